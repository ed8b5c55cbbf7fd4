"""The state of the table-table join (`joins.table_table`) between micro-batches: `TimelineStore`, a `JoinState`.

The state (`TimelineState`: one row per tweet id, one per follow pair) lives in memory across micro-batches
(materialized DataFrames) and is durable under the store's directory as a log of changed rows:
- `b<id>/`: the state rows batch `id` changed (Parquet, written by `stage`, replaced by a replay of the batch);
- `s<id>/`: the whole state after batch `id` (a compaction of the directories before it).
A row's batch is the id in its directory's name (`LOG_SCHEMA`'s `batch`, read from the file's path).
A directory is complete when its `_SUCCESS` marker exists; incomplete ones are ignored. `restore(N)` rebuilds the
state before batch N from the newest complete snapshot before N and the complete batch directories after it and
before N (the newest row per key), so a run that starts at N, after a crash too, and a batch that Spark replays
both see the state as it was before N. Every `snapshot_every` batch directories the state is compacted into one
snapshot and the directories it covers are removed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from joins.state import complete_dirs, empty_frame
from joins.table_table import TimelineChanges, TimelineState

__all__ = ["TimelineStore", "LOG_SCHEMA"]

LOG_SCHEMA = (
    "batch bigint, kind string, tweet_id string, user_id string, text string, ts bigint, posted boolean, "
    "deleted boolean, follower_id string, followee_id string, op string"
)
_FILE_SCHEMA = LOG_SCHEMA.removeprefix("batch bigint, ")  # a row's batch is its directory's id
_LOG_COLUMNS = [tuple(c.split()) for c in _FILE_SCHEMA.split(", ")]
_DIR_ID = r"/[bs]([0-9]+)/[^/]*$"  # the id in a file's path .../b<id>/part-... or .../s<id>/part-...
_TWEET_KEY, _FOLLOW_KEY = ["tweet_id"], ["follower_id", "followee_id"]
_TWEET_VALUES = ["user_id", "text", "ts", "posted", "deleted"]
_FOLLOW_VALUES = ["op", "ts"]


def _log_rows(df: DataFrame, kind: str) -> DataFrame:
    """`df` (tweet or follow state rows) as rows of the changes log's files (`_FILE_SCHEMA`). The batch id is not a
    column: a literal in the plan would make its generated code differ, and be compiled again, in every batch."""
    have = set(df.columns)
    return df.selectExpr(
        f"'{kind}' AS kind",
        *[f"CAST({c if c in have else 'NULL'} AS {t}) AS {c}" for c, t in _LOG_COLUMNS[1:]],
    )


class TimelineStore:
    """The join state of one job generation: in memory after batch `self.batch`, durable under `path` (see the
    module docstring). Implements `joins.state.JoinState[TimelineState]` with `TimelineChanges` as changes."""

    def __init__(self, spark, path: Path, *, snapshot_every: int = 100):
        self.spark, self.path, self.snapshot_every = spark, Path(path), snapshot_every
        self.state: TimelineState | None = None
        self.batch: int | None = None  # the state in memory is the state after this batch

    def restore(self, batch_id: int) -> TimelineState:
        """The state before micro-batch `batch_id`: from memory when it follows the last one, else from the log.

        When `snapshot_every` batch directories have accumulated, the state is first written as `s<batch_id-1>`
        and the directories it covers are removed (batch `batch_id - 1` is committed once `batch_id` starts)."""
        snapshot, changes = self._log_before(batch_id)
        if self.state is None or self.batch != batch_id - 1:
            self.state, self.batch = self._read(snapshot + changes), batch_id - 1
        if len(changes) >= self.snapshot_every:
            self._snapshot(batch_id - 1)
        return self.state

    def stage(self, batch_id: int, changes: TimelineChanges) -> None:
        """Write the batch's changed rows to `b<batch_id>` (replacing a partial or earlier write of it), and compute the
        state after the batch in memory (`TimelineChanges.settle`). Safe before or while the batch is applied to the
        view: `restore(M)` reads only directories of batches before M."""
        changes.settle()
        self._write(f"b{batch_id}", changes.tweet_rows, changes.follow_rows)

    def advance(self, batch_id: int, changes: TimelineChanges) -> None:
        """Move the state in memory past `batch_id` (once the view has the batch and `stage` is done)."""
        self.state, self.batch = changes.settle(), batch_id

    def _log_before(self, batch_id: int) -> tuple[list[Path], list[Path]]:
        """The newest complete snapshot before `batch_id` (a list of at most one) and the batch dirs after it."""
        snaps = complete_dirs(self.path, "s", batch_id)
        since = snaps[-1][0] if snaps else -1
        batches = [d for i, d in complete_dirs(self.path, "b", batch_id) if i > since]
        return [d for _, d in snaps[-1:]], batches

    def _read(self, dirs: list[Path]) -> TimelineState:
        rows = (
            self.spark.read.schema(_FILE_SCHEMA)
            .parquet(*[str(d) for d in dirs])
            .withColumn("batch", F.regexp_extract("_metadata.file_path", _DIR_ID, 1).cast("bigint"))
            if dirs
            else empty_frame(self.spark, LOG_SCHEMA)
        )

        def newest(kind: str, keys: list[str], values: list[str]) -> DataFrame:
            latest = F.max_by(F.struct(*values), "batch").alias("v")
            return (
                rows.where(F.col("kind") == kind)
                .groupBy(*keys)
                .agg(latest)
                .select(*keys, *[F.col(f"v.{c}").alias(c) for c in values])
                .localCheckpoint(eager=True)
            )

        return TimelineState(
            tweets=newest("t", _TWEET_KEY, _TWEET_VALUES), follows=newest("f", _FOLLOW_KEY, _FOLLOW_VALUES)
        )

    def _write(self, name: str, tweets: DataFrame, follows: DataFrame) -> None:
        rows = _log_rows(tweets, "t").unionByName(_log_rows(follows, "f"))
        rows.coalesce(1).write.mode("overwrite").parquet(str(self.path / name))

    def _snapshot(self, batch_id: int) -> None:
        self._write(f"s{batch_id}", self.state.tweets, self.state.follows)
        for _, d in complete_dirs(self.path, "b", batch_id + 1) + complete_dirs(self.path, "s", batch_id):
            shutil.rmtree(d, ignore_errors=True)
