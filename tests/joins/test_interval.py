"""`joins.interval.interval_join` on small in-memory DataFrames: a semantics table over several micro-batches
(matches, late rows, duplicates, closing under the watermark, outer rows), a self-join, and the state bound; its
state between steps (`joins.interval_state`): the watermark and idle rules, versions, a replayed step, pruning, in
a local lake and in one on a real HDFS."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from pyspark.sql import functions as F

from changelog.storage import as_lake, open_lake
from joins.errors import BadJoinArgument
from joins.interval import MIN_WATERMARK, JoinSide, interval_join
from joins.interval_state import IntervalProgress, IntervalSides, IntervalStore
from views.pipeline import parse_pipeline

H = 3_600_000
L_SCHEMA = "sid string, k string, ts bigint"
R_SCHEMA = "cid string, k string, ts bigint"
# A pipeline whose interval job joins topic `s` (left) with `c` (right) on `k`, right events in [l.ts, l.ts + 100]
PIPELINE = """
topics:
  s: {fields: {sid: id, k: id, text: string, ts: timestamp}, id: sid, time: ts}
  c: {fields: {cid: id, k: id, url: string, ts: timestamp}, id: cid, time: ts}
jobs:
  j:
    interval: {left: s, right: c, match: {k: k}, within: [0 ms, 100 ms]}
    views: {v: {row: {sid: sid}, fields: {n: matches}}}
"""


def _run(spark, batches, *, how="left", lower=0, upper=H, lateness=10, with_rows=False):
    """Feed `batches` [(left rows, right rows)] through the join, carrying state and the watermark
    (max ts seen - lateness) like the clicks job. Returns per batch a dict of what came out."""
    ls = rs = None
    w = MIN_WATERMARK
    max_ts = None
    out = []
    for lrows, rrows in batches:
        ldf = spark.createDataFrame(lrows, L_SCHEMA)
        rdf = spark.createDataFrame(rrows, R_SCHEMA)
        ok = [t for *_, t in lrows + rrows if t >= w]
        if ok:
            max_ts = max([max_ts or MIN_WATERMARK, *ok])
        w1 = max(w, max_ts - lateness) if max_ts is not None else w
        res = interval_join(
            JoinSide(ldf, ls, "sid"),
            JoinSide(rdf, rs, "cid"),
            on="k",
            lower_ms=lower,
            upper_ms=upper,
            how=how,
            watermark_before=w,
            watermark_after=w1,
        )
        lrows_out, rrows_out = res.left.collect(), res.right.collect()
        left = {r["sid"]: r for r in lrows_out}
        late = res.left_late.select("sid").unionByName(res.right_late.select(F.col("cid").alias("sid")))
        out.append(
            {
                "pairs": sorted((r["left"]["sid"], r["right"]["cid"]) for r in res.pairs.collect()),
                "rows": sorted(
                    (
                        (r["left"]["sid"] if r["left"] else "-", r["right"]["cid"] if r["right"] else "-")
                        for r in res.rows.collect()
                    )
                    if with_rows
                    else []
                ),
                "closed": {s: r["_matches"] for s, r in left.items() if r["_closed"]},
                "changed": {s: r["_matches"] for s, r in left.items() if r["_changed"]},
                "late": sorted(r["sid"] for r in late.collect()),
                "state": (sum(r["_keep"] for r in lrows_out), sum(r["_keep"] for r in rrows_out)),
                "w": w1,
            }
        )
        ls = spark.createDataFrame(
            [tuple(r[c] for c in res.left_state.columns) for r in lrows_out if r["_keep"]],
            res.left_state.schema,
        )
        rs = spark.createDataFrame(
            [tuple(r[c] for c in res.right_state.columns) for r in rrows_out if r["_keep"]],
            res.right_state.schema,
        )
        res.release()
        w = w1
    return out


def test_semantics_table(spark):
    # lateness 10 ms, window [s, s + 100] so that closing is visible with small numbers.
    batches = [
        # search s1 at 0; click c0 before it (no match), c1 inside, c2 on the upper bound (inclusive)
        ([("s1", "a", 0)], [("c0", "a", -1), ("c1", "a", 50), ("c2", "a", 100)]),
        # duplicate click c1 and duplicate search s1: no effect; c3 for another session: no match
        ([("s1", "a", 0)], [("c1", "a", 50), ("c3", "b", 60)]),
        # s2 arrives after its click c4 (which came in this batch too), watermark moves to 105: s1 (end 100) closes
        ([("s2", "a", 90)], [("c4", "a", 95), ("c5", "a", 115)]),
        # c6 at 50 is older than the watermark 105: late, dropped. s3 at 120 never matched.
        ([("s3", "b", 120)], [("c6", "a", 50)]),
        # ts 400 moves the watermark to 390: s2 (end 190) and s3 (end 220) close
        ([], [("c9", "z", 400)]),
    ]
    out = _run(spark, batches, upper=100, with_rows=True)
    assert out[0]["pairs"] == [("s1", "c1"), ("s1", "c2")]
    assert out[0]["changed"] == {"s1": 2} and out[0]["closed"] == {}
    assert out[1]["pairs"] == [] and out[1]["changed"] == {}
    assert out[2]["pairs"] == [("s1", "c4"), ("s2", "c2"), ("s2", "c4"), ("s2", "c5")]
    assert out[2]["w"] == 105 and out[2]["closed"] == {"s1": 3}
    assert out[3]["late"] == ["c6"] and out[3]["pairs"] == []
    assert out[4]["closed"] == {"s2": 3, "s3": 0}
    assert out[4]["rows"] == [("s3", "-")]  # left join: the unmatched closed search, once
    assert out[4]["state"] == (0, 1)  # only c9 (ts >= watermark) is kept


@pytest.mark.parametrize("how, want", [("inner", []), ("full", [("-", "c0"), ("s1", "-")])])
def test_outer_rows_by_how(spark, how, want):
    batches = [([("s1", "a", 0)], [("c0", "b", 5)]), ([], [("cz", "z", 1000)])]
    out = _run(spark, batches, how=how, upper=100, with_rows=True)
    assert [r for r in out[1]["rows"] if "-" in r] == want


def test_an_interval_after_the_row_counts_zero_matches_not_null(spark):
    """lower > 0: a row's range frame never holds the row itself and may hold no row at all; its matches are 0
    and, closed unmatched, it is an outer row once."""
    batches = [([("s1", "a", 0), ("s2", "a", 40)], [("c1", "a", 45)]), ([], [("cz", "z", 1000)])]
    out = _run(spark, batches, lower=10, upper=20, with_rows=True)
    assert out[0]["pairs"] == [] and out[0]["changed"] == {}
    # s1's end, 20, is under the first watermark, 35
    assert out[0]["closed"] == {"s1": 0} and out[1]["closed"] == {"s2": 0}
    assert [o["rows"] for o in out] == [[("s1", "-")], [("s2", "-")]]


def test_self_join_of_one_stream(spark):
    """Pairs of events of one stream within 10 ms of each other (the row with itself included)."""
    rows = [("e1", "a", 0), ("e2", "a", 5), ("e3", "a", 30)]
    df = spark.createDataFrame(rows, L_SCHEMA)
    res = interval_join(
        JoinSide(df, None, "sid"),
        JoinSide(df, None, "sid"),
        on="k",
        lower_ms=0,
        upper_ms=10,
        watermark_before=MIN_WATERMARK,
        watermark_after=MIN_WATERMARK,
    )
    got = sorted((r["left"]["sid"], r["right"]["sid"]) for r in res.pairs.collect())
    assert got == [("e1", "e1"), ("e1", "e2"), ("e2", "e2"), ("e3", "e3")]


def test_state_stays_flat_as_event_time_advances(spark):
    """A steady stream: 20 searches and 20 clicks per batch, 100 ms apart. The state holds only the rows of
    the last window + lateness, so its size stops growing after the first batches."""
    batches = []
    for b in range(5):
        base = b * 2000
        batches.append(
            (
                [(f"s{b}_{i}", f"k{i % 5}", base + i * 100) for i in range(20)],
                [(f"c{b}_{i}", f"k{i % 5}", base + i * 100 + 50) for i in range(20)],
            )
        )
    out = _run(spark, batches, upper=1000, lateness=500)
    sizes = [sum(o["state"]) for o in out]
    assert max(sizes[2:]) == min(sizes[2:]) == sizes[1]
    assert sizes[-1] < 40  # far below the 320 rows seen


def test_progress_watermark_and_idle_rule():
    p = IntervalProgress()
    assert p.saw(None, 5, 10) == MIN_WATERMARK and p.last_event_ms is None  # only late records: nothing moves
    assert p.saw(100, 1_000, 10) == 90 and (p.max_ts, p.last_event_ms) == (100, 1_000)
    assert p.saw(50, 2_000, 10) == 90 and (p.max_ts, p.last_event_ms) == (100, 2_000)
    p.watermark, p.next_close = 90, 150
    assert p.idle_watermark(2_059, 60, 10) is None  # not idle yet (timeout 60 ms after the arrival at 2_000)
    assert (
        p.idle_watermark(2_060, 60, 10) is None
    )  # idle: 100 - 10 + 60 = 150 does not pass the window end 150
    assert p.idle_watermark(2_061, 60, 10) == 151
    p.next_close = None
    assert p.idle_watermark(9_999, 60, 10) is None  # no window open: nothing to close


def _batch(spark, sides, rows):
    """Records `(topic, id, key, text, ts)` of topics `s` and `c` as one micro-batch in the stream's layout."""
    parts = []
    for i, topic in enumerate((sides.left, sides.right)):
        mine = [r[1:] for r in rows if r[0] == topic.name]
        parts.append(sides.topics.project(spark.createDataFrame(mine, topic.schema()), i))
    return parts[0].unionByName(parts[1])


@pytest.fixture(params=["local", pytest.param("hdfs", marks=pytest.mark.e2e)])
def lake(request, tmp_path):
    """A lake on the local disk, or on the session's HDFS (a directory of its own per test)."""
    if request.param == "local":
        return open_lake(tmp_path / "lake")
    return open_lake(f"{request.getfixturevalue('hdfs_server').url}/lake-{uuid.uuid4().hex[:8]}")


def test_store_steps_replay_idle_tick_and_layout(spark, lake):
    """One version per step (`v<fence>/state` + `meta.json`); a replayed step restores what its first attempt
    did and counts nothing twice; late records go to `on_late`; an idle tick is fenced after the newest version;
    versions a replay can no longer need are pruned. The same on a lake on HDFS (Spark reads and writes the rows
    by URI, the versions and their meta go through the lake): the state lives off the local disk."""
    sides = IntervalSides.of(spark, parse_pipeline(PIPELINE, "t.yml"), "j")
    key = "state/j/g1"
    store = IntervalStore(spark, as_lake(lake), key=key, sides=sides, lateness_ms=10)

    def versions() -> list[str]:
        return [e.name for e in lake.list(key) if e.name.startswith("v")]

    published, late = {}, []

    def publish(left, fence, watermark):
        got = left.where("_changed OR _closed").collect()
        published[fence] = sorted((r["sid"], r["_matches"], r["_closed"]) for r in got)

    def step(fence, rows):
        on_late = lambda rows, w0: late.append((sorted(r["_id"] for r in rows.collect()), w0))  # noqa: E731
        return store.batch_step(fence, _batch(spark, sides, rows), publish, on_late)

    one = step(1_000_000, [("s", "s1", "a", "q", 0), ("c", "c1", "a", "u", 50)] * 2)
    assert (one.counts["events"], one.counts["duplicates"], one.progress.watermark) == (4, 2, 40)
    assert (one.counts["left"], one.counts["right"]) == (2, 2)
    assert published[1_000_000] == [("s1", 1, False)]
    # c2 (ts 30 < 40) is late; ts 200 moves the watermark to 190: s1 (window end 100) closes; s3 stays open
    batch_two = [("c", "c2", "a", "u", 30), ("c", "c9", "z", "u", 200), ("s", "s3", "y", "h", 195)]
    two = step(2_000_000, batch_two)
    assert late == [(["c2"], 40)] and published[2_000_000] == [("s1", 1, True)]
    assert (two.counts["late"], two.counts["closed"], two.progress.closed) == (1, 1, 1)
    assert store.restore(2_000_000).fence == 1_000_000 and store.latest()[0] == 2_000_000
    again = step(
        2_000_000, batch_two
    )  # Spark replays batch 2 after a crash: same outcome, nothing counted twice
    arrived = again.progress.last_event_ms  # when the replay saw the batch
    assert again.counts == two.counts and again.progress == replace(two.progress, last_event_ms=arrived)
    assert step(3_000_000, []) is None
    # idle: 200 - 10 + 200 ms since the last arrival = 390 passes s3's window end (295)
    assert store.idle_step(arrived + 100, 200, publish) is None  # not idle yet
    tick = store.idle_step(arrived + 200, 200, publish)
    assert (
        tick.fence == 2_000_001
        and tick.progress.watermark == 390
        and published[2_000_001] == [("s3", 0, True)]
    )
    assert versions() == [f"v{f:020d}" for f in (1_000_000, 2_000_000, 2_000_001)]
    meta = lake.read_json(key, f"v{2_000_001:020d}", "meta.json")
    assert (meta["fence"], meta["watermark"], meta["closed"], meta["late"]) == (2_000_001, 390, 2, 1)
    # each side keeps its own columns: a left row its topic's fields, a right row only its key, id and time
    state = spark.read.schema(sides.state_schema()).parquet(lake.uri(key, f"v{2_000_000:020d}", "state"))
    kept = sorted((r["_side"], r["_id"], r["_k0"], r["_0_text"], r["_matches"]) for r in state.collect())
    assert kept == [(0, "s3", "y", "h", 0), (1, "c9", "z", None, 0)]
    assert not any(f.name.startswith("_1_") for f in state.schema.fields)
    step(4_000_000, [("c", "c10", "z", "u", 400)])  # its base is 2_000_001: older versions are dropped
    assert versions() == [f"v{f:020d}" for f in (2_000_001, 4_000_000)]


@pytest.mark.parametrize(
    "args, argument",
    [
        ({"how": "outer"}, "how"),
        ({"lower_ms": 5, "upper_ms": 4}, "lower_ms"),
        ({"watermark_before": 10, "watermark_after": 9}, "watermark_after"),
    ],
)
def test_an_argument_the_join_cannot_use_is_named(args, argument):
    kw = {"on": "k", "lower_ms": 0, "upper_ms": 1, "watermark_before": 0, "watermark_after": 0, **args}
    with pytest.raises(BadJoinArgument) as e:  # checked before either side is looked at
        interval_join(JoinSide(None, None, "sid"), JoinSide(None, None, "cid"), **kw)
    assert e.value.argument == argument and isinstance(e.value, ValueError)
