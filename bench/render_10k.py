"""Benchmark: render + validate an environment of N services (default 10,000) into
two files, against the fastest plain-Python way to make the same two files.

The environment's config is YAML with N services (port, replicas, a tag list);
two templates make an nginx upstream file (a loop) and a JSON file (tojson).

  render     configlang.rendering.render_source: parse the config with every bound
             (size, nesting, node count, JSON types, duplicate keys), merge the
             layers, render in the sandbox under the render budget, check each
             file (the JSON must parse), checksum. What a publish runs in its
             worker's child process (the fork itself is not timed).
  baseline   libyaml's CSafeLoader (no bounds), the same two files built with
             f-strings and json.dumps, json.loads of the JSON file: the least work
             that makes the same files from the same text on this machine.

Prints the best of --rounds for each, the ratio, and whether render met the goal
(< 0.5 s at 10,000 services).

    .venv/bin/python bench/render_10k.py [--services 10000] [--rounds 5]
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from configlang.rendering import render_source  # noqa: E402

GOAL_S = 0.5

UPSTREAMS = """\
{% for name, service in services.items() %}upstream {{ name }} {
    server 127.0.0.1:{{ service.port }} max_fails={{ service.replicas }};
}
{% endfor %}"""


def config_text(services: int) -> str:
    lines = ["services:"]
    for i in range(services):
        lines += [f"  svc-{i:05d}:", f"    port: {10000 + i}", f"    replicas: {1 + i % 3}",
                  f"    tags: [web, zone-{i % 4}]"]
    return "\n".join(lines) + "\n"


def source(text: str) -> dict:
    limits = {"max_config_bytes": 8 * 1024 * 1024, "max_config_depth": 32,
              "max_config_nodes": 1_000_000, "max_file_bytes": 8 * 1024 * 1024,
              "max_snapshot_bytes": 32 * 1024 * 1024, "max_files": 500,
              "max_template_iterations": 1_000_000}
    return {"limits": limits, "config": text, "application": "bench", "environment": "prod",
            "templates": [{"path": "upstreams.conf", "source": UPSTREAMS},
                          {"path": "services.json", "source": "{{ services | tojson }}\n"}],
            "fallback_files": [], "policy": None, "tenant_restrictions": None,
            "descriptor": None, "config_schema": None}


def baseline(text: str) -> list:
    config = yaml.load(text, Loader=yaml.CSafeLoader)
    services = config["services"]
    upstreams = "".join(
        f"upstream {name} {{\n    server 127.0.0.1:{s['port']} max_fails={s['replicas']};\n}}\n"
        for name, s in services.items())
    as_json = json.dumps(services) + "\n"
    json.loads(as_json)
    return [upstreams, as_json]


def render(text: str) -> list:
    rendered = render_source(source(text), seconds=60)
    if rendered.problems:
        raise SystemExit(f"render problems: {rendered.problems[:3]}")
    return [f["content"] for f in sorted(rendered.files, key=lambda f: f["path"],
                                          reverse=True)]


def best_of(rounds: int, work, text: str) -> tuple:
    best, result = float("inf"), None
    for _ in range(rounds):
        started = time.perf_counter()
        result = work(text)
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    text = config_text(args.services)
    base_s, base_files = best_of(args.rounds, baseline, text)
    render_s, render_files = best_of(args.rounds, render, text)
    if render_files[0] != base_files[0] or json.loads(render_files[1]) != json.loads(
            base_files[1]):
        raise SystemExit("render and baseline made different files")

    print(f"services: {args.services}, config: {len(text.encode()) // 1024} KiB, files: "
          f"{', '.join(f'{len(f.encode()) // 1024} KiB' for f in render_files)}")
    print(f"baseline (CSafeLoader + f-strings + json): {base_s:.3f} s")
    print(f"render + validate (render_source):          {render_s:.3f} s")
    print(f"ratio render/baseline: {render_s / base_s:.2f}; goal < {GOAL_S} s: "
          f"{'met' if render_s < GOAL_S else 'NOT met'}")


if __name__ == "__main__":
    main()
