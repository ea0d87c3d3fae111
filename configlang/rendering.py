"""Render a snapshot's stored source into files, and validate the result.

Pure: no database. The same function renders a publish, a preview and a
rollback, so a rollback of snapshot n reproduces n's content exactly.
"""

import hashlib
import json
import posixpath
import re
import tomllib
from dataclasses import dataclass, field

import jsonschema
from jinja2 import TemplateNotFound
from jinja2 import exceptions as jinja_errors
from jsonschema_specifications import REGISTRY as BUNDLED_SCHEMAS
from referencing.exceptions import Unresolvable

from configlang.budget import DEFAULT_RENDER_SECONDS, RenderBudget, RenderLimit
from configlang.merge import merge
from configlang.problems import Problem
from configlang.sandbox import template_environment
from configlang.secrets import (
    Placeholders,
    manifest,
    seal_template,
    secret_file_mode,
    template_context,
    unsealed,
)
from configlang.visible import invisible_problem
from configlang.yamlconfig import load_config, load_yaml

SOURCE_FORMAT = 1
DEFAULT_TEMPLATE_ITERATIONS = 1_000_000
AGENT_TEMP_MARKER = ".bellwether-tmp-"  # agent/files.py: the agent's temporary files
# Everything a render builds, together, may be this many times the snapshot limit.
PRODUCED_BYTES_FACTOR = 16


@dataclass
class Rendered:
    effective_config: dict
    provenance: dict = field(default_factory=dict)
    files: list[dict] = field(default_factory=list)
    fallback_files: list[dict] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # The secrets manifest: [{placeholder, reference, files}] (configlang.secrets).
    secrets: list[dict] = field(default_factory=list)
    # The mode of files receiving secrets the environment declares ("0640"); None: 0600.
    secret_file_mode: str | None = None
    # A render_limit the server's load decided (a deadline, memory, a killed child).
    load_dependent: bool = False
    # A render_limit of wall time (its deadline, a child stopped or not started in
    # time): the server's load decided it; a web request answers 503, not 400.
    timed_out: bool = False

    @property
    def is_valid(self) -> bool:
        return not self.problems

    @property
    def checksum(self) -> str:
        return content_checksum(self.files, self.secret_file_mode)

    def report(self) -> dict:
        return {
            "valid": self.is_valid,
            "errors": [p.as_dict() for p in self.problems],
            "file_count": len(self.files),
            "total_bytes": sum(len(f["content"].encode()) for f in self.files),
            "secrets": [{"reference": s["reference"], "files": s["files"]}
                        for s in self.secrets],
            **({"secret_file_mode": self.secret_file_mode} if self.secret_file_mode else {}),
        }


def content_checksum(files: list[dict], secret_file_mode: str | None = None) -> str:
    """sha256 over the canonical form: a JSON array of [path, content] sorted by path,
    each sealed secret placeholder written as the reference it stands for: the
    checksum names the content, whatever tokens a render chose, so identical
    content keeps one checksum (duplicates, quarantine, in sync). A declared
    secret file mode is content too: then the form is
    {"files": <that array>, "secret_file_mode": "0640"}.

    The agent recomputes this with the standard library's json module.
    """
    pairs = [[f["path"], unsealed(f["content"])]
             for f in sorted(files, key=lambda f: f["path"])]
    canonical = json.dumps(
        pairs if secret_file_mode is None
        else {"files": pairs, "secret_file_mode": secret_file_mode},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def path_problem(path: str) -> str | None:
    """Why `path` is not a safe relative file path, or None when it is."""
    if not path:
        return "the path is empty"
    if len(path) > 255:
        return "the path is longer than 255 characters"
    if "\\" in path or "\x00" in path or any(ord(c) < 32 for c in path):
        return "the path contains a backslash or a control character"
    for part in path.split("/"):
        invisible = invisible_problem(part)
        if invisible:
            return f"the path {invisible}"
    if AGENT_TEMP_MARKER in path:
        return f"the name {AGENT_TEMP_MARKER!r} is reserved for the agent's temporary files"
    if path.startswith("/"):
        return "the path must be relative"
    if posixpath.normpath(path) != path or any(part in ("", ".", "..") for part in path.split("/")):
        return "the path must be normalised, without '.', '..' or empty segments"
    return None


def path_collisions(paths: list[str]) -> list[tuple[str, str]]:
    """Pairs (a, b) where file a would have to be a directory of file b."""
    taken = set(paths)
    collisions = []
    for path in sorted(taken):
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in taken:
                collisions.append((parent, path))
    return collisions


_TOML_LINE = re.compile(r"at line (\d+)")


def file_problems(path: str, content: str, *, limits: dict) -> list[Problem]:
    """Checks by extension: .json, .yaml/.yml and .toml files must parse. No file may
    hold NUL: it is text, and PostgreSQL cannot store NUL in text."""
    if "\x00" in content:
        return [Problem("file_binary", "contains a NUL character", file=path)]
    lower = path.lower()
    if lower.endswith(".json"):
        try:
            json.loads(content)
        except json.JSONDecodeError as exc:
            return [Problem("file_json", exc.msg, file=path, line=exc.lineno)]
    elif lower.endswith((".yaml", ".yml")):
        # Rendered files may be larger than a config; only the file limit applies.
        file_limits = {**limits, "max_config_bytes": limits["max_file_bytes"]}
        _, problems = load_yaml(content, limits=file_limits, file=path)
        return [Problem("file_yaml", p.message, file=path, line=p.line) for p in problems]
    elif lower.endswith(".toml"):
        try:
            tomllib.loads(content)
        except tomllib.TOMLDecodeError as exc:
            match = _TOML_LINE.search(str(exc))
            return [
                Problem("file_toml", str(exc), file=path, line=int(match[1]) if match else None)
            ]
    return []


class _OutputTooLarge(Exception):
    pass


def _template_line(exc: BaseException, paths: set[str]) -> tuple[str | None, int | None]:
    """The innermost template frame of a runtime error (Jinja maps its line numbers)."""
    found: tuple[str | None, int | None] = (None, None)
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename in paths:
            found = (filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


def schema_problems(schema: dict, config: dict) -> list[Problem]:
    """Validate `config` against a JSON Schema. `$ref`s resolve only within the
    schema and the bundled metaschemas: nothing is fetched, so validation never
    depends on (or reaches) another server."""
    try:
        validator_cls = jsonschema.validators.validator_for(schema)
        validator_cls.check_schema(schema)
        validator = validator_cls(schema, registry=BUNDLED_SCHEMAS)
        errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.path)))
    except jsonschema.SchemaError as exc:
        return [Problem("schema_invalid", exc.message, key="config_schema")]
    except Unresolvable as exc:
        return [Problem("schema_invalid", f"unresolvable $ref: {exc}", key="config_schema")]
    except RecursionError:
        return [Problem("schema_invalid", "the schema refers to itself without end",
                        key="config_schema")]
    return [
        Problem("config_schema", error.message, file="config",
                key=".".join(str(p) for p in error.absolute_path) or None)
        for error in errors
    ]


def _syntax_problem(exc: jinja_errors.TemplateSyntaxError, path: str) -> Problem:
    return Problem("template_syntax", exc.message or str(exc), file=exc.name or path,
                   line=exc.lineno)


def _unparsable(exc: Exception, path: str) -> Problem:
    """A template Jinja or Python's compiler could not handle (too deeply nested, a
    literal Python refuses): a template_syntax problem, never an internal error."""
    reason = ("it is nested too deep or too long an expression"
              if isinstance(exc, (RecursionError, MemoryError))
              else f"{type(exc).__name__}: {str(exc)[:200]}")
    return Problem("template_syntax", f"the template cannot be compiled: {reason}",
                   file=path, line=getattr(exc, "lineno", None))


def template_syntax_problems(templates: list[dict]) -> list[Problem]:
    """Compile each template without rendering it: syntax, unknown filters and tests."""
    env = template_environment({}, budget=RenderBudget(
        operations=DEFAULT_TEMPLATE_ITERATIONS, value_bytes=1024 * 1024,
        total_bytes=16 * 1024 * 1024, seconds=DEFAULT_RENDER_SECONDS))
    problems = []
    for template in templates:
        try:
            env.compile(template["source"], name=template["path"], filename=template["path"])
        except jinja_errors.TemplateSyntaxError as exc:
            problems.append(_syntax_problem(exc, template["path"]))
        except Exception as exc:  # noqa: BLE001 - RecursionError, SyntaxError, ValueError...
            problems.append(_unparsable(exc, template["path"]))
    return problems


def render_budget(limits: dict, seconds: float | None = None) -> RenderBudget:
    """The one budget every template of a render draws on (configlang.budget).
    Sources stored before `max_template_iterations` existed get the default."""
    return RenderBudget(
        operations=limits.get("max_template_iterations", DEFAULT_TEMPLATE_ITERATIONS),
        value_bytes=limits["max_file_bytes"],
        total_bytes=PRODUCED_BYTES_FACTOR * limits["max_snapshot_bytes"],
        seconds=DEFAULT_RENDER_SECONDS if seconds is None else seconds)


def _render_templates(
    templates: list[dict], context: dict, limits: dict, budget: RenderBudget
) -> tuple[list[dict], list[Problem]]:
    sources = {t["path"]: t["source"] for t in templates}
    env = template_environment(sources, budget=budget)
    paths = set(sources)
    files, problems = [], []
    for path in sorted(sources):
        try:
            template = env.get_template(path)
        except jinja_errors.TemplateSyntaxError as exc:
            problems.append(_syntax_problem(exc, path))
            continue
        except Exception as exc:  # noqa: BLE001 - see _unparsable
            problems.append(_unparsable(exc, path))
            continue
        chunks, size = [], 0
        try:
            for chunk in template.generate(context):
                size += len(chunk.encode())
                if size > limits["max_file_bytes"]:
                    raise _OutputTooLarge
                chunks.append(chunk)
        except _OutputTooLarge:
            problems.append(
                Problem("file_too_large",
                        f"renders to more than {limits['max_file_bytes']} bytes", file=path)
            )
            continue
        except jinja_errors.TemplateSyntaxError as exc:  # in an included template
            problems.append(_syntax_problem(exc, path))
            continue
        except TemplateNotFound as exc:
            file, line = _template_line(exc, paths)
            problems.append(
                Problem("template_not_found", f"no template named {exc.name!r}",
                        file=file or path, line=line)
            )
            continue
        except (RenderLimit, MemoryError, RecursionError) as exc:
            budget.load_dependent |= isinstance(exc, MemoryError)
            file, line = _template_line(exc, paths)
            problems.append(_limit_problem(exc, file or path, line))
            break  # the budget is the render's: the templates after this one get none
        except jinja_errors.SecurityError as exc:
            file, line = _template_line(exc, paths)
            problems.append(
                Problem("template_security", str(exc), file=file or path, line=line)
            )
            continue
        except (jinja_errors.TemplateError, ArithmeticError, TypeError, ValueError,
                LookupError, AttributeError, OverflowError) as exc:
            file, line = _template_line(exc, paths)
            code = "template_undefined" if isinstance(exc, jinja_errors.UndefinedError) \
                else "template_error"
            problems.append(Problem(code, str(exc), file=file or path, line=line))
            continue
        except Exception as exc:  # noqa: BLE001 - whatever a filter or operator raises
            file, line = _template_line(exc, paths)
            problems.append(Problem("template_error", _error_text(exc), file=file or path,
                                    line=line))
            continue
        files.append({"path": path, "content": "".join(chunks)})
    return files, problems


def _error_text(exc: Exception) -> str:
    """What a template's misuse of a builtin raised (AssertionError, NameError...)."""
    text = str(exc)[:300]
    return f"{type(exc).__name__}: {text}" if text else \
        f"{type(exc).__name__} (a filter or operator was given arguments it cannot handle)"


def _limit_problem(exc: BaseException, file: str, line: int | None) -> Problem:
    reason = (str(exc) if isinstance(exc, RenderLimit)
              else "the render ran out of memory" if isinstance(exc, MemoryError)
              else "macros or includes nested too deep")
    where = f"{file}:{line}" if line else file
    return Problem("render_limit", f"{where}: {reason}", file=file, line=line)


def _values(error) -> str:
    values = error.as_dict()
    shown = [f"{layer} has {values[f'{layer}_value']!r}" for layer in ("environment", "descriptor")
             if f"{layer}_value" in values]
    return f" ({'; '.join(shown)})" if shown else ""


def _promoted(provenance: dict, origin: dict | None) -> dict:
    """A promoted release's keys say where it was promoted from."""
    if not origin:
        return provenance
    where = f"descriptor promoted from {origin['environment']} #{origin['number']}"
    return {key: where if layer == "descriptor" else layer for key, layer in provenance.items()}


def render_source(source: dict, *, seconds: float | None = None) -> Rendered:
    """Render and validate. Every problem found is reported, not only the first;
    the templates render under one budget (`render_budget`), `seconds` of wall
    time at most (default DEFAULT_RENDER_SECONDS)."""
    limits = source["limits"]
    config, problems = load_config(source["config"], limits=limits)
    environment_config, provenance = config, {}
    if not problems:
        merged = merge(environment=config, policy=(source.get("policy") or {}).get("content"),
                       tenant=source.get("tenant_restrictions"),
                       descriptor=source.get("descriptor"),
                       application=source["application"],
                       environment_name=source["environment"])
        config, provenance = merged.config, _promoted(merged.provenance,
                                                      source.get("promoted_from"))
        problems = [Problem(e.as_dict()["code"], f"{e.layer}: {e.message}"
                            + _values(e), file="config", key=e.path) for e in merged.errors]
    rendered = Rendered(effective_config=config, provenance=provenance, problems=list(problems))
    rendered.secret_file_mode, mode_problems = secret_file_mode(environment_config)
    rendered.problems.extend(mode_problems)

    if source.get("config_schema") is not None and not problems:
        rendered.problems.extend(schema_problems(source["config_schema"], config))

    templates, fallback = source["templates"], source["fallback_files"]
    if len(templates) > limits["max_files"] or len(fallback) > limits["max_files"]:
        rendered.problems.append(
            Problem("too_many_files", f"more than {limits['max_files']} files")
        )
        return rendered
    bad_paths = set()
    for kind, entries in (("templates", templates), ("fallback_files", fallback)):
        for entry in entries:
            reason = path_problem(entry["path"])
            if reason:
                bad_paths.add((kind, entry["path"]))
                rendered.problems.append(
                    Problem("file_path", reason, file=entry["path"] or None, key=kind)
                )
        for parent, child in path_collisions([e["path"] for e in entries]):
            bad_paths.add((kind, parent))
            rendered.problems.append(
                Problem("file_path", f"{parent} is a file, so {child} cannot be written",
                        file=parent, key=kind)
            )
    # Go on with the rest, so one bad path does not hide other problems.
    templates = [t for t in templates if ("templates", t["path"]) not in bad_paths]
    fallback = [f for f in fallback if ("fallback_files", f["path"]) not in bad_paths]

    if problems:  # without a parsed config, templates can only be syntax-checked
        rendered.problems.extend(template_syntax_problems(templates))
    else:
        placeholders = Placeholders(source)
        context = template_context(config, environment_config, placeholders)
        sealed = [{"path": t["path"], "source": seal_template(t["source"], placeholders)}
                  for t in templates]
        budget = render_budget(limits, seconds)
        files, template_problems = _render_templates(sealed, context, limits, budget)
        rendered.load_dependent = budget.load_dependent
        rendered.timed_out = budget.timed_out
        rendered.files = files
        rendered.problems.extend(template_problems)
        rendered.secrets, secret_problems = manifest(files, placeholders)
        rendered.problems.extend(secret_problems)

    rendered.fallback_files = sorted(
        ({"path": f["path"], "content": f["content"]} for f in fallback),
        key=lambda f: f["path"],
    )
    total = 0
    for entry in rendered.files + rendered.fallback_files:
        size = len(entry["content"].encode())
        total += size
        if size > limits["max_file_bytes"]:
            rendered.problems.append(
                Problem("file_too_large",
                        f"{size} bytes; the limit is {limits['max_file_bytes']}",
                        file=entry["path"])
            )
        else:
            rendered.problems.extend(file_problems(entry["path"], entry["content"],
                                                   limits=limits))
    if total > limits["max_snapshot_bytes"]:
        rendered.problems.append(
            Problem("snapshot_too_large",
                    f"{total} bytes in all; the limit is {limits['max_snapshot_bytes']}")
        )
    # An error in an included template surfaces in each template including it.
    rendered.problems = list(dict.fromkeys(rendered.problems))
    return rendered
