"""deploy/ as shipped: every server unit restarts on any exit, reads the shipped
settings file and is sandboxed as the agent's unit is, and systemd verifies it;
nginx accepts the shipped site with its placeholders filled in. (The e2e tests
run the units' command lines and the site: tests/e2e/test_production_shape.py,
tests/e2e/test_deploy_nginx.py.)"""

import os
import shutil
import subprocess

import pytest

from tests.deployfiles import DEPLOY, INSTALLED_BIN, certificate, site_filled, unit_section

SERVERS = ["bellwether-web@.service", "bellwether-worker.service", "bellwether-beat.service"]
SANDBOX = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
           "PrivateTmp": "yes", "PrivateDevices": "yes", "RestrictSUIDSGID": "yes"}


def required(tool: str) -> str:
    found = shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))
    if found is None:
        message = f"needs {tool} on PATH"
        if os.environ.get("BELLWETHER_REQUIRE_SERVICES") == "1":
            pytest.fail(message + "; BELLWETHER_REQUIRE_SERVICES=1 forbids skipping")
        pytest.skip(message)
    return found


@pytest.mark.parametrize("unit", SERVERS)
def test_each_server_unit_restarts_reads_the_settings_file_and_is_sandboxed(unit):
    service = dict(unit_section(unit))
    agent = dict(unit_section("bellwether-agent@.service"))

    assert service["Restart"] == "always"
    assert service["EnvironmentFile"] == "/etc/bellwether/bellwether.env"
    assert (service["User"], service["WorkingDirectory"]) == ("bellwether", "/opt/bellwether")
    assert service["ExecStart"].startswith(INSTALLED_BIN)
    for key, value in SANDBOX.items():
        assert service[key] == agent[key] == value, key
    assert service["RestrictAddressFamilies"] == agent["RestrictAddressFamilies"]


def test_systemd_verifies_the_server_units(tmp_path):
    """With ExecStart's executables pointing at ones that exist here (verify checks)."""
    analyze = required("systemd-analyze")
    for executable in ("granian", "celery"):
        (tmp_path / executable).write_text("#!/bin/sh\n")
        (tmp_path / executable).chmod(0o755)
    for unit in SERVERS:
        text = (DEPLOY / "systemd" / unit).read_text()
        (tmp_path / unit).write_text(text.replace(INSTALLED_BIN, f"{tmp_path}/"))
    (tmp_path / "bellwether-web@8000.service").symlink_to(tmp_path / SERVERS[0])
    names = ["bellwether-web@8000.service", *SERVERS[1:]]

    verified = subprocess.run([analyze, "verify", "--man=no", *names], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"})

    problems = [line for line in (verified.stdout + verified.stderr).splitlines()
                if "bellwether" in line]
    assert verified.returncode == 0 and not problems, verified.stdout + verified.stderr


def test_nginx_accepts_the_shipped_site(tmp_path):
    nginx = required("nginx")
    cert, key = certificate(tmp_path)
    site = tmp_path / "bellwether.conf"
    site.write_text(site_filled(https=8443, http=8080, agents=8001, app=8000, cert=cert,
                                key=key, log=tmp_path / "access.log"))
    main = tmp_path / "nginx.conf"
    main.write_text(f"pid {tmp_path}/nginx.pid;\nerror_log stderr;\nevents {{}}\n"
                    f"http {{\n    include {site};\n}}\n")

    checked = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(main), "-e", "stderr"],
                             capture_output=True, text=True, timeout=30)

    assert checked.returncode == 0, checked.stderr
