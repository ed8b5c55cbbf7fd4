"""The `agg` view kind against a brute force in plain Python over the live rows: random adds, removes and re-adds
with ties and nulls over several batches (a select of a table: rows change and leave; a select of an event topic:
append-only), each key's export line after every batch; the same sequence cut into other batches gives the same
lines; a batch written twice (a replay after a partial Redis write) has the effect of one; the state read back
from the lake (and compacted) gives the same; a semantics table of aggregate x case; the read side; the checks of
`views.frame.check_job`."""

from __future__ import annotations

import math
import random

import pytest

from changelog.storage import as_lake
from views.agg import AggView, export_aggs, query_agg
from views.errors import Fenced
from views.fence import Fence, raise_fence
from views.frame import ExpressionError, check_job, empty_rows, view_rows
from views.pipeline import parse_pipeline
from views.read import export_view, query_view
from views.redis_io import connect, set_generation

VALUES = (
    'rides: "count(*)", riders: "count(distinct rider)", rated: "count(rating)", fare_sum: "sum(fare)", '
    'fare_min: "min(fare)", fare_max: "max(fare)", fare_avg: "avg(fare)", rating_sum: "sum(rating)", '
    'first_rider: "min(rider)", last_ts: "max(ts)", cheap: "sum(if(fare < 10, 1, 0))", '
    'ratings: "count(distinct rating)", paid: "sum(fare > 5)"'
)
FIELDS = "{%s: id, city: string, rider: string, fare: double, rating: long, ts: timestamp}"
PIPELINE = f"""\
topics:
  rides:
    fields: {FIELDS % "ride_id"}
    optional: [city, rider, fare, rating]
    id: ride_id
    time: ts
  trips:
    fields: {FIELDS % "trip_id"}
    optional: [city, rider, fare, rating]
    key: trip_id
    time: ts
jobs:
  ride_stats:
    select: {{from: rides}}
    views:
      rides_by_city: {{agg: {{city: city}}, where: "rider <> 'x'", values: {{{VALUES}}}}}
  trip_stats:
    select: {{from: trips}}
    views:
      trips_by_city: {{agg: {{city: city}}, where: "rider <> 'x'", values: {{{VALUES}}}}}
"""
# (job, view) of each mode: append-only (an event topic's select), with removals (a table's select)
MODES = {True: ("ride_stats", "rides_by_city"), False: ("trip_stats", "trips_by_city")}
CITIES = ["a", "b", "c", "d{x}|", None]
RIDERS = ["r1", "r2", "r3", "x", None]
FARES = [None, 0.25, 2.5, 2.5, 7.75, 10.0, 12.0]
RATINGS = [None, 1, 3, 3, 5]

server = pytest.mark.parametrize("redis_url", ["server"], indirect=True)


@pytest.fixture(scope="module")
def pipeline():
    return parse_pipeline(PIPELINE, "rides.yml")


def _brute(live: dict) -> dict:
    """Every key's export line over the live rows ({id: (city, rider, fare, rating, ts)}), by key."""
    groups: dict = {}
    for city, rider, fare, rating, ts in live.values():
        if city is not None and rider is not None and rider != "x":
            groups.setdefault(city, []).append((rider, fare, rating, ts))
    out = {}
    for city, rows in sorted(groups.items()):
        fares = [f for _, f, _, _ in rows if f is not None]
        ratings = [r for _, _, r, _ in rows if r is not None]
        out[city] = {
            "city": city,
            "rides": len(rows),
            "riders": len({r for r, _, _, _ in rows}),
            "rated": len(ratings),
            "fare_sum": sum(fares) if fares else None,
            "fare_min": min(fares, default=None),
            "fare_max": max(fares, default=None),
            "fare_avg": sum(fares) / len(fares) if fares else None,
            "rating_sum": sum(ratings) if ratings else None,
            "first_rider": min(r for r, _, _, _ in rows),
            "last_ts": max(t for _, _, _, t in rows),
            "cheap": sum(1 for f in fares if f < 10),
            "ratings": len(set(ratings)),
            "paid": sum(1 for f in fares if f > 5) if fares else None,
        }
    return out


def _same(got: dict, want: dict) -> bool:
    """Equal lines: the same names in the same order, the same types, floats within a relative 1e-9."""
    if list(got) != list(want):
        return False
    for k, w in want.items():
        g = got[k]
        if isinstance(w, float):
            if not (isinstance(g, float) and math.isclose(g, w, rel_tol=1e-9)):
                return False
        elif type(g) is not type(w) or g != w:
            return False
    return True


def _assert_lines(client, view, live):
    got = {line["city"]: line for line in export_aggs(client, view)}
    want = _brute(live)
    assert list(got) == list(want)
    bad = [k for k in want if not _same(got[k], want[k])]
    assert not bad, [(got[k], want[k]) for k in bad]


def _row(rng):
    return (
        rng.choice(CITIES),
        rng.choice(RIDERS),
        rng.choice(FARES),
        rng.choice(RATINGS),
        rng.choice([5, 9, 9]),
    )


def _ops(rng, n: int, append_only: bool) -> list[tuple[str, tuple | None]]:
    """`n` operations (id, row or None: removed) on a table (or only new events when `append_only`)."""
    live, ops, next_id = set(), [], 0
    for _ in range(n):
        if append_only or not live or rng.random() < 0.45:
            ident, next_id = f"t{next_id}", next_id + 1
            live.add(ident)
            ops.append((ident, _row(rng)))
        elif rng.random() < 0.5:
            ident = rng.choice(sorted(live))
            live.discard(ident)
            ops.append((ident, None))
        else:
            ops.append((rng.choice(sorted(live)), _row(rng)))  # changed: removed, then added again
    return ops


def _changes(before: dict, after: dict, ids) -> list[tuple]:
    """A batch's row changes (id, sign, row) from the live rows before and after it (the net change per id)."""
    out = []
    for ident in sorted(set(ids)):
        old, new = before.get(ident), after.get(ident)
        if old == new:
            continue
        if old is not None:
            out.append((ident, -1, old))
        if new is not None:
            out.append((ident, 1, new))
    return out


def _frame(spark, pipeline, job, changes):
    schema = empty_rows(spark, pipeline, job).schema
    rows = [(ident, *row, ident, sign, row[4]) for ident, sign, row in changes]
    return view_rows(spark.createDataFrame(rows, schema).coalesce(1), pipeline, job)


def _agg(spark, tmp_path, pipeline, redis_url, append_only, **kw):
    job, name = MODES[append_only]
    return AggView(
        spark,
        as_lake(tmp_path / "lake"),
        pipeline.views[name],
        pipeline,
        f"state/{job}/g1/views/{name}",
        append_only=append_only,
        redis_url=redis_url,
        generation=1,
        **kw,
    )


def _run(spark, pipeline, agg, ops, size, *, check=None, first=1, live=None):
    """Apply `ops` in batches of `size` through `agg` (batch ids from `first`, the live rows before them `live`);
    `check(live)` after each batch. Returns the live rows after them."""
    job, _ = MODES[agg.append_only]
    live = dict(live or {})
    for n, i in enumerate(range(0, len(ops), size)):
        chunk = ops[i : i + size]
        after = dict(live)
        for ident, row in chunk:
            if row is None:
                after.pop(ident, None)
            else:
                after[ident] = row
        agg.write(_frame(spark, pipeline, job, _changes(live, after, [x for x, _ in chunk])), first + n)
        live = after
        if check:
            check(live)
    return live


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
@pytest.mark.parametrize("driver_max", [1000, 0], ids=["driver", "executors"])
@pytest.mark.slow
def test_every_key_equals_the_brute_force_after_every_batch(
    spark, tmp_path, pipeline, redis_url, append_only, driver_max
):
    client = connect(redis_url)
    set_generation(client, MODES[append_only][0], 1)
    agg = _agg(spark, tmp_path, pipeline, redis_url, append_only, driver_max=driver_max)
    ops = _ops(random.Random(7 + append_only), 36, append_only)
    _run(spark, pipeline, agg, ops, 12, check=lambda live: _assert_lines(client, agg.view, live))


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
@pytest.mark.slow
def test_the_same_sequence_cut_into_other_batches_gives_the_same_lines(
    spark, tmp_path, pipeline, redis_url, append_only
):
    client = connect(redis_url)
    set_generation(client, MODES[append_only][0], 1)
    ops = _ops(random.Random(11), 20, append_only)
    seen = []
    for size in (20, 7):
        client.flushdb()
        set_generation(client, MODES[append_only][0], 1)
        agg = _agg(spark, tmp_path / str(size), pipeline, redis_url, append_only)
        live = _run(spark, pipeline, agg, ops, size)
        seen.append(list(export_aggs(client, agg.view)))
        _assert_lines(client, agg.view, live)
    assert seen[0] == seen[1]


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
@pytest.mark.slow
def test_a_replayed_batch_after_a_partial_write_has_the_effect_of_one(
    spark, tmp_path, pipeline, redis_url, append_only
):
    """Batch 3 is staged and partly written, then the driver dies (no advance); Spark replays batch 3: in the same
    process, or in a new one (state read from the lake), with the same changes or, once the job's own state
    recorded the batch, with none of them. Each way the lines are those of one application."""
    job, name = MODES[append_only]
    client = connect(redis_url)
    ops = _ops(random.Random(5), 24, append_only)
    for replay in ("same process", "new process", "new process, no rows"):
        client.flushdb()
        set_generation(client, job, 1)
        lake = tmp_path / replay.replace(" ", "_").replace(",", "")
        agg = _agg(spark, lake, pipeline, redis_url, append_only)
        live = _run(spark, pipeline, agg, ops[:16], 16)  # batch 1
        after = dict(live)
        after = _run_live(ops[16:], live)
        changes = _frame(spark, pipeline, job, _changes(live, after, [x for x, _ in ops[16:]]))
        step = agg.step(changes, 3)
        agg.stage(step)
        rows = step.lines.collect()
        agg._send(rows[: len(rows) // 2])  # a partial write, then the driver dies
        if replay != "same process":
            agg = _agg(spark, lake, pipeline, redis_url, append_only)
        if replay.endswith("no rows"):
            changes = _frame(spark, pipeline, job, [])
        agg.write(changes, 3)
        _assert_lines(client, agg.view, after)
        agg.write(_frame(spark, pipeline, job, []), 4)  # and the next batch goes on from there
        _assert_lines(client, agg.view, after)


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
@pytest.mark.slow
def test_a_new_process_reads_the_state_from_the_lake_compacted_or_not(
    spark, tmp_path, pipeline, redis_url, append_only
):
    job, _ = MODES[append_only]
    client = connect(redis_url)
    set_generation(client, job, 1)
    ops = _ops(random.Random(3), 24, append_only)
    first = _agg(spark, tmp_path, pipeline, redis_url, append_only, snapshot_every=2)
    live = _run(spark, pipeline, first, ops[:12], 4)  # batches 1-3, compacted into s2 before batch 3
    assert any(e.name.startswith("s") for e in first.lake.list(first.root))
    again = _agg(spark, tmp_path, pipeline, redis_url, append_only, snapshot_every=2)
    check = lambda live: _assert_lines(client, again.view, live)  # noqa: E731
    live = _run(spark, pipeline, again, ops[12:], 6, check=check, first=4, live=live)
    client.flushdb()  # a batch that changes nothing writes nothing
    set_generation(client, job, 1)
    again.write(_frame(spark, pipeline, job, []), 10)
    assert list(export_aggs(client, again.view)) == []


def R(fare=None, rider="r1", rating=None, ts=1, city="K"):
    """A row of the semantics table: `city` "K" is the case's key, "K2" its second key."""
    return (city, rider, fare, rating, ts)


# (case, batches of (id, row or None: removed), the lines after them by key, each as {value: v}, {} when absent)
SEMANTICS = [
    (
        "max: the max's row leaves, its tie stays",
        [[("1", R(12.0)), ("2", R(12.0)), ("3", R(2.5))], [("1", None)]],
        {"K": {"fare_max": 12.0, "fare_min": 2.5, "rides": 2, "fare_sum": 14.5}},
    ),
    (
        "max: both rows of the max leave, the next greatest",
        [[("1", R(12.0)), ("2", R(12.0)), ("3", R(2.5))], [("1", None), ("2", None)]],
        {"K": {"fare_max": 2.5, "fare_avg": 2.5, "rides": 1}},
    ),
    (
        "min: its row changes to a greater value",
        [[("1", R(0.25)), ("2", R(7.75))], [("1", R(10.0))]],
        {"K": {"fare_min": 7.75, "fare_max": 10.0, "fare_sum": 17.75, "cheap": 1}},
    ),
    (
        "count distinct: a value counts while one row holds it",
        [[("1", R(rider="r1")), ("2", R(rider="r1")), ("3", R(rider="r2"))], [("1", None)]],
        {"K": {"riders": 2, "first_rider": "r1", "rides": 2}},
    ),
    (
        "count distinct: the last row holding a value leaves",
        [[("1", R(rider="r1")), ("2", R(rider="r1")), ("3", R(rider="r2"))], [("1", None)], [("2", None)]],
        {"K": {"riders": 1, "first_rider": "r2", "rides": 1}},
    ),
    (
        "null inputs: sums, min, max, avg null, counts 0",
        [[("1", R()), ("2", R())]],
        {
            "K": {
                "rides": 2,
                "rated": 0,
                "ratings": 0,
                "fare_sum": None,
                "fare_min": None,
                "fare_max": None,
                "fare_avg": None,
                "rating_sum": None,
                "cheap": 0,
                "paid": None,
            }
        },
    ),  # fmt: skip
    (
        "ties and distinct counts over equal values",
        [[("1", R(2.5, rating=3)), ("2", R(2.5, rating=3)), ("3", R(2.5, rating=None))]],
        {
            "K": {
                "rides": 3,
                "rated": 2,
                "ratings": 1,
                "rating_sum": 6,
                "fare_min": 2.5,
                "fare_max": 2.5,
                "cheap": 3,
            }
        },
    ),
    (
        "the last non-null value leaves: null again",
        [[("1", R(2.5)), ("2", R())], [("1", None)]],
        {"K": {"rides": 1, "fare_sum": None, "fare_max": None, "fare_avg": None, "cheap": 0}},
    ),
    ("no live row left: the key is absent", [[("1", R(2.5))], [("1", None)]], {"K": {}}),
    (
        "a row moves to another key",
        [[("1", R(2.5)), ("2", R(7.75))], [("1", R(2.5, city="K2"))]],
        {"K": {"rides": 1, "fare_sum": 7.75}, "K2": {"rides": 1, "fare_sum": 2.5}},
    ),
    (
        "a row that no longer satisfies where leaves",
        [[("1", R(2.5)), ("2", R(7.75))], [("2", R(7.75, rider="x"))]],
        {"K": {"rides": 1, "fare_max": 2.5}},
    ),
    ("a null key counts nowhere", [[("1", R(2.5, city=None))]], {"K": {}}),
    (
        "left and added again: counted again",
        [[("1", R(2.5))], [("1", None)], [("1", R(7.75))]],
        {"K": {"rides": 1, "fare_max": 7.75, "fare_min": 7.75}},
    ),
    (
        "types: counts and integral sums long, double sums and avg double, min string, max of a timestamp long",
        [[("1", R(2.5, rating=3, ts=1_700_000_000_000)), ("2", R(10.0, rating=4, ts=5))]],
        {
            "K": {
                "rides": 2,
                "fare_sum": 12.5,
                "rating_sum": 7,
                "fare_avg": 6.25,
                "last_ts": 1_700_000_000_000,
                "first_rider": "r1",
                "paid": 1,
                "cheap": 1,
                "riders": 1,
            }
        },
    ),  # fmt: skip
]


def _appends_only(batches) -> bool:
    seen = set()
    for batch in batches:
        for ident, row in batch:
            if row is None or ident in seen:
                return False
            seen.add(ident)
    return True


def _case_rows(n: int, batches):
    """Case `n`'s batches with its own ids and keys (`K` -> `k<n>`, `K2` -> `k<n>b`)."""
    keys = {"K": f"k{n}", "K2": f"k{n}b", None: None}
    return [[(f"c{n}.{i}", None if r is None else (keys[r[0]], *r[1:])) for i, r in b] for b in batches]


@pytest.fixture(scope="module")
def semantics(spark, redis_server, tmp_path_factory, pipeline):
    """Every case of `SEMANTICS` run at once (case k's batch i in batch i, each under its own keys), in both modes
    (append-only: the cases that only add): {append_only: {key: line}}."""
    url = redis_server["url"].rpartition("/")[0] + "/9"
    client = connect(url)
    client.flushdb()
    out = {}
    for append_only in (False, True):
        job, name = MODES[append_only]
        set_generation(client, job, 1)
        agg = _agg(spark, tmp_path_factory.mktemp("semantics"), pipeline, url, append_only)
        cases = [
            _case_rows(n, b) for n, (_, b, _) in enumerate(SEMANTICS) if not append_only or _appends_only(b)
        ]
        live: dict = {}
        for i in range(max(len(c) for c in cases)):
            ops = [op for c in cases if i < len(c) for op in c[i]]
            after = _run_live(ops, live)
            agg.write(_frame(spark, pipeline, job, _changes(live, after, [x for x, _ in ops])), i + 1)
            live = after
        out[append_only] = {line["city"]: line for line in export_aggs(client, agg.view)}
        assert _all_same(out[append_only], _brute(live))  # the table's cases agree with the brute force too
    client.flushdb()
    return out


def _all_same(got: dict, want: dict) -> bool:
    return list(got) == list(want) and all(_same(got[k], want[k]) for k in want)


def _run_live(ops, live=None) -> dict:
    out = dict(live or {})
    for ident, row in ops:
        out.pop(ident, None) if row is None else out.__setitem__(ident, row)
    return out


@pytest.mark.parametrize(
    "n, append_only",
    [(n, a) for n, (_, b, _) in enumerate(SEMANTICS) for a in (False, True) if not a or _appends_only(b)],
    ids=lambda x: ("append_only" if x else "removals") if isinstance(x, bool) else SEMANTICS[x][0],
)
def test_semantics(semantics, n, append_only):
    _, _, want = SEMANTICS[n]
    for key, values in want.items():
        line = semantics[append_only].get(key.replace("K2", f"k{n}b").replace("K", f"k{n}"), {})
        assert {k: line[k] for k in values if k in line} == values and bool(line) == bool(values)
        for k, v in values.items():
            assert type(line[k]) is type(v), (k, line[k], v)


@server
def test_query_and_export_through_the_read_side(spark, tmp_path, pipeline, redis_url):
    client = connect(redis_url)
    set_generation(client, "trip_stats", 1)
    agg = _agg(spark, tmp_path, pipeline, redis_url, False)
    ops = [
        ("t1", ("a", "r1", 2.5, 3, 5)),
        ("t2", ("d{x}|", "r2", None, None, 9)),
        ("t3", ("gone", "r1", 1.0, 1, 1)),
    ]
    live = _run(spark, pipeline, agg, ops, 3)
    live = _run(spark, pipeline, agg, [("t3", None)], 1, first=2, live=live)
    want = _brute(live)
    view = pipeline.views["trips_by_city"]
    got = query_view(client, "trips_by_city", "d{x}|", pipeline=pipeline)
    assert _same(got, {**want["d{x}|"], "generation": 1})
    assert query_agg(client, view, "gone") == {} == query_view(client, view, "nowhere")
    assert list(export_view(client, view)) == list(export_aggs(client, view))
    assert _all_same({x["city"]: x for x in export_view(client, view)}, want)
    assert (
        list(client.scan_iter("mv:trips_by_city:1:*")) != []
    )  # under the view's pattern: a dropped generation takes them


@server
def test_a_writer_below_the_fence_is_refused_and_writes_nothing(spark, tmp_path, pipeline, redis_url):
    client = connect(redis_url)
    set_generation(client, "trip_stats", 1)
    raise_fence(client, Fence("trip_stats", 2))
    ops = [("t1", ("a", "r1", 2.5, 3, 5))]
    for driver_max in (1000, 0):
        stale = _agg(
            spark, tmp_path / str(driver_max), pipeline, redis_url, False, fence=Fence("trip_stats", 1)
        )
        stale.driver_max = driver_max
        with pytest.raises(Exception) as e:
            _run(spark, pipeline, stale, ops, 1)
        assert isinstance(e.value, Fenced) or "FENCED" in str(e.value)
        assert list(export_aggs(client, stale.view)) == []
    holder = _agg(spark, tmp_path / "holder", pipeline, redis_url, False, fence=Fence("trip_stats", 2))
    live = _run(spark, pipeline, holder, ops, 1)
    _assert_lines(client, holder.view, live)


@pytest.mark.parametrize("redis_url", ["cluster"], indirect=True)
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
def test_on_a_redis_cluster_from_the_driver_and_the_executors(
    spark, tmp_path, pipeline, redis_url, append_only
):
    job, _ = MODES[append_only]
    client = connect(redis_url)
    set_generation(client, job, 1)
    raise_fence(client, Fence(job, 1))
    ops = _ops(random.Random(13), 30, append_only)
    agg = _agg(spark, tmp_path, pipeline, redis_url, append_only, fence=Fence(job, 1), driver_max=10)
    _run(spark, pipeline, agg, ops, 15, check=lambda live: _assert_lines(client, agg.view, live))


def _with_value(name: str, text: str) -> str:
    return PIPELINE.replace('rides: "count(*)", riders', f'rides: "count(*)", {name}: "{text}", riders', 1)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("max(upper(fare, 1, 2))", "upper"),
        ("min(no_such_function(fare))", "no_such_function"),
        ("max(sum(fare))", "may not hold an aggregate"),
        ("count(distinct max(fare) over (partition by city))", "may not hold an aggregate or a window"),
        ("sum(rider)", "sum is of numbers (or booleans, true counted as 1), not of a string"),
        ("avg(concat(rider, 'x'))", "avg is of numbers"),
    ],
)
def test_check_job_refuses_an_aggregate_spark_cannot_compute(spark, text, reason):
    p = parse_pipeline(_with_value("bad", text), "rides.yml")
    with pytest.raises(ExpressionError) as e:
        check_job(spark, p, "ride_stats")
    line = next(i for i, x in enumerate(_with_value("bad", text).splitlines(), 1) if text in x)
    assert e.value.where == f"rides.yml:{line}: jobs.ride_stats.views.rides_by_city.values.bad"
    assert e.value.expression == text and reason in e.value.reason
    assert "\n" not in str(e.value) and "at org.apache" not in str(e.value)


def test_check_job_passes_every_aggregate_of_the_contract(spark, pipeline):
    for job in MODES.values():
        check_job(spark, pipeline, job[0])
