"""The rollout commands: start (optionally waiting for the outcome), status
(optionally watching it live), confirm and roll back."""

from __future__ import annotations

from cli import endpoints
from cli.errors import CliError, UsageError
from cli.progress import (
    failure_line,
    follow,
    outcome_error,
    summary_line,
    wave_line,
    wave_rows,
)
from cli.render import Output, rollout_display

# Options of `rollout start` sent only when given, so a named --strategy's values
# (or the server's defaults) hold for everything else.
START_OPTIONS = ("strategy", "canary_agents", "canary_labels", "canary_gate", "bake_s",
                 "waves", "failure_threshold", "wave_timeout_s")


def start_request(args, snapshot: int) -> dict:
    request = {"snapshot": snapshot}
    for name in START_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            request[name] = value
    if getattr(args, "confirm", False):
        request["confirm"] = True
    return request


def newest_snapshot(client, environment: str) -> int:
    page = client.get(endpoints.snapshots(environment), limit=1)
    if not page["results"]:
        raise CliError(f"{environment} has no snapshot to roll out: publish one first")
    newest = page["results"][0]
    if newest["state"] != "ready":
        raise CliError(f"{environment}'s newest snapshot #{newest['number']} is "
                       f"{newest['state']}: give --snapshot N")
    return newest["number"]


def start(client, args, out: Output) -> int:
    snapshot = args.snapshot or newest_snapshot(client, args.environment)
    rollout = client.post(endpoints.rollouts(args.environment), start_request(args, snapshot))
    if not args.wait:
        rollout_shown(rollout, out)
        return 0
    if not out.is_json:
        out.line(f"started rollout {rollout['id']}; waiting up to {args.timeout:g} s")
    return followed(client, rollout["id"], args, out)


def followed(client, rollout_id: int, args, out: Output) -> int:
    """Follow until finished: 0 completed, else the outcome's error (rolled back 4,
    paused or timed out 3)."""
    display = rollout_display(out)
    try:
        rollout = follow(client, rollout_id, display=display, timeout_s=args.timeout,
                         interval_s=args.interval)
    finally:
        display.close()
    error = outcome_error(rollout)
    if error is not None:
        raise error
    if out.is_json:
        out.data(rollout)
    else:
        out.line(f"rollout {rollout_id} completed: #{rollout['snapshot']} is active",
                 style="green")
    return 0


def rollout_id_for(client, target: str) -> int:
    """A rollout id as given, or an environment's active rollout (else its latest)."""
    if target.isdigit():
        return int(target)
    if target.count("/") != 1:
        raise UsageError(f"{target!r} is neither a rollout id nor an environment "
                         "(APPLICATION/ENVIRONMENT)")
    active = client.get(endpoints.environment(target)).get("active_rollout")
    if active:
        return active["id"]
    page = client.get(endpoints.rollouts(target), limit=1)
    if not page["results"]:
        raise CliError(f"{target} has no rollout")
    return page["results"][0]["id"]


def status(client, args, out: Output) -> int:
    rollout_id = rollout_id_for(client, args.rollout)
    if args.watch:
        return followed(client, rollout_id, args, out)
    rollout_shown(client.get(endpoints.rollout(rollout_id)), out)
    return 0


def rollout_shown(rollout: dict, out: Output) -> None:
    if out.is_json:
        out.data(rollout)
        return
    out.line(summary_line(rollout))
    for row in wave_rows(rollout):
        out.line(wave_line(row))
    for failure in rollout.get("failures", []):
        out.line(failure_line(failure), style="red")


def transition(client, args, out: Output, action: str) -> int:
    """confirm / rollback at the version given, else at the version read now (the
    server refuses a version that changed since with 409 stale)."""
    version = args.expected_version
    if version is None:
        version = client.get(endpoints.rollout(args.rollout))["version"]
    rollout = client.post(f"{endpoints.rollout(args.rollout)}/{action}",
                          {"expected_version": version})
    rollout_shown(rollout, out)
    return 0
