"""`views.window` through the views that keep windows (`views.agg` for agg and count views, `views.list.rows` for
lists), on a Redis server and a Redis Cluster: sessions that merge across batches, hopping windows, `final` as the
watermark passes and `retain` removing old windows, against lines written out by hand from the definitions; and a
batch staged, partly written and then replayed in a new process (its state read from the lake) has the effect of
one."""

from __future__ import annotations

import pytest

from changelog.storage import as_lake
from views.agg import AggView
from views.frame import empty_rows, view_rows
from views.list import TopList
from views.pipeline import parse_pipeline
from views.read import export_view, query_view
from views.redis_io import connect, set_generation

PIPELINE = """\
topics:
  plays: {fields: {play_id: id, player: string, score: long, ts: timestamp}, id: play_id, time: ts}
jobs:
  arcade:
    select: {from: plays}
    views:
      streaks:
        agg: {player: player}
        window: {session: 10 s}
        retain: 15 s
        values: {plays: "count(*)", best: "max(score)"}
      points:
        count: {player: player}
        window: {tumble: 20 s}
        values: {points: score}
      tops:
        list: {player: player}
        window: {hop: 20 s, every: 10 s}
        entry: play_id
        order: [score desc, play_id desc]
        cap: 2
        fields: {score: score}
"""
S = 1_000  # a second
# (batch, its plays (id, player, score, time in s), the watermark after it in s)
BATCHES = [
    (1, [("a", "ann", 5, 1), ("b", "ann", 7, 8), ("c", "bob", 1, 3)], -9),
    (
        2,
        [("d", "ann", 2, 30), ("e", "bob", 0, 12)],
        20,
    ),  # bob's second play: 9 s after his first, one session
    (3, [("f", "ann", 9, 21), ("g", "bob", 4, 41)], 25),  # ann's 21 s joins 30 s (9 s apart), not 8 s (13 s)
    (4, [("h", "ann", 1, 52)], 45),  # ann's 8 s session (ended 18 s) is 27 s behind: retained no more
]


@pytest.fixture(scope="module")
def pipeline():
    return parse_pipeline(PIPELINE, "arcade.yml")


def _frame(spark, pipeline, plays):
    schema = empty_rows(spark, pipeline, "arcade").schema
    rows = [(i, p, s, t * S, i, 1, t * S) for i, p, s, t in plays]
    return view_rows(spark.createDataFrame(rows, schema).coalesce(1), pipeline, "arcade")


def _views(spark, lake, pipeline, redis_url):
    kw = {"append_only": True, "redis_url": redis_url, "generation": 1}
    out = [
        AggView(spark, lake, pipeline.views[n], pipeline, f"state/{n}", **kw) for n in ("streaks", "points")
    ]
    return out + [TopList(spark, lake, pipeline.views["tops"], pipeline, "state/tops", **kw)]


def _window(start: int, end: int, final: bool) -> dict:
    return {"window_start": start * S, "window_end": end * S, "final": final}


WANT = {
    "streaks": [
        {"player": "ann", "plays": 2, "best": 9, **_window(21, 40, True)},  # 21 s merged the 30 s session
        {"player": "ann", "plays": 1, "best": 1, **_window(52, 62, False)},
        {"player": "bob", "plays": 1, "best": 4, **_window(41, 51, False)},  # bob's 3-22 s: retained no more
    ],
    "points": [
        {"player": "ann", "points": 12, **_window(0, 20, True)},
        {"player": "ann", "points": 11, **_window(20, 40, True)},
        {"player": "ann", "points": 1, **_window(40, 60, False)},
        {"player": "bob", "points": 1, **_window(0, 20, True)},  # bob's 0 points at 12 s add nothing
        {"player": "bob", "points": 4, **_window(40, 60, False)},
    ],
    "tops": [
        {"player": "ann", "entries": ["b", "a"], **_window(-10, 10, True)},
        {"player": "ann", "entries": ["b", "a"], **_window(0, 20, True)},
        {"player": "ann", "entries": ["f"], **_window(10, 30, True)},
        {"player": "ann", "entries": ["f", "d"], **_window(20, 40, True)},
        {"player": "ann", "entries": ["d"], **_window(30, 50, False)},
        {"player": "ann", "entries": ["h"], **_window(40, 60, False)},
        {"player": "ann", "entries": ["h"], **_window(50, 70, False)},
        {"player": "bob", "entries": ["c"], **_window(-10, 10, True)},
        {"player": "bob", "entries": ["c", "e"], **_window(0, 20, True)},
        {"player": "bob", "entries": ["e"], **_window(10, 30, True)},
        {"player": "bob", "entries": ["g"], **_window(30, 50, False)},
        {"player": "bob", "entries": ["g"], **_window(40, 60, False)},
    ],
}


def _exports(client, pipeline) -> dict:
    return {n: list(export_view(client, n, pipeline=pipeline)) for n in WANT}


def test_windows_close_merge_and_leave_as_defined(spark, tmp_path, pipeline, redis_url):
    client = connect(redis_url)
    set_generation(client, "arcade", 1)
    views = _views(spark, as_lake(tmp_path / "lake"), pipeline, redis_url)
    for batch, plays, w in BATCHES:
        for v in views:
            v.write(_frame(spark, pipeline, plays), batch, watermark=w * S)
    got = _exports(client, pipeline)
    for name, lines in WANT.items():
        key = "player"
        want = sorted(lines, key=lambda x: f"{x[key]}|{x['window_start']}")
        assert got[name] == want, name
    assert query_view(client, "tops", f"ann|{20 * S}", pipeline=pipeline) == {
        "player": "ann",
        "generation": 1,
        "entries": [{"play_id": "f", "score": 9}, {"play_id": "d", "score": 2}],
        **_window(20, 40, True),
    }
    assert (
        query_view(client, "streaks", f"ann|{1 * S}", pipeline=pipeline) == {}
    )  # merged, then retained no more


@pytest.mark.slow
def test_a_batch_replayed_in_a_new_process_after_a_partial_write_has_the_effect_of_one(
    spark, tmp_path, pipeline, redis_url
):
    client = connect(redis_url)
    set_generation(client, "arcade", 1)
    lake = as_lake(tmp_path / "lake")
    views = _views(spark, lake, pipeline, redis_url)
    (b1, p1, w1), (b2, p2, w2), (b3, p3, w3), (b4, p4, w4) = BATCHES
    for batch, plays, w in ((b1, p1, w1), (b2, p2, w2)):
        for v in views:
            v.write(_frame(spark, pipeline, plays), batch, watermark=w * S)
    for v in views:  # batch 3 staged, the agg views' lines half written, then the driver dies
        step = v.step(_frame(spark, pipeline, p3), b3, watermark=w3 * S)
        v.stage(step)
        if isinstance(v, AggView):
            rows = step.lines.collect()
            v._send(rows[: len(rows) // 2])
    views = _views(spark, lake, pipeline, redis_url)  # a new process: the state from the lake
    for batch, plays, w in ((b3, p3, w3), (b4, p4, w4)):
        for v in views:
            v.write(_frame(spark, pipeline, plays), batch, watermark=w * S)
    got = _exports(client, pipeline)
    for name, lines in WANT.items():
        assert got[name] == sorted(lines, key=lambda x: f"{x['player']}|{x['window_start']}"), name
