"""The agent installs on its own: `pip install ./agent` (or its wheel) into a
fresh virtual environment, offline, pulls in nothing else and gives the
`bellwether-agent` command; the systemd unit is valid and sandboxed."""

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"
UNIT = ROOT / "deploy" / "systemd" / "bellwether-agent@.service"
DROP_IN = ROOT / "deploy" / "systemd" / "token-credential.conf"
# The oldest Python the agent claims (agent/__init__.py), when this machine has it.
OLDEST = next((p for p in ("/root/.pyenv/versions/3.8.18/bin/python3.8",
                           shutil.which("python3.8")) if p and os.access(p, os.X_OK)), None)
INTERPRETERS = [pytest.param(sys.executable, id="current"),
                pytest.param(OLDEST, id="python3.8", marks=pytest.mark.skipif(
                    OLDEST is None, reason="no Python 3.8 on this machine"))]


def _backend():
    spec = importlib.util.spec_from_file_location("agent_build_backend",
                                                  AGENT / "_build" / "backend.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args, **options) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", ""), "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "HOME": str(options.pop("home", "/tmp"))}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=300, env=env, **options)


def _venv(python: str, where: Path) -> Path:
    created = _run(python, "-m", "venv", where)
    assert created.returncode == 0, created.stderr
    return where / "bin"


def _installed(bin_dir: Path) -> set[str]:
    listed = _run(bin_dir / "python", "-m", "pip", "list", "--format=json")
    assert listed.returncode == 0, listed.stderr
    return {row["name"].lower() for row in json.loads(listed.stdout)}


def test_the_wheel_holds_the_agent_and_its_command_and_no_dependency(tmp_path):
    name = _backend().build_wheel(str(tmp_path))

    with zipfile.ZipFile(tmp_path / name) as wheel:
        files = set(wheel.namelist())
        info = name.split("-py3")[0] + ".dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
        scripts = wheel.read(f"{info}/entry_points.txt").decode()
        record = wheel.read(f"{info}/RECORD").decode()
    modules = {f"agent/{p.name}" for p in AGENT.glob("*.py")}
    assert name.startswith("bellwether_agent-") and name.endswith("-py3-none-any.whl")
    assert {f for f in files if f.startswith("agent/")} == modules
    assert "Requires-Dist" not in metadata
    assert "Requires-Python: >=3.8" in metadata
    assert "bellwether-agent = agent.cli:main" in scripts
    assert all(f"{path}," in record for path in files)


def test_the_backend_says_what_pyproject_says():
    backend = _backend()
    project = tomllib.loads((AGENT / "pyproject.toml").read_text())["project"]

    assert project["name"] == backend.NAME
    assert project["requires-python"] == backend.REQUIRES_PYTHON
    assert project["scripts"] == backend.SCRIPTS
    assert project["dependencies"] == []


@pytest.mark.parametrize("python", INTERPRETERS)
def test_pip_install_into_a_fresh_venv_gives_the_command_and_nothing_else(python, tmp_path):
    bin_dir = _venv(python, tmp_path / "venv")
    before = _installed(bin_dir)

    # --no-index: offline; a declared dependency would make the install fail.
    installed = _run(bin_dir / "python", "-m", "pip", "install", "--no-index", AGENT,
                     home=tmp_path, cwd=tmp_path)
    helped = _run(bin_dir / "bellwether-agent", "--help", cwd=tmp_path)

    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert _installed(bin_dir) - before == {"bellwether-agent"}
    assert helped.returncode == 0, helped.stderr
    for option in ("--server", "--enrollment-token", "--name", "--target-dir",
                   "--state-dir", "--token-file", "--config", "--health-url"):
        assert option in helped.stdout
    # The usage and configuration errors name the command as invoked.
    assert helped.stdout.startswith("usage: bellwether-agent "), helped.stdout[:80]
    refused = _run(bin_dir / "bellwether-agent", cwd=tmp_path)
    assert (refused.returncode, refused.stderr.strip()) == (
        2, "bellwether-agent: --server is required")
    # Nothing was written into the source tree.
    assert not list(AGENT.glob("*.egg-info")) and not (AGENT / "build").exists()


def test_the_built_wheel_installs_offline_and_runs(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name = _backend().build_wheel(str(wheels))
    bin_dir = _venv(sys.executable, tmp_path / "venv")

    installed = _run(bin_dir / "python", "-m", "pip", "install", "--no-index",
                     wheels / name, cwd=tmp_path)
    failing = _run(bin_dir / "bellwether-agent", "--once", cwd=tmp_path)

    assert installed.returncode == 0, installed.stderr
    # A configuration mistake is the agent's own clear exit 2, not an import error.
    assert failing.returncode == 2, failing.stderr
    assert "--server is required" in failing.stderr


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None,
                                       empty_lines_in_values=False)
    parser.optionxform = str
    parser.read(path)
    return parser


def test_the_unit_is_sandboxed_and_restarts_on_failure():
    service = _unit(UNIT)["Service"]

    assert service["ExecStart"].startswith("/usr/local/bin/bellwether-agent --config "
                                           "/etc/bellwether/%i.ini")
    assert service["ProtectSystem"] == "strict"
    assert service["ReadWritePaths"] == "/var/lib/bellwether/%i"
    assert service["StateDirectory"] == "bellwether/%i"
    for key in ("NoNewPrivileges", "PrivateTmp", "ProtectHome"):
        assert service[key] == "yes", key
    assert service["Restart"] == "on-failure"
    # Bad configuration and a refused (revoked, decommissioned) token stop it.
    assert service["RestartPreventExitStatus"].split() == ["2", "3"]
    # A stop (SIGTERM) is the agent's exit 143: clean, not a failure.
    assert service["SuccessExitStatus"].split() == ["143"]
    assert "BELLWETHER_STATE_DIR=/var/lib/bellwether/%i" in UNIT.read_text()
    drop_in = _unit(DROP_IN)["Service"]
    assert drop_in["LoadCredential"] == "token:/etc/bellwether/%i.token"
    assert drop_in["Environment"] == "BELLWETHER_TOKEN_FILE=%d/token"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_unit_and_its_credential_drop_in(tmp_path):
    """The unit, instantiated for web-1 with the drop-in, with ExecStart pointing
    at an executable that exists here (verify checks it)."""
    fake = tmp_path / "bellwether-agent"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    unit = tmp_path / "bellwether-agent@.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/bellwether-agent", str(fake)))
    drop_ins = tmp_path / "bellwether-agent@web-1.service.d"
    drop_ins.mkdir()
    shutil.copy(DROP_IN, drop_ins / "token.conf")
    instance = tmp_path / "bellwether-agent@web-1.service"
    instance.symlink_to(unit)

    verified = subprocess.run(["systemd-analyze", "verify", "--man=no", str(instance)],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"})

    problems = [line for line in (verified.stdout + verified.stderr).splitlines()
                if "bellwether-agent" in line]
    assert verified.returncode == 0 and not problems, verified.stdout + verified.stderr
