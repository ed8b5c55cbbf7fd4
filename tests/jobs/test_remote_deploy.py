"""A deployed job on a lake on HDFS (the session's `hdfs_server`), driven through the installed `mview` from two
places of one machine, each with its own working directory and HOME, as a user on another machine would: deploy
from the first, kill -9 its driver mid-stream, deploy from the second (no pid file, no local file of the first):
the new driver takes the job's lease over (`jobs.core.lease`: the old driver's process is gone) and continues from
the checkpoint in the lake; the timelines are exactly the reference's. From the second place `mview status` sees
the driver (its lease), a second deploy says it runs, and `mview stop` stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest

from jobs.ops.deploy import settings_env
from tests.conftest import make_settings
from tests.jobs.opshelp import MVIEW, status_of, wait_for, write_jsonl
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import export_timeline
from timeline_demo.workload import generate
from views.redis_io import connect

pytestmark = pytest.mark.e2e

JOB, CAP = "timeline", 10


def test_kill9_then_deploy_from_another_directory_and_home_continues_exactly(
    hdfs_server, redis_url, tmp_path
):
    connect(redis_url).flushdb()
    settings = make_settings(
        f"{hdfs_server.url}/deploy-{uuid.uuid4().hex[:8]}",
        redis_url,
        SPARK_MASTER="local[1]",
        SPARK_DRIVER_MEMORY="1g",
        METRICS_PORT="off",
        TIMELINE_CAP=CAP,
        TRIGGER_INTERVAL="200 ms",
    )
    env = {k: v for k, v in {**os.environ, **settings_env(settings)}.items() if k != "XDG_STATE_HOME"}

    def cli(place: str, *args: str) -> subprocess.CompletedProcess:
        home, cwd = tmp_path / place / "home", tmp_path / place / "work"
        home.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            [MVIEW, *args],
            env={**env, "HOME": str(home)},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        return r

    wl = generate(seed=5, users=20, celebrities=1, follows=90, tweets=90)
    tw, fo = [wl.tweets[:45], wl.tweets[45:]], [wl.follows[:45], wl.follows[45:]]

    def feed(i: int) -> dict:
        for topic, part in (("tweets", tw[i]), ("follows", fo[i])):
            cli("first", "ingest", topic, write_jsonl(tmp_path / f"{topic}{i}.jsonl", part))
        return expected_timelines(sum(tw[: i + 1], []), sum(fo[: i + 1], []), CAP)

    def timelines() -> dict:
        return {r["user_id"]: r["tweet_ids"] for r in export_timeline(connect(redis_url, wait=False))}

    def caught_up(truth: dict) -> bool:
        s = status_of(settings, JOB)
        return (
            s["running"] and s["lag_versions"] == 0 and s.get("state") == "running" and timelines() == truth
        )

    truth = feed(0)
    cli("first", "deploy", JOB)
    wait_for(lambda: caught_up(truth), "the job deployed from the first place to catch up", timeout_s=600)
    pid = status_of(settings, JOB)["pid"]  # from its lease: this process has no pid file of it
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    truth = feed(1)
    wait_for(lambda: not status_of(settings, JOB)["running"], "the killed driver to be gone")

    assert "deployed" in cli("second", "deploy", JOB).stdout
    wait_for(lambda: caught_up(truth), "the driver deployed from the second place to catch up", timeout_s=600)
    assert status_of(settings, JOB)["pid"] not in (None, pid)
    assert "already running" in cli("second", "deploy", JOB).stdout
    assert '"running": true' in cli("second", "status", "--json").stdout
    cli("second", "stop", JOB)
    assert not status_of(settings, JOB)["running"] and status_of(settings, JOB)["state"] == "stopped"
    assert timelines() == truth
