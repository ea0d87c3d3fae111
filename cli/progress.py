"""A rollout's progress as the CLI shows it: per-wave counts from the rollout's
detail (pure), the outcome as an exit code, and following a rollout until it
finishes (--wait, --watch) by polling its detail."""

from __future__ import annotations

import time
from dataclasses import dataclass

from cli import endpoints
from cli.errors import Refused, RolledBack, TimedOut, Unreachable

FINISHED = ("completed", "rolled_back")
TRANSIENT_STATUSES = (429, 502, 503, 504)  # worth asking again while following


def wave_label(index: int, waves: int | None = None) -> str:
    """A wave's name as the server names it (apps.rollouts.rules.wave_name): the
    canaries are wave 0; with `waves`, "of" the last one's number."""
    name = "the canaries" if index == 0 else f"wave {index}"
    return f"{name} of {waves - 1}" if waves and index else name


@dataclass(frozen=True)
class WaveRow:
    index: int
    gate: str
    targets: int
    activated: int
    acknowledged: int
    failed: int

    @property
    def label(self) -> str:
        return wave_label(self.index)


def wave_rows(rollout: dict) -> list[WaveRow]:
    """Activated and acknowledged per wave. A finished rollout's waves carry the
    counts it kept; a running one's current wave counts its evidence (the server
    lists up to 100 names per kind), and the waves before it passed their gate,
    so every activated target there had acknowledged."""
    finished = rollout.get("state") in FINISHED
    current = rollout.get("current_wave", 0)
    evidence = rollout.get("current_wave_evidence") or {}
    rows = []
    for wave in rollout.get("waves", []):
        index = wave.get("index", len(rows))
        targets = wave.get("targets", wave.get("size", 0))
        activated = wave.get("activated", 0)
        if finished:
            acknowledged, failed = wave.get("acknowledged", 0), wave.get("failed", 0)
        elif index < current:
            acknowledged, failed = activated, 0
        elif index == current:  # counted by the server (older ones: the names it lists)
            acknowledged = wave.get("acknowledged", len(evidence.get("acknowledged", [])))
            failed = wave.get("failed", len(evidence.get("failed", [])))
        else:
            acknowledged, failed = 0, 0
        rows.append(WaveRow(index=index, gate=wave.get("gate", "auto"), targets=targets,
                            activated=activated, acknowledged=acknowledged, failed=failed))
    return rows


def summary_line(rollout: dict) -> str:
    waves = rollout.get("waves", [])
    line = (f"rollout {rollout['id']} of {rollout['environment']} #{rollout['snapshot']}: "
            f"{rollout['state']} at {wave_label(rollout.get('current_wave', 0), len(waves))}")
    if rollout.get("reason"):
        line += f" ({rollout['reason']})"
    if rollout.get("rollback_snapshot"):
        line += f"; rolled back as #{rollout['rollback_snapshot']}"
    return line


def failure_line(failure: dict) -> str:
    """A failed agent and what it said."""
    message = f": {failure['message']}" if failure.get("message") else ""
    return f"  {failure['agent']} {failure['status']}{message}"


def wave_line(row: WaveRow) -> str:
    return (f"  {row.label} ({row.gate}): activated {row.activated}/{row.targets}, "
            f"acknowledged {row.acknowledged}/{row.targets}, failed {row.failed}")


def awaits_confirm(rollout: dict) -> bool:
    """The current wave has a manual gate and its evidence is complete: only a
    person's confirm moves it on."""
    if rollout.get("state") != "running":
        return False
    waves = rollout.get("waves", [])
    current = rollout.get("current_wave", 0)
    evidence = rollout.get("current_wave_evidence") or {}
    return (current < len(waves) and waves[current].get("gate") == "manual"
            and bool(evidence.get("acknowledged")) and not evidence.get("waiting")
            and not evidence.get("failed"))


def outcome_error(rollout: dict):
    """None when it completed (or still runs); else the error that ends the command:
    rolled back (exit 4) or paused by the server's wave timeout (exit 3)."""
    state = rollout.get("state")
    if state == "rolled_back":
        said = "".join(f"\n{failure_line(failure)}" for failure in rollout.get("failures", []))
        return RolledBack(f"rollout {rollout['id']} was rolled back: "
                          f"{rollout.get('reason') or 'no reason given'}{said}",
                          body={"rollout": rollout})
    if state == "paused":
        return TimedOut(f"rollout {rollout['id']} is paused: "
                        f"{rollout.get('reason') or 'no reason given'} (confirm resumes it)",
                        body={"rollout": rollout})
    return None


def follow(client, rollout_id: int, *, display, timeout_s: float, interval_s: float,
           clock=time.monotonic, sleep=time.sleep) -> dict:
    """Poll the rollout until it is completed, rolled back or paused, or until
    `timeout_s` passes (TimedOut). A transient failure (no answer, 429, 5xx) is
    noted and asked again until then; any other refusal ends it."""
    deadline = clock() + timeout_s
    rollout, hinted = None, set()
    while True:
        try:
            rollout = client.get(endpoints.rollout(rollout_id))
            display.update(rollout)
            if rollout["state"] != "running":
                return rollout
            if awaits_confirm(rollout) and rollout["current_wave"] not in hinted:
                hinted.add(rollout["current_wave"])  # once at each manual gate
                display.note(f"{wave_label(rollout['current_wave'])}: acknowledged, "
                             "waiting for a confirm: "
                             f"bellwether rollout confirm {rollout_id}")
        except Unreachable as exc:
            display.note(f"{exc.message}; asking again")
        except Refused as exc:
            if exc.status not in TRANSIENT_STATUSES:
                raise
            display.note(f"the server answered {exc.status} {exc.code}; asking again")
        if clock() + interval_s > deadline:
            raise TimedOut(f"rollout {rollout_id} did not finish within {timeout_s:g} s"
                           + (f" ({summary_line(rollout)})" if rollout else ""),
                           body={"rollout": rollout})
        sleep(interval_s)
