"""The Kafka side of the changelog against a real broker: `mview produce` publishes every non-blank line as one
message, keyed by the record's entity, and says so; an unreachable broker is one line naming KAFKA_BOOTSTRAP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import orjson
from confluent_kafka import Consumer

from changelog.kafka import PARTITIONS, end_offsets, kafka_key, kafka_topic, probe
from changelog.storage import as_lake
from tests.lakehelp import as_topic
from views.pipeline import builtin_pipeline


def _consume(bootstrap: str, name: str, n: int) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "auto.offset.reset": "earliest"})
    c.subscribe([name])
    out = []
    try:
        while len(out) < n:
            msgs = c.consume(n - len(out), timeout=10)
            assert msgs, f"only {len(out)} of {n} messages arrived"
            out += [m for m in msgs if m.error() is None]
    finally:
        c.close()
    return out


def _mview(*args, env, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args], env=env, input=stdin, capture_output=True, timeout=120
    )


def test_produce_every_nonblank_line_keyed_by_entity(tmp_path, kafka, monkeypatch):
    lines = [
        b'{"op":"follow","follower_id":"u1","followee_id":"u2","ts":1}',
        b"not json",
        b'{"op":"follow","follower_id":"u1","followee_id":"u2","ts":2}',
        b'{"op":"unfollow","follower_id":"u3","followee_id":"u1","ts":3}',
        b'{"op":"follow","follower_id":"u1"}',
        b"[1,2]",
    ]
    src = tmp_path / "follows.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + b"\n  \n".join(lines) + b"\r\n\n")
    env = {**os.environ, **kafka, "LAKE_DIR": str(tmp_path / "lake")}
    done = _mview("produce", "follows", str(src), "-", "--json", env=env, stdin=b"\n" + lines[0] + b"\n")
    assert done.returncode == 0, done.stderr
    name = kafka_topic(kafka["KAFKA_TOPIC_PREFIX"], as_topic("follows"))
    assert json.loads(done.stdout.splitlines()[-1]) == {"topic": name, "produced": len(lines) + 1}
    msgs = _consume(kafka["KAFKA_BOOTSTRAP"], name, len(lines) + 1)
    assert sorted(m.value() for m in msgs) == sorted([*lines, lines[0]])
    for m in msgs:
        assert m.key() == kafka_key(builtin_pipeline().topics["follows"], m.value())
    keys = {m.value(): m.key() for m in msgs}
    assert keys[lines[0]] == b"u1\x00u2" and keys[b"not json"] is None and keys[lines[4]] is None
    same = {m.partition() for m in msgs if m.key() == b"u1\x00u2"}
    assert len(same) == 1  # one entity, one partition
    ends = end_offsets(kafka["KAFKA_BOOTSTRAP"], [name])[name]
    assert len(ends) == PARTITIONS and sum(ends.values()) == len(lines) + 1


def test_produce_without_broker_or_configuration(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text('{"op":"post"}\n')
    env = {**os.environ, "LAKE_DIR": str(tmp_path / "lake"), "KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    done = _mview("produce", "tweets", str(src), env=env)
    err = done.stderr.decode().strip()
    assert done.returncode == 1 and len(err.splitlines()) == 1
    assert "KAFKA_BOOTSTRAP=127.0.0.1:1" in err and "make kafka" in err
    done = _mview("produce", "tweets", str(src), env={**env, "KAFKA_BOOTSTRAP": ""})
    assert done.returncode == 1 and b"Kafka is not configured" in done.stderr


def test_probe_says_at_once_that_nothing_listens_and_asks_whatever_does(kafka):
    """Every address refuses the connection: "connection refused" without waiting out the timeout. Something
    listens that is no broker: the Kafka client's verdict. The broker: None."""
    started = time.monotonic()
    assert probe("127.0.0.1:1,PLAINTEXT://127.0.0.1:2", timeout=600) == "connection refused"
    assert time.monotonic() - started < 300
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert probe(f"127.0.0.1:{listening.getsockname()[1]}", timeout=1) not in (None, "connection refused")
    assert probe(kafka["KAFKA_BOOTSTRAP"], timeout=10) is None


def test_a_line_terminator_never_changes_a_verdict():
    """A Kafka message has no terminator, a file's line has one: both get the same reason from parse_line."""
    from changelog.errors import InvalidRecord
    from changelog.records import parse_line

    for line in (b"{", b"not json", b'{"op":"post"', b"[1,", b'{"op":"follow","follower_id":"a"}'):
        reasons = set()
        for form in (line, line + b"\n", line + b"\r\n", line.decode(), line.decode() + "\n"):
            try:
                parse_line(builtin_pipeline().topics["follows"], form)
            except InvalidRecord as e:
                reasons.add(e.reason)
        assert len(reasons) == 1, reasons


def test_copy_batch_replayed_after_a_crash_adds_nothing(tmp_path):
    """The same batch (same app id and batch id) copied again, as after a crash between the Delta commit and
    Spark's checkpoint commit: no record and no dead letter twice; the next batch id is copied."""
    from deltalake import DeltaTable

    from changelog.deadletters import read_dead_letters
    from changelog.kafka import copy_batch
    from changelog.topics import topic_path

    names = {"p.tweets": as_topic("tweets"), "p.follows": as_topic("follows")}
    good = b'{"op":"post","tweet_id":"t1","user_id":"u1","text":"x","ts":1}'
    rows = [("p.tweets", 0, 7, good), ("p.tweets", 1, 3, b"nope"), ("p.follows", 2, 0, b"{}")]
    rows += [("p.tweets", 2, 0, None), ("p.tweets", 2, 1, b" \r\n")]  # blank: skipped, as ingest skips them
    first = copy_batch(as_lake(tmp_path), names, rows, app_id="a", version=4)
    assert first == {"tweets": {"accepted": 1, "rejected": 1}, "follows": {"accepted": 0, "rejected": 1}}
    assert copy_batch(as_lake(tmp_path), names, rows, app_id="a", version=4) == first  # what the batch holds
    tweets = DeltaTable(str(topic_path(as_lake(tmp_path), as_topic("tweets"))))
    assert tweets.version() == 1 and tweets.transaction_version("a.tweets") == 4
    dead = list(read_dead_letters(as_lake(tmp_path), as_topic("tweets")))
    assert [(d["partition"], d["offset"], d["raw"]) for d in dead] == [(1, 3, "nope")]
    assert len(list(read_dead_letters(as_lake(tmp_path), as_topic("follows")))) == 1
    copy_batch(
        as_lake(tmp_path),
        names,
        [("p.tweets", 1, 4, b"again"), ("p.tweets", 0, 8, good)],
        app_id="a",
        version=5,
    )
    assert DeltaTable(str(topic_path(as_lake(tmp_path), as_topic("tweets")))).version() == 2
    assert [d["raw"] for d in read_dead_letters(as_lake(tmp_path), as_topic("tweets"))] == [
        "nope",
        "again",
    ]  # in batch order


def _tweet_line(i: int, text: str = "hi") -> bytes:
    return orjson.dumps({"op": "post", "tweet_id": f"t{i}", "user_id": f"u{i % 50}", "text": text, "ts": i})


def _sent(bootstrap: str, name: str) -> int:
    """Messages the broker holds in Kafka topic `name`: its end offsets summed over partitions."""
    return sum(end_offsets(bootstrap, [name])[name].values())


def test_produce_skips_a_line_over_the_maximum_message_size_and_sends_every_other(tmp_path, kafka):
    """50,000 valid lines, a 3 MB line, a 1.5 MB line, 5,000 more (#36 D2): the 3 MB line can never be a message
    nor a record, so it is skipped and reported with its file, line and size; every other line reaches the broker
    (the 1.5 MB one too: the `kafka` job dead-letters it with its size, as `mview ingest` does), exit 0. The broker's
    end offsets count exactly the messages reported."""
    from changelog.kafka import MAX_MESSAGE_BYTES
    from changelog.records import MAX_RECORD_BYTES

    big = _tweet_line(0, "x" * 3_000_000)
    over_record = _tweet_line(1, "y" * 1_500_000)
    assert MAX_RECORD_BYTES < len(over_record) <= MAX_MESSAGE_BYTES < len(big)
    src = tmp_path / "tweets.jsonl"
    with open(src, "wb") as f:
        f.write(b"".join(_tweet_line(i) + b"\n" for i in range(10, 50_010)))
        f.write(big + b"\n" + over_record + b"\r\n")
        f.write(b"".join(_tweet_line(i) + b"\n" for i in range(60_000, 65_000)))
    env = {**os.environ, **kafka, "LAKE_DIR": str(tmp_path / "lake")}
    done = _mview("produce", "tweets", str(src), "--json", env=env)
    name = kafka_topic(kafka["KAFKA_TOPIC_PREFIX"], as_topic("tweets"))
    assert _sent(kafka["KAFKA_BOOTSTRAP"], name) == 55_001, done.stderr.decode()[-2000:]
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "topic": name,
        "produced": 55_001,
        "skipped": 1,
        "skipped_lines": [{"file": str(src), "line": 50_001, "bytes": len(big)}],
    }

    again = {**env, "KAFKA_TOPIC_PREFIX": kafka["KAFKA_TOPIC_PREFIX"] + "h."}  # the summary for people
    done = _mview("produce", "tweets", str(src), env=again)
    out = done.stdout.decode()
    assert done.returncode == 0 and done.stderr == b"", done.stderr.decode()[-2000:]
    assert "produced 55,001 messages" in out
    assert f"{src}: line 50,001 skipped: {len(big):,} bytes, over the maximum message size" in out


def test_produce_says_exactly_which_lines_the_broker_did_not_acknowledge(tmp_path, kafka):
    """A topic whose broker limit refuses some messages (`max.message.bytes` 2,000: a batch holding a 3,000-byte
    record is refused whole): `mview produce` waits for every verdict, exits 1 with one `mview:` line, and its
    report (`--json`: `not_acknowledged_lines`) names exactly the lines the broker does not hold. Once the limit
    is raised, sending exactly those lines again leaves every line in the topic exactly once."""
    import random
    import string

    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    bootstrap, name = kafka["KAFKA_BOOTSTRAP"], kafka_topic(kafka["KAFKA_TOPIC_PREFIX"], as_topic("tweets"))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics(
        [NewTopic(name, PARTITIONS, 1, config={"max.message.bytes": "2000"})]
    ).values():
        fut.result(30)
    rng = random.Random(7)  # incompressible text: lz4 does not shrink it under the limit
    lines = [
        _tweet_line(
            i, "".join(rng.choice(string.ascii_letters) for _ in range(3000)) if i in (7, 8, 20) else "ok"
        )
        for i in range(1, 41)
    ]
    src = tmp_path / "tweets.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    env = {**os.environ, **kafka, "LAKE_DIR": str(tmp_path / "lake")}
    done = _mview("produce", "tweets", str(src), "--json", env=env)
    err = done.stderr.decode().strip().splitlines()
    assert done.returncode == 1 and len(err) == 1 and err[0].startswith("mview: "), err
    assert "Message size too large" in err[0] and "Traceback" not in done.stderr.decode()
    report = json.loads(done.stdout.splitlines()[-1])
    missing = [n for f in report["not_acknowledged_lines"] for a, b in f["lines"] for n in range(a, b + 1)]
    assert {f["file"] for f in report["not_acknowledged_lines"]} == {str(src)}
    assert {7, 8, 20} <= set(missing) and report["produced"] == len(lines) - len(missing)
    assert _sent(bootstrap, name) == report["produced"]  # exactly what the report says arrived

    limit = ConfigEntry("max.message.bytes", "3000000", incremental_operation=AlterConfigOpType.SET)
    config = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[limit])
    for fut in admin.incremental_alter_configs([config]).values():
        fut.result(30)
    rest = tmp_path / "rest.jsonl"
    rest.write_bytes(b"".join(lines[n - 1] + b"\n" for n in missing))
    done = _mview("produce", "tweets", str(rest), "--json", env=env)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert sorted(m.value() for m in _consume(bootstrap, name, len(lines))) == sorted(lines)
    assert _sent(bootstrap, name) == len(lines)  # each line once: none lost, none doubled


def test_a_message_key_is_the_records_id_or_key_composite_ones_joined():
    """`kafka_key`: an event topic's `id` fields, a table topic's `key` fields, several joined by U+0000 (ids hold
    no control character), a long as its decimal text; no key when a line does not hold them all."""
    from views.pipeline import parse_pipeline

    own = parse_pipeline(
        """
topics:
  visits:
    fields: {site: id, visit: long, page: string, at: timestamp}
    id: [site, visit]
    time: at
  carts:
    fields: {shop: string, cart: id, total: double, at: timestamp}
    key: [shop, cart]
    time: at
    op: {upsert: put, remove: drop}
""",
        "own.yml",
    ).topics
    builtin = builtin_pipeline().topics
    cases = [
        (own["visits"], {"site": "s1", "visit": 42, "page": "/", "at": 1}, b"s1\x0042"),
        (own["visits"], {"site": "s1", "visit": -7}, b"s1\x00-7"),
        (own["carts"], {"op": "drop", "shop": "berlin", "cart": "c9", "at": 1}, b"berlin\x00c9"),
        (builtin["follows"], {"op": "follow", "follower_id": "u1", "followee_id": "u2"}, b"u1\x00u2"),
        (builtin["tweets"], {"op": "delete", "tweet_id": "t1", "user_id": "u1"}, b"t1"),
        (builtin["searches"], {"search_id": "s1", "session_id": "x"}, b"s1"),  # its id, not its session
        (builtin["activity"], {"event_id": "e1", "user_id": "u1"}, b"e1"),
        (builtin["profiles"], {"op": "upsert", "user_id": "\u00e9t\u00e9"}, "\u00e9t\u00e9".encode()),
        (own["visits"], {"site": "s1"}, None),  # a part missing
        (own["visits"], {"site": "s1", "visit": True}, None),
        (own["carts"], {"shop": "", "cart": "c9"}, None),  # an empty part
        (own["carts"], {"shop": None, "cart": "c9"}, None),
    ]
    for topic, record, key in cases:
        assert kafka_key(topic, orjson.dumps(record)) == key, (topic.name, record)
    for line in (b"not json", b"[1,2]", b'"s1"', b""):
        assert kafka_key(own["visits"], line) is None
