"""Redis loses the serving copy (restart without persistence, FLUSHALL): the service notices it against the
lake and rebuilds the views from the logs by itself, into a new generation, saying so in the log and the status.

Detection and `run --once`, without a deployed job: after FLUSHALL the lost pointer is named; with the pointer
back but the meta hash gone, the meta hash is named and a later batch cannot re-create it; `run --once` rebuilds
the exact view into generation 2 instead of writing new changes into an empty generation. A deployed job that
meets a Redis restarted empty: tests/jobs/ops/test_deploy.py (it shares that module's deployment).
"""

from __future__ import annotations

from changelog.ingest import ingest
from jobs.core.generations import record_batch, serving_copy_lost
from jobs.core.registry import job_spec
from tests.builtin import run_timeline
from tests.conftest import make_settings
from tests.jobs.opshelp import write_jsonl
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import export_timeline
from timeline_demo.workload import generate

JOB = "timeline"
CAP = 20


def _parts(records, n):
    size = -(-len(records) // n)
    return [records[i * size : (i + 1) * size] for i in range(n)]


def _timelines(client) -> dict:
    return {r["user_id"]: r["tweet_ids"] for r in export_timeline(client)}


def test_lost_serving_copy_is_detected_and_run_once_rebuilds_it(spark, tmp_path, redis_url, rclient, capsys):
    settings = make_settings(tmp_path / "lake", redis_url, TIMELINE_CAP=CAP)
    spec = job_spec(settings, JOB)
    wl = generate(seed=5, users=40, celebrities=2, follows=240, tweets=200)
    tw, fo = _parts(wl.tweets, 2), _parts(wl.follows, 2)

    def feed(i):
        ingest(spark, settings.lake, settings.topic("tweets"), [write_jsonl(tmp_path / f"t{i}.jsonl", tw[i])])
        ingest(
            spark, settings.lake, settings.topic("follows"), [write_jsonl(tmp_path / f"f{i}.jsonl", fo[i])]
        )

    assert serving_copy_lost(settings, rclient, spec) is None  # never published: nothing to lose
    feed(0)
    run_timeline(spark, settings, once=True)
    assert serving_copy_lost(settings, rclient, spec) is None
    assert _timelines(rclient) == expected_timelines(tw[0], fo[0], CAP)

    rclient.flushall()
    assert "mv:gen:timeline is gone" in serving_copy_lost(settings, rclient, spec)
    rclient.set("mv:gen:timeline", 1)
    assert "mv:meta:timeline:1 is gone" in serving_copy_lost(settings, rclient, spec)
    assert not record_batch(rclient, JOB, 1, 7, last_batch_ms=1)  # a later batch does not hide the loss
    assert "mv:meta:timeline:1 is gone" in serving_copy_lost(settings, rclient, spec)
    rclient.flushall()

    feed(1)
    run_timeline(spark, settings, once=True)  # what `mview run timeline --once` runs

    assert int(rclient.get("mv:gen:timeline")) == 2
    assert _timelines(rclient) == expected_timelines(wl.tweets, wl.follows, CAP)
    assert serving_copy_lost(settings, rclient, spec) is None
    assert list(rclient.scan_iter(match="mv:*:1:*")) == []
    assert "Redis lost the serving copy of timeline (the generation pointer" in capsys.readouterr().err
