"""A driver paused mid-batch and taken over (issue #41, item 9): the deployed `timeline` driver is stopped
(SIGSTOP of its process group) while a batch of unfollows is in flight; re-follows arrive; a second driver, started
by hand as on another machine (its own PID namespace, working directory and HOME), takes the job's lease once it
expired and applies both batches; then the first continues (SIGCONT). The first's stale batch changes nothing
(refused by the job's fence in Redis, `views.fence`, or stopped by its lease check before it writes), it stops
saying it lost the lease, and the timelines equal their definition."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from jobs.ops.deploy import settings_env
from tests.conftest import make_settings
from tests.devhelp import ingest_cli
from tests.jobs.opshelp import batch_in_flight, wait_for
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import export_timeline
from views.redis_io import connect

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

JOB, CAP, USERS, AUTHORS = "timeline", 40, 60, 3


def _records(op: str, ts: int) -> list[dict]:
    return [
        {"op": op, "follower_id": f"u{u}", "followee_id": f"a{a}", "ts": ts}
        for u in range(USERS)
        for a in range(AUTHORS)
    ]


def _tweets() -> list[dict]:
    return [
        {"op": "post", "tweet_id": f"t{a}-{i:03d}", "user_id": f"a{a}", "text": "x", "ts": 1_000 + 10 * i + a}
        for a in range(AUTHORS)
        for i in range(30)
    ]


def _driver(env: dict, place, *, namespace: bool) -> subprocess.Popen:
    """`python -m jobs run timeline` (the deployed job's loop) from `place` (its own HOME and working directory),
    in its own process group; with `namespace`, in its own PID namespace (as a driver on another machine). The group
    stays in this session: the kernel continues a stopped group that is orphaned (a new session's) whenever one of
    its processes exits."""
    (place / "home").mkdir(parents=True)
    cmd = [sys.executable, "-m", "jobs", "run", JOB]
    if namespace:
        cmd = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", *cmd]
    log = open(place / "driver.log", "wb")  # noqa: SIM115 - the driver's log, read by the test
    return subprocess.Popen(
        cmd,
        env={**env, "HOME": str(place / "home")},
        cwd=place,
        stdout=log,
        stderr=log,
        process_group=0,
    )


def test_a_paused_driver_taken_over_leaves_the_timelines_exact(redis_url, tmp_path):
    connect(redis_url).flushdb()
    settings = make_settings(
        tmp_path / "lake", redis_url, SPARK_MASTER="local[1]", SPARK_DRIVER_MEMORY="1g", METRICS_PORT="off",
        TIMELINE_CAP=CAP, TRIGGER_INTERVAL="200 ms",
    )  # fmt: skip
    env = {**os.environ, **settings_env(settings), "LEASE_TTL": "4 s", "PYTHONPATH": os.getcwd()}
    env.pop("XDG_STATE_HOME", None)
    tweets, follows = _tweets(), _records("follow", 2_000)
    unfollows, refollows = _records("unfollow", 3_000), _records("follow", 4_000)

    def timelines() -> dict:
        return {r["user_id"]: r["tweet_ids"] for r in export_timeline(connect(redis_url, wait=False))}

    ingest_cli(settings, tmp_path, "tweets", tweets)
    ingest_cli(settings, tmp_path, "follows", follows)
    first = _driver(env, tmp_path / "first", namespace=False)
    second = None
    try:
        truth = expected_timelines(tweets, follows, CAP)
        wait_for(lambda: timelines() == truth, "the first driver to catch up", timeout_s=600)
        checkpoint = tmp_path / "lake" / "checkpoints" / JOB / "g1"
        ingest_cli(settings, tmp_path, "follows", unfollows)
        wait_for(lambda: batch_in_flight(checkpoint), "the unfollows' batch to start", every_s=0.02)
        os.killpg(first.pid, signal.SIGSTOP)
        assert batch_in_flight(checkpoint)  # stopped before Spark committed the batch
        ingest_cli(settings, tmp_path, "follows", refollows)
        second = _driver(env, tmp_path / "second", namespace=True)
        truth = expected_timelines(tweets, follows + unfollows + refollows, CAP)  # as after the follows
        committed = checkpoint / "commits" / "2"  # the re-follows' batch: only the second driver runs now
        wait_for(committed.exists, "the second driver to apply both batches", timeout_s=600)
        assert timelines() == truth
        os.killpg(first.pid, signal.SIGCONT)
        assert first.wait(timeout=300) == 1
        assert "lost the job's lease" in (tmp_path / "first" / "driver.log").read_text(errors="replace")
        assert timelines() == truth and len(truth) == USERS
        assert second.poll() is None  # the second driver goes on
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
