import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from deltalake import DeltaTable

from changelog import records
from changelog.deadletters import deadletter_path, read_dead_letters
from changelog.errors import NotStored
from changelog.ingest import ingest
from changelog.records import MAX_RECORD_BYTES
from changelog.storage import as_lake
from changelog.topics import (
    MAX_BEFORE,
    ensure_topic,
    latest_version,
    read_batch,
    read_stream,
    topic_path,
    topic_schema,
)
from tests.lakehelp import as_topic, log_rows

MVIEW = str(Path(sys.executable).with_name("mview"))


def _dead_objects(lake, topic: str) -> list[Path]:
    """The topic's dead-letter objects on a local lake, in key order."""
    return sorted(Path(deadletter_path(as_lake(lake), as_topic(topic))).glob("*.jsonl"))


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
    result = ingest(spark, as_lake(lake), as_topic("follows"), [str(a), str(b)])
    assert result.summary() == {"topic": "follows", "accepted": 2, "rejected": 2}
    # version 0 creates the table; file a is one commit; file b has no valid line and makes none
    assert latest_version(as_lake(lake), as_topic("follows")) == 1
    rows = sorted(
        tuple(r) for r in read_batch(spark, as_lake(lake), as_topic("follows")).drop(MAX_BEFORE).collect()
    )
    assert rows == [("follow", "u1", "u2", 1767225600000), ("unfollow", "u1", "u2", 1767225600001)]
    dead = list(read_dead_letters(as_lake(lake), as_topic("follows")))
    assert [(d["file"], d["line"]) for d in dead] == [(str(a), 2), (str(b), 1)]
    assert "not valid JSON" in dead[0]["reason"] and "unknown op" in dead[1]["reason"]
    assert dead[0]["raw"] == "garbage"
    objects = _dead_objects(lake, "follows")  # one per file: its one piece
    assert len(objects) == 2 and all(p.name.startswith("ingest-") for p in objects)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in objects)  # raw input: its owner's only


def _post(tweet_id: str, text: str = "hi", ts: int = 1767225600000) -> bytes:
    return orjson.dumps({"op": "post", "tweet_id": tweet_id, "user_id": "u1", "text": text, "ts": ts})


def _texts(spark, lake) -> list[tuple]:
    return sorted(
        (r.tweet_id, r.text)
        for r in read_batch(spark, as_lake(lake), as_topic("tweets")).select("tweet_id", "text").collect()
    )


def test_a_line_over_the_maximum_record_size_is_dead_lettered_with_a_bounded_prefix(spark, tmp_path):
    """A 25 MB line is rejected with its size and a 1,000-character prefix; a line of exactly the maximum is kept."""
    lake, src = tmp_path / "lake", tmp_path / "big.jsonl"
    huge = _post("big", "x" * 25_000_000)
    at_max = _post("max", "")
    at_max = _post("max", "y" * (MAX_RECORD_BYTES - len(at_max)))
    assert len(at_max) == MAX_RECORD_BYTES
    src.write_bytes(_post("t1") + b"\n" + huge + b"\r\n" + at_max + b"\n" + _post("t2") + b"\n")
    result = ingest(spark, as_lake(lake), as_topic("tweets"), [str(src)])
    assert result.summary() == {"topic": "tweets", "accepted": 3, "rejected": 1}
    expected = [("max", "y" * (MAX_RECORD_BYTES - len(_post("max", "")))), ("t1", "hi"), ("t2", "hi")]
    assert _texts(spark, lake) == expected
    raw = b"".join(p.read_bytes() for p in _dead_objects(lake, "tweets"))
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
    monkeypatch.setattr(records, "parse_ts", lambda value, name="ts": True)
    lake, src = tmp_path / "lake", tmp_path / "bool.jsonl"
    src.write_bytes(_post("t1") + b"\n" + _post("t2") + b"\n")
    with pytest.raises(NotStored) as e:
        ingest(None, as_lake(lake), as_topic("tweets"), [str(src)])
    assert str(e.value).startswith(f"tweets: {src}: nothing was committed: the file's 2 validated record(s) ")
    assert "'ts'" in e.value.cause and "\n" not in str(e.value)
    assert (
        latest_version(as_lake(lake), as_topic("tweets")) == 0
    )  # the table was created; no append was committed


def test_a_byte_order_mark_is_dropped_at_the_start_of_a_file_only(spark, tmp_path):
    lake, src = tmp_path / "lake", tmp_path / "bom.jsonl"
    src.write_bytes(
        b"\xef\xbb\xbf" + _post("t1") + b"\n\xef\xbb\xbf" + _post("t2") + b"\n" + _post("t3") + b"\n"
    )
    result = ingest(spark, as_lake(lake), as_topic("tweets"), [str(src)])
    assert result.summary() == {"topic": "tweets", "accepted": 2, "rejected": 1}
    assert _texts(spark, lake) == [("t1", "hi"), ("t3", "hi")]
    (dead,) = read_dead_letters(as_lake(lake), as_topic("tweets"))
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
        threading.Thread(target=run, args=(lambda: ensure_topic(spark, as_lake(lake), as_topic("tweets")),))
        for _ in range(4)
    ]
    for t in creators:
        t.start()
    for t in creators:
        t.join()
    assert errors == [] and latest_version(as_lake(lake), as_topic("tweets")) == 0

    start = threading.Barrier(2)
    files = []
    for n in range(2):
        files.append(tmp_path / f"part{n}.jsonl")
        files[-1].write_bytes(b"".join(_post(f"p{n}-{i}") + b"\n" for i in range(50)))
    appenders = [
        threading.Thread(
            target=run, args=(lambda f=f: ingest(spark, as_lake(lake), as_topic("tweets"), [str(f)]),)
        )
        for f in files
    ]
    for t in appenders:
        t.start()
    for t in appenders:
        t.join()
    assert errors == [] and latest_version(as_lake(lake), as_topic("tweets")) == 2
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
    assert latest_version(as_lake(lake), as_topic("tweets")) == 2
    assert _texts(spark, lake) == sorted((f"p{n}-{i}", "hi") for n in range(2) for i in range(20))


def _stream_once(spark, lake, topic: str, checkpoint: Path, out: Path) -> None:
    """One run of a streaming query over the topic's log (everything new since its checkpoint) into `out`."""
    q = (
        read_stream(spark, as_lake(lake), as_topic(topic))
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    q.awaitTermination()


def test_concurrent_ingest_processes_and_a_spark_writer_store_every_record_once(spark, tmp_path):
    """A topic log, Spark's appends to it and a streaming query with its checkpoint, then four `mview ingest` processes (three files each) appending while Spark appends too: every
    record is in the log exactly once, Spark reads the log (also from a delta-rs checkpoint), and the streaming
    query resumes from its checkpoint across the delta-rs commits and sees every new record exactly once."""
    lake = tmp_path / "lake"
    path = str(topic_path(as_lake(lake), as_topic("tweets")))
    schema = topic_schema(as_topic("tweets"))

    def spark_append(k: int) -> None:  # an idempotent write, as the kafka job makes them
        df = spark.createDataFrame(
            [("post", f"s{k}-{i}", "u1", "hi", 1767225600000 + i) for i in range(10)], schema
        )
        df.write.format("delta").mode("append").option("txnAppId", "w").option("txnVersion", k).save(path)

    ensure_topic(None, as_lake(lake), as_topic("tweets"))
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
    assert (
        latest_version(as_lake(lake), as_topic("tweets")) == 4 + 4 * 3
    )  # version 0 created it; 4 Spark appends, 12 files
    DeltaTable(path).create_checkpoint()  # Spark must also read a checkpoint delta-rs wrote
    spark_append(3)  # a retried write: the checkpoint kept Spark's transaction id, so it is skipped
    got = [
        r.tweet_id for r in read_batch(spark, as_lake(lake), as_topic("tweets")).select("tweet_id").collect()
    ]
    assert sorted(got) == expected
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("userMetadata").collect()
    assert sum(1 for r in history if (r[0] or "").startswith("ingest ")) == 12
    _stream_once(spark, lake, "tweets", checkpoint, out)
    streamed = [r.tweet_id for r in spark.read.parquet(str(out)).select("tweet_id").collect()]
    assert sorted(streamed) == expected  # the first run's 10 records, then every later one, each once


def test_dead_letters_are_written_once_per_batch_and_read_in_key_order(tmp_path):
    """A replayed batch's dead letters are written once (its object exists: nothing is written); the reader gives
    every entry in key order; the objects stay readable by their owner only."""
    from changelog.deadletters import count_dead_letters, write_dead_letters

    lake = tmp_path / "lake"

    def entries(*ns):
        return [{"p": n} for n in ns]

    assert write_dead_letters(as_lake(lake), as_topic("tweets"), "kafka-a-000000000002", entries(3, 4))
    assert write_dead_letters(as_lake(lake), as_topic("tweets"), "kafka-a-000000000001", entries(1, 2))
    assert not write_dead_letters(
        as_lake(lake), as_topic("tweets"), "kafka-a-000000000001", entries(1, 2)
    )  # the batch replayed
    assert not write_dead_letters(
        as_lake(lake), as_topic("tweets"), "kafka-a-000000000003", []
    )  # nothing: no object
    assert [e["p"] for e in read_dead_letters(as_lake(lake), as_topic("tweets"))] == [1, 2, 3, 4]
    assert count_dead_letters(as_lake(lake), as_topic("tweets")) == 4
    assert [p.name for p in _dead_objects(lake, "tweets")] == [
        "kafka-a-000000000001.jsonl",
        "kafka-a-000000000002.jsonl",
    ]
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in _dead_objects(lake, "tweets"))
    assert (
        list(read_dead_letters(as_lake(lake), as_topic("follows"))) == []
        and count_dead_letters(as_lake(lake), as_topic("follows")) == 0
    )
    with pytest.raises(ValueError):
        write_dead_letters(as_lake(lake), as_topic("tweets"), "../x", entries(1))


# --- Retries, a full disk and the commit bound (#36 D6, D8): through the command line, as a user meets them. ---


def _ingest_cli(env: dict, *args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MVIEW, "ingest", "tweets", *map(str, args)],
        env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", **env},
        input=stdin,
        capture_output=True,
        timeout=600,
    )


def _summary(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _log_ids(lake: Path) -> list[str]:
    """Every tweet_id the tweets log holds, one per record (read with delta-rs, no Spark)."""
    return sorted(r["tweet_id"] for r in log_rows(lake, "tweets", sql="SELECT tweet_id FROM t"))


def _dead_lines(lake: Path, src) -> list[int]:
    """The lines of `src` the tweets dead letters hold, one per entry."""
    return sorted(
        e["line"] for e in read_dead_letters(as_lake(lake), as_topic("tweets")) if e["file"] == str(src)
    )


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    """The failure's one `mview:` line (no traceback, no Rust panic report)."""
    err = done.stderr.decode()
    lines = err.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("mview: "), err[-3000:]
    assert "Traceback" not in err and "panicked" not in err
    return lines[0]


def _write_tweets(
    path: Path, n: int, *, text=lambda i: "hi", bad_every: int = 100
) -> tuple[list[str], list[int]]:
    """`n` lines: tweets t<i>, and every `bad_every`-th line (the 8th of each hundred...) not JSON. Returns the
    ids of the valid ones and the line numbers of the invalid ones."""
    ids, bad = [], []
    with open(path, "wb") as f:
        for i in range(1, n + 1):
            if i % bad_every == 8:
                f.write(b"not json %d\n" % i)
                bad.append(i)
            else:
                f.write(_post(f"t{i}", text(i)) + b"\n")
                ids.append(f"t{i}")
    return ids, bad


@pytest.fixture
def small_fs(tmp_path):
    """A filesystem of 8 MB mounted at `tmp_path/small`: a tmpfs, or else an ext4 image on a loop device. Mounting
    needs root (as here and in CI); skipped, with the reason, where neither can be mounted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    image = tmp_path / "small.img"
    attempts = [
        [["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)]],
        [
            ["truncate", "-s", "8M", str(image)],
            ["mkfs.ext4", "-q", "-F", str(image)],
            ["mount", "-o", "loop", str(image), str(mnt)],
        ],
    ]
    why = []
    for steps in attempts:
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=60)
            except OSError as e:
                why.append(f"{step[0]}: {e}")
                break
            if done.returncode != 0:
                why.append(f"{' '.join(step[:3])}: {done.stderr.strip()}")
                break
        else:
            break
    else:
        pytest.skip(f"cannot mount a small filesystem to fill (needs root): {'; '.join(why)}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


def _fill(mnt: Path, leave: int) -> Path:
    """Fill the filesystem at `mnt` until about `leave` bytes are free; the filler's path (delete it to free)."""
    filler = mnt / "filler"
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_a_full_disk_fails_a_file_with_one_line_and_running_it_again_is_exact(tmp_path, small_fs):
    """LAKE_DIR runs full in the middle of a file committed in pieces (#36 D6): one `mview:` line naming the file,
    what it holds (lines 1-L committed) and what to do, no traceback, no Rust panic; the log holds exactly the
    records of lines 1-L and the dead-letter log exactly their dead letters (none of a piece whose commit
    failed). With room again, the same command goes on after line L: every record and every dead letter once."""
    lake = small_fs / "lake"
    src = tmp_path / "tweets.jsonl"
    rng = random.Random(5)  # text that does not compress: each piece takes its size on disk
    ids, bad = _write_tweets(src, 3000, text=lambda i: rng.randbytes(500).hex())
    env = {"LAKE_DIR": str(lake), "INGEST_COMMIT_RECORDS": "500"}
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    _summary(_ingest_cli(env, empty, "--json"))  # the topic exists; nothing committed
    filler = _fill(small_fs, 1_300_000)  # room for a piece or two of the file's 3 MB

    err = _one_error_line(_ingest_cli(env, src, "--json"))
    assert f"mview: tweets: {src}: committing lines " in err and "No space left on device" in err, err
    assert f"free space in LAKE_DIR ({lake})" in err and "run the same command again" in err, err
    committed = int(re.search(r"lines 1-([\d,]+) are committed", err)[1].replace(",", ""))
    assert 0 < committed < 3000 and f"it goes on after line {committed:,}" in err
    assert _log_ids(lake) == sorted(i for i in ids if int(i[1:]) <= committed)
    assert _dead_lines(lake, src) == [n for n in bad if n <= committed]

    filler.unlink()
    out = _summary(_ingest_cli(env, src, "--json"))
    assert out == {
        "topic": "tweets",
        "accepted": sum(1 for i in ids if int(i[1:]) > committed),
        "rejected": sum(1 for n in bad if n > committed),
        "already_committed": committed,
    }
    assert _log_ids(lake) == sorted(ids)
    assert _dead_lines(lake, src) == bad


def test_dead_letters_that_a_full_disk_kept_out_are_written_by_the_next_run_once(tmp_path, small_fs):
    """The commit of a file succeeds and its dead letters (a 900 KB line) find the disk full: they are written
    all or none, the one `mview:` line says which are missing, and the same command writes them once, committing
    nothing twice; a third run adds nothing."""
    lake = small_fs / "lake"
    src = tmp_path / "tweets.jsonl"
    src.write_bytes(_post("a") + b"\n{" + b"z" * 900_000 + b"\n" + _post("b") + b"\n")
    env = {"LAKE_DIR": str(lake)}
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    _summary(_ingest_cli(env, empty, "--json"))
    filler = _fill(small_fs, 300_000)

    err = _one_error_line(_ingest_cli(env, src, "--json"))
    assert "the dead letters of lines 1-3 are not written" in err and "lines 1-3 are committed" in err, err
    assert "run the same command again: it goes on after line 3 and writes those dead letters" in err, err
    assert _log_ids(lake) == ["a", "b"] and _dead_lines(lake, src) == []

    filler.unlink()
    out = _summary(_ingest_cli(env, src, "--json"))
    assert out == {"topic": "tweets", "accepted": 0, "rejected": 1, "already_committed": 3}
    again = _summary(_ingest_cli(env, src, "--json"))
    assert again == {"topic": "tweets", "accepted": 0, "rejected": 0, "already_committed": 3}
    assert _log_ids(lake) == ["a", "b"] and _dead_lines(lake, src) == [2]
    (dead,) = read_dead_letters(as_lake(lake), as_topic("tweets"))
    assert dead["raw_bytes"] == 900_001 and "not valid JSON" in dead["reason"]


def _peak_rss_mb(env: dict, *args) -> tuple[int, subprocess.CompletedProcess]:
    """The peak resident memory (MB) of one `mview ingest` process, and how it ended."""
    proc = subprocess.Popen(
        [MVIEW, "ingest", "tweets", *map(str, args)],
        env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.stdout.read(), proc.stderr.read()  # small: the summary, and nothing
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss // 1024, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_ingest_memory_is_bounded_by_the_commit_bound_not_the_file(tmp_path):
    """A 160 MB file with an 8 MiB commit bound (INGEST_COMMIT_BYTES) is committed in about 20 pieces, and the
    command's peak memory stays within 120 MB of ingesting one line, less than the file (#36 D8: the whole file
    was held until its one commit, 1.77 GB for 2.32 GB)."""
    src, one = tmp_path / "big.jsonl", tmp_path / "one.jsonl"
    rng = random.Random(3)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8000))
    ids, bad = _write_tweets(src, 40_000, text=lambda i: noise[i % 4000 :][:4000], bad_every=1000)
    assert src.stat().st_size > 160_000_000
    one.write_bytes(_post("x") + b"\n")
    env = {"INGEST_COMMIT_BYTES": str(8 << 20)}

    base, done = _peak_rss_mb({**env, "LAKE_DIR": str(tmp_path / "lake0")}, one, "--json")
    assert _summary(done)["accepted"] == 1
    peak, done = _peak_rss_mb({**env, "LAKE_DIR": str(tmp_path / "lake")}, src, "--json")
    assert _summary(done) == {"topic": "tweets", "accepted": len(ids), "rejected": len(bad)}
    assert peak - base < 120, f"peak {peak} MB, {peak - base} MB over one line's {base} MB"
    assert (
        latest_version(as_lake(tmp_path / "lake"), as_topic("tweets")) >= 18
    )  # committed in pieces of 8 MiB
    assert len(_log_ids(tmp_path / "lake")) == len(ids)


def test_ingest_killed_in_the_middle_of_a_file_then_run_again_stores_each_record_once(tmp_path):
    """`mview ingest` killed (SIGKILL) in the middle of a file, once some of it is stored (a few pieces committed,
    at whatever point of the next: its commit, its dead letters), then the same command: every record and every
    dead letter of the file exactly once, and the second run says which lines the first had committed (#36 D8)."""
    src = tmp_path / "tweets.jsonl"
    ids, bad = _write_tweets(src, 400_000, bad_every=1000)
    lake = tmp_path / "lake"
    env = {"LAKE_DIR": str(lake), "INGEST_COMMIT_RECORDS": "20000"}
    proc = subprocess.Popen(
        [MVIEW, "ingest", "tweets", str(src), "--json"],
        env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", **env},
        stdout=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if latest_version(as_lake(lake), as_topic("tweets")) >= 4 or len(_dead_lines(lake, src)) >= 60:
            break
        time.sleep(0.005)
    proc.kill()
    proc.communicate()
    assert proc.returncode == -9, "the first run ended before it could be killed in the middle of the file"

    out = _summary(_ingest_cli(env, src, "--json"))
    assert _log_ids(lake) == sorted(ids)
    assert _dead_lines(lake, src) == bad
    assert 0 < out.get("already_committed", 0) < 400_000 and out["accepted"] < len(ids), out


def test_a_file_ingested_again_goes_on_after_what_is_committed_and_a_changed_one_is_new(tmp_path):
    """The same file (real path, and its bytes up to what was committed) is ingested once: again, it commits
    nothing; grown at its end, only the new lines; changed in its committed part, it is a new file, ingested whole.
    Stdin is read once and never taken for an earlier input: each `-` is ingested whole."""
    lake = tmp_path / "lake"
    env = {"LAKE_DIR": str(lake)}
    src = tmp_path / "t.jsonl"
    src.write_bytes(b"".join(_post(f"t{i}") + b"\n" for i in range(8)) + b"bad\n\nbad too\n")
    assert _summary(_ingest_cli(env, src, "--json")) == {"topic": "tweets", "accepted": 8, "rejected": 2}
    again = _summary(_ingest_cli(env, src, "--json"))
    assert again == {"topic": "tweets", "accepted": 0, "rejected": 0, "already_committed": 11}
    text = _ingest_cli(env, src).stdout.decode()
    assert "accepted 0, rejected 0; lines 1-11 were committed before" in text
    with open(src, "ab") as f:
        f.write(_post("t8") + b"\nbad again\n")
    grown = _summary(_ingest_cli(env, src, "--json"))
    assert grown == {"topic": "tweets", "accepted": 1, "rejected": 1, "already_committed": 11}
    assert _log_ids(lake) == [f"t{i}" for i in range(9)] and len(_dead_lines(lake, src)) == 3

    src.write_bytes(src.read_bytes().replace(b'"t0"', b'"u0"'))  # same size, another file
    changed = _summary(_ingest_cli(env, src, "--json"))
    assert changed == {"topic": "tweets", "accepted": 9, "rejected": 3}
    for _ in range(2):
        piped = _summary(_ingest_cli(env, "-", "--json", stdin=_post("s1") + b"\n"))
        assert piped == {"topic": "tweets", "accepted": 1, "rejected": 0}
    assert _log_ids(lake).count("s1") == 2
