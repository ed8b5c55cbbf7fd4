"""Kafka in front of the Delta topic logs: topic names, the producer, the admin side and the dead letters of Kafka.

- Topic `T` of the lake is the Kafka topic `<KAFKA_TOPIC_PREFIX>T` (`kafka_topic`); a message's value is one
  record, exactly as a line of a JSON-lines file, and its key only places it in a partition.
- `publish` (and `produce`, its count) publishes every non-blank line of its sources as one message,
  unvalidated. The key is the record's `id` (an event topic) or `key` (a table topic) (`kafka_key`: the fields'
  values, several joined by U+0000) when the line is a JSON object that holds them, else no key: the records of
  one id or key stay in one partition, in the order they were produced. A line over `MAX_MESSAGE_BYTES` is no message: it is skipped and reported with its file, line and size
  (it could never be a record: the maximum record size is half of it), and the lines after it are sent. A line
  over the maximum record size but within `MAX_MESSAGE_BYTES` is sent, without a key, and the `kafka` job
  dead-letters it with its size, as `mview ingest` would. It returns once the broker has acknowledged every
  message (idempotent producer, acks from all in-sync replicas); after the first message the broker does not
  acknowledge, no further line is sent, every message already handed to the client is waited for until the
  broker acknowledges or refuses it, and `NotProduced` says exactly which lines are not acknowledged. Lines are
  numbered as `mview ingest` numbers them: from 1, blank lines included.
- `ensure_kafka_topics` creates missing Kafka topics with `PARTITIONS` partitions; an existing one is left as is.
- `end_offsets` (per partition, the offset the next message will get) and `committed_offsets` (where a Spark
  Kafka source's checkpoint has committed to) give the `kafka` job's lag (`lag`).
- `copy_batch` copies one micro-batch of messages into the topics' Delta logs, exactly once per (app id, batch
  id): every message is validated against its topic's declaration (`changelog.records`), the one definition
  `mview ingest` uses;
  the valid records of a topic are appended in one Delta commit (delta-rs) that records a Delta transaction
  (app id, batch id), skipped when the log already holds that transaction (a batch replayed after a crash
  commits nothing twice), the rejected ones are written as the batch's dead-letter object of the topic
  (`deadletter/<topic>/kafka-<app id>-<batch id>.jsonl`, `changelog.deadletters`), created once: a replayed
  batch finds it and writes nothing.
  A dead-letter entry is the one `mview ingest` writes for a line, with `file`/`line` replaced by the message's
  Kafka `topic`/`partition`/`offset` (`dead_letter`).
- A broker that does not answer within the timeout raises `KafkaUnavailable` naming KAFKA_BOOTSTRAP; where
  every address refuses the connection (nothing listens there), at once.
"""

from __future__ import annotations

import functools
import gc
import itertools
import json
import logging
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import orjson

from changelog.errors import InvalidRecord, KafkaUnavailable, NotProduced, ReadFrom
from changelog.records import MAX_RECORD_BYTES, line_parser
from changelog.storage import Lake
from spec.model import Topic

__all__ = [
    "PARTITIONS",
    "MAX_MESSAGE_BYTES",
    "kafka_topic",
    "kafka_key",
    "probe",
    "ensure_kafka_topics",
    "watermarks",
    "end_offsets",
    "committed_offsets",
    "lag",
    "ProduceResult",
    "publish",
    "produce",
    "dead_letter",
    "copy_batch",
    "broker_watch",
]

PARTITIONS = 3  # partitions of a Kafka topic that mview creates
# The largest message the producer sends and a topic mview creates accepts: a line a little over the maximum
# record size still reaches the `kafka` job, which rejects it with its size like `mview ingest` does.
MAX_MESSAGE_BYTES = 2 * MAX_RECORD_BYTES
_BOM = b"\xef\xbb\xbf"
_QUIET = logging.getLogger(
    "mview.kafka.client"
)  # librdkafka's own log lines (connection refused ...): not shown
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def kafka_topic(prefix: str, topic: Topic) -> str:
    """The Kafka topic of a lake topic: `<KAFKA_TOPIC_PREFIX><topic>`."""
    return f"{prefix}{topic.name}"


def kafka_key(topic: Topic, line: bytes) -> bytes | None:
    """The message key of a line of `topic`: the values of its record's `id` (event topic) or `key` (table topic)
    fields, several joined by U+0000; None unless the line is a JSON object in which each of them is a non-empty
    string or an integer (as text). The key only places a message in a partition: it never changes its meaning."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    parts = []
    for name in topic.identity:
        value = obj.get(name)
        if type(value) is str and value:
            parts.append(value)
        elif type(value) is int:
            parts.append(str(value))
        else:
            return None
    return (parts[0] if len(parts) == 1 else "\x00".join(parts)).encode("utf-8", "surrogatepass")


def _config(bootstrap: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, "logger": _QUIET, **extra}


def _refused(bootstrap: str) -> str | None:
    """Why not, at once, when every address of `bootstrap` refuses a TCP connection (nothing listens there); else
    None: something listens or cannot be told at once, and the Kafka client decides."""
    addresses = [a.strip().rpartition("://")[2] for a in bootstrap.split(",") if a.strip()]
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=0.5).close()
        except ConnectionRefusedError:
            continue
        except (OSError, ValueError):
            return None
        return None
    return "connection refused" if addresses else None


def probe(bootstrap: str, timeout: float = 5.0) -> str | None:
    """None if a broker answers at `bootstrap` within `timeout` seconds, else why not (one line). When no address
    accepts a connection it says so at once instead of waiting out the timeout."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    refused = _refused(bootstrap)
    if refused is not None:
        return refused
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


def watermarks(bootstrap: str, names: Iterable[str], *, timeout: float = 5.0) -> dict[str, dict[int, tuple]]:
    """Per Kafka topic of `names` that exists, per partition, (first offset the broker still holds, end offset)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    problem = probe(bootstrap, timeout)
    if problem is not None:
        raise KafkaUnavailable(bootstrap, problem)
    consumer = Consumer(_config(bootstrap, **{"group.id": "mview-lag", "enable.auto.commit": False}))
    try:
        topics = consumer.list_topics(timeout=timeout).topics
        return {
            name: {
                p: consumer.get_watermark_offsets(TopicPartition(name, p), timeout=timeout)
                for p in topics[name].partitions
            }
            for name in names
            if name in topics
        }
    except KafkaException as e:
        raise KafkaUnavailable(bootstrap, str(e.args[0])) from None
    finally:
        consumer.close()


def end_offsets(bootstrap: str, names: Iterable[str], *, timeout: float = 5.0) -> dict[str, dict[int, int]]:
    """Per Kafka topic of `names` that exists, per partition, the offset of the next message (the end)."""
    return {
        n: {p: w[1] for p, w in ps.items()} for n, ps in watermarks(bootstrap, names, timeout=timeout).items()
    }


def committed_offsets(checkpoint: Lake, *, key: str = "") -> dict[str, dict[int, int]]:
    """Where the last committed micro-batch of a streaming query with one Kafka source ends: per Kafka topic, per
    partition, the offset of the first message not yet processed. Empty if nothing was committed. The query's
    checkpoint is at `key` of the lake `checkpoint` (`key` empty: a `Lake` opened at the checkpoint itself), read
    through the lake's store."""
    from changelog.storage import NotFound

    lake = checkpoint
    done = [int(e.name) for e in lake.list(key, "commits") if not e.is_dir and e.name.isdigit()]
    if not done:
        return {}
    try:
        lines = lake.read_bytes(key, "offsets", str(max(done))).decode().splitlines()
    except NotFound:
        return {}
    out: dict[str, dict[int, int]] = {}
    for line in lines[2:]:
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            for name, parts in value.items():
                if isinstance(parts, dict):
                    out[name] = {int(p): int(o) for p, o in parts.items()}
    return out


def lag(
    bootstrap: str, names: Iterable[str], checkpoint: Lake, *, key: str = "", timeout: float = 2.0
) -> int:
    """Messages of the Kafka topics `names` that the query of the checkpoint (`committed_offsets`: `checkpoint`
    and `key`) has not processed yet, summed over partitions (a partition it never read counts from the first
    offset the broker still holds)."""
    done = committed_offsets(checkpoint, key=key)
    total = 0
    for name, parts in watermarks(bootstrap, names, timeout=timeout).items():
        for p, (low, high) in parts.items():
            total += max(0, high - max(low, done.get(name, {}).get(p, low)))
    return total


@dataclass
class ProduceResult:
    """What `publish` did. `produced`: messages the broker acknowledged, each there once. `skipped`: lines over
    `MAX_MESSAGE_BYTES`, never sent, as (file, line, bytes). `not_acknowledged`: per file, the (first, last) line
    ranges the broker did not acknowledge, `last` None for "to the end of the file" (the lines not sent after the
    first failure), in the order of the sources (a file named twice is there twice); empty when every message was
    acknowledged. `cause`: that first failure."""

    topic: str
    produced: int = 0
    skipped: list[tuple[str, int, int]] = field(default_factory=list)
    not_acknowledged: list[tuple[str, list[tuple[int, int | None]]]] = field(default_factory=list)
    cause: str | None = None

    def summary(self) -> dict:
        """The `--json` line: `topic` and `produced`; `skipped` (with `skipped_lines`) and `not_acknowledged` (with
        `not_acknowledged_lines`, `[first, last]` ranges, `last` null for the end of the file) when not zero."""
        out: dict = {"topic": self.topic, "produced": self.produced}
        if self.skipped:
            out["skipped"] = len(self.skipped)
            out["skipped_lines"] = [{"file": f, "line": n, "bytes": b} for f, n, b in self.skipped]
        if self.not_acknowledged:
            out["not_acknowledged"] = True
            out["not_acknowledged_lines"] = [
                {"file": f, "lines": [list(r) for r in ranges]} for f, ranges in self.not_acknowledged
            ]
        return out


def _ranges(lines: list[int]) -> list[tuple[int, int]]:
    """Line numbers as (first, last) ranges of consecutive ones."""
    out: list[tuple[int, int]] = []
    for n in sorted(set(lines)):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


_LINE_MASK = (1 << 40) - 1


@contextmanager
def _no_gc() -> Iterator[None]:
    """The block without the cyclic garbage collector: `publish` holds a small callback object per message in
    flight (up to the client's queue, 100,000), which no cycle holds, and collecting them cost a tenth of its
    CPU time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def _interrupt_stops(stop: list[str]) -> Iterator[None]:
    """In the main thread with Python's own SIGINT handler: within the block, a first Ctrl-C only appends
    "interrupted" to `stop` (the producer then stops before its next line, so what was sent is known exactly); a
    second one raises KeyboardInterrupt as usual. Elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    pressed = []

    def interrupted(signum, frame) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)
        stop.append("interrupted")

    signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _on_failure(failed: list[tuple[int, int]], stop: list[str]) -> Callable:
    """The delivery callback of a message, given its source index << 40 | line first: a failed message's
    (source index, line) goes to `failed`, the first failure's cause to `stop`. It holds only those two lists
    (not the producer: nothing cyclic while the message is in flight)."""

    def delivered(where: int, err, _msg) -> None:
        if err is not None:
            failed.append((where >> 40, where & _LINE_MASK))
            if not stop:
                stop.append(err.str())

    return delivered


class _Sender:
    """The producer of one `publish` call and what it knows of its messages: each message the client took
    (`handed`) gets exactly one verdict; `failed` holds the (source index, line) of each one the broker did not
    acknowledge, `stop` why no further line is sent (the first failure, or Ctrl-C)."""

    def __init__(self, bootstrap: str, name: str, topic: Topic, names: list[str], timeout: float) -> None:
        from confluent_kafka import KafkaError, KafkaException, Producer

        self.name, self.topic, self.names = name, topic, names
        self._refused, self._too_large = KafkaException, KafkaError.MSG_SIZE_TOO_LARGE
        self.result = ProduceResult(name)
        self.failed: list[tuple[int, int]] = []
        self.stop: list[str] = []
        self.handed = 0
        self._delivered = _on_failure(self.failed, self.stop)
        self.producer = Producer(
            _config(
                bootstrap,
                **{
                    "enable.idempotence": True,
                    "linger.ms": 20,
                    "compression.type": "lz4",
                    "message.max.bytes": MAX_MESSAGE_BYTES + 4096,
                    "message.timeout.ms": int(max(timeout, 30) * 1000),
                    # a message's callback runs only when it fails (and is dropped unrun when it is
                    # acknowledged): acknowledged = handed to the client - failed, once every verdict is in
                    "delivery.report.only.error": True,
                },
            )
        )

    def send_all(self, sources: list[str]) -> tuple[int, int] | None:
        """Send the lines of every source in order, then wait for every verdict (each comes within
        message.timeout.ms); the (source index, line) from which nothing was sent, or None."""
        unsent = None
        for i, source in enumerate(sources):
            fh = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115 - closed below
            try:
                stopped = self.send_source(i, fh)
            finally:
                if fh is not sys.stdin.buffer:
                    fh.close()
            if stopped is not None:
                unsent = (i, stopped)
                break
        while self.producer.flush(1.0) > 0:
            pass
        return unsent

    def send_source(self, i: int, fh) -> int | None:
        """Send the lines of source `i`; the line from which nothing was sent (after a failure), or None. A line
        over MAX_MESSAGE_BYTES, or one the client refuses as too large, is skipped; blank lines are not sent."""
        from changelog.ingest import _rest_of_line

        readline, limit = fh.readline, MAX_MESSAGE_BYTES + 2  # a line at the maximum and its "\r\n"
        first = readline(limit + len(_BOM))
        if first.startswith(_BOM):
            first = first[len(_BOM) :]
        lines = itertools.chain((first,) if first else (), iter(functools.partial(readline, limit), b""))
        stop, skipped, topic, base = self.stop, self.result.skipped, self.topic, i << 40
        for lineno, line in enumerate(lines, start=1):
            if stop:
                return lineno
            if line[-1:] == b"\n":  # a whole line: the common case
                line = line[:-2] if line[-2:-1] == b"\r" else line[:-1]
                size = len(line)
            else:  # the last line, without a terminator, or a line over the maximum (its rest is dropped)
                size, _consumed = _rest_of_line(fh, line, limit)
            if size > MAX_MESSAGE_BYTES:  # never a record: skipped, and the lines after it are sent
                skipped.append((self.names[i], lineno, size))
                continue
            if not line.strip():
                continue
            key = kafka_key(topic, line) if size <= MAX_RECORD_BYTES else None
            taken = self._hand(line, key, base | lineno)
            if taken is False:  # refused before sending it
                skipped.append((self.names[i], lineno, size))
            elif taken is None:  # not taken: it and the lines after it are not sent
                return lineno
        return None

    def _hand(self, line: bytes, key: bytes | None, where: int) -> bool | None:
        """Hand one message to the client, waiting while its local queue is full: True when taken, False when
        refused as too large, None when refused otherwise (the cause is then in `stop`)."""
        producer = self.producer
        try:
            while True:
                try:
                    producer.produce(
                        self.name, line, key, on_delivery=functools.partial(self._delivered, where)
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
        except self._refused as e:
            if e.args[0].code() == self._too_large:
                return False
            self.stop.append(e.args[0].str())
            return None
        self.handed += 1
        if self.handed % 10_000 == 0:
            producer.poll(0)
        return True

    def report(self, unsent: tuple[int, int] | None) -> ProduceResult:
        """The result once every verdict is in: acknowledged = handed - failed; per source, the line ranges not
        acknowledged (those that failed, and from `unsent` on, every line not sent)."""
        result = self.result
        result.cause = self.stop[0] if self.stop else None
        result.produced = self.handed - len(self.failed)
        per_source: dict[int, list] = {}
        for i, line in self.failed:
            per_source.setdefault(i, []).append(line)
        ranges: dict[int, list] = {i: _ranges(lines) for i, lines in per_source.items()}
        if unsent is not None:
            i, line = unsent
            ranges.setdefault(i, []).append((line, None))
            for later in range(i + 1, len(self.names)):
                ranges[later] = [(1, None)]
        result.not_acknowledged = [(self.names[i], ranges[i]) for i in sorted(ranges)]
        return result


def publish(
    bootstrap: str, prefix: str, topic: Topic, sources: list[str], *, timeout: float = 10.0
) -> ProduceResult:
    """Publish every non-blank line of `sources` (`-` = stdin) to the Kafka topic of `topic` (created if missing) and report exactly what the broker acknowledged
    (module docstring). Raises `NotProduced`, its `result` the report, when a line was not acknowledged;
    `KafkaUnavailable` when no broker answers at the start.
    """
    if topic.source is not None or topic.view is not None:
        raise ReadFrom(topic.name, topic.source, topic.view)
    name = kafka_topic(prefix, topic)
    ensure_kafka_topics(bootstrap, [name], timeout=timeout)
    names = ["<stdin>" if s == "-" else str(s) for s in sources]
    sender = _Sender(bootstrap, name, topic, names, timeout)
    # a first Ctrl-C stops before the next line; a callback per message, held until its verdict: nothing cyclic
    with _interrupt_stops(sender.stop), _no_gc():
        unsent = sender.send_all(sources)
    result = sender.report(unsent)
    if result.not_acknowledged:
        err = NotProduced(name, result.produced, result.cause or "not acknowledged", result.not_acknowledged)
        err.result = result
        raise err
    return result


def produce(bootstrap: str, prefix: str, topic: Topic, sources: list[str], *, timeout: float = 10.0) -> int:
    """`publish`, returning how many messages the broker acknowledged (all of them, or NotProduced is raised)."""
    return publish(bootstrap, prefix, topic, sources, timeout=timeout).produced


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


def _validate(rows, names: dict[str, Topic]) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """Per lake topic (by name), the valid records and the dead-letter entries of `rows`, in offset order. A blank
    message (empty, only whitespace, or null) is skipped, as `mview ingest` skips a blank line."""
    good: dict[str, list[dict]] = {t.name: [] for t in names.values()}
    dead: dict[str, list[dict]] = {t.name: [] for t in names.values()}
    parsers = {name: line_parser(t) for name, t in names.items()}
    for name, partition, offset, value in sorted(rows, key=lambda r: (r[0], r[1], r[2])):
        topic, raw = names[name].name, bytes(value or b"")
        if len(raw) <= MAX_RECORD_BYTES and not raw.strip():
            continue
        try:
            good[topic].append(parsers[name](raw))
        except InvalidRecord as e:
            dead[topic].append(dead_letter(name, partition, offset, raw, e.reason))
    return good, dead


def _append(lake, log, topic: Topic, lines: list[dict], app_id: str, version: int) -> None:
    """Append `lines` (validated records) to the topic's log (`log`: it loaded, a `deltalake.DeltaTable`) in one
    commit that records the Delta transaction (`app_id`, `version`), unless a commit of this log already recorded
    `version` or a later one for `app_id`."""
    from changelog.errors import NotStored
    from changelog.topics import RecordTable, append_table, topic_key

    done = log.transaction_version(app_id)
    if done is not None and done >= version:  # committed before a crash: the replayed batch adds nothing
        return
    batches = RecordTable(topic)
    for record in lines:
        batches.add(record)
    table = batches.table()
    if batches.unfit is not None:  # as ingest: nothing of the batch, never a record silently left out
        raise NotStored(topic.name, f"kafka batch {version}", len(lines), batches.unfit)
    append_table(
        lake,
        table,
        key=topic_key(topic),
        note=f"kafka batch {version}",
        time=topic.time,
        transactions=((app_id, version),),
        delta_table=log,
    )


def copy_batch(lake: Lake, names: dict[str, Topic], rows, *, app_id: str, version: int) -> dict:
    """Copy one micro-batch: `rows` are (Kafka topic, partition, offset, value) of the Kafka topics `names`
    (Kafka topic -> lake topic) into `lake`. Returns per lake topic (by name) {"accepted": n,
    "rejected": m} of the batch's messages. Needs no Spark: the logs are appended to with delta-rs, the Delta
    protocol Spark reads."""
    from changelog.deadletters import write_dead_letters
    from changelog.topics import open_topic

    by_name = {t.name: t for t in names.values()}
    good, dead = _validate(rows, names)
    # every topic the batch writes to, opened first: a declaration its log's records do not follow is refused
    # (`TopicChanged`) before anything of the batch is written
    opened = {t: open_topic(lake, by_name[t])[1] for t in good if good[t] or dead[t]}
    for topic, records in good.items():
        if records:
            _append(lake, opened[topic], by_name[topic], records, f"{app_id}.{topic}", version)
    batch = f"kafka-{re.sub(r'[^A-Za-z0-9._-]', '_', app_id)}-{version:012d}"
    for topic, entries in dead.items():
        write_dead_letters(lake, by_name[topic], batch, entries)
    return {t: {"accepted": len(good[t]), "rejected": len(dead[t])} for t in good}


def broker_watch(bootstrap: str, say: Callable[[str], None], every_s: float = 2.0):
    """A function to call often: every `every_s` seconds it checks the broker and, when that changes, calls `say`
    with "ok" (it answers again) or "waiting for Kafka at KAFKA_BOOTSTRAP=... since HH:MM:SS (why)"."""
    state: dict = {"next": 0.0, "down": False}

    def tick() -> None:
        if time.monotonic() < state["next"]:
            return
        state["next"] = time.monotonic() + every_s
        problem = probe(bootstrap, timeout=1.0)
        if problem is None and state["down"]:
            state["down"] = False
            say("ok")
        elif problem is not None and not state["down"]:
            state["down"] = True
            say(
                f"waiting for Kafka at KAFKA_BOOTSTRAP={bootstrap} since {time.strftime('%H:%M:%S')} ({problem})"
            )

    return tick
