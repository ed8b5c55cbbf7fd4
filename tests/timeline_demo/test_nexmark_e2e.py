"""The Nexmark pipeline (`timeline_demo/pipelines/nexmark.yml`) end to end through Kafka, every view compared with the
brute force of the contract's definitions (`timeline_demo.brute`) for the same records: a generated workload
(persons, auctions, bids, q13's side input, with bad lines, duplicates, late events and moves; the tables read
the persons', auctions' and bids' logs)
published by the installed `mview produce` into the session's broker (a topic prefix of the test's own); `mview run
kafka --once --json` copies it into the logs (its accepted and rejected counts per topic, a dead letter with the
Kafka topic, partition and offset for exactly the lines the brute force rejects); `mview run JOB --once --json` of
q3, q8, q13 and q20 (the four join kinds; `test_nexmark_sql` checks every query); then `mview export` of their views, `mview query --json` of a sample of keys and `mview status
--json`. The commands that start Spark (`run`, and `export` of the log view) go through the CLI's own code in
this process, on the tests' Spark session (`tests.jobs.opshelp.mview_here`): a JVM of their own each would cost
the suite about two minutes; the others run the installed `mview`. The shop's end-to-end test runs every command
through the installed `mview`."""

from __future__ import annotations

import json

import pytest

from tests.jobs.opshelp import mview_here
from tests.timeline_demo.e2ehelp import (
    assert_same,
    check_kafka_dead_letters,
    cli,
    last_json,
    only,
    query_sample,
    scenario_settings,
)
from timeline_demo.brute import brute_force
from timeline_demo.nexmark import PIPELINE, generate_nexmark
from views.pipeline import load_pipeline

pytestmark = pytest.mark.slow

JOBS = ("q3", "q8", "q13", "q20")


def here(settings, *args: str):
    """`mview ARGS` through the CLI's code in this process (Spark: the tests' session); it must exit 0."""
    done = mview_here(settings, *args)
    assert done.returncode == 0, f"mview {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done


def test_whole_through_kafka_and_the_cli_equals_the_brute_force(spark, tmp_path, redis_url, kafka):
    pipeline = only(load_pipeline(PIPELINE), JOBS)
    feed = generate_nexmark(
        events=1_000, seed=41, rate=10, side_rows=1_100, moves=0.3, duplicates=0.05, bad=0.03, late=6
    )
    files = feed.write(tmp_path / "in")
    want = brute_force(pipeline, feed.batches(1))
    assert sum(want.rejected.values()) > 0
    settings = scenario_settings(tmp_path / "lake", redis_url, PIPELINE, **kafka)

    for topic, paths in files.items():
        produced = last_json(cli(settings, "produce", topic, *paths, "--json"))
        lines = sum(1 for p in paths for x in open(p, "rb").read().split(b"\n") if x.strip())
        assert produced["produced"] == lines, produced
    copied = last_json(here(settings, "run", "kafka", "--once", "--json"))
    assert copied == {
        t: {"accepted": want.accepted[t], "rejected": want.rejected[t]} for t in pipeline.written
    }
    assert check_kafka_dead_letters(settings, pipeline, files) == sum(want.rejected.values())

    for job in JOBS:
        totals = last_json(here(settings, "run", job, "--once", "--json"))
        assert totals["job"] == job and totals["batches"] == 1, totals
    assert want.late == {"q8": 0} and want.held == {"q13": 0}  # one batch; the clock records

    for view, v in pipeline.views.items():
        done = here(settings, "export", view) if v.kind == "log" else cli(settings, "export", view)
        got = [json.loads(x) for x in done.stdout.splitlines() if x.strip()]
        assert got, view
        assert_same(got, want.export(view), f"export {view}")
    assert query_sample(settings, want, through_cli=True) >= 5 * 3

    status = last_json(cli(settings, "status", "--json"))
    for job in JOBS:
        s = status[job]
        assert (s["running"], s["generation"], s["lag_versions"]) == (False, 1, 0), (job, s)
        logs = {
            pipeline.topics[t].source or t for t in pipeline.jobs[job].topics
        }  # a table read from persons: its log
        assert s["rejected"] == sum(want.rejected[t] for t in logs), (job, s)
    assert status["kafka"]["lag_versions"] == 0, status["kafka"]
    assert status["q8"]["late"] == 0 and status["q13"]["held"] == 0
