"""A driver paused mid-batch and taken over (issue #41, item 9): the deployed `timeline` driver is stopped
(SIGSTOP of its process group) at the first list it rewrites in a batch of unfollows, with more round trips of its
sink still to send; re-follows arrive; a second driver, started by hand as on another machine (its own PID
namespace, working directory and HOME), takes the job's lease once it expired and applies both batches; then the
first continues (SIGCONT). Its stale writes change nothing (refused by the job's fence in Redis, `views.fence`),
it exits 1 saying it lost the lease, and the timelines equal their definition. Without the fence the rest of its
stale batch lands and some timelines lose the unfollowed author's entries for good.

On a remote lake, HDFS or S3 (the session's `tests.devhelp.hdfs_server` or `s3_server`, its own path or prefix):
the lease, the checkpoint and the tables are in that store, and the test reads the checkpoint through it
(`changelog.storage.Lake`). One store per run (`tests.devhelp.one_store`: MVIEW_TEST_STORE, by default HDFS and S3
on alternate days): above `changelog.storage.Lake` the take-over is the same code on every store, a local lake
included (the lease's create, the fence in Redis); the stores' own primitives (of racing creators exactly one wins,
an object is replaced whole, a store that does not answer is one error) are held on the local lake, HDFS and S3 in
every run by tests/changelog/test_storage.py, the lease on a local lake (a paused holder taken over included) and
on HDFS by tests/jobs/core/test_lease.py, and the fence of every view kind by tests/views/test_fence.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid

import pytest
import redis

from jobs.core.runtime import checkpoint_key, committed_batches
from jobs.ops.deploy import settings_env
from tests.conftest import make_settings
from tests.devhelp import ingest_cli, one_store_param
from tests.jobs.opshelp import batch_in_flight, wait_for
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import export_timeline
from views.redis_io import connect

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

JOB, CAP, USERS, AUTHORS = "timeline", 800, 240, 4


def _records(op: str, ts: int, authors=range(AUTHORS)) -> list[dict]:
    return [
        {"op": op, "follower_id": f"u{u}", "followee_id": f"a{a}", "ts": ts}
        for u in range(USERS)
        for a in authors
    ]


def _tweets() -> list[dict]:
    """400 tweets of each author: a follower's list is full (CAP) and stays full when one author is unfollowed, so
    the unfollows refill every list (DEL, ZADD of 800 entries: about 6 MB, several round trips of the sink)."""
    return [
        {
            "op": "post",
            "tweet_id": f"tweet-a{a}-{i:05d}",
            "user_id": f"a{a}",
            "text": "x",
            "ts": 1_000 + 10 * i + a,
        }
        for a in range(AUTHORS)
        for i in range(400)
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


def _pause_at_first_list_rewrite(redis_url: str, pid: int) -> threading.Event:
    """Watch Redis (MONITOR) and stop process group `pid` (SIGSTOP) at the first DEL of a timeline it sends, as
    the issue did: the rest of its batch (its sink's next round trips) is then still to send. The event is set once
    it is stopped."""
    paused = threading.Event()
    rewrite = re.compile(r"\bDEL mv:timeline:1:")

    def watch() -> None:
        with redis.Redis.from_url(redis_url).monitor() as m:
            for cmd in m.listen():
                if rewrite.search(cmd["command"]):
                    os.killpg(pid, signal.SIGSTOP)
                    paused.set()
                    return

    threading.Thread(target=watch, daemon=True, name="monitor").start()
    return paused


@pytest.fixture(params=one_store_param())
def lake(request) -> tuple[str, str, dict[str, str]]:
    """This run's remote store (the session's HDFS or S3 server, started here at its first use), its LAKE_DIR (its
    own path on HDFS, its own prefix in the bucket) and its environment (S3: its endpoint and credentials;
    `get_spark` adds S3A for them)."""
    store = request.param
    server = request.getfixturevalue(f"{store}_server")
    name = f"fencing-{uuid.uuid4().hex[:8]}"
    if store == "hdfs":
        return store, f"{server.url}/{name}", {}
    return store, f"s3a://{server.bucket}/{name}", server.env()


def test_a_paused_driver_taken_over_leaves_the_timelines_exact(lake, redis_url, tmp_path):
    connect(redis_url).flushdb()
    store, lake_dir, store_env = lake
    settings = make_settings(
        lake_dir, redis_url, SPARK_MASTER="local[1]", SPARK_DRIVER_MEMORY="1g", METRICS_PORT="off",
        TIMELINE_CAP=CAP, TRIGGER_INTERVAL="200 ms", SHUFFLE_PARTITIONS=1, **store_env,
    )  # fmt: skip
    assert settings.lake.kind == store
    env = {**os.environ, **settings_env(settings), "LEASE_TTL": "4 s", "PYTHONPATH": os.getcwd()}
    env.pop("XDG_STATE_HOME", None)
    tweets, follows = _tweets(), _records("follow", 2_000)
    unfollows, refollows = _records("unfollow", 30_000, [0]), _records("follow", 40_000, [0])

    def timelines() -> dict:
        return {r["user_id"]: r["tweet_ids"] for r in export_timeline(connect(redis_url, wait=False))}

    ingest_cli(settings, tmp_path, "tweets", tweets)
    ingest_cli(settings, tmp_path, "follows", follows)
    first = _driver(env, tmp_path / "first", namespace=False)
    second = None
    try:
        truth = expected_timelines(tweets, follows, CAP)
        wait_for(lambda: timelines() == truth, "the first driver to catch up", timeout_s=600)
        checkpoint = checkpoint_key(JOB, 1)  # read through the store (settings.lake), local or not
        paused = _pause_at_first_list_rewrite(redis_url, first.pid)
        ingest_cli(settings, tmp_path, "follows", unfollows)
        assert paused.wait(600), "the first driver never rewrote a list"
        assert batch_in_flight(settings.lake, checkpoint)  # stopped mid-batch: before Spark committed it
        ingest_cli(settings, tmp_path, "follows", refollows)
        second = _driver(env, tmp_path / "second", namespace=True)
        truth = expected_timelines(tweets, follows + unfollows + refollows, CAP)  # as after the follows
        wait_for(  # the re-follows' batch (2) committed: only the second driver runs now
            lambda: 2 in committed_batches(settings.lake, checkpoint),
            "the second driver to apply both batches",
            timeout_s=600,
        )
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
