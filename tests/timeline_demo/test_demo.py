"""The demo end to end on a tiny workload (continuous job, chunked ingest, Spark SQL verification), and the
verification itself: the Spark SQL definition equals the brute-force reference, and a corrupted Redis timeline
is reported as a mismatch."""

from __future__ import annotations

import pytest

from tests.conftest import make_settings
from timeline_demo.demo import run_demo
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import timeline_key
from timeline_demo.verify import sql_timelines, verify_timelines
from timeline_demo.workload import sized


@pytest.mark.slow
def test_demo_verifies_every_timeline_and_catches_a_wrong_one(spark, tmp_path, redis_url, rclient, capsys):
    settings = make_settings(tmp_path / "lake", redis_url, TIMELINE_CAP=20, TRIGGER_INTERVAL="200 ms")
    code = run_demo(spark, settings, size="tiny", seed=3, chunks=2, show=2, every=1.0)
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(s for s in out.splitlines() if s.startswith("verified: "))
    n = int(line.split()[1].split("/")[0])
    assert line == f"verified: {n}/{n} timelines match the SQL definition" and n > 20

    wl = sized("tiny", seed=3)
    assert sql_timelines(spark, settings.lake, settings.pipeline(), 20) == expected_timelines(
        wl.tweets, wl.follows, 20
    )

    victim = sorted(expected_timelines(wl.tweets, wl.follows, 20))[0]
    key = timeline_key(1, victim)
    rclient.zrem(key, rclient.zrange(key, 0, 0)[0])
    v = verify_timelines(spark, settings)
    assert (v.total, v.matching, v.ok) == (n, n - 1, False)
    assert v.mismatches[0]["user_id"] == victim
