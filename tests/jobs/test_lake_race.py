"""Many writers of one topic on a lake on HDFS or S3 (the session's real servers), with no lock anywhere: two
`mview ingest` processes at a time and a deployed `kafka` job (delta-rs commits) append to `follows` while `mview
maintain --once` (Spark: the compaction to the deciding record per key, then OPTIMIZE) rewrites it.

The log is then read back version by version with delta-rs, as a reader on another machine would: the versions
are contiguous; every append version adds records, and their union is every record sent, each exactly once
(counted); every compaction version keeps a subset of the version before it that decides every key as it did
(the deciding records of the snapshot it read, plus what was appended since), and every OPTIMIZE version the
same records as the version before it, so no commit was lost or overwritten and no append was
dropped by a rewrite; the last version decides every key as all the records sent do."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter

import pytest

from changelog.topics import topic_key
from jobs.ops.deploy import deploy, stop
from tests.conftest import make_settings, write_jsonl
from tests.devhelp import one_store_param
from tests.jobs.opshelp import mview, status_of, wait_for
from tests.lakehelp import as_topic

pytestmark = pytest.mark.e2e

PAIRS = [(f"u{a}", f"u{b}") for a in range(6) for b in range(5) if a != b]  # 24 keys
T0 = 1_767_225_600_000


class _Records:
    """Follow and unfollow records over `PAIRS`, each with a time of its own (so every record is distinct)."""

    def __init__(self):
        self.n, self.sent, self.lock = 0, [], threading.Lock()

    def take(self, count: int) -> list[dict]:
        with self.lock:
            out = []
            for _ in range(count):
                follower, followee = PAIRS[(self.n * 7) % len(PAIRS)]
                op = "unfollow" if self.n % 5 == 3 else "follow"
                out.append(
                    {"op": op, "follower_id": follower, "followee_id": followee, "ts": T0 + self.n * 1000}
                )
                self.n += 1
            self.sent += out
            return out


def _row(r: dict) -> tuple:
    return (r["op"], r["follower_id"], r["followee_id"], int(r["ts"]))


def _deciding(rows) -> set[tuple]:
    """Per key the record that decides the table: the greatest time, an unfollow winning a tie (all times differ
    here), as `changelog.current` defines it."""
    best: dict = {}
    for r in rows:
        key = (r[1], r[2])
        if key not in best or (r[3], r[0] == "unfollow") > (best[key][3], best[key][0] == "unfollow"):
            best[key] = r
    return set(best.values())


@pytest.fixture(params=one_store_param())
def store_settings(request, tmp_path, redis_url, kafka):
    """Settings of a fresh lake on the session's HDFS or S3 server (this run's), the session's Kafka broker."""
    name = f"race-{uuid.uuid4().hex[:8]}"
    if request.param == "hdfs":
        lake, env = f"{request.getfixturevalue('hdfs_server').url}/{name}", {}
    else:
        server = request.getfixturevalue("s3_server")
        lake, env = f"s3a://{server.bucket}/{name}", server.env()
    return make_settings(
        lake,
        redis_url,
        **env,
        **kafka,
        SPARK_MASTER="local[1]",
        SPARK_DRIVER_MEMORY="1g",
        METRICS_PORT="off",
        TRIGGER_INTERVAL="200 ms",
        COMPACT_TOPICS="follows",
    )


def _ms(t: int) -> int:
    """Milliseconds from a timestamp cast to an integer in whichever unit the reader uses."""
    return t // 1_000_000 if t > 10**17 else t // 1000 if t > 10**14 else t


def _versions(settings) -> list[tuple[int, str, list[tuple]]]:
    """(version, operation, rows) of every version of the follows log, read with delta-rs."""
    from deltalake import DeltaTable, QueryBuilder

    uri, options = (
        settings.lake.delta_uri(topic_key(as_topic("follows"))),
        settings.lake.delta_options() or None,
    )
    ops = {h["version"]: h.get("operation", "") for h in DeltaTable(uri, storage_options=options).history()}
    out = []
    for v in sorted(ops):
        table = DeltaTable(uri, version=v, storage_options=options)
        got = (
            QueryBuilder()
            .register("t", table)
            .execute("SELECT op, follower_id, followee_id, CAST(ts AS BIGINT) AS ms FROM t")
            .read_all()
        )
        cols = (
            [got.column(c).to_pylist() for c in ("op", "follower_id", "followee_id", "ms")]
            if got.num_rows
            else []
        )
        rows = [(o, a, b, _ms(t)) for o, a, b, t in zip(*cols, strict=True)] if cols else []
        out.append((v, ops[v], rows))
    return out


def test_ingests_kafka_job_and_maintenance_commit_to_one_topic_at_once(store_settings, tmp_path):
    settings, records = store_settings, _Records()

    def send(command: str, records_: list[dict]) -> None:
        """`mview ingest follows` or `mview produce follows` (to Kafka, for the kafka job) of `records_`."""
        path = write_jsonl(tmp_path / f"{command}-{uuid.uuid4().hex[:6]}.jsonl", records_)
        r = mview(settings, command, "follows", path)
        assert r.returncode == 0, r.stderr[-2000:]

    send("ingest", records.take(120))  # five records per key: something to compact
    send("produce", records.take(30))
    reports, failures = [], []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                failures.append(e)

        return threading.Thread(target=run)

    done = threading.Event()  # maintenance finished: the appenders stop after their round in flight

    def appender() -> None:
        while not done.is_set():
            send("ingest", records.take(15))
            time.sleep(2)

    def producer() -> None:
        while not done.is_set():
            send("produce", records.take(10))
            time.sleep(2)

    def maintainer() -> None:
        try:
            # OPTIMIZE and VACUUM of every table on S3Proxy, beside three appenders and another test's JVMs
            r = mview(settings, "maintain", "--once", "--json", timeout=1500)
            assert r.returncode == 0, r.stderr[-2000:]
            reports.append(json.loads(r.stdout.strip().splitlines()[-1]))
        finally:
            done.set()

    try:
        assert deploy(settings, "kafka") == 0
        wait_for(
            lambda: status_of(settings, "kafka").get("lag_versions") == 0, "the kafka job's first copy", 600
        )
        threads = [guarded(appender) for _ in range(2)] + [guarded(producer), guarded(maintainer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        wait_for(
            lambda: status_of(settings, "kafka").get("lag_versions") == 0, "the kafka job to catch up", 600
        )
    finally:
        stop(settings, "kafka")

    versions = _versions(settings)
    assert [v for v, _, _ in versions] == list(range(len(versions)))
    sent = Counter(_row(r) for r in records.sent)
    appended, compactions, optimizes = Counter(), 0, 0
    for (_, _, before), (v, op, rows) in zip([(None, None, [])] + versions[:-1], versions, strict=True):
        if op == "OPTIMIZE":
            optimizes += 1
            assert Counter(rows) == Counter(before), f"version {v}: OPTIMIZE changed the records"
        elif not Counter(rows) - Counter(before) and len(rows) < len(before):
            # the deciding records of the snapshot it read, plus what was appended after that read
            compactions += 1
            assert _deciding(rows) == _deciding(before), f"version {v}: the compaction changed a decision"
        else:
            added = Counter(rows) - Counter(before)
            assert Counter(before) - Counter(rows) == Counter(), f"version {v} ({op}) dropped records"
            appended += added
    assert sum(appended.values()) == len(records.sent)
    assert appended == sent  # every record in the log exactly once
    assert reports[0]["errors"] == [] and "follows" in reports[0]["compacted"], reports
    assert compactions == 1 and optimizes >= 1, (compactions, optimizes, reports)
    assert _deciding(versions[-1][2]) == _deciding(sent)
