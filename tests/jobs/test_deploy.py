"""The timeline job run as a service (deploy/stop/status/replay), with real processes, a real redis-server
that the test stops and restarts, and SIGKILL in the middle of a micro-batch. One scenario, because each
deployed Spark driver costs tens of seconds here; every phase checks its own guarantee:

1. deploy is idempotent (a second deploy says so and keeps the same pid); status reports lag, then 0;
2. kill -9 of the driver while a micro-batch is in flight; status: not running, lag > 0 (the interrupted
   batch); deploy again: it resumes from the checkpoint;
3. Redis stopped under the running job: the log and status say "waiting for Redis", input keeps arriving;
   Redis started again: the job catches up;
4. replay while a reader queries continuously: every read is whole and correct, the generation goes 1 -> 2,
   generation 1's keys are gone; generation 2 is an uninterrupted run of the same logs from the start, and it
   equals, key by key, generation 1 as the killed, redeployed, Redis-starved job left it;
5. the deployed job continues on generation 2 with new input (every timeline equals the brute-force
   reference of all records); stop is idempotent.
"""

from __future__ import annotations

import os
import signal
import threading

from changelog.ingest import ingest
from jobs.deploy import deploy, log_path, stop
from jobs.replay import replay
from jobs.runtime import checkpoint_dir
from tests.conftest import make_settings
from tests.jobs.opshelp import OwnRedis, batch_in_flight, redis_content, status_of, wait_for, write_jsonl
from timeline_demo.reference import expected_timelines
from timeline_demo.workload import generate
from views.redis_io import connect
from views.timeline import export_timeline, query_timeline

JOB = "timeline"
CAP = 20


def _parts(records, n):
    size = -(-len(records) // n)
    return [records[i * size : (i + 1) * size] for i in range(n)]


def test_deployed_job_survives_kill9_redis_restart_and_replay(spark, tmp_path, capsys):
    wl = generate(seed=11, users=60, celebrities=2, follows=360, tweets=360)
    # A running job plans a batch per commit it sees, so each phase that only needs "input arrives" feeds one
    # topic (one commit, one micro-batch): tweets part 1 is killed mid-batch, follows part 1 waits for Redis.
    tw, fo = _parts(wl.tweets, 3), _parts(wl.follows, 3)
    own = OwnRedis(tmp_path / "redis").start()
    settings = make_settings(tmp_path / "lake", own.url(0), TIMELINE_CAP=CAP, TRIGGER_INTERVAL="200 ms")

    def feed(i, topics=("tweets", "follows")):
        if "tweets" in topics:
            ingest(spark, settings.lake_dir, "tweets", [write_jsonl(tmp_path / f"t{i}.jsonl", tw[i])])
        if "follows" in topics:
            ingest(spark, settings.lake_dir, "follows", [write_jsonl(tmp_path / f"f{i}.jsonl", fo[i])])

    def caught_up(gen=1):
        s = status_of(settings, JOB)
        return (
            s["running"] and s["generation"] == gen and s["lag_versions"] == 0 and s.get("state") == "running"
        )

    try:
        # 1. deploy, idempotently; the first input is processed (lag back to 0).
        feed(0)
        assert status_of(settings, JOB)["lag_versions"] > 0
        assert deploy(settings, JOB) == 0
        pid = status_of(settings, JOB)["pid"]
        assert pid is not None
        assert deploy(settings, JOB) == 0
        assert "already running" in capsys.readouterr().out
        assert status_of(settings, JOB)["pid"] == pid
        wait_for(caught_up, "the first input to be processed")

        # 2. kill -9 while a micro-batch is in flight; deploy again.
        feed(1, ["tweets"])
        wait_for(
            lambda: batch_in_flight(checkpoint_dir(settings, JOB, 1)), "a micro-batch in flight", every_s=0.02
        )
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not status_of(settings, JOB)["running"], "the killed driver to be gone")
        assert status_of(settings, JOB)["lag_versions"] > 0  # the interrupted batch is not committed
        assert deploy(settings, JOB) == 0
        pid2 = status_of(settings, JOB)["pid"]
        assert pid2 not in (None, pid)
        wait_for(caught_up, "the redeployed job to catch up")

        # 3. Redis stopped under the running job, input arrives, Redis comes back: the job catches up.
        own.stop()
        feed(1, ["follows"])
        wait_for(
            lambda: "waiting for Redis" in str(status_of(settings, JOB).get("redis")), "status to say so"
        )
        wait_for(lambda: "waiting for Redis at" in log_path(settings, JOB).read_text(), "the log to say so")
        own.start()
        wait_for(
            lambda: caught_up() and status_of(settings, JOB).get("redis") == "ok", "catch-up after Redis"
        )

        # 4. replay while a reader queries continuously. Generation 1 is what the interrupted job left.
        interrupted = redis_content(connect(own.url(0)), JOB, 1)
        want = expected_timelines(sum(tw[:2], []), sum(fo[:2], []), CAP)
        users = sorted(want)[:40]
        reads, problems, done = [], [], threading.Event()

        def reader():
            client = connect(own.url(0))
            while not done.is_set():
                for u in users:
                    try:
                        r = query_timeline(client, u)
                    except Exception as e:  # noqa: BLE001 - a failed read is what we look for
                        problems.append(f"{u}: {e!r}")
                        continue
                    got = [t["tweet_id"] for t in r["tweets"]]
                    if got != want.get(u, []) or any(t["user_id"] is None for t in r["tweets"]):
                        problems.append(f"{u} g{r['generation']}: {got} != {want.get(u, [])}")
                    reads.append(r["generation"])

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert replay(spark, settings, JOB) == 0
        finally:
            done.set()
            thread.join()
        assert not problems, problems[:5]
        assert reads and set(reads) == {1, 2} and reads[-1] == 2
        assert reads == sorted(reads)  # never back to the old generation
        client = connect(own.url(0))
        assert int(client.get("mv:gen:timeline")) == 2
        assert [k for k in client.scan_iter(match="mv:*:1:*")] == []
        assert not client.exists("mv:meta:timeline:1")
        assert not checkpoint_dir(settings, JOB, 1).exists()
        # The replay ran the same records uninterrupted: exactly the interrupted run's Redis content.
        assert len(interrupted) > 100
        assert redis_content(client, JOB, 2) == interrupted

        # 5. the deployed job continues on generation 2 with new input; stop, idempotently.
        feed(2)
        wait_for(lambda: caught_up(gen=2), "the deployed job to continue on generation 2")
        assert status_of(settings, JOB)["pid"] == pid2
        final = expected_timelines(wl.tweets, wl.follows, CAP)
        assert {r["user_id"]: r["tweet_ids"] for r in export_timeline(client)} == final
        assert stop(settings, JOB) == 0
        assert stop(settings, JOB) == 0
        assert "not running" in capsys.readouterr().out
        s = status_of(settings, JOB)
        assert not s["running"] and s["pid"] is None and s["state"] == "stopped"
    finally:
        stop(settings, JOB)
        own.stop()
