"""Redis failures as a user meets them through the installed `mview`: a password-protected server that is
unreachable, refuses the credentials, or is addressed with TLS on one side only. Every error is one line that
says what is wrong and what to do, and no output, status or log shows the password; permanent errors are not
retried; a deployed job stops at once while it waits for Redis, loses nothing, and a job whose credentials
stop working says so in its status and exits."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from changelog.ingest import ingest
from jobs.deploy import log_path, settings_env
from jobs.deploy import stop as stop_job
from jobs.runtime import checkpoint_dir
from tests.conftest import make_settings
from tests.jobs.opshelp import OwnRedis, batch_in_flight, status_of, wait_for, write_jsonl
from timeline_demo.reference import expected_timelines
from timeline_demo.workload import generate
from views.redis_io import connect
from views.timeline import export_timeline

MVIEW = str(Path(sys.executable).parent / "mview")
JOB, CAP, SECRET = "timeline", 20, "pw-S3cret"


def _mview(settings, *args, url: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **settings_env(settings)}
    if url is not None:
        env["REDIS_URL"] = url
    return subprocess.run([MVIEW, *args], env=env, capture_output=True, text=True, timeout=300)


def _one_line_error(r: subprocess.CompletedProcess, *expected: str) -> str:
    assert r.returncode != 0, r
    assert r.stdout == "" or "deployed" not in r.stdout, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mview: "), r.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _protected(tmp_path) -> OwnRedis:
    own = OwnRedis(tmp_path / "redis")
    own.password = SECRET
    return own.start()


def test_cli_errors_name_the_problem_and_never_show_the_password(tmp_path):
    own = _protected(tmp_path)
    settings = make_settings(tmp_path / "lake", own.url())
    settings.lake_dir.mkdir(parents=True)
    wrong, none = own.url().replace(SECRET, "wr0ng-pw"), own.url().replace(f":{SECRET}@", "")
    tls = own.url().replace("redis://", "rediss://")
    try:
        assert _mview(settings, "query", JOB, "u1").returncode == 0
        for url, expected in [
            (wrong, ("refused the credentials", "redis://:***@127.0.0.1")),
            (none, ("requires a password", "redis://:PASSWORD@host:port/db")),
            (tls, ("TLS handshake", "use redis:// for a plain port", "rediss://:***@127.0.0.1")),
        ]:
            for args in (("query", JOB, "u1"), ("deploy", JOB)):
                line = _one_line_error(_mview(settings, *args, url=url), *expected)
                assert "make redis" not in line and "wr0ng" not in line and SECRET not in line
        assert not (settings.lake_dir / "jobs" / JOB / "job.log").exists()  # no deploy started anything

        own.stop()
        line = _one_line_error(
            _mview(settings, "query", JOB, "u1"), "cannot reach Redis at redis://:***@127.0.0.1", "make redis"
        )
        assert SECRET not in line
        for args in (("status", "--json"), ("status",)):
            r = _mview(settings, *args)
            assert r.returncode == 0 and SECRET not in r.stdout + r.stderr, r
        status = json.loads(_mview(settings, "status", "--json").stdout)
        assert status[JOB]["redis"].startswith("cannot reach Redis at redis://:***@127.0.0.1")
    finally:
        own.stop()


def test_stop_while_waiting_for_redis_then_credentials_that_stop_working(spark, tmp_path):
    wl = generate(seed=5, users=40, celebrities=1, follows=240, tweets=240)
    half_t = len(wl.tweets) // 2
    own = _protected(tmp_path)
    settings = make_settings(
        tmp_path / "lake", own.url(), TIMELINE_CAP=CAP, TRIGGER_INTERVAL="200 ms", STOP_TIMEOUT="2 minutes"
    )

    def feed(name, topic, records):
        ingest(spark, settings.lake_dir, topic, [write_jsonl(tmp_path / f"{name}.jsonl", records)])

    def caught_up():
        s = status_of(settings, JOB)
        return s["running"] and s["lag_versions"] == 0 and s.get("state") == "running" and s["redis"] == "ok"

    try:
        feed("t0", "tweets", wl.tweets[:half_t])
        feed("f0", "follows", wl.follows)
        r = _mview(settings, "deploy", JOB)
        assert r.returncode == 0 and "deployed" in r.stdout, r
        wait_for(caught_up, "the first input to be processed")
        job_files = settings.lake_dir / "jobs" / JOB
        for name in ("job.log", "status.json"):
            assert stat.S_IMODE((job_files / name).stat().st_mode) == 0o600, name

        # Redis stops; a micro-batch waits for it; `mview stop` ends the job at once, not after STOP_TIMEOUT.
        own.stop()
        feed("t1", "tweets", wl.tweets[half_t:])
        wait_for(lambda: batch_in_flight(checkpoint_dir(settings, JOB, 1)), "a micro-batch waiting for Redis")
        wait_for(
            lambda: "waiting for Redis" in str(status_of(settings, JOB).get("redis")), "status to say so"
        )
        r = _mview(settings, "status", "--json")
        assert "waiting for Redis at redis://:***@" in r.stdout and SECRET not in r.stdout + r.stderr
        started = time.monotonic()
        r = _mview(settings, "stop", JOB)
        took = time.monotonic() - started
        assert r.returncode == 0 and "SIGKILL" not in r.stderr, r
        assert took < 30, f"stop took {took:.0f}s: it waited for Redis (STOP_TIMEOUT is 2 minutes)"
        s = status_of(settings, JOB)
        assert not s["running"] and s["state"] == "stopped"
        assert s["lag_versions"] > 0  # the interrupted batch is replayed at the next start

        # Redis back, deployed again: the replayed batch and everything else is exact.
        own.start()
        assert _mview(settings, "deploy", JOB).returncode == 0
        wait_for(caught_up, "the redeployed job to catch up")
        got = {r["user_id"]: r["tweet_ids"] for r in export_timeline(connect(own.url()))}
        assert got == expected_timelines(wl.tweets, wl.follows, CAP)

        # The password changes under the running job: it stops retrying, says why, and exits.
        own.stop()
        own.password = "n3w-pw"
        own.start()
        wait_for(lambda: not status_of(settings, JOB)["running"], "the job to give up", timeout_s=120)
        s = status_of(settings, JOB)
        assert s["state"] == "failed" and "refused the credentials" in s["error"], s
        r = _mview(settings, "deploy", JOB)  # still the old password
        _one_line_error(r, "refused the credentials")
        log = log_path(settings, JOB).read_text()
        assert "not retrying" in log and "waiting for Redis at redis://:***@" in log
        assert SECRET not in log and SECRET not in r.stdout + r.stderr
        assert stat.S_IMODE(log_path(settings, JOB).stat().st_mode) == 0o600
    finally:
        stop_job(settings, JOB)
        own.stop()
