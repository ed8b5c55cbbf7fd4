"""Validated ingest: JSON lines -> the topic's Delta log, one commit per file; bad lines -> dead letters.

Every line is decoded with orjson and validated (`changelog.records`). Valid records are appended to the topic's
table in one Delta commit per input file (a file with no valid line makes no commit), written without Spark by
delta-rs (the `deltalake` package) as an Arrow table of the topic's schema (`topic_arrow_schema`), built from the
validated records themselves: each value is stored exactly as validated (a string as its UTF-8 text, `ts` as a
64-bit integer), and if a validated record does not fit the schema exactly (a value of another type, a field the
topic does not have) nothing of the file is committed and `NotStored` is raised. The commit's `userMetadata` is
`ingest <file>`. Concurrent appenders (other `mview ingest` processes, Spark writers) are safe: a commit that
finds its version taken is retried on the next one; every record is committed once.

A rejected line is appended to `LAKE_DIR/deadletter/<topic>.jsonl` as
`{"file","line","reason","raw","raw_bytes","at"}` and never reaches a view; ingestion goes on with the next line.
`raw` is the line as text (without its terminator), or for a line over `MAX_RECORD_BYTES` only its first
`DEADLETTER_RAW_CHARS` characters; `raw_bytes` is the line's whole size in bytes. A line over the maximum is never
held in memory whole. Blank (whitespace-only) lines are skipped, not rejected. A UTF-8 byte order mark at the
start of a file is dropped (anywhere else it makes the line invalid JSON).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import orjson

from changelog import records
from changelog.errors import InvalidRecord, NotStored
from changelog.records import DEADLETTER_RAW_CHARS, check_record_size, dead_letter_raw, parse_line
from changelog.topics import RecordTable, append_table, ensure_topic

__all__ = ["IngestResult", "ingest", "deadletter_path", "append_dead_letters", "DEADLETTER_RAW_CHARS"]

_BOM = b"\xef\xbb\xbf"

# Validated records are turned into Arrow record batches of this many rows (one commit holds them all).


@dataclass
class IngestResult:
    topic: str
    accepted: int = 0
    rejected: int = 0
    files: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {"topic": self.topic, "accepted": self.accepted, "rejected": self.rejected}


def _owner_only(path, flags):
    """Open (and create) a file readable and writable by its owner only: dead letters hold raw input."""
    return os.open(path, flags, 0o600)


def deadletter_path(lake_dir: Path, topic: str) -> Path:
    return Path(lake_dir) / "deadletter" / f"{topic}.jsonl"


def append_dead_letters(path: Path, entries: list[dict], key: Callable[[dict], tuple | None]) -> int:
    """Append to the dead-letter log `path` those of `entries` it does not hold yet; return how many were appended.
    A source's batch replayed after a crash (its dead letters written, its records not yet committed) so writes
    each of its dead letters once.

    `key(entry)` is (group, position) for an entry of the appending source, None for any other (a line of `mview
    ingest`, another source): a Kafka topic and partition with the offset, or a table with the WAL position. A
    group's positions grow along the log, so it is read from its end back only until every group of `entries` has
    shown an entry before their first."""
    first: dict = {}
    for e in entries:
        group, pos = key(e)
        first[group] = min(first.get(group, pos), pos)
    seen = _written_since(path, key, first)
    new = [e for e in entries if key(e) not in seen]
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # raw input: owner only
        with os.fdopen(fd, "ab") as out:
            out.write(b"".join(orjson.dumps(e) + b"\n" for e in new))
    return len(new)


def _written_since(path: Path, key: Callable[[dict], tuple | None], first: dict) -> set[tuple]:
    """The keys of the entries of `path` at or after their group's position in `first`, read from the end back."""
    seen: set[tuple] = set()
    open_groups = set(first)
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return seen
    with fh:
        end, rest = fh.seek(0, os.SEEK_END), b""
        while end > 0 and open_groups:
            start = max(0, end - (1 << 20))
            fh.seek(start)
            lines = (fh.read(end - start) + rest).split(b"\n")
            rest, lines = (lines[0], lines[1:]) if start > 0 else (b"", lines)
            for line in reversed(lines):
                try:
                    e = orjson.loads(line)
                    k = key(e) if isinstance(e, dict) else None
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue
                if k is None or k[0] not in first:
                    continue
                if k[1] >= first[k[0]]:
                    seen.add(k)
                else:
                    open_groups.discard(k[0])
            end = start
    return seen


def _terminator(chunk: bytes) -> int:
    return 2 if chunk.endswith(b"\r\n") else 1 if chunk.endswith(b"\n") else 0


def _read_lines(fh: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """(line, size) per line of `fh`; size is the line's length in bytes without its terminator. A line over
    `MAX_RECORD_BYTES` is read in bounded chunks: only its first chunk is yielded, with the whole line's size.
    A UTF-8 byte order mark at the start of the first line is dropped."""
    limit = records.MAX_RECORD_BYTES + 2  # a line at the maximum, and its "\r\n"
    first = True
    while line := fh.readline(limit + len(_BOM) if first else limit):
        whole = len(line) < limit or line.endswith(b"\n")
        size, rest = len(line), line
        while not whole and not rest.endswith(b"\n") and (rest := fh.readline(1 << 20)):
            size += len(rest)
        size -= _terminator(rest)
        if first:
            first = False
            if line.startswith(_BOM):
                line, size = line[len(_BOM) :], size - len(_BOM)
        yield line, size


def _lines(source: str) -> Iterator[tuple[bytes, int]]:
    if source == "-":
        yield from _read_lines(sys.stdin.buffer)
    else:
        with open(source, "rb") as fh:
            yield from _read_lines(fh)


def _dead_letter(name: str, lineno: int, raw: bytes, size: int, reason: str) -> bytes:
    at = int(time.time() * 1000)
    text = dead_letter_raw(raw, size)
    entry = {"file": name, "line": lineno, "reason": reason, "raw": text, "raw_bytes": size, "at": at}
    return orjson.dumps(entry) + b"\n"


def _commit(path: str, topic: str, name: str, batches: RecordTable, accepted: int) -> None:
    """Append the file's records to the topic's table in one commit; `NotStored` if they do not fit exactly."""
    table = batches.table()
    if batches.unfit is not None:
        raise NotStored(topic, name, accepted, batches.unfit)
    append_table(path, table, note=f"ingest {name}")


def ingest(
    spark, lake_dir: Path, topic: str, sources: list[str], *, progress: Callable[[str], None] | None = None
) -> IngestResult:
    """Append the valid records of each source file (`-` = stdin) to `topic`; return the counts.

    Needs no Spark: `spark` is not used (None is fine); it stays first so callers holding a session need not
    change."""
    lake_dir = Path(lake_dir)
    path = ensure_topic(None, lake_dir, topic)
    dl_path = deadletter_path(lake_dir, topic)
    dl_path.parent.mkdir(parents=True, exist_ok=True)
    result = IngestResult(topic)
    for source in sources:
        name = "<stdin>" if source == "-" else str(source)
        accepted = rejected = 0
        started = time.monotonic()
        good = RecordTable(topic)
        with open(dl_path, "ab", opener=_owner_only) as dead:
            for lineno, (raw, size) in enumerate(_lines(source), start=1):
                try:
                    check_record_size(size)
                    if not raw.strip():
                        continue
                    record = parse_line(topic, raw)
                except InvalidRecord as e:
                    rejected += 1
                    dead.write(_dead_letter(name, lineno, raw, size, e.reason))
                    continue
                good.add(record)
                accepted += 1
                if progress and lineno % 200_000 == 0:
                    progress(f"{topic}: {name}: {lineno:,} lines read")
        if accepted:
            _commit(path, topic, name, good, accepted)
        result.accepted += accepted
        result.rejected += rejected
        result.files.append(
            {
                "file": name,
                "accepted": accepted,
                "rejected": rejected,
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    return result
