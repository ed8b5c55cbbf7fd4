"""The three jobs on a real three-master Redis Cluster (REDIS_CLUSTER=true): every view equals its definition, a
replay switches generations and drops the old one on every master, `mview query`/`export`/`status` read it; and
a deployed job whose master is killed (SIGKILL, append-only file on) waits, retries and converges, nothing lost."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest
import redis
from redis.cluster import RedisCluster

from changelog.ingest import ingest
from jobs.dev.redis import scratch_redis_cluster, start_cluster_node
from jobs.ops.deploy import deploy, settings_env, stop
from jobs.ops.replay import replay
from tests.builtin import run_timeline
from tests.conftest import make_settings, split_at_random, write_jsonl
from tests.jobs.opshelp import status_of, wait_for
from tests.jobs.test_clicks import M
from tests.jobs.test_clicks import _run_chunked as run_clicks_chunked
from tests.jobs.test_enrichment import _run_chunked as run_enrichment_chunked
from tests.jobs.test_enrichment import export_activity_by_country, export_enriched
from timeline_demo.clicks_workload import expected_clicks, generate_clicks
from timeline_demo.enrichment_workload import expected_by_country, expected_enriched, generate_enrichment
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import export_timeline
from timeline_demo.workload import generate
from views.redis_io import connect

CAP = 20


@pytest.fixture
def cluster_url(redis_cluster):
    RedisCluster.from_url(redis_cluster["url"]).flushall()
    return redis_cluster["url"]


def _timelines(client) -> dict:
    return {r["user_id"]: r["tweet_ids"] for r in export_timeline(client)}


def _feed(spark, settings, tmp_path, name, tweets, follows) -> None:
    ingest(spark, settings.lake, settings.topic("tweets"), [write_jsonl(tmp_path / f"t{name}.jsonl", tweets)])
    ingest(
        spark, settings.lake, settings.topic("follows"), [write_jsonl(tmp_path / f"f{name}.jsonl", follows)]
    )


def _mview(settings, *args) -> str:
    env = {**os.environ, **settings_env(settings)}
    done = subprocess.run([sys.executable, "-m", "jobs", *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_timeline_with_celebrities_replay_query_export_and_status(
    spark, tmp_path, redis_cluster, cluster_url
):
    settings = make_settings(
        tmp_path / "lake", cluster_url, TIMELINE_CAP=CAP, FANOUT_LIMIT=3, REDIS_CLUSTER="true"
    )
    wl = generate(seed=23, users=60, celebrities=3, follows=400, tweets=300)
    parts = list(
        zip(*(split_at_random(x, 2, random.Random(23)) for x in (wl.tweets, wl.follows)), strict=True)
    )
    client = connect(cluster_url, cluster=True)
    for i, (tweets, follows) in enumerate(parts):
        _feed(spark, settings, tmp_path, i, tweets, follows)
        run_timeline(spark, settings, once=True)
        seen = (sum((p[0] for p in parts[: i + 1]), []), sum((p[1] for p in parts[: i + 1]), []))
        assert _timelines(client) == expected_timelines(*seen, CAP)
    truth = expected_timelines(wl.tweets, wl.follows, CAP)
    assert client.scan_iter(match="mv:timeline.reads:1:*").__next__()  # some reads merged celebrities' tweets
    spread = [redis.Redis(port=p).dbsize() for p in redis_cluster["ports"]]
    assert all(n > 0 for n in spread), spread

    assert replay(spark, settings, "timeline") == 0
    assert int(client.get("mv:gen:timeline")) == 2 and _timelines(client) == truth
    for port in redis_cluster["ports"]:  # the old generation is gone from every master
        assert list(redis.Redis(port=port).scan_iter(match="mv:*:1:*")) == []

    user = max(truth, key=lambda u: len(truth[u]))
    shown = json.loads(_mview(settings, "query", "timeline", user, "--json"))
    assert [t["tweet_id"] for t in shown["tweets"]] == truth[user]
    exported = [json.loads(line) for line in _mview(settings, "export", "timeline").splitlines()]
    assert {r["user_id"]: r["tweet_ids"] for r in exported} == truth
    assert status_of(settings, "timeline")["generation"] == 2


@pytest.mark.slow
def test_clicks_and_enrichment_on_a_cluster_equal_their_definitions(spark, tmp_path, cluster_url):
    wl = generate_clicks(seed=3, sessions=60)
    want_sc, want_ctr = expected_clicks(wl.searches, wl.clicks, 10 * M)
    _, sc, ctr = run_clicks_chunked(spark, tmp_path, cluster_url, wl, 2, 3)
    assert sc == want_sc and ctr == want_ctr

    wl = generate_enrichment(seed=4)
    truth = expected_enriched(wl.profiles, wl.activity)
    settings = run_enrichment_chunked(spark, tmp_path, cluster_url, wl, 2, 4)
    assert {r["event_id"]: r for r in export_enriched(spark, settings.lake_dir, 1)} == truth
    counts = {r["country"]: r["events"] for r in export_activity_by_country(connect(cluster_url))}
    assert counts == expected_by_country(truth)


@pytest.mark.slow  # a deployed driver (a JVM of its own) and a cluster of its own
def test_a_deployed_job_waits_for_a_killed_master_and_converges_with_nothing_lost(spark, tmp_path):
    workdir = tmp_path / "cluster"
    workdir.mkdir()
    procs, ports = scratch_redis_cluster(workdir, persist=True)
    url = f"redis://127.0.0.1:{ports[0]}/0"
    settings = make_settings(
        tmp_path / "lake", url, TIMELINE_CAP=CAP, TRIGGER_INTERVAL="200 ms", REDIS_CLUSTER="true"
    )
    wl = generate(seed=29, users=50, celebrities=2, follows=300, tweets=300)
    parts = list(
        zip(*(split_at_random(x, 3, random.Random(29)) for x in (wl.tweets, wl.follows)), strict=True)
    )
    truths = [
        expected_timelines(
            sum((p[0] for p in parts[: i + 1]), []), sum((p[1] for p in parts[: i + 1]), []), CAP
        )
        for i in range(3)
    ]

    def caught_up(i) -> bool:
        s = status_of(settings, "timeline")
        if not (s["running"] and s["lag_versions"] == 0 and s.get("state") == "running"):
            return False
        try:
            return _timelines(connect(url, wait=False)) == truths[i]
        except Exception:  # noqa: BLE001 - the cluster is still coming back
            return False

    try:
        _feed(spark, settings, tmp_path, 0, *parts[0])
        assert deploy(settings, "timeline") == 0
        wait_for(lambda: caught_up(0), "the first input to be in the views")

        procs[1].send_signal(signal.SIGKILL)  # a master that holds a third of the slots
        procs[1].wait(10)
        _feed(spark, settings, tmp_path, 1, *parts[1])
        wait_for(
            lambda: "waiting for Redis" in str(status_of(settings, "timeline").get("redis", "")),
            "the job to say it waits for Redis",
        )
        procs[1] = start_cluster_node(ports[1], workdir, persist=True)
        wait_for(lambda: caught_up(1), "the views to be whole again after the master came back")
        s = status_of(settings, "timeline")
        assert s["generation"] == 1 and not s.get("rebuilds")  # nothing was lost: no rebuild

        _feed(spark, settings, tmp_path, 2, *parts[2])
        wait_for(lambda: caught_up(2), "the job to go on")
    finally:
        stop(settings, "timeline")
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
