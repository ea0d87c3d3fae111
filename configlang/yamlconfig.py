"""YAML through the safe constructor only, bounded in size, nesting and alias expansion.

Values are limited to what JSON can hold, so a config renders the same in a
template, in the API and in a stored snapshot. Timestamps stay strings.

With libyaml, its C parser reads the text (scanning and parsing are most of the
time a large config takes) and the nodes are composed here in Python, so the
nesting bound holds before anything recurses: libyaml's own C composer recurses
once per level and crashes the process on deep enough input (100,000 `[`).

Most configs are plain: mappings, sequences and untagged scalars, no anchors.
Those are built straight from libyaml's events (`_plain_value`), without nodes,
in one loop that holds every bound itself (nesting, node count, string keys,
no duplicates, no NUL, finite floats); the first thing it does not take (an
anchor, an alias, a tag, a merge key, a bound broken, a syntax error) hands the
text to the composer above, which says why, with the line.
"""

import math

import yaml

from configlang.problems import Problem

try:  # libyaml's parser; PyYAML's wheels ship it
    from yaml._yaml import CParser
except ImportError:  # pragma: no cover - a PyYAML built without libyaml
    CParser = None

_MERGE_TAG = "tag:yaml.org,2002:merge"


class ConfigTooDeep(yaml.MarkedYAMLError):
    pass


class _Bounded(yaml.composer.Composer, yaml.constructor.SafeConstructor,
               yaml.resolver.Resolver):
    """The composer with a nesting bound, the safe constructor refusing duplicate
    keys, and the resolver without timestamps. A loader puts it before its parser,
    so composing is always this one's (libyaml's CParser has a C composer too)."""

    max_depth = 32

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if not tag.endswith(":timestamp")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream):
        self.init_parser(stream)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            # The root is level 0, as in _walk, so both checks agree.
            if self._depth > self.max_depth + 1:
                raise ConfigTooDeep(
                    problem=f"nesting deeper than {self.max_depth} levels",
                    problem_mark=self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _PythonLoader(_Bounded, yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    def init_parser(self, stream):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)

    @staticmethod
    def line_of(text: str, position: int) -> int:
        return text.count("\n", 0, position) + 1


if CParser is not None:
    class _LibyamlLoader(_Bounded, CParser):
        def init_parser(self, stream):
            CParser.__init__(self, stream)

        @staticmethod
        def line_of(text: str, position: int) -> int:
            # libyaml counts UTF-8 bytes.
            return text.encode("utf-8", "surrogatepass").count(b"\n", 0, position) + 1

# The loader load_yaml uses: libyaml's parser when PyYAML has it.
LOADER = _LibyamlLoader if CParser is not None else _PythonLoader

_NOT_PLAIN = object()  # what _plain_value answers for anything it leaves to LOADER
_NO_KEY = object()
_STR_TAG = "tag:yaml.org,2002:str"
_INT_TAG = "tag:yaml.org,2002:int"
_CONVERTED_TAGS = ("tag:yaml.org,2002:null", "tag:yaml.org,2002:bool",
                   "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _Scalars(yaml.constructor.SafeConstructor):
    """The safe constructor's own conversions, for the scalars _plain_value reads."""

    def convert(self, tag: str, text: str):
        return self.yaml_constructors[tag](self, yaml.ScalarNode(tag, text))


_SCALARS = _Scalars()


def _plain_scalar(text: str, seen: dict):
    """A plain (unquoted, untagged) scalar as _Bounded resolves and constructs it,
    or _NOT_PLAIN: a merge key, a value JSON cannot hold. `seen` remembers texts."""
    value = seen.get(text, _NO_KEY)
    if value is not _NO_KEY:
        return value
    resolvers = _Bounded.yaml_implicit_resolvers
    tag = next((tag for tag, regexp in resolvers.get(text[:1], []) + resolvers.get(None, [])
                if regexp.match(text)), _STR_TAG)
    if tag == _STR_TAG:
        value = text if "\x00" not in text else _NOT_PLAIN
    elif tag == _INT_TAG and text.isascii() and text.isdigit() and text[0] != "0":
        value = int(text)  # what construct_yaml_int does with plain decimal digits
    elif tag in _CONVERTED_TAGS:
        value = _SCALARS.convert(tag, text)
        if isinstance(value, float) and not math.isfinite(value):
            value = _NOT_PLAIN
    else:
        value = _NOT_PLAIN
    seen[text] = value
    return value


def _plain_scalar_event(event, seen: dict):
    """The value of a scalar event, or _NOT_PLAIN (an anchor, a tag)."""
    if event.anchor is not None or event.tag is not None:
        return _NOT_PLAIN
    text = event.value
    if event.implicit[0]:
        value = seen.get(text, _NO_KEY)
        return _plain_scalar(text, seen) if value is _NO_KEY else value
    return text if "\x00" not in text else _NOT_PLAIN


def _plain_document(next_event, *, max_depth: int, max_nodes: int):
    """Build one document's value from its events, holding every bound."""
    root, seen, nodes, depth = None, {}, 0, 0
    open_: list = [None]  # the containers being filled, outermost after None
    keys: list = [None]  # for each, the key waiting for its value (_NO_KEY: none)
    while True:
        event = next_event()
        kind = type(event)
        if kind is yaml.ScalarEvent:
            value = _plain_scalar_event(event, seen)
        elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
            if event.anchor is not None or event.tag is not None:
                return _NOT_PLAIN
            value = {} if kind is yaml.MappingStartEvent else []
        elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
            open_.pop()
            keys.pop()
            depth -= 1
            continue
        elif kind is yaml.DocumentEndEvent:
            return root
        else:  # an alias, or events out of order
            return _NOT_PLAIN
        if value is _NOT_PLAIN or depth > max_depth:
            return _NOT_PLAIN
        into = open_[-1]
        if into is None:
            root = value
        elif type(into) is list:
            into.append(value)
        elif keys[-1] is _NO_KEY:
            if type(value) is not str or value in into:
                return _NOT_PLAIN
            keys[-1] = value
            continue
        else:
            into[keys[-1]] = value
            keys[-1] = _NO_KEY
        nodes += 1
        if nodes > max_nodes:
            return _NOT_PLAIN
        if kind is not yaml.ScalarEvent:
            open_.append(value)
            keys.append(_NO_KEY)
            depth += 1


def _plain_value(text: str, *, max_depth: int, max_nodes: int):
    """The value of a plain YAML text straight from libyaml's events, or _NOT_PLAIN
    for anything it leaves to LOADER (which then reports the problem, if any)."""
    parser = CParser(text)
    try:
        next_event = parser.get_event
        if type(next_event()) is not yaml.StreamStartEvent:
            return _NOT_PLAIN
        start = next_event()
        if type(start) is yaml.StreamEndEvent:
            return None
        if type(start) is not yaml.DocumentStartEvent:
            return _NOT_PLAIN
        value = _plain_document(next_event, max_depth=max_depth, max_nodes=max_nodes)
        if value is _NOT_PLAIN or type(next_event()) is not yaml.StreamEndEvent:
            return _NOT_PLAIN
        return value
    except Exception:  # noqa: BLE001 - a syntax error, an int() refused: LOADER says which
        return _NOT_PLAIN
    finally:
        parser.dispose()


def value_problems(value, *, max_depth: int, max_nodes: int, file: str | None) -> list[Problem]:
    """Check the expanded value: JSON types only, bounded depth and node count."""
    problems: list[Problem] = []
    count = 0
    stack: list[tuple[object, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        count += 1
        if count > max_nodes:
            return problems + [
                Problem(
                    "yaml_too_large",
                    f"expands to more than {max_nodes} values (alias expansion?)",
                    file=file,
                )
            ]
        if depth > max_depth:
            return problems + [
                Problem(
                    "yaml_too_deep",
                    f"nesting deeper than {max_depth} levels",
                    file=file,
                    key=path or None,
                )
            ]
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    problems.append(
                        Problem(
                            "yaml_key_type",
                            f"key {key!r} is a {type(key).__name__}; keys must be strings",
                            file=file,
                            key=path or None,
                        )
                    )
                    continue
                stack.append((child, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                stack.append((child, f"{path}[{index}]", depth + 1))
        elif isinstance(item, str) and "\x00" in item:
            problems.append(
                Problem("yaml_value_type", "NUL characters are not allowed", file=file,
                        key=path or None)
            )
        elif isinstance(item, float) and not math.isfinite(item):
            problems.append(
                Problem("yaml_value_type", "NaN and infinity are not allowed", file=file, key=path)
            )
        elif item is not None and not isinstance(item, (str, int, float, bool)):
            problems.append(
                Problem(
                    "yaml_value_type",
                    f"values of type {type(item).__name__} are not allowed",
                    file=file,
                    key=path or None,
                )
            )
    return problems


def load_yaml(
    text: str, *, limits: dict, file: str | None = None
) -> tuple[object, list[Problem]]:
    """Parse `text`; return (value, problems). The value is None when there are problems."""
    size = len(text.encode())
    if size > limits["max_config_bytes"]:
        return None, [
            Problem(
                "yaml_too_large",
                f"{size} bytes; the limit is {limits['max_config_bytes']}",
                file=file,
            )
        ]
    if LOADER is not _PythonLoader:
        value = _plain_value(text, max_depth=limits["max_config_depth"],
                             max_nodes=limits["max_config_nodes"])
        if value is not _NOT_PLAIN:
            return value, []
    return _composed(text, limits=limits, file=file)


def _composed(text: str, *, limits: dict, file: str | None) -> tuple[object, list[Problem]]:
    """Parse `text` through LOADER's bounded composer, then check the expanded value."""
    loader = None
    try:
        # The reader checks every character when it is built: inside the try.
        loader = LOADER(text)
        loader.max_depth = limits["max_config_depth"]
        value = loader.get_single_data()
    except yaml.reader.ReaderError as exc:
        line = LOADER.line_of(text, exc.position)
        message = f"unacceptable character #x{exc.character:04x}: {exc.reason}" if isinstance(
            exc.character, int) else str(exc.reason)
        return None, [Problem("yaml_syntax", message, file=file, line=line)]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = " ".join(p for p in (exc.context, exc.problem) if p) or str(exc)
        code = "yaml_too_deep" if isinstance(exc, ConfigTooDeep) else "yaml_syntax"
        return None, [Problem(code, message, file=file, line=mark.line + 1 if mark else None)]
    except yaml.YAMLError as exc:
        return None, [Problem("yaml_syntax", str(exc), file=file)]
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # An explicit tag whose value does not convert, e.g. `!!int abc`.
        return None, [Problem("yaml_syntax", f"a value cannot be converted: {exc}", file=file)]
    except RecursionError:
        return None, [Problem("yaml_too_deep", "nesting too deep to read", file=file)]
    finally:
        if loader is not None:
            loader.dispose()
    problems = value_problems(
        value,
        max_depth=limits["max_config_depth"],
        max_nodes=limits["max_config_nodes"],
        file=file,
    )
    return (None, problems) if problems else (value, [])


def load_config(text: str, *, limits: dict, file: str = "config") -> tuple[dict, list[Problem]]:
    """Load an environment config: a YAML mapping (an empty document is `{}`)."""
    value, problems = load_yaml(text, limits=limits, file=file)
    if problems:
        return {}, problems
    if value is None:
        return {}, []
    if not isinstance(value, dict):
        return {}, [
            Problem(
                "config_not_mapping",
                f"the top level must be a mapping, not a {type(value).__name__}",
                file=file,
                line=1,
            )
        ]
    return value, []
