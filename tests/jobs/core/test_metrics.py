"""Prometheus metrics of a job: what a scrape shows after a micro-batch (no Spark). A deployed job whose counters
move by exactly the records ingested, with the operations page open in headless Chromium:
tests/jobs/ops/test_deploy.py (it shares that module's deployment)."""

from __future__ import annotations

from prometheus_client import generate_latest

from changelog.deadletters import write_dead_letters
from jobs.core.metrics import JobMetrics
from jobs.core.runtime import write_status
from jobs.core.skeleton import Batch
from tests.conftest import make_settings
from tests.jobs.opshelp import metric_samples


def test_a_batch_moves_the_counters_and_the_status_file_feeds_the_rest(tmp_path, redis_url):
    settings = make_settings(tmp_path / "lake", redis_url)
    write_dead_letters(
        settings.lake, settings.topic("tweets"), "ingest-1", [{"reason": "x"}, {"reason": "y"}]
    )
    write_status(settings, "timeline", generation=3, held=0, last_batch_ms=1_700_000_000_000)
    m = JobMetrics(settings, "timeline")
    before = metric_samples(generate_latest(m.registry).decode())
    assert before[("mview_input_records_total", (("topic", "tweets"),))] == 0
    assert before[("mview_rejected_records_total", (("topic", "tweets"),))] == 2
    assert before[("mview_rejected_records_total", (("topic", "follows"),))] == 0
    assert before[("mview_generation", ())] == 3
    assert before[("mview_last_batch_timestamp_seconds", ())] == 1_700_000_000

    batch = Batch(
        events=7,
        summary="",
        totals={"entries": 40, "timeline_ops": 5},
        inputs={"tweets": 4, "follows": 3},
        phases={"join": 0.2, "sink": 0.7},
    )
    m.observe(batch, 1.5)
    m.observe(batch, 0.5)
    after = metric_samples(generate_latest(m.registry).decode())
    assert after[("mview_input_records_total", (("topic", "tweets"),))] == 8
    assert after[("mview_input_records_total", (("topic", "follows"),))] == 6
    assert after[("mview_batches_total", ())] == 2
    assert after[("mview_batch_duration_seconds_count", ())] == 2
    assert after[("mview_batch_duration_seconds_sum", ())] == 2.0
    assert after[("mview_batch_phase_seconds_count", (("phase", "sink"),))] == 2
    assert after[("mview_view_writes_total", (("kind", "entries"),))] == 80
