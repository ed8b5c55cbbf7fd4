"""The `timeline` job: tweets x follows -> home timelines in Redis (see `joins.table_table` for semantics).

State: the join's state (one row per tweet id, one per follow pair) lives in memory across micro-batches
(materialized DataFrames, local to the job) and is durable as an append-only Delta log of changed rows,
`LAKE_DIR/state/timeline/g<N>/changes`, one commit per micro-batch tagged with its batch id.

Per micro-batch N: the batch is joined with the state, the resulting timeline changes are applied to Redis
(idempotent per key), the changed state rows are appended to the log (idempotent: Delta `txnAppId` =
job and generation, `txnVersion` = N) and only then does the in-memory state move on. After a crash, or when
Spark replays batch N, the state is rebuilt from the log rows of batches < N (the newest row per key), so the
replayed batch computes the same changes again: Redis operations repeat with the same effect and the append is
skipped, with no lost and no doubled effect.
"""

from __future__ import annotations

import time

from pyspark.sql import functions as F

from changelog.topics import read_stream
from jobs.runtime import (
    checkpoint_dir,
    ensure_delta_table,
    log,
    log_sources,
    run_stream,
    state_dir,
    write_status,
)
from jobs.settings import Settings
from joins.table_table import TimelineState, maintain_timeline
from views.keys import meta_key
from views.redis_io import connect, ensure_generation
from views.timeline import SEP, TimelineSink

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


class _StateStore:
    """The join state of one generation: in memory after batch `self.batch`, durable in the changes log."""

    def __init__(self, spark, path: str, app_id: str):
        self.spark, self.path, self.app_id = spark, path, app_id
        self.state: TimelineState | None = None
        self.batch: int | None = None  # the state in memory is the state after this batch

    def before(self, batch_id: int) -> TimelineState:
        """The state before micro-batch `batch_id`: from memory when it follows the last one, else from the log."""
        if self.state is None or self.batch != batch_id - 1:
            self.state = self._restore(batch_id)
        return self.state

    def _restore(self, batch_id: int) -> TimelineState:
        rows = self.spark.read.format("delta").load(self.path).where(F.col("batch") < batch_id)

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

    def commit(self, batch_id: int, changes) -> None:
        """Append the batch's changed rows (skipped by Delta if batch `batch_id` was appended before)."""

        def as_log(df, kind: str):
            have = set(df.columns)
            return df.select(
                F.lit(batch_id).cast("bigint").alias("batch"),
                F.lit(kind).alias("kind"),
                *[(F.col(c) if c in have else F.lit(None)).cast(t).alias(c) for c, t in _LOG_COLUMNS[2:]],
            )

        rows = as_log(changes.tweet_rows, "t").unionByName(as_log(changes.follow_rows, "f"))
        (
            rows.coalesce(1)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", self.app_id)
            .option("txnVersion", batch_id)
            .save(self.path)
        )
        self.state, self.batch = changes.after, batch_id


def _entries(col):
    return F.array_join(
        F.transform(col, lambda e: F.concat(e["ts"].cast("string"), F.lit(SEP), e["tweet_id"])), SEP
    )


def _ops(changes):
    none = F.lit(None).cast("string")
    removes = changes.removes.groupBy("follower_id").agg(
        F.array_join(F.sort_array(F.collect_list("tweet_id")), SEP).alias("removes")
    )
    timeline = (
        changes.adds.select("follower_id", _entries(F.col("entries")).alias("entries"))
        .join(removes, "follower_id", "full")
        .select(
            F.lit("timeline").alias("kind"),
            F.col("follower_id").alias("id"),
            F.lit("add").alias("mode"),
            "removes",
            "entries",
            none.alias("body"),
        )
    )
    replaces = changes.replaces.select(
        F.lit("timeline").alias("kind"),
        F.col("follower_id").alias("id"),
        F.lit("replace").alias("mode"),
        none.alias("removes"),
        _entries(F.col("entries")).alias("entries"),
        none.alias("body"),
    )
    born = changes.tweets_live.select(
        F.lit("tweet").alias("kind"),
        F.col("tweet_id").alias("id"),
        none.alias("mode"),
        none.alias("removes"),
        none.alias("entries"),
        F.to_json(F.struct("tweet_id", "user_id", "text", "ts")).alias("body"),
    )
    dead = changes.tweets_dead.select(
        F.lit("tweet").alias("kind"),
        F.col("tweet_id").alias("id"),
        none.alias("mode"),
        none.alias("removes"),
        none.alias("entries"),
        none.alias("body"),
    )
    return timeline.unionByName(replaces).unionByName(born).unionByName(dead)


def run_timeline(spark, settings: Settings, *, once: bool = True, generation: int | None = None) -> dict:
    """Run the timeline job into `generation` (default: the serving one). Returns totals of this run."""
    client = connect(settings.redis_url)
    gen = generation if generation is not None else ensure_generation(client, JOB)
    changes_path = ensure_delta_table(spark, state_dir(settings, JOB, gen) / "changes", _LOG_SCHEMA)
    store = _StateStore(spark, changes_path, f"{JOB}-g{gen}-state")
    sink = TimelineSink(settings.redis_url, gen, settings.timeline_cap)
    totals = {"batches": 0, "events": 0, "timeline_ops": 0, "entries": 0, "seconds": 0.0}

    def process(batch_df, batch_id: int) -> None:
        started = time.monotonic()
        batch = batch_df.persist()
        n_events = batch.count()
        if n_events == 0:
            batch.unpersist()
            return
        tweets_b = batch.where(F.col("topic") == "tweets").select("op", "tweet_id", "user_id", "text", "ts")
        follows_b = batch.where(F.col("topic") == "follows").select("op", "follower_id", "followee_id", "ts")
        changes = maintain_timeline(store.before(batch_id), tweets_b, follows_b, cap=settings.timeline_cap)
        t_compute = time.monotonic()
        written = sink.write(_ops(changes), batch_id)
        n_ops, n_entries = written["timelines"], written["entries"]
        t_sink = time.monotonic()
        # Advance the state only after Redis has the batch (a crash in between replays the batch idempotently).
        store.commit(batch_id, changes)
        t_state = time.monotonic()
        changes.release()
        batch.unpersist()
        took = time.monotonic() - started
        totals["batches"] += 1
        totals["events"] += n_events
        totals["timeline_ops"] += n_ops
        totals["entries"] += n_entries
        totals["seconds"] += took
        now = int(time.time() * 1000)
        client.hset(meta_key(JOB, gen), mapping={"last_batch_id": batch_id, "last_batch_ms": now})
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
            f"redis {t_sink - t_compute:.2f}s, state {t_state - t_sink:.2f}s)"
        )

    log_sources(settings, JOB, gen, TOPICS)
    run_stream(
        _source(spark, settings),
        process,
        checkpoint=checkpoint_dir(settings, JOB, gen),
        once=once,
        settings=settings,
        name=f"timeline_g{gen}",
    )
    return totals
