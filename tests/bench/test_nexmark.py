"""The nexmark part's table rows (`bench.nexmark.rows`): one per query, beside Flink's per-core figure with the
caveat, no goal; and they reach the bench table (`bench.report.table_rows`). The part itself runs in `make bench`."""

from __future__ import annotations

from bench.nexmark import FLINK_PER_CORE, QUERIES, rows
from bench.report import COLUMNS, table_rows


def _query(q: str, per_core: int) -> dict:
    return {
        "what": f"what {q} is",
        "batches": 1,
        "records_read": 1_000,
        "batch_seconds": 10.0,
        "cpu_seconds": 19.0,
        "redis_cpu_seconds": 1.5,
        "events_per_s_per_core": per_core,
        "records_per_s_per_core": 50,
        "flink_per_core": FLINK_PER_CORE[q],
        "ratio_to_flink": round(per_core / FLINK_PER_CORE[q], 3),
    }


RES = {"events": 2_000_000, "cores": 2, "queries": {q: _query(q, 19_000) for q in QUERIES}}


def test_one_row_per_query_beside_flink_with_the_caveat_and_no_goal():
    got = rows(RES)
    assert [r["figure"].split()[1] for r in got] == list(QUERIES)
    for r, q in zip(got, QUERIES, strict=True):
        assert set(r) == set(COLUMNS)
        assert r["measured"].startswith("19,000/s/core")
        assert f"{FLINK_PER_CORE[q]:,}/s/core" in r["reference"] and "8-core workers" in r["reference"]
        assert "2 cores incl. Redis writes" in r["reference"]
        assert r["ratio"] == f"{19_000 / FLINK_PER_CORE[q]:.3f}"
        assert (r["goal"], r["met"]) == ("(none set)", "n/a")
        assert "2,000,000 Nexmark events" in r["workload"]
    assert got[-1]["ratio"] == "1.000"  # q20: Flink's 19,000


def test_the_rows_reach_the_bench_table_and_a_failure_is_one_row():
    part = {"available": True, **RES, "rows": rows(RES)}
    figures = [r["figure"] for r in table_rows({"meta": {}, "nexmark": part})]
    assert [f.split()[1] for f in figures] == list(QUERIES)
    failed = table_rows({"meta": {}, "nexmark": {"error": "RuntimeError: boom"}})
    assert len(failed) == 1 and failed[0]["figure"] == "nexmark" and "boom" in failed[0]["measured"]
