"""Secret references in rendered files: sealed placeholders and the secrets manifest.

Pure: no database. An agent resolves a secret only where the bundle's manifest
lists a placeholder, and it substitutes only that exact text. The renderer makes
the placeholders:

- A placeholder is `${secret:sealed:<token>:<reference>}`. The token is an HMAC of
  the reference keyed by a hash of every input of the render (config, templates,
  descriptor, policy, restrictions, limits). A descriptor cannot contain the
  token of its own render (that would be a fixed point of SHA-256), so no text
  that came from a descriptor, however a template transforms it, is ever a
  placeholder. The same inputs give the same placeholders: a rollback reproduces
  its snapshot's files exactly.
- Templates get a placeholder where the environment put a reference: the values
  of the effective config's `secrets` (the environment's, and a descriptor's
  that passed descriptor_policy.secret_refs and the tenant's restrictions), a
  config value the environment itself wrote as exactly `${secret:<reference>}`,
  and `${secret:<reference>}` written in a template's own text.
- Any other `${secret:` text in a rendered file, and a placeholder a template
  altered (sliced, upper-cased, ...), is refused at publish, naming the file and
  line: an older agent would otherwise resolve such text.

A file that receives a secret is written 0600 by the agent, or with the mode the
environment's own config declares as `secret_file_mode` (an octal string such as
"0640"): never anything for others, nor write for the group, and readable by
its owner. The bundle carries it, and the checksum covers it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from urllib.parse import unquote

from configlang.problems import Problem
from configlang.values import copied

MANIFEST_VERSION = b"bellwether secrets manifest v1\x00"
_ABSENT = object()
SECRET_TEXT = "${secret:"
REFERENCE = r"(?:env:[A-Za-z_][A-Za-z0-9_]*|file:/[^\s}]+|vault:[^\s#}]+#[^\s#}]+)"
INLINE_REFERENCE = re.compile(r"\$\{secret:(" + REFERENCE + r")\}")
MAX_PROBLEMS_PER_FILE = 20
PLACEHOLDER = re.compile(r"\$\{secret:sealed:([0-9a-f]{32}):(" + REFERENCE + r")\}")
SECRET_FILE_MODE_KEY = "secret_file_mode"


def reference_refusal(reference: str) -> str | None:
    """Why a well-formed reference is still refused, or None: a `vault:` or `file:`
    path with an empty, `.` or `..` segment (a vault segment also after
    percent-decoding), or a vault segment holding a `\\` or percent-encoding a `/`,
    a `\\` or a `%` (`%2f`, `%5c`, `%25`: a segment that decodes into two, or
    decodes again into `..`). Such a path would escape the patterns that bound it
    (descriptor_policy.secret_refs `vault:secret/data/shop/*`, a host's
    --secret-allow) while naming another place."""
    kind, _, rest = reference.partition(":")
    if kind == "vault":
        segments = [unquote(s) for s in rest.partition("#")[0].split("/")]
        if any(c in segment for segment in segments for c in "/\\%"):
            return (f"{reference} has a path segment with a `\\` or a percent-encoded "
                    "`/`, `\\` or `%`; name the secret by its plain path")
    elif kind == "file":
        segments = rest.removeprefix("/").split("/")
    else:
        return None
    if any(segment in ("", ".", "..") for segment in segments):
        return (f"{reference} has an empty, `.` or `..` path segment; name the secret by "
                "its plain path")
    return None

DEFAULT_SECRET_FILE_MODE = 0o600
_OCTAL_MODE = re.compile(r"0?[0-7]{3}")


def secret_file_mode_refusal(value) -> str | None:
    """Why `value` cannot be the mode of files receiving secrets, or None. The
    agent (agent/references.py) applies the same rule."""
    if not isinstance(value, str) or not _OCTAL_MODE.fullmatch(value):
        return ("must be an octal mode as a quoted string, such as \"0640\" (unquoted, "
                "YAML reads 0640 as a number)")
    mode = int(value, 8)
    if mode & 0o007:
        return f"{value} grants access to others; a secret's file may not"
    if mode & 0o020:
        return f"{value} lets the group write; a secret's file may not"
    if not mode & 0o400:
        return f"{value} does not let the owner read the file"
    return None


def secret_file_mode(config) -> tuple[str | None, list[Problem]]:
    """The mode the environment's own `config` declares for files receiving
    secrets, as four octal digits ("0640"); None for the default (0600)."""
    if not isinstance(config, dict) or SECRET_FILE_MODE_KEY not in config:
        return None, []
    value = config[SECRET_FILE_MODE_KEY]
    refusal = secret_file_mode_refusal(value)
    if refusal is not None:
        return None, [Problem("secret_file_mode", refusal, file="config",
                              key=SECRET_FILE_MODE_KEY)]
    mode = int(value, 8)
    return (None if mode == DEFAULT_SECRET_FILE_MODE else f"{mode:04o}"), []


class Placeholders:
    """The placeholders of one render, and which of them were handed out."""

    def __init__(self, source: dict):
        canonical = json.dumps(source, sort_keys=True, ensure_ascii=False,
                               separators=(",", ":"), default=str)
        self._key = hashlib.sha256(
            MANIFEST_VERSION + canonical.encode("utf-8", "surrogatepass")).digest()
        self.issued: dict[str, str] = {}  # placeholder -> reference

    def token(self, reference: str) -> str:
        return hmac.new(self._key, reference.encode(), hashlib.sha256).hexdigest()[:32]

    def __call__(self, reference: str) -> str:
        placeholder = "${secret:sealed:" + self.token(reference) + ":" + reference + "}"
        self.issued[placeholder] = reference
        return placeholder


def _reference_of(value) -> str | None:
    match = INLINE_REFERENCE.fullmatch(value) if isinstance(value, str) else None
    return match.group(1) if match else None


def _sealed_copy(merged, environment, placeholders: Placeholders):
    """A copy of `merged` (configlang.values.copied) with the values the environment
    itself wrote as `${secret:<reference>}` sealed; `environment` is the
    environment's value at the same place (_ABSENT: it has none)."""
    if type(merged) is dict:
        if type(environment) is not dict:
            return copied(merged)
        return {key: _sealed_copy(value, environment.get(key, _ABSENT), placeholders)
                for key, value in merged.items()}
    if type(merged) is list:
        if type(environment) is not list or len(merged) != len(environment):
            return copied(merged)
        return [_sealed_copy(m, e, placeholders)
                for m, e in zip(merged, environment, strict=True)]
    reference = _reference_of(merged)
    if reference is not None and merged == environment:
        return placeholders(reference)
    return merged


def template_context(config: dict, environment_config: dict,
                     placeholders: Placeholders) -> dict:
    """The config templates see, a copy sharing nothing with `config`: secrets (and
    the environment's own inline references) as sealed placeholders; everything
    else as it is."""
    context = _sealed_copy(
        {k: v for k, v in config.items() if k != "secrets"},
        {k: v for k, v in environment_config.items() if k != "secrets"}, placeholders)
    secrets = config.get("secrets")
    if isinstance(secrets, dict):
        context["secrets"] = {
            name: placeholders(_reference_of(value)) if _reference_of(value) else value
            for name, value in secrets.items()}
    elif "secrets" in config:
        context["secrets"] = secrets
    return context


def seal_template(source: str, placeholders: Placeholders) -> str:
    """A template's own `${secret:<reference>}` text becomes its placeholder."""
    return INLINE_REFERENCE.sub(lambda m: placeholders(m.group(1)), source)


def unsealed(content: str) -> str:
    """`content` with each sealed placeholder shown as `${secret:<reference>}`."""
    if "${secret:sealed:" not in content:
        return content
    return PLACEHOLDER.sub(lambda m: "${secret:" + m.group(2) + "}", content)


def _line(content: str, index: int) -> int:
    return content.count("\n", 0, index) + 1


def _file_problems(path: str, content: str, placeholders: Placeholders) -> list[Problem]:
    problems = []
    ours = {m.start(): m.end() for m in PLACEHOLDER.finditer(content)
            if m.group(0) in placeholders.issued}
    for match in re.finditer(re.escape(SECRET_TEXT), content):
        if len(problems) >= MAX_PROBLEMS_PER_FILE:
            break
        if match.start() not in ours:
            problems.append(Problem(
                "secret_reference", "holds `${secret:` text that is not a secret the "
                "environment's templates placed (from a descriptor or a transformed "
                "value); agents never resolve it: use {{ secrets.NAME }}", file=path,
                line=_line(content, match.start())))
    lower = content.lower()
    kept = "".join(content[start:end] for start, end in ours.items())
    for reference in placeholders.issued.values():
        token = placeholders.token(reference)
        line = _line(content, lower.index(token)) if token in lower else None
        if lower.count(token) > kept.count(token) and line not in {p.line for p in problems}:
            problems.append(Problem(
                "secret_reference", f"a template altered the placeholder of secret "
                f"{reference}; place {{{{ secrets.NAME }}}} unchanged", file=path, line=line))
    return problems


def manifest(files: list[dict], placeholders: Placeholders) -> tuple[list, list[Problem]]:
    """The secrets manifest of rendered `files` and the problems found: each
    placeholder used, its reference and the files holding it."""
    used: dict[str, list] = {}
    problems: list[Problem] = []
    for entry in files:
        content = entry["content"]
        for placeholder in placeholders.issued:
            if placeholder in content:
                used.setdefault(placeholder, []).append(entry["path"])
        if SECRET_TEXT in content or placeholders.issued:
            problems.extend(_file_problems(entry["path"], content, placeholders))
    for placeholder, paths in sorted(used.items()):
        refusal = reference_refusal(placeholders.issued[placeholder])
        for path in paths if refusal else ():
            content = next(e["content"] for e in files if e["path"] == path)
            problems.append(Problem("secret_reference", refusal, file=path,
                                    line=_line(content, content.index(placeholder))))
    listed = [{"placeholder": placeholder, "reference": placeholders.issued[placeholder],
               "files": sorted(paths)} for placeholder, paths in sorted(used.items())]
    return listed, problems
