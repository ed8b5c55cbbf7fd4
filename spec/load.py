"""Loading and checking a pipeline file: `load_pipeline(path)` -> `spec.model.Pipeline`, or `PipelineError` with every
problem found, one line each (`<file>:<line>: <key>: <what is wrong>`). No Spark: the shape of the file is checked
by pydantic, then the references between its parts (topics, fields, join kinds, view kinds) here; an expression
that is a plain field name is checked against what the view sees, and no expression may call Java or hold a
subquery (`spec.sql.outside_reach`). Expressions are Spark SQL: any other problem in one (a typo in a function, a
type that does not fit) is found when the job starts, by Spark, and reported in one line naming the file, line and
expression (`views.frame.check_job`).
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spec.durations import parse_duration_ms
from spec.errors import PipelineError, Problem
from spec.model import (
    FIELD_TYPES,
    MATCHES,
    VERSION,
    Asof,
    Capture,
    Interval,
    Job,
    Join,
    Pipeline,
    Select,
    Topic,
    View,
    Window,
)
from spec.source import YamlProblem, read_yaml
from spec.sql import outside_reach, parse_aggregate

__all__ = ["load_pipeline", "parse_pipeline", "RESERVED_JOBS"]

RESERVED_JOBS = ("kafka", "cdc")  # the source jobs: a pipeline's jobs cannot take their names
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_IDENT = re.compile(r"^`?([A-Za-z_][A-Za-z0-9_]*)`?(?:\.`?([A-Za-z_][A-Za-z0-9_]*)`?)?$")
_ORDER = re.compile(r"^(.*?)(?:\s+(asc|desc))?$", re.IGNORECASE | re.DOTALL)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class _Op(_Strict):
    upsert: str
    remove: str


class _Capture(_Strict):
    postgres: str
    columns: dict[str, str] = {}


Names = str | list[str]


class _Topic(_Strict):
    fields: dict[str, str] = {}
    time: str | None = None
    from_: str | dict | None = Field(None, alias="from")
    id: Names | None = None
    key: Names | None = None
    optional: list[str] = []
    op: _Op | None = None
    final_deletes: bool = False
    remove_fields: list[str] = []
    capture: _Capture | None = None


Expr = str | int | float | bool


class _Interval(_Strict):
    left: str
    right: str
    match: dict[str, Expr]
    within: tuple[str, str]
    unmatched: bool = False


class _Asof(_Strict):
    stream: str
    table: str
    match: dict[str, Expr]
    pin: str | None = None


class _Join(_Strict):
    left: str
    right: str
    match: dict[str, Expr]


class _Select(_Strict):
    source: str = Field(alias="from")


class _View(_Strict):
    row: dict[str, Expr] | None = None
    count: dict[str, Expr] | None = None
    agg: dict[str, Expr] | None = None
    list: dict[str, Expr] | None = None
    log: dict[str, Any] | None = None
    fields: dict[str, Expr] = {}
    values: dict[str, Expr] = {}
    entry: Expr | None = None
    order: builtins.list[str] | str | None = None
    cap: int | None = None
    entries: str | None = None
    items: str | None = None
    fanout_limit: int | None = None
    where: Expr | None = None
    show: str | None = None
    window: dict[str, Any] | None = None
    retain: str | None = None


class _Job(_Strict):
    interval: _Interval | None = None
    asof: _Asof | None = None
    join: _Join | None = None
    select: _Select | None = None
    views: dict[str, _View] = {}


class _Pipeline(_Strict):
    topics: dict[str, Any]
    jobs: dict[str, Any] = {}


class _Problems:
    """Collects problems with the line of their key."""

    def __init__(self, file: str, lines: Mapping[tuple, int]):
        self.file, self.lines, self.found = file, lines, []
        self.broken_topics: set[str] = set()

    def add(self, path: tuple, message: str) -> None:
        line = 1  # a key missing at the top: the file's first line
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                line = self.lines[path[:n]]
                break
        key = ".".join(str(p) for p in path)
        self.found.append(Problem(self.file, line, key, message))


def _names(value) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _expr(value) -> str:
    """An expression as SQL text (YAML gives numbers and booleans for `1`, `true`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _yaml_booleans(data, path: tuple, lines: dict, out: _Problems):
    """`data` with every mapping key YAML read as a boolean (`on:`, `yes:`, ...) written as the word `on`/`off`, so
    that the checks can name it (pydantic only accepts names as keys)."""
    if isinstance(data, list):
        return [_yaml_booleans(v, (*path, i), lines, out) for i, v in enumerate(data)]
    if not isinstance(data, dict):
        return data
    fixed = {}
    for k, v in data.items():
        if isinstance(k, bool):
            word = "on" if k else "off"
            lines[(*path, word)] = lines.get((*path, k), 0)
            k = word
        fixed[k] = _yaml_booleans(v, (*path, k), lines, out)
    return fixed


def _validated(model, data, path: tuple, out: _Problems):
    """`data` (the part of the file at `path`) as `model`, or None with its problems added."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        _pydantic_problems(e, out, path)
        return None


def _pydantic_problems(e: ValidationError, out: _Problems, prefix: tuple = ()) -> None:
    """`e`'s errors as problems, one per key, in words."""
    wrong: dict[tuple, list[dict]] = {}
    ons = {
        tuple(err["loc"][:-1])
        for err in e.errors()
        if err["type"] == "extra_forbidden" and err["loc"][-1] == "on"
    }
    for err in e.errors():
        if err["type"] == "missing" and err["loc"][-1] == "match" and prefix + tuple(err["loc"][:-1]) in ons:
            continue  # said with the `on:` below
        path = prefix + tuple(err["loc"])
        # pydantic's loc of a union member names the member type (e.g. `str`, `list[str]`): drop those
        path = tuple(
            p for p in path if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool")))
        )
        kind, last = err["type"], path[-1] if path else ""
        if kind == "extra_forbidden":
            if last == "on" and path[-2:-1] in (("interval",), ("asof",), ("join",)):
                out.add(
                    path,
                    "`on:` is read by YAML as true: write `match:` (a map of one side's expression to the other's)",
                )
            elif last in ("on", "off"):
                out.add(path, f"unknown key (YAML reads `{last}:` as a boolean)")
            else:
                out.add(path, "unknown key")
        elif kind == "missing":
            out.add(path, "missing")
        elif kind == "value_error":
            out.add(path, str(err["ctx"]["error"]))
        else:
            wrong.setdefault(path, []).append(err)
    for path, errs in wrong.items():
        out.add(path, _wrong_kind(errs))


# What a value of each kind is, in words (pydantic's error type's first word: int_parsing, string_type, ...).
_KINDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "string": "text",
    "dict": "a mapping ({name: value, ...})",
    "model": "a mapping ({key: value, ...})",
    "list": "a list ([a, b, ...])",
    "tuple": "a list ([a, b])",
}


def _wrong_kind(errs: list[dict]) -> str:
    """The message of a value of the wrong kind: pydantic's errors for one key (one per member of a union, e.g.
    an expression is text, a number or a boolean) as what the key takes and what it got."""
    got = repr(errs[0].get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    if errs[0]["type"] in ("too_short", "too_long"):
        return f"{errs[0]['msg'].replace(' after validation', '')}: {got}"
    kinds = list(dict.fromkeys(e["type"].split("_")[0] for e in errs))
    if {"string", "int", "float", "bool"} <= set(kinds):
        what = "an expression (text, a number or true/false)"
    elif kinds == ["string", "list"]:
        what = "a name or a list of names"
    elif kinds == ["list", "string"]:
        what = "an expression or a list of them"
    else:
        what = " or ".join(_KINDS.get(k, k) for k in kinds)
    return f"{what}, not {got}"


def _seen(found: list[Problem]) -> list[Problem]:
    """Problems once each (a union's members can report one mistake several times)."""
    out, keys = [], set()
    for p in found:
        if (p.line, p.key, p.message) not in keys:
            keys.add((p.line, p.key, p.message))
            out.append(p)
    return out


_OWN = ("fields", "time", "id", "optional", "op", "final_deletes", "remove_fields", "capture")


def _read_from(name: str, t: _Topic, declared: dict, out: _Problems) -> _Topic | None:
    """A topic declared `from: <event topic>`: that topic's log read as a table, keyed by its own `key`, with the
    source's fields, time and optional fields (None, with its problems, when it cannot be)."""
    path, before = ("topics", name), len(out.found)
    src = declared.get(t.from_) if isinstance(t.from_, str) else None
    if not isinstance(t.from_, str):
        out.add(
            (*path, "from"), "a view read as a topic (`from: {view: ...}`) is not built yet: read a topic"
        )
    elif t.from_ not in declared:
        out.add((*path, "from"), f"{t.from_!r} is not a topic of this file (topics: {', '.join(declared)})")
    elif src is None:  # declared, with problems of its own (reported where it is declared)
        return None
    elif src.from_ is not None:
        out.add((*path, "from"), f"{t.from_!r} is read from {src.from_!r} itself: read {src.from_!r}")
    elif src.id is None:
        out.add((*path, "from"), f"{t.from_!r} is a table topic: `from:` reads an event topic as a table")
    for k in (k for k in _OWN if k in t.model_fields_set):
        out.add(
            (*path, k), "a topic read from another has that topic's fields, time and records: give only `key`"
        )
    if t.key is None:
        out.add(path, "a topic read from an event topic is a table: give its `key`")
    if len(out.found) > before:
        return None
    return t.model_copy(update={"fields": src.fields, "time": src.time, "optional": src.optional})


# long: one check per rule of a topic declaration, in the order the contract states them
def _topic(name: str, t: _Topic, out: _Problems) -> Topic | None:
    path = ("topics", name)
    before = len(out.found)
    if not _NAME.match(name):
        out.add(path, "a topic name is a letter then letters, digits or _")
    if not t.fields or t.time is None:
        out.add(path, "a topic needs `fields` (at least one) and `time`, or `from:` another topic")
        return None
    for f, kind in t.fields.items():
        if kind not in FIELD_TYPES:
            out.add(
                (*path, "fields", f), f"field {f!r} has type {kind!r}: choose one of {', '.join(FIELD_TYPES)}"
            )
        if not _NAME.match(f):
            out.add((*path, "fields", f), "a field name is a letter then letters, digits or _")
        if t.op and f == "op":
            out.add(
                (*path, "fields", f), "`op` is the record's operation in a topic with `op:`: rename the field"
            )
    if (t.id is None) == (t.key is None):
        out.add(
            path, "a topic has either `id` (an event topic) or `key` (a table topic), not both or neither"
        )
    ident = _names(t.id if t.id is not None else t.key or ())
    role = "id" if t.id is not None else "key"
    for f in ident:
        if f not in t.fields:
            out.add((*path, role), f"{f!r} is not a field of the topic (fields: {', '.join(t.fields)})")
        elif t.fields[f] not in ("id", "string", "long"):
            out.add((*path, role), f"{f!r} is a {t.fields[f]}: an {role} field is an id, a string or a long")
        elif f in t.optional:
            out.add((*path, "optional"), f"{f!r} is the topic's {role}: it cannot be optional")
    if t.time not in t.fields:
        out.add((*path, "time"), f"{t.time!r} is not a field of the topic (fields: {', '.join(t.fields)})")
    elif t.fields[t.time] != "timestamp":
        out.add((*path, "time"), f"{t.time!r} is a {t.fields[t.time]}: the time field is a timestamp")
    elif t.time in t.optional:
        out.add((*path, "optional"), f"{t.time!r} is the topic's time: it cannot be optional")
    for i, f in enumerate(t.optional):
        if f not in t.fields:
            out.add((*path, "optional", i), f"{f!r} is not a field of the topic")
    if t.id is not None:
        for k in ("op", "final_deletes", "remove_fields", "capture"):
            if getattr(t, k) not in (None, False, []):
                out.add((*path, k), f"`{k}` is for table topics (with `key`), and this is an event topic")
    if t.op and t.op.upsert == t.op.remove:
        out.add((*path, "op"), "upsert and remove need different names")
    for i, f in enumerate(t.remove_fields):
        if f not in t.fields or f in ident or f == t.time:
            out.add((*path, "remove_fields", i), f"{f!r} is not a non-key field of the topic")
    if t.remove_fields and not t.op:
        out.add((*path, "remove_fields"), "a topic without `op` has no remove records")
    if t.capture:
        for f in t.capture.columns:
            if f not in t.fields:
                out.add((*path, "capture", "columns", f), f"{f!r} is not a field of the topic")
    if len(out.found) > before:
        return None
    return Topic(
        name=name,
        fields=tuple(t.fields.items()),
        time=t.time,
        id=_names(t.id) if t.id is not None else None,
        key=_names(t.key) if t.key is not None else None,
        optional=frozenset(t.optional),
        op=(t.op.upsert, t.op.remove) if t.op else None,
        final_deletes=t.final_deletes,
        remove_fields=tuple(t.remove_fields),
        source=t.from_,
        capture=Capture(t.capture.postgres, dict(t.capture.columns)) if t.capture else None,
    )


def _duration(value: str, path: tuple, out: _Problems) -> int | None:
    try:
        return parse_duration_ms(value, signed=True)
    except ValueError as e:
        out.add(path, str(e))
        return None


def _side(
    topics: dict[str, Topic], name: str, kind: str, path: tuple, why: str, out: _Problems
) -> Topic | None:
    t = topics.get(name)
    if t is None:
        if name not in out.broken_topics:  # a declared topic with problems: said there, once
            out.add(path, f"unknown topic {name!r} (topics: {', '.join(topics) or 'none'})")
        return None
    if t.kind != kind:
        out.add(path, f"{name!r} is {'an' if t.kind == 'event' else 'a'} {t.kind} topic: {why}")
        return None
    return t


def _field_expr(expr: str, known: Mapping[str, Topic] | None, path: tuple, out: _Problems) -> None:
    """Refuse what an expression may not do (`spec.sql.outside_reach`: call Java, read a table); when `expr` is a
    plain name (`f` or `topic.f`), check that the side(s) have it. Other expressions are Spark's to check (when
    the job starts)."""
    why = outside_reach(expr)
    if why:
        out.add(path, why)
        return
    m = _IDENT.match(expr.strip())
    if not m or known is None:  # (None: the job's sides are unknown, said elsewhere)
        return
    a, b = m.groups()
    if b is None:
        names = {n for t in known.values() for n in t.names}
        if a not in names and a.lower() not in ("true", "false", "null"):
            out.add(path, f"{a!r} is not a field of {' or '.join(known)}")
    elif a not in known:
        out.add(path, f"{a!r} is not a topic whose fields are seen here ({', '.join(known)})")
    elif b not in known[a].names:
        out.add(path, f"{b!r} is not a field of {a!r}")


# long: one rule per join kind, as the contract lists them
def _join(name: str, j: _Job, topics: dict[str, Topic], out: _Problems):
    path = ("jobs", name)
    kinds = [k for k in ("interval", "asof", "join", "select") if getattr(j, k) is not None]
    if len(kinds) != 1:
        out.add(
            path,
            "a job has exactly one of `interval`, `asof`, `join`, `select`"
            + (f" (has {', '.join(kinds)})" if kinds else ""),
        )
        return None, None
    kind = kinds[0]
    raw = getattr(j, kind)
    p = (*path, kind)
    if kind == "select":
        t = topics.get(raw.source)
        if t is None and raw.source not in out.broken_topics:
            out.add((*p, "from"), f"unknown topic {raw.source!r} (topics: {', '.join(topics) or 'none'})")
        return kind, None if t is None else Select(t.name)
    if not raw.match:
        out.add((*p, "match"), "empty: map at least one expression of one side to one of the other")
    match = tuple((str(a), _expr(b)) for a, b in raw.match.items())
    if kind == "interval":
        left = _side(topics, raw.left, "event", (*p, "left"), "an interval join joins two event topics", out)
        right = _side(
            topics, raw.right, "event", (*p, "right"), "an interval join joins two event topics", out
        )
        lo = _duration(raw.within[0], (*p, "within", 0), out)
        hi = _duration(raw.within[1], (*p, "within", 1), out)
        if lo is not None and hi is not None and lo > hi:
            out.add((*p, "within"), f"the lower bound {raw.within[0]!r} is after the upper {raw.within[1]!r}")
        if left and right:
            for a, b in match:
                _field_expr(a, {left.name: left}, (*p, "match", a), out)
                _field_expr(b, {right.name: right}, (*p, "match", a), out)
        if None in (left, right, lo, hi):
            return kind, None
        return kind, Interval(left.name, right.name, match, lo, hi, raw.unmatched)
    if kind == "asof":
        stream = _side(
            topics, raw.stream, "event", (*p, "stream"), "an asof join's stream is an event topic", out
        )
        table = _side(topics, raw.table, "table", (*p, "table"), "an asof join's table is a table topic", out)
        if stream and table:
            for a, _ in match:
                _field_expr(a, {stream.name: stream}, (*p, "match", a), out)
            got = {b for _, b in match}
            if got != set(table.key):
                out.add(
                    (*p, "match"),
                    f"the table side must be exactly the key of {table.name!r} ({', '.join(table.key)}), got "
                    f"{', '.join(sorted(got)) or 'nothing'}",
                )
            if raw.pin is not None and raw.pin not in stream.names:
                out.add((*p, "pin"), f"{raw.pin!r} is not a field of {stream.name!r}")
            for side in (stream, table):
                if VERSION in side.names:
                    out.add(
                        (*p, side.name),
                        f"{side.name!r} has a field {VERSION!r}, the name of the version an asof view sees: rename it",
                    )
        if not (stream and table):
            return kind, None
        return kind, Asof(stream.name, table.name, match, raw.pin)
    why = (
        "a join joins two table topics (for two event topics use `interval`, for an event and a table `asof`)"
    )
    left = _side(topics, raw.left, "table", (*p, "left"), why, out)
    right = _side(topics, raw.right, "table", (*p, "right"), why, out)
    if left and right:
        for a, b in match:
            _field_expr(a, {left.name: left}, (*p, "match", a), out)
            _field_expr(b, {right.name: right}, (*p, "match", a), out)
    if not (left and right):
        return kind, None
    return kind, Join(left.name, right.name, match)


def _numeric_order(expr: str, known: Mapping[str, Topic] | None, path: tuple, out: _Problems) -> None:
    """A list's order that is a plain field name must be a number or a timestamp (other expressions are Spark's to
    type when the job starts, `views.frame.check_job`)."""
    m = _IDENT.match(expr.strip())
    if not m or known is None:
        return
    a, b = m.groups()
    topics = [known[a]] if b is not None and a in known else list(known.values())
    name = a if b is None else b
    kind = next((t.type_of(name) for t in topics if name in t.names), None)
    if kind in ("id", "string", "boolean"):
        out.add(
            path,
            f"a list's order is a number or a timestamp; {expr!r} is {'an' if kind == 'id' else 'a'} {kind}",
        )


def _seen_names(job_kind: str, sides: tuple[Topic, Topic]) -> Mapping[str, Topic]:
    """What a view's names may be, by topic: the sides' topics (interval: the left side only) and the job's own
    name (`matches`, `version`) as a topic of one field."""
    if job_kind == "select":
        return {sides[0].name: sides[0]}
    left, right = sides
    if job_kind == "interval":
        return {left.name: left, MATCHES: Topic(MATCHES, ((MATCHES, "long"),), MATCHES, id=(MATCHES,))}
    names = {left.name: left, right.name: right}
    if job_kind == "asof":
        return {**names, VERSION: Topic(VERSION, ((VERSION, "string"),), VERSION, id=(VERSION,))}
    return names


_WINDOWED = {"window", "retain"}
_KIND_KEYS = {
    "row": {"fields", "where", "show"},
    "count": {"values", "where", "show", *_WINDOWED},
    "agg": {"values", "where", "show", *_WINDOWED},
    "list": {
        "entry",
        "order",
        "cap",
        "entries",
        "items",
        "fanout_limit",
        "fields",
        "where",
        "show",
        *_WINDOWED,
    },
    "log": {"where"},
}
_WINDOW_KINDS = ("tumble", "hop", "session")


def _window_placed(v: _View, kind: str | None, event: bool, path: tuple, out: _Problems) -> bool:
    """Whether the view has a `window` where one may be (its job's rows have an event time); `retain` without a
    window is a problem too."""
    if v.window is None:
        if v.retain is not None:
            out.add((*path, "retain"), "`retain` is of a windowed view: add a `window` or remove it")
        return False
    p = (*path, "window")
    if kind == "join" or (kind == "select" and not event):
        rows = "a join's rows" if kind == "join" else "a table's rows"
        out.add(
            p,
            f"{rows} have no event time: a window is for select (of an event topic), interval and asof jobs",
        )
        return False
    return True


def _window(
    v: _View, kind: str | None, event: bool, path: tuple, out: _Problems
) -> tuple[Window | None, int | None]:
    """The view's `window` and `retain` (ms), checked: one of tumble, hop (with `every`, at most its size) or session,
    positive durations, on a job whose rows have an event time (a select of an event topic, interval, asof)."""
    p = (*path, "window")
    if not _window_placed(v, kind, event, path, out):
        return None, None
    given = [k for k in _WINDOW_KINDS if k in v.window]
    extra = sorted(set(v.window) - {*_WINDOW_KINDS, "every"})
    if len(given) != 1 or extra:
        out.add(
            p,
            "a window is one of `{tumble: 1 h}`, `{hop: 1 h, every: 10 min}`, `{session: 5 min}`"
            + (f" (unknown key {extra[0]!r})" if extra else ""),
        )
        return None, None
    (wk,) = given
    size = _duration(str(v.window[wk]), (*p, wk), out)
    every = None
    if wk == "hop":
        if "every" not in v.window:
            out.add(
                p,
                "a hopping window needs `every`: how often a window starts, e.g. `{hop: 1 h, every: 10 min}`",
            )
            return None, None
        every = _duration(str(v.window["every"]), (*p, "every"), out)
    elif "every" in v.window:
        out.add((*p, "every"), f"`every` is of a hopping window (`hop`), not of a {wk} one")
    retain = None if v.retain is None else _duration(str(v.retain), (*path, "retain"), out)
    for what, ms, at in (
        (wk, size, (*p, wk)),
        ("every", every, (*p, "every")),
        ("retain", retain, (*path, "retain")),
    ):
        if ms is not None and ms <= 0 and not (what == "retain" and ms == 0):
            out.add(at, f"`{what}` is a duration above 0")
            return None, None
    if size is None or (wk == "hop" and every is None) or (v.retain is not None and retain is None):
        return None, None
    if every is not None and every > size:
        out.add(
            (*p, "every"),
            f"`every` ({v.window['every']}) is longer than the window ({v.window[wk]}): rows "
            "between two windows would be in none",
        )
        return None, None
    return Window(wk, size, every), retain


# long: one rule per view kind, as the contract lists them
def _view(
    name: str, job: str, kind: str | None, v: _View, seen, out: _Problems, event: bool = True
) -> View | None:
    path = ("jobs", job, "views", name)
    before = len(out.found)
    if not _NAME.match(name):
        out.add(path, "a view name is a letter then letters, digits or _")
    kinds = [k for k in ("row", "count", "agg", "list", "log") if getattr(v, k) is not None]
    if len(kinds) != 1:
        out.add(
            path,
            "a view has exactly one of `row`, `count`, `agg`, `list`, `log`"
            + (f" (has {', '.join(kinds)})" if kinds else ""),
        )
        return None
    vk = kinds[0]
    optional = set().union(*_KIND_KEYS.values())  # every key a view kind may take beside its own
    given = {k for k in optional if getattr(v, k) not in (None, {}, [])}
    for k in sorted(given - _KIND_KEYS[vk]):
        out.add((*path, k), f"`{k}` is not a key of a {vk} view")
    if vk == "log" and kind not in ("asof", "select", None):
        out.add((*path, "log"), "a log view is for asof and select jobs (an output log of the emitted rows)")
    if vk == "log" and kind == "select" and not event:
        out.add(
            (*path, "log"), "a log view of a select is of an event topic (a table's rows change and leave)"
        )
    if vk == "list" and v.fanout_limit is not None and kind not in ("join", None):
        out.add(
            (*path, "fanout_limit"),
            "`fanout_limit` is for a list view of a join job (a heavy match value's entries are merged at read "
            f"time); a {kind} job's list has none: remove it",
        )
    key = None
    fields = tuple(
        (str(n), _expr(e)) for n, e in (v.log.get("fields", {}) if vk == "log" else v.fields).items()
    )
    if vk == "log":
        extra = set(v.log) - {"fields"}
        if extra:
            out.add((*path, "log", sorted(extra)[0]), "unknown key (a log view has `fields`)")
        if not fields:
            out.add((*path, "log", "fields"), "a log view needs `fields`")
    else:
        keyed = getattr(v, vk)
        if len(keyed) != 1:
            out.add((*path, vk), f"a {vk} view has one key: `{vk}: {{<name>: <expression>}}`")
        else:
            key = next((str(n), _expr(e)) for n, e in keyed.items())
            _field_expr(key[1], seen, (*path, vk, key[0]), out)
    values = tuple((str(n), _expr(e)) for n, e in v.values.items())
    if vk == "count" and not values:
        out.add((*path, "values"), "a count view needs `values`: the sums it keeps, e.g. `{orders: 1}`")
    if vk == "agg" and not values:
        out.add((*path, "values"), 'an agg view needs `values`: its aggregates, e.g. `{rides: "count(*)"}`')
    exprs = fields + values
    if vk == "agg":
        exprs = fields
        for n, e in values:
            try:
                a = parse_aggregate(e)
            except ValueError as why:
                out.add((*path, "values", n), str(why))
                continue
            if a.expr is not None:
                exprs += ((n, a.expr),)
    for n, e in fields + values:
        if n.startswith("_") or not _NAME.match(n):
            out.add(
                (*path, "fields" if (n, e) in fields else "values", n),
                "a name is a letter then letters, digits or _",
            )
    for n, e in exprs:
        _field_expr(
            e,
            seen,
            (*path, "log", "fields", n)
            if vk == "log"
            else (*path, "fields" if (n, e) in fields else "values", n),
            out,
        )
    if v.where is not None:
        _field_expr(_expr(v.where), seen, (*path, "where"), out)
    order: tuple[tuple[str, bool], ...] = ()
    if vk == "list":
        if v.entry is None:
            out.add((*path, "entry"), "a list view needs `entry`: the expression of an entry's id")
        else:
            _field_expr(_expr(v.entry), seen, (*path, "entry"), out)
        if v.order is None:
            out.add((*path, "order"), "a list view needs `order`, e.g. `[ts desc, order_id desc]`")
        else:
            terms = [v.order] if isinstance(v.order, str) else v.order
            parsed = []
            for i, term in enumerate(terms):
                m = _ORDER.match(str(term).strip())
                expr, d = m.group(1).strip(), (m.group(2) or "asc").lower()
                parsed.append((expr, d == "desc"))
                _field_expr(expr, seen, (*path, "order", i), out)
            if parsed:
                _numeric_order(parsed[0][0], seen, (*path, "order", 0), out)
            if not 1 <= len(parsed) <= 2:
                out.add(
                    (*path, "order"),
                    "a list's order is one expression (a number or timestamp), then optionally the entry",
                )
            elif len(parsed) == 2 and (parsed[1][0] != _expr(v.entry) or parsed[1][1] != parsed[0][1]):
                out.add(
                    (*path, "order", 1),
                    "the second term of a list's order is the entry, in the same direction as the first (ties are ordered by the entry)",
                )
            order = tuple(parsed[:1])
        if v.cap is None or v.cap < 1:
            out.add((*path, "cap"), "a list view needs `cap`, a number >= 1: the entries kept per key")
        if v.fanout_limit is not None and v.fanout_limit < 0:
            out.add((*path, "fanout_limit"), "a number >= 0, or empty for no limit")
    window, retain = _window(v, kind, event, path, out) if vk in ("count", "agg", "list") else (None, None)
    if len(out.found) > before:
        return None
    return View(
        name=name,
        job=job,
        kind=vk,
        key=key,
        fields=fields,
        values=values,
        entry=_expr(v.entry) if v.entry is not None else None,
        order=order,
        cap=v.cap,
        entries=v.entries or "entries",
        items=v.items,
        fanout_limit=v.fanout_limit,
        where=_expr(v.where) if v.where is not None else None,
        show=v.show,
        window=window,
        retain_ms=retain,
    )


def parse_pipeline(text: str, file: str, env: Mapping[str, str] | None = None) -> Pipeline:
    """The pipeline in `text` (read from `file`, named in messages), with `${VAR}` taken from `env` (default: the
    process environment). Raises `PipelineError` with every problem found."""
    env = os.environ if env is None else env
    try:
        data, lines = read_yaml(text, env)
    except YamlProblem as e:
        raise PipelineError([Problem(file, e.line, "", e.message)]) from None
    out = _Problems(file, lines)
    data = _yaml_booleans(data, (), lines, out)
    try:
        raw = _Pipeline.model_validate(data)
    except ValidationError as e:
        _pydantic_problems(e, out)
        raise PipelineError(_seen(out.found)) from None
    topics = _topics(raw, out)
    out.broken_topics = set(raw.topics) - set(topics)
    if not raw.topics:
        out.add(("topics",), "no topics: declare at least one")
    jobs, views_seen = {}, {}
    for name, body in raw.jobs.items():
        j = _validated(_Job, body, ("jobs", name), out)
        if j is None:
            continue
        if not _NAME.match(name):
            out.add(("jobs", name), "a job name is a letter then letters, digits or _")
        if name in RESERVED_JOBS:
            out.add(("jobs", name), f"{name!r} is the name of a source job: choose another")
        kind, spec = _join(name, j, topics, out)
        if not j.views:
            out.add(("jobs", name, "views"), "a job needs at least one view")
        seen = _seen_names(kind, tuple(topics[t] for t in spec.topics)) if spec else None
        if seen is not None:
            fields = {n for t in seen.values() for n in t.names}
            for t in spec.topics:
                if t in fields:
                    out.add(
                        ("jobs", name, kind),
                        f"the topic {t!r} has the name of a field this job's views see: rename one",
                    )
        views = []
        for vname, v in j.views.items():
            if vname in views_seen:
                out.add(
                    ("jobs", name, "views", vname),
                    f"the view name {vname!r} is taken by job {views_seen[vname]!r}",
                )
            views_seen[vname] = name
            event = spec is None or topics[spec.topics[0]].kind == "event"
            view = _view(vname, name, kind, v, seen, out, event)
            if view is not None:
                views.append(view)
        if spec is not None:
            jobs[name] = Job(name, kind, spec, tuple(views))
    if out.found:
        raise PipelineError(_seen(out.found))
    read = Pipeline(file=file, topics=topics, jobs=jobs, lines=lines)
    placed = {n: replace(t, declared_at=read.where("topics", n, "fields")) for n, t in topics.items()}
    return replace(read, topics=placed)


def _topics(raw: _Pipeline, out: _Problems) -> dict[str, Topic]:
    """The file's topics that are valid (a topic read `from:` another completed from it first)."""
    declared = {n: _validated(_Topic, t, ("topics", n), out) for n, t in raw.topics.items()}
    declared = {
        n: _read_from(n, t, declared, out) if t is not None and t.from_ is not None else t
        for n, t in declared.items()
    }
    return {n: t for n, t in ((n, _topic(n, t, out)) for n, t in declared.items() if t) if t is not None}


def load_pipeline(path: str | Path, env: Mapping[str, str] | None = None) -> Pipeline:
    """The pipeline of the file at `path` (see `parse_pipeline`). A file that cannot be read is one problem too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PipelineError(
            [Problem(str(path), 0, "", f"cannot read the pipeline file: {e.strerror or e}")]
        ) from None
    except UnicodeDecodeError:
        raise PipelineError([Problem(str(path), 0, "", "not UTF-8 text")]) from None
    return parse_pipeline(text, str(path), env)
