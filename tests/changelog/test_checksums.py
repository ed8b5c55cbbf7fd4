"""Version checksums of the topic logs: written after every delta-rs commit, exact by Delta's own validation
(Spark compares a checksum with the table's reconstructed state), used by Spark for the protocol and metadata,
and never written where they could be wrong."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from changelog.checksums import write_checksums
from changelog.storage import as_lake
from changelog.topics import RecordTable, append_table, ensure_topic, table_version
from tests.lakehelp import as_topic


def checksum_path(log: Path, version: int) -> Path:
    return log / f"{version:020d}.crc"


def _tweets(n: int, tag: str):
    t = RecordTable(as_topic("tweets"))
    for i in range(n):
        t.add({"op": "tweet", "tweet_id": f"{tag}-{i}", "user_id": "u", "text": "x" * i, "ts": i})
    return t.table()


def _validate(spark, path: str) -> dict:
    """Spark's own check of the newest checksum against the state it reconstructs from the log (raises on a
    mismatch: `checksum.mismatch.fatal`), and the checksum it read."""
    jvm = spark._jvm
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog
    delta_log.clearCache()
    log = delta_log.forTable(spark._jsparkSession, path)
    none = jvm.scala.Option.empty()
    snap = log.update(False, none, none)
    assert snap.checksumOpt().isDefined(), "Spark found no checksum for the newest version"
    spark.conf.set("spark.databricks.delta.checksum.mismatch.fatal", "true")
    ok = snap.validateChecksum(jvm.PythonUtils.toScalaMap({"context": "test"}))
    crc = snap.checksumOpt().get()
    return {"ok": ok, "files": crc.numFiles(), "bytes": crc.tableSizeBytes(), "version": snap.version()}


def test_every_commit_gets_an_exact_checksum_that_spark_validates(spark, tmp_path):
    path = ensure_topic(None, as_lake(tmp_path), as_topic("tweets"))
    log = Path(path) / "_delta_log"
    assert checksum_path(log, 0).exists()
    for k in range(3):
        append_table(as_lake(path), _tweets(5 + k, f"a{k}"), note="test", time="ts")
    assert all(checksum_path(log, v).exists() for v in range(4))
    got = _validate(spark, path)
    assert got == {"ok": True, "files": 3, "bytes": got["bytes"], "version": 3}
    assert got["bytes"] == sum(p.stat().st_size for p in Path(path).glob("*.parquet"))
    assert not list(log.glob(".*.tmp"))


def test_concurrent_appenders_leave_a_complete_exact_chain(spark, tmp_path):
    path = ensure_topic(None, as_lake(tmp_path), as_topic("tweets"))
    errors = []

    def appender(w: int) -> None:
        try:
            for k in range(4):
                append_table(as_lake(path), _tweets(3, f"w{w}-{k}"), note="test", time="ts")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=appender, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    log = Path(path) / "_delta_log"
    assert table_version(as_lake(path)) == 16
    assert all(checksum_path(log, v).exists() for v in range(17))
    assert _validate(spark, path)["files"] == 16


def test_a_chain_resumes_from_a_spark_checksum_and_spark_goes_on_from_ours(spark, tmp_path):
    """Spark's compaction of a topic (remove + add, its own checksum), then delta-rs appends again."""
    path = ensure_topic(None, as_lake(tmp_path), as_topic("tweets"))
    for k in range(3):
        append_table(as_lake(path), _tweets(4, f"b{k}"), note="test", time="ts")
    spark.read.format("delta").load(path).repartition(1).write.format("delta").mode("overwrite").option(
        "dataChange", "false"
    ).save(path)
    append_table(as_lake(path), _tweets(2, "after"), note="test", time="ts")
    got = _validate(spark, path)
    assert got["ok"] and got["version"] == 5 and got["files"] == 2
    assert spark.read.format("delta").load(path).count() == 14


@pytest.mark.parametrize(
    "action, why",
    [
        (
            {"remove": {"path": "x.parquet", "deletionTimestamp": 1, "dataChange": True}},
            "a remove without size",
        ),
        ({"commitInfo": {"operation": "COMPUTE STATS"}}, "an operation that re-adds files"),
        (
            {
                "protocol": {
                    "minReaderVersion": 3,
                    "minWriterVersion": 7,
                    "readerFeatures": ["deletionVectors"],
                }
            },
            "features",
        ),
    ],
)
def test_no_checksum_where_it_could_be_wrong(tmp_path, action, why):
    path = ensure_topic(None, as_lake(tmp_path), as_topic("tweets"))
    append_table(as_lake(path), _tweets(2, "c"), note="test", time="ts")
    log = Path(path) / "_delta_log"
    (log / f"{2:020d}.json").write_text(json.dumps(action) + "\n")  # a commit by some other writer
    assert write_checksums(as_lake(path), 2) == 0, why
    assert not checksum_path(log, 2).exists()
    assert checksum_path(log, 1).exists()


def test_a_long_log_without_checksums_gets_none_until_a_spark_commit(tmp_path):
    """A log that grew without checksums (older lakes): an append does not re-read it from version 0."""
    from changelog import checksums

    path = ensure_topic(None, as_lake(tmp_path), as_topic("tweets"))
    log = Path(path) / "_delta_log"
    for k in range(checksums._MAX_WALK + 1):
        append_table(as_lake(path), _tweets(1, f"d{k}"), note="test", time="ts")
    for crc in log.glob("*.crc"):
        crc.unlink()
    append_table(as_lake(path), _tweets(1, "last"), note="test", time="ts")
    assert not list(log.glob("*.crc"))
    assert write_checksums(as_lake(path), 3) == 4  # a short log is derived from version 0
