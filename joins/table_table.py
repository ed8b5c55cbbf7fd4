"""Table-table join maintained incrementally: the home timeline, `tweets JOIN follows`.

The view is `SELECT f.follower_id, t.* FROM tweets t JOIN follows f ON f.followee_id = t.user_id` over the
*current* tables, newest `cap` per follower (ties by tweet_id descending). The current tables are derived
from the logs order-independently:
- tweets: a tweet is live when a `post` was seen and no `delete` was ever seen (a delete is a tombstone,
  whichever arrives first). Repeated posts of one id keep the greatest (ts, user_id, text).
- follows: per (follower, followee) the event with the greatest `ts` wins; on equal `ts` an `unfollow` wins
  (the conservative choice, like a tombstone). A pair is current when its winning event is a `follow`.

State (`TimelineState`: one row per tweet id, one per follow pair) is kept by the job. `maintain_timeline`
takes the state before a micro-batch and the batch, and returns the state after it, the changed state rows
and the changes to publish, by the product rule d(T join F) = dT join F' + T' join dF (primes: after the batch):
- a tweet that becomes live is added to the timeline of every current follower of its author;
- a follow that becomes current adds the followee's newest `cap` live tweets to the follower;
- a follower who loses entries (an unfollow, or the delete of a tweet of someone they followed) has them
  removed; if their timeline was full (the join held more than `cap` rows for them, so Redis did not hold all
  of them) it is recomputed whole from the state after the batch (`replace`), which refills it with the
  next-newest tweets.
Duplicate records change no state, so they have one effect. Because state is a function of the *set* of
records, the published timelines never depend on arrival order or on batch boundaries.

Celebrities (`fanout_limit`, FANOUT_LIMIT): an author with more than `fanout_limit` current followers is a
*celebrity* and is not fanned out on write. The steps above then run over the *effective* pairs (current pairs whose
followee is not a celebrity), so the follower timelines hold exactly the newest `cap` tweets of their effective
followees. An author who crosses the limit in a batch turns every pair of theirs that stays current into an effective
gain (no longer a celebrity: backfilled) or loss (became one: removed, and refilled when the timeline was full). The
celebrity side of the changes: per celebrity, the newest `cap` live tweets (`authored_adds`, and `authored_replaces`
for an author who became one or lost a live tweet), authors who stopped being one (`authored_retired`), and the
(follower, celebrity) pairs that began or ended (`celebs_gained`, `celebs_lost`). The newest `cap` of a follower's
whole join is the newest `cap` of their timeline merged with their celebrities' sets (`views.timeline.read_timeline`).
With `fanout_limit=None` none of this is planned. Who is a celebrity is derived state (`TimelineState.celebs`), kept in
memory across batches and recomputed from the follows after a restore. A batch of tweets only has *posts*
(`begin_timeline`: its tweets that became live and the authored adds), planned before the batch's changes are counted,
so that a view can publish what makes a celebrity's tweet visible before the rest is computed.

Every step is a Spark SQL plan over the batch and the state (no Python per row); plan branches whose input is
empty in a batch (no deletes, no unfollows, no new follows, ...) are left out. The state's durable form between
micro-batches is `joins.table_table_state.TimelineStore`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from joins.state import empty_frame, with_row_count

__all__ = [
    "TimelineState",
    "TimelineChanges",
    "maintain_timeline",
    "begin_timeline",
    "TimelineStep",
    "TimelinePosts",
    "TWEET_STATE_SCHEMA",
    "FOLLOW_STATE_SCHEMA",
    "ENTRIES_TYPE",
]

TWEET_STATE_SCHEMA = (
    "tweet_id string, user_id string, text string, ts bigint, posted boolean, deleted boolean"
)
FOLLOW_STATE_SCHEMA = "follower_id string, followee_id string, op string, ts bigint"
ENTRIES_TYPE = "array<struct<ts:bigint,tweet_id:string,p:string>>"  # p: the tweet's `carry` value, or null
_TWEET_COLS = [c.split()[0] for c in TWEET_STATE_SCHEMA.split(", ")]
_FOLLOW_COLS = [c.split()[0] for c in FOLLOW_STATE_SCHEMA.split(", ")]


@dataclass(frozen=True)
class TimelineState:
    tweets: DataFrame  # TWEET_STATE_SCHEMA, one row per tweet id ever seen
    follows: DataFrame  # FOLLOW_STATE_SCHEMA, one row per pair ever seen
    # user_id: the celebrities under the fan-out limit in use (derived from `follows`; None: not computed yet)
    celebs: DataFrame | None = None


@dataclass(frozen=True)
class TimelineChanges:
    """One batch's changes. The followers' side (`adds`, `removes`, `replaces`), `tweets_dead` and the changed state
    rows are planned on first use (a view can publish what it needs first before the rest is planned)."""

    after: TimelineState  # the state after the batch, as plans over the state before (`settle` computes it)
    tweets_live: DataFrame  # tweet_id, user_id, text, ts: tweets that became live
    counts: dict | None = (
        None  # born, fanned, died, gained, lost: how many tweets/pairs changed which way (0 = empty)
    )
    # With a fan-out limit only (else None), the celebrity side; counts adds up, down (authors who became /
    # stopped being celebrities), celebs_gained, celebs_lost (0 = empty):
    authored_adds: DataFrame | None = (
        None  # user_id, entries (ENTRIES_TYPE): add to the author's set, trim to cap
    )
    authored_replaces: DataFrame | None = None  # user_id, entries: the author's whole set (newest cap live)
    authored_retired: DataFrame | None = None  # user_id: authors who stopped being celebrities
    celebs_gained: DataFrame | None = None  # follower_id, followee_id: a celebrity the follower now follows
    celebs_lost: DataFrame | None = (
        None  # follower_id, followee_id: ... no longer follows (or is no celebrity)
    )
    _plans: dict = field(
        default_factory=dict
    )  # name -> a function making it, replaced by its result on first use
    _cached: list = field(default_factory=list)
    _settled: dict = field(default_factory=dict)  # "state": the settled state, once computed

    def _plan(self, name: str):
        if callable(self._plans[name]):
            self._plans[name] = self._plans[name]()
        return self._plans[name]

    @property
    def adds(self) -> DataFrame:
        """follower_id, entries (ENTRIES_TYPE, the newest, at most cap): add, then trim to cap."""
        return self._plan("timelines")[0]

    @property
    def removes(self) -> DataFrame:
        """follower_id, tweet_id: entries to remove (before the adds)."""
        return self._plan("timelines")[1]

    @property
    def replaces(self) -> DataFrame:
        """follower_id, entries (ENTRIES_TYPE, the newest cap): the whole new timeline."""
        return self._plan("timelines")[2]

    @property
    def tweets_dead(self) -> DataFrame:
        """tweet_id: tweets that stopped being live."""
        return self._plan("tweets_dead")

    @property
    def tweet_rows(self) -> DataFrame:
        """Changed tweet state rows (TWEET_STATE_SCHEMA)."""
        return self._plan("tweet_rows")

    @property
    def follow_rows(self) -> DataFrame:
        """Changed follow state rows (FOLLOW_STATE_SCHEMA)."""
        return self._plan("follow_rows")

    def settle(self) -> TimelineState:
        """The state after the batch, computed (the tables the batch changed, as local checkpoints, in one Spark job)
        the first time and kept: the state for the next batch. A sink's plans may run before or while it does; it
        must run before `release()`."""
        if "state" not in self._settled:
            before = self._settled.pop("before")
            tables = {
                name: getattr(self.after, name).localCheckpoint(eager=False)
                for name in ("tweets", "follows")
                if getattr(self.after, name) is not getattr(before, name)
            }
            rows = _count_parts(list(tables.values())) if tables else []
            counted = {
                name: with_row_count(df, n) for (name, df), n in zip(tables.items(), rows, strict=True)
            }
            self._settled["state"] = replace(self.after, **counted)
        return self._settled["state"]

    def release(self) -> None:
        """Free the batch-sized intermediate results once the batch is published and the state committed."""
        for df in self._cached:
            df.unpersist()


def _live(t: DataFrame) -> DataFrame:
    return t.where(F.col("posted") & ~F.col("deleted"))


def _current(f: DataFrame) -> DataFrame:
    return f.where(F.col("op") == "follow").select("follower_id", "followee_id")


def _newest(entries: Column, cap: int) -> Column:
    """The newest `cap` (ts, tweet_id) structs of `entries` (ties by tweet_id descending), in no particular order.

    Sorted only when there are more than `cap` (the order of the array carries no meaning). No `array_distinct`:
    callers pass distinct rows, and Spark's array_distinct of structs compares every pair (quadratic)."""
    return F.when(F.size(entries) <= cap, entries).otherwise(
        F.slice(F.sort_array(entries, asc=False), 1, cap)
    )


def _timelines(pairs: DataFrame, cap: int) -> DataFrame:
    """follower_id, entries: the newest `cap` of each follower's (follower_id, tweet_id, ts, p) rows (distinct)."""
    return pairs.groupBy("follower_id").agg(
        _newest(F.collect_list(F.struct("ts", "tweet_id", "p")), cap).alias("entries")
    )


def _with_carry(tweets: DataFrame, carry: str | None) -> DataFrame:
    """`tweets` (ts, tweet_id, ...) with column `p`: the SQL expression `carry` evaluated per row, or null."""
    p = F.expr(carry) if carry else F.lit(None).cast("string")
    return tweets.withColumn("p", p)


def _top_per_author(tweets: DataFrame, cap: int) -> DataFrame:
    w = Window.partitionBy("user_id").orderBy(F.col("ts").desc(), F.col("tweet_id").desc())
    return tweets.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") <= cap).drop("_rank")


def _backfill(pairs: DataFrame, live: DataFrame, cap: int, carry: str | None) -> DataFrame:
    """follower_id, tweet_id, ts, p: for each (follower_id, followee_id) pair, the followee's newest `cap` tweets
    of `live`. Cut per author before the fan-out to the pairs (a celebrity's thousands of tweets are not joined to
    each of their followers and cut after), and `carry` evaluated once per tweet, before the fan-out too."""
    authors = pairs.select(F.col("followee_id").alias("user_id")).distinct()
    top = _with_carry(_top_per_author(live.join(authors, "user_id", "left_semi"), cap), carry)
    return pairs.join(
        top.select(F.col("user_id").alias("followee_id"), "tweet_id", "ts", "p"), "followee_id"
    ).select("follower_id", "tweet_id", "ts", "p")


# The change queries' expressions are SQL text (`F.expr`, `selectExpr`) rather than built from `functions`. (Not
# one `spark.sql` query: the micro-batch belongs to the streaming query's own session, and a temporary view of it
# is not visible from the state's.)
# In both, the state rows of the batch's keys are selected first (a semi join that streams the state past the small
# batch), so the outer join never hashes or ships the whole state.


def _tweet_changes(before: DataFrame, batch: DataFrame) -> DataFrame:
    """Changed tweet rows with `live_before`, `live_after`, `moved`, `user_before`. Unchanged ids are left out."""
    reduced = batch.groupBy("tweet_id").agg(
        F.expr("max(CASE WHEN op = 'post' THEN struct(ts, user_id, text) END) AS p"),
        F.expr("max(CASE WHEN NOT (op = 'post') THEN struct(user_id) END) AS d"),
    )
    b = before.join(reduced.select("tweet_id"), "tweet_id", "left_semi")
    j = reduced.alias("n").join(b.alias("b"), "tweet_id", "left")
    return (
        j.selectExpr(
            "tweet_id",
            "n.p",
            "n.d",
            "b.tweet_id IS NULL AS is_new",
            "greatest(CASE WHEN b.posted THEN struct(b.ts AS ts, b.user_id AS user_id, b.text AS text) END, n.p) AS np",
            "coalesce(b.posted, false) AS was_posted",
            "coalesce(b.deleted, false) AS was_deleted",
            "struct(b.user_id AS user_id, b.text AS text, b.ts AS ts, b.posted AS posted, b.deleted AS deleted) AS old",
        )
        .selectExpr(
            "tweet_id",
            "coalesce(np.user_id, old.user_id, d.user_id) AS user_id",
            "np.text AS text",
            "np.ts AS ts",
            "was_posted OR p IS NOT NULL AS posted",
            "was_deleted OR d IS NOT NULL AS deleted",
            "was_posted AND NOT was_deleted AS live_before",
            "is_new",
            "old",
        )
        .where("is_new OR NOT (struct(user_id, text, ts, posted, deleted) <=> old)")
        .selectExpr(
            "tweet_id",
            "user_id",
            "text",
            "ts",
            "posted",
            "deleted",
            "live_before",
            "posted AND NOT deleted AS live_after",
            # a live tweet whose post changed (a second post of the id with a greater ts) moves in the timelines
            "live_before AND posted AND NOT deleted"
            " AND NOT (struct(user_id, ts) <=> struct(old.user_id AS user_id, old.ts AS ts)) AS moved",
            "old.user_id AS user_before",
        )
    )


def _follow_changes(before: DataFrame, batch: DataFrame) -> DataFrame:
    """Changed pair rows with `current_before`, `current_after`. Per pair the greatest `ts` wins, an unfollow on
    equal `ts`."""
    keys = ["follower_id", "followee_id"]
    reduced = batch.groupBy(*keys).agg(
        F.expr("max(struct(ts, CASE WHEN op = 'unfollow' THEN 1 ELSE 0 END AS r, op)) AS n")
    )
    b = before.join(reduced.select(*keys), keys, "left_semi")
    j = reduced.alias("n").join(b.alias("b"), keys, "left")
    return (
        j.selectExpr(
            *keys,
            "n.n",
            "coalesce(b.op = 'follow', false) AS current_before",
            "CASE WHEN b.op IS NOT NULL"
            " THEN struct(b.ts AS ts, CASE WHEN b.op = 'unfollow' THEN 1 ELSE 0 END AS r, b.op AS op) END AS old",
        )
        .selectExpr("*", "greatest(old, n) AS win")
        .where("old IS NULL OR NOT (old <=> win)")
        .selectExpr(
            *keys, "win.op AS op", "win.ts AS ts", "current_before", "win.op = 'follow' AS current_after"
        )
    )


_CHANGES_SCHEMAS = {  # what each returns
    _tweet_changes: f"{TWEET_STATE_SCHEMA}, live_before boolean, live_after boolean, moved boolean, user_before string",
    _follow_changes: f"{FOLLOW_STATE_SCHEMA}, current_before boolean, current_after boolean",
}


def _replace_rows(state: DataFrame, changed: DataFrame, keys: list[str], cols: list[str]) -> DataFrame:
    """`state` with the rows of `changed` (same keys) replaced or inserted, a plan of `spark.sql.shuffle.partitions`
    partitions: a union adds its inputs' partitions, so without the coalesce a state kept by a broadcast anti join
    would gain some in every batch."""
    rows = changed.select(*cols)
    parts = int(state.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    kept = state.join(changed.select(*keys), keys, "left_anti")
    return kept.unionByName(rows).coalesce(parts)


def _change_rows(state: TimelineState, tweets_batch: DataFrame | None, follows_batch: DataFrame | None):
    """(tweet changes, follow changes) as lazy local checkpoints, computed by the first Spark job that uses them (only
    the broadcasts of their joins run at once). A topic without a batch has no plan at all: an empty DataFrame.

    Local checkpoints rather than `persist()`: a checkpoint's lineage is cut, so a result used twice in one query is
    never recomputed (Spark does not always substitute a persisted plan)."""
    spark = state.tweets.sparkSession
    return tuple(
        empty_frame(spark, _CHANGES_SCHEMAS[changes])
        if batch is None
        else changes(before, batch).localCheckpoint(eager=False)
        for changes, before, batch in (
            (_tweet_changes, state.tweets, tweets_batch),
            (_follow_changes, state.follows, follows_batch),
        )
    )


def _count_changes(rows: list[tuple[DataFrame | None, tuple[str, ...]]]) -> list[tuple[int, ...]]:
    """For each (changes, conditions) of `rows` (changes None: a topic without a batch, all zero), its row count and
    the count of rows meeting each condition (SQL text), all computed by one Spark job (it materializes the lazy
    checkpoints)."""
    width = max(len(conds) for _, conds in rows)
    flags = []
    for i, (df, conds) in enumerate(rows):
        if df is not None:
            conds = (*conds, *["false"] * (width - len(conds)))
            cols = [f"CAST(coalesce({c}, false) AS int) AS c{j}" for j, c in enumerate(conds)]
            flags.append(df.selectExpr(f"{i} AS part", *cols))
    counts = {}
    if flags:
        union = functools.reduce(DataFrame.unionByName, flags)
        sums = [F.sum(f"c{j}") for j in range(width)]
        for row in union.groupBy("part").agg(F.count("*"), *sums).collect():
            counts[row[0]] = row[1:]
    return [
        tuple(int(x) for x in counts.get(i, (0,) * (len(c) + 1))[: len(c) + 1])
        for i, (_, c) in enumerate(rows)
    ]


_BORN = "live_after AND (NOT live_before OR moved)"  # over _tweet_changes: the tweet (re)enters timelines
_DIED = "live_before AND (NOT live_after OR moved)"  # ... leaves them (a moved tweet does both)
_GAINED = "NOT current_before AND current_after"  # over _follow_changes: the pair became current
_LOST = "current_before AND NOT current_after"
_TIMELINES_SCHEMA = f"follower_id string, entries {ENTRIES_TYPE}"


@dataclass(frozen=True)
class _Delta:
    """One batch's effect on the state: the changed rows, the state before and after, and the rows that change
    the join (born/died tweets, gained/lost pairs), with `n`: how many of each (0 = no plan branch)."""

    before: TimelineState
    after: TimelineState
    tweets: DataFrame  # _tweet_changes rows (a local checkpoint)
    follows: DataFrame  # _follow_changes rows (a local checkpoint)
    born: DataFrame  # tweet_id, user_id, text, ts
    died: DataFrame  # tweet_id, user_id (the author before), live_after
    gained: DataFrame  # follower_id, followee_id (effective pairs)
    lost: DataFrame  # follower_id, followee_id (effective pairs)
    n: dict  # born, fanned (born, by an author who was no celebrity), died, gained, lost
    cur_before: DataFrame  # follower_id, followee_id: the effective pairs before the batch
    cur_after: DataFrame  # ... after it


def _born(tc: DataFrame) -> DataFrame:
    """tweet_id, user_id, text, ts: the tweets of `_tweet_changes` rows that became live."""
    return tc.where(_BORN).select("tweet_id", "user_id", "text", "ts")


def _delta(
    state: TimelineState,
    tc: DataFrame,
    fc: DataFrame,
    present: tuple[bool, bool],
    born: DataFrame | None = None,
    celebs: DataFrame | None = None,
) -> _Delta:
    """The batch's changed state rows (`_change_rows`, `present`: whether each topic has a batch) counted, and the
    state after it (lazy: `TimelineChanges.settle` computes it). `born`: `_born(tc)` if already planned. `celebs`
    (user_id; None: no fan-out limit): the celebrities before the batch, whose tweets are not fanned out on write;
    `n["fanned"]` counts the tweets that became live by the others."""
    counted, fanned = tc, _BORN
    if celebs is not None:
        counted = tc.join(celebs.select("user_id", F.lit(True).alias("_celeb")), "user_id", "left")
        fanned = f"({_BORN}) AND _celeb IS NULL"
    (n_tc, n_born, n_died, n_fanned), (n_fc, n_gained, n_lost) = _count_changes(
        [
            (counted if present[0] else None, (_BORN, _DIED, fanned)),
            (fc if present[1] else None, (_GAINED, _LOST)),
        ]
    )
    tc, fc = with_row_count(tc, n_tc), with_row_count(fc, n_fc)
    tweets_after = _replace_rows(state.tweets, tc, ["tweet_id"], _TWEET_COLS) if n_tc else state.tweets
    follows_after = (
        _replace_rows(state.follows, fc, ["follower_id", "followee_id"], _FOLLOW_COLS)
        if n_fc
        else state.follows
    )
    return _Delta(
        before=state,
        after=TimelineState(tweets=tweets_after, follows=follows_after),
        tweets=tc,
        follows=fc,
        born=_born(tc) if born is None else born,
        died=tc.where(_DIED).select("tweet_id", F.col("user_before").alias("user_id"), "live_after"),
        gained=fc.where(_GAINED).select("follower_id", "followee_id"),
        lost=fc.where(_LOST).select("follower_id", "followee_id"),
        n={"born": n_born, "fanned": n_fanned, "died": n_died, "gained": n_gained, "lost": n_lost},
        cur_before=_current(state.follows),
        cur_after=_current(follows_after),
    )


def _removals(d: _Delta, cap: int) -> tuple[DataFrame, DataFrame, list[DataFrame]]:
    """(removes: follower_id, tweet_id; refill: follower_id; persisted intermediates) for the followers who lose
    entries: an unfollow, or a delete of a tweet by someone they followed before the batch. A loser whose join
    held at most `cap` rows (the view holds all of them) loses exactly those entries; one that held more than
    `cap` (the view holds only the newest `cap`) is in `refill`, to be recomputed whole."""
    cur_before = d.cur_before
    parts = []
    if d.n["died"]:
        died_authors = d.died.select(F.col("user_id").alias("followee_id"), "tweet_id")
        parts.append(cur_before.join(died_authors, "followee_id").select("follower_id", "tweet_id"))
    if d.n["lost"]:
        lost_tweets = _live(d.before.tweets).select(F.col("user_id").alias("followee_id"), "tweet_id")
        parts.append(d.lost.join(lost_tweets, "followee_id").select("follower_id", "tweet_id"))
    removes_all = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1]).distinct()
    removes_all = removes_all.persist()
    losers = removes_all.select("follower_id").distinct()
    live_per_author = (
        _live(d.before.tweets).groupBy(F.col("user_id").alias("followee_id")).agg(F.count("*").alias("n"))
    )
    sizes = cur_before.join(losers, "follower_id").join(live_per_author, "followee_id")
    refill = (
        sizes.groupBy("follower_id").agg(F.sum("n").alias("n")).where(F.col("n") > cap).select("follower_id")
    ).persist()
    removes = removes_all.join(refill, "follower_id", "left_anti")
    return removes, refill, [removes_all, refill]


def _adds(d: _Delta, refill: DataFrame | None, cap: int, carry: str | None) -> DataFrame:
    """follower_id, entries: the entries each follower gains (followers in `refill` left out).

    dT join F' = dT join (F' minus dF) + dT join dF, and T' join dF holds the second term, so the adds are
    dT join (pairs current before and after) + T' join (pairs that became current): disjoint, each
    (follower, tweet) once, and a first batch (empty state) computes the join only once.
    - a tweet that became live goes to every follower of its author who followed before and still does;
    - a new follow brings the followee's newest `cap` live tweets (tweets of this batch included)."""
    candidates = []
    if d.n["fanned"]:  # (a celebrity's tweets reach no timeline: without others, the follows are not read)
        authors = _with_carry(d.born, carry).select(
            F.col("user_id").alias("followee_id"), "tweet_id", "ts", "p"
        )
        kept = d.cur_before
        if d.n["lost"]:
            kept = kept.join(d.lost, ["follower_id", "followee_id"], "left_anti")
        candidates.append(kept.join(authors, "followee_id").select("follower_id", "tweet_id", "ts", "p"))
    if d.n["gained"]:
        candidates.append(_backfill(d.gained, _live(d.after.tweets), cap, carry))
    if not candidates:
        return empty_frame(d.before.tweets.sparkSession, _TIMELINES_SCHEMA)
    pairs = candidates[0] if len(candidates) == 1 else candidates[0].unionByName(candidates[1])
    if refill is not None:
        pairs = pairs.join(refill, "follower_id", "left_anti")
    return _timelines(pairs, cap)


def _replaces(d: _Delta, refill: DataFrame, cap: int, carry: str | None) -> DataFrame:
    """follower_id, entries: the whole new timeline of each follower in `refill`, recomputed from the state after
    the batch (an empty array when nothing is left)."""
    pairs = _backfill(d.cur_after.join(refill, "follower_id"), _live(d.after.tweets), cap, carry)
    return refill.join(_timelines(pairs, cap), "follower_id", "left").select(
        "follower_id", F.coalesce("entries", F.array().cast(ENTRIES_TYPE)).alias("entries")
    )


def _celebs(follows: DataFrame, limit: int) -> DataFrame:
    """user_id: the authors with more than `limit` current followers."""
    per_author = _current(follows).groupBy(F.col("followee_id").alias("user_id")).count()
    return per_author.where(F.col("count") > limit).select("user_id")


def _as_followee(users: DataFrame) -> DataFrame:
    return users.select(F.col("user_id").alias("followee_id"))


def _count_parts(dfs: list[DataFrame]) -> list[int]:
    """The row count of each of `dfs` (lazy local checkpoints among them are materialized), in one Spark job."""
    union = functools.reduce(
        DataFrame.unionByName, [df.selectExpr(f"{i} AS part") for i, df in enumerate(dfs)]
    )
    got = dict(union.groupBy("part").count().collect())
    return [int(got.get(i, 0)) for i in range(len(dfs))]


@dataclass(frozen=True)
class _Celebrities:
    """The celebrity side of one batch (see `_effective`)."""

    before: DataFrame  # user_id: celebrities before the batch
    after: DataFrame  # ... after it
    flips: DataFrame  # followee_id, up: authors who became (up) or stopped being (not up) celebrities
    gained: DataFrame  # follower_id, followee_id: pairs (current, followee a celebrity) that began
    lost: DataFrame  # ... that ended
    cached: tuple = ()  # batch-sized local checkpoints, released with the batch


# long: one plan per kind of change of the celebrity side, and the counts of all in one Spark job
def _effective(d: _Delta, limit: int) -> tuple[_Delta, _Celebrities]:
    """`d` over the *effective* pairs (current pairs whose followee is not a celebrity: more than `limit` current
    followers), and the celebrity side. An author who crosses the limit in the batch turns all their pairs that
    stay current into effective gains (no longer a celebrity) or losses (became one), so the join's machinery
    backfills or removes and refills them like any follow or unfollow."""
    spark, keys = d.before.tweets.sparkSession, ["follower_id", "followee_id"]
    before = d.before.celebs
    if before is None:
        before = _celebs(d.before.follows, limit).localCheckpoint(eager=False)
    empty_pairs = empty_frame(spark, "follower_id string, followee_id string")
    after, flips = before, empty_frame(spark, "followee_id string, up boolean")
    gained = lost = c_gained = c_lost = empty_pairs
    n = {"up": 0, "down": 0, "celebs_gained": 0, "celebs_lost": 0}
    if d.n["gained"] or d.n["lost"]:
        moved = d.follows.where(f"({_GAINED}) OR ({_LOST})").groupBy("followee_id")
        delta = moved.agg(F.expr(f"sum(CAST({_GAINED} AS int)) - sum(CAST({_LOST} AS int)) AS delta"))
        now = (
            d.cur_after.join(delta.select("followee_id"), "followee_id", "left_semi")
            .groupBy("followee_id")
            .count()
        )
        status = delta.join(now, "followee_id", "left").selectExpr(
            "followee_id",
            f"coalesce(count, 0) - delta > {limit} AS was",
            f"coalesce(count, 0) > {limit} AS now",
        )
        flips = status.where("was <> now").selectExpr("followee_id", "now AS up").localCheckpoint(eager=False)
        after = (
            before.join(status.select(F.col("followee_id").alias("user_id")), "user_id", "left_anti")
            .unionByName(status.where("now").select(F.col("followee_id").alias("user_id")))
            .localCheckpoint(eager=False)
        )
        stable = d.cur_after.join(flips, "followee_id").join(d.gained, keys, "left_anti")
        up, down = stable.where("up").select(*keys), stable.where("NOT up").select(*keys)
        gained = d.gained.join(_as_followee(after), "followee_id", "left_anti").unionByName(down)
        lost = d.lost.join(_as_followee(before), "followee_id", "left_anti").unionByName(up)
        c_gained = d.gained.join(_as_followee(after), "followee_id", "left_semi").unionByName(up)
        c_lost = d.lost.join(_as_followee(before), "followee_id", "left_semi").unionByName(down)
        gained, lost, c_gained, c_lost = (
            df.localCheckpoint(eager=False) for df in (gained, lost, c_gained, c_lost)
        )
        counts = _count_parts(
            [gained, lost, c_gained, c_lost, flips.where("up"), flips.where("NOT up"), after]
        )
        gained, lost, c_gained, c_lost, flips, after = (
            with_row_count(df, n)
            for df, n in zip(
                (gained, lost, c_gained, c_lost, flips, after),
                (*counts[:4], counts[4] + counts[5], counts[6]),
                strict=True,
            )
        )
        d = replace(d, gained=gained, lost=lost, n={**d.n, "gained": counts[0], "lost": counts[1]})
        n = dict(zip(["celebs_gained", "celebs_lost", "up", "down"], counts[2:6], strict=True))
    d = replace(
        d,
        after=replace(d.after, celebs=after),
        cur_before=d.cur_before.join(_as_followee(before), "followee_id", "left_anti"),
        cur_after=d.cur_after.join(_as_followee(after), "followee_id", "left_anti"),
        n={**d.n, **n},
    )
    cached = (flips, gained, lost, c_gained, c_lost) if d.n["gained"] or d.n["lost"] else ()
    return d, _Celebrities(before, after, flips, c_gained, c_lost, cached)


def _authored(
    d: _Delta, c: _Celebrities, cap: int, carry: str | None, posts: TimelinePosts | None
) -> tuple[DataFrame, DataFrame]:
    """(adds, replaces), both user_id, entries: the changes of the celebrities' authored sets. An author who became
    a celebrity, or a celebrity with a tweet that stopped being live, has the whole set recomputed (the newest
    `cap` live tweets, an empty array when none is left); a celebrity's other new tweets are added (the adds of
    `posts` when given: the same rows)."""
    spark = d.before.tweets.sparkSession
    adds = replaces = empty_frame(spark, f"user_id string, entries {ENTRIES_TYPE}")
    whole = [c.flips.where("up").select(F.col("followee_id").alias("user_id"))]
    if d.n["died"]:
        whole.append(d.died.select("user_id").join(c.after, "user_id", "left_semi"))
    authors = functools.reduce(DataFrame.unionByName, whole).distinct()
    if d.n["up"] or d.n["died"]:
        live = _live(d.after.tweets).join(authors, "user_id", "left_semi")
        top = _with_carry(_top_per_author(live, cap), carry)
        entries = F.collect_list(F.struct("ts", "tweet_id", "p")).alias("entries")
        replaces = authors.join(top.groupBy("user_id").agg(entries), "user_id", "left").select(
            "user_id", F.coalesce("entries", F.array().cast(ENTRIES_TYPE)).alias("entries")
        )
    if d.n["born"]:
        adds = posts.authored_adds if posts else _authored_adds(d.born, c.after, authors, cap, carry)
    return adds, replaces


def _authored_adds(
    born: DataFrame, celebs: DataFrame, whole: DataFrame, cap: int, carry: str | None
) -> DataFrame:
    """user_id, entries: the `born` tweets of the `celebs`, per author, the newest `cap`; authors in `whole` (their
    set is recomputed whole) left out."""
    born = born.join(celebs, "user_id", "left_semi").join(whole, "user_id", "left_anti")
    return (
        _with_carry(born, carry)
        .groupBy("user_id")
        .agg(_newest(F.collect_list(F.struct("ts", "tweet_id", "p")), cap).alias("entries"))
    )


@dataclass(frozen=True)
class TimelinePosts:
    """A batch's new tweets under a fan-out limit, planned before the batch's changes are counted: what makes a
    celebrity's tweet visible. Made for a batch of tweets only (no follows, so no author crosses the limit in it);
    the same rows as the batch's `TimelineChanges.tweets_live` and `authored_adds`."""

    tweets_live: DataFrame  # tweet_id, user_id, text, ts: tweets that became live
    authored_adds: DataFrame  # user_id, entries (ENTRIES_TYPE): add to the author's set, trim to cap


@dataclass(frozen=True)
class TimelineStep:
    """One micro-batch whose changed rows are planned but not yet computed (`begin_timeline`): `posts` (or None) can
    be published first; `finish()` counts the changes (one Spark job) and plans the rest."""

    posts: TimelinePosts | None
    _finish: Callable[[], TimelineChanges]

    def finish(self) -> TimelineChanges:
        return self._finish()


def begin_timeline(
    state: TimelineState,
    tweets_batch: DataFrame | None,
    follows_batch: DataFrame | None,
    *,
    cap: int,
    carry: str | None = None,
    fanout_limit: int | None = None,
) -> TimelineStep:
    """`maintain_timeline` in two steps (same arguments, same changes): the batch's changed rows planned, with its
    `posts` when the batch holds tweets only and a fan-out limit is set (else None); then `finish()`."""
    if fanout_limit is not None and state.celebs is None:
        state = replace(state, celebs=_celebs(state.follows, fanout_limit).localCheckpoint(eager=False))
    tc, fc = _change_rows(state, tweets_batch, follows_batch)
    present = (tweets_batch is not None, follows_batch is not None)
    posts = None
    if fanout_limit is not None and present == (True, False):
        born = _born(tc)
        replaced = tc.where(_DIED).select(F.col("user_before").alias("user_id"))
        posts = TimelinePosts(born, _authored_adds(born, state.celebs, replaced, cap, carry))
    finish = functools.partial(_finish, state, tc, fc, present, posts, cap, carry, fanout_limit)
    return TimelineStep(posts, finish)


def maintain_timeline(
    state: TimelineState,
    tweets_batch: DataFrame | None,
    follows_batch: DataFrame | None,
    *,
    cap: int,
    carry: str | None = None,
    fanout_limit: int | None = None,
) -> TimelineChanges:
    """The state after one micro-batch, and the timeline changes it causes. See the module docstring.

    `state` is not modified. `tweets_batch`: op, tweet_id, user_id, text, ts. `follows_batch`: op, follower_id,
    followee_id, ts. Either may be None when the batch has no record of that topic. Batch-sized intermediates are
    cached until `release()`; the new state is computed by `settle()` (or by the first plan that uses it), which
    must come before `release()`. `carry` (optional): the SQL text of a string expression over a tweet's columns
    `ts` and `tweet_id`, evaluated once per tweet (before the tweet is fanned out to its followers) and carried in
    each of its entries as `p`; without it `p` is null. `fanout_limit`: authors with more current followers are
    celebrities, not fanned out (None: no limit, and no celebrity plan at all).
    """
    return begin_timeline(
        state, tweets_batch, follows_batch, cap=cap, carry=carry, fanout_limit=fanout_limit
    ).finish()


def _finish(
    state: TimelineState,
    tc: DataFrame,
    fc: DataFrame,
    present: tuple[bool, bool],
    posts: TimelinePosts | None,
    cap: int,
    carry: str | None,
    fanout_limit: int | None,
) -> TimelineChanges:
    spark = state.tweets.sparkSession
    celebs_before = state.celebs if fanout_limit is not None else None
    d = _delta(state, tc, fc, present, born=posts.tweets_live if posts else None, celebs=celebs_before)
    cached = [d.tweets, d.follows]
    celebs = None
    if fanout_limit is not None:
        d, celebs = _effective(d, fanout_limit)
        cached += celebs.cached

    def timelines() -> tuple[DataFrame, DataFrame, DataFrame]:
        if d.n["died"] or d.n["lost"]:
            removes, refill, persisted = _removals(d, cap)
            cached.extend(persisted)
            return _adds(d, refill, cap, carry), removes, _replaces(d, refill, cap, carry)
        removes = empty_frame(spark, "follower_id string, tweet_id string")
        return _adds(d, None, cap, carry), removes, empty_frame(spark, _TIMELINES_SCHEMA)

    side = {}
    if celebs is not None:
        adds, whole = _authored(d, celebs, cap, carry, posts)
        side = dict(
            authored_adds=adds,
            authored_replaces=whole,
            authored_retired=celebs.flips.where("NOT up").select(F.col("followee_id").alias("user_id")),
            celebs_gained=celebs.gained,
            celebs_lost=celebs.lost,
        )
    return TimelineChanges(
        after=d.after,
        tweets_live=d.born,
        counts=dict(d.n),
        _plans={
            "timelines": timelines,
            "tweets_dead": lambda: d.died.where(~F.col("live_after")).select("tweet_id"),
            "tweet_rows": lambda: d.tweets.select(*_TWEET_COLS),
            "follow_rows": lambda: d.follows.select(*_FOLLOW_COLS),
        },
        _cached=cached,
        _settled={"before": state},
        **side,
    )
