"""Beyond one machine: the built-in pipeline with `LAKE_DIR` on a real HDFS and `SPARK_MASTER` a standalone
cluster of two workers, each in its own working directory (`tests.devhelp.spark_cluster`). Records enter through
the installed CLI (`mview ingest`, LAKE_DIR a URI); every job runs by `spark-submit` (`python -m jobs.core.submit
run <job> --once`) from a driver with its own working directory and HOME, the three drivers side by side (each an
application of the cluster), so the drivers, the executors and the CLI share the lake only through HDFS. Timeline,
clicks and enrichment equal their definitions (the workloads' brute-force references), and the timeline's whole
Redis content (every view and extra key) is exactly what the same records give in local mode (the tests' `local[2]`
session, a local lake).

(This test holds what tests/jobs/test_cluster.py held on a standalone master and worker of its own: the session's
cluster serves both, one cluster per test session.)"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from changelog.ingest import ingest
from tests.builtin import run_timeline
from tests.conftest import make_settings, write_jsonl
from tests.devhelp import ingest_cli, job_once
from tests.jobs.opshelp import redis_content
from timeline_demo.clicks_workload import expected_clicks, generate_clicks
from timeline_demo.enrichment_workload import expected_by_country, expected_enriched, generate_enrichment
from timeline_demo.reference import expected_timelines
from timeline_demo.workload import generate
from views.read import export_view
from views.redis_io import connect

pytestmark = pytest.mark.e2e

CAP = 20
M = 60_000


def test_the_builtin_pipeline_on_hdfs_and_a_two_worker_cluster(
    spark, hdfs_server, spark_cluster, tmp_path, redis_url, rclient
):
    run = uuid.uuid4().hex[:8]
    common = {
        "SPARK_MASTER": spark_cluster.master,
        "SPARK_DRIVER_MEMORY": "1g",
        "TIMELINE_CAP": CAP,
        "METRICS_PORT": "off",
    }
    # clicks and the timeline in one lake; enrichment (its workload's disorder needs 5 minutes) in another
    main = make_settings(f"{hdfs_server.url}/beyond-{run}", redis_url, **common)
    enrich = make_settings(
        f"{hdfs_server.url}/beyond-enrich-{run}",
        redis_url.rsplit("/", 1)[0] + "/1",
        ALLOWED_LATENESS="5 minutes",
        **common,
    )
    assert main.lake_dir is None and main.lake_uri.startswith("hdfs://")

    tl = generate(seed=21, users=60, celebrities=2, follows=400, tweets=400)
    cl = generate_clicks(seed=3, sessions=40)
    en = generate_enrichment(seed=4)
    ingest_cli(main, tmp_path, "tweets", tl.tweets)
    ingest_cli(main, tmp_path, "follows", tl.follows)
    ingest_cli(main, tmp_path, "searches", cl.searches)
    ingest_cli(main, tmp_path, "clicks", cl.clicks)
    ingest_cli(enrich, tmp_path, "profiles", en.profiles)
    ingest_cli(enrich, tmp_path, "activity", en.activity)

    apps_before = {a for d in spark_cluster.worker_dirs for a in (Path(d) / "work").glob("app-*")}
    driver = tmp_path / "driver"  # nothing of the CLI's working directory: the lake is on HDFS only

    def submitted(settings, job: str) -> dict:
        home = driver / job / "home"  # nothing of the CLI's HOME either
        home.mkdir(parents=True)
        totals, _ = job_once(
            settings, job, driver / job, submit=True, HOME=str(home), SPARK_LOCAL_IP="127.0.0.1"
        )
        return totals

    with ThreadPoolExecutor(3) as pool:  # the three drivers side by side
        runs = {
            job: pool.submit(submitted, settings, job)
            for settings, job in ((main, "timeline"), (main, "clicks"), (enrich, "enrichment"))
        }
        # meanwhile, the same timeline records in local mode (the tests' session, a local lake)
        local = make_settings(tmp_path / "lake_local", redis_url.rsplit("/", 1)[0] + "/2", TIMELINE_CAP=CAP)
        for topic, records in (("tweets", tl.tweets), ("follows", tl.follows)):
            path = write_jsonl(tmp_path / f"local-{topic}.jsonl", records)  # one commit each, as the CLI's
            ingest(spark, local.lake, local.topic(topic), [path])
        run_timeline(spark, local, once=True)
        for job, run in runs.items():
            totals = run.result()
            assert totals["job"] == job and totals["events"] > 0
    assert all(set((Path(d) / "work").glob("app-*")) - apps_before for d in spark_cluster.worker_dirs), (
        "both workers ran executors of these jobs"
    )

    client = connect(redis_url)
    want = expected_timelines(tl.tweets, tl.follows, CAP)
    assert sum(len(v) for v in want.values()) > 300
    got = {r["user_id"]: r["tweet_ids"] for r in export_view(client, "timeline")}
    assert got == want
    on_cluster = redis_content(client, "timeline", 1)
    assert len(on_cluster) > 50
    assert on_cluster == redis_content(connect(local.redis_url), "timeline", 1)
    want_sc, want_ctr = expected_clicks(cl.searches, cl.clicks, 10 * M)
    assert (
        sum(r["clicked"] for r in want_sc.values()) > 5
        and sum(not r["clicked"] for r in want_sc.values()) > 5
    )
    assert {r["search_id"]: r for r in export_view(client, "search_clicks")} == want_sc
    assert {r["query"]: r for r in export_view(client, "ctr")} == want_ctr
    truth = expected_enriched(en.profiles, en.activity)
    assert len(truth) > 300
    by_country = {
        r["country"]: r["events"] for r in export_view(connect(enrich.redis_url), "activity_by_country")
    }
    assert by_country == expected_by_country(truth)
