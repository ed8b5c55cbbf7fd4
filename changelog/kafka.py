"""Kafka in front of the Delta topic logs: topic names, the producer, the admin side and the dead letters of Kafka.

- Topic `T` of the lake is the Kafka topic `<KAFKA_TOPIC_PREFIX>T` (`kafka_topic`); a message's value is one
  record, exactly as a line of a JSON-lines file, and its key only places it in a partition.
- `produce` publishes every non-blank line of its sources as one message, unvalidated. The key is the record's
  entity key (`entity_key`: tweets by tweet_id, follows by the follower/followee pair, searches and clicks by
  session_id, activity and profiles by user_id) when the line is a JSON object that holds it, else no key: one
  entity's records stay in one partition, in the order they were produced. It returns once the broker has
  acknowledged every message (idempotent producer, acks from all in-sync replicas), or raises.
- `ensure_kafka_topics` creates missing Kafka topics with `PARTITIONS` partitions; an existing one is left as is.
- `end_offsets` (per partition, the offset the next message will get) is what the `kafka` job's lag is measured
  against. `dead_letter` builds a dead-letter entry of a rejected message, the same entry `mview ingest` writes
  for a line with `file`/`line` replaced by the message's `topic`/`partition`/`offset`.
- A broker that does not answer within the timeout raises `KafkaUnavailable` naming KAFKA_BOOTSTRAP.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator

import orjson

from changelog.errors import KafkaUnavailable, NotProduced
from changelog.records import MAX_RECORD_BYTES

__all__ = [
    "PARTITIONS",
    "MAX_MESSAGE_BYTES",
    "ENTITY_KEYS",
    "kafka_topic",
    "entity_key",
    "probe",
    "ensure_kafka_topics",
    "end_offsets",
    "produce",
    "dead_letter",
]

PARTITIONS = 3  # partitions of a Kafka topic that mview creates
# The largest message the producer sends and a topic mview creates accepts: a line a little over the maximum
# record size still reaches the `kafka` job, which rejects it with its size like `mview ingest` does.
MAX_MESSAGE_BYTES = 2 * MAX_RECORD_BYTES
ENTITY_KEYS: dict[str, tuple[str, ...]] = {
    "tweets": ("tweet_id",),
    "follows": ("follower_id", "followee_id"),
    "searches": ("session_id",),
    "clicks": ("session_id",),
    "activity": ("user_id",),
    "profiles": ("user_id",),
}
_BOM = b"\xef\xbb\xbf"
_QUIET = logging.getLogger(
    "mview.kafka.client"
)  # librdkafka's own log lines (connection refused ...): not shown
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def kafka_topic(prefix: str, topic: str) -> str:
    return f"{prefix}{topic}"


def entity_key(topic: str, line: bytes) -> bytes | None:
    """The partition key of a line of `topic`: its entity's id(s), or None if the line does not hold them."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    parts = [obj.get(f) for f in ENTITY_KEYS[topic]]
    if not all(isinstance(p, str) and p for p in parts):
        return None
    return "\x00".join(parts).encode()  # ids hold no control character: the separator is unambiguous


def _config(bootstrap: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, "logger": _QUIET, **extra}


def probe(bootstrap: str, timeout: float = 5.0) -> str | None:
    """None if a broker answers at `bootstrap` within `timeout` seconds, else why not (one line)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient(_config(bootstrap)).list_topics(timeout=timeout)
    except KafkaException as e:
        return str(e.args[0].str() if e.args and hasattr(e.args[0], "str") else e)
    return None


def _admin(bootstrap: str, timeout: float):
    from confluent_kafka.admin import AdminClient

    problem = probe(bootstrap, timeout)
    if problem is not None:
        raise KafkaUnavailable(bootstrap, problem)
    return AdminClient(_config(bootstrap))


def ensure_kafka_topics(bootstrap: str, names: Iterable[str], *, timeout: float = 10.0) -> list[str]:
    """Create the Kafka topics of `names` that do not exist (PARTITIONS partitions, the broker's replication);
    return the names created. Raises KafkaUnavailable if no broker answers."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap, timeout)
    existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [n for n in names if n not in existing]
    if not missing:
        return []
    config = {"max.message.bytes": str(MAX_MESSAGE_BYTES + 4096)}
    futures = admin.create_topics(
        [NewTopic(n, PARTITIONS, -1, config=config) for n in missing], operation_timeout=timeout
    )
    created = []
    for name, fut in futures.items():
        try:
            fut.result(timeout)
            created.append(name)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another creator was first
                raise KafkaUnavailable(bootstrap, f"creating {name}: {e.args[0].str()}") from None
    return created


def end_offsets(bootstrap: str, names: Iterable[str], *, timeout: float = 5.0) -> dict[str, dict[int, int]]:
    """Per Kafka topic of `names` that exists, per partition, the offset of the next message (the end)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    problem = probe(bootstrap, timeout)
    if problem is not None:
        raise KafkaUnavailable(bootstrap, problem)
    consumer = Consumer(_config(bootstrap, **{"group.id": "mview-lag", "enable.auto.commit": False}))
    try:
        topics = consumer.list_topics(timeout=timeout).topics
        out: dict[str, dict[int, int]] = {}
        for name in names:
            if name in topics:
                out[name] = {
                    p: consumer.get_watermark_offsets(TopicPartition(name, p), timeout=timeout)[1]
                    for p in topics[name].partitions
                }
        return out
    except KafkaException as e:
        raise KafkaUnavailable(bootstrap, str(e.args[0])) from None
    finally:
        consumer.close()


def _lines(source: str) -> Iterator[bytes]:
    """The non-blank lines of `source` (`-` = stdin) without terminators; a byte order mark that starts the
    source is dropped (as `mview ingest` does)."""
    fh = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115 - closed below
    try:
        first = True
        for line in fh:
            if first:
                first = False
                if line.startswith(_BOM):
                    line = line[len(_BOM) :]
            line = line.rstrip(b"\n")
            line = line[:-1] if line.endswith(b"\r") else line
            if line.strip():
                yield line
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


def produce(bootstrap: str, prefix: str, topic: str, sources: list[str], *, timeout: float = 10.0) -> int:
    """Publish every non-blank line of `sources` to the Kafka topic of `topic` (created if missing); return how
    many messages the broker acknowledged (all of them, or NotProduced / KafkaUnavailable is raised)."""
    from confluent_kafka import KafkaError, Producer

    name = kafka_topic(prefix, topic)
    ensure_kafka_topics(bootstrap, [name], timeout=timeout)
    failed: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(err.str())

    producer = Producer(
        _config(
            bootstrap,
            **{
                "enable.idempotence": True,
                "linger.ms": 20,
                "compression.type": "lz4",
                "message.max.bytes": MAX_MESSAGE_BYTES + 4096,
                "message.timeout.ms": int(max(timeout, 30) * 1000),
            },
        )
    )
    sent = 0
    for source in sources:
        for line in _lines(source):
            key = entity_key(topic, line)
            while True:
                try:
                    producer.produce(name, line, key, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
                except Exception as e:  # noqa: BLE001 - e.g. MSG_SIZE_TOO_LARGE: say which line
                    code = e.args[0].code() if e.args and hasattr(e.args[0], "code") else None
                    if code == KafkaError.MSG_SIZE_TOO_LARGE:
                        raise NotProduced(name, sent, f"a line of {len(line):,} bytes in {source}") from None
                    raise
            sent += 1
            if sent % 10_000 == 0:
                producer.poll(0)
    remaining = producer.flush(max(timeout, 30) * 3)
    if remaining or failed:
        cause = failed[0] if failed else f"{remaining:,} messages unacknowledged"
        raise NotProduced(name, sent - len(failed) - remaining, cause)
    return sent


def dead_letter(kafka_topic_name: str, partition: int, offset: int, raw: bytes, reason: str) -> dict:
    """The dead-letter entry of a rejected message: the reason, its coordinates, the raw value (for one over
    the maximum record size, only its first DEADLETTER_RAW_CHARS characters) and its size in bytes."""
    from changelog.ingest import DEADLETTER_RAW_CHARS

    size = len(raw)
    if size <= MAX_RECORD_BYTES:
        text = raw.decode("utf-8", "replace")
    else:
        text = raw[: 4 * DEADLETTER_RAW_CHARS].decode("utf-8", "replace")[:DEADLETTER_RAW_CHARS]
    return {
        "topic": kafka_topic_name,
        "partition": partition,
        "offset": offset,
        "reason": reason,
        "raw": text,
        "raw_bytes": size,
        "at": int(time.time() * 1000),
    }
