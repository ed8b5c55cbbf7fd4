"""Reading a pipeline file: YAML to plain data, with the line of every key and item, and `${VAR:-default}`.

`read_yaml(text, env)` returns `(data, lines)`: `data` is what `yaml.safe_load` would give, `lines` maps the path
of every mapping key and sequence item (a tuple of keys and indexes) to its 1-based line.

Environment variables: a scalar may hold `${NAME}` or `${NAME:-default}`, replaced by the variable's value (or the
default when it is unset or empty). A scalar that is one such reference and nothing else takes the type of the
text it becomes, as if written there (`cap: ${TIMELINE_CAP:-800}` is the number 800; an empty result is null), so
a pipeline can follow settings such as `TIMELINE_CAP` without a second copy of them. (In a flow mapping, `{...}`,
quote such a scalar: `cap: "${TIMELINE_CAP:-800}"`.) A variable whose name says it may hold a credential
(`SECRETIVE`: a part PASSWORD, PASSWD, PASS, SECRET, TOKEN, CREDENTIAL(S), PRIVATE, KEY, DSN, URL or URI, e.g.
`AWS_SECRET_ACCESS_KEY`, `PG_DSN`, `REDIS_URL`) is refused with its line: a pipeline file could otherwise copy it
into a view that anyone who reads Redis sees.

YAML 1.1 reads the keys `on`, `off`, `yes`, `no` as booleans; such a key is kept as the boolean (the checks say
what to write instead, e.g. `match:` for `on:`).

Bounds (a pipeline file may come from anyone): nesting deeper than `MAX_DEPTH` levels, a file whose aliases (`*name`
repeats the node `&name` marks) expand to more than `MAX_NODES` keys, items and values, and an alias inside the node
it names are each one `YamlProblem`, found before anything is expanded (an aliased node is measured once).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import yaml

__all__ = ["read_yaml", "YamlProblem", "MAX_DEPTH", "MAX_NODES", "SECRETIVE"]

MAX_DEPTH = 64  # levels of mappings and sequences (a pipeline needs about 8)
MAX_NODES = 100_000  # keys, items and values once aliases are expanded (the shipped pipelines have under 400)

_SCALARS = yaml.SafeLoader("")  # constructs scalar nodes only (no state kept between them)
SECRETIVE = re.compile(
    r"(?:^|_)(?:PASSWORD|PASSWD|PASS|SECRET|TOKEN|CREDENTIALS?|PRIVATE|KEY|DSN|URL|URI)(?:_|$)", re.IGNORECASE
)
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
        except (yaml.YAMLError, RecursionError):  # not YAML (or absurdly nested): the text itself
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
        for m in _REF.finditer(value):
            if SECRETIVE.search(m.group(1)):
                raise YamlProblem(
                    node.start_mark.line + 1,
                    f"${{{m.group(1)}}} may hold a credential: a pipeline file may not read it (write the value)",
                )
        return _substitute(value, env)
    return value


def _shallow(text: str) -> None:
    """Raise `YamlProblem` where `text` nests deeper than `MAX_DEPTH` (read as events: no recursion)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise YamlProblem(
                    event.start_mark.line + 1, f"nested more than {MAX_DEPTH} levels deep: not a pipeline"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _bounded(root) -> None:
    """Raise `YamlProblem` when the tree under `root`, aliases expanded, holds an alias inside the node it names, is
    deeper than `MAX_DEPTH` or has more than `MAX_NODES` nodes. Each node (an aliased one is one node shared by its
    aliases) is measured once, without recursion."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        k = id(node)
        if done:
            kids = _children(node)
            size[k] = 1 + sum(size[id(c)] for c in kids)
            depth[k] = 1 + max((depth[id(c)] for c in kids), default=0)
            open_.discard(k)
            line = node.start_mark.line + 1
            if size[k] > MAX_NODES:
                raise YamlProblem(
                    line, f"its aliases (*name) expand to more than {MAX_NODES:,} values: not a pipeline"
                )
            if depth[k] > MAX_DEPTH:
                raise YamlProblem(line, f"its aliases (*name) nest more than {MAX_DEPTH} levels deep")
        elif k not in size:
            if k in open_:
                raise YamlProblem(
                    node.start_mark.line + 1, "an alias (*name) inside the node it names (&name) itself"
                )
            open_.add(k)
            stack.append((node, True))
            stack += [(c, False) for c in _children(node) if id(c) not in size]


def read_yaml(text: str, env: Mapping[str, str]) -> tuple[dict, dict[tuple, int]]:
    """Parse `text` (see the module docstring). Raises `YamlProblem` for text that is not a YAML mapping, or that
    breaks the bounds."""
    try:
        _shallow(text)
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
    _bounded(root)
    lines: dict[tuple, int] = {}
    data = _build(root, (), lines, env)
    return data, lines
