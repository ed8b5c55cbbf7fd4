"""The `list` view kind of jobs that give row changes (`views.list.rows`) against a brute force in plain Python over
the live rows: random adds, removes and moves (a select of a table: rows change and leave, so lists are refilled)
or only adds (a select of an event topic: the `top` mode), with ties, nulls and a `where`, descending and ascending
(a timestamp order); each key's list and items after every batch, and Redis holds the body of exactly the entries
some list holds; the same sequence cut into other batches gives the same lists; a batch replayed after a partial
Redis write has the effect of one; the state read back from the lake (and compacted) gives the same."""

from __future__ import annotations

import random

import pytest

from changelog.storage import as_lake
from tests.views.test_agg import _changes  # a batch's row changes from the live rows before and after it
from views.fence import Fence, raise_fence
from views.frame import check_job, empty_rows, view_rows
from views.keys import key_id, view_pattern
from views.list import TopList, export_list, list_views, read_list
from views.pipeline import parse_pipeline
from views.redis_io import connect, set_generation

FIELDS = "{%s: id, board: string, player: string, score: long, ts: timestamp}"
VIEWS = (
    "{%(p)sbest: {list: {board: board}, entry: player, order: [score desc, player desc], cap: 3, "
    'fields: {loud: "upper(player)"}, entries: players, where: "player <> \'x\'"}, '
    '%(p)sfirst: {list: {board: board}, entry: player, order: "timestamp_millis(score) asc", cap: 2, '
    'fields: {player: player, n: "length(player)"}}}'
)
PIPELINE = f"""\
topics:
  scores:
    fields: {FIELDS % "score_id"}
    optional: [board, player, score]
    id: score_id
    time: ts
  standings:
    fields: {FIELDS % "standing_id"}
    optional: [board, player, score]
    key: standing_id
    time: ts
jobs:
  score_lists:
    select: {{from: scores}}
    views: {VIEWS % {"p": "s_"}}
  standing_lists:
    select: {{from: standings}}
    views: {VIEWS % {"p": "t_"}}
"""
MODES = {
    True: "score_lists",
    False: "standing_lists",
}  # append-only (an event topic), with removals (a table)
BOARDS = ["a", "b", "c{x}|", None]
PLAYERS = ["p1", "p2", "p3", "p4", "p5", "é6", "x", None]
SCORES = [None, -3, 1, 2, 2, 5, 7, 7]

server = pytest.mark.parametrize("redis_url", ["server"], indirect=True)


@pytest.fixture(scope="module")
def pipeline():
    return parse_pipeline(PIPELINE, "scores.yml")


def _brute(live: dict, desc: bool, cap: int, where: bool) -> dict:
    """{board: [player, ...]} of the live rows ({id: (board, player, score)}): per board and player its first score,
    the first `cap` players by (score, player) in the order's direction."""
    best: dict = {}
    for board, player, score in live.values():
        if board is None or player is None or score is None or (where and player == "x"):
            continue
        seen = best.setdefault(board, {})
        if player not in seen or (score > seen[player] if desc else score < seen[player]):
            seen[player] = score
    out = {}
    for board, seen in sorted(best.items(), key=lambda x: x[0].encode()):
        ranked = sorted(seen.items(), key=lambda x: (x[1], x[0].encode()), reverse=desc)
        out[board] = [p for p, _ in ranked[:cap]]
    return out


def _want(live: dict) -> dict:
    return {"best": _brute(live, True, 3, True), "first": _brute(live, False, 2, False)}


def _assert_lists(client, pipeline, job, live):
    """Every list view of `job` equals the brute force: export, each key's items, and the bodies Redis holds are
    exactly those of the entries some list holds."""
    for name, want in _want(live).items():
        view = _view(pipeline, job, name)
        got = {x["board"]: x[view.entries] for x in export_list(client, view)}
        assert got == want, name
        for board, players in want.items():
            items = read_list(client, view, board)[view.items_name]
            if name == "best":
                assert items == [{"player": p, "loud": p.upper()} for p in players]
            else:
                assert items == [{"player": p, "n": len(p)} for p in players]
        held = {p for players in want.values() for p in players}
        bodies = {key_id(k) for k in client.scan_iter(match=view_pattern(f"{view.name}.entry", 1))}
        assert bodies == held, name


def _view(pipeline, job, name):
    return next(v for v in pipeline.jobs[job].views if v.name.endswith(name))


def _ops(rng, n: int, append_only: bool) -> list[tuple[str, tuple | None]]:
    """`n` operations (id, row or None: removed) on a table (or only new events when `append_only`)."""
    live, ops, next_id = set(), [], 0
    for _ in range(n):
        row = (rng.choice(BOARDS), rng.choice(PLAYERS), rng.choice(SCORES))
        if append_only or not live or rng.random() < 0.45:
            ident, next_id = f"t{next_id}", next_id + 1
            live.add(ident)
            ops.append((ident, row))
        elif rng.random() < 0.5:
            ident = rng.choice(sorted(live))
            live.discard(ident)
            ops.append((ident, None))
        else:
            ops.append((rng.choice(sorted(live)), row))  # moved or changed: removed, then added again
    return ops


def _frame(spark, pipeline, job, changes):
    schema = empty_rows(spark, pipeline, job).schema
    rows = [(ident, *row, 5, ident, sign, 5) for ident, sign, row in changes]
    return view_rows(spark.createDataFrame(rows, schema).coalesce(1), pipeline, job)


def _lists(spark, lake, pipeline, redis_url, append_only, **kw) -> list[TopList]:
    job = MODES[append_only]
    return [
        TopList(
            spark,
            as_lake(lake),
            v,
            pipeline,
            f"state/{job}/g1/views/{v.name}",
            append_only=append_only,
            redis_url=redis_url,
            generation=1,
            **kw,
        )
        for v in pipeline.jobs[job].views
    ]


def _apply(ops, live) -> dict:
    out = dict(live)
    for ident, row in ops:
        out.pop(ident, None) if row is None else out.__setitem__(ident, row)
    return out


def _run(spark, pipeline, views, ops, size, *, check=None, first=1, live=None):
    """Apply `ops` in batches of `size` through every view of `views` (batch ids from `first`, the live rows before
    them `live`); `check(live)` after each batch. Returns the live rows after them."""
    job = views[0].view.job
    live = dict(live or {})
    for n, i in enumerate(range(0, len(ops), size)):
        chunk = ops[i : i + size]
        after = _apply(chunk, live)
        frame = _frame(spark, pipeline, job, _changes(live, after, [x for x, _ in chunk]))
        for v in views:
            v.write(frame, first + n)
        live = after
        if check:
            check(live)
    return live


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
@pytest.mark.slow
def test_every_list_equals_the_brute_force_after_every_batch(
    spark, tmp_path, pipeline, redis_url, append_only
):
    job = MODES[append_only]
    client = connect(redis_url)
    set_generation(client, job, 1)
    views = _lists(spark, tmp_path, pipeline, redis_url, append_only)
    ops = _ops(random.Random(7 + append_only), 36, append_only)
    _run(spark, pipeline, views, ops, 12, check=lambda live: _assert_lists(client, pipeline, job, live))


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
@pytest.mark.slow
def test_the_same_sequence_cut_into_other_batches_gives_the_same_lists(
    spark, tmp_path, pipeline, redis_url, append_only
):
    job = MODES[append_only]
    client = connect(redis_url)
    ops = _ops(random.Random(11), 20, append_only)
    seen = []
    for size in (20, 7):
        client.flushdb()
        set_generation(client, job, 1)
        views = _lists(spark, tmp_path / str(size), pipeline, redis_url, append_only)
        live = _run(spark, pipeline, views, ops, size)
        seen.append([list(export_list(client, v.view)) for v in views])
        _assert_lists(client, pipeline, job, live)
    assert seen[0] == seen[1]


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
@pytest.mark.slow
def test_a_replayed_batch_after_a_partial_write_has_the_effect_of_one(
    spark, tmp_path, pipeline, redis_url, append_only
):
    """Batch 3 is staged and its first write phase (and part of its lists) applied, then the driver dies (no
    advance); Spark replays batch 3: in the same process, or in a new one (state read from the lake), with the same
    changes or, once the job's own state recorded the batch, with none of them. Each way the lists are those of one
    application."""
    job = MODES[append_only]
    client = connect(redis_url)
    ops = _ops(random.Random(5), 30, append_only)
    for replay in ("same process", "new process", "new process, no rows"):
        client.flushdb()
        set_generation(client, job, 1)
        lake = tmp_path / replay.replace(" ", "_").replace(",", "")
        views = _lists(spark, lake, pipeline, redis_url, append_only)
        live = _run(spark, pipeline, views, ops[:20], 20)  # batch 1
        after = _apply(ops[20:], live)
        changes = _frame(spark, pipeline, job, _changes(live, after, [x for x, _ in ops[20:]]))
        for v in views:
            step = v.step(changes, 3)
            v.stage(step)
            bodies, lists = (step.ops.where(f"_phase = {i}").drop("_phase") for i in (0, 1))
            # the bodies and half of the lists, then the driver dies
            v.sink.write([(bodies, 1), (lists.orderBy("id").limit(max(1, lists.count() // 2)), 1)], 3)
        if replay != "same process":
            views = _lists(spark, lake, pipeline, redis_url, append_only)
        if replay.endswith("no rows"):
            changes = _frame(spark, pipeline, job, [])
        for v in views:
            v.write(changes, 3)
        _assert_lists(client, pipeline, job, after)
        for v in views:  # and the next batch goes on from there
            v.write(_frame(spark, pipeline, job, []), 4)
        _assert_lists(client, pipeline, job, after)


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
@pytest.mark.slow
def test_a_new_process_reads_the_state_from_the_lake_compacted_or_not(
    spark, tmp_path, pipeline, redis_url, append_only
):
    job = MODES[append_only]
    client = connect(redis_url)
    set_generation(client, job, 1)
    ops = _ops(random.Random(3), 24, append_only)
    first = _lists(spark, tmp_path, pipeline, redis_url, append_only, snapshot_every=2)
    live = _run(spark, pipeline, first, ops[:12], 4)  # batches 1-3, compacted into s2 before batch 3
    assert any(e.name.startswith("s") for e in first[0].lake.list(first[0].root))
    again = _lists(spark, tmp_path, pipeline, redis_url, append_only, snapshot_every=2)
    check = lambda live: _assert_lists(client, pipeline, job, live)  # noqa: E731
    _run(spark, pipeline, again, ops[12:], 6, check=check, first=4, live=live)


# (case, batches of (id, (board, player, score) or None: removed), the `best` list of board "K" after them)
SEMANTICS = [
    ("ties in the order: by the entry, descending", [[("1", ("K", "p1", 5)), ("2", ("K", "p3", 5))]], ["p3", "p1"]),
    ("one entry from two rows: once, at its first order value", [[("1", ("K", "p1", 2)), ("2", ("K", "p1", 7))]], ["p1"]),
    (
        "the first entry leaves: refilled from the key's other rows",
        [[("1", ("K", "p1", 9)), ("2", ("K", "p2", 8)), ("3", ("K", "p3", 7)), ("4", ("K", "p4", 1))], [("1", None)]],
        ["p2", "p3", "p4"],
    ),
    (
        "a row moves to another key: refilled here",
        [[("1", ("K", "p1", 9)), ("2", ("K", "p2", 8)), ("3", ("K", "p3", 7)), ("4", ("K", "p4", 1))],
         [("2", ("K2", "p2", 8))]],
        ["p1", "p3", "p4"],
    ),
    (
        "the entry's best row leaves: its next row places it",
        [[("1", ("K", "p1", 9)), ("2", ("K", "p1", 1)), ("3", ("K", "p2", 5))], [("1", None)]],
        ["p2", "p1"],
    ),
    ("null key, entry, order and a row where fails: nowhere", [[("1", (None, "p1", 1)), ("2", ("K", None, 1)), ("3", ("K", "p1", None)), ("4", ("K", "x", 3))]], []),
    ("the last row leaves: the list is gone", [[("1", ("K", "p1", 1))], [("1", None)]], []),
]  # fmt: skip


@pytest.fixture(scope="module")
def semantics(spark, redis_server, tmp_path_factory, pipeline):
    """Every case of `SEMANTICS` run at once (case n's batch i in batch i, its boards `K` -> `k<n>`, `K2` ->
    `k<n>b`): {board: [player, ...]} of the `best` list, checked against the brute force as a whole too."""
    url = redis_server["url"].rpartition("/")[0] + "/9"
    client = connect(url)
    client.flushdb()
    job = MODES[False]
    set_generation(client, job, 1)
    views = _lists(spark, tmp_path_factory.mktemp("semantics"), pipeline, url, False)
    boards = lambda n, row: None if row is None else ({"K": f"k{n}", "K2": f"k{n}b"}.get(row[0]), *row[1:])  # noqa: E731
    cases = [
        [[(f"c{n}.{i}", boards(n, r)) for i, r in b] for b in batches]
        for n, (_, batches, _) in enumerate(SEMANTICS)
    ]
    live: dict = {}
    for i in range(max(len(c) for c in cases)):
        ops = [op for c in cases if i < len(c) for op in c[i]]
        live = _run(spark, pipeline, views, ops, len(ops), first=i + 1, live=live)
    _assert_lists(client, pipeline, job, live)
    out = {x["board"]: x["players"] for x in export_list(client, views[0].view)}
    client.flushdb()
    return out


@pytest.mark.parametrize("n", range(len(SEMANTICS)), ids=[c for c, _, _ in SEMANTICS])
def test_semantics(semantics, n):
    _, _, want = SEMANTICS[n]
    assert semantics.get(f"k{n}", []) == want


def test_list_views_of_each_job_kind(spark, tmp_path, pipeline, redis_server_url):
    made = list_views(spark, as_lake(tmp_path), pipeline, "score_lists", "state/s", append_only=True,
                      redis_url=redis_server_url, generation=1)  # fmt: skip
    assert [v.view.name for v in made] == ["s_best", "s_first"] and made[0].root.endswith("views/s_best/top")
    check_job(spark, pipeline, "score_lists")


@pytest.mark.parametrize("redis_url", ["cluster"], indirect=True)
def test_on_a_redis_cluster(spark, tmp_path, pipeline, redis_url):
    job = MODES[False]
    client = connect(redis_url)
    set_generation(client, job, 1)
    raise_fence(client, Fence(job, 1))
    views = _lists(spark, tmp_path, pipeline, redis_url, False, fence=Fence(job, 1))
    ops = _ops(random.Random(13), 30, False)
    _run(spark, pipeline, views, ops, 15, check=lambda live: _assert_lists(client, pipeline, job, live))
