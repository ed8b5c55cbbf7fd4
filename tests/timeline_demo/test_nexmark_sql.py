"""Every Nexmark query that `timeline_demo/pipelines/nexmark.yml` declares equals Nexmark's own SQL of it computed
by DuckDB over the same events (`timeline_demo.nexmark_sql`), on two seeds: one workload of 40 s of event time
ingested and run in one piece, one of 30 min in two pieces (each job run once per piece, in chain order, so the
chained queries q4, q5 and q7 follow their upstream's changes). No duplicates, moves or late events: Nexmark has
none (their rules are the contract's, checked against `timeline_demo.brute` elsewhere)."""

from __future__ import annotations

import pytest

from tests.timeline_demo.e2ehelp import exports_here, run_here, scenario_settings
from timeline_demo.nexmark import PIPELINE, generate_nexmark
from timeline_demo.nexmark_sql import NOT_EXPRESSED, QUERIES, connect, differences, nexmark_rows, result
from views.pipeline import load_pipeline

pytestmark = pytest.mark.slow

ALL = {f"q{n}" for n in range(23)}


def test_every_query_is_declared_or_says_why_not():
    pipeline = load_pipeline(PIPELINE)
    assert set(QUERIES) | set(NOT_EXPRESSED) == ALL and not set(QUERIES) & set(NOT_EXPRESSED)
    assert {j for q in QUERIES.values() for j in q.jobs} == set(pipeline.jobs)
    text = PIPELINE.read_text()
    assert all(f"- {q} (" in text for q in NOT_EXPRESSED)


@pytest.mark.parametrize(("seed", "rate", "pieces"), [(5, 50, 1), (6, 1, 2)])
def test_every_query_equals_nexmark_sql_in_duckdb(spark, tmp_path, redis_url, seed, rate, pieces):
    pipeline = load_pipeline(PIPELINE)
    feed = generate_nexmark(events=2_000, seed=seed, rate=rate, side_rows=10_000)
    records = {t: [r for batch in feed.batches(1) for r in batch.get(t, [])] for t in pipeline.written}
    settings = scenario_settings(tmp_path / "lake", redis_url, PIPELINE)
    run_here(spark, settings, pipeline, feed.batches(pieces), tmp_path / "in")

    exports = exports_here(spark, settings, pipeline)
    bids = {b["bid_id"]: b for b in records["bids"]}
    con = connect(records)
    for query in sorted(QUERIES, key=lambda q: int(q[1:])):
        want = nexmark_rows(con, query)
        assert want, query
        got = result(query, exports, bids)
        diffs = differences(query, got, want)
        assert not diffs, (
            "\n".join(diffs[:10]) + f"\n({len(diffs)} differences, {len(got)} rows, {len(want)} wanted)"
        )
