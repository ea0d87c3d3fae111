"""`bellwether`: the command line, its options and help, and exit codes (docs/ci.md).

    0 done (a rollout completed)        3 timed out, or the rollout is paused
    1 the server refused (its envelope) 4 the rollout was rolled back
    2 bad usage, configuration or file  5 the server could not be reached
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from cli import commands, rollouts
from cli.client import Client
from cli.config import profile_load, token_hint
from cli.errors import USAGE, CliError
from cli.render import Output

ENVIRONMENT = re.compile(r"^[A-Za-z0-9_-]+/[A-Za-z0-9_-]+$")
WAVE = re.compile(r"^(?:(\d+)%|(\d+))(?::(auto|manual))?(?::(\d+))?$")
LABEL = re.compile(r"^([^=\s]+)=(\S*)$")

MAIN_HELP = """\
Server and token: BELLWETHER_URL and BELLWETHER_TOKEN, or a profile of the config
file (~/.config/bellwether/config.toml, or --config):

    default_profile = "prod"
    [profiles.prod]
    url = "https://bellwether.example.com"
    token_file = "~/.config/bellwether/prod.token"   # or: token = "bwu_…"

Create a token with `manage.py api_token create USERNAME --name ci` or in the admin.

Exit codes: 0 done (a rollout completed), 1 the server refused (its error is
shown: status, code, message, fields), 2 bad usage, configuration or file,
3 timed out (or the rollout paused), 4 the rollout was rolled back, 5 the
server could not be reached. Recipes for CI: docs/ci.md.

examples:
  bellwether environments
  bellwether publish -f release.yaml --dry-run
  bellwether rollout start shop/prod --canary-gate auto --wave 50% --wait
  bellwether rollout status shop/prod --watch
"""


def environment_name(value: str) -> str:
    if not ENVIRONMENT.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not APPLICATION/ENVIRONMENT "
                                         "(e.g. shop/prod)")
    return value


def positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return int(value)


def whole(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number")
    return int(value)


def seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number <= 7 * 86400:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds")
    return number


def wave_spec(value: str) -> dict:
    """25% | 3, then optionally :auto or :manual, then :BAKE_S (e.g. 50%:manual:600)."""
    match = WAVE.match(value)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a wave: PERCENT% or COUNT, optionally :auto|:manual and "
            ":BAKE_SECONDS (e.g. 25%, 3:manual, 100%:auto:600)")
    percent, count, gate, bake = match.groups()
    spec = {"percent": int(percent)} if percent else {"count": int(count)}
    if gate:
        spec["gate"] = gate
    if bake:
        spec["bake_s"] = int(bake)
    return spec


def label(value: str) -> tuple[str, str]:
    match = LABEL.match(value)
    if not match:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE")
    return match.group(1), match.group(2)


class Labels(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        labels = dict(getattr(namespace, self.dest) or {})
        labels[values[0]] = values[1]
        setattr(namespace, self.dest, labels)


def agents(value: str) -> list[int | str]:
    """Agents by id or name, comma-separated: 12,web-1 (the server says which names
    are no agents of the environment)."""
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{value!r} names no agent (e.g. web-1,web-2 or 12,13)")
    return [int(part) if part.isdigit() else part for part in parts]


class Extend(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (getattr(namespace, self.dest) or []) + values)


def common_options(suppress: bool) -> argparse.ArgumentParser:
    """Accepted before or after the command; the command's copy wins when given."""
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("connection and output")
    group.add_argument("--output", "-o", choices=["text", "json"], default=default("text"),
                       help="json: one JSON document on stdout, for scripts (default text)")
    group.add_argument("--config", default=default(None),
                       help="config file (default ~/.config/bellwether/config.toml, "
                            "or BELLWETHER_CONFIG)")
    group.add_argument("--profile", default=default(None),
                       help="profile of the config file (default: BELLWETHER_PROFILE, "
                            "its default_profile, or 'default')")
    group.add_argument("--url", default=default(None),
                       help="server URL (default: BELLWETHER_URL, or the profile's url)")
    return parent


def add_command(commands_parser, name: str, handler, summary: str, examples: str,
                parents) -> argparse.ArgumentParser:
    parser = commands_parser.add_parser(
        name, help=summary, description=summary, parents=parents,
        epilog="examples:\n" + examples, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(handler=handler)
    return parser


def following_options(parser, default_timeout: float) -> None:
    parser.add_argument("--timeout", type=seconds, default=default_timeout,
                        help=f"give up after this many seconds: exit 3 (default "
                             f"{default_timeout:g})")
    parser.add_argument("--interval", type=seconds, default=2.0,
                        help="seconds between two looks at the rollout (default 2)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bellwether", description="Bellwether from the command line: environments, "
        "publishing, staged rollouts.", epilog=MAIN_HELP, parents=[common_options(False)],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parents = [common_options(True)]
    environment_commands(sub, parents)
    rollout_commands(sub, parents)
    return parser


def environment_commands(sub, parents) -> None:
    add_command(sub, "environments", commands.environments,
                "List the environments you may see, with what is active and rolling out.",
                "  bellwether environments\n  bellwether environments -o json | jq -r "
                "'.[].full_name'", parents)
    p = add_command(sub, "preview", commands.preview,
                    "Render an environment's current inputs; records nothing (exit 1 "
                    "when invalid).", "  bellwether preview shop/staging\n", parents)
    p.add_argument("environment", type=environment_name, help="APPLICATION/ENVIRONMENT")
    p = add_command(sub, "diff", commands.diff, "Show what a snapshot changes, file by file.",
                    "  bellwether diff shop/prod 2            # against #1\n"
                    "  bellwether diff shop/prod 5 --against 2\n", parents)
    p.add_argument("environment", type=environment_name, help="APPLICATION/ENVIRONMENT")
    p.add_argument("snapshot", type=positive, help="snapshot number")
    p.add_argument("--against", type=positive, help="compare with this snapshot "
                   "(default: the one before)")
    p = add_command(sub, "publish", commands.publish,
                    "Publish a descriptor file (or an environment's current inputs) and "
                    "wait until the snapshot is stored.",
                    "  bellwether publish -f release.yaml --dry-run   # check it, record "
                    "nothing\n  bellwether publish -f release.yaml\n"
                    "  bellwether publish shop/staging              # the current inputs\n",
                    parents)
    p.add_argument("environment", nargs="?", type=environment_name,
                   help="APPLICATION/ENVIRONMENT: publish its current inputs")
    p.add_argument("-f", "--file", help="descriptor (YAML, or JSON when named *.json)")
    p.add_argument("--dry-run", action="store_true",
                   help="answer the effective config and diff; record nothing (exit 1 when "
                        "it would not publish)")
    p.add_argument("--timeout", type=seconds, default=300.0,
                   help="seconds to wait for the render (default 300; then exit 3)")
    p = add_command(sub, "agents", commands.agents,
                    "List an environment's agents: sync, applied and desired snapshot, "
                    "last report.", "  bellwether agents shop/prod\n"
                    "  bellwether agents shop/prod --drift drifted -o json\n", parents)
    p.add_argument("environment", type=environment_name, help="APPLICATION/ENVIRONMENT")
    p.add_argument("--drift", choices=["any", "drifted", "not-drifted"], default="any",
                   help="only agents with (or without) unrestored drift")
    p = add_command(sub, "promote", commands.promote,
                    "Promote what one environment runs to another of its application: "
                    "its release applied to the target's own config, published there "
                    "(and, where governed, to be approved).",
                    "  bellwether promote shop/staging shop/prod\n"
                    "  bellwether promote shop/staging shop/prod --snapshot 12 --confirm\n",
                    parents)
    p.add_argument("source", type=environment_name, help="from APPLICATION/ENVIRONMENT")
    p.add_argument("target", type=environment_name, help="to APPLICATION/ENVIRONMENT")
    p.add_argument("--snapshot", type=positive, help="the snapshot you expect the source to "
                   "run (409 stale when it runs another)")
    p.add_argument("--confirm", action="store_true", help="release it even if a file is "
                   "emptied or the files shrink sharply (the degenerate-render guard)")
    add_config_command(sub, parents)


def add_config_command(sub, parents) -> None:
    add_command(sub, "config", show_config,
                "Show the server, profile and where the token comes from (never the "
                "token itself).", "  BELLWETHER_PROFILE=prod bellwether config\n", parents)


def rollout_commands(sub, parents) -> None:
    p = add_command(sub, "approve", commands.approve,
                    "Approve a release asking for approval (docs/governance.md), naming "
                    "the content you reviewed: a release changed since is refused. "
                    "Without --checksum and --plan-digest it shows the content and the "
                    "command that approves it.",
                    "  bellwether approve 42            # shows what you would approve\n"
                    "  bellwether approve 42 --checksum sha256:… --plan-digest 3f… "
                    "--comment 'CHG-7'\n", parents)
    p.add_argument("release", type=positive, help="release id")
    p.add_argument("--checksum", help="the snapshot checksum you reviewed")
    p.add_argument("--plan-digest", help="the plan digest you reviewed")
    p.add_argument("--comment", help="why, for the audit log")
    rollout = sub.add_parser(
        "rollout", help="Start, watch, confirm or roll back a staged rollout.",
        description="Staged rollouts (docs/rollouts.md).", parents=parents,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bellwether rollout start shop/prod --canary-gate auto --wait\n"
               "  bellwether rollout status shop/prod --watch\n"
               "  bellwether rollout confirm 42\n  bellwether rollout rollback 42\n")
    actions = rollout.add_subparsers(dest="action", metavar="ACTION", required=True)
    rollout_start_command(actions, parents)
    p = add_command(actions, "status", rollouts.status,
                    "Show a rollout's waves (or watch them live until it finishes).",
                    "  bellwether rollout status 42\n"
                    "  bellwether rollout status shop/prod --watch   # its active (or "
                    "latest) rollout\n", parents)
    p.add_argument("rollout", help="rollout id, or APPLICATION/ENVIRONMENT")
    p.add_argument("--watch", action="store_true", help="follow until it finishes; exit "
                   "like --wait of rollout start")
    following_options(p, 3600.0)
    for action, summary in (("confirm", "Confirm the current wave (its agents must have "
                             "acknowledged)."), ("rollback", "Roll the rollout back: the "
                             "previous content as a new, higher snapshot.")):
        p = add_command(actions, action, lambda c, a, o, action=action:
                        rollouts.transition(c, a, o, action), summary,
                        f"  bellwether rollout {action} 42\n", parents)
        p.add_argument("rollout", type=positive, help="rollout id")
        p.add_argument("--expected-version", type=positive,
                       help="the version you saw (default: the current one)")


def rollout_start_command(actions, parents) -> None:
    p = add_command(
        actions, "start", rollouts.start,
        "Start a staged rollout of a snapshot (default: the newest), canaries first.",
        "  bellwether rollout start shop/prod --canary-label az=eu-1a --wave 25% --wave 100%\n"
        "  bellwether rollout start shop/prod --snapshot 7 --canary-gate auto --wait "
        "--timeout 1800\n  bellwether rollout start shop/prod --strategy canary-then-10-percent "
        "--wait\n\nwith --wait: exit 0 completed, 4 rolled back, 3 paused or timed out "
        "(the reason is shown)\n", parents)
    p.add_argument("environment", type=environment_name, help="APPLICATION/ENVIRONMENT")
    p.add_argument("--snapshot", type=positive, help="snapshot number (default: the newest)")
    p.add_argument("--strategy", help="a named rollout strategy of the server; the options "
                   "below override its values")
    p.add_argument("--canary-agents", type=agents, action=Extend, metavar="AGENTS",
                   help="canary agents by name or id, comma-separated (repeatable)")
    p.add_argument("--canary-label", dest="canary_labels", type=label, action=Labels,
                   metavar="KEY=VALUE", help="agents with this label are canaries "
                   "(repeatable)")
    p.add_argument("--canary-gate", choices=["auto", "manual"],
                   help="after the canaries: move on by itself or on a confirm (server "
                        "default: manual)")
    p.add_argument("--bake-s", type=whole, help="seconds the canaries bake once acknowledged")
    p.add_argument("--wave", dest="waves", type=wave_spec, action="append",
                   metavar="SPEC", help="a wave after the canaries: 25%% or 3, optionally "
                   ":auto|:manual and :BAKE_SECONDS (repeatable; the last takes the rest)")
    p.add_argument("--failure-threshold", type=whole,
                   help="failed agents tolerated before rolling back (server default 0)")
    p.add_argument("--wave-timeout-s", type=positive,
                   help="seconds a wave may take to acknowledge before the rollout pauses")
    p.add_argument("--confirm", action="store_true", help="roll it out even if a file is "
                   "emptied or the files shrink sharply (the degenerate-render guard)")
    p.add_argument("--wait", action="store_true",
                   help="wait for the outcome: exit 0 completed, 4 rolled back, 3 paused "
                        "or timed out")
    following_options(p, 1800.0)


def show_config(client, args, out: Output) -> int:
    profile = client.profile
    document = {"url": profile.url, "profile": profile.name,
                "token": token_hint(profile.token), "token_source": profile.token_source,
                "timeout_s": profile.timeout_s}
    if out.is_json:
        out.data(document)
    else:
        for key, value in document.items():
            out.line(f"{key}: {value}")
    return 0


def main(argv: list[str] | None = None, *, environ=None, stdout=None, stderr=None) -> int:
    environ = os.environ if environ is None else environ
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else USAGE
    out = Output(args.output, stdout, stderr)
    if getattr(args, "handler", None) is None:
        parser.print_help(file=stderr or sys.stderr)
        return USAGE
    try:
        profile = profile_load(config_option=args.config, profile_option=args.profile,
                               url_option=args.url, environ=environ)
        for warning in profile.warnings:
            out.note(f"warning: {warning}")
        return args.handler(Client(profile), args, out)
    except CliError as exc:
        out.error(exc)
        return exc.exit_code
    except (KeyError, TypeError, AttributeError) as exc:
        error = CliError(f"the server's answer is not what this CLI expects ({exc!r}): "
                         "is the server of another version?")
        out.error(error)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
