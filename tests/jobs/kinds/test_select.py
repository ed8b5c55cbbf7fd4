"""`jobs.kinds.select` end to end on a pipeline nobody here wrote (`tests.tickethelp`: gate scans, a seat map and
season passes, three select jobs with row, count, log, agg and list views), against the brute force of the contract's
definitions (`timeline_demo.brute`), compared exactly (an avg with the contract's relative tolerance of 1e-9):
random workloads in shuffled arrival orders cut into 1 and 2 batches (and the table select into 5), a batch Spark
replays after a crash, an event delivered again in a later batch, and ingested files with bad lines."""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson
import pytest

from changelog.ingest import ingest
from jobs.kinds.select import run
from tests.conftest import make_settings
from tests.shophelp import write_chunk
from tests.tickethelp import JOBS, T0, ticket_text, workload
from timeline_demo.brute import brute_force
from views.log import export_log
from views.pipeline import load_pipeline
from views.read import export_view, query_view
from views.redis_io import connect

AGG = True  # the agg views (`tests.tickethelp.AGG_VIEWS`)
LISTS = True  # the list views (`tests.tickethelp.LIST_VIEWS`)


@pytest.fixture(scope="module")
def tickets(tmp_path_factory):
    path = tmp_path_factory.mktemp("tickets") / "tickets.yml"
    path.write_text(ticket_text(agg=AGG, lists=LISTS))
    return load_pipeline(path, {})


def _pieces(arrivals: list[tuple[str, dict]], n: int, rng: random.Random) -> list[dict[str, list[dict]]]:
    """The arrival order cut into `n` consecutive non-empty pieces at random points: [{topic: records}]."""
    cuts = sorted(rng.sample(range(1, len(arrivals)), n - 1)) if n > 1 else []
    bounds = [0, *cuts, len(arrivals)]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece: dict[str, list[dict]] = {}
        for topic, rec in arrivals[a:b]:
            piece.setdefault(topic, []).append(rec)
        out.append(piece)
    return out


def _append(spark, settings, pipeline, piece: dict[str, list[dict]]) -> None:
    """One Delta commit per topic of the piece (`mview ingest` of one file of valid records)."""
    for topic, records in piece.items():
        if records:
            write_chunk(spark, settings.lake_dir, pipeline.topic(topic), records)


def _run_all(spark, settings, pipeline, jobs=tuple(JOBS)) -> None:
    for job in jobs:
        run(spark, settings, pipeline, job, once=True)


def _export(spark, settings, pipeline, view: str) -> list[dict]:
    v = pipeline.views[view]
    if v.kind == "log":
        return list(export_log(spark, settings.lake, v, 1))
    return list(export_view(connect(settings.redis_url), view, pipeline=pipeline))


def _expect(pipeline, view: str, lines: list[dict]) -> list[dict]:
    """`lines` with each avg of an agg view as `pytest.approx` (relative 1e-9)."""
    v = pipeline.views[view]
    avgs = {n for n, a in v.aggregates if a.func == "avg"} if v.kind == "agg" else set()
    return [{k: pytest.approx(x, rel=1e-9) if k in avgs and x is not None else x for k, x in line.items()}
            for line in lines]  # fmt: skip


def _assert_views(spark, settings, pipeline, want, jobs=tuple(JOBS), what: str = "") -> None:
    """Every view of `jobs` exported as the brute force says, and some keys queried (an absent one too)."""
    client = connect(settings.redis_url)
    for job in jobs:
        for v in pipeline.jobs[job].views:
            got = _export(spark, settings, pipeline, v.name)
            assert got == _expect(pipeline, v.name, want.export(v.name)), f"{what}: view {v.name}"
            if v.kind == "log":
                continue
            keys = want.keys(v.name)
            for key in [*keys[:2], *keys[-2:], "no such key"]:
                expected = want.query(v.name, key)
                assert (
                    query_view(client, v.name, key, pipeline=pipeline)
                    == _expect(pipeline, v.name, [expected])[0]
                ), f"{what}: query {v.name} {key!r}"


def _brute(pipeline, pieces):
    return brute_force(pipeline, pieces, lateness_ms=10 * 60_000)


def _workload_covers(pipeline, arrivals) -> None:
    """The workload has what the tests are about (so that passing says something)."""
    scans = [r for t, r in arrivals if t == "scans"]
    by_id: dict[str, list[dict]] = {}
    for r in scans:
        by_id.setdefault(r["scan_id"], []).append(r)
    assert sum(len(c) > 1 and all(x == c[0] for x in c) for c in by_id.values()) > 5  # delivered twice
    assert sum(len({repr(x) for x in c}) > 1 for c in by_id.values()) > 3  # copies that differ
    assert sum(r["ts"] < T0 for r in scans) > 10  # hours behind the others
    seats = [r for t, r in arrivals if t == "seats"]
    assert sum(r["op"] == "release" for r in seats) > 5
    at: dict[tuple, set] = {}
    for r in seats:
        at.setdefault((r["venue"], r["seat"], r["ts"]), set()).add(repr(r))
    assert sum(len(s) > 1 for s in at.values()) > 2  # equal-time ties
    whole = _brute(pipeline, [{}])  # (nothing) vs everything in one batch: every view of every job non-empty
    assert all(not whole.export(v) for v in pipeline.views)
    one = _brute(pipeline, _pieces(arrivals, 1, random.Random(0)))
    assert all(one.export(v) for v in pipeline.views)


# five batches of the table select, where removals and moves are (`make test`)
@pytest.mark.parametrize("chunks, seed", [(1, 11), pytest.param(5, 13, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_views_equal_the_brute_force_for_any_chunking_and_arrival_order(
    spark, tmp_path, redis_url, tickets, chunks, seed
):
    arrivals = workload(seed)
    _workload_covers(tickets, arrivals)
    pieces = _pieces(arrivals, chunks, random.Random(seed))
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=tickets.file)
    jobs = tuple(JOBS) if chunks < 5 else ("seat_map",)
    for i, piece in enumerate(pieces):
        _append(spark, settings, tickets, piece)
        _run_all(spark, settings, tickets, jobs)
        if chunks < 5 or i == chunks - 1:  # after every batch (a stale max or distinct count shows there)
            want = _brute(tickets, pieces[: i + 1])
            _assert_views(spark, settings, tickets, want, jobs, what=f"{chunks} batches, after {i + 1}")


def _undo_delta_batch(path: Path, spark, app: str | None, batch: int) -> bool:
    """Remove the last version of the Delta table at `path` when it is the append of `batch` by `app` (a write that
    never happened; `app` None: a plain append, the ids table's); True if it was."""
    log = path / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json"))
    actions = [orjson.loads(x) for x in (log / f"{version:020d}.json").read_bytes().splitlines() if x]
    txns = [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a]
    appended = any(a.get("commitInfo", {}).get("operation") == "WRITE" for a in actions)
    if txns != ([(app, batch)] if app is not None else []) or not appended:
        return False
    for name in (f"{version:020d}.json", f"{version:020d}.crc"):
        (log / name).unlink(missing_ok=True)
        (log / f".{name}.crc").unlink(missing_ok=True)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # a new driver would read the log afresh
    return True


def _crash(spark, settings, pipeline, job: str, *, within_aggs: bool) -> int:
    """The lake as a crash during the last batch N left it: the job's streaming checkpoint without N's commit
    (Spark runs N again on restart) and the job's own state without what N records (an event select's ids table
    without N's append; a table select's batch directory incomplete). The views were written: all of them, or
    (`within_aggs`) the row and count views only, the agg and list views' batch directories being incomplete and the
    output logs without N. Returns N."""
    lake = Path(settings.lake_dir)
    commits = lake / "checkpoints" / job / "g1" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    state = lake / "state" / job / "g1"
    if pipeline.sides(job)[0].kind == "event":
        assert _undo_delta_batch(state / "ids", spark, None, last)
    else:
        (state / "table" / f"b{last}" / "_SUCCESS").unlink()
    if within_aggs:
        aggs = [v.name for v in pipeline.jobs[job].views if v.kind in ("agg", "list")]  # their own state
        done = list((state / "views").glob(f"*/*/b{last}/_SUCCESS"))
        assert sorted(p.parts[-4] for p in done) == sorted(aggs)
        for marker in done:
            marker.unlink()
        for v in pipeline.jobs[job].views:
            if v.kind == "log":
                _undo_delta_batch(lake / "outputs" / v.name / "g1", spark, f"{job}-g1-{v.name}", last)
    return last


@pytest.mark.parametrize("job", ["gate_flow", "seat_map"])
@pytest.mark.slow
def test_a_batch_replayed_after_a_crash_has_the_effect_of_one(spark, tmp_path, redis_url, tickets, job):
    topic = JOBS[job]
    arrivals = [(t, r) for t, r in workload(21) if t == topic]
    first, second = _pieces(arrivals, 2, random.Random(21))
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=tickets.file)
    commits = Path(settings.lake_dir) / "checkpoints" / job / "g1" / "commits"
    _append(spark, settings, tickets, first)
    run(spark, settings, tickets, job, once=True)
    want = _brute(tickets, [first])
    _assert_views(spark, settings, tickets, want, jobs=(job,), what="first run")
    last = _crash(spark, settings, tickets, job, within_aggs=False)
    run(spark, settings, tickets, job, once=True)  # the batch again, nothing new
    assert (commits / str(last)).exists()  # Spark did run it again
    _assert_views(spark, settings, tickets, want, jobs=(job,), what="the batch replayed")
    # an event select crashed after its ids were recorded: the batch again selects nothing
    if tickets.sides(job)[0].kind == "event":
        for name in (str(last), f".{last}.crc"):
            (commits / name).unlink(missing_ok=True)
        run(spark, settings, tickets, job, once=True)
        assert (commits / str(last)).exists()
        _assert_views(
            spark, settings, tickets, want, jobs=(job,), what="replayed after its ids were recorded"
        )
        ids = spark.read.format("delta").load(str(Path(settings.lake_dir) / "state" / job / "g1" / "ids"))
        assert ids.count() == ids.select("_id").distinct().count()  # no copies: nothing was recorded again
    _crash(spark, settings, tickets, job, within_aggs=AGG or LISTS)
    _append(spark, settings, tickets, second)
    run(spark, settings, tickets, job, once=True)  # the batch again, then the next
    assert (commits / str(last + 1)).exists()
    want = _brute(tickets, [first, second])
    _assert_views(spark, settings, tickets, want, jobs=(job,), what="replayed, then the next batch")


@pytest.mark.slow
def test_an_event_delivered_again_in_a_later_batch_has_one_effect(spark, tmp_path, redis_url, tickets):
    """The same id again, in a later batch: the first batch's copy stays, whatever the copy's time or fields. A
    batch's records are counted with their copies, its own and earlier batches'."""
    base = {"ticket_id": "t1", "gate": "north", "zone": "A", "fee": 2.5, "bags": 1}
    hour = 3_600_000
    x3 = {**base, "scan_id": "x3", "ts": T0 + hour}
    batches = [
        {"scans": [{**base, "scan_id": "x1", "ts": T0}, {**base, "scan_id": "x2", "ts": T0 + 5_000}]},
        {"scans": [{**base, "scan_id": "x1", "ts": T0, "gate": "south"}]},  # the same time, other fields
        {"scans": [{**base, "scan_id": "x2", "ts": T0 + hour, "fee": 9.0}, x3, dict(x3)]},
    ]  # fmt: skip
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=tickets.file)
    events = []
    for batch in batches:
        _append(spark, settings, tickets, batch)
        events.append(run(spark, settings, tickets, "gate_flow", once=True)["events"])
    assert events == [2, 1, 3]
    want = _brute(tickets, batches)
    assert [(r["scan_id"], r["gate"], r["fee"]) for r in want.export("scan_row")] == [
        ("x1", "north", 2.5),
        ("x2", "north", 2.5),
        ("x3", "north", 2.5),
    ]
    assert want.export("gate_counts") == [{"gate": "north", "scans": 3, "fees": 7.5, "bags": 3, "noted": 0}]
    _assert_views(spark, settings, tickets, want, jobs=("gate_flow",), what="copies in later batches")


def HOLD(seat, ts, section, holder, price, row_no, venue="arena"):
    return {"op": "hold", "venue": venue, "seat": seat, "section": section, "holder": holder, "price": price,
            "row_no": row_no, "ts": ts}  # fmt: skip


def RELEASE(seat, ts, venue="arena"):
    return {"op": "release", "venue": venue, "seat": seat, "ts": ts}


@pytest.mark.skipif(not AGG, reason="select jobs publish no agg views yet")
@pytest.mark.slow
def test_aggregates_of_a_table_select_follow_moves_removals_and_re_adds(spark, tmp_path, redis_url, tickets):
    """Each batch's aggregates, as the brute force gives them for the batches so far: a section's max leaves (the
    next greatest shows), a seat moves to another section, a holder of two seats stays counted once while one
    holds, a released seat comes back, a release ties a hold."""
    m = 60_000
    batches = [
        [HOLD("A1", T0, "floor", "h1", 40.0, 2), HOLD("A2", T0, "floor", "h1", 30.0, 5),
         HOLD("A3", T0, "floor", "h2", 10.0, 1), HOLD("B1", T0, "box", "h3", 20.0, 9, venue="club")],
        [HOLD("A1", T0 + m, "box", "h1", 40.0, 2), RELEASE("A3", T0 + m), HOLD("A2", T0 - m, "floor", "h9", 99.0, 1)],
        [HOLD("A3", T0 + 2 * m, "floor", "h1", 12.5, 1), HOLD("B1", T0 + 2 * m, "box", "h3", 25.0, 3, venue="club"),
         RELEASE("B1", T0 + 2 * m, venue="club")],
    ]  # fmt: skip
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=tickets.file)
    seen = []
    for batch in batches:
        seen.append({"seats": batch})
        _append(spark, settings, tickets, seen[-1])
        run(spark, settings, tickets, "seat_map", once=True)
        _assert_views(
            spark, settings, tickets, _brute(tickets, seen), jobs=("seat_map",), what=f"batch {len(seen)}"
        )
    final = _brute(tickets, seen)
    assert final.query("section_stats", "floor") == {
        "section": "floor", "seats": 2, "holders": 1, "held": 2, "revenue": 42.5, "low": 12.5, "high": 30.0,
        "avg_price": 21.25, "front": 1, "top_row": 5, "avg_row": 3.0, "generation": 1,
    }  # fmt: skip
    assert final.query("section_stats", "box")["seats"] == 1  # A1 moved in, B1 left (its release ties a hold)


@pytest.mark.slow
def test_ingested_files_with_bad_lines_reach_the_views_as_the_brute_force_says(
    spark, tmp_path, redis_url, tickets
):
    """Through `mview ingest` of JSON-lines files (ISO times with zones, extra fields, a remove with its key and time
    only): a line that is not a valid record is dead-lettered and never reaches a view, the next lines go on."""
    good = [json.dumps({"scan_id": f"i{i}", "ticket_id": f"t{i % 3}", "gate": "east", "fee": i / 4, "bags": i % 2,
                        "ts": f"2026-03-01T1{8 + i % 2}:0{i % 6}:00+01:00", "extra": [i]}) for i in range(12)]  # fmt: skip
    scans = [
        [
            *good[:6],
            "{not json",
            '["a list"]',
            json.dumps({"scan_id": "bad1", "ticket_id": "t1", "gate": "east", "fee": "free", "ts": T0}),
        ],  # fmt: skip
        [
            good[3],
            *good[6:],
            json.dumps({"scan_id": " ", "ticket_id": "t", "gate": "e", "fee": 1, "ts": T0}),
            json.dumps({"scan_id": "bad3", "ticket_id": "t", "gate": "e", "fee": 1, "ts": "yesterday"}),
        ],  # fmt: skip
    ]
    seats = [
        [
            json.dumps(HOLD("A1", T0, "floor", "h1", 10.0, 1)),
            json.dumps(HOLD("A2", T0, "box", None, 20.0, 2)),
            json.dumps({**HOLD("A3", T0, "box", "h2", 5.0, 3), "op": "reserve"}),
        ],  # fmt: skip
        [
            json.dumps({"op": "release", "venue": "arena", "seat": "A1", "ts": "2026-03-01T19:00:00Z"}),
            json.dumps({"op": "hold", "venue": "arena", "seat": "A4", "ts": T0}),
        ],  # fmt: skip
    ]
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=tickets.file)
    batches, got = [], {"scans": [0, 0], "seats": [0, 0]}
    for i, lines in enumerate(zip(scans, seats, strict=True)):
        batch = dict(zip(("scans", "seats"), lines, strict=True))
        batches.append(batch)
        for topic, topic_lines in batch.items():
            path = tmp_path / f"{topic}-{i}.jsonl"
            path.write_text("".join(x + "\n" for x in topic_lines))
            result = ingest(None, settings.lake, tickets.topic(topic), [str(path)])
            got[topic][0] += result.accepted
            got[topic][1] += result.rejected
        _run_all(spark, settings, tickets, ("gate_flow", "seat_map"))
    want = _brute(tickets, batches)
    assert (
        got
        == {t: [want.accepted[t], want.rejected[t]] for t in ("scans", "seats")}
        == {
            "scans": [13, 5],
            "seats": [3, 2],
        }
    )
    assert [r["seat"] for r in want.export("seat_row")] == ["arena/A2"]
    _assert_views(spark, settings, tickets, want, jobs=("gate_flow", "seat_map"), what="ingested files")
