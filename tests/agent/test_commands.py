"""A snapshot never runs code on the host: validate/reload/start run in the agent's own
empty directory with an allowlisted environment, so no snapshot file can shadow a
module, a command or a startup hook."""

from __future__ import annotations

import os
import shlex
import shutil

import pytest

from agent.apply import SUCCEEDED, WARNING, command_environment
from tests.agent.support import make_bundle

PYTHON = shutil.which("python3") or "python3"


def payload(marker) -> str:
    return f"open({str(marker)!r}, 'a').write('ran\\n')\n"


def hostile_files(marker) -> dict:
    """Every way a file could get Python to run it at start-up or import."""
    code = payload(marker)
    return {
        "app.json": '{"ok": true}\n',
        "json/__init__.py": code,
        "json/tool.py": code,
        "sitecustomize.py": code,
        "usercustomize.py": code,
        "evil.pth": f"import os; exec({code!r})\n",
        "lib/python3/site-packages/evil.pth": f"import os; exec({code!r})\n",
        "validate": f"#!/bin/sh\n{PYTHON} -c {shlex.quote(code)}\n",
        "python3": f"#!/bin/sh\n{PYTHON} -c {shlex.quote(code)}\nexit 0\n",
        "env.sh": f"{PYTHON} -c {shlex.quote(code)}\n",
    }


def make_executable(host):
    for name in ("validate", "python3"):
        os.chmod(host.target / name, 0o755)


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "pwned"


def test_json_tool_is_not_shadowed_by_a_snapshot_json_package(host, marker):
    command = f"python3 -m json.tool {shlex.quote(str(host.target / 'app.json'))}"
    applier = host.applier(validate=command)

    outcome = applier.apply(make_bundle(1, hostile_files(marker)), host.load_state())

    assert outcome.status == SUCCEEDED, outcome
    assert not marker.exists()


@pytest.mark.parametrize("command", [
    "python3 -c 'import json, sys'",
    "python3 -m json.tool /dev/null || true",
    "python3 -c 'import site'",
])
def test_python_start_up_hooks_in_the_snapshot_never_run(host, marker, command):
    applier = host.applier(validate=command)

    applier.apply(make_bundle(1, hostile_files(marker)), host.load_state())

    assert not marker.exists()


def test_hostile_agent_variables_do_not_reach_the_commands(host, marker):
    """Even if the agent itself was started with variables naming the target."""
    target = str(host.target)
    environ = {"PATH": f".:{target}:{os.environ['PATH']}", "PYTHONPATH": target,
               "PYTHONSTARTUP": f"{target}/sitecustomize.py", "PYTHONUSERBASE": target,
               "ENV": f"{target}/env.sh", "BASH_ENV": f"{target}/env.sh",
               "HOME": target, "TMPDIR": target, "LD_PRELOAD": f"{target}/x.so"}
    applier = host.applier(validate="python3 -c 'import json' && sh -c true && bash -c true",
                           environ=environ)
    files = hostile_files(marker)
    applier.apply(make_bundle(1, files), host.load_state())
    make_executable(host)

    outcome = applier.apply(make_bundle(2, files), host.load_state())

    assert outcome.status == SUCCEEDED, outcome
    assert not marker.exists()


@pytest.mark.parametrize("command", ["./validate", "validate", "sh validate", ". ./env.sh"])
def test_a_relative_command_never_finds_a_snapshot_file(host, marker, command):
    files = hostile_files(marker)
    host.applier().apply(make_bundle(1, files), host.load_state())
    make_executable(host)
    applier = host.applier(validate=command)

    outcome = applier.apply(make_bundle(2, files), host.load_state())

    assert outcome.status == WARNING  # not found: validate fails, #1 is restored
    assert not marker.exists()


def test_command_environment_is_an_allowlist(tmp_path):
    target = str(tmp_path / "target")
    environ = {"PATH": f"/usr/bin::relative:{target}/bin:/bin", "LANG": "C.UTF-8",
               "LC_ALL": "C", "SECRET_TOKEN": "x", "PYTHONPATH": "/x", "HOME": "/root",
               "TMPDIR": f"{target}/tmp", "KEEP": "k"}

    env = command_environment(environ, target_dir=target, number=7, passthrough=("KEEP",))

    assert env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "HOME": "/root",
                   "KEEP": "k", "BELLWETHER_TARGET_DIR": target, "BELLWETHER_SNAPSHOT": "7",
                   "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1",
                   "PYTHONDONTWRITEBYTECODE": "1"}


def test_a_missing_path_gets_the_default(tmp_path):
    env = command_environment({}, target_dir=str(tmp_path), number=None)

    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["BELLWETHER_SNAPSHOT"] == ""


def test_the_run_directory_is_the_agents_and_stays_empty(host):
    applier = host.applier(validate='test -z "$(ls -A)" && test "$(pwd -P)" != '
                                    f'{shlex.quote(os.path.realpath(host.target))}')

    outcome = applier.apply(make_bundle(1, {"a.conf": "x\n"}), host.load_state())

    assert outcome.status == SUCCEEDED, outcome
    assert os.listdir(host.state_dir / "run") == []
