"""The timeline join at the DataFrame level: how many Spark jobs one micro-batch's join step runs, a semantics
table (a batch, the state earlier batches left, the changes it causes), and the same events in different
micro-batches giving the same state and timelines. (The job is tested end to end against the SQL definition in
tests/jobs/test_timeline.py.)"""

from __future__ import annotations

import pytest

from joins.state import empty_frame
from joins.table_table import FOLLOW_STATE_SCHEMA, TWEET_STATE_SCHEMA, TimelineState, maintain_timeline


def test_one_batch_of_both_topics_runs_two_spark_jobs(spark):
    """The join step of a batch with tweets and follows runs one Spark job that counts both topics' changes, and
    `settle` one that materializes both state tables (a Spark job is a round of driver planning and scheduling).
    Broadcast joins are off here: a broadcast is a Spark job of its own inside the action that needs it."""
    state = TimelineState(
        tweets=spark.createDataFrame(
            [("t1", "a", "x", 1, True, False), ("t2", "b", "y", 2, True, False)], TWEET_STATE_SCHEMA
        ).localCheckpoint(),
        follows=spark.createDataFrame([("u1", "a", "follow", 1)], FOLLOW_STATE_SCHEMA).localCheckpoint(),
    )
    tweets = spark.createDataFrame(
        [("post", "t3", "a", "z", 3), ("delete", "t2", "b", None, 4)],
        "op string, tweet_id string, user_id string, text string, ts bigint",
    )
    follows = spark.createDataFrame(
        [("follow", "u1", "b", 5), ("unfollow", "u2", "a", 5)],
        "op string, follower_id string, followee_id string, ts bigint",
    )
    sc = spark.sparkContext
    sc.setJobGroup("timeline-join-step", "maintain_timeline of one batch")
    tracker = sc.statusTracker()
    threshold = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")

    def jobs():
        ids = tracker.getJobIdsForGroup("timeline-join-step")
        return [tracker.getStageInfo(s).name for j in ids for s in tracker.getJobInfo(j).stageIds], len(ids)

    try:
        changes = maintain_timeline(state, tweets, follows, cap=10)
        stages, n_join = jobs()
        assert n_join == 1, stages
        changes.settle()
        stages, n_all = jobs()
        assert n_all == 2, stages
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", threshold)
    assert changes.counts == {"born": 1, "fanned": 1, "died": 1, "gained": 1, "lost": 0}
    after = changes.settle()
    assert sorted(r.tweet_id for r in after.tweets.collect()) == ["t1", "t2", "t3"]
    assert sorted((r.follower_id, r.followee_id) for r in after.follows.collect()) == [
        ("u1", "a"),
        ("u1", "b"),
        ("u2", "a"),
    ]


# --- Semantics table: the changes one micro-batch causes, given the state the earlier batches left. ---
# Events: ("post"|"delete", tweet_id, author, ts) and ("follow"|"unfollow", follower, followee, ts).
# Expected: adds / replaces {follower: [(tweet_id, ts), ...]}, removes {follower: [tweet_id, ...]}, live / dead
# [tweet_id, ...] (the tweets that became live / stopped being live); what a case does not name is empty.

_TWEETS = "op string, tweet_id string, user_id string, text string, ts bigint"
_FOLLOWS = "op string, follower_id string, followee_id string, ts bigint"


def _empty_state(spark) -> TimelineState:
    return TimelineState(
        tweets=empty_frame(spark, TWEET_STATE_SCHEMA), follows=empty_frame(spark, FOLLOW_STATE_SCHEMA)
    )


def _batch(spark, rows: list[tuple], schema: str):
    """A batch as the job hands it over: read once into the JVM (a local checkpoint), None when empty."""
    return spark.createDataFrame(rows, schema).localCheckpoint() if rows else None


def _step(spark, state: TimelineState, events: list[tuple], cap: int):
    tweets = [
        (op, a, b, f"{a}!" if op == "post" else None, ts)
        for op, a, b, ts in events
        if op in ("post", "delete")
    ]
    follows = [e for e in events if e[0] in ("follow", "unfollow")]
    return maintain_timeline(
        state,
        _batch(spark, tweets, _TWEETS),
        _batch(spark, follows, _FOLLOWS),
        cap=cap,
    )


def _per_follower(df, value) -> dict:
    out: dict = {}
    for r in df.collect():
        out.setdefault(r.follower_id, []).extend(value(r))
    return {f: sorted(v) for f, v in out.items()}


def _observed(changes) -> dict:
    def entries(r):
        return [(e.tweet_id, e.ts) for e in r.entries]

    return {
        "adds": _per_follower(changes.adds, entries),
        "removes": _per_follower(changes.removes, lambda r: [r.tweet_id]),
        "replaces": _per_follower(changes.replaces, entries),
        "live": sorted(r.tweet_id for r in changes.tweets_live.collect()),
        "dead": sorted(r.tweet_id for r in changes.tweets_dead.collect()),
    }


_CASES = [
    # (id, earlier batches, the batch, cap, expected changes)
    (
        "post by a followed author is added to each follower",
        [[("follow", "r", "a", 1), ("follow", "s", "a", 1)]],
        [("post", "t1", "a", 5)],
        5,
        {"adds": {"r": [("t1", 5)], "s": [("t1", 5)]}, "live": ["t1"]},
    ),
    (
        "post by an unfollowed author adds nothing",
        [[("follow", "r", "a", 1)]],
        [("post", "t1", "b", 5)],
        5,
        {"live": ["t1"]},
    ),
    (
        "delete of a live tweet removes it",
        [[("follow", "r", "a", 1), ("post", "t1", "a", 5)]],
        [("delete", "t1", "a", 6)],
        5,
        {"removes": {"r": ["t1"]}, "dead": ["t1"]},
    ),
    (
        "delete before post is a tombstone",
        [[("follow", "r", "a", 1), ("delete", "t1", "a", 6)]],
        [("post", "t1", "a", 5)],
        5,
        {},
    ),
    (
        "delete and post in one batch is a tombstone",
        [[("follow", "r", "a", 1)]],
        [("post", "t1", "a", 5), ("delete", "t1", "a", 1)],
        5,
        {},
    ),
    (
        "duplicate post changes nothing",
        [[("follow", "r", "a", 1), ("post", "t1", "a", 5)]],
        [("post", "t1", "a", 5)],
        5,
        {},
    ),
    (
        "second post of an id with a greater ts moves it",
        [[("follow", "r", "a", 1), ("post", "t1", "a", 5)]],
        [("post", "t1", "a", 9)],
        5,
        {"removes": {"r": ["t1"]}, "adds": {"r": [("t1", 9)]}, "live": ["t1"]},
    ),
    (
        "second post of an id with a smaller ts changes nothing",
        [[("follow", "r", "a", 1), ("post", "t1", "a", 5)]],
        [("post", "t1", "a", 3)],
        5,
        {},
    ),
    (
        "follow backfills the followee's newest cap live tweets",
        [[("post", f"t{i}", "a", i) for i in range(1, 5)] + [("delete", "t4", "a", 9)]],
        [("follow", "r", "a", 10)],
        2,
        {"adds": {"r": [("t2", 2), ("t3", 3)]}},
    ),
    (
        "follow and post of the followee in one batch add the tweet once",
        [],
        [("follow", "r", "a", 1), ("post", "t1", "a", 2)],
        5,
        {"adds": {"r": [("t1", 2)]}, "live": ["t1"]},
    ),
    (
        "unfollow removes the followee's tweets",
        [[("follow", "r", "a", 1), ("post", "t1", "a", 2), ("post", "t2", "a", 3), ("post", "t3", "b", 4)]],
        [("unfollow", "r", "a", 4)],
        5,
        {"removes": {"r": ["t1", "t2"]}},
    ),
    (
        "unfollow older than the follow changes nothing",
        [[("follow", "r", "a", 5), ("post", "t1", "a", 2)]],
        [("unfollow", "r", "a", 4)],
        5,
        {},
    ),
    (
        "follow and unfollow with equal ts in one batch: unfollow wins",
        [[("post", "t1", "a", 1)]],
        [("follow", "r", "a", 5), ("unfollow", "r", "a", 5)],
        5,
        {},
    ),
    (
        "unfollow with the follow's ts retracts it",
        [[("post", "t1", "a", 1), ("follow", "r", "a", 5)]],
        [("unfollow", "r", "a", 5)],
        5,
        {"removes": {"r": ["t1"]}},
    ),
    (
        "follow with the unfollow's ts changes nothing",
        [[("post", "t1", "a", 1), ("unfollow", "r", "a", 5)]],
        [("follow", "r", "a", 5)],
        5,
        {},
    ),
    (
        "a full timeline losing an entry is replaced with the next newest",
        [[("follow", "r", "a", 0), ("post", "t1", "a", 1), ("post", "t2", "a", 2), ("post", "t3", "a", 3)]],
        [("delete", "t3", "a", 9)],
        2,
        {"replaces": {"r": [("t1", 1), ("t2", 2)]}, "dead": ["t3"]},
    ),
    (
        "a full timeline losing a followee is replaced with what is left",
        [
            [("follow", "r", "a", 0), ("follow", "r", "b", 0)]
            + [("post", f"t{i}", "ab"[i > 1], i) for i in (1, 2, 3)]
        ],
        [("unfollow", "r", "b", 4)],
        2,
        {"replaces": {"r": [("t1", 1)]}},
    ),
    (
        "a replaced timeline gets no separate adds",
        [[("follow", "r", "a", 0), ("post", "t1", "a", 1), ("post", "t2", "a", 2), ("post", "t3", "a", 3)]],
        [("delete", "t3", "a", 9), ("post", "t4", "a", 4)],
        2,
        {"replaces": {"r": [("t2", 2), ("t4", 4)]}, "live": ["t4"], "dead": ["t3"]},
    ),
    (
        "a full timeline losing its last followee is replaced with nothing",
        [[("follow", "r", "a", 0), ("post", "t1", "a", 1), ("post", "t2", "a", 2)]],
        [("unfollow", "r", "a", 3)],
        1,
        {"replaces": {"r": []}},
    ),
]


@pytest.mark.parametrize("earlier, batch, cap, expected", [c[1:] for c in _CASES], ids=[c[0] for c in _CASES])
def test_a_batch_changes_the_timelines_as_the_definition_says(spark, earlier, batch, cap, expected):
    state = _empty_state(spark)
    for events in earlier:
        state = _step(spark, state, events, cap).settle()
    got = _observed(_step(spark, state, batch, cap))
    want = {k: expected.get(k, {} if k in ("adds", "removes", "replaces") else []) for k in got}
    assert got == want


def _apply(timelines: dict, changes, cap: int) -> None:
    """What the view does with one batch's changes: replace, remove, add, keep the newest `cap`."""
    for r in changes.replaces.collect():
        timelines[r.follower_id] = {(e.ts, e.tweet_id) for e in r.entries}
    removes = {(r.follower_id, r.tweet_id) for r in changes.removes.collect()}
    for f, entries in timelines.items():
        timelines[f] = {e for e in entries if (f, e[1]) not in removes}
    for r in changes.adds.collect():
        timelines.setdefault(r.follower_id, set()).update((e.ts, e.tweet_id) for e in r.entries)
    for f, entries in timelines.items():
        timelines[f] = set(sorted(entries, reverse=True)[:cap])


_EVENTS = [
    ("follow", "r", "a", 1),
    ("post", "t1", "a", 2),
    ("post", "t2", "a", 3),
    ("follow", "s", "a", 2),
    ("post", "t3", "b", 4),
    ("follow", "r", "b", 5),
    ("delete", "t2", "a", 6),
    ("post", "t4", "a", 7),
    ("unfollow", "s", "a", 8),
    ("post", "t2", "a", 9),  # after its delete: stays deleted
    ("follow", "s", "b", 3),
    ("post", "t1", "a", 10),  # moves t1
]


@pytest.mark.parametrize(
    "cuts", [(), (4, 8), (1, 2, 6, 7, 11)], ids=["one batch", "three batches", "six batches"]
)
def test_a_batch_chunked_any_way_gives_the_same_state_and_timelines(spark, cuts):
    from timeline_demo.reference import expected_timelines

    cap = 2
    bounds = [0, *cuts, len(_EVENTS)]
    state, timelines = _empty_state(spark), {}
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        changes = _step(spark, state, _EVENTS[lo:hi], cap)
        _apply(timelines, changes, cap)
        state = changes.settle()
    tweets = [
        {"op": op, "tweet_id": t, "user_id": u, "text": f"{t}!", "ts": ts}
        for op, t, u, ts in _EVENTS
        if op in ("post", "delete")
    ]
    follows = [
        {"op": op, "follower_id": a, "followee_id": b, "ts": ts}
        for op, a, b, ts in _EVENTS
        if op in ("follow", "unfollow")
    ]
    got = {f: [t for _, t in sorted(e, reverse=True)] for f, e in sorted(timelines.items()) if e}
    assert got == expected_timelines(tweets, follows, cap) == {"r": ["t1", "t4"], "s": ["t3"]}
    assert sorted(map(tuple, state.tweets.collect())) == [
        ("t1", "a", "t1!", 10, True, False),
        ("t2", "a", "t2!", 9, True, True),
        ("t3", "b", "t3!", 4, True, False),
        ("t4", "a", "t4!", 7, True, False),
    ]
    assert sorted(map(tuple, state.follows.collect())) == [
        ("r", "a", "follow", 1),
        ("r", "b", "follow", 5),
        ("s", "a", "unfollow", 8),
        ("s", "b", "follow", 3),
    ]


def test_an_author_crossing_the_fanout_limit_turns_their_pairs_into_effective_losses_then_gains(spark):
    """FANOUT_LIMIT 1: a second follower makes `a` a celebrity: r's pair stops being effective (its entries are
    removed), the authored set is made whole, r and s gain `a` as a celebrity. An unfollow brings `a` back to one
    follower: s's pair becomes effective (backfilled), both celebrity pairs end, the authored set is retired."""

    def step(state, events):
        tweets = [(op, t, u, f"{t}!", ts) for op, t, u, ts in events if op in ("post", "delete")]
        follows = [e for e in events if e[0] in ("follow", "unfollow")]
        return maintain_timeline(
            state,
            _batch(spark, tweets, _TWEETS),
            _batch(spark, follows, _FOLLOWS),
            cap=5,
            fanout_limit=1,
        )

    def pairs(df):
        return sorted((r.follower_id, r.followee_id) for r in df.collect())

    first = step(
        _empty_state(spark), [("follow", "r", "a", 1), ("post", "t1", "a", 2), ("post", "t2", "a", 3)]
    )
    assert _observed(first)["adds"] == {"r": [("t1", 2), ("t2", 3)]}
    up = step(first.settle(), [("follow", "s", "a", 4)])
    assert {k: up.counts[k] for k in ("gained", "lost", "up", "down", "celebs_gained")} == {
        "gained": 0,
        "lost": 1,
        "up": 1,
        "down": 0,
        "celebs_gained": 2,
    }
    assert _observed(up)["removes"] == {"r": ["t1", "t2"]} and not _observed(up)["adds"]
    assert [(r.user_id, sorted(e.tweet_id for e in r.entries)) for r in up.authored_replaces.collect()] == [
        ("a", ["t1", "t2"])
    ]
    assert pairs(up.celebs_gained) == [("r", "a"), ("s", "a")]
    down = step(up.settle(), [("unfollow", "r", "a", 5)])
    assert _observed(down)["adds"] == {"s": [("t1", 2), ("t2", 3)]} and not _observed(down)["removes"]
    assert pairs(down.celebs_lost) == [("r", "a"), ("s", "a")]
    assert [r.user_id for r in down.authored_retired.collect()] == ["a"]


def test_a_batch_of_tweets_only_under_a_fanout_limit_has_its_posts_before_its_changes_are_counted(spark):
    """`begin_timeline` plans a tweets-only batch's posts without counting anything: the tweets that became live
    and the celebrities' authored adds, the same rows `finish()` gives. A celebrity whose set is recomputed whole
    (`c`: a delete) is left out of the adds; a batch with follows, or no fan-out limit, has no posts."""
    from joins.table_table import begin_timeline

    follows = [("follow", u, a, 1) for u, a in (("r", "a"), ("s", "a"), ("r", "c"), ("s", "c"), ("r", "b"))]
    posts = [("post", "t1", "a", "t1!", 1), ("post", "t3", "c", "t3!", 2)]
    state = maintain_timeline(
        _empty_state(spark),
        _batch(spark, posts, _TWEETS),
        _batch(spark, follows, _FOLLOWS),
        cap=5,
        fanout_limit=1,
    ).settle()
    tweets = [
        ("post", "t5", "a", "t5!", 5),
        ("post", "t6", "b", "t6!", 6),
        ("post", "t7", "c", "t7!", 7),
        ("delete", "t3", "c", None, 8),
    ]
    batch, sc = _batch(spark, tweets, _TWEETS), spark.sparkContext
    sc.setJobGroup("timeline-begin", "begin_timeline of one batch")
    threshold = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")  # a broadcast would be a job of its own
    try:
        step = begin_timeline(state, batch, None, cap=5, fanout_limit=1)
        assert spark.sparkContext.statusTracker().getJobIdsForGroup("timeline-begin") == []
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", threshold)

    def authored(df):
        return {r.user_id: sorted(e.tweet_id for e in r.entries) for r in df.collect()}

    assert sorted(r.tweet_id for r in step.posts.tweets_live.collect()) == ["t5", "t6", "t7"]
    assert authored(step.posts.authored_adds) == {"a": ["t5"]}
    changes = step.finish()
    assert sorted(r.tweet_id for r in changes.tweets_live.collect()) == ["t5", "t6", "t7"]
    assert authored(changes.authored_adds) == {"a": ["t5"]}
    assert authored(changes.authored_replaces) == {"c": ["t7"]}
    assert (changes.counts["born"], changes.counts["fanned"]) == (3, 1)  # t6: b is no celebrity
    assert _observed(changes)["adds"] == {"r": [("t6", 6)]}
    one_follow = _batch(spark, [("follow", "s", "b", 9)], _FOLLOWS)
    assert (
        begin_timeline(state, _batch(spark, tweets, _TWEETS), one_follow, cap=5, fanout_limit=1).posts is None
    )
    assert begin_timeline(state, _batch(spark, tweets, _TWEETS), None, cap=5).posts is None


def test_a_batch_of_celebrity_tweets_only_does_not_read_the_follows(spark):
    """Under a fan-out limit, tweets whose authors are all celebrities reach no follower's timeline on write: the
    batch's timeline adds are an empty plan, which reads no state (a celebrity's million follow pairs are not
    scanned for each of their tweets), while their authored set gets them."""
    follows = [("follow", u, "a", 1) for u in ("r", "s")] + [("follow", "r", "b", 1)]
    state = maintain_timeline(
        _empty_state(spark), None, _batch(spark, follows, _FOLLOWS), cap=5, fanout_limit=1
    ).settle()
    tweets = [("post", "t1", "a", "t1!", 2), ("post", "t2", "a", "t2!", 3)]
    changes = maintain_timeline(state, _batch(spark, tweets, _TWEETS), None, cap=5, fanout_limit=1)
    assert (changes.counts["born"], changes.counts["fanned"]) == (2, 0)
    plan = changes.adds._jdf.queryExecution().optimizedPlan().toString()
    assert "LogicalRDD" not in plan and "Relation" not in plan.replace("LocalRelation", ""), plan
    assert _observed(changes)["adds"] == {}
    assert [sorted(e.tweet_id for e in r.entries) for r in changes.authored_adds.collect()] == [["t1", "t2"]]


def test_the_state_size_estimate_follows_its_rows_so_small_batches_stay_broadcast_joins(spark):
    """After every batch the state is a local checkpoint of the state joined with the batch; its size estimate is made
    from its row count (not carried over from that join), so after many one-tweet batches the next batch's change
    query still broadcasts the batch's side instead of shuffling the whole state."""
    from joins.state import with_row_count
    from joins.table_table import _tweet_changes

    def batch(rows, schema):  # the job's batch has an estimate from its files; a test's, from its row count
        return with_row_count(_batch(spark, rows, schema), len(rows))

    def estimate(df):
        return df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()

    follows = [("follow", f"f{i}", "a", 1) for i in range(3)]
    state = maintain_timeline(
        _empty_state(spark), None, batch(follows, _FOLLOWS), cap=5, fanout_limit=1
    ).settle()
    for n in range(15):
        one = batch([("post", f"t{n}", "a", "x", n)], _TWEETS)
        state = maintain_timeline(state, one, None, cap=5, fanout_limit=1).settle()
    assert state.tweets.count() == 15 and estimate(state.tweets) < 10_000
    plan = _tweet_changes(state.tweets, batch([("post", "t99", "a", "x", 99)], _TWEETS))
    executed = plan._jdf.queryExecution().executedPlan().toString()
    assert "BroadcastHashJoin" in executed and "SortMergeJoin" not in executed
