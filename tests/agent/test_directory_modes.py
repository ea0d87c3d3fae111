"""The modes of the directories the agent creates, with the real agent process under
`umask 000`: 0755 in the target (as new files there are 0644), 0700 where the
state, backups, staged snapshots and commands' working directory live. The umask
never widens them, and it never narrows them below what the agent needs."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys

import pytest

from agent.runner import EXIT_OK
from tests.agent.support import REPO_ROOT, agent_env, make_bundle, script, sealed

pytestmark = pytest.mark.processes

V1 = {"conf.d/deep/site.conf": "listen 80;\n",
      "secrets/db.conf": "password " + sealed("env:BW_DB_PASSWORD") + "\n"}
V2 = {"conf.d/deep/site.conf": "listen 8080;\n",
      "secrets/db.conf": "password " + sealed("env:BW_DB_PASSWORD") + "\n",
      "added/more/new.conf": "new\n"}


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def run_agent(tmp_path, server, target, state_dir, *extra, umask: int):
    return subprocess.run(
        [sys.executable, "-m", "agent", "--once", "--server", server.url, "--token",
         server.token, "--target-dir", str(target), "--state-dir", str(state_dir),
         "--name", "web-1", *extra],
        cwd=REPO_ROOT, env=agent_env(BW_DB_PASSWORD="hunter22"), capture_output=True,
        text=True, timeout=60, umask=umask)


def staged_modes_recorder(tmp_path) -> tuple:
    """A validate command naming {staged} that writes the mode of every directory of
    the staged tree (the tree itself first) to a file."""
    seen = tmp_path / "staged-modes"
    command = script(tmp_path, "record.sh",
                     f'find "$1" -type d -exec stat -c "%a %n" {{}} + > {shlex.quote(str(seen))}\n')
    return f"{command} {{staged}}", seen


@pytest.mark.parametrize("umask", [0o000, 0o077], ids=["umask-000", "umask-077"])
def test_directories_the_agent_creates_have_fixed_modes_whatever_the_umask(
        tmp_path, server, umask):
    target = tmp_path / "etc" / "shop" / "conf"  # none of them exists yet
    state_dir = tmp_path / "var" / "lib" / "bellwether" / "web-1"
    validate, seen = staged_modes_recorder(tmp_path)
    server.publish(make_bundle(1, V1))
    first = run_agent(tmp_path, server, target, state_dir, "--validate-command", validate,
                      umask=umask)
    assert first.returncode == EXIT_OK, first.stderr
    server.publish(make_bundle(2, V2))  # a second apply: a backup with directories

    second = run_agent(tmp_path, server, target, state_dir, "--validate-command", validate,
                       umask=umask)

    assert second.returncode == EXIT_OK, second.stderr
    expected = {
        # Made by the agent: the target and the directories above it, and those in it.
        tmp_path / "etc": 0o755, tmp_path / "etc" / "shop": 0o755, target: 0o755,
        target / "conf.d": 0o755, target / "conf.d" / "deep": 0o755,
        target / "secrets": 0o755, target / "added": 0o755, target / "added" / "more": 0o755,
        # The state directory (0700) and those above it (0755), and what is in it.
        tmp_path / "var": 0o755, tmp_path / "var" / "lib": 0o755,
        tmp_path / "var" / "lib" / "bellwether": 0o755, state_dir: 0o700,
        state_dir / "backup": 0o700, state_dir / "backup" / "conf.d": 0o700,
        state_dir / "backup" / "conf.d" / "deep": 0o700,
        state_dir / "backup" / "secrets": 0o700, state_dir / "run": 0o700,
    }
    assert {str(p): oct(mode(p)) for p in expected} == {
        str(p): oct(m) for p, m in expected.items()}
    # Files: exact modes too (the secret's file 0600, the others 0644).
    assert oct(mode(target / "secrets" / "db.conf")) == oct(0o600)
    assert oct(mode(target / "added" / "more" / "new.conf")) == oct(0o644)
    assert oct(mode(state_dir / "state.json")) == oct(0o600)
    # The staged tree, seen by the validate command while it ran: 0700 throughout.
    staged = dict(line.split(" ", 1)[::-1] for line in seen.read_text().splitlines())
    assert len(staged) == 6, staged  # the tree, conf.d, conf.d/deep, secrets, added, more
    assert set(staged.values()) == {"700"}, staged


def test_a_state_dir_made_under_umask_000_is_private_before_anything_is_written(
        tmp_path, server):
    state_dir = tmp_path / "state" / "web-1"
    server.publish(make_bundle(1, V1))

    result = run_agent(tmp_path, server, tmp_path / "target", state_dir, umask=0o000)

    assert result.returncode == EXIT_OK, result.stderr
    assert oct(mode(state_dir)) == oct(0o700)
    assert oct(mode(tmp_path / "state")) == oct(0o755)
    for path in state_dir.rglob("*"):
        if path.is_dir():
            assert oct(mode(path)) == oct(0o700), path
        else:
            assert oct(mode(path)) == oct(0o600), path


def test_an_existing_directory_keeps_its_mode(tmp_path, server):
    """The agent sets the modes of what it creates, never of what it finds."""
    target = tmp_path / "target"
    (target / "conf.d").mkdir(parents=True)
    os.chmod(target, 0o750)
    os.chmod(target / "conf.d", 0o711)
    server.publish(make_bundle(1, {"conf.d/site.conf": "x\n", "top.conf": "y\n"}))

    result = run_agent(tmp_path, server, target, tmp_path / "state", umask=0o000)

    assert result.returncode == EXIT_OK, result.stderr
    assert (oct(mode(target)), oct(mode(target / "conf.d"))) == (oct(0o750), oct(0o711))
