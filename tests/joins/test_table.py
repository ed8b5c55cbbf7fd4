"""The `join` kind at the DataFrame level (`joins.table`, `joins.table_list`): how many Spark jobs one micro-batch's
join step runs, semantics tables (a batch, the state earlier batches left, the changes it causes) for the built-in
timeline's list shape and for the join's delta, the same events in different micro-batches giving the same state and
lists, and randomized workloads of other shapes through both list paths against a brute force of the contract's
definitions. (The built-in job is tested end to end in tests/jobs/test_timeline.py.)"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from joins.sparkapi import plan_text, size_estimate
from joins.state import empty_frame, with_row_count
from joins.table import TableJoin, TableState, begin_join, maintain_join, side_changes, state_schema
from joins.table_list import generic_list
from views.list import generic_spec, list_shape
from views.pipeline import load_pipeline, parse_pipeline

BUILTIN = Path(__file__).resolve().parents[2] / "timeline_demo" / "pipelines" / "builtin.yml"
_TWEETS = "op string, tweet_id string, user_id string, text string, ts bigint"
_FOLLOWS = "op string, follower_id string, followee_id string, ts bigint"


def _builtin(spark, cap: int, limit: int | None = None):
    """(join, list shape) of the built-in timeline job with `cap` and fan-out `limit`."""
    env = {"TIMELINE_CAP": str(cap), "FANOUT_LIMIT": "" if limit is None else str(limit)}
    p = load_pipeline(BUILTIN, env)
    job = p.jobs["timeline"]
    join = TableJoin(spark, *p.sides("timeline"), job.spec.match)
    return join, list_shape(join, job.views[0])


def _empty_state(join) -> TableState:
    return TableState(tuple(empty_frame(join.spark, state_schema(t)) for t in join.topics))


def _batch(spark, rows: list[tuple], schema: str):
    """A batch as the job hands it over: read once into the JVM (a local checkpoint), None when empty."""
    return spark.createDataFrame(rows, schema).localCheckpoint() if rows else None


@pytest.mark.slow
def test_one_batch_of_both_topics_runs_two_spark_jobs(spark):
    """The join step of a batch with tweets and follows runs one Spark job that counts both topics' changes, and
    `settle` one that materializes both state tables (a Spark job is a round of driver planning and scheduling).
    Broadcast joins are off here: a broadcast is a Spark job of its own inside the action that needs it."""
    join, shape = _builtin(spark, 10)
    state = TableState(
        (
            spark.createDataFrame(
                [("t1", "a", "x", 1, True, False), ("t2", "b", "y", 2, True, False)],
                state_schema(join.topics[0]),
            ).localCheckpoint(),
            spark.createDataFrame(
                [("u1", "a", 1, True, False)], state_schema(join.topics[1])
            ).localCheckpoint(),
        )
    )
    tweets = spark.createDataFrame([("post", "t3", "a", "z", 3), ("delete", "t2", "b", None, 4)], _TWEETS)
    follows = spark.createDataFrame([("follow", "u1", "b", 5), ("unfollow", "u2", "a", 5)], _FOLLOWS)
    sc = spark.sparkContext
    sc.setJobGroup("timeline-join-step", "maintain_join of one batch")
    tracker = sc.statusTracker()
    threshold = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")

    def jobs():
        ids = tracker.getJobIdsForGroup("timeline-join-step")
        return [tracker.getStageInfo(s).name for j in ids for s in tracker.getJobInfo(j).stageIds], len(ids)

    try:
        changes = maintain_join(join, state, (tweets, follows), [shape])
        stages, n_join = jobs()
        assert n_join == 1, stages
        changes.settle()
        stages, n_all = jobs()
        assert n_all == 2, stages
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", threshold)
    assert changes.lists["timeline"].counts == {"born": 1, "fanned": 1, "died": 1, "gained": 1, "lost": 0}
    after = changes.settle()
    assert sorted(r.tweet_id for r in after.sides[0].collect()) == ["t1", "t2", "t3"]
    assert sorted((r.follower_id, r.followee_id) for r in after.sides[1].collect()) == [
        ("u1", "a"),
        ("u1", "b"),
        ("u2", "a"),
    ]


# --- Semantics table: the changes one micro-batch causes, given the state the earlier batches left. ---
# Events: ("post"|"delete", tweet_id, author, ts) and ("follow"|"unfollow", follower, followee, ts).
# Expected: adds / replaces {follower: [(tweet_id, ts), ...]}, removes {follower: [tweet_id, ...]}, live / dead
# [tweet_id, ...] (the tweets that became live / stopped being live); what a case does not name is empty.


def _step(spark, join, shape, state: TableState, events: list[tuple], cap: int | None = None):
    tweets = [
        (op, a, b, f"{a}!" if op == "post" else None, ts)
        for op, a, b, ts in events
        if op in ("post", "delete")
    ]
    follows = [e for e in events if e[0] in ("follow", "unfollow")]
    if cap is not None:
        shape = replace(shape, cap=cap)
    batches = (_batch(spark, tweets, _TWEETS), _batch(spark, follows, _FOLLOWS))
    return maintain_join(join, state, batches, [shape])


def _per_key(df, value) -> dict:
    out: dict = {}
    for r in df.collect():
        out.setdefault(r._k, []).extend(value(r))
    return {f: sorted(v) for f, v in out.items()}


def _observed(changes) -> dict:
    lists = changes.lists["timeline"]

    def entries(r):
        return [(e._e, e._o) for e in r.entries]

    return {
        "adds": _per_key(lists.adds, entries),
        "removes": _per_key(lists.removes, lambda r: [r._e]),
        "replaces": _per_key(lists.replaces, entries),
        "live": sorted(r.tweet_id for r in lists.entries_live.collect()),
        "dead": sorted(r._e for r in lists.entries_dead.collect()),
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
        "a later follow of a current pair changes no timeline",
        [[("post", "t1", "a", 1), ("follow", "r", "a", 5)]],
        [("follow", "r", "a", 7)],
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


def _topics_of(events: list[tuple]) -> frozenset:
    return frozenset("tweets" if e[0] in ("post", "delete") else "follows" for e in events)


def _own(n: int, events: list[tuple]) -> list[tuple]:
    """Case `n`'s events under ids of its own: every tweet id and user prefixed `c<n>_`."""
    return [(op, f"c{n}_{a}", f"c{n}_{b}", ts) for op, a, b, ts in events]


def _case_part(observed: dict, n: int) -> dict:
    """The part of `observed` that is case `n`'s, its ids unprefixed (the order of each list kept)."""
    p = f"c{n}_"

    def strip(v):
        return (v[0].removeprefix(p), *v[1:]) if isinstance(v, tuple) else v.removeprefix(p)

    out: dict = {}
    for k, got in observed.items():
        if isinstance(got, dict):
            out[k] = {f.removeprefix(p): [strip(v) for v in vs] for f, vs in got.items() if f.startswith(p)}
        else:
            out[k] = [strip(v) for v in got if v.startswith(p)]
    return out


@pytest.fixture(scope="module")
def timeline_cases(spark) -> dict:
    """Every case of `_CASES` run together with the cases of its cap whose earlier batches and batch hold the same
    topics (so that each batch takes the path it takes alone: tweets only, follows only or both), each under ids
    of its own: {case index: the changes its batch caused}."""
    groups: dict = {}
    for n, (_, earlier, batch, cap, _) in enumerate(_CASES):
        groups.setdefault((cap, tuple(map(_topics_of, earlier)), _topics_of(batch)), []).append(n)
    out = {}
    for (cap, earlier, _), cases in groups.items():
        join, shape = _builtin(spark, cap)
        state = _empty_state(join)
        for i in range(len(earlier)):
            events = [e for n in cases for e in _own(n, _CASES[n][1][i])]
            state = _step(spark, join, shape, state, events).settle()
        observed = _observed(
            _step(spark, join, shape, state, [e for n in cases for e in _own(n, _CASES[n][2])])
        )
        out.update({n: _case_part(observed, n) for n in cases})
    return out


@pytest.mark.parametrize("n", range(len(_CASES)), ids=[c[0] for c in _CASES])
def test_a_batch_changes_the_timelines_as_the_definition_says(timeline_cases, n):
    expected = _CASES[n][4]
    got = timeline_cases[n]
    want = {k: expected.get(k, {} if k in ("adds", "removes", "replaces") else []) for k in got}
    assert got == want


def _apply(lists: dict, changes, cap: int) -> None:
    """What the view does with one batch's changes: replace, remove, add, keep the newest `cap`."""
    for r in changes.replaces.collect():
        lists[r._k] = {(e._o, e._e) for e in r.entries}
    removes = {(r._k, r._e) for r in changes.removes.collect()}
    for k, entries in lists.items():
        lists[k] = {e for e in entries if (k, e[1]) not in removes}
    for r in changes.adds.collect():
        lists.setdefault(r._k, set()).update((e._o, e._e) for e in r.entries)
    for k, entries in lists.items():
        lists[k] = set(sorted(entries, reverse=True)[:cap])


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
    join, shape = _builtin(spark, cap)
    bounds = [0, *cuts, len(_EVENTS)]
    state, timelines = _empty_state(join), {}
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        changes = _step(spark, join, shape, state, _EVENTS[lo:hi])
        _apply(timelines, changes.lists["timeline"], cap)
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
    # (tweet_id, user_id, text, ts, upsert seen, remove seen)
    assert sorted(map(tuple, state.sides[0].collect())) == [
        ("t1", "a", "t1!", 10, True, False),
        ("t2", "a", "t2!", 9, True, True),
        ("t3", "b", "t3!", 4, True, False),
        ("t4", "a", "t4!", 7, True, False),
    ]
    # (follower_id, followee_id, ts, an upsert decides, a remove decides)
    assert sorted(map(tuple, state.sides[1].collect())) == [
        ("r", "a", 1, True, False),
        ("r", "b", 5, True, False),
        ("s", "a", 8, False, True),
        ("s", "b", 3, True, False),
    ]


@pytest.mark.slow
def test_an_author_crossing_the_fanout_limit_turns_their_pairs_into_effective_losses_then_gains(spark):
    """FANOUT_LIMIT 1: a second follower makes `a` heavy: r's pair stops being effective (its entries are removed),
    the heavy entries are made whole, r and s gain `a` as a heavy value. An unfollow brings `a` back to one follower:
    s's pair becomes effective (backfilled), both heavy pairs end, the heavy entries are retired."""
    join, shape = _builtin(spark, 5, limit=1)

    def pairs(df):
        return sorted((r._k, r._m) for r in df.collect())

    first = _step(
        spark,
        join,
        shape,
        _empty_state(join),
        [("follow", "r", "a", 1), ("post", "t1", "a", 2), ("post", "t2", "a", 3)],
    )
    assert _observed(first)["adds"] == {"r": [("t1", 2), ("t2", 3)]}
    up = _step(spark, join, shape, first.settle(), [("follow", "s", "a", 4)])
    counts = up.lists["timeline"].counts
    assert {k: counts[k] for k in ("gained", "lost", "up", "down", "heavy_gained")} == {
        "gained": 0,
        "lost": 1,
        "up": 1,
        "down": 0,
        "heavy_gained": 2,
    }
    assert _observed(up)["removes"] == {"r": ["t1", "t2"]} and not _observed(up)["adds"]
    replaces = up.lists["timeline"].heavy_replaces.collect()
    assert [(r._m, sorted(e._e for e in r.entries)) for r in replaces] == [("a", ["t1", "t2"])]
    assert pairs(up.lists["timeline"].heavy_gained) == [("r", "a"), ("s", "a")]
    down = _step(spark, join, shape, up.settle(), [("unfollow", "r", "a", 5)])
    assert _observed(down)["adds"] == {"s": [("t1", 2), ("t2", 3)]} and not _observed(down)["removes"]
    assert pairs(down.lists["timeline"].heavy_lost) == [("r", "a"), ("s", "a")]
    assert [r._m for r in down.lists["timeline"].heavy_retired.collect()] == ["a"]


@pytest.mark.slow
def test_a_batch_of_tweets_only_under_a_fanout_limit_has_its_posts_before_its_changes_are_counted(spark):
    """`begin_join` plans a tweets-only batch's posts without counting anything: the tweets that became live and the
    heavy values' adds, the same rows `finish()` gives. A heavy value whose entries are recomputed whole (`c`: a
    delete) is left out of the adds; a batch with follows, or no fan-out limit, has no posts."""
    join, shape = _builtin(spark, 5, limit=1)
    follows = [("follow", u, a, 1) for u, a in (("r", "a"), ("s", "a"), ("r", "c"), ("s", "c"), ("r", "b"))]
    posts = [("post", "t1", "a", "t1!", 1), ("post", "t3", "c", "t3!", 2)]
    batches = (_batch(spark, posts, _TWEETS), _batch(spark, follows, _FOLLOWS))
    state = maintain_join(join, _empty_state(join), batches, [shape]).settle()
    tweets = [
        ("post", "t5", "a", "t5!", 5),
        ("post", "t6", "b", "t6!", 6),
        ("post", "t7", "c", "t7!", 7),
        ("delete", "t3", "c", None, 8),
    ]
    batch, sc = _batch(spark, tweets, _TWEETS), spark.sparkContext
    sc.setJobGroup("timeline-begin", "begin_join of one batch")
    threshold = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")  # a broadcast would be a job of its own
    try:
        step = begin_join(join, state, (batch, None), [shape])
        assert spark.sparkContext.statusTracker().getJobIdsForGroup("timeline-begin") == []
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", threshold)

    def heavy(df):
        return {r._m: sorted(e._e for e in r.entries) for r in df.collect()}

    posted = step.posts["timeline"]
    assert sorted(r.tweet_id for r in posted.entries_live.collect()) == ["t5", "t6", "t7"]
    assert heavy(posted.heavy_adds) == {"a": ["t5"]}
    changes = step.finish()
    lists = changes.lists["timeline"]
    assert sorted(r.tweet_id for r in lists.entries_live.collect()) == ["t5", "t6", "t7"]
    assert heavy(lists.heavy_adds) == {"a": ["t5"]}
    assert heavy(lists.heavy_replaces) == {"c": ["t7"]}
    assert (lists.counts["born"], lists.counts["fanned"]) == (3, 1)  # t6: b is not heavy
    assert _observed(changes)["adds"] == {"r": [("t6", 6)]}
    one_follow = _batch(spark, [("follow", "s", "b", 9)], _FOLLOWS)
    both = (_batch(spark, tweets, _TWEETS), one_follow)
    assert begin_join(join, state, both, [shape]).posts["timeline"] is None
    no_limit = replace(shape, fanout_limit=None)
    assert (
        begin_join(join, state, (_batch(spark, tweets, _TWEETS), None), [no_limit]).posts["timeline"] is None
    )


def test_a_batch_of_celebrity_tweets_only_does_not_read_the_follows(spark):
    """Under a fan-out limit, entries whose match values are all heavy reach no list on write: the batch's list adds
    are an empty plan, which reads no state (a heavy value's million list-side rows are not scanned for each of its
    entries), while its heavy entries get them."""
    join, shape = _builtin(spark, 5, limit=1)
    follows = [("follow", u, "a", 1) for u in ("r", "s")] + [("follow", "r", "b", 1)]
    state = maintain_join(
        join, _empty_state(join), (None, _batch(spark, follows, _FOLLOWS)), [shape]
    ).settle()
    tweets = [("post", "t1", "a", "t1!", 2), ("post", "t2", "a", "t2!", 3)]
    changes = maintain_join(join, state, (_batch(spark, tweets, _TWEETS), None), [shape])
    lists = changes.lists["timeline"]
    assert (lists.counts["born"], lists.counts["fanned"]) == (2, 0)
    plan = plan_text(lists.adds)
    assert "LogicalRDD" not in plan and "Relation" not in plan.replace("LocalRelation", ""), plan
    assert _observed(changes)["adds"] == {}
    assert [sorted(e._e for e in r.entries) for r in lists.heavy_adds.collect()] == [["t1", "t2"]]


@pytest.mark.slow
def test_the_state_size_estimate_follows_its_rows_so_small_batches_stay_broadcast_joins(spark):
    """After every batch the state is a local checkpoint of the state joined with the batch; its size estimate is made
    from its row count (not carried over from that join), so after many one-tweet batches the next batch's change
    query still broadcasts the batch's side instead of shuffling the whole state."""
    join, shape = _builtin(spark, 5, limit=1)

    def batch(rows, schema):  # the job's batch has an estimate from its files; a test's, from its row count
        return with_row_count(_batch(spark, rows, schema), len(rows))

    follows = [("follow", f"f{i}", "a", 1) for i in range(3)]
    state = maintain_join(join, _empty_state(join), (None, batch(follows, _FOLLOWS)), [shape]).settle()
    for n in range(15):
        one = batch([("post", f"t{n}", "a", "x", n)], _TWEETS)
        state = maintain_join(join, state, (one, None), [shape]).settle()
    assert state.sides[0].count() == 15 and size_estimate(state.sides[0]) < 10_000
    plan = side_changes(join.topics[0], state.sides[0], batch([("post", "t99", "a", "x", 99)], _TWEETS))
    executed = plan_text(plan, "executed")
    assert "BroadcastHashJoin" in executed and "SortMergeJoin" not in executed


# --- Any two table topics: the join's delta, and both list paths, against the contract's definitions. ---

_SHAPES = """
topics:
  items:
    fields: {item: id, grp: id, score: long, label: string, ts: timestamp}
    optional: [label]
    key: item
    time: ts
    op: {upsert: put, remove: del}
    final_deletes: FINAL
  members:
    fields: {user: id, grp: id, role: string, ts: timestamp}
    optional: [role]
    key: [user, grp]
    time: ts
    op: {upsert: join, remove: leave}
jobs:
  j:
    join: {left: items, right: members, match: {grp: grp}}
    views:
      feed: {list: {user: user}, entry: item, order: [ts desc, item desc], cap: 3, fields: {item: item, score: score}}
      oldest: {list: {user: members.user}, entry: item, order: [score asc, item asc], cap: 2,
               fields: {item: item, label: label}}
      feed_where: {list: {user: user}, entry: item, order: [ts desc, item desc], cap: 2, where: "score > 1",
                   fields: {item: item, score: score}}
      by_group: {list: {grp: grp}, entry: item, order: [score desc, item desc], cap: 2, fields: {item: item}}
      by_role: {list: {role: role}, entry: item, order: [ts asc, item asc], cap: 3, fields: {item: item, ts: ts}}
      per_member: {row: {item: item}, fields: {user: user}}
"""


def _shapes(final: bool = True):
    return parse_pipeline(_SHAPES.replace("FINAL", "true" if final else "false"), "shapes.yml")


def test_which_list_path_each_shape_takes(spark):
    """The list shape's own algorithm for a key over one side and the other side's key as the entry (in any naming,
    in either direction); the delta path for a `where`, a key over the entry's side, or a key that, with the match,
    does not identify the list side's row."""
    p = _shapes()
    join = TableJoin(spark, *p.sides("j"), p.jobs["j"].spec.match)
    views = {v.name: v for v in p.jobs["j"].views}
    shape = list_shape(join, views["oldest"])
    assert (shape.side, shape.entry_side, shape.descending) == (1, 0, False)
    assert list_shape(join, views["feed"]).side == 1
    for name in ("feed_where", "by_group", "by_role"):
        assert list_shape(join, views[name]) is None
    unique = {n: generic_spec(join, views[n]).unique_pairs for n in ("feed_where", "by_group", "by_role")}
    assert unique == {"feed_where": True, "by_group": False, "by_role": False}
    spec = generic_spec(join, views["by_group"])
    assert (spec.key_side, spec.entry_side) == (0, 0)


def _frame(spark, topic, records: list[dict]):
    if not records:
        return None
    cols = [n for n, _ in topic.columns()]
    return spark.createDataFrame(
        [tuple(r.get(c) for c in cols) for r in records], topic.schema()
    ).localCheckpoint()


def _pairs_of(df) -> dict:
    return {r._id: (r._s0.asDict(), r._s1.asDict()) for r in df.collect()}


_I = {"op": "put", "label": None}
_M = {"op": "join", "role": None}
_DELTA_CASES = [
    # (id, earlier batches, the batch, removed pairs, added pairs) - a pair: (item, user)
    (
        "an item joins every member of its group",
        [[], [("m", "u1", "g", 1), ("m", "u2", "g", 1)]],
        [("i", "a", "g", 5)],
        [],
        [("a", "u1"), ("a", "u2")],
    ),
    (
        "a member joins every item of the group",
        [[("i", "a", "g", 1), ("i", "b", "g", 2), ("i", "c", "h", 3)], []],
        [("m", "u1", "g", 5)],
        [],
        [("a", "u1"), ("b", "u1")],
    ),
    (
        "an item moving to another group leaves one pair and enters another",
        [[("i", "a", "g", 1)], [("m", "u1", "g", 1), ("m", "u2", "h", 1)]],
        [("i", "a", "h", 5)],
        [("a", "u1")],
        [("a", "u2")],
    ),
    (
        "a changed item is removed with its old values and added with its new ones",
        [[("i", "a", "g", 1)], [("m", "u1", "g", 1)]],
        [("i", "a", "g", 7)],
        [("a", "u1")],
        [("a", "u1")],
    ),
    (
        "a member's later join changes its row in every pair",
        [[("i", "a", "g", 1)], [("m", "u1", "g", 1)]],
        [("m", "u1", "g", 3)],
        [("a", "u1")],
        [("a", "u1")],
    ),
    (
        "a leave removes the member's pairs",
        [[("i", "a", "g", 1), ("i", "b", "g", 1)], [("m", "u1", "g", 1)]],
        [("l", "u1", "g", 2)],
        [("a", "u1"), ("b", "u1")],
        [],
    ),
    (
        "a delete removes the item's pairs",
        [[("i", "a", "g", 1)], [("m", "u1", "g", 1), ("m", "u2", "g", 1)]],
        [("d", "a", None, 2)],
        [("a", "u1"), ("a", "u2")],
        [],
    ),
    (
        "an item and a member in one batch give their pair once",
        [],
        [("i", "a", "g", 1), ("m", "u1", "g", 1)],
        [],
        [("a", "u1")],
    ),
    (
        "a duplicate changes nothing",
        [[("i", "a", "g", 1)], [("m", "u1", "g", 1)]],
        [("i", "a", "g", 1)],
        [],
        [],
    ),
    (
        "an older change changes nothing",
        [[("i", "a", "g", 5)], [("m", "u1", "g", 5)]],
        [("i", "a", "h", 4), ("l", "u1", "g", 4)],
        [],
        [],
    ),
    (
        "a deleted item never comes back",
        [[("d", "a", None, 9)], [("m", "u1", "g", 1)]],
        [("i", "a", "g", 10)],
        [],
        [],
    ),
]


def _delta_records(events) -> tuple[list, list]:
    items = [
        {**_I, "item": a, "grp": g, "score": 1, "ts": ts} if k == "i" else {"op": "del", "item": a, "ts": ts}
        for k, a, g, ts in events
        if k in "id"
    ]
    members = [
        {**_M, "user": u, "grp": g, "ts": ts, "op": "join" if k == "m" else "leave"}
        for k, u, g, ts in events
        if k in "ml"
    ]
    return items, members


def _own_delta(n: int, events: list[tuple]) -> list[tuple]:
    """Case `n`'s events under ids of its own: every item, user and group prefixed `c<n>_`."""
    return [(k, f"c{n}_{a}", None if g is None else f"c{n}_{g}", ts) for k, a, g, ts in events]


@pytest.fixture(scope="module")
def delta_cases(spark) -> dict:
    """Every case of `_DELTA_CASES` run together with the cases whose earlier batches and batch hold the same topics
    (so that each batch takes the path it takes alone), each under ids of its own: {case index: its batch's removed
    and added pairs, the added rows' ids, and the (key, user) rows a row view of the job makes of the added rows}."""
    from views.frame import select_view, view_rows

    p = _shapes()
    join = TableJoin(spark, *p.sides("j"), p.jobs["j"].spec.match)
    view = next(v for v in p.jobs["j"].views if v.name == "per_member")

    def topics(events):
        return frozenset("items" if e[0] in "id" else "members" for e in events)

    def frames(events):
        items, members = _delta_records(events)
        return _frame(spark, join.topics[0], items), _frame(spark, join.topics[1], members)

    groups: dict = {}
    for n, (_, earlier, batch, _, _) in enumerate(_DELTA_CASES):
        groups.setdefault((tuple(map(topics, earlier)), topics(batch)), []).append(n)
    out = {}
    for (earlier, _), cases in groups.items():
        state = TableState(tuple(empty_frame(spark, state_schema(t)) for t in join.topics))
        for i in range(len(earlier)):
            events = [e for n in cases for e in _own_delta(n, _DELTA_CASES[n][1][i])]
            state = maintain_join(join, state, frames(events)).settle()
        changes = maintain_join(
            join, state, frames([e for n in cases for e in _own_delta(n, _DELTA_CASES[n][2])])
        )
        removed, added = _pairs_of(changes.removed), _pairs_of(changes.added)
        rows = view_rows(join.frame_rows(changes.added), p, "j")
        viewed = [(r["_key"], r["user"]) for r in select_view(rows, view, p).collect()]
        for n in cases:
            own = f"c{n}_"

            def pairs(df_pairs, own=own):
                return sorted(
                    (s0["item"].removeprefix(own), s1["user"].removeprefix(own))
                    for s0, s1 in df_pairs.values()
                    if s0["item"].startswith(own)
                )

            out[n] = {
                "removed": pairs(removed),
                "added": pairs(added),
                "ids": [i for i, (s0, _) in added.items() if s0["item"].startswith(own)],
                "viewed": sorted(
                    (k.removeprefix(own), u.removeprefix(own)) for k, u in viewed if k.startswith(own)
                ),
            }
    return out


@pytest.mark.parametrize("n", range(len(_DELTA_CASES)), ids=[c[0] for c in _DELTA_CASES])
def test_the_delta_removes_and_adds_exactly_the_joined_rows_a_batch_changes(delta_cases, n):
    _, _, _, removed, added = _DELTA_CASES[n]
    got = delta_cases[n]
    assert (got["removed"], got["added"]) == (sorted(removed), sorted(added))
    assert all(i.startswith('["') for i in got["ids"])  # the left key and the right key, as a JSON array
    # a row view of the job evaluates its expressions on the delta's rows (`views.frame`'s layout)
    assert got["viewed"] == sorted(added)


def _workload(rng: random.Random, events: int = 90) -> list[tuple[str, dict]]:
    """(topic, record) arrivals over few keys and times (ties), with removes and duplicates."""
    out = []
    for _ in range(events):
        ts = rng.randrange(1, 25)
        if rng.random() < 0.5:
            item = f"i{rng.randrange(14)}"
            if rng.random() < 0.15:
                out.append(("items", {"op": "del", "item": item, "ts": ts}))
            else:
                label = rng.choice([None, "x", "y"])
                rec = {
                    "op": "put",
                    "item": item,
                    "grp": f"g{rng.randrange(4)}",
                    "score": rng.randrange(4),
                    "ts": ts,
                }
                out.append(("items", {**rec, "label": label}))
        else:
            op = "leave" if rng.random() < 0.25 else "join"
            rec = {"op": op, "user": f"u{rng.randrange(5)}", "grp": f"g{rng.randrange(4)}", "ts": ts}
            out.append(("members", {**rec, "role": rng.choice([None, "a", "b"])}))
    out += rng.sample(out, 8)  # delivered twice
    rng.shuffle(out)
    return out


def _current_join(p, arrivals) -> dict:
    """The inner join of the current tables by the contract's rule (`timeline_demo.brute.current_table`), by pair
    identity: {json [item, user, grp]: (item row, member row)}."""
    import json

    from timeline_demo.brute import current_table, validate

    items = current_table(p.topic("items"), (validate(p.topic(t), r) for t, r in arrivals if t == "items"))
    members = current_table(
        p.topic("members"), (validate(p.topic(t), r) for t, r in arrivals if t == "members")
    )
    names = {t: p.topic(t).names for t in ("items", "members")}
    out = {}
    for (item,), i in items.items():
        for (user, grp), m in members.items():
            if i["grp"] == m["grp"]:
                row = ({n: i[n] for n in names["items"]}, {n: m[n] for n in names["members"]})
                out[json.dumps([item, user, grp], separators=(",", ":"))] = row
    return out


@pytest.mark.parametrize("final, seed", [(True, 1), (False, 2)], ids=["final deletes", "latest wins"])
def test_the_delta_applied_batch_after_batch_is_the_join_of_the_current_tables(spark, final, seed):
    """A random workload cut into batches at random: the join's rows kept by applying each batch's removed then added
    rows equal, after every batch, the inner join of the current tables computed from the records so far."""
    p = _shapes(final)
    join = TableJoin(spark, *p.sides("j"), p.jobs["j"].spec.match)
    rng = random.Random(seed)
    arrivals = _workload(rng)
    cuts = sorted(rng.sample(range(1, len(arrivals)), 4))
    state, rows = TableState(tuple(empty_frame(spark, state_schema(t)) for t in join.topics)), {}
    for lo, hi in zip([0, *cuts], [*cuts, len(arrivals)], strict=True):
        part = arrivals[lo:hi]
        batches = tuple(_frame(spark, t, [r for n, r in part if n == t.name]) for t in join.topics)
        changes = maintain_join(join, state, batches)
        removed, added = _pairs_of(changes.removed), _pairs_of(changes.added)
        assert set(removed) <= set(rows), f"seed {seed}: removed rows that were not there"
        assert not set(added) & (set(rows) - set(removed)), f"seed {seed}: added rows that were there"
        rows = {k: v for k, v in rows.items() if k not in removed} | added
        assert rows == _current_join(p, arrivals[:hi]), f"seed {seed}, records {hi}"
        state = changes.settle()
        changes.release()


def _lists_after(lists: dict, bodies: dict, got, cap: int, descending: bool) -> None:
    """What the view does with one batch's list changes: replace, remove, add, keep the first `cap`; bodies."""
    for r in got.replaces.collect():
        lists[r._k] = {(e._o, e._e) for e in r.entries}
    removes = {(r._k, r._e) for r in got.removes.collect()}
    for k, entries in lists.items():
        lists[k] = {e for e in entries if (k, e[1]) not in removes}
    for r in got.adds.collect():
        lists.setdefault(r._k, set()).update((e._o, e._e) for e in r.entries)
    for k, entries in lists.items():
        lists[k] = set(sorted(entries, key=lambda e: (e[0], e[1].encode()), reverse=descending)[:cap])
    for r in got.bodies.collect() if hasattr(got, "bodies") else []:
        if r._b is None:
            bodies.pop(r._e, None)
        else:
            bodies[r._e] = r._b


@pytest.mark.parametrize("seed, chunks", [(3, 1), (4, 3), (5, 4)])
@pytest.mark.slow
def test_both_list_paths_equal_the_definition_for_any_arrival_order_and_chunking(spark, seed, chunks):
    """Every list view of the shapes' job (two of the list shape, three by the delta: a `where`, a key over the
    entry's side with (key, entry) repeated, a key over the other side), maintained batch after batch from random
    arrivals cut into `chunks` batches, equals the brute force's lists after every batch; the delta path's bodies
    are those of the entries listed."""
    import json

    from timeline_demo.brute import batches_of, brute_force

    p = _shapes(final=seed % 2 == 1)
    join = TableJoin(spark, *p.sides("j"), p.jobs["j"].spec.match)
    views = [v for v in p.jobs["j"].views if v.kind == "list"]
    shapes = [s for s in (list_shape(join, v) for v in views) if s]
    generic = {v.name: generic_spec(join, v, body="to_json(named_struct('item', item))") for v in views}
    rng = random.Random(seed)
    arrivals = _workload(rng)
    cuts = sorted(rng.sample(range(1, len(arrivals)), chunks - 1))
    state = TableState(tuple(empty_frame(spark, state_schema(t)) for t in join.topics))
    lists = {v.name: {} for v in views}
    bodies = {v.name: {} for v in views}
    for lo, hi in zip([0, *cuts], [*cuts, len(arrivals)], strict=True):
        part = arrivals[lo:hi]
        batches = tuple(_frame(spark, t, [r for n, r in part if n == t.name]) for t in join.topics)
        changes = maintain_join(join, state, batches, shapes)
        for v in views:
            got = changes.lists.get(v.name) or generic_list(changes, generic[v.name])
            _lists_after(lists[v.name], bodies[v.name], got, v.cap, v.order[0][1])
        want = brute_force(p, batches_of(arrivals[:hi]))
        for v in views:
            key_order = sorted(lists[v.name], key=lambda k: k.encode())
            entries = [
                {
                    v.key_name: k,
                    v.entries: [
                        e
                        for _, e in sorted(
                            lists[v.name][k], key=lambda e: (e[0], e[1].encode()), reverse=v.order[0][1]
                        )
                    ],
                }
                for k in key_order
                if lists[v.name][k]
            ]
            assert entries == want.export(v.name), f"{v.name}, seed {seed}, records {hi}"
            if list_shape(join, v) is None:
                listed = {e for line in entries for e in line[v.entries]}
                assert listed <= set(bodies[v.name]), f"{v.name}: bodies missing"
                assert all(json.loads(bodies[v.name][e]) == {"item": e} for e in listed)
        state = changes.settle()
        changes.release()
