"""The agent's local state: one JSON file, always written atomically."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from agent.files import write_atomic

MAX_REMEMBERED_DEPLOYMENTS = 200


@dataclass
class State:
    active_number: int | None = None
    active_checksum: str | None = None
    active_label: str | None = None
    # Paths (relative to the target directory) the active snapshot wrote.
    managed_files: list = field(default_factory=list)
    etag: str | None = None
    # A failed (number, checksum), not retried until the desired one changes.
    blocked: dict | None = None
    # Push deployment ids already applied -> the report sent for each.
    processed_deployments: dict = field(default_factory=dict)
    unsent_report: dict | None = None
    # Set while an apply is writing files; found on start-up after a crash.
    in_progress: dict | None = None
    token: str | None = None
    # The server's poll interval, kept so a restart answered 304 keeps its pace.
    poll_interval_s: float | None = None

    @classmethod
    def load(cls, path: str) -> State:
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def save(self, path: str) -> None:
        if len(self.processed_deployments) > MAX_REMEMBERED_DEPLOYMENTS:
            newest = list(self.processed_deployments.items())[-MAX_REMEMBERED_DEPLOYMENTS:]
            self.processed_deployments = dict(newest)
        # Not sorted: processed_deployments keeps its order, oldest first.
        text = json.dumps(asdict(self), indent=2)
        write_atomic(path, text.encode("utf-8"), mode=0o600)

    def is_blocked(self, number: int, checksum: str) -> bool:
        return self.blocked == {"number": number, "checksum": checksum}


def state_path(state_dir: str) -> str:
    return os.path.join(state_dir, "state.json")
