"""A view read as a topic (`from: {view: <view>}`): the fields, identity and time such a topic has, told from the
view's declaration and what its job's rows are, without Spark.

- A `log` view is an event topic of the rows it logs: its fields the log's fields; the declaration names which of
  them is the `id` and which the `time` (a timestamp).
- A `row`, `count` or `agg` view is a table topic of its entries, keyed by the view's key name (a windowed view: by
  the key name and `window_start`): its fields the export line's (the key, then the view's fields or values; a
  windowed view's also `window_start`, `window_end` and `final`), plus `BATCH`, the upstream job's micro-batch that
  wrote the record, its time: per key the record of the latest batch wins, and a key the view no longer holds is a
  remove record (`op` `upsert`/`remove`). A key is its text, as Redis keeps it: a string.
- A `list` view is not read as a topic (a list is the first entries of its key, not a row): read the topic its job
  reads, or a view of its rows.

A field's type is told from its expression (`expr_type`): a field of a topic the job reads (bare, or
`<topic>.<field>`), `matches` and `version`, a literal, a `CAST(... AS <type>)`, a comparison or a logical
operator (boolean), arithmetic over typed operands, and the usual functions (`coalesce`, `if`, `lower`, `concat`,
...); an agg view's `count` is a long, `avg` a double, `sum`, `min` and `max` their expression's type. Where it
cannot be told, the declaration gives it: `fields: {<name>: <type>}` beside `from:`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from spec.model import Topic, View
from spec.sql import parse_aggregate

__all__ = ["BATCH", "OP", "WINDOW_FIELDS", "expr_type", "agg_type", "entry_fields", "table_key"]

BATCH = "_batch"  # the upstream micro-batch that wrote a view table's record: its time
OP = ("upsert", "remove")  # a view table's record operations
WINDOW_FIELDS = (("window_start", "timestamp"), ("window_end", "timestamp"), ("final", "boolean"))

_IDENT = r"`[^`]+`|[A-Za-z_][A-Za-z0-9_]*"
_NAME = re.compile(rf"^\s*({_IDENT})\s*(?:\.\s*({_IDENT})\s*)?$")
_INT = re.compile(r"^\s*-?\d+\s*[lL]?\s*$")
_FLOAT = re.compile(r"^\s*-?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][-+]?\d+)\s*[dD]?\s*$")
_STRING = re.compile(r"^\s*('([^'\\]|\\.)*'|\"([^\"\\]|\\.)*\")\s*$")
_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*$", re.DOTALL)
_CAST = re.compile(r"^(.*)\s+as\s+([A-Za-z]+)\s*(\(.*\))?\s*$", re.IGNORECASE | re.DOTALL)
_CASE = re.compile(r"^case\b.*?\bthen\b(.*?)\b(?:when|else|end)\b", re.IGNORECASE | re.DOTALL)
_WORDS = re.compile(r"\b(and|or|not|is|in|like|rlike|between)\b", re.IGNORECASE)

_SQL_NAMES = {
    "tinyint": "long",
    "smallint": "long",
    "int": "long",
    "integer": "long",
    "bigint": "long",
    "long": "long",
    "float": "double",
    "double": "double",
    "decimal": "double",
    "string": "string",
    "varchar": "string",
    "boolean": "boolean",
    "timestamp": "timestamp",
}
_STRINGS = (
    "lower upper concat concat_ws substr substring trim ltrim rtrim lpad rpad replace regexp_replace regexp_extract "
    "initcap reverse format_string split_part left right cast_string date_format to_json string md5 sha1 sha2"
).split()
_LONGS = "length char_length size floor ceil ceiling hash unix_millis unix_seconds year month day hour minute".split()
_DOUBLES = "sqrt exp ln log log10 log2 pow power rand".split()
_FIRST = (
    "coalesce nvl ifnull greatest least abs negative positive round".split()
)  # the type of their first argument
_BOOLEANS = "isnull isnotnull startswith endswith contains array_contains exists".split()


def _strip(sql: str) -> str:
    """`sql` without the parentheses around all of it."""
    s = sql.strip()
    while s.startswith("(") and s.endswith(")") and _depth_zero_split(s[1:-1], ()) is not None:
        s = s[1:-1].strip()
    return s


def _masked(sql: str) -> str:
    """`sql` with the contents of its string literals and quoted names blanked (same length)."""
    out, quote = [], None
    for c in sql:
        if quote:
            out.append(" " if c != quote else c)
            if c == quote:
                quote = None
        else:
            if c in "'\"`":
                quote = c
            out.append(c)
    return "".join(out)


def _depth_zero_split(sql: str, ops: tuple[str, ...]) -> list[tuple[str, str]] | None:
    """The operators of `ops` found outside parentheses (and literals) of `sql`, with the text before each, as
    (operator, operand) pairs and a last ("", operand); None when the parentheses do not balance."""
    m, depth, parts, start, i = _masked(sql), 0, [], 0, 0
    while i < len(m):
        c = m[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0:
            op = next((o for o in ops if m.startswith(o, i)), None)
            if op is not None and i > start:
                parts.append((op, sql[start:i]))
                start = i = i + len(op)
                continue
        i += 1
    if depth:
        return None
    return [*parts, ("", sql[start:])]


def _top(sql: str) -> str:
    """`sql` as `_masked`, with what is inside parentheses blanked too: its text outside them."""
    depth, out = 0, []
    for c in _masked(sql):
        depth += {"(": 1, ")": -1}.get(c, 0)
        out.append(c if depth == 0 and c not in "()" else " ")
    return "".join(out)


def _args(inner: str) -> list[str]:
    parts = _depth_zero_split(inner, (",",)) or [("", inner)]
    return [p for _, p in parts]


def _field(name: str, table: str | None, seen: Mapping[str, Topic]) -> str | None:
    name = name.strip("`")
    if table is not None:
        t = seen.get(table.strip("`"))
        return dict(t.fields).get(name) if t is not None else None
    for t in seen.values():  # a bare name is the first side's that has it
        if name in t.names:
            return t.type_of(name)
    return None


def _numeric(types: list[str | None]) -> str | None:
    if None in types or not all(t in ("long", "double", "timestamp") for t in types):
        return None
    return "double" if "double" in types else ("timestamp" if "timestamp" in types else "long")


# long: one rule per form of expression, in the order the module docstring lists them
def expr_type(sql: str, seen: Mapping[str, Topic]) -> str | None:
    """The field type (`spec.model.FIELD_TYPES`, an id as a string) of the Spark SQL expression `sql` over a job's
    rows, `seen` what its views see by topic (`matches` and `version` as topics of one field); None when it cannot
    be told (see the module docstring)."""
    s = _strip(sql)
    m = _NAME.match(s)
    if m:
        low = s.lower()
        if low in ("true", "false"):
            return "boolean"
        t = _field(m.group(2), m.group(1), seen) if m.group(2) else _field(m.group(1), None, seen)
        return "string" if t == "id" else t
    if _INT.match(s):
        return "long"
    if _FLOAT.match(s):
        return "double"
    if _STRING.match(s):
        return "string"
    case = _CASE.match(s)
    if case:  # the type of its first result
        return expr_type(case.group(1), seen)
    if _WORDS.search(_top(s)):
        return "boolean"
    compared = _depth_zero_split(s, ("<=>", "<=", ">=", "!=", "<>", "==", "=", "<", ">"))
    if compared and len(compared) > 1:
        return "boolean"
    added = _depth_zero_split(s, ("+", "-", "*", "%", "/"))
    if added and len(added) > 1 and all(p.strip() for _, p in added):
        if any(op == "/" for op, _ in added):
            return "double"
        return _numeric([expr_type(p, seen) for _, p in added])
    call = _CALL.match(s)
    if not call:
        return None
    func, inner = call.group(1).lower(), call.group(2)
    if func == "cast":
        c = _CAST.match(inner)
        return _SQL_NAMES.get(c.group(2).lower()) if c else None
    args = _args(inner)
    if func in _STRINGS:
        return "string"
    if func in _LONGS or func == "count":
        return "long"
    if func in _DOUBLES or func == "avg":
        return "double"
    if func in _BOOLEANS:
        return "boolean"
    if func in ("if", "iff") and len(args) == 3:
        return expr_type(args[1], seen) or expr_type(args[2], seen)
    if func in _FIRST or func in ("sum", "min", "max", "first", "last", "any_value"):
        return expr_type(args[0], seen) if args else None
    return None


def agg_type(text: str, seen: Mapping[str, Topic]) -> str | None:
    """The type of an agg view's value `text` (`count(...)`: a long, `avg`: a double, `sum`: a long of longs or
    booleans (true counts 1), a double of doubles; `min`, `max`: their expression's)."""
    a = parse_aggregate(text)
    if a.func == "count":
        return "long"
    if a.func == "avg":
        return "double"
    t = expr_type(a.expr, seen)
    if a.func == "sum":
        return "long" if t in ("long", "boolean") else "double" if t == "double" else None
    return t


def entry_fields(view: View, values: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """The fields of a row, count or agg view read as a table topic: its key name (a string), `values` (its
    fields' or values' names and types), and a windowed view's window (see the module docstring; `BATCH` is added
    by the loader)."""
    return [(view.key_name, "string"), *values, *(WINDOW_FIELDS if view.window is not None else ())]


def table_key(view: View) -> tuple[str, ...]:
    """The key of a row, count or agg view read as a table topic: its key name (and `window_start` when windowed)."""
    return (view.key_name, "window_start") if view.window is not None else (view.key_name,)
