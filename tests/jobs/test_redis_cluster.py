"""The three jobs on a real three-master Redis Cluster (REDIS_CLUSTER=true): every view equals its definition, a
replay switches generations and drops the old one on every master, `mview query`/`export`/`status` read it. (A
deployed job whose master is killed waits, retries and converges with nothing lost: `tests/jobs/ops/test_service.py`,
on that module's deployment.)"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import redis
from redis.cluster import RedisCluster

from changelog.ingest import ingest
from jobs.ops.deploy import settings_env
from jobs.ops.replay import replay
from tests.builtin import run_timeline
from tests.conftest import make_settings, split_at_random, write_jsonl
from tests.jobs.opshelp import status_of
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
