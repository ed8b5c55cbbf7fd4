"""The `row` view kind: one entry per key, each row of the view in a Redis hash of its key.

Redis (generation `g` of the view's job): hash `mv:<view>:<g>:{<key>}`, one field per row of the view with that key:
field = the row's identity (`_id`: an interval job's left event, an asof job's stream event, ...), value = JSON
`[final, line]`, where `line` is the export line (`{"<key name>": key, <field>: value, ...}`, fields in declared
order, null fields kept) and `final` is true once an interval job's row is final (its window closed), false
before, and null for the other kinds.

Changes (`ROW_CHANGES`, made by `row_changes` from a job's rows, `views.frame`): `key, id, body`; a body sets
that identity's entry of the key's hash (HSET), a null body removes it (HDEL). The content is absolute, so a
replayed batch has the effect of one, and a job applies its batches in order. `RowSink` sends them from the
executors, one command per change, pipelined (`views.wire.forward`: the key is the hash tag, so each command goes
to its key's master on a Redis Cluster).

Read as a table by another job (`View.table`, `views.table`): `RowTable` keeps, on the lake, per key the row a
reader sees, as an agg view of one value (the max of the struct of the row's fields then its identity, the order
`query_row` picks by), and appends each batch's changed keys' lines to the view's table log; the Redis hashes stay
the row sink's. Not for an interval job's row views (their rows change as matches arrive until the window closes).

Read: `query_row` gives the line of the key's greatest row (the one whose fields, compared in declared order with
null smallest, are greatest; then the greatest identity), plus `final` when it is not null, plus `generation`;
`{}` when the key has no row. `export_rows` gives every key's line, by key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.storage import Lake
from spec.model import Pipeline, View
from spec.problems import Expr
from spec.viewfile import ShownKeys, ViewCheck, ViewFile
from spec.viewtable import entry_fields, expr_type
from views.agg import AggStep, AggView
from views.fence import GATE_LUA, UNFENCED, Fence
from views.frame import line_sql, select_view
from views.keys import key_id, view_key, view_pattern
from views.redis_io import current_generation, is_cluster
from views.wire import args, forward, gated, hash_tag_column, lit, payload_rows, view_key_column

__all__ = [
    "FILE",
    "ROW_CHANGES",
    "row_changes",
    "row_delta",
    "RowSink",
    "query_row",
    "export_rows",
    "pick_row",
    "RowTable",
    "row_tables",
]


class RowKeys(ShownKeys):
    """A row view in the file: `row: {<key name>: <expression>}` and the `fields` of its row."""

    row: dict[str, Expr]
    fields: dict[str, Expr] = {}


def _read(keys: RowKeys, check: ViewCheck) -> dict:
    return {"key": check.one_key(keys.row, "row"), "fields": check.named(keys.fields, ("fields",))}


def _topic(view: View, seen) -> list:
    return entry_fields(view, [(n, expr_type(e, seen)) for n, e in view.fields])


FILE = ViewFile("row", RowKeys, _read, topic=_topic)


ROW_CHANGES = "key string, id string, body string"
_SCAN = 500  # keys per pipelined round trip of an export


def _body(view: View, final: str | None) -> str:
    fin = "CAST(NULL AS boolean)" if final is None else f"({final})"
    return f"concat('[', coalesce(CAST({fin} AS string), 'null'), ',', {line_sql(view, '_ka')}, ']')"


def _before(x: DataFrame, view: View, pipeline: Pipeline, before: dict, shown_before: str) -> DataFrame:
    """`x` with `_kb` (the key) and `_sb` (shown) of each row as it was before the step: the view's key and
    where evaluated with the columns `before` names rebound to their SQL (e.g. `matches` to its value before)."""
    stash = {f"_a_{n}": F.col(quoted(n)) for n in before}
    rebound = x.withColumns(stash).withColumns({n: F.expr(sql) for n, sql in before.items()})
    y = select_view(rebound, view, pipeline, parts=("key", "where"), keep=rebound.columns)
    y = y.selectExpr(
        *[quoted(c) for c in rebound.columns],
        "_key AS _kb",
        f"_where AND coalesce((\n{shown_before}\n), false) AS _sb",
    )
    return y.withColumns({n: F.col(f"_a_{n}") for n in before}).drop(*stash)


def row_changes(
    frame: DataFrame,
    view: View,
    pipeline: Pipeline,
    *,
    shown: str = "true",
    final: str | None = None,
    before: dict[str, str] | None = None,
    shown_before: str = "false",
) -> DataFrame:
    """The changes (`ROW_CHANGES`) of row view `view` from `frame` (`views.frame.view_rows` of a job's rows that
    may have changed): the entry of each row that is `shown` (SQL over the frame) and satisfies the view's
    `where`, its `final` flag the SQL `final` (None: null).

    before: for rows whose key or where may have changed in the step, the columns whose values before the step
    differ, as {name: SQL of the value before}; `shown_before` says (over those values) whether the row was shown
    then. A row shown before under another key, or not shown any more, has its old entry removed first."""
    every = frame.columns
    x = select_view(frame, view, pipeline, parts=("key", "where"), keep=every)
    x = x.selectExpr(
        *[quoted(c) for c in every], "_key AS _ka", f"_where AND coalesce((\n{shown}\n), false) AS _sa"
    )
    if before:
        x = _before(x, view, pipeline, before, shown_before)
    under = [c for c in x.columns if c.startswith("_")]
    y = select_view(x, view, pipeline, parts=("fields",), keep=under)
    body = _body(view, final)
    if not before:
        return y.where("_sa AND _ka IS NOT NULL").selectExpr("_ka AS key", "_id AS id", f"{body} AS body")
    gone = "_sb AND _kb IS NOT NULL AND (NOT _sa OR NOT (_kb <=> _ka))"
    pair = (
        f"array(named_struct('key', _kb, 'id', _id, 'body', CAST(NULL AS string), 'on', {gone}), "
        f"named_struct('key', _ka, 'id', _id, 'body', {body}, 'on', _sa AND _ka IS NOT NULL))"
    )
    return y.selectExpr(f"inline(filter({pair}, c -> c.on))").select("key", "id", "body")


def row_delta(rows: DataFrame, view: View, pipeline: Pipeline) -> DataFrame:
    """The changes (`ROW_CHANGES`) of row view `view` from a batch's row changes (`views.frame`: `_sign` -1 a row
    removed, 1 a row added): a removed row's entry is removed, an added row's set; where a row's identity is both
    removed and added under one key (a row that changed), the added entry wins."""
    gone = row_changes(rows.where("_sign < 0"), view, pipeline)
    new = row_changes(rows.where("_sign > 0"), view, pipeline)
    gone = gone.join(new.select("key", "id"), ["key", "id"], "left_anti")
    return gone.selectExpr("key", "id", "CAST(NULL AS string) AS body").unionByName(new)


class RowSink:
    """Applies a row view's changes (`ROW_CHANGES`) to generation `generation` of view `view` in the Redis at
    `url` (see the module docstring), each write fenced by `fence` (`views.fence`). A `views.sink.Sink`: idempotent per
    batch (absolute content); a `views.sink.CommandSink`."""

    def __init__(self, url: str, view: str, generation: int, fence: Fence = UNFENCED):
        self.url, self.view, self.generation, self.fence = url, view, generation, fence

    def commands(self, changes: DataFrame, batch_id: int) -> DataFrame:
        """The changes as Redis commands (`cmd`, `tag`: `views.wire.payload_rows`' input): one fenced call each
        (`views.fence`), HSET or HDEL (absolute content: the batch id is not needed to apply a batch once)."""
        key = view_key_column(self.view, self.generation, "key")
        hset = args(lit("HSET"), "k", "id", "body")
        hdel = args(lit("HDEL"), "k", "id")
        cmd = gated(self.fence, "k", ("body IS NOT NULL", hset), ("body IS NULL", hdel))
        return changes.select("id", "body", F.expr(key).alias("k"), "key").select(
            F.expr(cmd).alias("cmd"),
            F.expr(hash_tag_column("key")).alias("tag"),
        )

    def write(self, changes: DataFrame, batch_id: int) -> dict:
        """Apply `changes` from the executors (one Spark job). Returns {}: the job counts its rows itself."""
        rows = payload_rows(self.commands(changes, batch_id), cluster=is_cluster(self.url))
        forward(rows, self.url, what=f"{self.view} sink", scripts=(GATE_LUA,))
        return {}


def _rank(value):
    """A field value as a sort key: null smallest, NaN greatest among numbers, structures by their JSON text."""
    if value is None:
        return (0,)
    if isinstance(value, float) and math.isnan(value):
        return (2,)
    if isinstance(value, (dict, list)):
        return (1, json.dumps(value, sort_keys=True))
    return (1, value)


def _loads(raw):
    """JSON text as Spark writes it: standard, but a double NaN or infinity is written `NaN`, `Infinity`."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def pick_row(entries: dict, view: View) -> tuple[bool | None, dict] | None:
    """(final, line) of the greatest row among a key's hash `entries` ({identity: `[final, line]` JSON}), None when
    there is none."""
    best = None
    for ident, raw in entries.items():
        final, line = _loads(raw)
        rank = (tuple(_rank(line.get(n)) for n, _ in view.fields), ident)
        if best is None or rank > best[0]:
            best = (rank, final, line)
    return None if best is None else (best[1], best[2])


def query_row(client, view: View, key: str) -> dict:
    """The line of `key`'s greatest row, plus `final` (when not null) and `generation`; `{}` when it has none."""
    generation = current_generation(client, view.job)
    got = pick_row(client.hgetall(view_key(view.name, generation, key)), view)
    if got is None:
        return {}
    final, line = got
    return {**line, **({} if final is None else {"final": final}), "generation": generation}


def export_rows(client, view: View) -> Iterator[dict]:
    """Every key's line (its greatest row), ordered by key."""
    generation = current_generation(client, view.job)
    keys = sorted(client.scan_iter(match=view_pattern(view.name, generation), count=1000), key=key_id)
    for i in range(0, len(keys), _SCAN):
        pipe = client.pipeline(transaction=False)
        for k in keys[i : i + _SCAN]:
            pipe.hgetall(k)
        for entries in pipe.execute():
            got = pick_row(entries, view)
            if got is not None:
                yield got[1]


_ROW = "_row"


class RowTable(AggView):
    """The table log of row view `view` of `pipeline`, read as a table by another job (see the module docstring):
    its state under key `key` of lake `lake`; keyword arguments `AggView`'s (its Redis ones unused)."""

    def __init__(self, spark, lake: Lake, view: View, pipeline: Pipeline, key: str, **kw):
        struct = ", ".join(f"{lit(n)}, ({e})" for n, e in view.fields)
        greatest = f"max(named_struct({struct}, '_id', _id))"
        super().__init__(
            spark, lake, replace(view, kind="agg", values=((_ROW, greatest),)), pipeline, key, **kw
        )
        self.names = [n for n, _ in view.fields]

    def _line_sql(self) -> str:
        pairs = [f"{lit(self.view.key_name)}, _key", *[f"{lit(n)}, {_ROW}.{quoted(n)}" for n in self.names]]
        return f"to_json(named_struct({', '.join(pairs)}), map('ignoreNullFields', 'false'))"

    def publish(self, step: AggStep) -> dict:
        """Append the batch's changed keys' lines to the table log (nothing to Redis)."""
        self.table.write(step.lines, step.batch_id)
        return {}


def row_tables(spark, lake: Lake, pipeline: Pipeline, job: str, state_key: str, **kw) -> list[RowTable]:
    """A `RowTable` for each row view of `job` that another job reads as a table, its state under
    `<state_key>/views/<view>` of `lake` (keyword arguments `AggView`'s); none for an interval job."""
    if pipeline.jobs[job].kind == "interval":
        return []
    return [
        RowTable(spark, lake, v, pipeline, f"{state_key}/views/{v.name}", **kw)
        for v in pipeline.jobs[job].views
        if v.kind == "row" and v.table
    ]
