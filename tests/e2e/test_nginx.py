"""End to end with a real nginx: the agent writes the site file, validates it with
`nginx -t`, reloads (starting nginx the first time), and a rejected config is
restored while nginx keeps serving what it served before."""

from __future__ import annotations

import pytest

from tests.e2e.harness import free_port, wait_for, wait_in_sync

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SITE = """server {
    listen 127.0.0.1:{{ port }};
    location / {
        default_type text/plain;
        return 200 "{{ message }}\\n";
    }
}
"""
# Valid for the template engine, rejected by `nginx -t`.
BROKEN_SITE = SITE.replace("    location / {", "    bellwether_no_such_directive on;\n"
                                               "    location / {")


def config(port: int, message: str) -> str:
    return f"port: {port}\nmessage: {message}\n"


def test_nginx_serves_each_applied_snapshot_and_keeps_the_old_one_when_nginx_rejects_a_new_one(
    make_nginx, make_fleet
):
    port = free_port()
    fleet = make_fleet(config(port, "served from snapshot one"), {"site.conf": SITE})
    agent_name = "nginx-1"
    nginx = make_nginx(fleet.root / agent_name / "target" / "site.conf", port)
    first = fleet.api.publish()
    assert first["number"] == 1
    assert nginx.get()[0] is None  # nothing listens yet: the agent starts nginx

    agent = fleet.start_agent(
        agent_name,
        "--validate-command", nginx.validate_command,
        "--reload-command", nginx.reload_command,
        "--start-command", nginx.start_command,
        "--command-timeout", "30",
    )

    def serves(text: str):
        def probe():
            answer = nginx.get()
            return answer == (200, text + "\n"), answer
        return probe

    def diagnostics() -> str:
        return fleet.logs() + "\n" + nginx.dump()

    agent_id = wait_in_sync(fleet, [agent_name], 1)[agent_name]["id"]
    wait_for(serves("served from snapshot one"), what="nginx to serve #1",
             diagnostics=diagnostics)
    assert "starting instead" in agent.log()  # reload found no nginx running
    master = nginx.master_pid()
    assert master is not None

    # A new snapshot: validated, reloaded into the running master.
    fleet.change_config(config(nginx.port, "served from snapshot two"))
    second = fleet.api.publish()
    assert second["number"] == 2
    wait_in_sync(fleet, [agent_name], 2)
    wait_for(serves("served from snapshot two"), what="nginx to serve #2",
             diagnostics=diagnostics)
    assert nginx.master_pid() == master  # reloaded, not restarted
    second_files = fleet.api.snapshot_files(2)
    assert agent.files() == second_files

    # A snapshot nginx rejects: restored, reported warning, blocked.
    fleet.put_template("site.conf", BROKEN_SITE)
    third = fleet.api.publish()
    assert third["number"] == 3
    assert "bellwether_no_such_directive on;" in fleet.api.snapshot_files(3)["site.conf"]

    def warned():
        status = fleet.api.agents()[agent_name]["status"]
        return status["last_status"] == "warning", status

    status = wait_for(warned, what="the agent to report #3 warning", diagnostics=diagnostics)
    assert status["blocked"] == {"number": 3, "checksum": third["checksum"]}
    assert status["applied"] == {"number": 2, "checksum": second["checksum"]}
    assert status["desired"]["number"] == 3
    assert status["sync"] == "behind"
    assert "#3 failed (validate exited 1" in status["last_message"], status
    assert "restored #2" in status["last_message"], status
    deployments = fleet.api.agent_deployments(agent_id)
    assert [(d["snapshot"], d["state"]) for d in deployments
            if d["snapshot"] == 3] == [(3, "warning")]

    assert agent.files() == second_files
    assert agent.state()["blocked"] == {"number": 3, "checksum": third["checksum"]}
    assert agent.state()["active_number"] == 2
    checked = nginx.check_config()
    assert checked.returncode == 0, checked.stderr  # what is on disk is the good config
    assert nginx.get() == (200, "served from snapshot two\n")
    assert nginx.master_pid() == master
    assert agent.running()
