"""Hostile file paths in a bundle, with the real agent process: whatever the path —
`..` segments (also ones that come back into the target), absolute paths, empty or
`.` segments, NUL, names or paths too long, a symbolic link in the target — the
agent writes nothing outside the directory it writes to: not from the staged tree
(one level deeper than the target), not into its backup, not live. Such a bundle
fails before anything is written; a link made in the staged tree while it is
validated fails the swap, and the previous files are put back."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.apply import FAILED, SUCCEEDED, WARNING
from agent.runner import EXIT_APPLY_FAILED, EXIT_OK
from tests.agent.conftest import Host
from tests.agent.support import REPO_ROOT, agent_env, make_bundle, script, sealed, text_tree

pytestmark = pytest.mark.processes

V1 = {"nginx.conf": "worker_processes 2;\n", "escaped.conf": "kept\n",
      "conf.d/shop.conf": "listen 80;\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/shop.conf": "listen 8080;\n",
      "conf.d/new.conf": "only in #2\n"}
VALIDATE = {"staged": "test -f {staged}/nginx.conf",
            "in place": "test -f $BELLWETHER_TARGET_DIR/nginx.conf"}


@pytest.fixture
def world(tmp_path) -> Host:
    """<tmp>/host/srv/etc is the target (so `../../srv/etc/x` comes back into it),
    <tmp>/host/var/state the state; <tmp>/host/srv/outside holds a file of the
    host's. #1 is applied."""
    root = tmp_path / "host"
    target, state_dir = root / "srv" / "etc", root / "var" / "state"
    target.mkdir(parents=True)
    (root / "srv" / "outside").mkdir()
    (root / "srv" / "outside" / "new.conf").write_text("the host's own\n")
    world = Host(tmp_path=tmp_path, target=target, state_dir=state_dir)
    assert world.applier().apply(make_bundle(1, V1), world.load_state()).status == SUCCEEDED
    return world


def everything(root: Path, *, leaving_out: Path) -> dict:
    """Every entry under `root` (but `leaving_out`): what it is, its mode, its content."""
    found = {}
    for directory, names, files in os.walk(root):
        if Path(directory) == leaving_out or leaving_out in Path(directory).parents:
            continue
        for name in names + files:
            path = Path(directory) / name
            info = os.lstat(path)
            content = (os.readlink(path) if stat.S_ISLNK(info.st_mode) else
                       path.read_bytes() if stat.S_ISREG(info.st_mode) else None)
            found[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode),
                                                  stat.S_IMODE(info.st_mode), content)
    return found


def once(world: Host, server, validate: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", "--once", "--server", server.url, "--token",
         server.token, "--target-dir", str(world.target), "--state-dir",
         str(world.state_dir), "--validate-command", validate],
        cwd=REPO_ROOT, env=agent_env(**env), capture_output=True, text=True, timeout=60)


def hostile(world: Host, kind: str) -> tuple:
    """(path, content) of the hostile file `kind`; makes the links it needs."""
    root = world.target.parent.parent
    if kind == "existing link leaving":
        (world.target / "link").symlink_to(root / "srv" / "outside")
        return "link/new.conf", "through a link\n"
    if kind == "existing relative link up":
        (world.target / "up").symlink_to("..")
        return "up/outside/new.conf", "through a link\n"
    return {
        "dotdot back into the target": ("../../srv/etc/escaped.conf", "pwned\n"),
        "dotdot in the middle": ("conf.d/../../etc/escaped.conf", "pwned\n"),
        "dotdot leaving": ("../outside/new.conf", "pwned\n"),
        "absolute into the target": (str(world.target / "abs.conf"), "pwned\n"),
        "absolute outside": (str(root / "srv" / "outside" / "new.conf"), "pwned\n"),
        "empty segment": ("conf.d//escaped.conf", "pwned\n"),
        "trailing slash": ("conf.d/escaped/", "pwned\n"),
        "dot segment": ("./escaped.conf", "pwned\n"),
        "NUL": ("escaped\x00.conf", "pwned\n"),
        "name over 255 bytes": ("n" * 256, "pwned\n"),
        "multibyte name over 255 bytes": ("é" * 126 + ".conf", "pwned\n"),
        "path over 1024 bytes": ("/".join(["d" * 200] * 6), "pwned\n"),
        "lone surrogate": ("esc\ud800aped.conf", "pwned\n"),
        "secret to a dotdot path": ("../../srv/etc/secret.conf",
                                    "password " + sealed("env:BW_HOSTILE_SECRET") + "\n"),
    }[kind]


KINDS = ["dotdot back into the target", "dotdot in the middle", "dotdot leaving",
         "absolute into the target", "absolute outside", "empty segment", "trailing slash",
         "dot segment", "NUL", "name over 255 bytes", "multibyte name over 255 bytes",
         "path over 1024 bytes", "lone surrogate", "secret to a dotdot path",
         "existing link leaving", "existing relative link up"]


@pytest.mark.parametrize("validate", list(VALIDATE))
@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_path_fails_the_bundle_before_anything_is_written(
        world, server, kind, validate):
    path, content = hostile(world, kind)
    root = world.target.parent.parent
    before = everything(root, leaving_out=world.state_dir)
    # A lone surrogate cannot be encoded: no checksum covers it (nor could a server's).
    checksum = "sha256:" + "0" * 64 if kind == "lone surrogate" else None
    server.publish(make_bundle(2, {**V2, path: content}, checksum=checksum))

    result = once(world, server, VALIDATE[validate], BW_HOSTILE_SECRET="s3cr3t-value")

    assert result.returncode == EXIT_APPLY_FAILED, result.stderr
    assert [r["status"] for r in server.reports] == [FAILED]
    assert "nothing was written" in server.reports[0]["message"]
    assert everything(root, leaving_out=world.state_dir) == before
    assert text_tree(world.target) == V1
    assert world.load_state().active_number == 1
    assert "Traceback" not in result.stderr


def test_a_link_made_in_the_staged_tree_while_it_is_validated_fails_the_swap(world, server):
    """The staged tree is checked as the directory its files are read from: a link
    put there (by the validate command here) is never followed out of it."""
    root = world.target.parent.parent
    outside = root / "srv" / "outside"
    relink = script(world.tmp_path, "relink.sh",
                    f'rm -r "$1/conf.d" && ln -s {shlex.quote(str(outside))} "$1/conf.d"\n')
    before = everything(root, leaving_out=world.state_dir)
    server.publish(make_bundle(2, V2))

    result = once(world, server, f"{relink} {{staged}}")

    assert result.returncode == EXIT_APPLY_FAILED, result.stderr
    assert [r["status"] for r in server.reports] == [WARNING]
    assert "leaves the staged directory through a symbolic link" in server.reports[0]["message"]
    assert everything(root, leaving_out=world.state_dir) == before  # outside/new.conf stays
    assert text_tree(world.target) == V1


def test_a_staged_file_replaced_by_a_link_is_not_swapped_in(world, server):
    relink = script(world.tmp_path, "relink.sh", 'ln -sf /etc/hostname "$1/nginx.conf"\n')
    server.publish(make_bundle(2, V2))

    result = once(world, server, f"{relink} {{staged}}")

    assert result.returncode == EXIT_APPLY_FAILED, result.stderr
    assert "is not a regular file" in server.reports[0]["message"]
    assert not os.path.islink(world.target / "nginx.conf")
    assert text_tree(world.target) == V1


@pytest.mark.parametrize("validate", list(VALIDATE))
def test_a_name_of_255_bytes_is_written(world, server, validate):
    """The longest name a filesystem takes is written: the temp file beside it
    (`.<name>.bellwether-tmp-…`) shortens the name it carries."""
    longest = {"conf.d/" + "é" * 125 + ".conf": "long\n", "n" * 255: "long too\n"}
    assert all(len(p.split("/")[-1].encode()) == 255 for p in longest)
    server.publish(make_bundle(2, {**V2, **longest}))

    result = once(world, server, VALIDATE[validate])

    assert result.returncode == EXIT_OK, result.stderr
    assert text_tree(world.target) == {**V2, **longest}
