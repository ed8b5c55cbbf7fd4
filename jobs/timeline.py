"""The `timeline` job: tweets x follows -> home timelines in Redis (see `joins.table_table` for semantics).

Source: the `tweets` and `follows` topic logs, one stream. Join: `joins.table_table.begin_timeline`, its state
kept by `joins.table_table_state.TimelineStore` under `LAKE_DIR/state/timeline/g<N>/changes`. View:
`views.timeline` (`timeline_phases`, `TimelineSink`).

Per micro-batch N: the state before N is restored (from memory, or from the log after a restart or when Spark
replays N); the batch is joined with it; the timeline operations are applied to Redis (idempotent per key) while
the changed state rows are staged under batch id N (a replay stages them again); only when both are done does
the state advance past N. A replayed batch computes the same changes again and repeats the same Redis operations,
so no effect is lost or doubled. The state before a run's first batch is restored before the query starts.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from itertools import islice

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.topics import read_stream
from jobs.errors import FanoutLimitChanged
from jobs.runtime import log
from jobs.settings import Settings
from jobs.skeleton import Batch, JobRun, Wiring, run_job
from joins.table_table import begin_timeline
from joins.table_table_state import TimelineStore
from views.keys import meta_key
from views.timeline import ENTRY_CARRY, TimelineSink, timeline_phases, timeline_posts

__all__ = ["run_timeline", "TOPICS"]

JOB = "timeline"
TOPICS = ("tweets", "follows")
_COLUMNS = ["topic", "op", "tweet_id", "user_id", "text", "follower_id", "followee_id", "ts"]


def _source(spark, settings: Settings) -> DataFrame:
    """Both topics as one stream of `_COLUMNS` (the other topic's columns null)."""

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


def _split(batch: DataFrame, present) -> tuple[DataFrame | None, DataFrame | None]:
    """The batch's tweets and follows, None for a topic not `present` (no record of it in the batch)."""
    tweets = follows = None
    if "tweets" in present:
        tweets = batch.where(F.col("topic") == "tweets").select("op", "tweet_id", "user_id", "text", "ts")
    if "follows" in present:
        follows = batch.where(F.col("topic") == "follows").select("op", "follower_id", "followee_id", "ts")
    return tweets, follows


def _per_topic(batch: DataFrame) -> dict[str, int]:
    return dict(batch.groupBy("topic").count().collect())


def _shown(limit: int | None) -> str:
    return "" if limit is None else str(limit)


def _check_fanout_limit(run: JobRun) -> None:
    """A generation keeps the FANOUT_LIMIT it was built with (which keys hold whose tweets depends on it)."""
    meta = run.client.hgetall(meta_key(JOB, run.generation))
    built = meta.get(b"fanout_limit", b"").decode()
    if b"last_batch_id" in meta and built != _shown(run.settings.fanout_limit):
        raise FanoutLimitChanged(
            JOB, run.generation, int(built) if built else None, run.settings.fanout_limit
        )


def _wire(run: JobRun) -> Wiring:
    settings = run.settings
    _check_fanout_limit(run)
    store = TimelineStore(run.spark, run.state_dir / "changes")
    sink = TimelineSink(settings.redis_url, run.generation, settings.timeline_cap)
    run.totals.update(timeline_ops=0, entries=0)
    limited = settings.fanout_limit is not None
    joining = dict(cap=settings.timeline_cap, carry=ENTRY_CARRY, fanout_limit=settings.fanout_limit)

    def process(batch_df: DataFrame, batch_id: int) -> Batch | None:
        started = time.monotonic()
        batch = batch_df.localCheckpoint(eager=False)  # read from memory after its first Spark job
        # A batch of tweets only under a fan-out limit (told by the offset log, no Spark job) is counted after its
        # posts are written: what makes a celebrity's tweet visible goes out first, in the job computing its rows.
        posts_first = limited and run.topics_moved(batch_id, TOPICS) == {"tweets"}
        per_topic = None if posts_first else _per_topic(batch)
        if per_topic == {}:
            return None
        step = begin_timeline(store.restore(batch_id), *_split(batch, per_topic or {"tweets"}), **joining)
        posted = step.posts is not None
        early = sink.write_few(timeline_posts(step.posts), batch_id) if posted else None
        per_topic = per_topic or _per_topic(batch)
        if not (n_events := sum(per_topic.values())):
            return None
        changes = step.finish()
        t_join = time.monotonic()
        # The state after the batch is computed and its changed rows staged (Spark jobs of their own) while Redis
        # applies the batch; the state advances only once both are done.
        phases = timeline_phases(changes, posted)
        head = list(islice(phases, 1 if limited and not posted else 0))
        with ThreadPoolExecutor(max_workers=1) as pool:
            first = early or sink.write(head, batch_id)
            staged = pool.submit(store.stage, batch_id, changes)
            written = {k: v + first[k] for k, v in sink.write(phases, batch_id).items()}
            t_sink = time.monotonic()
            staged.result()
        store.advance(batch_id, changes)
        t_state = time.monotonic()
        changes.release()
        n_ops, n_entries = written["timelines"], written["entries"]
        return Batch(
            events=n_events,
            summary=(
                f"{n_events:,} events -> {n_ops:,} timelines, {n_entries:,} entries (join "
                f"{t_join - started:.2f}s, redis {t_sink - t_join:.2f}s, state wait {t_state - t_sink:.2f}s)"
            ),
            totals={"timeline_ops": n_ops, "entries": n_entries},
            # readers cut merged timelines to the cap; a run checks the limit is the generation's
            meta={"cap": settings.timeline_cap, "fanout_limit": _shown(settings.fanout_limit)},
            inputs=per_topic,
            phases={"join": t_join - started, "sink": t_sink - t_join, "state": t_state - t_sink},
        )

    started = time.monotonic()
    first = run.next_batch_id()
    store.restore(first)
    log(f"timeline g{run.generation}: state before batch {first} loaded in {time.monotonic() - started:.2f}s")
    return Wiring(source=_source(run.spark, settings), process=process)


def run_timeline(spark, settings: Settings, *, once: bool = True, generation: int | None = None) -> dict:
    """Run the timeline job into `generation` (default: the serving one, rebuilt first if Redis lost it, see
    `jobs.replay.serving_or_rebuild`). Returns this run's totals: batches, events, timeline_ops, entries,
    seconds."""
    return run_job(spark, settings, JOB, _wire, once=once, generation=generation)
