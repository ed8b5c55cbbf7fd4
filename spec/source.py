"""Reading a pipeline file: YAML to plain data, with the line of every key and item, and `${VAR:-default}`.

`read_yaml(text, env)` returns `(data, lines)`: `data` is what `yaml.safe_load` would give, `lines` maps the path
of every mapping key and sequence item (a tuple of keys and indexes) to its 1-based line.

Environment variables: a scalar may hold `${NAME}` or `${NAME:-default}`, replaced by the variable's value (or the
default when it is unset or empty). A scalar that is one such reference and nothing else takes the type of the
text it becomes, as if written there (`cap: ${TIMELINE_CAP:-800}` is the number 800; an empty result is null), so
a pipeline can follow settings such as `TIMELINE_CAP` without a second copy of them. (In a flow mapping, `{...}`,
quote such a scalar: `cap: "${TIMELINE_CAP:-800}"`.)

YAML 1.1 reads the keys `on`, `off`, `yes`, `no` as booleans; such a key is kept as the boolean (the checks say
what to write instead, e.g. `match:` for `on:`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import yaml

__all__ = ["read_yaml", "YamlProblem"]

_SCALARS = yaml.SafeLoader("")  # constructs scalar nodes only (no state kept between them)
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class YamlProblem(Exception):
    """The text is not YAML, or not a mapping at its top: `line` (1-based, 0 if unknown) and `message`."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


def _substitute(text: str, env: Mapping[str, str]) -> object:
    def value(m: re.Match) -> str:
        got = env.get(m.group(1), "")
        return got if got != "" else (m.group(2) or "")

    whole = _REF.fullmatch(text.strip())
    if whole:
        got = value(whole)
        if got.strip() == "":
            return None
        try:
            return yaml.safe_load(got)
        except yaml.YAMLError:
            return got
    return _REF.sub(value, text)


def _build(node, path: tuple, lines: dict, env: Mapping[str, str]):
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = _build(key_node, path, {}, env)
            if isinstance(key, (list, dict)):
                raise YamlProblem(key_node.start_mark.line + 1, "a mapping key must be a plain name")
            lines[(*path, key)] = key_node.start_mark.line + 1
            out[key] = _build(value_node, (*path, key), lines, env)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            items.append(_build(item, (*path, i), lines, env))
        return items
    value = _SCALARS.construct_object(node, deep=True)
    if isinstance(value, str) and "${" in value:
        return _substitute(value, env)
    return value


def read_yaml(text: str, env: Mapping[str, str]) -> tuple[dict, dict[tuple, int]]:
    """Parse `text` (see the module docstring). Raises `YamlProblem` for text that is not a YAML mapping."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise YamlProblem(mark.line + 1 if mark else 0, f"not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise YamlProblem(0, f"not valid YAML: {e}") from None
    if root is None:
        raise YamlProblem(0, "the file is empty: it needs at least `topics:`")
    if not isinstance(root, yaml.MappingNode):
        raise YamlProblem(root.start_mark.line + 1, "the file must be a mapping (topics:, jobs:)")
    lines: dict[tuple, int] = {}
    data = _build(root, (), lines, env)
    return data, lines
