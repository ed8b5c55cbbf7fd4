"""The `timeline` job: tweets x follows -> home timelines in Redis (see `joins.table_table` for semantics).

Per micro-batch: the batch is joined with the job's state (Delta tables pinned to their current version), the
resulting timeline changes are applied to Redis (idempotent per key), and only then is the state advanced with a
MERGE. A crash anywhere replays the micro-batch: Redis operations repeat with the same effect and the state MERGE
is idempotent, so there is no lost and no doubled effect.
"""

from __future__ import annotations

import time

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from changelog.topics import read_stream, table_version
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
from joins.table_table import FOLLOW_STATE_SCHEMA, TWEET_STATE_SCHEMA, TimelineState, maintain_timeline
from views.keys import meta_key
from views.redis_io import connect, ensure_generation
from views.timeline import SEP, TimelineSink

__all__ = ["run_timeline", "TOPICS"]

JOB = "timeline"
TOPICS = ("tweets", "follows")
_COLUMNS = ["topic", "op", "tweet_id", "user_id", "text", "follower_id", "followee_id", "ts"]


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


def _entries(col):
    return F.array_join(
        F.transform(col, lambda e: F.concat(e["ts"].cast("string"), F.lit(SEP), e["tweet_id"])), SEP
    )


def _ops(changes):
    none = F.lit(None).cast("string")
    adds = changes.adds.groupBy("follower_id").agg(
        _entries(F.sort_array(F.collect_list(F.struct("ts", "tweet_id")), asc=False)).alias("entries")
    )
    removes = changes.removes.groupBy("follower_id").agg(
        F.array_join(F.sort_array(F.collect_list("tweet_id")), SEP).alias("removes")
    )
    timeline = adds.join(removes, "follower_id", "full").select(
        F.lit("timeline").alias("kind"),
        F.col("follower_id").alias("id"),
        F.lit("add").alias("mode"),
        "removes",
        "entries",
        none.alias("body"),
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
    sdir = state_dir(settings, JOB, gen)
    tweets_path = ensure_delta_table(spark, sdir / "tweets", TWEET_STATE_SCHEMA, deletion_vectors=True)
    follows_path = ensure_delta_table(spark, sdir / "follows", FOLLOW_STATE_SCHEMA, deletion_vectors=True)
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
        t_table, f_table = DeltaTable.forPath(spark, tweets_path), DeltaTable.forPath(spark, follows_path)
        state = TimelineState(
            tweets=spark.read.format("delta")
            .option("versionAsOf", table_version(tweets_path))
            .load(tweets_path),
            follows=spark.read.format("delta")
            .option("versionAsOf", table_version(follows_path))
            .load(follows_path),
        )
        changes = maintain_timeline(state, tweets_b, follows_b, cap=settings.timeline_cap)
        t_compute = time.monotonic()
        written = sink.write(_ops(changes), batch_id)
        n_ops, n_entries = written["timelines"], written["entries"]
        t_sink = time.monotonic()
        # Advance the state only after Redis has the batch (a crash in between replays the batch idempotently).
        (
            t_table.alias("s")
            .merge(changes.tweet_rows.alias("n"), "s.tweet_id = n.tweet_id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
        (
            f_table.alias("s")
            .merge(
                changes.follow_rows.alias("n"),
                "s.follower_id = n.follower_id AND s.followee_id = n.followee_id",
            )
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
        t_merge = time.monotonic()
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
            f"{n_entries:,} entries in {took:.2f}s (join+redis {t_sink - t_compute:.2f}s, "
            f"state {t_merge - t_sink:.2f}s)"
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
