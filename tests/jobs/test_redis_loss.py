"""Redis loses the serving copy (restart without persistence, FLUSHALL): the service notices it against the
lake and rebuilds the views from the logs by itself, into a new generation, saying so in the log and the status.

1. Detection and `run --once`, without a deployed job: after FLUSHALL the lost pointer is named; with the
   pointer back but the meta hash gone, the meta hash is named and a later batch cannot re-create it; `run
   --once` rebuilds the exact view into generation 2 instead of writing new changes into an empty generation.
2. A deployed timeline job, Redis SIGKILLed and restarted empty on the same port with input ingested while it
   was down: no manual step, every timeline equals the reference again, the log and status say a rebuild
   happened. A reader polls all along; the longest time a reader got an empty timeline that the logs say is not
   empty is measured and printed (readers follow the pointer, which is gone until the rebuilt generation is
   switched in).
"""

from __future__ import annotations

import threading
import time

import redis

from changelog.ingest import ingest
from jobs.deploy import deploy, log_path, stop
from jobs.generations import record_batch, serving_copy_lost
from jobs.registry import JOBS
from jobs.timeline import run_timeline
from tests.conftest import make_settings
from tests.jobs.opshelp import OwnRedis, status_of, wait_for, write_jsonl
from timeline_demo.reference import expected_timelines
from timeline_demo.workload import generate
from views.timeline import export_timeline, query_timeline

JOB = "timeline"
CAP = 20


def _parts(records, n):
    size = -(-len(records) // n)
    return [records[i * size : (i + 1) * size] for i in range(n)]


def _timelines(client) -> dict:
    return {r["user_id"]: r["tweet_ids"] for r in export_timeline(client)}


def test_lost_serving_copy_is_detected_and_run_once_rebuilds_it(spark, tmp_path, redis_url, rclient, capsys):
    settings = make_settings(tmp_path / "lake", redis_url, TIMELINE_CAP=CAP)
    spec = JOBS[JOB]
    wl = generate(seed=5, users=40, celebrities=2, follows=240, tweets=200)
    tw, fo = _parts(wl.tweets, 2), _parts(wl.follows, 2)

    def feed(i):
        ingest(spark, settings.lake_dir, "tweets", [write_jsonl(tmp_path / f"t{i}.jsonl", tw[i])])
        ingest(spark, settings.lake_dir, "follows", [write_jsonl(tmp_path / f"f{i}.jsonl", fo[i])])

    assert serving_copy_lost(settings, rclient, spec) is None  # never published: nothing to lose
    feed(0)
    run_timeline(spark, settings, once=True)
    assert serving_copy_lost(settings, rclient, spec) is None
    assert _timelines(rclient) == expected_timelines(tw[0], fo[0], CAP)

    rclient.flushall()
    assert "mv:gen:timeline is gone" in serving_copy_lost(settings, rclient, spec)
    rclient.set("mv:gen:timeline", 1)
    assert "mv:meta:timeline:1 is gone" in serving_copy_lost(settings, rclient, spec)
    assert not record_batch(rclient, JOB, 1, 7, last_batch_ms=1)  # a later batch does not hide the loss
    assert "mv:meta:timeline:1 is gone" in serving_copy_lost(settings, rclient, spec)
    rclient.flushall()

    feed(1)
    run_timeline(spark, settings, once=True)  # what `mview run timeline --once` runs

    assert int(rclient.get("mv:gen:timeline")) == 2
    assert _timelines(rclient) == expected_timelines(wl.tweets, wl.follows, CAP)
    assert serving_copy_lost(settings, rclient, spec) is None
    assert list(rclient.scan_iter(match="mv:*:1:*")) == []
    assert "Redis lost the serving copy of timeline (the generation pointer" in capsys.readouterr().err


def test_deployed_job_rebuilds_after_redis_restarts_empty(spark, tmp_path, capsys):
    wl = generate(seed=17, users=50, celebrities=2, follows=300, tweets=300)
    tw, fo = _parts(wl.tweets, 3), _parts(wl.follows, 3)
    own = OwnRedis(tmp_path / "redis", persist=False).start()
    settings = make_settings(tmp_path / "lake", own.url(0), TIMELINE_CAP=CAP, TRIGGER_INTERVAL="200 ms")
    truths = [expected_timelines(sum(tw[: i + 1], []), sum(fo[: i + 1], []), CAP) for i in range(3)]
    # Users whose true timeline is non-empty whatever part of the input the logs hold at the time of a read.
    users = sorted(set.intersection(*(set(t) for t in truths)))
    assert len(users) > 20

    def feed(i):
        ingest(spark, settings.lake_dir, "tweets", [write_jsonl(tmp_path / f"t{i}.jsonl", tw[i])])
        ingest(spark, settings.lake_dir, "follows", [write_jsonl(tmp_path / f"f{i}.jsonl", fo[i])])

    def caught_up(gen):
        s = status_of(settings, JOB)
        return (
            s["running"] and s["generation"] == gen and s["lag_versions"] == 0 and s.get("state") == "running"
        )

    empty_since: dict[str, float] = {}
    stretches: list[float] = []
    errors, states, done = [], set(), threading.Event()

    def reader():
        client = redis.Redis.from_url(own.url(0), socket_connect_timeout=1, socket_timeout=2)
        while not done.is_set():
            for u in users:
                try:
                    r = query_timeline(client, u)
                except (redis.ConnectionError, redis.TimeoutError):
                    errors.append(time.monotonic())
                    time.sleep(0.05)
                    continue
                now = time.monotonic()
                if not r["tweets"]:
                    empty_since.setdefault(u, now)
                elif u in empty_since:
                    stretches.append(now - empty_since.pop(u))

    def status_watch():
        while not done.wait(0.3):
            states.add(status_of(settings, JOB).get("state"))

    threads = [threading.Thread(target=reader), threading.Thread(target=status_watch)]
    try:
        feed(0)
        assert deploy(settings, JOB) == 0
        wait_for(lambda: caught_up(1), "the first input to be processed")
        assert _timelines(redis.Redis.from_url(own.url(0))) == truths[0]
        for t in threads:
            t.start()

        own.kill()
        feed(1)  # ingested while Redis is down
        own.start()  # same port, no data
        restarted = time.monotonic()

        wait_for(
            lambda: caught_up(2) and _timelines(redis.Redis.from_url(own.url(0))) == truths[1],
            "the views to be whole again without a manual step",
        )
        whole_after = time.monotonic() - restarted
        s = status_of(settings, JOB)
        assert s["rebuilds"] == 1 and s["last_rebuild"]["generation"] == 2
        assert "mv:gen:timeline is gone" in s["last_rebuild"]["reason"]
        assert "rebuilding" in states
        text = log_path(settings, JOB).read_text()
        assert (
            "Redis lost the serving copy of timeline (the generation pointer mv:gen:timeline is gone" in text
        )
        assert "rebuilding generation 2 from the logs" in text

        feed(2)  # the job goes on, on generation 2
        wait_for(
            lambda: caught_up(2) and _timelines(redis.Redis.from_url(own.url(0))) == truths[2],
            "the job to continue on generation 2",
        )
        done.set()
        for t in threads:
            t.join()
        stretches.extend(time.monotonic() - since for since in empty_since.values())
        assert not empty_since, f"still empty at the end: {sorted(empty_since)[:5]}"
        longest = max(stretches, default=0.0)
        with capsys.disabled():
            print(
                f"\nredis loss: longest empty answer for a non-empty timeline {longest:.1f}s "
                f"({len(stretches)} empty stretches; views whole again {whole_after:.0f}s after the restart "
                f"at the latest; {len(errors)} reads failed while Redis was down)"
            )
        assert s["rebuilds"] == status_of(settings, JOB)["rebuilds"]  # no second rebuild
    finally:
        done.set()
        for t in threads:
            if t.is_alive():
                t.join()
        stop(settings, JOB)
        own.stop()
