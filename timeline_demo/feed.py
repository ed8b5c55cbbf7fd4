"""What the seeded generators of the example pipelines (`timeline_demo.nexmark`, `timeline_demo.shop`) share: the
arrival order of their records, the faults they add (duplicates, bad lines, late events) and their files.

`arrange(timed, ...)` turns records stamped with their event time into a `Feed`, the records of every topic in
arrival order:
- arrival = event time, plus, with probability `delay_prob`, a delay of up to `delay_ms` (keep it within
  ALLOWED_LATENESS: such a record is out of order, never late), so records arrive out of order within and across
  topics;
- duplicates: copies of `duplicates` x n random records (the same JSON), each arriving within `delay_ms` after
  its event time: a record delivered twice has the effect of one;
- bad lines: `bad` x n lines that no topic accepts (`bad_line`: not JSON, not an object, a field missing or of
  the wrong type, an empty or blank id, an id with a control character, a timestamp without a zone or out of
  range, an unknown `op`), each at a random place;
- the *tail*: late records, then the clock records, after everything else. A late record's time lies behind
  the watermark of the records before the tail, so it is late (dropped by interval jobs, counted) whenever it is
  delivered in a later batch than them: `Feed.batches(n)` and `Feed.write(dir, chunks=n)` put the whole tail in
  the last of `n >= 2` batches (with one batch nothing is late: the watermark at a batch's start counts). Clock
  records have times far past every event (the greatest time + the lateness + a margin): they move every
  watermark past every event, so that every interval window closes and every asof event is emitted.

Files (`Feed.write`): one JSON-lines file per topic, `<topic>.jsonl`, or with `chunks=n > 1` one per topic and
batch, `<topic>-<i>.jsonl` (i = 0000..n-1, every file written, empty ones too): ingesting batch after batch (`mview
ingest <topic> <topic>-<i>.jsonl` for every topic, then `mview run JOB --once`) replays the arrival order;
`timeline_demo.brute.batches_from_dir` reads the same layout back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson

from spec.model import Topic

__all__ = ["Feed", "arrange", "bad_line", "delay", "ts_value", "write_lines"]

_ZONE = timezone(timedelta(hours=2))


def ts_value(ms: int, rng: random.Random, iso_ratio: float) -> int | str:
    """A timestamp as a record carries it: epoch ms, or (with probability `iso_ratio`) ISO-8601 text, in UTC
    (`...Z`) or at +02:00, with milliseconds."""
    if rng.random() >= iso_ratio:
        return ms
    zone = timezone.utc if rng.random() < 0.7 else _ZONE
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).astimezone(zone)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# long: one kind of fault per branch
def bad_line(rng: random.Random, topic: Topic, good: dict[str, Any]) -> str:
    """A JSON line that `topic` rejects, made from its valid record `good` by one fault (chosen at random)."""
    rec = dict(good)
    required = [n for n in topic.names if n not in topic.optional]
    if topic.op and rec.get("op") == topic.op[1]:  # a remove record needs only these
        required = [n for n in required if n in (*topic.identity, topic.time, *topic.remove_fields)]
    ids = [n for n in required if topic.type_of(n) == "id"]
    kinds = ["json", "array", "missing", "type", "ts_zone", "ts_range", "ts_text"]
    kinds += ["empty_id", "blank_id", "control_id"] if ids else []
    kinds += ["op"] if topic.op else []
    kind = rng.choice(kinds)
    if kind == "json":
        return orjson.dumps(rec).decode()[: rng.randrange(1, 12)]
    if kind == "array":
        return orjson.dumps(list(rec.values())).decode()
    if kind == "missing":
        rec.pop(rng.choice(required), None)
    elif kind == "type":
        name = rng.choice(required)
        kind_of = topic.type_of(name)
        rec[name] = {"id": 12, "string": 12, "long": "12", "double": "1.5", "boolean": "true"}.get(
            kind_of, [1]
        )
    elif kind == "ts_zone":
        rec[topic.time] = "2026-01-01T10:00:00"
    elif kind == "ts_range":
        rec[topic.time] = 4_102_444_800_000
    elif kind == "ts_text":
        rec[topic.time] = "yesterday"
    elif kind == "empty_id":
        rec[rng.choice(ids)] = ""
    elif kind == "blank_id":
        rec[rng.choice(ids)] = "  "
    elif kind == "control_id":
        rec[rng.choice(ids)] = "a\u0001b"
    else:
        rec["op"] = "merge"
    return orjson.dumps(rec).decode()


def delay(rng: random.Random, prob: float, most_ms: int) -> int:
    """A record's arrival delay: with probability `prob`, up to `most_ms` (uniform), else 0."""
    return rng.randrange(most_ms + 1) if most_ms and rng.random() < prob else 0


def write_lines(path: Path, records: list) -> None:
    """`records` as JSON lines at `path` (a `str` is written as it is: a bad line)."""
    with open(path, "wb") as fh:
        for r in records:
            fh.write((r.encode() if isinstance(r, str) else orjson.dumps(r)) + b"\n")


@dataclass
class Feed:
    """The records of `topics` in arrival order: `arrivals` is [(topic, record or bad line)], the last `tail` of
    them the late and clock records (see the module docstring). `counts` says how many of each kind were made."""

    topics: tuple[str, ...]
    arrivals: list[tuple[str, Any]]
    tail: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def records(self, topic: str) -> list:
        """The records (and bad lines) of `topic`, in arrival order."""
        return [r for t, r in self.arrivals if t == topic]

    def batches(self, n: int = 1) -> list[dict[str, list]]:
        """The arrivals cut into `n` batches of about equal size, the tail in the last: [{topic: records}]."""
        body = self.arrivals[: len(self.arrivals) - self.tail]
        out = []
        for i in range(n):
            piece = body[len(body) * i // n : len(body) * (i + 1) // n]
            if i == n - 1:
                piece = piece + self.arrivals[len(body) :]
            batch: dict[str, list] = {t: [] for t in self.topics}
            for t, r in piece:
                batch[t].append(r)
            out.append(batch)
        return out

    def write(self, directory: str | Path, *, chunks: int = 1) -> dict[str, list[str]]:
        """Write the files (see the module docstring); returns {topic: [file, ...]} in batch order."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        files: dict[str, list[str]] = {t: [] for t in self.topics}
        for i, batch in enumerate(self.batches(chunks)):
            for t, recs in batch.items():
                path = d / (f"{t}.jsonl" if chunks == 1 else f"{t}-{i:04d}.jsonl")
                write_lines(path, recs)
                files[t].append(str(path))
        return files


# long: the arrival order and each kind of fault, in the order the module docstring states them
def arrange(
    timed: list[tuple[int, str, dict]],
    *,
    topics: dict[str, Topic],
    rng: random.Random,
    delay_prob: float,
    delay_ms: int,
    duplicates: float = 0.0,
    bad: float = 0.0,
    late: list[tuple[str, dict]] = (),
    clock: list[tuple[str, dict]] = (),
    delays: random.Random | None = None,
) -> Feed:
    """The `Feed` of `timed`, [(event time, topic, record)] (see the module docstring); `late` and `clock` are
    the tail's records, in that order. `delays`: the generator of the arrival delays (default `rng`), drawn one
    per record of `timed` in order (`delay`), so that a streaming writer can draw the same ones."""
    n = len(timed)
    keyed = []
    for i, (t, topic, rec) in enumerate(timed):
        keyed.append((t + delay(delays or rng, delay_prob, delay_ms), i, topic, rec))
    made = int(n * duplicates)
    for j in range(made):
        t, topic, rec = timed[rng.randrange(n)]
        keyed.append((t + rng.randrange(delay_ms + 1), n + j, topic, dict(rec)))
    keyed.sort(key=lambda x: (x[0], x[1]))
    arrivals: list[tuple[str, Any]] = [(topic, rec) for _, _, topic, rec in keyed]
    wrong = int(n * bad)
    for _ in range(wrong):
        topic, rec = arrivals[rng.randrange(len(arrivals))]
        while isinstance(rec, str):
            topic, rec = arrivals[rng.randrange(len(arrivals))]
        arrivals.insert(rng.randrange(len(arrivals) + 1), (topic, bad_line(rng, topics[topic], rec)))
    tail = list(late) + list(clock)
    counts = {"records": n, "duplicates": made, "bad": wrong, "late": len(late), "clock": len(clock)}
    return Feed(tuple(topics), arrivals + tail, tail=len(tail), counts=counts)
