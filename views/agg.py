"""The `agg` view kind: per key, each of the view's aggregates over the view's live rows.

What a key holds: the live rows of the job (`views.frame`'s row changes: a row is live from the change that adds it
to the one that removes it) that satisfy the view's `where` and have a non-null key, grouped by the key (its text).
Each value is its aggregate over them: `count(*)` the rows, `count(EXPR)` the rows where EXPR is not null,
`count(distinct EXPR)` the distinct non-null values, `sum`, `min`, `max` and `avg` (a double) over the non-null
values, null when there is none. A key with no live row is absent. Removals are exact: a `max` whose row left
gives the next greatest; a distinct value counts while a row holds it.

Types of the export line: a count is a long; a sum of an integral or boolean expression (true counts 1) a long, of
any other number a double; an avg a double; a min or max keeps the expression's type (a timestamp field is epoch ms).

Redis (generation `g` of the view's job): string `mv:<view>:<g>:{<key>}` holding the key's export line
`{"<key name>": key, <value name>: value, ...}` (values in declared order, nulls kept). A batch sets the whole
line of every key it touches (SET), or deletes the key (DEL) when it has no live row left; each write is one
fenced call (`views.fence.GATE_LUA`), refused whole when the writer's lease epoch is below the job's fence.

State (the job's own, on the lake, never in Redis), under the key the job gives, in one of two modes:
- `rows` (`append_only=False`: a join, a select of a table): each live row's key and aggregate inputs by `_id`;
  a batch's keys are recomputed from their rows (so a removal is exact);
- `parts` (`append_only=True`: rows are never removed, as a select of an event topic, interval, asof): per key
  only what its aggregates need: the row count, each value's non-null count, sum, min or max, and the distinct
  values of a `count(distinct ...)`; a batch merges its rows' parts into its keys' parts. Removals are ignored.
Either is bounded by the live rows (distinct values for `parts`), not by history. Under `<key>/<mode>/`, as
`views.state` keeps a view's state: a state row's `_sid` is its identity (the row's `_id`, or the key).

Per micro-batch N (`AggView.write(changes, N)`, or its steps `step`, `stage`, `publish`, `advance`: the protocol
and crash-replay rules of `views.state`): the batch's changes and the state before N give `b<N>` and the state after
N; the lines of the keys `b<N>` names (a row's key after and before N) are computed from it and written. Within a
batch an `_id` has at most one removal (the row as it was before the batch) and at most one addition (the row after
it). A batch replayed after a crash writes the same lines.

Read: `query_agg` gives the key's line plus `generation`, `{}` when the key is absent; `export_aggs` every present
key's line, by key. `check_agg` is the view's part of `views.frame.check_job`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, IntegralType, NumericType

from changelog.current import quoted
from changelog.storage import Lake
from spec.model import Pipeline, View
from spec.problems import Expr, expr_text
from spec.sql import Aggregate, parse_aggregate
from spec.viewfile import ViewCheck, ViewFile, WindowedKeys
from spec.viewtable import agg_type, entry_fields
from views import window
from views.errors import ViewError
from views.fence import GATE_LUA, GATE_SHA, UNFENCED, Fence
from views.frame import ExpressionError, _quiet, empty_rows, evaluate, select_view, view_path, view_rows
from views.keys import key_id, view_key, view_pattern
from views.redis_io import Forwarder, current_generation, is_cluster, pack, sink_client
from views.state import LakeState, StateStep, StateView, changed_rows, touched
from views.table import ViewTable, reading_topic
from views.wire import args, forward, gated, hash_tag_column, lit, payload_rows, view_key_column

__all__ = ["FILE", "AggView", "AggStep", "agg_views", "kept_as_agg", "check_agg", "query_agg", "export_aggs"]


class AggKeys(WindowedKeys):
    """An agg view in the file: `agg: {<key name>: <expression>}` and its aggregates, `values` (`spec.sql`)."""

    agg: dict[str, Expr]
    values: dict[str, Expr] = {}


def _read(keys: AggKeys, check: ViewCheck) -> dict:
    if not keys.values:
        check.add(("values",), 'an agg view needs `values`: its aggregates, e.g. `{rides: "count(*)"}`')
    values = []
    for name, value in keys.values.items():
        name, text = str(name), expr_text(value)
        check.name(name, ("values", name))
        try:
            aggregate = parse_aggregate(text)
        except ValueError as why:
            check.add(("values", name), str(why))
            continue
        if aggregate.expr is not None:
            check.expr(aggregate.expr, ("values", name))
        values.append((name, text))
    return {"key": check.one_key(keys.agg, "agg"), "values": tuple(values)}


def _topic(view: View, seen) -> list:
    return entry_fields(view, [(n, agg_type(e, seen)) for n, e in view.values])


FILE = ViewFile("agg", AggKeys, _read, topic=_topic)


_LIVE = "_sign > 0 AND _where AND _key IS NOT NULL"
_SCAN = 500  # keys per pipelined round trip of an export


@dataclass(frozen=True)
class _Value:
    """One aggregate of the view: its `name`, `agg`, index `i` (its input column is `_a<i>`, none for `count(*)`)
    and the input's type `kind` (None for `count(*)`)."""

    name: str
    agg: Aggregate
    i: int
    kind: DataType | None

    @property
    def col(self) -> str:
        return f"_a{self.i}"

    @property
    def total(self) -> str:
        """The SQL type of its sum: bigint for an integral or boolean input, else double."""
        return "bigint" if isinstance(self.kind, (IntegralType, BooleanType)) else "double"

    def over_rows(self) -> str:
        """SQL of the aggregate over a key's live rows (`rows` mode)."""
        f, a = self.agg.func, self.col
        if self.agg.expr is None:
            return "count(1)"
        if f == "count":
            return f"count(DISTINCT {a})" if self.agg.distinct else f"count({a})"
        if f in ("min", "max"):
            return f"{f}({a})"
        return f"sum(CAST({a} AS {self.total}))" if f == "sum" else f"avg(CAST({a} AS double))"

    def parts(self) -> list[tuple[str, str, str, str]]:
        """(column, SQL type, SQL of one row's part, SQL merging parts) of its `parts`-mode state (`count(*)`:
        none, the rows' count `_n` is every key's)."""
        f, a, i = self.agg.func, self.col, self.i
        if self.agg.expr is None:
            return []
        kind = self.kind.simpleString()
        if f == "count" and self.agg.distinct:
            merge = f"array_distinct(flatten(collect_list(_d{i})))"
            return [(f"_d{i}", f"array<{kind}>", f"filter(array({a}), x -> x IS NOT NULL)", merge)]
        count = (f"_c{i}", "bigint", f"CAST({a} IS NOT NULL AS bigint)", f"sum(_c{i})")
        if f == "count":
            return [count]
        if f in ("min", "max"):
            return [(f"_m{i}", kind, a, f"{f}(_m{i})")]
        t = self.total if f == "sum" else "double"
        return [(f"_s{i}", t, f"CAST({a} AS {t})", f"sum(_s{i})"), *([count] if f == "avg" else [])]

    def over_parts(self) -> str:
        """SQL of the aggregate over a key's merged parts (`parts` mode)."""
        f, i = self.agg.func, self.i
        if self.agg.expr is None:
            return "_n"
        if f == "count":
            return f"CAST(size(_d{i}) AS bigint)" if self.agg.distinct else f"_c{i}"
        if f in ("min", "max"):
            return f"_m{i}"
        return f"_s{i}" if f == "sum" else f"CASE WHEN _c{i} > 0 THEN _s{i} / _c{i} END"


def _aggregates(view: View) -> tuple[tuple[str, Aggregate], ...]:
    """(name, aggregate) of the view's values: an agg view's as written; a (windowed) count view's each the `sum`
    of its expression (a null adding nothing)."""
    if view.kind == "count":
        return tuple((n, Aggregate("sum", e)) for n, e in view.values)
    return view.aggregates


def _inputs(frame: DataFrame, view: View, pipeline: Pipeline) -> DataFrame:
    """`frame` (row changes, `views.frame.view_rows`) as `_id`, `_sign`, `_time`, `_late` (those it has), `_key`,
    `_where` and each aggregate's input `_a<i>`; `ExpressionError` names an expression Spark cannot analyse."""
    sel = select_view(frame, view, pipeline, parts=("key", "where"), keep=frame.columns)
    texts = dict(view.values)
    exprs = [
        (f"_a{i}", a.expr, texts[n], view_path(view, "values", n))
        for i, (n, a) in enumerate(_aggregates(view))
        if a.expr is not None
    ]
    keep = [c for c in ("_id", "_sign", "_time", "_late", "_key", "_where") if c in sel.columns]
    return evaluate(sel, exprs, pipeline, keep=keep)


def _values(spark, view: View, pipeline: Pipeline) -> tuple[_Value, ...]:
    frame = view_rows(empty_rows(spark, pipeline, view.job), pipeline, view.job)
    schema = _inputs(frame, view, pipeline).schema
    return tuple(
        _Value(n, a, i, None if a.expr is None else schema[f"_a{i}"].dataType)
        for i, (n, a) in enumerate(_aggregates(view))
    )


def _nested(frame: DataFrame, expr: str) -> bool:
    """Whether the expression `expr` (that Spark analyses over `frame`) cannot be an aggregate's input: it holds
    an aggregate or a window function itself."""
    from pyspark.errors import AnalysisException

    with _quiet():
        try:
            frame.groupBy("_id").agg(F.expr(f"count((\n{expr}\n))"))
        except AnalysisException:
            return True
    return False


def check_agg(frame: DataFrame, view: View, pipeline: Pipeline) -> None:
    """Analyse agg view `view` over `frame` (a job's empty rows, `views.frame.view_rows`): its key, where and each
    aggregate's expression. Raises `ExpressionError` (at `jobs.<job>.views.<view>.values.<name>` for a value) for
    an expression Spark cannot analyse, one that holds an aggregate or a window function itself (`max(sum(x))`),
    and a `sum` or `avg` of something that is not a number or a boolean. Runs no Spark job."""
    texts = dict(view.values)
    for n, a in view.aggregates:
        path = view_path(view, "values", n)
        if a.expr is None:
            continue
        evaluate(frame, [("_x", a.expr, texts[n], path)], pipeline)
        if _nested(frame, a.expr):
            why = (
                "an aggregate's expression is over one row: it may not hold an aggregate or a window function"
            )
            raise ExpressionError(pipeline.where(*path), texts[n], why)
    schema = _inputs(frame, view, pipeline).schema
    for i, (n, a) in enumerate(view.aggregates):
        kind = schema[f"_a{i}"].dataType if a.expr is not None else None
        if a.func in ("sum", "avg") and not isinstance(kind, (NumericType, BooleanType)):
            why = f"{a.func} is of numbers (or booleans, true counted as 1), not of a {kind.simpleString()}"
            raise ExpressionError(pipeline.where(*view_path(view, "values", n)), texts[n], why)


@dataclass
class AggStep(StateStep):
    """One micro-batch's work (`views.state.StateStep`) and its keys' lines (`lines`: `_key`, `line`, null for a key
    to delete)."""

    lines: DataFrame | None = None


class AggView(StateView):
    """Agg view `view` of `pipeline`: its state under key `key` of lake `lake` (`append_only`: the job never removes
    a row, so the `parts` mode), its lines in generation `generation` of the Redis at `redis_url`, each write fenced
    by `fence` (see the module docstring). A `views.sink.Sink`: `write(changes, batch_id)`.

    `snapshot_every`: batch directories between two compactions; `driver_max`: a batch touching at most this many
    keys writes them from the driver (no Spark job to send them), more from the executors."""

    def __init__(
        self,
        spark,
        lake: Lake,
        view: View,
        pipeline: Pipeline,
        key: str,
        *,
        append_only: bool,
        redis_url: str,
        generation: int,
        fence: Fence = UNFENCED,
        snapshot_every: int = 100,
        driver_max: int = 1000,
    ):
        self.spark, self.view, self.pipeline, self.append_only = spark, view, pipeline, append_only
        self.url, self.generation, self.fence = redis_url, generation, fence
        self.driver_max = driver_max
        self.window = view.window
        if self.window is not None and not append_only:
            raise ViewError(f"view {view.name!r}: a window is of a job whose rows are never removed")
        self.values = _values(spark, view, pipeline)
        mode = "windows" if self.window is not None else "parts" if append_only else "rows"
        root = f"{key.strip('/')}/{mode}".lstrip("/")
        self.store = LakeState(spark, lake, root, self._payload(), snapshot_every=snapshot_every)
        # another job reads the view as a table: its log (`views.table`)
        topic = reading_topic(pipeline, view)
        self.table = ViewTable(spark, lake, view, topic, view.job, generation) if topic is not None else None

    def _payload(self) -> list[tuple[str, DataType | str]]:
        """(name, type) of a state row's columns after `_sid` and `_key`."""
        if not self.append_only:
            return [(v.col, v.kind) for v in self.values if v.agg.expr is not None]
        parts = [("_n", "bigint"), *[(c, t) for v in self.values for c, t, _, _ in v.parts()]]
        return [*window.COLUMNS, *parts] if self.window is not None else parts

    # -- a micro-batch

    def _merged_parts(self, state: DataFrame, changes: DataFrame) -> DataFrame:
        """`parts` mode: the batch's state rows (`b<N>`): the parts of each key the batch adds rows to, its parts
        before merged with the rows'. Windowed: of each window the batch adds rows to (`views.window`)."""
        parts = [p for v in self.values for p in v.parts()]
        merges = [("_n", "sum(_n)"), *[(c, m) for c, _, _, m in parts]]
        ev = _inputs(changes, self.view, self.pipeline).where(_LIVE)
        cols = ["CAST(1 AS bigint) AS _n", *[f"{sql} AS {c}" for c, _, sql, _ in parts]]
        if self.window is not None:
            return self._merged_windows(state, window.not_late(ev), cols, merges)
        rows = ev.selectExpr("_key", *cols)
        keys = rows.select("_key").distinct()
        old = state.join(F.broadcast(keys), "_key", "left_semi").select("_key", "_n", *[p[0] for p in parts])
        merged = old.unionByName(rows).groupBy("_key").agg(*[F.expr(m).alias(c) for c, m in merges])
        payload = self.store.cols[2:]
        return merged.selectExpr(
            "_key AS _sid", "false AS _gone", "CAST(NULL AS string) AS _was", "_key", *payload
        )

    def _merged_windows(self, state: DataFrame, ev: DataFrame, cols: list[str], merges) -> DataFrame:
        """Windowed `parts` mode: each window the rows `ev` (not late) fall in, its parts before merged with theirs;
        sessions merged where they overlap, a session merged into another leaving (`_gone`)."""
        spans = window.in_windows(ev, self.window).selectExpr("_k0", "_ws", "_we", "_key", *cols)
        names = [c for c, _ in merges]
        head = "_sid", "false AS _gone", "CAST(NULL AS string) AS _was", "_key"
        payload = self.store.cols[2:]
        if self.window.kind != "session":
            keys = spans.select("_key").distinct()
            old = state.join(F.broadcast(keys), "_key", "left_semi").select(
                "_k0", "_ws", "_we", "_key", *names
            )
            merged = (
                old.unionByName(spans)
                .groupBy("_key")
                .agg(
                    F.first("_k0").alias("_k0"),
                    F.first("_ws").alias("_ws"),
                    F.first("_we").alias("_we"),
                    *[F.expr(m).alias(c) for c, m in merges],
                )  # fmt: skip
            )
            return merged.selectExpr(
                "_key AS _sid", "false AS _fin", *head[1:], *[c for c in payload if c != "_fin"]
            )
        k0s = spans.select("_k0").distinct()
        old = state.where("NOT _fin").join(F.broadcast(k0s), "_k0", "left_semi")
        merged = window.merge_sessions(
            old.select("_k0", "_ws", "_we", *names).unionByName(spans.drop("_key")), merges
        )
        kept = merged.selectExpr(
            "_key AS _sid", "false AS _fin", *head[1:], *[c for c in payload if c != "_fin"]
        )
        gone = old.join(merged.select("_key"), "_key", "left_anti").selectExpr(
            "_sid", "true AS _gone", "_key AS _was", "CAST(NULL AS string) AS _key", *payload
        )
        return kept.unionByName(gone)

    def _line_sql(self) -> str:
        key = "_k0" if self.window is not None else "_key"
        pairs = [f"{lit(self.view.key_name)}, {key}"] + [
            f"{lit(v.name)}, {quoted(v.name)}" for v in self.values
        ]
        if self.window is not None:
            pairs += ["'window_start', _ws", "'window_end', _we", "'final', _fin"]
        return f"to_json(named_struct({', '.join(pairs)}), map('ignoreNullFields', 'false'))"

    def _present(self) -> str:
        """SQL: whether a key with rows has a line (a count view's key whose sums are all 0 has none)."""
        if self.view.kind != "count":
            return "_live"
        return "_live AND (" + " OR ".join(f"{quoted(v.name)} <> 0" for v in self.values) + ")"

    def _over_parts(self, v: _Value) -> str:
        """A value over a key's parts; a count view's sum of no non-null value is 0, not null."""
        if self.view.kind == "count":
            return f"coalesce({v.over_parts()}, CAST(0 AS {v.total}))"
        return v.over_parts()

    def _lines(self, state: DataFrame, touched: DataFrame) -> DataFrame:
        """`_key`, `line` of each key of `touched` over `state` (the state after the batch); `line` null for a key
        with no live row."""
        live = state.join(F.broadcast(touched), "_key", "left_semi")
        if self.append_only:
            extra = [c for c, _ in window.COLUMNS] if self.window is not None else []
            per_key = live.selectExpr(
                "_key",
                "true AS _live",
                *extra,
                *[f"{self._over_parts(v)} AS {quoted(v.name)}" for v in self.values],
            )
        else:
            per_key = live.groupBy("_key").agg(
                F.lit(True).alias("_live"), *[F.expr(v.over_rows()).alias(v.name) for v in self.values]
            )
        return touched.join(per_key, "_key", "left").selectExpr(
            "_key", f"CASE WHEN {self._present()} THEN {self._line_sql()} END AS line"
        )

    def _logged_lines(self, log: DataFrame) -> DataFrame:
        """`_key`, `line` of each key of the batch's state rows `log` (`parts` and `windows` modes: a row is its
        key's whole state after the batch, or the key left, `_gone`: its `_was` has no line)."""
        extra = [c for c, _ in window.COLUMNS] if self.window is not None else []
        per_key = log.where("NOT _gone").selectExpr(
            "_key",
            "true AS _live",
            *extra,
            *[f"{self._over_parts(v)} AS {quoted(v.name)}" for v in self.values],
        )
        lines = per_key.selectExpr("_key", f"CASE WHEN {self._present()} THEN {self._line_sql()} END AS line")
        return lines.unionByName(
            log.where("_gone").selectExpr("_was AS _key", "CAST(NULL AS string) AS line")
        )

    def step(self, changes: DataFrame, batch_id: int, *, watermark: int | None = None) -> AggStep:
        """Batch `batch_id`'s state rows, the state after it and its keys' lines (`AggStep`), from `changes` (the
        batch's row changes, `views.frame.view_rows`) and the state before it (`restore`); when an earlier attempt
        of the batch staged `b<batch_id>` whole, from that instead (see the module docstring). A windowed view's
        windows become final or leave under `watermark`, the job's after the batch (`views.window.settle`).
        Materializes both (in memory); the lines are computed when `publish` reads them."""
        state, log = self.store.before(batch_id)
        staged = log is not None
        if not staged:
            if self.append_only:
                log = self._merged_parts(state, changes)
            else:
                ev = _inputs(changes, self.view, self.pipeline)
                log = changed_rows(state, ev, _LIVE, self.store.cols[2:])
            if self.window is not None:
                log = window.settle(state, log, watermark, self.view.retain_ms)
            log = log.localCheckpoint(eager=True)
        if self.append_only:  # a state row of the batch is its key's (window's) whole state after it
            return AggStep(batch_id, log, staged, state, None, self._logged_lines(log))
        after = self.store.after(state, log)
        return AggStep(batch_id, log, staged, state, after, self._lines(after, touched(log)))

    def publish(self, step: AggStep) -> dict:
        """Write the lines of the batch's keys to the view's table log when another job reads it (`views.table`),
        then to Redis (SET or DEL, each one fenced call): from the driver when at most `driver_max` keys, else from
        the executors. Returns `{"keys": n}`, the keys written (None when sent from the executors)."""
        if self.table is not None:
            self.table.write(step.lines, step.batch_id)
        if self.driver_max > 0:
            rows = step.lines.coalesce(1).limit(self.driver_max + 1).collect()  # one Spark job
            if len(rows) <= self.driver_max:
                return {"keys": self._send(rows)}
        key = view_key_column(self.view.name, self.generation, "_key")
        cmd = gated(
            self.fence,
            "k",
            ("line IS NOT NULL", args(lit("SET"), "k", "line")),
            ("line IS NULL", args(lit("DEL"), "k")),
        )
        cmds = step.lines.select("_key", "line", F.expr(key).alias("k")).select(
            F.expr(cmd).alias("cmd"), F.expr(hash_tag_column("_key")).alias("tag")
        )
        rows = payload_rows(cmds, cluster=is_cluster(self.url))
        forward(rows, self.url, what=f"{self.view.name} sink", scripts=(GATE_LUA,))
        return {"keys": None}

    def _send(self, rows) -> int:
        with Forwarder(sink_client(self.url), what=f"{self.view.name} sink", scripts=(GATE_LUA,)) as out:
            for key, line in rows:
                k = view_key(self.view.name, self.generation, key)
                cmd = ("SET", k, line) if line is not None else ("DEL", k)
                out.add(
                    pack("EVALSHA", GATE_SHA, 2, self.fence.key, k, self.fence.epoch, len(cmd), *cmd), 1, k
                )
        return len(rows)


def kept_as_agg(view: View) -> bool:
    """Whether this module keeps `view`: an agg view, or a count view with a window or read as a table by another
    job (`View.table`), kept as an agg view of sums with its state on the lake, written and read as one."""
    return view.kind == "agg" or (view.kind == "count" and (view.window is not None or view.table))


def agg_views(spark, lake: Lake, pipeline: Pipeline, job: str, state_key: str, **kw) -> list[AggView]:
    """An `AggView` for each view of `job` this module keeps (`kept_as_agg`), its state under
    `<state_key>/views/<view>` of `lake` (keyword arguments `append_only`, `redis_url`, `generation`, `fence`:
    `AggView`'s)."""
    views = pipeline.jobs[job].views
    return [
        AggView(spark, lake, v, pipeline, f"{state_key}/views/{v.name}", **kw)
        for v in views
        if kept_as_agg(v)
    ]


def _loads(raw):
    """JSON text as Spark writes it: standard, but a double NaN or infinity is written `NaN`, `Infinity`."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def query_agg(client, view: View, key: str) -> dict:
    """`{"<key name>": key, <value>: v, ..., "generation": g}`; `{}` when the key is absent (no live row)."""
    generation = current_generation(client, view.job)
    raw = client.get(view_key(view.name, generation, key))
    return {} if raw is None else {**_loads(raw), "generation": generation}


def export_aggs(client, view: View) -> Iterator[dict]:
    """Every present key's line, ordered by key."""
    generation = current_generation(client, view.job)
    keys = sorted(client.scan_iter(match=view_pattern(view.name, generation), count=1000), key=key_id)
    for i in range(0, len(keys), _SCAN):
        pipe = client.pipeline(transaction=False)
        for k in keys[i : i + _SCAN]:
            pipe.get(k)
        for raw in pipe.execute():
            if raw is not None:
                yield _loads(raw)
