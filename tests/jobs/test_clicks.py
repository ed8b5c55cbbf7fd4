"""The clicks job end to end (real Delta logs, real Spark, real redis-server): random workloads against the
brute-force definition for several seeds and chunkings; late events, duplicates, bad lines, the idle timeout."""

from __future__ import annotations

import json
import random

import pytest

from changelog.deadletters import read_dead_letters
from changelog.ingest import ingest
from jobs.core.registry import job_spec
from jobs.core.runtime import job_key, read_status
from jobs.kinds.interval import close_idle
from tests.conftest import make_settings, write_jsonl
from timeline_demo.clicks_workload import chunk_arrivals, expected_clicks, generate_clicks
from timeline_demo.workload import T0
from views.read import export_view, query_view
from views.redis_io import connect


def run_clicks(spark, settings, **kwargs) -> dict:
    """The built-in pipeline's `clicks` job, as `mview run clicks` runs it."""
    return job_spec(settings, "clicks").run(spark, settings, **kwargs)


def close_idle_windows(spark, settings, **kwargs) -> dict:
    """The idle rule of the built-in `clicks` job (`jobs.kinds.interval.close_idle`)."""
    return close_idle(spark, settings, settings.pipeline(), "clicks", **kwargs)


H = 3_600_000
M = 60_000


def export_search_clicks(client):
    return export_view(client, "search_clicks")


def export_ctr(client):
    return export_view(client, "ctr")


def query_search_clicks(client, search_id):
    return query_view(client, "search_clicks", search_id)


def query_ctr(client, query):
    return query_view(client, "ctr", query)


def _run_chunked(spark, tmp_path, redis_url, wl, chunks: int, seed: int):
    """Ingest the arrival order cut into `chunks` pieces (one commit per topic and piece), then run the job once
    with one commit of each topic per micro-batch: `chunks` micro-batches whose boundaries are the cuts."""
    settings = make_settings(tmp_path / f"lake{seed}_{chunks}", redis_url)
    pieces = chunk_arrivals(wl.arrivals, chunks, random.Random(seed))
    for i, piece in enumerate(pieces):
        for topic in ("searches", "clicks"):
            assert piece[topic], "every piece holds both topics, so batch i is piece i"
            ingest(
                spark,
                settings.lake,
                settings.topic(topic),
                [write_jsonl(tmp_path / f"{topic}{seed}_{chunks}_{i}.jsonl", piece[topic])],
            )
    totals = run_clicks(spark, settings, once=True, max_files_per_trigger=1)
    assert totals["batches"] == chunks
    client = connect(redis_url)
    sc = {r["search_id"]: r for r in export_search_clicks(client)}
    ctr = {r["query"]: r for r in export_ctr(client)}
    return settings, sc, ctr


@pytest.mark.parametrize("seed, chunkings", [pytest.param(1, (1, 3), marks=pytest.mark.slow), (2, (2,))])
def test_search_clicks_and_ctr_equal_the_definition_for_any_chunking(
    spark, tmp_path, redis_url, rclient, seed, chunkings
):
    wl = generate_clicks(seed=seed, sessions=60)
    want_sc, want_ctr = expected_clicks(wl.searches, wl.clicks, 10 * M)
    # The workload exercises every case: clicked and not, final and still open, duplicates.
    assert sum(r["clicked"] for r in want_sc.values()) > 20
    assert sum(not r["clicked"] for r in want_sc.values()) > 10
    assert sum(r["searches"] for r in want_ctr.values()) < len({r["search_id"] for r in wl.searches})
    assert len(wl.searches) + len(wl.clicks) > len(
        {r.get("search_id") or r.get("click_id") for _, r in wl.arrivals}
    )
    results = []
    for chunks in chunkings:
        rclient.flushall()
        settings, sc, ctr = _run_chunked(spark, tmp_path, redis_url, wl, chunks, seed)
        assert sc == want_sc, f"chunks={chunks}"
        assert ctr == want_ctr, f"chunks={chunks}"
        status = read_status(settings, "clicks")
        assert status["late"] == 0 and status["duplicates"] > 0
        results.append((sc, ctr))
    assert all(r == results[0] for r in results)


def _ingest(spark, settings, tmp_path, topic, records, name):
    return ingest(spark, settings.lake, settings.topic(topic), [write_jsonl(tmp_path / name, records)])


def _search(sid, sess, ts, q="shoes"):
    return {"search_id": sid, "session_id": sess, "query": q, "ts": ts}


def _click(cid, sess, ts):
    return {"click_id": cid, "session_id": sess, "url": f"https://x/{cid}", "ts": ts}


def test_early_clicked_final_outcome_late_duplicate_bad_line_and_idle(spark, tmp_path, redis_url):
    settings = make_settings(tmp_path / "lake", redis_url, IDLE_TIMEOUT="1 minute")
    client = connect(redis_url)

    # 1. s1 and s2 open; c1 (10 min after s1, arriving first) matches s1: clicked as soon as seen, not final.
    _ingest(spark, settings, tmp_path, "clicks", [_click("c1", "a", T0 + 10 * M)], "c1.jsonl")
    (tmp_path / "bad.jsonl").write_text(
        '{"click_id":"c7","session_id":"a","url":"u","ts":"yesterday"}\nnot json\n'
    )
    res = ingest(spark, settings.lake, settings.topic("clicks"), [str(tmp_path / "bad.jsonl")])
    assert (res.accepted, res.rejected) == (0, 2)
    _ingest(
        spark, settings, tmp_path, "searches", [_search("s1", "a", T0), _search("s2", "b", T0)], "s1.jsonl"
    )
    run_clicks(spark, settings, once=True)
    got = query_search_clicks(client, "s1")
    assert (got["clicked"], got["clicks"], got["final"]) == (True, 1, False)
    assert query_search_clicks(client, "s2") == {}  # never clicked: false before its window closed
    assert query_ctr(client, "shoes") == {}

    # 2. A duplicate of c1, c2 on s1's upper bound, and an event 2 h later: watermark T0 + 1h50 closes both.
    _ingest(
        spark,
        settings,
        tmp_path,
        "clicks",
        [_click("c1", "a", T0 + 10 * M), _click("c2", "a", T0 + H), _click("c9", "z", T0 + 2 * H)],
        "c2.jsonl",
    )
    run_clicks(spark, settings, once=True)
    assert list(export_search_clicks(client)) == [
        {"search_id": "s1", "session_id": "a", "query": "shoes", "ts": T0, "clicked": True, "clicks": 2},
        {"search_id": "s2", "session_id": "b", "query": "shoes", "ts": T0, "clicked": False, "clicks": 0},
    ]
    assert query_search_clicks(client, "s1")["final"] is True
    assert list(export_ctr(client)) == [{"query": "shoes", "searches": 2, "clicked": 1}]

    # 3. A late click for s2 (older than the watermark on arrival): dropped, logged, counted; nothing recounted.
    _ingest(spark, settings, tmp_path, "clicks", [_click("c3", "b", T0 + 20 * M)], "c3.jsonl")
    run_clicks(spark, settings, once=True)
    assert query_search_clicks(client, "s2")["clicks"] == 0
    assert query_ctr(client, "shoes") == {"query": "shoes", "searches": 2, "clicked": 1, "generation": 1}
    status = read_status(settings, "clicks")
    assert status["late"] == 1 and status["rejected"] == 2 and status["duplicates"] == 1
    late_key = f"{job_key('clicks')}/late/g1"  # one object per batch with late records
    late = [
        json.loads(x)
        for e in settings.lake.list(late_key)
        for x in settings.lake.read_bytes(late_key, e.name).splitlines()
    ]
    assert [(r["id"], r["reason"].startswith("late: ts")) for r in late] == [("c3", True)]
    dead = list(read_dead_letters(settings.lake, settings.topic("clicks")))
    assert "'ts'" in dead[0]["reason"] and "not valid JSON" in dead[1]["reason"]

    # 4. s3 opens, then nothing arrives: after the idle timeout the watermark moves with the wall clock.
    _ingest(spark, settings, tmp_path, "searches", [_search("s3", "y", T0 + 2 * H, "hats")], "s3.jsonl")
    run_clicks(spark, settings, once=True)  # idle check at the end: not idle yet
    assert query_search_clicks(client, "s3") == {}
    last = read_status(settings, "clicks")["last_batch_ms"]
    assert close_idle_windows(spark, settings, now_ms=last + 30 * M) == {}  # idle, but s3 is still open
    assert query_search_clicks(client, "s3") == {}
    out = close_idle_windows(spark, settings, now_ms=last + 2 * H)
    assert out["closed"] == 1
    assert query_search_clicks(client, "s3")["clicked"] is False
    assert query_ctr(client, "hats") == {"query": "hats", "searches": 1, "clicked": 0, "generation": 1}
    assert query_ctr(client, "shoes") == {"query": "shoes", "searches": 2, "clicked": 1, "generation": 1}
