"""The `kafka` job against a real broker, run as the CLI runs it (`mview produce` in a subprocess; `mview run
kafka --once` through `jobs.ops.cli.main` on the tests' Spark session, which has the Kafka source; deployed, a driver
of its own):

1. `mview produce` a workload with bad lines (status: lag = every message), `mview run kafka --once --json`: the
   Delta logs hold exactly what `mview ingest` of the same files stores, and the dead letters carry the same
   reasons, line by line, plus unique Kafka coordinates; a second `--once` copies nothing; no lag; every view of
   the three jobs over those logs equals the one over the ingested logs. Without a
   broker, or without KAFKA_BOOTSTRAP, `--once` is one line saying what to do.
2. deployed: input keeps arriving; kill -9 of the driver with a micro-batch in flight, deploy again; then the
   broker stopped under the job (status says it waits, `state: waiting`) and started again: every produced record
   is in the Delta log exactly once (counted), the lag returns to 0, and the status shows no stale error.
3. half a workload through Kafka, deleted there (as retention does), then the other half: the timeline view equals the
   view of the same records through `mview ingest`, and `replay` rebuilds it exactly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import orjson

from changelog.deadletters import read_dead_letters
from changelog.ingest import ingest
from changelog.records import MAX_RECORD_BYTES
from changelog.storage import as_lake
from changelog.topics import topic_path
from jobs.core.runtime import checkpoint_key, committed_batches
from jobs.ops.deploy import deploy, settings_env, stop
from tests.conftest import make_settings
from tests.jobs.opshelp import batch_in_flight, mview_here, status_of, wait_for
from tests.lakehelp import as_topic, log_rows
from views.pipeline import builtin_pipeline

JOB = "kafka"
TOPICS = tuple(builtin_pipeline().topics)  # the built-in pipeline's topics: the kafka job copies every one


def _dead(lake, topic) -> list[dict]:
    return list(read_dead_letters(as_lake(lake), as_topic(topic)))


def _mview(settings, *args, check=True) -> subprocess.CompletedProcess:
    env = {**os.environ, **settings_env(settings)}
    done = subprocess.run([sys.executable, "-m", "jobs", *args], env=env, capture_output=True, timeout=900)
    assert not check or done.returncode == 0, done.stderr.decode()[-3000:]
    return done


def _here(settings, *args) -> subprocess.CompletedProcess:
    done = mview_here(settings, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _workload() -> dict[str, list[bytes]]:
    tweets = [
        orjson.dumps({"op": "post", "tweet_id": f"t{i}", "user_id": f"u{i % 7}", "text": f"hi {i}", "ts": i})
        for i in range(1, 301)
    ]
    tweets[10:10] = [
        b"not json",
        b"[1,2]",
        b'{"op":"post","tweet_id":"t9999"}',
        b'{"op":"post","tweet_id":"","user_id":"u1","text":"x","ts":5}',
        b'{"op":"post","tweet_id":"t1","user_id":"u1","text":"x","ts":"2024-01-01T00:00:00"}',
        b'{"op":"post","tweet_id":"t1","user_id":"u1","text":"x","ts":9999999999999999}',
        b'{"op":"post","tweet_id":"\xff","user_id":"u1","text":"x","ts":5}',
        b'{"op":"shout","tweet_id":"t1"}',
        b'{"op":"post","tweet_id":"t0","user_id":"u1","text":"' + b"a" * MAX_RECORD_BYTES + b'","ts":5}',
    ]
    follows = [
        orjson.dumps({"op": "follow", "follower_id": f"u{i % 9}", "followee_id": f"u{i % 7}", "ts": i})
        for i in range(1, 101)
    ] + [b'{"op":"follow","follower_id":"u1","followee_id":"u\\u0001","ts":3}', b"{"]
    clicks = [
        orjson.dumps({"click_id": f"c{i}", "session_id": f"s{i % 5}", "url": "/x", "ts": i})
        for i in range(50)
    ] + [b'{"click_id":"c1","session_id":"s1","url":7,"ts":1}']
    minute = 60_000
    searches = [
        orjson.dumps(
            {"search_id": f"q{i}", "session_id": f"s{i % 5}", "query": f"w{i % 3}", "ts": i * 5 * minute}
        )
        for i in range(40)
    ] + [b'{"search_id":"q1","session_id":"s1","query":"w","ts":"yesterday"}']
    clicks += [
        orjson.dumps({"click_id": f"k{i}", "session_id": f"s{i % 5}", "url": "/y", "ts": i * 5 * minute + 5})
        for i in range(0, 40, 3)
    ]
    profiles = [
        orjson.dumps(
            {
                "op": "upsert",
                "user_id": f"u{i % 6}",
                "name": f"n{i}",
                "country": f"c{i % 4}",
                "ts": i * minute,
            }
        )
        for i in range(30)
    ] + [b'{"op":"upsert","user_id":"u1","name":"x","ts":1}']
    activity = [
        orjson.dumps({"event_id": f"e{i}", "user_id": f"u{i % 6}", "action": "view", "ts": i * minute + 7})
        for i in range(60)
    ] + [b'{"event_id":"e1","user_id":"u1","action":"view"}']
    return {
        "tweets": tweets,
        "follows": follows,
        "clicks": clicks,
        "searches": searches,
        "profiles": profiles,
        "activity": activity,
    }


def test_once_copies_what_ingest_stores_and_rejects_the_same_lines(spark, tmp_path, kafka, redis_url):
    base = redis_url.rsplit("/", 1)[0]
    settings = make_settings(tmp_path / "lake", f"{base}/3", **kafka)
    direct = tmp_path / "direct"  # the same files through `mview ingest`
    files = {}
    for topic, lines in _workload().items():
        files[topic] = tmp_path / f"{topic}.jsonl"
        files[topic].write_bytes(b"\n".join(lines) + b"\n")
        _mview(settings, "produce", topic, str(files[topic]))
        ingest(None, as_lake(direct), as_topic(topic), [str(files[topic])])

    assert status_of(settings, JOB)["lag_versions"] == sum(len(lines) for lines in _workload().values())
    out = json.loads(_here(settings, "run", JOB, "--once", "--json").stdout.splitlines()[-1])
    assert set(out) == set(TOPICS)
    for topic in TOPICS:
        stored, expected = log_rows(settings.lake_dir, topic), log_rows(direct, topic)
        key = lambda r: orjson.dumps(r, option=orjson.OPT_SORT_KEYS)  # noqa: E731
        assert sorted(stored, key=key) == sorted(expected, key=key), topic
        dead, want = _dead(settings.lake_dir, topic), _dead(direct, topic)
        assert out[topic] == {"accepted": len(stored), "rejected": len(dead)}
        verdicts = sorted((d["raw"], d["raw_bytes"], d["reason"]) for d in dead)
        assert verdicts == sorted((d["raw"], d["raw_bytes"], d["reason"]) for d in want), topic
        coords = [(d["topic"], d["partition"], d["offset"]) for d in dead]
        assert len(set(coords)) == len(coords)
        assert all(c[0] == f"{kafka['KAFKA_TOPIC_PREFIX']}{topic}" for c in coords)
    assert out["tweets"] == {"accepted": 300, "rejected": 9}

    versions = {
        t: sorted(os.listdir(Path(topic_path(settings.lake, settings.topic(t))) / "_delta_log"))
        for t in TOPICS
    }
    again = json.loads(_here(settings, "run", JOB, "--once", "--json").stdout.splitlines()[-1])
    assert again == {t: {"accepted": 0, "rejected": 0} for t in TOPICS}
    assert versions == {
        t: sorted(os.listdir(Path(topic_path(settings.lake, settings.topic(t))) / "_delta_log"))
        for t in TOPICS
    }
    assert sum(len(_dead(settings.lake_dir, t)) for t in TOPICS) == 9 + 2 + 1 + 1 + 1 + 1
    assert status_of(settings, JOB)["lag_versions"] == 0
    _views_equal(spark, settings, make_settings(direct, f"{base}/4"))


def _views_equal(spark, via_kafka, via_ingest) -> None:
    """Every view of the three jobs over the logs the kafka job wrote equals the one over the ingested logs."""
    from jobs.core.registry import jobs
    from views.read import export_view
    from views.redis_io import connect

    exports = []
    for settings in (via_kafka, via_ingest):
        views = {}
        for name in ("timeline", "clicks", "enrichment"):
            spec = jobs(settings)[name]
            spec.run(spark, settings, once=True)
            client = connect(settings.redis_url)
            for view in spec.views:
                rows = export_view(client, view, job=name, lake=settings.lake, spark=lambda: spark)
                views[view] = sorted(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in rows)
        exports.append(views)
    assert all(exports[0].values()), {
        v: len(rows) for v, rows in exports[0].items()
    }  # every view has content
    assert exports[0] == exports[1]


def test_once_without_broker_or_configuration_says_what_to_do(tmp_path, redis_url):
    settings = make_settings(tmp_path / "lake", redis_url, KAFKA_BOOTSTRAP="127.0.0.1:1")
    done = _mview(settings, "run", JOB, "--once", check=False)
    err = done.stderr.decode().strip().splitlines()
    assert done.returncode == 1 and len(err) == 1
    assert "KAFKA_BOOTSTRAP=127.0.0.1:1" in err[0] and "make kafka" in err[0]
    assert status_of(settings, JOB)["lag_versions"] is None  # the broker does not answer: unknown
    done = _mview(make_settings(tmp_path / "lake", redis_url), "run", JOB, "--once", check=False)
    assert done.returncode == 1 and b"Kafka is not configured: set KAFKA_BOOTSTRAP" in done.stderr


class _Producer(threading.Thread):
    """Produces numbered tweets in small files, one `mview produce` per chunk, until stopped."""

    def __init__(self, settings, tmp_path, chunk=3_000):
        super().__init__(daemon=True)
        self.settings, self.dir, self.chunk, self.n, self.halt = (
            settings,
            tmp_path,
            chunk,
            0,
            threading.Event(),
        )

    def produce(self) -> None:
        lines = [
            orjson.dumps({"op": "post", "tweet_id": f"t{i}", "user_id": f"u{i % 50}", "text": "x", "ts": i})
            for i in range(self.n, self.n + self.chunk)
        ]
        path = self.dir / f"chunk{self.n}.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        _mview(self.settings, "produce", "tweets", str(path))
        self.n += self.chunk

    def run(self) -> None:
        while not self.halt.wait(0.3):
            self.produce()


def test_deployed_job_kill9_and_broker_outage_copy_each_record_once(tmp_path, kafka, kafka_broker, redis_url):
    settings = make_settings(tmp_path / "lake", redis_url, TRIGGER_INTERVAL="200 ms", **kafka)
    producer = _Producer(settings, tmp_path)
    producer.produce()

    def exactly_once() -> bool:
        s = status_of(settings, JOB)
        if not (s["running"] and s["lag_versions"] == 0):
            return False
        ids = Counter(r["tweet_id"] for r in log_rows(settings.lake_dir, "tweets"))
        assert max(ids.values(), default=1) == 1, "a record was copied twice"
        return len(ids) == producer.n

    try:
        assert deploy(settings, JOB) == 0
        pid = status_of(settings, JOB)["pid"]
        producer.start()
        cp = checkpoint_key(JOB, 0)
        wait_for(lambda: committed_batches(settings.lake, cp), "a first committed batch")
        wait_for(lambda: batch_in_flight(settings.lake, cp), "a micro-batch in flight", every_s=0.02)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not status_of(settings, JOB)["running"], "the killed driver to be gone")
        assert deploy(settings, JOB) == 0
        producer.halt.set()
        producer.join()
        wait_for(exactly_once, "every record once after the kill", timeout_s=600)

        kafka_broker.stop()
        wait_for(
            lambda: "waiting for Kafka" in str(status_of(settings, JOB).get("kafka")), "status to say so"
        )
        assert status_of(settings, JOB)["state"] == "waiting"
        kafka_broker.start()
        producer.produce()
        wait_for(exactly_once, "every record once after the broker came back", timeout_s=600)
        assert status_of(settings, JOB)["kafka"] == "ok"
        wait_for(
            lambda: (s := status_of(settings, JOB))["state"] == "running" and s.get("last_error") is None,
            "no stale state or error once the broker answers",
            timeout_s=30,
        )
        stop(settings, JOB)
        assert "kafka" not in status_of(settings, JOB)  # what a running job saw, gone once it stopped
    finally:
        producer.halt.set()
        stop(settings, JOB)


def _delete_held(bootstrap: str, names: list[str]) -> None:
    """Delete every message the Kafka topics hold now (DeleteRecords up to each partition's end offset): the state
    retention leaves once it deleted a topic's old segments, without racing its clock."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from changelog.kafka import watermarks

    ends = [
        TopicPartition(n, p, hi)
        for n, parts in watermarks(bootstrap, names).items()
        for p, (_, hi) in parts.items()
    ]
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until every future is done
    for fut in admin.delete_records(ends).values():
        fut.result(30)


def test_timeline_through_kafka_equals_ingest_and_replay_outlives_retention(
    spark, tmp_path, kafka, redis_url
):
    """Half a workload through Kafka, then Kafka deletes it (as its retention does), then the other half: the
    timeline view equals the one of the same records through `mview ingest`, and `replay` rebuilds it exactly from
    the logs."""
    from changelog.kafka import watermarks
    from jobs.ops.replay import replay
    from tests.builtin import run_timeline
    from tests.jobs.opshelp import redis_content
    from timeline_demo.workload import generate
    from views.redis_io import connect

    wl = generate(seed=5, users=40, celebrities=1, follows=240, tweets=240)
    base = redis_url.rsplit("/", 1)[0]
    via_kafka = make_settings(tmp_path / "k", f"{base}/1", **kafka)
    via_ingest = make_settings(tmp_path / "i", f"{base}/2")
    names = [f"{kafka['KAFKA_TOPIC_PREFIX']}{t}" for t in ("tweets", "follows")]
    halves = {
        t: (getattr(wl, t)[: len(getattr(wl, t)) // 2], getattr(wl, t)[len(getattr(wl, t)) // 2 :])
        for t in ("tweets", "follows")
    }

    def deleted() -> bool:  # the first half is gone from Kafka
        marks = watermarks(kafka["KAFKA_BOOTSTRAP"], names)
        return all(
            sum(lo for lo, _ in marks[f"{kafka['KAFKA_TOPIC_PREFIX']}{t}"].values()) == len(halves[t][0])
            for t in halves
        )

    for half in (0, 1):
        for topic in ("tweets", "follows"):
            path = tmp_path / f"{topic}{half}.jsonl"
            path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in halves[topic][half]))
            _mview(via_kafka, "produce", topic, str(path))
            ingest(None, via_ingest.lake, via_ingest.topic(topic), [str(path)])
        if half == 1:
            assert deleted()
        _here(via_kafka, "run", JOB, "--once")
        if half == 0:
            _delete_held(kafka["KAFKA_BOOTSTRAP"], names)

    run_timeline(spark, via_kafka, once=True)
    run_timeline(spark, via_ingest, once=True)
    expected = redis_content(connect(via_ingest.redis_url), "timeline", 1)
    assert expected and redis_content(connect(via_kafka.redis_url), "timeline", 1) == expected
    assert replay(spark, via_kafka, "timeline") == 0
    assert redis_content(connect(via_kafka.redis_url), "timeline", 2) == expected
