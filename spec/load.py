"""Loading and checking a pipeline file: `load_pipeline(path, kinds=...)` -> `spec.model.Pipeline`, or `PipelineError`
with every problem found, one line each (`<file>:<line>: <key>: <what is wrong>`). The view kinds are given by the
caller (`views.kinds` registers them; `views.pipeline.load_pipeline` is the loader with them): each kind's module
reads its own keys (`spec.viewfile`). No Spark: the shape of the file is checked by pydantic, then the references
between its parts (topics, fields, join kinds, what every view shares) here; an expression
that is a plain field name is checked against what the view sees, and no expression may call Java or hold a
subquery (`spec.sql.outside_reach`). Expressions are Spark SQL: any other problem in one (a typo in a function, a
type that does not fit) is found when the job starts, by Spark, and reported in one line naming the file, line and
expression (`views.frame.check_job`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

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
from spec.problems import (
    NAME,
    Expr,
    Problems,
    Strict,
    duration,
    expr_text,
    field_expr,
    pydantic_problems,
    unique,
    validated,
)
from spec.source import YamlProblem, read_yaml
from spec.viewfile import ViewCheck, ViewFile, WindowedKeys
from spec.viewtable import BATCH, OP, table_key

__all__ = ["load_pipeline", "parse_pipeline", "RESERVED_JOBS"]

RESERVED_JOBS = ("kafka", "cdc")  # the source jobs: a pipeline's jobs cannot take their names


class _Op(Strict):
    upsert: str
    remove: str


class _Capture(Strict):
    postgres: str
    columns: dict[str, str] = {}


Names = str | list[str]


class _Topic(Strict):
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


class _Interval(Strict):
    left: str
    right: str
    match: dict[str, Expr]
    within: tuple[str, str]
    unmatched: bool = False


class _Asof(Strict):
    stream: str
    table: str
    match: dict[str, Expr]
    pin: str | None = None


class _Join(Strict):
    left: str
    right: str
    match: dict[str, Expr]


class _Select(Strict):
    source: str = Field(alias="from")


class _Job(Strict):
    interval: _Interval | None = None
    asof: _Asof | None = None
    join: _Join | None = None
    select: _Select | None = None
    views: dict[str, Any] = {}


class _Pipeline(Strict):
    topics: dict[str, Any]
    jobs: dict[str, Any] = {}


def _names(value) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _yaml_booleans(data, path: tuple, lines: dict, out: Problems):
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


_OWN = ("fields", "time", "id", "optional", "op", "final_deletes", "remove_fields", "capture")


def _read_from(name: str, t: _Topic, declared: dict, out: Problems) -> _Topic | None:
    """A topic declared `from: <event topic>`: that topic's log read as a table, keyed by its own `key`, with the
    source's fields, time and optional fields (None, with its problems, when it cannot be)."""
    path, before = ("topics", name), len(out.found)
    src = declared.get(t.from_)
    if t.from_ not in declared:
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
def _topic(name: str, t: _Topic, out: Problems) -> Topic | None:
    path = ("topics", name)
    before = len(out.found)
    if not NAME.match(name):
        out.add(path, "a topic name is a letter then letters, digits or _")
    if not t.fields or t.time is None:
        out.add(path, "a topic needs `fields` (at least one) and `time`, or `from:` another topic")
        return None
    for f, kind in t.fields.items():
        if kind not in FIELD_TYPES:
            out.add(
                (*path, "fields", f), f"field {f!r} has type {kind!r}: choose one of {', '.join(FIELD_TYPES)}"
            )
        if not NAME.match(f):
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


def _side(
    topics: dict[str, Topic], name: str, kind: str, path: tuple, why: str, out: Problems
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


# long: one rule per join kind, as the contract lists them
def _join(name: str, j: _Job, topics: dict[str, Topic], out: Problems):
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
    match = tuple((str(a), expr_text(b)) for a, b in raw.match.items())
    if kind == "interval":
        left = _side(topics, raw.left, "event", (*p, "left"), "an interval join joins two event topics", out)
        right = _side(
            topics, raw.right, "event", (*p, "right"), "an interval join joins two event topics", out
        )
        lo = duration(raw.within[0], (*p, "within", 0), out)
        hi = duration(raw.within[1], (*p, "within", 1), out)
        if lo is not None and hi is not None and lo > hi:
            out.add((*p, "within"), f"the lower bound {raw.within[0]!r} is after the upper {raw.within[1]!r}")
        if left and right:
            for a, b in match:
                field_expr(a, {left.name: left}, (*p, "match", a), out)
                field_expr(b, {right.name: right}, (*p, "match", a), out)
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
                field_expr(a, {stream.name: stream}, (*p, "match", a), out)
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
            field_expr(a, {left.name: left}, (*p, "match", a), out)
            field_expr(b, {right.name: right}, (*p, "match", a), out)
    if not (left and right):
        return kind, None
    return kind, Join(left.name, right.name, match)


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


_WINDOW_KINDS = ("tumble", "hop", "session")


def _window_placed(v: WindowedKeys, kind: str | None, event: bool, path: tuple, out: Problems) -> bool:
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
    v: WindowedKeys, kind: str | None, event: bool, path: tuple, out: Problems
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
    size = duration(str(v.window[wk]), (*p, wk), out)
    every = None
    if wk == "hop":
        if "every" not in v.window:
            out.add(
                p,
                "a hopping window needs `every`: how often a window starts, e.g. `{hop: 1 h, every: 10 min}`",
            )
            return None, None
        every = duration(str(v.window["every"]), (*p, "every"), out)
    elif "every" in v.window:
        out.add((*p, "every"), f"`every` is of a hopping window (`hop`), not of a {wk} one")
    retain = None if v.retain is None else duration(str(v.retain), (*path, "retain"), out)
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


def _view(name: str, job: str, raw, at: ViewCheck, files: Mapping[str, ViewFile]) -> View | None:
    """The view `name` of `job` (at `at.path`) as its kind's module reads it (`spec.viewfile`), after what every kind
    shares: the name, exactly one kind key, no key of another kind, a job kind it serves, `where`, `window`."""
    path, kind, out = at.path, at.job_kind, at.out
    before = len(out.found)
    if not NAME.match(name):
        out.add(path, "a view name is a letter then letters, digits or _")
    if not isinstance(raw, dict):
        out.add(path, f"a view is a mapping with one of {_kind_keys(files)} and its keys")
        return None
    kinds = [k for k in files if k in raw]
    if len(kinds) != 1:
        out.add(
            path,
            f"a view has exactly one of {_kind_keys(files)}"
            + (f" (has {', '.join(kinds)})" if kinds else ""),
        )
        return None
    f = files[kinds[0]]
    others = set().union(*(vf.key_names for vf in files.values())) - f.key_names - set(files)
    for k in sorted(set(raw) & others):
        out.add((*path, k), f"`{k}` is not a key of a {f.name} view")
    keys = validated(f.keys, {k: v for k, v in raw.items() if k not in others}, path, out)
    if keys is None:
        return None
    if kind is not None and kind not in f.serves:
        out.add((*path, f.name), f.serves_note or f"a {f.name} view is for {' and '.join(f.serves)} jobs")
    parts = f.read(keys, at)
    where = None if keys.where is None else at.expr(keys.where, ("where",))
    window, retain = _window(keys, kind, at.event, path, out) if f.windowed else (None, None)
    if len(out.found) > before:
        return None
    show = getattr(keys, "show", None)
    return View(
        name=name, job=job, kind=f.name, where=where, show=show, window=window, retain_ms=retain, **parts
    )


def _kind_keys(files: Mapping[str, ViewFile]) -> str:
    return ", ".join(f"`{k}`" for k in files)


def parse_pipeline(
    text: str, file: str, env: Mapping[str, str] | None = None, *, kinds: Mapping[str, ViewFile]
) -> Pipeline:
    """The pipeline in `text` (read from `file`, named in messages), with `${VAR}` taken from `env` (default: the
    process environment) and its views of the view kinds `kinds` (by the name in the file: `views.kinds`). Raises
    `PipelineError` with every problem found."""
    env = os.environ if env is None else env
    try:
        data, lines = read_yaml(text, env)
    except YamlProblem as e:
        raise PipelineError([Problem(file, e.line, "", e.message)]) from None
    out = Problems(file, lines)
    data = _yaml_booleans(data, (), lines, out)
    try:
        raw = _Pipeline.model_validate(data)
    except ValidationError as e:
        pydantic_problems(e, out)
        raise PipelineError(unique(out.found)) from None
    topics, of_views = _topics(raw, out)
    out.broken_topics = set(raw.topics) - set(topics) - set(of_views)
    if not raw.topics:
        out.add(("topics",), "no topics: declare at least one")
    jobs, views_seen = {}, {}
    for name in _job_order(raw, of_views, out):
        _view_topics(_raw_reads(raw.jobs[name]), raw, of_views, topics, jobs, out, kinds)
        job = _job(name, raw.jobs[name], topics, views_seen, out, kinds)
        if job is not None:
            jobs[name] = job
    jobs = {n: jobs[n] for n in raw.jobs if n in jobs}  # in the file's order
    topics = {n: topics[n] for n in raw.topics if n in topics}
    _view_topics(list(of_views), raw, of_views, topics, jobs, out, kinds)  # those no job reads
    if out.found:
        raise PipelineError(unique(out.found))
    tables = {t.view for t in topics.values() if t.view is not None and t.kind == "table"}
    events = {t.view for t in topics.values() if t.view is not None and t.kind == "event"}
    jobs = {
        n: replace(
            j, views=tuple(replace(v, table=v.name in tables, events=v.name in events) for v in j.views)
        )
        for n, j in jobs.items()
    }
    read = Pipeline(file=file, topics=topics, jobs=jobs, lines=lines)
    placed = {n: replace(t, declared_at=read.where("topics", n, "fields")) for n, t in topics.items()}
    return replace(read, topics=placed)


def _job(
    name: str, body, topics: dict[str, Topic], views_seen: dict, out: Problems, kinds: Mapping[str, ViewFile]
) -> Job | None:
    """The job `name` (its join kind, then its views; `views_seen`: the job of each view name so far), or None."""
    j = validated(_Job, body, ("jobs", name), out)
    if j is None:
        return None
    if not NAME.match(name):
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
        at = ViewCheck(("jobs", name, "views", vname), kind, event, seen, out)
        view = _view(vname, name, v, at, kinds)
        if view is not None:
            views.append(view)
    return Job(name, kind, spec, tuple(views)) if spec is not None else None


def _raw_reads(body) -> list[str]:
    """The topic names a job's declaration reads, as written (before it is checked)."""
    if not isinstance(body, dict):
        return []
    names = []
    for kind in ("interval", "asof", "join", "select"):
        spec = body.get(kind)
        if isinstance(spec, dict):
            names += [v for k, v in spec.items() if k in ("left", "right", "stream", "table", "from")]
    return [n for n in names if isinstance(n, str)]


def _raw_views(body) -> list[str]:
    views = body.get("views") if isinstance(body, dict) else None
    return [str(v) for v in views] if isinstance(views, dict) else []


def _job_order(raw: _Pipeline, of_views: dict[str, _Topic], out: Problems) -> list[str]:
    """The file's jobs, each after the jobs whose views it reads (through topics read `from: {view: ...}`). A cycle
    is one problem naming it, on the first of its topics; the jobs of a cycle are left out (and those topics
    counted as broken, so that nothing else reports them again)."""
    owner = {v: j for j, body in raw.jobs.items() for v in _raw_views(body)}
    via = {n: t.from_.get("view") for n, t in of_views.items()}
    needs = {
        j: [(n, owner[via[n]]) for n in _raw_reads(body) if n in via and via[n] in owner]
        for j, body in raw.jobs.items()
    }
    order, state = [], {}

    def visit(j: str, path: list[tuple[str, str]]) -> None:
        state[j] = "visiting"
        for topic, up in needs[j]:
            if state.get(up) == "visiting":
                ring = [*path, (j, topic)]
                ring = ring[[x for x, _ in ring].index(up) :]
                names = " -> ".join([x for x, _ in ring] + [up])
                how = "; ".join(f"{x} reads {t!r} (view {via[t]!r} of {owner[via[t]]!r})" for x, t in ring)
                out.add(
                    ("topics", ring[0][1], "from"), f"jobs {names} read each other's views ({how}): a cycle"
                )
                out.broken_topics.update(t for _, t in ring)
                state.update({x: "cyclic" for x, _ in ring})
            elif up not in state:
                visit(up, [*path, (j, topic)])
        if state[j] == "visiting":
            state[j] = "done"
            order.append(j)

    for j in raw.jobs:
        if j not in state:
            visit(j, [])
    return [j for j in order if state[j] == "done"]


def _view_topics(
    names: list[str],
    raw: _Pipeline,
    of_views: dict[str, _Topic],
    topics: dict[str, Topic],
    jobs: dict,
    out: Problems,
    kinds: Mapping[str, ViewFile],
) -> None:
    """Make each topic of `names` read from a view, not made yet, once the job of that view is read (`_job_order`
    puts it first); one whose view's job has problems of its own is counted as broken."""
    by_view = {v.name: (j, v) for j in jobs.values() for v in j.views}
    for name in names:
        if name not in of_views or name in topics or name in out.broken_topics:
            continue
        t = of_views[name]
        view = t.from_.get("view")
        declared = [v for b in raw.jobs.values() for v in _raw_views(b)]
        if view in by_view:
            made = _view_topic(name, t, *by_view[view], topics, out, kinds)
            if made is not None:
                topics[name] = made
                continue
        elif view not in declared:  # a view of a job with problems of its own is said there
            out.add(("topics", name, "from", "view"), f"unknown view {view!r} (views: {', '.join(declared)})")
        out.broken_topics.add(name)


_VIEW_OWN = ("key", "op", "optional", "final_deletes", "remove_fields", "capture")


# long: one rule per part of the declaration, as spec.viewtable's docstring lists them
def _view_topic(
    name: str,
    t: _Topic,
    job: Job,
    view: View,
    topics: dict[str, Topic],
    out: Problems,
    kinds: Mapping[str, ViewFile],
):
    """The topic `name` read from view `view` of job `job` (see `spec.viewtable`), or None with its problems."""
    path, before = ("topics", name), len(out.found)
    if not NAME.match(name):
        out.add(path, "a topic name is a letter then letters, digits or _")
    if set(t.from_) != {"view"} or not isinstance(t.from_.get("view"), str):
        out.add((*path, "from"), "a topic read from a view is `from: {view: <view name>}`")
        return None
    kind = kinds[view.kind]
    if kind.topic is None:
        readable = ", ".join(k for k, f in kinds.items() if f.topic is not None)
        out.add(
            (*path, "from", "view"),
            f"{view.name!r} is a {view.kind} view, which is not read as a topic (read a view of: {readable})",
        )
        return None
    event = kind.events
    for k in (k for k in _VIEW_OWN if k in t.model_fields_set):
        out.add((*path, k), "a topic read from a view has the view's key and records: remove it")
    if not event:
        for k in (k for k in ("id", "time") if k in t.model_fields_set):
            out.add((*path, k), f"a topic read from a {view.kind} view is keyed by the view's key: remove it")
    seen = _seen_names(job.kind, tuple(topics[n] for n in job.spec.topics))
    fields = dict(kind.topic(view, seen))
    for f, given in t.fields.items():
        if f not in fields:
            out.add((*path, "fields", f), f"{f!r} is not a field of view {view.name!r} ({', '.join(fields)})")
        elif given not in FIELD_TYPES:
            out.add(
                (*path, "fields", f),
                f"field {f!r} has type {given!r}: choose one of {', '.join(FIELD_TYPES)}",
            )
        else:
            fields[f] = given
    exprs = dict(view.fields) | dict(view.values)
    for f in (f for f, told in fields.items() if told is None):
        out.add(
            (*path, "from"),
            f"the type of {f!r} of view {view.name!r} ({exprs.get(f, f)}) cannot be told from its expression: "
            f"give it, `fields: {{{f}: <type>}}`",
        )
    if event:
        ident = _names(t.id) if t.id is not None else ()
        if not ident:
            out.add(
                path,
                f"a topic read from a log view is an event topic: give its `id` (of {', '.join(fields)})",
            )
        for f in ident:
            if fields.get(f, "") not in ("id", "string", "long"):
                out.add((*path, "id"), f"{f!r} is not a string or long field of view {view.name!r}")
        if t.time is None or fields.get(t.time) != "timestamp":
            out.add((*path, "time"), f"give `time`, a timestamp field of view {view.name!r}")
        other = next((o for o in topics.values() if o.view == view.name and o.time != t.time), None)
        if other is not None:
            out.add(
                (*path, "time"),
                f"topic {other.name!r} reads view {view.name!r} with time {other.time!r}: every topic of a log view "
                "has the same time (its log is stamped by it)",
            )
    if len(out.found) > before:
        return None
    if event:
        return Topic(name=name, fields=tuple(fields.items()), time=t.time, id=_names(t.id), view=view.name)
    return Topic(
        name=name,
        fields=(*fields.items(), (BATCH, "timestamp")),
        time=BATCH,
        key=table_key(view),
        op=OP,
        view=view.name,
    )


def _topics(raw: _Pipeline, out: Problems) -> tuple[dict[str, Topic], dict[str, _Topic]]:
    """The file's topics that are valid (a topic read `from:` another completed from it first), and those read from
    a view (`from: {view: ...}`), made once their view's job is read (`_view_topic`)."""
    declared = {n: validated(_Topic, t, ("topics", n), out) for n, t in raw.topics.items()}
    of_views = {n: t for n, t in declared.items() if t is not None and isinstance(t.from_, dict)}
    declared = {
        n: _read_from(n, t, declared, out) if t is not None and t.from_ is not None else t
        for n, t in declared.items()
        if n not in of_views
    }
    topics = {n: t for n, t in ((n, _topic(n, t, out)) for n, t in declared.items() if t) if t is not None}
    return topics, of_views


def load_pipeline(
    path: str | Path, env: Mapping[str, str] | None = None, *, kinds: Mapping[str, ViewFile]
) -> Pipeline:
    """The pipeline of the file at `path` (see `parse_pipeline`). A file that cannot be read is one problem too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PipelineError(
            [Problem(str(path), 0, "", f"cannot read the pipeline file: {e.strerror or e}")]
        ) from None
    except UnicodeDecodeError:
        raise PipelineError([Problem(str(path), 0, "", "not UTF-8 text")]) from None
    return parse_pipeline(text, str(path), env, kinds=kinds)
