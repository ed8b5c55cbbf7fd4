"""The state of a `join` job (`joins.table`) between micro-batches: `TableStore`, a `JoinState`.

The state (`TableState`: each side's current table, one row per key ever seen) lives in memory across
micro-batches (materialized DataFrames) and is durable under the store's key in the lake (`changelog.storage.Lake`:
listed and removed through it, written and read by Spark by its URI) as a log of changed rows:
- `b<id>/`: the state rows batch `id` changed (Parquet, written by `stage`, replaced by a replay of the batch);
- `s<id>/`: the whole state after batch `id` (a compaction of the directories before it).
Both sides' rows are in the same files (one Spark job writes a batch's): `_side` says whose, and side `i`'s
columns are `_<i>_<column>` (the other side's are null). A row's batch is the id in its directory's name (read
from the file's path). A directory is complete when its `_SUCCESS` marker exists; incomplete ones are ignored.
`restore(N)` rebuilds the state before batch N from the newest complete snapshot before N and the complete batch
directories after it and before N (the newest row per key), so a run that starts at N, after a crash too, and a
batch that Spark replays both see the state as it was before N. Every `snapshot_every` batch directories the state
is compacted into one snapshot and the directories it covers are removed. (Derived state, the heavy values of a
list with a fan-out limit, is not stored: it is computed again from the restored tables.)
"""

from __future__ import annotations

import functools

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from changelog.current import quoted
from changelog.storage import Lake
from joins.state import complete_dirs, empty_frame
from joins.table import JoinChanges, TableJoin, TableState, state_schema

__all__ = ["TableStore"]

_DIR_ID = r"/[bs]([0-9]+)/[^/]*$"  # the id in a file's path .../b<id>/part-... or .../s<id>/part-...


class TableStore:
    """The join state of one job generation: in memory after batch `self.batch`, durable under key `key` of
    `lake` (the lake's root when `key` is empty; see the module docstring). Implements
    `joins.state.JoinState[TableState]` with `JoinChanges` as changes. `join` is anything with the tables' `topics`
    and `key_columns(i)`: a `TableJoin`'s two, or a select's one (`joins.select.TableSelect`)."""

    def __init__(self, spark, lake: Lake, join: TableJoin, *, key: str = "", snapshot_every: int = 100):
        self.spark, self.join, self.snapshot_every = spark, join, snapshot_every
        self.lake, self.key = lake, key.strip("/")
        self._complete: set[str] = set()  # directories known to be complete (`joins.state.complete_dirs`)
        self.state: TableState | None = None
        self.batch: int | None = None  # the state in memory is the state after this batch
        self._columns = []  # per side: (name, SQL type) of its state columns
        for topic in join.topics:
            fields = DataType.fromDDL(state_schema(topic)).fields  # needs the session (a JVM parse)
            self._columns.append([(f.name, f.dataType.simpleString()) for f in fields])
        self._file_schema = ", ".join(
            ["_side int"] + [f"`_{i}_{n}` {t}" for i, cols in enumerate(self._columns) for n, t in cols]
        )

    def restore(self, batch_id: int) -> TableState:
        """The state before micro-batch `batch_id`: from memory when it follows the last one, else from the log.

        When `snapshot_every` batch directories have accumulated, the state is first written as `s<batch_id-1>`
        and the directories it covers are removed (batch `batch_id - 1` is committed once `batch_id` starts)."""
        snapshot, changes = self._log_before(batch_id)
        if self.state is None or self.batch != batch_id - 1:
            self.state, self.batch = self._read(snapshot + changes), batch_id - 1
        if len(changes) >= self.snapshot_every:
            self._snapshot(batch_id - 1)
        return self.state

    def stage(self, batch_id: int, changes: JoinChanges) -> None:
        """Write the batch's changed rows to `b<batch_id>` (replacing a partial or earlier write of it), and compute the
        state after the batch in memory (`JoinChanges.settle`). Safe before or while the batch is applied to the
        view: `restore(M)` reads only directories of batches before M."""
        changes.settle()
        self._write(f"b{batch_id}", [changes.side_rows(i) for i in range(len(self.join.topics))])

    def advance(self, batch_id: int, changes: JoinChanges) -> None:
        """Move the state in memory past `batch_id` (once the view has the batch and `stage` is done)."""
        self.state, self.batch = changes.settle(), batch_id

    def _complete_dirs(self, prefix: str, below: int) -> list[tuple[int, str]]:
        return complete_dirs(self.lake, self.key, prefix, below, self._complete)

    def _log_before(self, batch_id: int) -> tuple[list[str], list[str]]:
        """The keys of the newest complete snapshot before `batch_id` (a list of at most one) and of the batch
        dirs after it."""
        snaps = self._complete_dirs("s", batch_id)
        since = snaps[-1][0] if snaps else -1
        batches = [d for i, d in self._complete_dirs("b", batch_id) if i > since]
        return [d for _, d in snaps[-1:]], batches

    def _read(self, dirs: list[str]) -> TableState:
        if not dirs:
            return TableState(sides=tuple(empty_frame(self.spark, state_schema(t)) for t in self.join.topics))
        rows = (
            self.spark.read.schema(self._file_schema)
            .parquet(*[self.lake.uri(d) for d in dirs])
            .withColumn("_batch", F.regexp_extract("_metadata.file_path", _DIR_ID, 1).cast("bigint"))
        )

        def newest(i: int) -> DataFrame:
            keys = self.join.key_columns(i)
            own = [n for n, _ in self._columns[i]]
            values = [n for n in own if n not in keys]
            latest = F.max_by(F.struct(*[F.col(f"`_{i}_{n}`").alias(n) for n in values]), "_batch").alias(
                "_v"
            )
            return (
                rows.where(F.col("_side") == i)
                .groupBy(*[F.col(f"`_{i}_{k}`").alias(k) for k in keys])
                .agg(latest)
                .selectExpr(*[quoted(n) if n in keys else f"_v.{quoted(n)} AS {quoted(n)}" for n in own])
                .localCheckpoint(eager=True)
            )

        return TableState(sides=tuple(newest(i) for i in range(len(self.join.topics))))

    def _log_rows(self, i: int, df: DataFrame) -> DataFrame:
        """Side `i`'s state rows as rows of the log's files. The batch id is not a column: a literal in the plan would
        make its generated code differ, and be compiled again, in every batch."""
        cols = [f"{i} AS _side"]
        for j, own in enumerate(self._columns):
            for n, t in own:
                cols.append(f"CAST({quoted(n) if j == i else 'NULL'} AS {t}) AS `_{j}_{n}`")
        return df.selectExpr(*cols)

    def _write(self, name: str, sides: list[DataFrame]) -> None:
        rows = functools.reduce(DataFrame.unionByName, [self._log_rows(i, df) for i, df in enumerate(sides)])
        self._complete.discard(name)  # replaced: complete again only once this write has its marker
        rows.coalesce(1).write.mode("overwrite").parquet(self.lake.uri(self.key, name))

    def _snapshot(self, batch_id: int) -> None:
        self._write(f"s{batch_id}", list(self.state.sides))
        for _, d in self._complete_dirs("b", batch_id + 1) + self._complete_dirs("s", batch_id):
            self.lake.delete_tree(d)
            self._complete.discard(d.rpartition("/")[2])
