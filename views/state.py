"""A view's own state on the lake, kept from a job's row changes, and the protocol of one micro-batch: what the views
that keep state share (`views.agg`, and `views.list.rows`, the `list` kind of the jobs that give row changes).

State: rows, each with an identity `_sid` (unique in the state), a key `_key` and the view's payload columns, under
the view's root key of the lake:
- `b<N>/`: the state rows batch N changed (Parquet): `_sid`; `_gone` (the row left the state); `_was` (the key the
  row had before N, when it was in the state; null otherwise); `_key` (null for a row that left); the payload;
- `s<N>/`: the whole state after batch N, a compaction of the directories before it, made once `snapshot_every`
  batch directories have accumulated (the older directories are then deleted).
A directory counts once its `_SUCCESS` marker exists. The state before batch N: per `_sid`, its row in the newest
complete directory before N (the newest snapshot and the batch directories after it), unless gone.

Per micro-batch N (`StateView.write(changes, N)`, or its steps):
1. `step` (the view's own): the state before N (`LakeState.before`: the memory's, after N-1, or read from the lake)
   and the batch's changes give the batch's state rows (`b<N>`), the state after N and the view's Redis writes;
   when an earlier attempt of N staged `b<N>` whole, its rows are the batch's and the changes are not read again
   (a job may give fewer rows once its own state recorded N);
2. `stage` (`b<N>` made durable, replacing a partial write of it) beside `publish` (the Redis writes: each key
   written whole, so absolute);
3. `advance`: the state after N is the memory's (made in step 1 when the Redis writes are computed from it, else by
   `finish` beside step 2).
A batch Spark replays after a crash (possibly after part of its Redis writes) finds the same state before N and the
same `b<N>` rows, so it writes what the first attempt wrote: the effect of one. A job calls `write` before it
records its own state for N. The keys a batch touches are those its state rows name (a row's key after and before N,
`touched`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from changelog.current import quoted
from changelog.storage import Lake
from joins.state import complete_dirs, empty_frame

__all__ = ["LakeState", "StateStep", "StateView", "changed_rows", "touched", "fresh", "ddl", "views_of"]

_DIR_ID = r"/[bs]([0-9]+)/[^/]*$"  # the id in a file's path .../b<id>/part-... or .../s<id>/part-...
_HEAD = [("_sid", "string"), ("_gone", "boolean"), ("_was", "string"), ("_key", "string")]


def ddl(columns: list[tuple[str, DataType | str]]) -> str:
    """DDL text of (name, type) pairs, a type given as a `DataType` or as SQL text."""
    return ", ".join(f"{quoted(n)} {t if isinstance(t, str) else t.simpleString()}" for n, t in columns)


@dataclass
class StateStep:
    """One micro-batch's state work: `batch_id`, the state rows it changes (`log`, the rows of `b<N>`), whether they
    are staged already (`staged`: an earlier attempt of the batch wrote `b<N>` whole), the state before it
    (`before`) and after it (`state`: made by `step` when the view's Redis writes are computed from it, else by
    `StateView.finish`, beside them)."""

    batch_id: int
    log: DataFrame
    staged: bool
    before: DataFrame
    state: DataFrame | None = None


class LakeState:
    """The state of one view under key `root` of `lake` (see the module docstring): rows of `_sid`, `_key` and the
    `payload` columns ((name, type) pairs). `snapshot_every`: batch directories between two compactions."""

    def __init__(self, spark, lake: Lake, root: str, payload: list, *, snapshot_every: int = 100):
        self.spark, self.lake, self.root = spark, lake, root.strip("/")
        self.snapshot_every = snapshot_every
        self.partitions = max(1, int(spark.conf.get("spark.sql.shuffle.partitions")))
        self._complete: set[str] = set()  # directories known to be complete (`joins.state.complete_dirs`)
        self.state: DataFrame | None = None
        self.batch: int | None = None  # the state in memory is the state after this batch
        self.cols = ["_sid", "_key", *[n for n, _ in payload]]
        self.ddl = ddl([("_sid", "string"), ("_key", "string"), *payload])
        self.file_cols = [n for n, _ in _HEAD + payload]
        self.file_ddl = ddl(_HEAD + payload)

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

    def before(self, batch_id: int) -> tuple[DataFrame, DataFrame | None]:
        """(the state before micro-batch `batch_id`, the rows of `b<batch_id>` when an earlier attempt staged it
        whole, else None). The state is the memory's when no complete directory lies between it and `batch_id`,
        else read from the lake; compacted into `s<batch_id - 1>` first when `snapshot_every` batch directories
        have accumulated."""
        snap, batches, staged = self._dirs(batch_id)
        newer = [self._dir_id(d) for d in snap + batches]
        fresh = self.state is not None and self.batch is not None and self.batch < batch_id
        if not (fresh and all(i <= self.batch for i in newer)):
            self.state, self.batch = self._read(snap + batches), batch_id - 1
        if len(batches) >= self.snapshot_every:
            self._snapshot(batch_id - 1)
        log = None if staged is None else self._files([staged]).localCheckpoint(eager=True)
        return self.state, log

    def _read(self, dirs: list[str]) -> DataFrame:
        """The state the log directories `dirs` give: per `_sid` its row of the newest directory, unless gone."""
        if not dirs:
            return empty_frame(self.spark, self.ddl)
        rows = self._files(dirs).withColumn(
            "_batch", F.regexp_extract(F.col("_metadata.file_path"), _DIR_ID, 1).cast("bigint")
        )
        others = [c for c in rows.columns if c not in ("_sid", "_batch")]
        newest = rows.groupBy("_sid").agg(F.max_by(F.struct(*others), "_batch").alias("_v"))
        live = newest.select("_sid", "_v.*").where("NOT _gone").select(*self.cols)
        return live.coalesce(self.partitions).localCheckpoint(eager=True)

    def _files(self, dirs: list[str]) -> DataFrame:
        return self.spark.read.schema(self.file_ddl).parquet(*[self.lake.uri(d) for d in dirs])

    def _write(self, name: str, rows: DataFrame) -> None:
        self._complete.discard(name)  # replaced: complete again only once this write has its marker
        rows.coalesce(1).write.mode("overwrite").parquet(self.lake.uri(self.root, name))

    def _snapshot(self, batch_id: int) -> None:
        rows = self.state.selectExpr("_sid", "false AS _gone", "CAST(NULL AS string) AS _was", *self.cols[1:])
        self._write(f"s{batch_id}", rows.select(*self.file_cols))
        old = complete_dirs(self.lake, self.root, "b", batch_id + 1, self._complete)
        old += complete_dirs(self.lake, self.root, "s", batch_id, self._complete)
        for _, d in old:
            self.lake.delete_tree(d)
            self._complete.discard(d.rpartition("/")[2])

    def after(self, state: DataFrame, log: DataFrame) -> DataFrame:
        """The state after a batch: `state` (before it) with the batch's state rows `log` applied; materialized."""
        kept = state.join(F.broadcast(fresh(log.select("_sid"))), "_sid", "left_anti")
        out = kept.unionByName(log.where("NOT _gone").select(*self.cols))
        return out.coalesce(self.partitions).localCheckpoint(eager=True)

    def stage(self, step: StateStep) -> None:
        """Make the batch's state rows durable (`b<N>`, replacing a partial write of it; nothing when an earlier
        attempt staged it whole). Invisible to `before(M)` for M <= N."""
        if not step.staged:
            self._write(f"b{step.batch_id}", step.log.select(*self.file_cols))

    def advance(self, step: StateStep) -> None:
        """The state after the batch is current (once `stage` and the Redis writes returned)."""
        self.state, self.batch = step.state, step.batch_id


def changed_rows(state: DataFrame, rows: DataFrame, live: str, payload: list[str]) -> DataFrame:
    """The state rows of a batch whose state is the live rows by `_id` (`_sid`): each row of `rows` (row changes
    with `_id`, `_sign`, `_key` and the `payload` columns) for which the SQL condition `live` holds, under its `_id`
    (`_was`: its key before, if it was in `state`), and each row of `state` the batch removes and does not add
    again (`_gone`)."""
    ids = rows.select(F.col("_id").alias("_sid")).distinct()
    added = (
        rows.where(live)
        .dropDuplicates(["_id"])
        .select(F.col("_id").alias("_sid"), "_key", *payload, F.lit(True).alias("_new"))
    )
    gone = state.join(F.broadcast(ids), "_sid", "left_semi").select("_sid", F.col("_key").alias("_was"))
    return added.join(gone, "_sid", "full_outer").select(
        "_sid", F.col("_new").isNull().alias("_gone"), "_was", "_key", *payload
    )


def touched(log: DataFrame) -> DataFrame:
    """`_key`: the keys a batch's state rows `log` name, after and before the batch, once each."""
    keys = log.where("NOT _gone").select("_key").union(log.select(F.col("_was").alias("_key")))
    return fresh(keys.where("_key IS NOT NULL").distinct())


def fresh(df: DataFrame) -> DataFrame:
    """`df` with columns of its own identity: a frame derived from a state (whose materialized plans keep their
    columns' identities) joined with that state again would otherwise hold the same column twice, which Spark
    cannot always tell apart."""
    return df.select(*[F.col(quoted(c)).alias(c) for c in df.columns])


class StateView:
    """A view that keeps a `LakeState` (`store`) and writes Redis from it (see the module docstring). A
    `views.sink.Sink`: `write(changes, batch_id)`. A subclass gives `step(changes, batch_id)` (a `StateStep`) and
    `publish(step)` (the Redis writes; returns the counts `write` returns)."""

    store: LakeState

    @property
    def lake(self) -> Lake:
        return self.store.lake

    @property
    def root(self) -> str:
        return self.store.root

    def restore(self, batch_id: int) -> DataFrame:
        """The state before micro-batch `batch_id` (`LakeState.before`)."""
        return self.store.before(batch_id)[0]

    def step(self, changes: DataFrame, batch_id: int, *, watermark: int | None = None) -> StateStep:
        raise NotImplementedError

    def publish(self, step: StateStep) -> dict:
        raise NotImplementedError

    def stage(self, step: StateStep) -> None:
        self.store.stage(step)

    def finish(self, step: StateStep) -> None:
        """The state after the batch (`step.state`), when `step` did not make it."""
        if step.state is None:
            step.state = self.store.after(step.before, step.log)

    def advance(self, step: StateStep) -> None:
        self.finish(step)
        self.store.advance(step)

    def write(self, changes: DataFrame, batch_id: int, *, watermark: int | None = None) -> dict:
        """Apply batch `batch_id`'s row changes: `step`, then `stage` and `finish` beside `publish`, then `advance`.
        Returns what `publish` returns. `watermark`: the job's after the batch (a windowed view's windows close under
        it)."""
        step = self.step(changes, batch_id, watermark=watermark)
        with ThreadPoolExecutor(max_workers=1) as pool:
            staged = pool.submit(lambda: (self.stage(step), self.finish(step)))
            done = self.publish(step)
            staged.result()
        self.advance(step)
        return done


def views_of(cls, kind: str, spark, lake, pipeline, job: str, state_key: str, **kw) -> list:
    """A `cls(spark, lake, view, pipeline, key, **kw)` for each view of kind `kind` of `job` of `pipeline`, its state
    under `key` = `<state_key>/views/<view>` of `lake`."""
    views = pipeline.jobs[job].views
    return [
        cls(spark, lake, v, pipeline, f"{state_key}/views/{v.name}", **kw) for v in views if v.kind == kind
    ]
