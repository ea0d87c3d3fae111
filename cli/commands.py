"""The commands about environments, snapshots, descriptors and agents: each reads
its arguments, calls the API through the client and shows the answer."""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text

from cli import endpoints
from cli.errors import CliError, Refused, TimedOut, UsageError
from cli.render import Output, detail_line, shown

PAGE = 500
MAX_PAGES = 1000  # 500,000 items: past this a list that never ends is the server's fault
DESCRIPTOR_TYPES = {".json": "application/json"}  # anything else is sent as YAML


def all_pages(client, path: str, **query) -> list[dict]:
    """Every item of a paginated list (limit/offset; the server clamps at 500), or
    an error when the list does not end: a `next` page seen before, or MAX_PAGES."""
    items, offset, seen = [], 0, set()
    for _ in range(MAX_PAGES):
        page = client.get(path, limit=PAGE, offset=offset or None, **query)
        items += page["results"]
        following = page.get("next")
        if not following or not page["results"]:
            return items
        if str(following) in seen:
            raise CliError(f"GET {path}: the server named the same next page twice "
                           f"({str(following)[:200]}): the list does not end")
        seen.add(str(following))
        offset += len(page["results"])
    raise CliError(f"GET {path}: the list did not end after {MAX_PAGES} pages "
                   f"({len(items)} items): stopped")


def snapshot_ref(snapshot: dict | None) -> str:
    return "-" if not snapshot else f"#{snapshot['number']}"


def environments(client, args, out: Output) -> int:
    found = all_pages(client, endpoints.ENVIRONMENTS)
    if out.is_json:
        out.data(found)
        return 0
    rows = []
    for env in found:
        rollout = env.get("active_rollout")
        rows.append([env["full_name"], env["release_policy"], snapshot_ref(env["active_snapshot"]),
                     env["snapshot_counter"],
                     f"{rollout['id']} {rollout['state']} #{rollout['snapshot']}" if rollout
                     else "-"])
    out.table(["environment", "policy", "active", "snapshots", "rollout"], rows)
    return 0


def preview(client, args, out: Output) -> int:
    body = client.get(endpoints.environment(args.environment) + "/preview")
    if out.is_json:
        out.data(body)
    else:
        out.line(f"{args.environment}: {'valid' if body['valid'] else 'INVALID'}"
                 + (f", checksum {body['checksum']}" if body.get("checksum") else ""))
        problems_shown(out, body.get("errors", []))
        for item in body.get("files", []):
            out.line(f"  {item['path']} ({len(item['content'].encode())} bytes)")
    return 0 if body["valid"] else invalid_exit(out, "the rendered configuration is invalid")


def invalid_exit(out: Output, message: str) -> int:
    if not out.is_json:
        out.note(message)
    return 1


def problems_shown(out: Output, problems: list[dict]) -> None:
    for problem in problems:
        out.line(Text("  ! ", style="red") + shown(detail_line(problem)))


def diff(client, args, out: Output) -> int:
    body = client.get(endpoints.snapshot(args.environment, args.snapshot) + "/diff",
                      against=args.against)
    if out.is_json:
        out.data(body)
        return 0
    against = "nothing" if body["against"] is None else f"#{body['against']}"
    out.line(f"{args.environment} #{body['snapshot']} against {against}: "
             f"{len(body['files'])} file(s) changed")
    for item in body["files"]:
        out.line(f"{item['status']}: {item['path']}", style="bold")
        if item.get("too_large"):
            out.line(f"  too large to compare line by line: {item.get('old_bytes')} -> "
                     f"{item.get('new_bytes')} bytes")
        for text in item.get("diff", "").splitlines():
            style = ("green" if text.startswith("+") and not text.startswith("+++")
                     else "red" if text.startswith("-") and not text.startswith("---")
                     else None)
            out.line(shown(text), style=style)
    return 0


# --- publishing -------------------------------------------------------------------------


def publish(client, args, out: Output) -> int:
    if bool(args.environment) == bool(args.file):
        raise UsageError("publish takes an environment (its current inputs) or -f "
                         "DESCRIPTOR, not both and not neither")
    if args.dry_run and not args.file:
        raise UsageError("--dry-run previews a descriptor: give -f DESCRIPTOR")
    if args.environment:
        body = client.post(endpoints.environment(args.environment) + "/publish")
    else:
        path = Path(args.file)
        data = descriptor_bytes(path)
        try:
            body = client.post_raw(endpoints.DESCRIPTORS, data,
                                   DESCRIPTOR_TYPES.get(path.suffix.lower(), "application/yaml"),
                                   dry_run="1" if args.dry_run else None)
        except Refused as exc:  # the server's "YAML body:6" is this file's line 6
            exc.message = f"{path}: {exc.message}"
            raise
        if args.dry_run:
            return dry_run_shown(body, out)
    body = publication_finished(client, body, timeout_s=args.timeout, out=out)
    publication_shown(body, out)
    return 0


def descriptor_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"descriptor file {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"descriptor file {path} cannot be read: {exc.strerror}") from None


def dry_run_shown(body: dict, out: Output) -> int:
    if out.is_json:
        out.data(body)
    else:
        against = "nothing" if body.get("against") is None else f"#{body['against']}"
        out.line(f"dry run: {'valid' if body['valid'] else 'INVALID'}; "
                 f"{len(body.get('diff', []))} file(s) differ from {against}")
        problems_shown(out, body.get("errors", []))
        for item in body.get("diff", []):
            out.line(f"  {item.get('status')}: {item.get('path')}")
    return 0 if body["valid"] else invalid_exit(out, "the descriptor would not publish")


def publication_finished(client, body: dict, *, timeout_s: float, out: Output,
                         interval_s: float = 0.5) -> dict:
    """A publication still rendering (202) is asked again until it is stored."""
    deadline = time.monotonic() + timeout_s
    while body.get("state") == "rendering":
        if time.monotonic() >= deadline:
            raise TimedOut(f"publication {body['id']} still renders after {timeout_s:g} s "
                           f"(ask again: GET {body['url']})", body={"publication": body})
        out.note(f"rendering ({body.get('progress') or 'queued'})…")
        time.sleep(interval_s)
        body = client.get(endpoints.publication(body["id"]))
    if body.get("state") in ("invalid", "superseded"):
        raise CliError(f"publication {body['id']} is {body['state']}",
                       details=body.get("errors", []), body={"publication": body})
    return body


def publication_shown(body: dict, out: Output) -> None:
    if out.is_json:
        out.data(body)
        return
    snapshot = body["snapshot"]
    out.line(f"{body['environment']} #{snapshot['number']} ({snapshot['label']}) "
             f"{snapshot['state']}{' (identical content existed)' if body['deduplicated'] else ''}"
             f", checksum {snapshot['checksum']}")
    release = body.get("release") or {}
    if body.get("activated"):
        out.line("activated: agents following the environment apply it now")
    else:
        ways = " or ".join(release.get("released_by", [])) or "nothing"
        out.line(f"not activated ({release.get('policy')}): released by {ways}"
                 + (f"; {release['note']}" if release.get("note") else ""))


# --- agents, approvals, promotions ------------------------------------------------------


def agents(client, args, out: Output) -> int:
    drifted = {"drifted": "1", "not-drifted": "0"}.get(args.drift)
    found = all_pages(client, endpoints.environment(args.environment) + "/agents",
                      drifted=drifted)
    if out.is_json:
        out.data(found)
        return 0
    rows = []
    for agent in found:
        status = agent.get("status", {})
        held = status.get("held_by") or {}
        rows.append([agent["id"], agent["name"], status.get("sync"),
                     snapshot_ref(status.get("applied")), snapshot_ref(status.get("desired")),
                     status.get("last_status") or "-", "yes" if status.get("online") else "no",
                     held.get("kind", "-"), "yes" if status.get("drift") else "-"])
    out.table(["id", "name", "sync", "applied", "desired", "last report", "online", "held",
               "drift"], rows, title=f"{args.environment}: {len(found)} agent(s)")
    return 0


def approve(client, args, out: Output) -> int:
    """Approve a release (docs/governance.md) naming the content you reviewed — its
    snapshot's checksum and its plan's digest, given as --checksum and
    --plan-digest. Without them, show the release's content and the command that
    approves exactly it: nothing is approved unseen, and a release changed since is
    refused by the server (409 stale)."""
    if not (args.checksum and args.plan_digest):
        release = client.get(endpoints.release(args.release))
        out.line(f"release {args.release}: #{release.get('snapshot')} of "
                 f"{release.get('environment')} ({release.get('state')})")
        for name in ("checksum", "plan_digest", "plan"):
            out.line(f"  {name}: {release.get(name)}")
        raise UsageError(
            "name the content you reviewed to approve it: bellwether approve "
            f"{args.release} --checksum {release.get('checksum')} --plan-digest "
            f"{release.get('plan_digest')}", body={"release": release})
    request = {"checksum": args.checksum, "plan_digest": args.plan_digest}
    if args.comment:
        request["comment"] = args.comment
    body = client.post(endpoints.release(args.release) + "/approve", request)
    if out.is_json:
        out.data(body)
    else:
        out.line(f"release {args.release}: approved #{body.get('snapshot')} "
                 f"({args.checksum[:19]}); now {body.get('state', '?')}")
    return 0


def promote(client, args, out: Output) -> int:
    """Publish on the target what the source runs (its release applied to the
    target's own config), waiting for the render like `publish`."""
    request = {"from": args.source, "confirm": args.confirm}
    if args.snapshot is not None:
        request["number"] = args.snapshot
    body = client.post(endpoints.promote(args.target), request)
    if out.is_json:
        out.data(body)
    else:
        snapshot = body.get("snapshot") or {}
        out.line(f"promoted {args.source} to {args.target}: "
                 f"{snapshot_ref(snapshot) if snapshot else body.get('state', '?')}")
    return 0
