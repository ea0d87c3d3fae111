"""YAML through the safe constructor only, bounded in size, nesting and alias expansion.

Values are limited to what JSON can hold, so a config renders the same in a
template, in the API and in a stored snapshot. Timestamps stay strings.

With libyaml, its C parser reads the text (scanning and parsing are most of the
time a large config takes) and the nodes are composed here in Python, so the
nesting bound holds before anything recurses: libyaml's own C composer recurses
once per level and crashes the process on deep enough input (100,000 `[`).
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
