"""The `timeline` job: tweets x follows -> home timelines in Redis (see `joins.table_table` for semantics).

State: the join's state (one row per tweet id, one per follow pair) lives in memory across micro-batches
(materialized DataFrames, local to the job) and is durable as a log of changed rows,
`LAKE_DIR/state/timeline/g<N>/changes/b<batch id>/` (Parquet, one directory per micro-batch, complete when its
`_SUCCESS` marker exists). A plain Parquet write is used rather than a Delta commit because each Delta commit
rebuilt a table snapshot, several Spark jobs for a handful of rows; the directory per batch id gives the same
idempotence.

Per micro-batch N: the batch is joined with the state; the resulting timeline changes are applied to Redis
(idempotent per key) while, in a second Spark job, the changed state rows are written to `b<N>` (a replay
overwrites it with the same rows); only when both are done does the in-memory state move on. When a run starts
(after a crash too) the state before its first batch N (one past the checkpoint's last committed batch) is rebuilt
from the complete directories of batches < N (the newest row per key), and so it is whenever Spark replays a
batch: the replayed batch computes the same changes again, Redis operations repeat with the same effect, with no
lost and no doubled effect. Every
`_SNAPSHOT_EVERY` batches the state is compacted into one snapshot directory.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pyspark.sql import functions as F

from changelog.topics import read_stream
from jobs.generations import record_batch
from jobs.replay import serving_or_rebuild
from jobs.runtime import (
    checkpoint_dir,
    log,
    log_sources,
    run_stream,
    state_dir,
    write_status,
)
from jobs.settings import Settings
from joins.table_table import TimelineState, maintain_timeline
from views.redis_io import connect
from views.timeline import TimelineSink, entry, member

__all__ = ["run_timeline", "TOPICS"]

JOB = "timeline"
TOPICS = ("tweets", "follows")
_COLUMNS = ["topic", "op", "tweet_id", "user_id", "text", "follower_id", "followee_id", "ts"]
_TWEET_KEY, _FOLLOW_KEY = ["tweet_id"], ["follower_id", "followee_id"]
_TWEET_VALUES = ["user_id", "text", "ts", "posted", "deleted"]
_FOLLOW_VALUES = ["op", "ts"]
_LOG_SCHEMA = (
    "batch bigint, kind string, tweet_id string, user_id string, text string, ts bigint, posted boolean, "
    "deleted boolean, follower_id string, followee_id string, op string"
)
_SNAPSHOT_EVERY = 100  # batch directories after which the state is compacted into one snapshot
_LOG_COLUMNS = [tuple(c.split()) for c in _LOG_SCHEMA.split(", ")]


def _source(spark, settings: Settings):
    def norm(df, topic):
        cols = set(df.columns)
        return df.select(
            F.lit(topic).alias("topic"),
            *[F.col(c) if c in cols else F.lit(None).cast("string").alias(c) for c in _COLUMNS[1:-1]],
            F.col("ts"),
        )

    tweets = norm(read_stream(spark, settings.lake_dir, "tweets"), "tweets")
    follows = norm(read_stream(spark, settings.lake_dir, "follows"), "follows")
    return tweets.unionByName(follows)


def _log_rows(df, batch_id: int, kind: str):
    """`df` (tweet or follow state rows) as rows of the changes log, tagged with `batch_id`."""
    have = set(df.columns)
    return df.selectExpr(  # SQL text: a few Py4J round trips instead of ~40 (see views.wire)
        f"CAST({int(batch_id)} AS bigint) AS batch",
        f"'{kind}' AS kind",
        *[f"CAST({c if c in have else 'NULL'} AS {t}) AS {c}" for c, t in _LOG_COLUMNS[2:]],
    )


def _complete(root: Path, prefix: str, below: int) -> list[tuple[int, Path]]:
    """(id, dir) of the complete `<prefix><id>` directories under `root` with id < below, by id."""
    found = []
    for d in root.glob(f"{prefix}*"):
        if d.name[1:].isdigit() and int(d.name[1:]) < below and (d / "_SUCCESS").exists():
            found.append((int(d.name[1:]), d))
    return sorted(found)


class _StateStore:
    """The join state of one generation: in memory after batch `self.batch`, durable under `path` as
    `b<id>` (the rows batch `id` changed) and `s<id>` (the whole state after batch `id`, a compaction)."""

    def __init__(self, spark, path: Path):
        self.spark, self.path = spark, path
        self.state: TimelineState | None = None
        self.batch: int | None = None  # the state in memory is the state after this batch

    def before(self, batch_id: int) -> TimelineState:
        """The state before micro-batch `batch_id`: from memory when it follows the last one, else from the log.

        When `_SNAPSHOT_EVERY` batch directories have accumulated, the state is first written as `s<batch_id-1>`
        and the directories it covers are removed (batch `batch_id - 1` is committed once `batch_id` starts).
        """
        snapshot, changes = self._log_before(batch_id)
        if self.state is None or self.batch != batch_id - 1:
            self.state, self.batch = self._restore(snapshot + changes), batch_id - 1
        if len(changes) >= _SNAPSHOT_EVERY:
            self._snapshot(batch_id - 1)
        return self.state

    def _log_before(self, batch_id: int) -> tuple[list[Path], list[Path]]:
        """The newest complete snapshot before `batch_id` (a list of at most one) and the batch dirs after it."""
        snaps = _complete(self.path, "s", batch_id)
        since = snaps[-1][0] if snaps else -1
        return [d for _, d in snaps[-1:]], [d for i, d in _complete(self.path, "b", batch_id) if i > since]

    def _restore(self, dirs: list[Path]) -> TimelineState:
        rows = (
            self.spark.read.schema(_LOG_SCHEMA).parquet(*[str(d) for d in dirs])
            if dirs
            else self.spark.createDataFrame([], _LOG_SCHEMA)
        )

        def newest(kind: str, keys: list[str], values: list[str]):
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

    def _write(self, name: str, batch_id: int, tweets, follows) -> None:
        rows = _log_rows(tweets, batch_id, "t").unionByName(_log_rows(follows, batch_id, "f"))
        rows.coalesce(1).write.mode("overwrite").parquet(str(self.path / name))

    def _snapshot(self, batch_id: int) -> None:
        self._write(f"s{batch_id}", batch_id, self.state.tweets, self.state.follows)
        for _, d in _complete(self.path, "b", batch_id + 1) + _complete(self.path, "s", batch_id):
            shutil.rmtree(d, ignore_errors=True)

    def write(self, batch_id: int, changes) -> None:
        """Write the batch's changed rows to `b<batch_id>` (replacing a partial or earlier write of it). Safe
        before the batch is applied to Redis: a run restarts from the state before its first batch, built only from
        the directories of earlier batches, and a replayed batch writes `b<batch_id>` again."""
        self._write(f"b{batch_id}", batch_id, changes.tweet_rows, changes.follow_rows)

    def advance(self, batch_id: int, changes) -> None:
        """Move the state in memory past `batch_id` (once Redis has the batch and `write` is done)."""
        self.state, self.batch = changes.after, batch_id


def _ops(changes):
    """The sink's operations (TIMELINE_OPS_SCHEMA) for `changes`; branches with no input are left out of the plan.
    The entries' wire text (`p`) was made per tweet by the join (`payload=entry`). Expressions are SQL text (see
    `views.wire`)."""
    n = changes.counts
    removing, adding = n["died"] or n["lost"], n["born"] or n["gained"]

    def op(df, kind, mode="NULL", removes="NULL", entries="NULL", body="NULL"):
        return df.selectExpr(
            f"'{kind}' AS kind",
            f"{'follower_id' if kind == 'timeline' else 'tweet_id'} AS id",
            f"CAST({mode} AS string) AS mode",
            f"CAST({removes} AS array<string>) AS removes",
            f"CAST({entries} AS array<string>) AS entries",
            f"CAST({body} AS string) AS body",
        )

    parts = []
    adds = changes.adds.selectExpr("follower_id", "entries.p AS entries")
    if removing:
        removes = changes.removes.groupBy("follower_id").agg(
            F.expr(f"collect_list({member('tweet_id')}) AS removes")
        )
        touched = adds.join(removes, "follower_id", "full") if adding else removes
        parts.append(op(touched, "timeline", "'add'", "removes", "entries" if adding else "NULL"))
        parts.append(op(changes.replaces, "timeline", "'replace'", entries="entries.p"))
    elif adding:
        parts.append(op(adds, "timeline", "'add'", entries="entries"))
    if n["born"]:
        parts.append(op(changes.tweets_live, "tweet", body="to_json(struct(tweet_id, user_id, text, ts))"))
    if n["died"]:
        parts.append(op(changes.tweets_dead, "tweet"))
    out = parts[0] if parts else op(changes.tweets_dead, "tweet")
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _next_batch_id(checkpoint: Path) -> int:
    """The id of the next micro-batch the query at `checkpoint` runs: one past its last committed batch."""
    commits = checkpoint / "commits"
    done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(done, default=-1) + 1


def run_timeline(spark, settings: Settings, *, once: bool = True, generation: int | None = None) -> dict:
    """Run the timeline job into `generation` (default: the serving one, rebuilt first if Redis lost it, see
    `jobs.replay.serving_or_rebuild`). Returns totals of this run."""
    client = connect(settings.redis_url)
    gen = generation if generation is not None else serving_or_rebuild(spark, settings, JOB)
    store = _StateStore(spark, state_dir(settings, JOB, gen) / "changes")
    sink = TimelineSink(settings.redis_url, gen, settings.timeline_cap)
    totals = {"batches": 0, "events": 0, "timeline_ops": 0, "entries": 0, "seconds": 0.0}

    def process(batch_df, batch_id: int) -> None:
        started = time.monotonic()
        # Materialized by the count below and read from memory after it (a local checkpoint: no columnar cache
        # encoding, and no plan substitution that can miss; see joins.table_table._changes).
        batch = batch_df.localCheckpoint(eager=False)
        per_topic = dict(batch.groupBy("topic").count().collect())
        n_events = sum(per_topic.values())
        if n_events == 0:
            record_batch(client, JOB, gen, batch_id)
            return
        tweets_b = follows_b = None
        if per_topic.get("tweets"):
            tweets_b = batch.where(F.col("topic") == "tweets").select(
                "op", "tweet_id", "user_id", "text", "ts"
            )
        if per_topic.get("follows"):
            follows_b = batch.where(F.col("topic") == "follows").select(
                "op", "follower_id", "followee_id", "ts"
            )
        changes = maintain_timeline(
            store.before(batch_id), tweets_b, follows_b, cap=settings.timeline_cap, payload=entry
        )
        t_compute = time.monotonic()
        # The changed state rows are written while Redis applies the batch (a Spark job of its own, on the core
        # the sink leaves idle while it waits for Redis); the state advances only once both are done.
        with ThreadPoolExecutor(max_workers=1) as pool:
            wrote = pool.submit(store.write, batch_id, changes)
            written = sink.write(_ops(changes), batch_id)
            t_sink = time.monotonic()
            wrote.result()
        n_ops, n_entries = written["timelines"], written["entries"]
        store.advance(batch_id, changes)
        t_state = time.monotonic()
        changes.release()
        took = time.monotonic() - started
        totals["batches"] += 1
        totals["events"] += n_events
        totals["timeline_ops"] += n_ops
        totals["entries"] += n_entries
        totals["seconds"] += took
        now = int(time.time() * 1000)
        record_batch(client, JOB, gen, batch_id, last_batch_ms=now)
        write_status(
            settings,
            JOB,
            generation=gen,
            last_batch_id=batch_id,
            last_batch_ms=now,
            last_batch_seconds=round(took, 3),
            last_batch_events=n_events,
        )
        log(
            f"timeline g{gen} batch {batch_id}: {n_events:,} events -> {n_ops:,} timelines, "
            f"{n_entries:,} entries in {took:.2f}s (join {t_compute - started:.2f}s, "
            f"redis {t_sink - t_compute:.2f}s, state wait {t_state - t_sink:.2f}s)"
        )

    log_sources(settings, JOB, gen, TOPICS)
    started = time.monotonic()
    first = _next_batch_id(checkpoint_dir(settings, JOB, gen))
    store.before(first)
    log(f"timeline g{gen}: state before batch {first} loaded in {time.monotonic() - started:.2f}s")
    run_stream(
        _source(spark, settings),
        process,
        checkpoint=checkpoint_dir(settings, JOB, gen),
        once=once,
        settings=settings,
        name=f"timeline_g{gen}",
    )
    return totals
