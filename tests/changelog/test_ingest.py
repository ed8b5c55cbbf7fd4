import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest
from deltalake import DeltaTable

from changelog import records
from changelog.errors import NotStored
from changelog.ingest import deadletter_path, ingest
from changelog.records import MAX_RECORD_BYTES
from changelog.topics import ensure_topic, latest_version, read_batch, read_stream, topic_path, topic_schema

MVIEW = str(Path(sys.executable).with_name("mview"))


def test_ingest_appends_valid_records_one_commit_per_file_and_dead_letters_the_rest(spark, tmp_path):
    lake = tmp_path / "lake"
    a = tmp_path / "a.jsonl"
    a.write_text(
        '{"op":"follow","follower_id":"u1","followee_id":"u2","ts":"2026-01-01T00:00:00Z"}\n'
        "garbage\n"
        "\n"
        '{"op":"unfollow","follower_id":"u1","followee_id":"u2","ts":1767225600001}\n'
    )
    b = tmp_path / "b.jsonl"
    b.write_text('{"op":"block","follower_id":"u1","followee_id":"u2","ts":1}\n')
    result = ingest(spark, lake, "follows", [str(a), str(b)])
    assert result.summary() == {"topic": "follows", "accepted": 2, "rejected": 2}
    # version 0 creates the table; file a is one commit; file b has no valid line and makes none
    assert latest_version(lake, "follows") == 1
    rows = sorted(tuple(r) for r in read_batch(spark, lake, "follows").collect())
    assert rows == [("follow", "u1", "u2", 1767225600000), ("unfollow", "u1", "u2", 1767225600001)]
    dead = [json.loads(x) for x in deadletter_path(lake, "follows").read_text().splitlines()]
    assert [(d["file"], d["line"]) for d in dead] == [(str(a), 2), (str(b), 1)]
    assert "not valid JSON" in dead[0]["reason"] and "unknown op" in dead[1]["reason"]
    assert dead[0]["raw"] == "garbage"
    assert deadletter_path(lake, "follows").stat().st_mode & 0o777 == 0o600  # raw input: its owner's only


def _post(tweet_id: str, text: str = "hi", ts: int = 1767225600000) -> bytes:
    return orjson.dumps({"op": "post", "tweet_id": tweet_id, "user_id": "u1", "text": text, "ts": ts})


def _texts(spark, lake) -> list[tuple]:
    return sorted(
        (r.tweet_id, r.text) for r in read_batch(spark, lake, "tweets").select("tweet_id", "text").collect()
    )


def test_a_line_over_the_maximum_record_size_is_dead_lettered_with_a_bounded_prefix(spark, tmp_path):
    """A 25 MB line is rejected with its size and a 1,000-character prefix; a line of exactly the maximum is kept."""
    lake, src = tmp_path / "lake", tmp_path / "big.jsonl"
    huge = _post("big", "x" * 25_000_000)
    at_max = _post("max", "")
    at_max = _post("max", "y" * (MAX_RECORD_BYTES - len(at_max)))
    assert len(at_max) == MAX_RECORD_BYTES
    src.write_bytes(_post("t1") + b"\n" + huge + b"\r\n" + at_max + b"\n" + _post("t2") + b"\n")
    result = ingest(spark, lake, "tweets", [str(src)])
    assert result.summary() == {"topic": "tweets", "accepted": 3, "rejected": 1}
    expected = [("max", "y" * (MAX_RECORD_BYTES - len(_post("max", "")))), ("t1", "hi"), ("t2", "hi")]
    assert _texts(spark, lake) == expected
    raw = deadletter_path(lake, "tweets").read_bytes()
    assert len(raw) < 2_000
    (dead,) = [json.loads(x) for x in raw.splitlines()]
    assert dead["reason"] == (
        f"record of {len(huge):,} bytes exceeds the maximum record size of {MAX_RECORD_BYTES:,} bytes"
    )
    assert (dead["file"], dead["line"], dead["raw_bytes"]) == (str(src), 2, len(huge))
    assert dead["raw"] == huge[:1000].decode()


def test_a_validated_record_that_does_not_fit_the_topic_schema_exactly_is_not_stored(tmp_path, monkeypatch):
    """A validation bug that lets a boolean through as `ts` (Arrow would store it as 1) fails the whole file:
    nothing of it is committed."""
    monkeypatch.setattr(records, "parse_ts", lambda value: True)
    lake, src = tmp_path / "lake", tmp_path / "bool.jsonl"
    src.write_bytes(_post("t1") + b"\n" + _post("t2") + b"\n")
    with pytest.raises(NotStored) as e:
        ingest(None, lake, "tweets", [str(src)])
    assert str(e.value).startswith(f"tweets: {src}: nothing was committed: the file's 2 validated record(s) ")
    assert "'ts'" in e.value.cause and "\n" not in str(e.value)
    assert latest_version(lake, "tweets") == 0  # the table was created; no append was committed


def test_a_byte_order_mark_is_dropped_at_the_start_of_a_file_only(spark, tmp_path):
    lake, src = tmp_path / "lake", tmp_path / "bom.jsonl"
    src.write_bytes(
        b"\xef\xbb\xbf" + _post("t1") + b"\n\xef\xbb\xbf" + _post("t2") + b"\n" + _post("t3") + b"\n"
    )
    result = ingest(spark, lake, "tweets", [str(src)])
    assert result.summary() == {"topic": "tweets", "accepted": 2, "rejected": 1}
    assert _texts(spark, lake) == [("t1", "hi"), ("t3", "hi")]
    (dead,) = [json.loads(x) for x in deadletter_path(lake, "tweets").read_text().splitlines()]
    assert dead["line"] == 2 and "byte order mark" in dead["reason"]


def test_concurrent_creators_of_a_topic_and_concurrent_appends_all_succeed(spark, tmp_path):
    """Threads racing to create a new topic and append to it all succeed, each record stored once (threads share
    one JVM here; the lake's lock is per open file, so they exclude each other as processes do)."""
    lake = tmp_path / "lake"
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def run(fn):
        start.wait()
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    creators = [
        threading.Thread(target=run, args=(lambda: ensure_topic(spark, lake, "tweets"),)) for _ in range(4)
    ]
    for t in creators:
        t.start()
    for t in creators:
        t.join()
    assert errors == [] and latest_version(lake, "tweets") == 0

    start = threading.Barrier(2)
    files = []
    for n in range(2):
        files.append(tmp_path / f"part{n}.jsonl")
        files[-1].write_bytes(b"".join(_post(f"p{n}-{i}") + b"\n" for i in range(50)))
    appenders = [
        threading.Thread(target=run, args=(lambda f=f: ingest(spark, lake, "tweets", [str(f)]),))
        for f in files
    ]
    for t in appenders:
        t.start()
    for t in appenders:
        t.join()
    assert errors == [] and latest_version(lake, "tweets") == 2
    assert _texts(spark, lake) == sorted((f"p{n}-{i}", "hi") for n in range(2) for i in range(50))


def test_two_mview_ingest_processes_creating_a_new_topic_at_once_both_succeed(spark, tmp_path):
    lake = tmp_path / "lake"
    env = {
        **os.environ,
        "LAKE_DIR": str(lake),
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "SPARK_MASTER": "local[1]",
        "SHUFFLE_PARTITIONS": "1",
    }
    files = []
    for n in range(2):
        files.append(tmp_path / f"producer{n}.jsonl")
        files[-1].write_bytes(b"".join(_post(f"p{n}-{i}") + b"\n" for i in range(20)))
    procs = [
        subprocess.Popen(
            [MVIEW, "ingest", "tweets", str(f), "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in files
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out.splitlines()[-1]) == {"topic": "tweets", "accepted": 20, "rejected": 0}
    assert latest_version(lake, "tweets") == 2
    assert _texts(spark, lake) == sorted((f"p{n}-{i}", "hi") for n in range(2) for i in range(20))


def _stream_once(spark, lake, topic: str, checkpoint: Path, out: Path) -> None:
    """One run of a streaming query over the topic's log (everything new since its checkpoint) into `out`."""
    q = (
        read_stream(spark, lake, topic)
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    q.awaitTermination()


def test_concurrent_ingest_processes_and_a_spark_writer_store_every_record_once(spark, tmp_path):
    """A topic created by Spark (a lake from before ingest wrote with delta-rs), a streaming query with its
    checkpoint, then four `mview ingest` processes (three files each) appending while Spark appends too: every
    record is in the log exactly once, Spark reads the log (also from a delta-rs checkpoint), and the streaming
    query resumes from its checkpoint across the delta-rs commits and sees every new record exactly once."""
    lake = tmp_path / "lake"
    path = str(topic_path(lake, "tweets"))
    schema = topic_schema("tweets")

    def spark_append(k: int) -> None:  # an idempotent write, as the kafka job makes them
        df = spark.createDataFrame(
            [("post", f"s{k}-{i}", "u1", "hi", 1767225600000 + i) for i in range(10)], schema
        )
        df.write.format("delta").mode("append").option("txnAppId", "w").option("txnVersion", k).save(path)

    spark.createDataFrame([], schema).write.format("delta").save(path)  # how Spark created topics
    spark_append(0)
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    _stream_once(spark, lake, "tweets", checkpoint, out)

    files = {}
    for n in range(4):
        for k in range(3):
            f = files.setdefault(n, [])
            f.append(tmp_path / f"p{n}-{k}.jsonl")
            f[-1].write_bytes(b"".join(_post(f"p{n}-{k}-{i}") + b"\n" for i in range(100)))
    env = {**os.environ, "LAKE_DIR": str(lake), "REDIS_URL": "redis://127.0.0.1:1/0"}
    procs = [
        subprocess.Popen(
            [MVIEW, "ingest", "tweets", *map(str, files[n]), "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    for k in range(1, 4):  # Spark appends while the processes run
        spark_append(k)
    for p in procs:
        out_, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out_.splitlines()[-1]) == {"topic": "tweets", "accepted": 300, "rejected": 0}

    expected = sorted(
        [f"s{k}-{i}" for k in range(4) for i in range(10)]
        + [f"p{n}-{k}-{i}" for n in range(4) for k in range(3) for i in range(100)]
    )
    assert latest_version(lake, "tweets") == 4 + 4 * 3  # version 0 created it; 4 Spark appends, 12 files
    DeltaTable(path).create_checkpoint()  # Spark must also read a checkpoint delta-rs wrote
    spark_append(3)  # a retried write: the checkpoint kept Spark's transaction id, so it is skipped
    got = [r.tweet_id for r in read_batch(spark, lake, "tweets").select("tweet_id").collect()]
    assert sorted(got) == expected
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("userMetadata").collect()
    assert sum(1 for r in history if (r[0] or "").startswith("ingest ")) == 12
    _stream_once(spark, lake, "tweets", checkpoint, out)
    streamed = [r.tweet_id for r in spark.read.parquet(str(out)).select("tweet_id").collect()]
    assert sorted(streamed) == expected  # the first run's 10 records, then every later one, each once


def test_append_dead_letters_adds_only_what_the_log_does_not_hold_of_each_group(tmp_path):
    """A replayed batch's dead letters are appended once per (group, position); lines of other sources (and a line
    that is not JSON) between them are passed over; the log stays readable by its owner only."""
    from changelog.ingest import append_dead_letters

    path = tmp_path / "dead" / "t.jsonl"

    def key(e):
        return (e["g"], e["p"]) if "g" in e else None

    def entries(*gp):
        return [{"g": g, "p": p} for g, p in gp]

    assert append_dead_letters(path, entries(("a", 1), ("a", 2), ("b", 5)), key) == 3
    with open(path, "ab") as f:
        f.write(b'{"file": "x.jsonl", "line": 1}\nnot json\n')
    assert append_dead_letters(path, entries(("a", 2), ("a", 3), ("b", 5), ("b", 6)), key) == 2
    assert append_dead_letters(path, entries(("a", 1)), key) == 0
    got = [orjson.loads(line) for line in path.read_bytes().splitlines() if line != b"not json"]
    assert [(e.get("g"), e.get("p")) for e in got] == [
        ("a", 1),
        ("a", 2),
        ("b", 5),
        (None, None),
        ("a", 3),
        ("b", 6),
    ]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
