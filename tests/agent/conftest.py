"""Fixtures for the agent's unit tests: a target and a state directory in tmp_path,
an Applier on them with real commands, and a local protocol server."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.apply import Applier, Commands
from agent.client import Client
from agent.runner import Agent
from agent.state import State, state_path
from tests.agent.support import ProtocolServer


@dataclass
class Host:
    """One host the agent manages: its target directory and its state on disk."""

    tmp_path: Path
    target: Path
    state_dir: Path

    @property
    def state_file(self) -> str:
        return state_path(str(self.state_dir))

    def load_state(self) -> State:
        return State.load(self.state_file)

    def save(self, state: State) -> None:
        state.save(self.state_file)

    @property
    def backup(self) -> Path:
        return self.state_dir / "backup"

    def applier(self, *, validate=None, reload=None, start=None, timeout_s=30.0,
                environ=None, secret_allow=None, passthrough_env=(), probe=None,
                sleep=None) -> Applier:
        """An Applier; with a health `probe`, `sleep` gets the waits between attempts
        (default: none happen)."""
        return Applier(
            target_dir=str(self.target), state_dir=str(self.state_dir), save=self.save,
            commands=Commands(validate=validate, reload=reload, start=start,
                              timeout_s=timeout_s, passthrough_env=passthrough_env),
            environ=dict(os.environ) if environ is None else environ,
            secret_allow=secret_allow, probe=probe,
            sleep=sleep or (lambda seconds: None),
        )

    def agent(self, server_url: str, *, token: str = ProtocolServer.TOKEN, sleep=None,
              rng=lambda: 0.5, poll_interval=None, **commands) -> Agent:
        """An Agent as `python -m agent` builds it, with its State loaded from disk."""

        def no_sleep(seconds):
            raise AssertionError(f"unexpected sleep({seconds})")

        return Agent(client=Client(server_url, token=token, timeout=5),
                     applier=self.applier(**commands), state=self.load_state(),
                     save=self.save, poll_interval=poll_interval,
                     sleep=sleep or no_sleep, rng=rng)


@pytest.fixture
def host(tmp_path) -> Host:
    target = tmp_path / "target"
    target.mkdir()
    return Host(tmp_path=tmp_path, target=target, state_dir=tmp_path / "state")


@pytest.fixture
def server():
    running = ProtocolServer().start()
    yield running
    running.stop()


# --- host faults: small and read-only filesystems (needs root and mount(8)) ------------


class Mounts:
    """tmpfs mounts made for one test, unmounted after it. Where mounting is not
    permitted the test is skipped (the unit tests in test_host_faults.py cover the
    same paths with the OS call failing)."""

    def __init__(self):
        self.made = []

    @staticmethod
    def _mount(*args) -> subprocess.CompletedProcess:
        if shutil.which("mount") is None:
            pytest.skip("no mount(8) here")
        return subprocess.run(["mount", *args], capture_output=True, text=True)

    def tmpfs(self, path: Path, size: str = "1m") -> Path:
        path.mkdir(parents=True, exist_ok=True)
        result = self._mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        self.made.append(path)
        return path

    def read_only(self, path: Path) -> None:
        result = self._mount("-o", "remount,ro", str(path))
        assert result.returncode == 0, result.stderr

    def read_write(self, path: Path) -> None:
        result = self._mount("-o", "remount,rw", str(path))
        assert result.returncode == 0, result.stderr

    def unmount_all(self) -> None:
        for path in reversed(self.made):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def mounts():
    made = Mounts()
    yield made
    made.unmount_all()


@pytest.fixture
def read_only_mount(mounts):
    def make(path: Path) -> Path:
        mounts.tmpfs(path)
        mounts.read_only(path)
        return path
    return make
