"""A pipeline as the service uses it: topics, jobs (a join of two topics, or a select of one) and the views they
publish, resolved and checked.

Made by `spec.load.load_pipeline` (with the view kinds of `views.kinds`: `views.pipeline.load_pipeline`) from a pipeline file; immutable. Nothing here knows a domain: a topic is its fields
and roles (id or key, time, op), a job is a join kind over two topics or a select of one topic, a view is a kind
(row, count, agg, list, log) over the rows the job gives.

What a view sees (`Pipeline.row_columns(job)`), per job kind:
- select: the topic's fields;
- interval: the left topic's fields and `matches` (long): the number of matching right events seen so far;
- asof: the stream's fields, the table's fields (bare where the stream has no field of that name), `version`;
- join: the left topic's fields, the right topic's fields (bare where the left has no field of that name).
Every field of a side is also reachable as `<topic>.<field>`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from spec.durations import duration_text
from spec.sql import Aggregate, parse_aggregate

__all__ = [
    "FieldType",
    "FIELD_TYPES",
    "SQL_TYPES",
    "Capture",
    "Topic",
    "Interval",
    "Asof",
    "Join",
    "Select",
    "Window",
    "View",
    "Job",
    "Pipeline",
    "VERSION",
    "MATCHES",
]

FieldType = Literal["id", "string", "long", "double", "boolean", "timestamp"]
FIELD_TYPES: tuple[str, ...] = ("id", "string", "long", "double", "boolean", "timestamp")
# How a field of each type is stored in a topic's log and seen by expressions (a timestamp: epoch ms).
SQL_TYPES: dict[str, str] = {
    "id": "string",
    "string": "string",
    "long": "bigint",
    "double": "double",
    "boolean": "boolean",
    "timestamp": "bigint",
}
VERSION = "version"  # what an asof view sees as the id of the version used (`<key>@<time>`), or null
MATCHES = "matches"  # what an interval view sees as the number of matching right events so far


@dataclass(frozen=True)
class Capture:
    """`capture: {postgres: <table>, columns: {<field>: <column>}}`: the `cdc` job captures the table into the
    topic; each field is filled from the column of the same name, or the one `columns` names."""

    postgres: str
    columns: Mapping[str, str] = field(default_factory=dict)

    def column(self, field_name: str) -> str:
        return self.columns.get(field_name, field_name)


@dataclass(frozen=True)
class Topic:
    """An input log. An *event* topic has `id` (a record delivered twice has the effect of one); a *table* topic has
        `key` (it is the changelog of a keyed table: per key, the record with the greatest time wins; on equal times a
        delete wins, then the record whose non-key fields, in declared order, are greatest; with `final_deletes`, a
        delete of a key is final whatever the times).

        fields: (name, type) in declared order. optional: fields that may be absent or null. op: (upsert name, remove
        name) of the record's field `op`, or None (every record is an upsert). remove_fields: fields a remove record
        must carry besides the key and the time (none by default). source: the event topic whose log this table topic
    reads (`from:`; nothing is written to this topic itself), None for a topic of its own log. view: the view whose
    rows this topic is (`from: {view: ...}`: a log view's as an event topic, a row, count or agg view's as a table
    topic keyed by the view's key, `spec.viewtable`), None otherwise. log: the lake key of the log such a topic
    reads, the view's table log in the generation its job serves (`views.table.table_key`), set when a job runs
    (`jobs.core.chain`); None in the file's pipeline. declared_at: `<file>:<line>: topics.<name>.fields`
        of the declaration it was read from, for messages (None for a topic made in code; not compared)."""

    name: str
    fields: tuple[tuple[str, str], ...]
    time: str
    id: tuple[str, ...] | None = None
    key: tuple[str, ...] | None = None
    optional: frozenset[str] = frozenset()
    op: tuple[str, str] | None = None
    final_deletes: bool = False
    remove_fields: tuple[str, ...] = ()
    capture: Capture | None = None
    source: str | None = None
    view: str | None = None
    log: str | None = None
    declared_at: str | None = field(default=None, compare=False, repr=False)

    @property
    def kind(self) -> Literal["event", "table"]:
        return "event" if self.id is not None else "table"

    @property
    def identity(self) -> tuple[str, ...]:
        """The fields that identify a record (event topic) or a row (table topic)."""
        return self.id if self.id is not None else self.key

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.fields)

    def type_of(self, name: str) -> str:
        return dict(self.fields)[name]

    @property
    def values(self) -> tuple[str, ...]:
        """The non-key fields, in declared order (the time among them): what the current-table rule compares."""
        return tuple(n for n in self.names if n not in self.identity)

    def columns(self) -> list[tuple[str, str]]:
        """(name, SQL type) of the topic's log: `op` first when the topic has one, then the fields in order."""
        cols = [("op", "string")] if self.op else []
        return cols + [(n, SQL_TYPES[t]) for n, t in self.fields]

    def schema(self) -> str:
        """The log's columns as a SQL schema string (`op string, order_id string, ...`)."""
        return ", ".join(f"`{n}` {t}" for n, t in self.columns())


@dataclass(frozen=True)
class Interval:
    """Stream-stream: a right event r matches a left event l when every `match` pair is equal and
    `lower_ms <= r.time - l.time <= upper_ms`. unmatched: publish left events with no match once closed."""

    left: str
    right: str
    match: tuple[tuple[str, str], ...]
    lower_ms: int
    upper_ms: int
    unmatched: bool = False

    @property
    def topics(self) -> tuple[str, str]:
        return (self.left, self.right)


@dataclass(frozen=True)
class Asof:
    """Stream-table: each stream event joined with the version of its table key in force at its time, or the one its
    `pin` field names. match: (stream expression, table key field) pairs, covering the table's key."""

    stream: str
    table: str
    match: tuple[tuple[str, str], ...]
    pin: str | None = None

    @property
    def topics(self) -> tuple[str, str]:
        return (self.stream, self.table)


@dataclass(frozen=True)
class Join:
    """Table-table: the inner join of the two current tables, maintained incrementally."""

    left: str
    right: str
    match: tuple[tuple[str, str], ...]

    @property
    def topics(self) -> tuple[str, str]:
        return (self.left, self.right)


@dataclass(frozen=True)
class Select:
    """No join: the rows of one topic. An event topic gives each event once (a duplicate id has one effect); a table
    topic its current rows, which change and leave with it."""

    source: str

    @property
    def topics(self) -> tuple[str]:
        return (self.source,)

    @property
    def match(self) -> tuple:
        return ()


@dataclass(frozen=True)
class Window:
    """An event-time window of a count, agg or list view (`window:`): `kind` tumble, hop or session. A tumbling
    window holds the times in `[k*size_ms, (k+1)*size_ms)`; a hopping one of size `size_ms` starts every `every_ms`
    (a row is in each window that holds its time); a session (`size_ms`: its gap) holds a key's rows each less than
    the gap away from another of them, and ends at its last row's time plus the gap. Aligned to the epoch (ms)."""

    kind: Literal["tumble", "hop", "session"]
    size_ms: int
    every_ms: int | None = None

    @property
    def text(self) -> str:
        """As a pipeline file writes it: `tumble 1 h`, `hop 1 h every 10 min`, `session 5 min`."""
        every = f" every {duration_text(self.every_ms)}" if self.every_ms else ""
        return f"{self.kind} {duration_text(self.size_ms)}{every}"

    @property
    def step_ms(self) -> int:
        """The distance between two windows' starts (a tumbling window's size; a session has none)."""
        return self.every_ms or self.size_ms


@dataclass(frozen=True)
class View:
    """What Redis (or an output log) holds of a job's rows. kind: row | count | agg | list | log.

    key: (name, expression) of a row, count, agg or list view. fields: (name, expression) pairs of a row, list entry
    or log line. values: (name, expression) sums of a count view, (name, aggregate text) of an agg view
    (`aggregates`: parsed). entry, order ((expression, descending) pairs), cap,
    entries (the export's name of the entry list), items (the name of the entries with their fields in `query
    --json`; default: `entries`'s), fanout_limit: a list view's. where: only the rows for which it holds. show: the
    plain `mview query` output of one row or entry (Python format fields named as the view's names). window: a
    count, agg or list view's event-time window (`Window`; its key becomes `<key>|<window start>`), retain_ms: how
    long after the watermark passed its end a final window stays (None: always). table: a table topic of the
    pipeline reads the view (`from: {view: ...}`), so its job keeps the view's table log (`views.table`); events:
    an event topic reads the (log) view, so its output log carries the stamp of a topic's log (`views.log`)."""

    name: str
    job: str
    kind: str  # a registered view kind (`views.kinds`)
    key: tuple[str, str] | None = None
    fields: tuple[tuple[str, str], ...] = ()
    values: tuple[tuple[str, str], ...] = ()
    entry: str | None = None
    order: tuple[tuple[str, bool], ...] = ()
    cap: int | None = None
    entries: str = "entries"
    items: str | None = None
    fanout_limit: int | None = None
    where: str | None = None
    show: str | None = None
    window: Window | None = None
    retain_ms: int | None = None
    table: bool = False
    events: bool = False

    @property
    def key_name(self) -> str | None:
        return self.key[0] if self.key else None

    @property
    def items_name(self) -> str:
        return self.items or self.entries

    @property
    def aggregates(self) -> tuple[tuple[str, Aggregate], ...]:
        """(name, `spec.sql.Aggregate`) of an agg view's values, in declared order."""
        return tuple((n, parse_aggregate(t)) for n, t in self.values)


@dataclass(frozen=True)
class Job:
    name: str
    kind: Literal["interval", "asof", "join", "select"]
    spec: Interval | Asof | Join | Select
    views: tuple[View, ...]

    @property
    def topics(self) -> tuple[str, ...]:
        return self.spec.topics


@dataclass(frozen=True)
class Pipeline:
    """A checked pipeline. `file` is the path it was read from (as given); `lines` maps key paths to lines."""

    file: str
    topics: Mapping[str, Topic]
    jobs: Mapping[str, Job]
    lines: Mapping[tuple, int] = field(default_factory=dict, repr=False)

    @property
    def views(self) -> dict[str, View]:
        return {v.name: v for job in self.jobs.values() for v in job.views}

    def topic(self, name: str) -> Topic:
        return self.topics[name]

    @property
    def written(self) -> dict[str, Topic]:
        """The topics with a log of their own, those producers write (not read `from:` another topic or a view), by
        name."""
        return {n: t for n, t in self.topics.items() if t.source is None and t.view is None}

    def reading(self, logs: Mapping[str, str]) -> Pipeline:
        """This pipeline with each topic named in `logs` reading the log at that lake key (`Topic.log`: a topic read
        from a view, its table log in the generation its job serves)."""
        if not logs:
            return self
        return replace(self, topics={n: replace(t, log=logs.get(n, t.log)) for n, t in self.topics.items()})

    def view_job(self, view: str) -> str:
        """The job that maintains view `view`."""
        return self.views[view].job

    def upstream(self, job: str) -> tuple[str, ...]:
        """The jobs whose views `job` reads (through a topic read `from: {view: ...}`), directly, in the order of its
        topics."""
        views = [self.topics[t].view for t in self.jobs[job].topics]
        return tuple(dict.fromkeys(self.view_job(v) for v in views if v is not None))

    def chain(self, job: str) -> tuple[str, ...]:
        """The jobs `job` depends on, directly or through others, each after those it depends on (the order `run
        --once` runs them in); not `job` itself. The loader refuses a cycle, so there is none."""
        out: dict[str, None] = {}

        def visit(j: str) -> None:
            for up in self.upstream(j):
                if up not in out:
                    visit(up)
                    out[up] = None

        visit(job)
        return tuple(out)

    def downstream(self, job: str) -> tuple[str, ...]:
        """The jobs that read `job`'s views, directly or through others, each after those it depends on (the order
        in which a replay of `job` rebuilds them)."""
        order = dict.fromkeys(n for name in self.jobs for n in (*self.chain(name), name))
        return tuple(j for j in order if job in self.chain(j))

    def where(self, *path) -> str:
        """`<file>:<line>: <dotted path>` for messages about the key at `path` (the nearest line known)."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                return f"{self.file}:{self.lines[path[:n]]}: {'.'.join(map(str, path))}"
        return f"{self.file}: {'.'.join(map(str, path))}"

    def sides(self, job: str) -> tuple[Topic, ...]:
        """The topics `job` reads, in the order it declares them: two for a join kind, one for a select."""
        return tuple(self.topics[t] for t in self.jobs[job].topics)

    def row_columns(self, job: str) -> list[tuple[str, str]]:
        """(name, SQL type) of the bare names a view of `job` sees (see the module docstring); every side's
        fields are also `<topic>.<field>`."""
        j = self.jobs[job]
        first, *rest = self.sides(job)
        cols = [(n, SQL_TYPES[t]) for n, t in first.fields]
        if j.kind == "select":
            return cols
        (second,) = rest
        if j.kind == "interval":
            return cols + [(MATCHES, "bigint")]
        taken = set(first.names)
        cols += [(n, SQL_TYPES[t]) for n, t in second.fields if n not in taken]
        return cols + ([(VERSION, "string")] if j.kind == "asof" else [])

    def fingerprint(self, job: str) -> str:
        """What a generation of `job` is built from (`definition`), as a short hash. A job started with another
        fingerprint is rebuilt into a new generation."""
        text = json.dumps(self.definition(job), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def definition(self, job: str) -> dict:
        """What a generation of `job` is built from, as plain data: the job with its views (`job`) and the
        declarations of the topics it reads (`topics`; where a topic's records come from, its capture, does not
        change what they mean, nor where in a file it was declared), and the definitions of the jobs whose views it
        reads (`upstream`, when it reads any); the views of `job` that other jobs read (`read_as_topics`, when there
        are any: such a view keeps a log from its first batch, so a reader added later rebuilds the job)."""
        j = self.jobs[job]
        topics = {t: {**asdict(self.topics[t]), "capture": None} for t in j.topics}
        own = asdict(j)
        for v in own["views"]:  # said once, below (`read_as_topics`)
            del v["table"], v["events"]
        body = {
            "job": own,
            "topics": {
                t: {
                    k: v
                    for k, v in d.items()
                    if k != "declared_at" and (k not in ("view", "log") or v is not None)
                }
                for t, d in topics.items()
            },
        }
        own = {v.name for v in j.views}
        tables = sorted(t.view for t in self.topics.values() if t.view in own)
        if tables:  # a view another job reads keeps a log of its entries from its first batch (`views.table`)
            body["read_as_topics"] = tables
        upstream = self.upstream(job)
        if upstream:  # a view read changes with its job's definition: so does this job's
            body["upstream"] = {up: self.definition(up) for up in upstream}
        return json.loads(json.dumps(body, default=_plain))


def _plain(value):
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(type(value).__name__)
