"""Prometheus metrics of a job and the operations page: what a scrape shows after a micro-batch (no Spark); a
deployed job whose counters move by exactly the records ingested, rejected ones included, while the operations
page, open in headless Chromium, shows the job and an input-rate chart that changes after the ingest."""

from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from changelog.ingest import ingest
from jobs.deploy import deploy, stop
from jobs.devredis import free_port
from jobs.metrics import JobMetrics
from jobs.runtime import write_status
from jobs.skeleton import Batch
from jobs.ui import serve_in_thread
from tests.browser import browser
from tests.conftest import make_settings
from tests.jobs.opshelp import status_of, wait_for, write_jsonl


def _samples(text: str) -> dict:
    """{(sample name, sorted labels without `job`): value} of a scrape."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "job"))
            out[(s.name, labels)] = s.value
    return out


def test_a_batch_moves_the_counters_and_the_status_file_feeds_the_rest(tmp_path, redis_url):
    settings = make_settings(tmp_path / "lake", redis_url)
    (tmp_path / "lake" / "deadletter").mkdir(parents=True)
    (tmp_path / "lake" / "deadletter" / "tweets.jsonl").write_text('{"reason": "x"}\n{"reason": "y"}\n')
    write_status(settings, "timeline", generation=3, held=0, last_batch_ms=1_700_000_000_000)
    m = JobMetrics(settings, "timeline")
    before = _samples(generate_latest(m.registry).decode())
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
    after = _samples(generate_latest(m.registry).decode())
    assert after[("mview_input_records_total", (("topic", "tweets"),))] == 8
    assert after[("mview_input_records_total", (("topic", "follows"),))] == 6
    assert after[("mview_batches_total", ())] == 2
    assert after[("mview_batch_duration_seconds_count", ())] == 2
    assert after[("mview_batch_duration_seconds_sum", ())] == 2.0
    assert after[("mview_batch_phase_seconds_count", (("phase", "sink"),))] == 2
    assert after[("mview_view_writes_total", (("kind", "entries"),))] == 80


def test_a_deployed_job_counts_exactly_the_records_ingested(spark, tmp_path, redis_url):
    settings = make_settings(
        tmp_path / "lake", redis_url, METRICS_PORT=free_port(), TRIGGER_INTERVAL="200 ms", SPARK_UI="true"
    )
    tweets = [
        {"op": "post", "tweet_id": f"t{i}", "user_id": "a", "text": "x", "ts": 1000 + i} for i in range(5)
    ]
    follows = [{"op": "follow", "follower_id": "u1", "followee_id": "a", "ts": 1}]
    ingest(spark, settings.lake_dir, "follows", [write_jsonl(tmp_path / "f.jsonl", follows)])
    try:
        assert deploy(settings, "timeline") == 0
        wait_for(
            lambda: status_of(settings, "timeline").get("lag_versions") == 0, "the follows to be processed"
        )
        url = status_of(settings, "timeline")["metrics_url"]
        assert url.startswith("http://127.0.0.1:")
        spark_ui = status_of(settings, "timeline")["spark_ui_url"]  # SPARK_UI=true: Spark's own UI, served
        assert urllib.request.urlopen(spark_ui, timeout=10).status == 200

        def scrape() -> dict:
            return _samples(urllib.request.urlopen(url, timeout=10).read().decode())

        page = serve_in_thread(settings)
        web = browser(tmp_path)
        web.get(f"http://127.0.0.1:{page.server_port}/")
        wait_for(
            lambda: "1 job(s) running" in web.find_element("id", "note").text, "the page to show the job"
        )
        wait_for(lambda: _points(web) >= 3, "the charts to have a few samples")
        assert _rate_max(web) == 0  # nothing arrived while the page was open
        start = scrape()
        bad = tmp_path / "t.jsonl"
        write_jsonl(bad, tweets)
        with open(bad, "a") as fh:
            fh.write('{"op": "post"}\nnot json\n')
        ingest(spark, settings.lake_dir, "tweets", [str(bad)])
        key_in, key_rej = (
            ("mview_input_records_total", (("topic", "tweets"),)),
            (
                "mview_rejected_records_total",
                (("topic", "tweets"),),
            ),
        )
        wait_for(
            lambda: scrape()[key_in] - start[key_in] == 5, "the 5 valid tweets to be counted", timeout_s=300
        )
        end = scrape()
        assert end[key_rej] - start[key_rej] == 2
        assert (
            end[("mview_input_records_total", (("topic", "follows"),))]
            == start[("mview_input_records_total", (("topic", "follows"),))]
        )
        assert end[("mview_view_writes_total", (("kind", "entries"),))] >= 5
        # the batch is counted before Spark commits it to the checkpoint, which the lag is read from
        wait_for(lambda: scrape()[("mview_lag_versions", ())] == 0, "the lag to reach 0", timeout_s=60)
        wait_for(lambda: _rate_max(web) > 0, "the input-rate chart to show the ingest", timeout_s=60)
        assert web.find_element("id", "job-timeline").get_attribute("class") == "job running"
        web.quit()
        page.shutdown()
    finally:
        stop(settings, "timeline")
    assert status_of(settings, "timeline")["metrics_url"] is None
    assert status_of(settings, "timeline")["spark_ui_url"] is None


def _points(web) -> int:
    return web.execute_script(
        "const l = document.querySelector('#job-timeline polyline'); return l ? Number(l.dataset.n) : 0"
    )


def _rate_max(web) -> float:
    """The largest input rate the timeline job's chart shows (from its title: `...: last (max M)`)."""
    title = web.execute_script(
        "return Array.from(document.querySelectorAll('#job-timeline .chart .title'))"
        ".map(e => e.textContent).find(t => t.startsWith('input rate')) || ''"
    )
    return float(title.split("(max ")[1].rstrip(")")) if "(max " in title else 0.0
