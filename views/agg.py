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
Either is bounded by the live rows (distinct values for `parts`), not by history. Files under
`<key>/<mode>/`: `b<N>/`, the state rows batch N changed (Parquet: a row's `_sid` is its identity, `_id` or the
key; `_gone` marks a removed row, `_was` the key a row had before N), and `s<N>/`, the whole state after batch N
(a compaction of the directories before it, every `snapshot_every` batch directories). A directory counts once its
`_SUCCESS` marker exists.

Per micro-batch N (`AggView.write(changes, N)`, or its steps `step`, `stage`, `publish`, `advance`): the state
before N is the memory's (after N-1) or read from the complete directories before N; the batch's changes give
`b<N>` and the state after N; the lines of the keys `b<N>` names (a row's key after and before N) are computed
from it and written. Within a batch an `_id` has at most one removal (the row as it was before the batch) and at
most one addition (the row after it). A batch Spark replays (after a crash, possibly after part of its Redis
writes) finds the state before N again and writes the same lines; when its first attempt's `b<N>` is complete,
that is the batch's effect and the replay's changes (a job may give fewer rows once its own state recorded N) are
not read again. A job calls `write` before it records its own state for N.

Read: `query_agg` gives the key's line plus `generation`, `{}` when the key is absent; `export_aggs` every present
key's line, by key. `check_agg` is the view's part of `views.frame.check_job`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, IntegralType, NumericType

from changelog.current import quoted
from changelog.storage import Lake, as_lake
from joins.state import complete_dirs, empty_frame
from spec.model import Pipeline, View
from spec.sql import Aggregate
from views.fence import GATE_LUA, GATE_SHA, UNFENCED, Fence
from views.frame import ExpressionError, _quiet, empty_rows, evaluate, select_view, view_path, view_rows
from views.keys import key_id, view_key, view_pattern
from views.redis_io import Forwarder, current_generation, is_cluster, pack, sink_client
from views.wire import args, forward, gated, hash_tag_column, lit, payload_rows, view_key_column

__all__ = ["AggView", "AggStep", "agg_views", "check_agg", "query_agg", "export_aggs"]

_LIVE = "_sign > 0 AND _where AND _key IS NOT NULL"
_DIR_ID = r"/[bs]([0-9]+)/[^/]*$"  # the id in a file's path .../b<id>/part-... or .../s<id>/part-...
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


def _inputs(frame: DataFrame, view: View, pipeline: Pipeline) -> DataFrame:
    """`frame` (row changes, `views.frame.view_rows`) as `_id`, `_sign` (those it has), `_key`, `_where` and each
    aggregate's input `_a<i>`; `ExpressionError` names an expression Spark cannot analyse."""
    sel = select_view(frame, view, pipeline, parts=("key", "where"), keep=frame.columns)
    texts = dict(view.values)
    exprs = [
        (f"_a{i}", a.expr, texts[n], view_path(view, "values", n))
        for i, (n, a) in enumerate(view.aggregates)
        if a.expr is not None
    ]
    keep = [c for c in ("_id", "_sign", "_key", "_where") if c in sel.columns]
    return evaluate(sel, exprs, pipeline, keep=keep)


def _values(spark, view: View, pipeline: Pipeline) -> tuple[_Value, ...]:
    frame = view_rows(empty_rows(spark, pipeline, view.job), pipeline, view.job)
    schema = _inputs(frame, view, pipeline).schema
    return tuple(
        _Value(n, a, i, None if a.expr is None else schema[f"_a{i}"].dataType)
        for i, (n, a) in enumerate(view.aggregates)
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


def _ddl(columns: list[tuple[str, DataType | str]]) -> str:
    return ", ".join(f"{quoted(n)} {t if isinstance(t, str) else t.simpleString()}" for n, t in columns)


@dataclass
class AggStep:
    """One micro-batch's work: `batch_id`, the state rows it changes (`log`, the rows of `b<N>`), whether they are
    staged already (`staged`: an earlier attempt of the batch wrote `b<N>` whole), the state after it (`state`) and
    its keys' lines (`lines`: `_key`, `line`, null for a key to delete)."""

    batch_id: int
    log: DataFrame
    staged: bool
    state: DataFrame
    lines: DataFrame


class AggView:
    """Agg view `view` of `pipeline`: its state under key `key` of lake `lake` (`append_only`: the job never removes
    a row, so the `parts` mode), its lines in generation `generation` of the Redis at `redis_url`, each write fenced
    by `fence` (see the module docstring). A `views.sink.Sink`: `write(changes, batch_id)`.

    `snapshot_every`: batch directories between two compactions; `driver_max`: a batch touching at most this many
    keys writes them from the driver (no Spark job to send them), more from the executors."""

    def __init__(
        self,
        spark,
        lake: Lake | str,
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
        self.snapshot_every, self.driver_max = snapshot_every, driver_max
        self.lake = as_lake(lake)
        self.root = f"{key.strip('/')}/{'parts' if append_only else 'rows'}".lstrip("/")
        self.values = _values(spark, view, pipeline)
        self.partitions = max(1, int(spark.conf.get("spark.sql.shuffle.partitions")))
        self._complete: set[str] = set()  # directories known to be complete (`joins.state.complete_dirs`)
        self.state: DataFrame | None = None
        self.batch: int | None = None  # the state in memory is the state after this batch
        payload = self._payload()
        self._state_cols = ["_sid", "_key", *[n for n, _ in payload]]
        self._state_ddl = _ddl([("_sid", "string"), ("_key", "string"), *payload])
        head = [("_sid", "string"), ("_gone", "boolean"), ("_was", "string"), ("_key", "string")]
        self._file_cols = [n for n, _ in head + payload]
        self._file_ddl = _ddl(head + payload)

    def _payload(self) -> list[tuple[str, DataType | str]]:
        """(name, type) of a state row's columns after `_sid` and `_key`."""
        if not self.append_only:
            return [(v.col, v.kind) for v in self.values if v.agg.expr is not None]
        return [("_n", "bigint"), *[(c, t) for v in self.values for c, t, _, _ in v.parts()]]

    # -- the state on the lake

    def _dirs(self, batch_id: int) -> tuple[list[str], list[str], str | None]:
        """(the newest complete snapshot before `batch_id`, as a list of at most one; the complete batch
        directories after it and before `batch_id`; `b<batch_id>` when it is complete, else None)."""
        snaps = complete_dirs(self.lake, self.root, "s", batch_id, self._complete)
        since = snaps[-1][0] if snaps else -1
        batches = complete_dirs(self.lake, self.root, "b", batch_id + 1, self._complete)
        staged = next((d for i, d in batches if i == batch_id), None)
        return [d for _, d in snaps[-1:]], [d for i, d in batches if since < i < batch_id], staged

    @staticmethod
    def _dir_id(key: str) -> int:
        return int(key.rpartition("/")[2][1:])

    def restore(self, batch_id: int) -> DataFrame:
        """The state before micro-batch `batch_id` (`_sid`, `_key` and the mode's columns): the memory's when no
        complete directory lies between it and `batch_id`, else read from the lake. Compacts the state into
        `s<batch_id - 1>` first when `snapshot_every` batch directories have accumulated."""
        return self._before(batch_id)[0]

    def _before(self, batch_id: int) -> tuple[DataFrame, str | None]:
        snap, batches, staged = self._dirs(batch_id)
        newer = [self._dir_id(d) for d in snap + batches]
        fresh = self.state is not None and self.batch is not None and self.batch < batch_id
        if not (fresh and all(i <= self.batch for i in newer)):
            self.state, self.batch = self._read(snap + batches), batch_id - 1
        if len(batches) >= self.snapshot_every:
            self._snapshot(batch_id - 1)
        return self.state, staged

    def _read(self, dirs: list[str]) -> DataFrame:
        """The state the log directories `dirs` give: per `_sid` its row of the newest directory, unless gone."""
        if not dirs:
            return empty_frame(self.spark, self._state_ddl)
        rows = self._files(dirs).withColumn(
            "_batch", F.regexp_extract(F.col("_metadata.file_path"), _DIR_ID, 1).cast("bigint")
        )
        others = [c for c in rows.columns if c not in ("_sid", "_batch")]
        newest = rows.groupBy("_sid").agg(F.max_by(F.struct(*others), "_batch").alias("_v"))
        live = newest.select("_sid", "_v.*").where("NOT _gone").select(*self._state_cols)
        return live.coalesce(self.partitions).localCheckpoint(eager=True)

    def _files(self, dirs: list[str]) -> DataFrame:
        return self.spark.read.schema(self._file_ddl).parquet(*[self.lake.uri(d) for d in dirs])

    def _write(self, name: str, rows: DataFrame) -> None:
        self._complete.discard(name)  # replaced: complete again only once this write has its marker
        rows.coalesce(1).write.mode("overwrite").parquet(self.lake.uri(self.root, name))

    def _snapshot(self, batch_id: int) -> None:
        rows = self.state.selectExpr(
            "_sid", "false AS _gone", "CAST(NULL AS string) AS _was", *self._state_cols[1:]
        )
        self._write(f"s{batch_id}", rows.select(*self._file_cols))
        old = complete_dirs(self.lake, self.root, "b", batch_id + 1, self._complete)
        old += complete_dirs(self.lake, self.root, "s", batch_id, self._complete)
        for _, d in old:
            self.lake.delete_tree(d)
            self._complete.discard(d.rpartition("/")[2])

    # -- a micro-batch

    def _changed_rows(self, state: DataFrame, changes: DataFrame) -> DataFrame:
        """`rows` mode: the batch's state rows (`b<N>`): each added row under its `_id` (`_was`: its key before,
        if it was live), and each live row the batch removes and does not add again (`_gone`)."""
        ev = _inputs(changes, self.view, self.pipeline)
        payload = self._state_cols[2:]
        ids = ev.select(F.col("_id").alias("_sid")).distinct()
        added = (
            ev.where(_LIVE)
            .dropDuplicates(["_id"])
            .select(F.col("_id").alias("_sid"), "_key", *payload, F.lit(True).alias("_new"))
        )
        gone = state.join(F.broadcast(ids), "_sid", "left_semi").select("_sid", F.col("_key").alias("_was"))
        return added.join(gone, "_sid", "full_outer").select(
            "_sid", F.col("_new").isNull().alias("_gone"), "_was", "_key", *payload
        )

    def _merged_parts(self, state: DataFrame, changes: DataFrame) -> DataFrame:
        """`parts` mode: the batch's state rows (`b<N>`): the parts of each key the batch adds rows to, its parts
        before merged with the rows'."""
        parts = [p for v in self.values for p in v.parts()]
        ev = _inputs(changes, self.view, self.pipeline).where(_LIVE)
        rows = ev.selectExpr("_key", "CAST(1 AS bigint) AS _n", *[f"{sql} AS {c}" for c, _, sql, _ in parts])
        keys = rows.select("_key").distinct()
        old = state.join(F.broadcast(keys), "_key", "left_semi").select("_key", "_n", *[p[0] for p in parts])
        merged = (
            old.unionByName(rows)
            .groupBy("_key")
            .agg(F.expr("sum(_n)").alias("_n"), *[F.expr(m).alias(c) for c, _, _, m in parts])
        )
        payload = self._state_cols[2:]
        return merged.selectExpr(
            "_key AS _sid", "false AS _gone", "CAST(NULL AS string) AS _was", "_key", *payload
        )

    def _line_sql(self) -> str:
        pairs = [f"{lit(self.view.key_name)}, _key"] + [
            f"{lit(v.name)}, {quoted(v.name)}" for v in self.values
        ]
        return f"to_json(named_struct({', '.join(pairs)}), map('ignoreNullFields', 'false'))"

    def _lines(self, state: DataFrame, touched: DataFrame) -> DataFrame:
        """`_key`, `line` of each key of `touched` over `state` (the state after the batch); `line` null for a key
        with no live row."""
        live = state.join(F.broadcast(touched), "_key", "left_semi")
        if self.append_only:
            per_key = live.selectExpr(
                "_key", "true AS _live", *[f"{v.over_parts()} AS {quoted(v.name)}" for v in self.values]
            )
        else:
            per_key = live.groupBy("_key").agg(
                F.lit(True).alias("_live"), *[F.expr(v.over_rows()).alias(v.name) for v in self.values]
            )
        return touched.join(per_key, "_key", "left").selectExpr(
            "_key", f"CASE WHEN _live THEN {self._line_sql()} END AS line"
        )

    def step(self, changes: DataFrame, batch_id: int) -> AggStep:
        """Batch `batch_id`'s state rows, the state after it and its keys' lines (`AggStep`), from `changes` (the
        batch's row changes, `views.frame.view_rows`) and the state before it (`restore`); when an earlier attempt
        of the batch staged `b<batch_id>` whole, from that instead (see the module docstring). Materializes both (in
        memory); the lines are computed when `publish` reads them."""
        state, staged = self._before(batch_id)
        if staged is not None:
            log = self._files([staged]).localCheckpoint(eager=True)
        elif self.append_only:
            log = self._merged_parts(state, changes).localCheckpoint(eager=True)
        else:
            log = self._changed_rows(state, changes).localCheckpoint(eager=True)
        kept = state.join(F.broadcast(log.select("_sid")), "_sid", "left_anti")
        after = kept.unionByName(log.where("NOT _gone").select(*self._state_cols))
        after = after.coalesce(self.partitions).localCheckpoint(eager=True)
        touched = (
            log.where("NOT _gone")
            .select("_key")
            .union(log.select(F.col("_was").alias("_key")))
            .where("_key IS NOT NULL")
            .distinct()
        )
        return AggStep(batch_id, log, staged is not None, after, self._lines(after, touched))

    def stage(self, step: AggStep) -> None:
        """Make the batch's state rows durable (`b<N>`, replacing a partial write of it; nothing when an earlier
        attempt staged it whole). Invisible to `restore(M)` for M <= N."""
        if not step.staged:
            self._write(f"b{step.batch_id}", step.log)

    def publish(self, step: AggStep) -> int | None:
        """Write the lines of the batch's keys to Redis (SET or DEL, each one fenced call): from the driver when
        at most `driver_max` keys (returns their number), else from the executors (returns None)."""
        if self.driver_max > 0:
            rows = step.lines.coalesce(1).limit(self.driver_max + 1).collect()  # one Spark job
            if len(rows) <= self.driver_max:
                return self._send(rows)
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
        return None

    def _send(self, rows) -> int:
        with Forwarder(sink_client(self.url), what=f"{self.view.name} sink", scripts=(GATE_LUA,)) as out:
            for key, line in rows:
                k = view_key(self.view.name, self.generation, key)
                cmd = ("SET", k, line) if line is not None else ("DEL", k)
                out.add(
                    pack("EVALSHA", GATE_SHA, 2, self.fence.key, k, self.fence.epoch, len(cmd), *cmd), 1, k
                )
        return len(rows)

    def advance(self, step: AggStep) -> None:
        """The state after the batch is current (once `stage` and `publish` returned)."""
        self.state, self.batch = step.state, step.batch_id

    def write(self, changes: DataFrame, batch_id: int) -> dict:
        """Apply batch `batch_id`'s row changes: `step`, then `stage` beside `publish`, then `advance`. Returns
        `{"keys": n}`, the keys written (None when sent from the executors)."""
        step = self.step(changes, batch_id)
        with ThreadPoolExecutor(max_workers=1) as pool:
            staged = pool.submit(self.stage, step)
            n = self.publish(step)
            staged.result()
        self.advance(step)
        return {"keys": n}


def agg_views(
    spark,
    lake: Lake | str,
    pipeline: Pipeline,
    job: str,
    state_key: str,
    *,
    append_only: bool,
    redis_url: str,
    generation: int,
    fence: Fence = UNFENCED,
) -> list[AggView]:
    """An `AggView` for each agg view of `job`, its state under `<state_key>/views/<view>` of `lake`."""
    return [
        AggView(
            spark,
            lake,
            v,
            pipeline,
            f"{state_key}/views/{v.name}",
            append_only=append_only,
            redis_url=redis_url,
            generation=generation,
            fence=fence,
        )
        for v in pipeline.jobs[job].views
        if v.kind == "agg"
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
