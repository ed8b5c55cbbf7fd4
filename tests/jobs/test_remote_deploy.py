"""A deployed job on a lake on HDFS or S3 (the session's `hdfs_server` or `s3_server`), driven through the installed
`mview` from two places of one machine, each with its own working directory and HOME, as a user on another machine
would. One deployment lives through both failures, one after the other:

- the store (the NameNode, or the S3 server) stopped under the running job for longer than the lease's validity:
  the job stops its query and waits (one log line, which `mview status` shows beside its one-line error about the
  lake, from this machine's files), takes its lease back once the store answers again, and continues: new input is
  processed exactly, by the same driver;
- then kill -9 of that driver mid-stream, and a deploy from the second place (no pid file, no local file of the
  first): the new driver takes the job's lease over (`jobs.core.lease`: the old driver's process is gone) and
  continues from the checkpoint in the lake; the timelines are exactly the reference's. From the second place
  `mview status` sees the driver (its lease), a second deploy says it runs, and `mview stop` stops it. On S3 no
  log or status of either place holds the secret key.

One store per run (`tests.devhelp.one_store`: MVIEW_TEST_STORE, by default HDFS and S3 on alternate days): above
`changelog.storage.Lake` the wait, the lease's renewal and take-over and the checkpoint are the same code on both;
the stores' own primitives, a store that does not answer included, are held on both in every run by
tests/changelog/test_storage.py."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest

from jobs.ops.deploy import settings_env
from tests.conftest import make_settings
from tests.devhelp import one_store_param
from tests.jobs.opshelp import MVIEW, status_of, wait_for, write_jsonl
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import export_timeline
from timeline_demo.workload import generate
from views.redis_io import connect

pytestmark = pytest.mark.e2e

JOB, CAP = "timeline", 10


class _Place:
    """A lake on the session's HDFS (or `server`'s S3 bucket), the workload in three slices, and `mview` run from
    named places (each its own working directory and HOME)."""

    def __init__(self, server, redis_url: str, tmp_path, *, s3: bool = False):
        connect(redis_url).flushdb()
        self.tmp, self.redis_url = tmp_path, redis_url
        name = f"deploy-{uuid.uuid4().hex[:8]}"
        self.settings = make_settings(
            f"s3a://{server.bucket}/{name}" if s3 else f"{server.url}/{name}",
            redis_url,
            **(server.env() if s3 else {}),
            SPARK_MASTER="local[1]",
            SPARK_DRIVER_MEMORY="1g",
            METRICS_PORT="off",
            TIMELINE_CAP=CAP,
            TRIGGER_INTERVAL="200 ms",
        )
        self.env = {
            k: v for k, v in {**os.environ, **settings_env(self.settings)}.items() if k != "XDG_STATE_HOME"
        }
        # every process of the lake (the CLI, the drivers) with one short lease TTL: the outage outlasts the
        # lease's validity sooner
        self.env["LEASE_TTL"] = "10 s"
        wl = generate(seed=5, users=20, celebrities=1, follows=90, tweets=90)
        self.tw = [wl.tweets[:30], wl.tweets[30:60], wl.tweets[60:]]
        self.fo = [wl.follows[:30], wl.follows[30:60], wl.follows[60:]]

    def cli(self, place: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        home, cwd = self.tmp / place / "home", self.tmp / place / "work"
        home.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            [MVIEW, *args],
            env={**self.env, "HOME": str(home)},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0 or not check, r.stdout[-2000:] + r.stderr[-3000:]
        return r

    def feed(self, i: int) -> dict:
        """`mview ingest` slice `i`; the reference timelines of the slices fed."""
        for topic, part in (("tweets", self.tw[i]), ("follows", self.fo[i])):
            self.cli("first", "ingest", topic, write_jsonl(self.tmp / f"{topic}{i}.jsonl", part))
        return expected_timelines(sum(self.tw[: i + 1], []), sum(self.fo[: i + 1], []), CAP)

    def timelines(self) -> dict:
        return {r["user_id"]: r["tweet_ids"] for r in export_timeline(connect(self.redis_url, wait=False))}

    def caught_up(self, truth: dict) -> bool:
        s = status_of(self.settings, JOB)
        return (
            s["running"]
            and s["lag_versions"] == 0
            and s.get("state") == "running"
            and self.timelines() == truth
        )

    def log(self, place: str) -> str:
        """The deployed job's log on this machine, as deployed from `place` (its HOME's state directory)."""
        found = sorted((self.tmp / place / "home").rglob("job.log"))
        return found[0].read_text(errors="replace") if found else ""


@pytest.fixture(params=one_store_param())
def store(request):
    """This run's remote store: ("hdfs" or "s3", the session's server of it)."""
    return request.param, request.getfixturevalue(f"{request.param}_server")


def test_an_outage_then_a_kill9_and_a_deploy_from_another_place_leave_the_timelines_exact(
    store, redis_url, tmp_path
):
    kind, server = store
    p = _Place(server, redis_url, tmp_path, s3=kind == "s3")
    settings, cli, feed, caught_up, timelines = p.settings, p.cli, p.feed, p.caught_up, p.timelines
    truth = feed(0)
    cli("first", "deploy", JOB)
    try:
        wait_for(lambda: caught_up(truth), "the job deployed from the first place to catch up", timeout_s=600)
        pid = status_of(settings, JOB)["pid"]  # from its lease: this process has no pid file of it
        assert isinstance(pid, int)

        # The store stopped for longer than the lease's validity: the job waits, and says so.
        seen = len(p.log("first"))  # what the log says from here on
        server.stop()
        try:
            wait_for(
                lambda: "the job's lease cannot be renewed" in p.log("first")[seen:],
                "the job to wait for the lake",
                timeout_s=180,
                every_s=1.0,
            )
            st = cli("first", "status", check=False)  # the lake does not answer: what this machine knows
            assert st.returncode == 1 and "LAKE_DIR" in st.stderr and len(st.stderr.strip().splitlines()) == 1
            assert f"{JOB}: running here (pid " in st.stdout and "lake does not answer): waiting" in st.stdout
        finally:
            server.start()
        wait_for(
            lambda: "the job's lease is renewed" in p.log("first")[seen:], "the lease back", timeout_s=180
        )
        truth = feed(1)
        wait_for(lambda: caught_up(truth), "the job to continue after the outage", timeout_s=600)
        assert status_of(settings, JOB)["pid"] == pid  # the same driver: it never exited

        # kill -9 of that driver, more input, and a deploy from a place with nothing of the first.
        os.kill(pid, signal.SIGKILL)
        truth = feed(2)
        wait_for(lambda: not status_of(settings, JOB)["running"], "the killed driver to be gone")
        assert "deployed" in cli("second", "deploy", JOB).stdout
        wait_for(
            lambda: caught_up(truth), "the driver deployed from the second place to catch up", timeout_s=600
        )
        assert status_of(settings, JOB)["pid"] not in (None, pid)
        assert "already running" in cli("second", "deploy", JOB).stdout
        assert '"running": true' in cli("second", "status", "--json").stdout
        cli("second", "stop", JOB)
        assert not status_of(settings, JOB)["running"] and status_of(settings, JOB)["state"] == "stopped"
        assert timelines() == truth
        if kind == "s3":  # the secret key reached no log or status of either place
            secret = server.credentials["AWS_SECRET_ACCESS_KEY"]
            logs = [p.log("first"), p.log("second")]
            assert secret and all(logs)
            assert (
                secret not in "".join(logs) + st.stdout + st.stderr + cli("second", "status", "--json").stdout
            )
    finally:
        cli("second", "stop", JOB, check=False)
