"""End to end: a real server process and real `python -m agent` processes.

Publish -> every agent applies and reports; a manual agent waits for its push; an
offline agent gets its pending push when it comes back; agents ride out a server
outage with their config intact and recover.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.harness import wait_deployment, wait_for, wait_in_sync

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TEMPLATES = {
    "app/settings.conf": "message = {{ message }}\nworkers = {{ workers }}\n",
    "app/peers.txt": "{% for peer in peers %}{{ peer }}\n{% endfor %}",
}


def config(message: str, workers: int = 2) -> str:
    return f"message: {message}\nworkers: {workers}\npeers:\n  - 10.0.0.1\n  - 10.0.0.2\n"


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


def test_every_agent_applies_each_published_snapshot_and_reports_success(make_fleet):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    first = fleet.api.publish()
    assert first["number"] == 1
    names = ["web-1", "web-2", "web-3"]
    for name in names:
        fleet.start_agent(name)

    agents = wait_in_sync(fleet, names, 1)

    expected = fleet.api.snapshot_files(1)
    assert set(expected) == {"app/settings.conf", "app/peers.txt"}
    for name in names:
        status = agents[name]["status"]
        assert status["applied"] == {"number": 1, "checksum": first["checksum"]}
        assert status["online"] is True
        assert fleet.agents[name].files() == expected
        state = fleet.agents[name].state()
        assert (state["active_number"], state["active_checksum"]) == (1, first["checksum"])
        [deployment] = fleet.api.agent_deployments(agents[name]["id"])
        assert (deployment["kind"], deployment["snapshot"], deployment["state"]) == (
            "pull", 1, "succeeded")

    # A new snapshot: a changed file and a removed one.
    fleet.change_config(config("hello v2", workers=8))
    fleet.remove_template("app/peers.txt")
    second = fleet.api.publish(confirm=True)  # a file goes away: the guard asks first
    assert second["number"] == 2

    agents = wait_in_sync(fleet, names, 2)

    expected = fleet.api.snapshot_files(2)
    assert expected == {"app/settings.conf": "message = hello v2\nworkers = 8\n"}
    for name in names:
        assert agents[name]["status"]["applied"] == {"number": 2,
                                                     "checksum": second["checksum"]}
        assert fleet.agents[name].files() == expected  # peers.txt is gone
        deployments = fleet.api.agent_deployments(agents[name]["id"])
        assert sorted((d["snapshot"], d["kind"], d["state"]) for d in deployments) == [
            (1, "pull", "succeeded"), (2, "pull", "succeeded")]
        assert fleet.agents[name].running()


def test_manual_agent_stays_on_its_snapshot_until_a_push_brings_the_new_one(make_fleet):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    fleet.api.publish()
    follower, manual = fleet.start_agent("follower"), fleet.start_agent("manual-1")
    agents = wait_in_sync(fleet, ["follower", "manual-1"], 1)
    manual_id = agents["manual-1"]["id"]
    first_files = fleet.api.snapshot_files(1)

    switched = fleet.api.set_mode(manual_id, "manual")
    assert switched["mode"] == "manual"
    assert switched["status"]["desired"]["number"] == 1

    fleet.change_config(config("hello v2"))
    second = fleet.api.publish()
    assert second["number"] == 2
    # The auto_pull follower takes #2 ...
    wait_in_sync(fleet, ["follower"], 2)
    assert follower.files() == fleet.api.snapshot_files(2)
    # ... while the manual agent, polling all along, stays on #1.
    polls = r"desired state unchanged|in sync at #1"
    seen = count(polls, manual.log())
    wait_for(lambda: (count(polls, manual.log()) >= seen + 3, count(polls, manual.log())),
             what="manual-1 to poll three more times", diagnostics=fleet.logs)
    status = fleet.api.agents()["manual-1"]["status"]
    assert status["applied"]["number"] == 1
    assert status["desired"]["number"] == 1
    assert manual.files() == first_files
    assert "applying #2" not in manual.log()

    [pushed] = fleet.api.deploy(2, [manual_id])
    assert (pushed["agent"], pushed["snapshot"], pushed["kind"], pushed["state"]) == (
        manual_id, 2, "push", "pending")

    done = wait_deployment(fleet, manual_id, pushed["id"], "succeeded")
    assert done["reported_at"] is not None
    agents = wait_in_sync(fleet, ["manual-1"], 2)
    assert agents["manual-1"]["mode"] == "manual"
    assert agents["manual-1"]["status"]["applied"] == {"number": 2,
                                                       "checksum": second["checksum"]}
    assert manual.files() == fleet.api.snapshot_files(2)
    assert f"applying #2 ({second['label']}) for push {pushed['id']}" in manual.log()


def test_offline_agent_applies_its_pending_push_when_it_comes_back(make_fleet):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    fleet.api.publish()
    agent = fleet.start_agent("edge-1")
    agent_id = wait_in_sync(fleet, ["edge-1"], 1)["edge-1"]["id"]
    first_files = agent.files()

    assert agent.stop() is not None
    fleet.change_config(config("hello v2"))
    second = fleet.api.publish()
    [pushed] = fleet.api.deploy(2, [agent_id])

    assert pushed["state"] == "pending"
    [pending] = [d for d in fleet.api.agent_deployments(agent_id) if d["id"] == pushed["id"]]
    assert (pending["state"], pending["reported_at"]) == ("pending", None)
    status = fleet.api.agents()["edge-1"]["status"]
    assert (status["applied"]["number"], status["desired"]["number"], status["sync"]) == (
        1, 2, "behind")
    assert agent.files() == first_files

    # Back with only what its state directory holds (its own token, no enrollment).
    agent.restart_without_enrollment_token()

    done = wait_deployment(fleet, agent_id, pushed["id"], "succeeded")
    assert done["snapshot"] == 2
    wait_in_sync(fleet, ["edge-1"], 2)
    assert agent.files() == fleet.api.snapshot_files(2)
    log = agent.log()
    assert f"applying #2 ({second['label']}) for push {pushed['id']}" in log
    assert count(r"enrolled as edge-1", log) == 1


def test_agents_keep_their_config_while_the_server_is_down_and_recover(make_fleet):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    first = fleet.api.publish()
    names = ["web-1", "web-2"]
    agents = [fleet.start_agent(name) for name in names]
    wait_in_sync(fleet, names, 1)
    first_files = fleet.api.snapshot_files(1)
    logged_before = {a.name: len(a.log()) for a in agents}

    assert fleet.server.stop() is not None

    def outage_log(agent) -> str:
        return agent.log()[logged_before[agent.name]:]

    for agent in agents:
        wait_for(lambda a=agent: (count("server unavailable", outage_log(a)) >= 2,
                                  outage_log(a)[-2000:]),
                 what=f"{agent.name} to retry twice", diagnostics=fleet.logs)
    for agent in agents:
        assert agent.running(), agent.dump()
        assert agent.files() == first_files
        assert agent.state()["active_number"] == 1
        assert agent.state()["active_checksum"] == first["checksum"]
        delays = [int(d) for d in re.findall(r"retrying in (\d+)s", outage_log(agent))]
        # Exponential backoff with jitter: 1-2 s after the first failure, 2-4 s after
        # the second: never the 1 s poll interval again.
        assert delays[1] >= 2, delays
        assert "keeping the current config" in outage_log(agent)

    fleet.server.start().wait_ready()
    fleet.change_config(config("hello v3"))
    second = fleet.api.publish()
    assert second["number"] == 2

    agents_now = wait_in_sync(fleet, names, 2, timeout=40.0)
    for agent in agents:
        assert agent.files() == fleet.api.snapshot_files(2)
        assert agents_now[agent.name]["status"]["online"] is True
