"""Table-table join maintained incrementally: the home timeline, `tweets JOIN follows`.

The view is `SELECT f.follower_id, t.* FROM tweets t JOIN follows f ON f.followee_id = t.user_id` over the
*current* tables, newest `cap` per follower (ties by tweet_id descending). The current tables are derived
from the logs order-independently:
- tweets: a tweet is live when a `post` was seen and no `delete` was ever seen (a delete is a tombstone,
  whichever arrives first). Repeated posts of one id keep the greatest (ts, user_id, text).
- follows: per (follower, followee) the event with the greatest `ts` wins; on equal `ts` an `unfollow` wins
  (the conservative choice, like a tombstone). A pair is current when its winning event is a `follow`.

State (`TimelineState`: one row per tweet id, one per follow pair) is kept by the job (Delta tables).
`maintain_timeline` takes the state before a micro-batch and the batch, and returns the new state rows and
the changes to publish, by the product rule d(T join F) = dT join F' + T' join dF (primes: after the batch):
- a tweet that becomes live is added to the timeline of every current follower of its author;
- a follow that becomes current adds the followee's newest `cap` live tweets to the follower;
- a follower who loses entries (an unfollow, or the delete of a tweet of someone they followed) has them
  removed; if their timeline was full (the join held more than `cap` rows for them, so Redis did not hold all
  of them) it is recomputed whole from the state after the batch (`replace`), which refills it with the
  next-newest tweets.
Duplicate records change no state, so they have one effect. Because state is a function of the *set* of
records, the published timelines never depend on arrival order or on batch boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "TimelineState",
    "TimelineChanges",
    "maintain_timeline",
    "TWEET_STATE_SCHEMA",
    "FOLLOW_STATE_SCHEMA",
]

TWEET_STATE_SCHEMA = (
    "tweet_id string, user_id string, text string, ts bigint, posted boolean, deleted boolean"
)
FOLLOW_STATE_SCHEMA = "follower_id string, followee_id string, op string, ts bigint"


@dataclass(frozen=True)
class TimelineState:
    tweets: DataFrame  # TWEET_STATE_SCHEMA, one row per tweet id ever seen
    follows: DataFrame  # FOLLOW_STATE_SCHEMA, one row per pair ever seen


@dataclass(frozen=True)
class TimelineChanges:
    tweet_rows: DataFrame  # changed tweet state rows (upsert into state by tweet_id)
    follow_rows: DataFrame  # changed follow state rows (upsert by follower_id, followee_id)
    adds: DataFrame  # follower_id, tweet_id, ts: entries to add (then trim to cap)
    removes: DataFrame  # follower_id, tweet_id: entries to remove (before the adds)
    replaces: (
        DataFrame  # follower_id, entries: array<struct<ts, tweet_id>> newest first: the whole new timeline
    )
    tweets_live: DataFrame  # tweet_id, user_id, text, ts: tweets that became live
    tweets_dead: DataFrame  # tweet_id: tweets that stopped being live
    _cached: tuple = ()

    def release(self) -> None:
        """Free the materialized intermediate results once the batch is published and the state committed."""
        for df in self._cached:
            df.unpersist()


def _live(t: DataFrame) -> DataFrame:
    return t.where(F.col("posted") & ~F.col("deleted"))


def _current(f: DataFrame) -> DataFrame:
    return f.where(F.col("op") == "follow")


def _top_per(df: DataFrame, key: str, cap: int) -> DataFrame:
    w = Window.partitionBy(key).orderBy(F.col("ts").desc(), F.col("tweet_id").desc())
    return df.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") <= cap).drop("_rank")


def _tweet_changes(before: DataFrame, batch: DataFrame) -> DataFrame:
    """Changed tweet rows with `live_before`, `live_after`. Only tweet ids whose state changed are returned."""
    post = F.col("op") == "post"
    reduced = batch.groupBy("tweet_id").agg(
        F.max(F.when(post, F.struct("ts", "user_id", "text"))).alias("p"),
        F.max(F.when(~post, F.struct("user_id")).otherwise(None)).alias("d"),
    )
    b = before.alias("b")
    j = reduced.alias("n").join(b, "tweet_id", "left")
    old_post = F.when(F.col("b.posted"), F.struct(F.col("b.ts"), F.col("b.user_id"), F.col("b.text")))
    new_post = F.greatest(old_post, F.col("n.p"))
    posted = F.coalesce(F.col("b.posted"), F.lit(False)) | F.col("n.p").isNotNull()
    deleted = F.coalesce(F.col("b.deleted"), F.lit(False)) | F.col("n.d").isNotNull()
    out = j.select(
        "tweet_id",
        F.coalesce(new_post["user_id"], F.col("b.user_id"), F.col("n.d.user_id")).alias("user_id"),
        new_post["text"].alias("text"),
        new_post["ts"].alias("ts"),
        posted.alias("posted"),
        deleted.alias("deleted"),
        (F.coalesce(F.col("b.posted"), F.lit(False)) & ~F.coalesce(F.col("b.deleted"), F.lit(False))).alias(
            "live_before"
        ),
        F.col("b.tweet_id").isNull().alias("_new"),
        F.struct(
            F.col("b.user_id"), F.col("b.text"), F.col("b.ts"), F.col("b.posted"), F.col("b.deleted")
        ).alias("_old"),
    ).withColumn("live_after", F.col("posted") & ~F.col("deleted"))
    changed = F.col("_new") | ~F.struct("user_id", "text", "ts", "posted", "deleted").eqNullSafe(
        F.col("_old")
    )
    # A live tweet whose post changed (a second post of the same id with a greater ts) moves in the timelines.
    moved = (
        F.col("live_before")
        & F.col("live_after")
        & ~F.struct("user_id", "ts").eqNullSafe(F.struct(F.col("_old.user_id"), F.col("_old.ts")))
    )
    return (
        out.where(changed)
        .withColumn("moved", moved)
        .withColumn("user_before", F.col("_old.user_id"))
        .drop("_new", "_old")
    )


def _follow_changes(before: DataFrame, batch: DataFrame) -> DataFrame:
    """Changed pair rows with `current_before`, `current_after`."""
    rank = F.when(F.col("op") == "unfollow", 1).otherwise(0)
    reduced = batch.groupBy("follower_id", "followee_id").agg(
        F.max(F.struct("ts", rank.alias("r"), "op")).alias("n")
    )
    j = reduced.join(before.alias("b"), ["follower_id", "followee_id"], "left")
    old = F.when(
        F.col("b.op").isNotNull(),
        F.struct(
            F.col("b.ts"), F.when(F.col("b.op") == "unfollow", 1).otherwise(0).alias("r"), F.col("b.op")
        ),
    )
    win = F.greatest(old, F.col("n"))
    out = j.select(
        "follower_id",
        "followee_id",
        win["op"].alias("op"),
        win["ts"].alias("ts"),
        F.coalesce(F.col("b.op") == "follow", F.lit(False)).alias("current_before"),
        (win["op"] == "follow").alias("current_after"),
        old.isNull().alias("_new"),
        (~old.eqNullSafe(win)).alias("_moved"),
    )
    return out.where(F.col("_new") | F.col("_moved")).drop("_new", "_moved")


def maintain_timeline(
    state: TimelineState, tweets_batch: DataFrame, follows_batch: DataFrame, *, cap: int
) -> TimelineChanges:
    """The state rows and timeline changes caused by one micro-batch. See the module docstring for semantics.

    `tweets_batch`: op, tweet_id, user_id, text, ts. `follows_batch`: op, follower_id, followee_id, ts.
    The returned DataFrames are lazy over `state` (pin it to a table version) and the batch.
    """
    # Batch-sized intermediate results are materialized once (lineage cut), so the plans below stay small.
    tc = _tweet_changes(state.tweets, tweets_batch).localCheckpoint(eager=True)
    fc = _follow_changes(state.follows, follows_batch).localCheckpoint(eager=True)

    tweet_rows = tc.select(*[c.split()[0] for c in TWEET_STATE_SCHEMA.split(", ")])
    tweets_after = state.tweets.join(tc.select("tweet_id"), "tweet_id", "left_anti").unionByName(tweet_rows)
    follow_rows = fc.drop("current_before", "current_after")
    follows_after = state.follows.join(
        fc.select("follower_id", "followee_id"), ["follower_id", "followee_id"], "left_anti"
    ).unionByName(follow_rows)
    live_after = _live(tweets_after)
    cur_after = _current(follows_after).select("follower_id", "followee_id")

    born = tc.where(F.col("live_after") & (~F.col("live_before") | F.col("moved"))).select(
        "tweet_id", "user_id", "text", "ts"
    )
    died = tc.where(F.col("live_before") & (~F.col("live_after") | F.col("moved"))).select(
        "tweet_id", F.col("user_before").alias("user_id"), "live_after"
    )
    gained = fc.where(~F.col("current_before") & F.col("current_after")).select("follower_id", "followee_id")
    lost = fc.where(F.col("current_before") & ~F.col("current_after")).select("follower_id", "followee_id")

    # Followers who lose entries: an unfollow, or a delete of a tweet by someone they followed before the batch.
    cur_before = _current(state.follows).select("follower_id", "followee_id")
    died_authors = F.broadcast(died.select(F.col("user_id").alias("followee_id"), "tweet_id"))
    rm_deleted = cur_before.join(died_authors, "followee_id").select("follower_id", "tweet_id")
    rm_unfollowed = lost.join(
        _live(state.tweets).select(F.col("user_id").alias("followee_id"), "tweet_id"), "followee_id"
    ).select("follower_id", "tweet_id")
    removes_all = rm_deleted.unionByName(rm_unfollowed).distinct().localCheckpoint(eager=True)
    losers = removes_all.select("follower_id").distinct()
    # A loser whose timeline held every entry of the join (at most `cap`) is exact with ZREM; one that had more
    # than `cap` (Redis keeps only the newest `cap`) is recomputed whole, which refills it.
    live_per_author = (
        _live(state.tweets).groupBy(F.col("user_id").alias("followee_id")).agg(F.count("*").alias("n"))
    )
    sizes = cur_before.join(losers, "follower_id").join(live_per_author, "followee_id")
    refill = (
        sizes.groupBy("follower_id").agg(F.sum("n").alias("n")).where(F.col("n") > cap).select("follower_id")
    )
    removes = removes_all.join(refill, "follower_id", "left_anti")

    # dT join F': new live tweets to every current follower of the author.
    add_new_tweets = cur_after.join(
        F.broadcast(born.select(F.col("user_id").alias("followee_id"), "tweet_id", "ts")), "followee_id"
    ).select("follower_id", "tweet_id", "ts")
    # T' join dF: a new follow brings the followee's newest `cap` live tweets.
    authors = gained.select(F.col("followee_id").alias("user_id")).distinct()
    top_of_authors = _top_per(live_after.join(F.broadcast(authors), "user_id"), "user_id", cap)
    add_new_follows = gained.join(
        top_of_authors.select(F.col("user_id").alias("followee_id"), "tweet_id", "ts"), "followee_id"
    ).select("follower_id", "tweet_id", "ts")
    adds = _top_per(
        add_new_tweets.unionByName(add_new_follows).distinct().join(refill, "follower_id", "left_anti"),
        "follower_id",
        cap,
    )

    # Refill: the whole new timeline of each follower recomputed (empty array when nothing is left).
    refill_rows = _top_per(
        cur_after.join(refill, "follower_id")
        .join(live_after.select(F.col("user_id").alias("followee_id"), "tweet_id", "ts"), "followee_id")
        .select("follower_id", "tweet_id", "ts"),
        "follower_id",
        cap,
    )
    replaces = refill.join(
        refill_rows.groupBy("follower_id").agg(
            F.sort_array(F.collect_list(F.struct("ts", "tweet_id")), asc=False).alias("entries")
        ),
        "follower_id",
        "left",
    ).select(
        "follower_id",
        F.coalesce("entries", F.array().cast("array<struct<ts:bigint,tweet_id:string>>")).alias("entries"),
    )

    return TimelineChanges(
        tweet_rows=tweet_rows,
        follow_rows=follow_rows,
        adds=adds,
        removes=removes,
        replaces=replaces,
        tweets_live=born,
        tweets_dead=died.where(~F.col("live_after")).select("tweet_id"),
        _cached=(tc, fc, refill, removes_all),
    )
