"""Validated ingest: JSON lines -> the topic's Delta log, one commit per file (per piece of a large file); bad
lines -> dead letters, written only after the commit of their piece.

Every line is decoded with orjson and validated (`changelog.records`). Valid records are appended to the topic's
table in one Delta commit per input file (a file with no valid line makes no commit), written without Spark by
delta-rs (the `deltalake` package) as an Arrow table of the topic's schema (`topic_arrow_schema`), built from the
validated records themselves: each value is stored exactly as validated (a string as its UTF-8 text, `ts` as a
64-bit integer), and if a validated record does not fit the schema exactly (a value of another type, a field the
topic does not have) nothing of the piece is committed and `NotStored` is raised. The commit's `userMetadata` is
`ingest <file>`. Concurrent appenders (other `mview ingest` processes, Spark writers) are safe: a commit that
finds its version taken is retried on the next one; every record is committed once.

**The commit bound.** What a file's commit holds is kept in memory until it is committed, so a large file is
committed in pieces: a piece ends after `COMMIT_RECORDS` valid records or once its records' lines and its dead
letters hold `COMMIT_BYTES` bytes, whichever comes first, and it is committed before the next line is read. Memory
is then bounded whatever the file's size (a piece, plus at most one line of `MAX_RECORD_BYTES`); a file below the
bound is one commit. A piece with only dead letters is committed too (an empty commit that records its position),
except when it is the whole file: a file with no valid line makes no commit.

**Dead letters** of a piece are written after its commit, as one object created once
(`changelog.deadletters.write_dead_letters`: `deadletter/<topic>/ingest-<run's start>-<run>-<first line>.jsonl`),
all of them or none, so a commit that fails leaves no dead letter of its lines behind.

**Positions: a retry is exact.** Each commit records in its `commitInfo` (`mview.ingest`, JSON) the file, the
piece's first and last line and byte range, how many dead letters it has and the name of their object; for a
regular file also the SHA-256 of the file's bytes up to the piece's end and a Delta transaction
(`mview.ingest:<real path>`, that end), atomic with the commit. Ingesting a regular file whose real path has such a
transaction and whose first bytes up to it still hash to the recorded digest (the same file, or the same file
grown at its end) goes on after the last line committed: nothing of it is committed twice, and the dead letters
of its last committed piece that the earlier run could not write are written then (their object, if it is not
there), once each. A file that differs in those bytes is a new file and is ingested whole. Stdin (and any input
that is not a regular file) is read once and never resumed: a failure says which line to feed again from
(`IngestFailed`).

A failure to commit or to write dead letters (a full disk) raises `IngestFailed` with exactly what the log holds
of the file; delta-rs's report of a Rust panic on the way is not shown, since the failure is reported as one
line.

A rejected line becomes a dead letter `{"file","line","reason","raw","raw_bytes","at"}` of the topic (read with
`changelog.deadletters.read_dead_letters`) and never reaches a view; ingestion goes on with the next line.
`raw` is the line as text (without its terminator), or for a line over `MAX_RECORD_BYTES` only its first
`DEADLETTER_RAW_CHARS` characters; `raw_bytes` is the line's whole size in bytes. A line over the maximum is never
held in memory whole. Blank (whitespace-only) lines are skipped, not rejected. A UTF-8 byte order mark at the
start of a file is dropped (anywhere else it makes the line invalid JSON). Lines are numbered from 1, blank ones
included.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO

import orjson

from changelog import records
from changelog.deadletters import deadletter_key, deadletter_path, write_dead_letters
from changelog.errors import IngestFailed, InvalidRecord, NotStored, ReadFrom, TopicChanged
from changelog.records import DEADLETTER_RAW_CHARS, check_record_size, dead_letter_raw, line_parser
from changelog.storage import Lake, NotFound, StorageError
from changelog.topics import RecordTable, append_table, open_topic, table_version, topic_key
from spec.model import Topic

__all__ = [
    "IngestResult",
    "ingest",
    "deadletter_path",
    "DEADLETTER_RAW_CHARS",
    "COMMIT_RECORDS",
    "COMMIT_BYTES",
]

_BOM = b"\xef\xbb\xbf"

# The commit bound (module docstring): a piece of a file is committed after this many valid records, or once its
# records' lines and dead letters hold this many bytes. A file below both is one commit.
COMMIT_RECORDS = 500_000
COMMIT_BYTES = 128 << 20

_APP = "mview.ingest:"  # + a file's real path: the Delta transaction of its position (bytes committed)
_META = "mview.ingest"  # the commitInfo field that describes the piece a commit holds (JSON)
_BLOCK = 1 << 20  # bytes read at a time to hash a file


@dataclass
class IngestResult:
    """Per topic, the records committed and the lines dead-lettered by this run; `already_committed`: the lines of
    files committed by an earlier run, skipped (a file ingested again goes on after them)."""

    topic: str
    accepted: int = 0
    rejected: int = 0
    already_committed: int = 0
    files: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        out = {"topic": self.topic, "accepted": self.accepted, "rejected": self.rejected}
        if self.already_committed:
            out["already_committed"] = self.already_committed
        return out


_LAST_START = [0]  # the newest run start handed out in this process (ns): each run's is later
_START_LOCK = threading.Lock()


def _run_start() -> int:
    """A run's start in ns since the epoch, later than every earlier run's of this process: the names of the dead
    letters of files ingested one after the other sort in that order."""
    with _START_LOCK:
        _LAST_START[0] = max(time.time_ns(), _LAST_START[0] + 1)
        return _LAST_START[0]


def _terminator(chunk: bytes) -> int:
    return 2 if chunk.endswith(b"\r\n") else 1 if chunk.endswith(b"\n") else 0


def _read_lines(
    fh: BinaryIO, max_bytes: int | None = None, *, at_start: bool = True
) -> Iterator[tuple[bytes, int, int]]:
    """(line, size, consumed) per line of `fh`: size is the line's length in bytes without its terminator, consumed
    the bytes read for it (terminator and byte order mark included). A line over `max_bytes` (default
    `MAX_RECORD_BYTES`) is read in bounded chunks: only its first chunk is yielded, with the whole line's size.
    `at_start`: `fh` is at the start of its input, where a UTF-8 byte order mark is dropped."""
    limit = 2 + (
        records.MAX_RECORD_BYTES if max_bytes is None else max_bytes
    )  # a line at the maximum, "\r\n"
    readline = fh.readline
    if at_start:  # the first line, which may start with a byte order mark
        line = readline(limit + len(_BOM))
        if not line:
            return
        bom = len(_BOM) if line.startswith(_BOM) else 0
        size, consumed = _rest_of_line(fh, line, limit + bom)
        yield line[bom:], size - bom, consumed
    while line := readline(limit):
        if line[-1:] == b"\n":  # a whole line: the common case
            consumed = len(line)
            yield line, consumed - (2 if line[-2:-1] == b"\r" else 1), consumed
        else:  # the last line without a terminator, or a line over the limit
            size, consumed = _rest_of_line(fh, line, limit)
            yield line, size, consumed


def _rest_of_line(fh: BinaryIO, line: bytes, limit: int) -> tuple[int, int]:
    """(size without terminator, bytes consumed) of the line that starts with `line` (read with `limit`): the rest
    of a line over the limit is read in bounded chunks and dropped."""
    rest, consumed = line, len(line)
    if len(line) >= limit and not line.endswith(b"\n"):
        while not rest.endswith(b"\n") and (rest := fh.readline(1 << 20)):
            consumed += len(rest)
    return consumed - _terminator(rest), consumed


def _dead_letter(name: str, lineno: int, raw: bytes, size: int, reason: str) -> bytes:
    at = int(time.time() * 1000)
    text = dead_letter_raw(raw, size)
    entry = {"file": name, "line": lineno, "reason": reason, "raw": text, "raw_bytes": size, "at": at}
    return orjson.dumps(entry) + b"\n"


def _verdict(parse: Callable[[bytes], dict], raw: bytes, size: int) -> dict | str | None:
    """A line's fate under `parse` (the topic's `line_parser`): its record, the reason it is rejected, or None for a
    blank line."""
    try:
        check_record_size(size)
        if not raw.strip():
            return None
        return parse(raw)
    except InvalidRecord as e:
        return e.reason


def _cause(e: BaseException) -> str:
    """An exception as one short line: the store's reason for a `StorageError`, the OS's for an OSError, else its
    text."""
    if isinstance(e, StorageError):
        text = e.reason
    elif isinstance(e, OSError) and e.strerror:
        text = e.strerror
    else:
        text = str(e) or type(e).__name__
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


def _failure(e: BaseException) -> bool:
    """Whether `e` is a failure to report (anything but an interrupt or an exit): delta-rs raises its errors as
    exceptions, and a Rust panic as pyo3's PanicException, which derives from BaseException."""
    return not isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit))


_STDERR = threading.Lock()  # one capture of file descriptor 2 at a time


@contextmanager
def _rust_report_hidden(hide: bool = True) -> Iterator[None]:
    """Run the block with file descriptor 2 captured, then write what was captured to it, except a Rust panic's
    report when the block failed: delta-rs's worker threads print a panic there (e.g. on a full disk) before the
    error reaches Python, and the failure is reported as one line instead. Captures run one at a time (the
    descriptor is the process's). With `hide` false, or without memfd (not Linux), nothing is captured."""
    try:
        capture = os.memfd_create("mview-stderr") if hide else None
    except (AttributeError, OSError):
        capture = None
    if capture is None:
        yield
        return
    with _STDERR:
        yield from _captured(capture)


def _captured(capture: int) -> Iterator[None]:
    """The body of `_rust_report_hidden`: file descriptor 2 onto the memfd `capture` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(capture, 2)
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.lseek(capture, 0, os.SEEK_SET)
        with os.fdopen(capture, "rb") as f:
            text = f.read()
        if text and not (failed and b"panicked at" in text):
            os.write(2, text)


def _commit_infos(lake: Lake, key: str, since: int = -1) -> Iterator[tuple[int, dict]]:
    """(version, the `mview.ingest` description of its piece) of the ingest commits of the Delta log at `key`,
    newest first, down to the version after `since`; stops at a commit file that is gone (log cleanup)."""
    for version in range(table_version(lake, key), since, -1):
        try:
            lines = lake.read_bytes(key, "_delta_log", f"{version:020d}.json").splitlines()
        except NotFound:
            return
        for line in lines:
            if line.startswith(b'{"commitInfo"'):
                meta = orjson.loads(line)["commitInfo"].get(_META)
                if isinstance(meta, str):
                    try:
                        yield version, json.loads(meta)
                    except ValueError:
                        pass
                break


class _File:
    """The ingest of one source into a topic (see the module docstring): read, validate, commit piece by piece,
    dead letters after each commit; resumed after what an earlier run committed of the same regular file."""

    def __init__(self, ctx: _Context, source: str, not_read: int = 0):
        self.ctx, self.source, self.not_read = ctx, source, not_read
        self.name = "<stdin>" if source == "-" else str(source)
        self.run = uuid.uuid4().hex
        self.started = _run_start()
        self.committed = 0  # lines of the file committed so far (this run or earlier ones)
        self.commits = 0
        self.accepted = self.rejected = self.already = 0
        self.real: str | None = None  # the real path of a regular file: its position is recorded and resumed
        self.hasher = hashlib.sha256()
        self.hashed = 0  # bytes of the file in `hasher`
        self.fd: int | None = None  # the file, to hash it beside the reading

    def failed(self, cause: str, *, dead_letters_missing: tuple[int, int] | None = None) -> IngestFailed:
        return IngestFailed(
            self.ctx.topic,
            self.name,
            cause,
            committed=self.committed,
            dead_letters_missing=dead_letters_missing,
            resumable=self.real is not None,
            not_read=self.not_read,
            lake_dir=self.ctx.lake.uri(),
        )

    def _batch(self, first: int) -> str:
        """The name of the dead-letter object of this run's piece that starts at line `first`."""
        return f"ingest-{self.started:019d}-{self.run[:16]}-{first:012d}"

    def ingest(self) -> None:
        if self.source == "-":
            self._read(sys.stdin.buffer, 0, 0)
            return
        with open(self.source, "rb") as fh:
            if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                self.real, self.fd = os.path.realpath(self.source), os.open(self.source, os.O_RDONLY)
            try:
                done = self._resume() if self.real else None
                if done is None:
                    self._read(fh, 0, 0)
                else:
                    fh.seek(done["bytes"][1])
                    self._read(fh, done["lines"][1], done["bytes"][1])
            finally:
                if self.fd is not None:
                    os.close(self.fd)

    def _read(self, fh: BinaryIO, lineno: int, offset: int) -> None:
        """Read from line `lineno` + 1 (at byte `offset`) to the end, committing piece by piece."""
        ctx, topic, name, parse = self.ctx, self.ctx.topic, self.name, self.ctx.parse
        max_records, max_bytes, progress = ctx.commit_records, ctx.commit_bytes, ctx.progress
        good, dead = RecordTable(ctx.declared), []
        first, start = lineno + 1, offset
        accepted = held = 0
        for raw, size, consumed in _read_lines(fh, at_start=offset == 0):
            lineno += 1
            offset += consumed
            try:
                check_record_size(size)
                if not raw.strip():
                    continue
                record = parse(raw)
            except InvalidRecord as e:
                entry = _dead_letter(name, lineno, raw, size, e.reason)
                dead.append(entry)
                held += len(entry)
            else:
                good.add(record)
                accepted += 1
                held += size
            if progress and lineno % 200_000 == 0:
                progress(f"{topic}: {name}: {lineno:,} lines read")
            if accepted >= max_records or held >= max_bytes:
                self._commit(good, accepted, dead, first, lineno, start, offset)
                good, dead = RecordTable(ctx.declared), []
                first, start = lineno + 1, offset
                accepted = held = 0
        if accepted or (dead and (self.commits or self.committed)):
            self._commit(good, accepted, dead, first, lineno, start, offset)
        elif dead:  # the whole file, without a valid line: no commit, its dead letters alone
            self._write_dead_letters(dead, None, self._batch(first))
            self.rejected += len(dead)

    def _digest(self, end: int) -> str:
        """The SHA-256 of the file's first `end` bytes (read beside the reading, from where it was hashed to)."""
        while self.hashed < end:
            block = os.pread(self.fd, min(_BLOCK, end - self.hashed), self.hashed)
            if not block:
                break
            self.hasher.update(block)
            self.hashed += len(block)
        return self.hasher.copy().hexdigest()

    def _commit(
        self, good: RecordTable, accepted: int, dead: list[bytes], first: int, last: int, start: int, end: int
    ) -> None:
        """Commit one piece (lines `first`-`last`, bytes [`start`, `end`)), then write its dead letters."""
        ctx = self.ctx
        table = good.table()
        if good.unfit is not None:
            raise NotStored(ctx.topic, self.name, accepted, good.unfit, self.committed)
        piece = {
            "file": self.name,
            "lines": [first, last],
            "bytes": [start, end],
            "dead_letters": len(dead),
            "run": self.run,
        }
        if dead:
            piece["dead_letter_batch"] = self._batch(first)
        transactions: tuple = ()
        if self.real is not None:
            piece.update(path=self.real, sha256=self._digest(end))
            transactions = ((_APP + self.real, end),)
        before = -1
        try:
            with _rust_report_hidden(ctx.quiet):
                ctx.refresh()
                before = ctx.table.version()
                append_table(
                    ctx.lake,
                    table,
                    key=ctx.key,
                    note=f"ingest {self.name}",
                    time=ctx.declared.time,
                    transactions=transactions,
                    metadata={_META: json.dumps(piece)},
                    delta_table=ctx.table,
                )
        except BaseException as e:
            if not _failure(e) or self._landed(before, last):
                raise
            raise self.failed(f"committing lines {first:,}-{last:,} failed ({_cause(e)})") from None
        self.committed, self.commits = last, self.commits + 1
        self.accepted += accepted
        self._write_dead_letters(dead, (first, last), piece.get("dead_letter_batch", ""))
        self.rejected += len(dead)

    def _landed(self, before: int, last: int) -> bool:
        """Whether the commit of this run's piece ending at line `last` is in the log after all (an error raised
        after the commit itself, e.g. by the checksum that follows it)."""
        if before < 0:
            return False
        return any(
            p.get("run") == self.run and p["lines"][1] == last
            for _v, p in _commit_infos(self.ctx.lake, self.ctx.key, before)
        )

    def _write_dead_letters(self, dead: list[bytes], lines: tuple[int, int] | None, batch: str) -> int:
        """Write `dead` (lines `lines` of the file, None: all of it) as the dead-letter object `batch`, unless it
        exists; how many were written."""
        if not dead:
            return 0
        try:
            return len(dead) if write_dead_letters(self.ctx.lake, self.ctx.declared, batch, dead) else 0
        except (StorageError, OSError) as e:
            what = f"lines {lines[0]:,}-{lines[1]:,}" if lines else "the file"
            raise self.failed(
                f"writing the dead letters of {what} failed ({_cause(e)})", dead_letters_missing=lines
            ) from None

    def _resume(self) -> dict | None:
        """The description of the last piece an earlier run committed of this file, when its bytes up to that
        piece's end are still those committed (the hash is then at that end); else None: a new file. Dead letters of
        that piece the earlier run did not write are written now."""
        ctx = self.ctx
        ctx.refresh()
        end = ctx.table.transaction_version(_APP + self.real)
        if end is None:
            return None
        done = next(
            (
                p
                for _v, p in _commit_infos(ctx.lake, ctx.key)
                if p.get("path") == self.real and p["bytes"][1] == end
            ),
            None,
        )
        if done is None or os.fstat(self.fd).st_size < end or self._digest(end) != done.get("sha256"):
            self.hasher, self.hashed = hashlib.sha256(), 0
            return None
        self.committed = self.already = done["lines"][1]
        self._complete_dead_letters(done)
        return done

    def _complete_dead_letters(self, done: dict) -> None:
        """Write the dead letters of the committed piece `done` if their object is not there (its run stopped
        between the commit and them): derived again from the piece's lines."""
        if not done.get("dead_letters", 0):
            return
        batch = done["dead_letter_batch"]
        if self.ctx.lake.exists(deadletter_key(self.ctx.declared), f"{batch}.jsonl"):
            return
        (first, last), (start, _end) = done["lines"], done["bytes"]
        missing = []
        with open(self.source, "rb") as fh:
            fh.seek(start)
            lines = _read_lines(fh, at_start=start == 0)
            for lineno, (raw, size, _consumed) in zip(range(first, last + 1), lines, strict=False):
                verdict = _verdict(self.ctx.parse, raw, size)
                if isinstance(verdict, str):
                    missing.append(_dead_letter(done["file"], lineno, raw, size, verdict))
        self.rejected += self._write_dead_letters(missing, (first, last), batch)


@dataclass
class _Context:
    """What the files of one `ingest` call share: the topic (`topic` its name, `declared` its declaration, `parse`
    its line parser), the lake, its log (key and loaded table), the commit bound."""

    topic: str
    declared: Topic
    parse: Callable[[bytes], dict]
    lake: Lake
    key: str
    table: object
    commit_records: int
    commit_bytes: int
    progress: Callable[[str], None] | None
    quiet: bool
    loaded: float = field(default_factory=time.monotonic)

    def refresh(self) -> None:
        """Bring the loaded table up to the log's latest version, unless it was loaded within the last second
        (what others committed since then only makes a commit retry on the next version)."""
        if time.monotonic() - self.loaded > 1.0:
            self.table.update_incremental()
            self.loaded = time.monotonic()


def ingest(
    spark,
    lake: Lake,
    topic: Topic,
    sources: list[str],
    *,
    progress: Callable[[str], None] | None = None,
    commit_records: int = COMMIT_RECORDS,
    commit_bytes: int = COMMIT_BYTES,
    quiet: bool = False,
) -> IngestResult:
    """Append the valid records of each source file (`-` = stdin) to `topic`'s log in `lake`; return the counts
    of this run.

    Each file is committed in one commit, or in pieces of at most `commit_records` records / `commit_bytes` bytes
    (module docstring); a file an earlier run committed (in part) goes on after its last committed line. Raises
    `IngestFailed` when a commit or the dead letters cannot be written (its `result`: the files done before it).
    `quiet` (the command line's): delta-rs's report of a Rust panic on such a failure is not shown on stderr,
    which is captured around each commit (`_rust_report_hidden`).

    A declaration its log's records do not follow raises `TopicChanged` before anything is read
    (`changelog.topics.open_topic`).

    Needs no Spark: `spark` is not used (None is fine); it stays first so callers holding a session need not
    change."""
    spec = topic
    if spec.source is not None or spec.view is not None:
        raise ReadFrom(spec.name, spec.source, spec.view)
    table = _open_log(lake, spec, sources, quiet)
    ctx = _Context(
        spec.name,
        spec,
        line_parser(spec),
        lake,
        topic_key(spec),
        table,
        commit_records,
        commit_bytes,
        progress,
        quiet,
    )
    result = IngestResult(spec.name)
    for i, source in enumerate(sources):
        _ingest_file(ctx, source, not_read=len(sources) - i - 1, result=result)
    return result


def _open_log(lake: Lake, spec: Topic, sources: list[str], quiet: bool):
    """The loaded Delta table of the log of `spec` (created if missing). `TopicChanged` is raised as is; a
    failure to prepare the log raises `IngestFailed` for the first source (resumable unless stdin), the others
    not read."""
    try:
        with _rust_report_hidden(quiet):
            _uri, table = open_topic(lake, spec)
    except TopicChanged:
        raise
    except BaseException as e:
        if not _failure(e) or not sources:
            raise
        name = "<stdin>" if sources[0] == "-" else str(sources[0])
        raise IngestFailed(
            spec.name,
            name,
            f"preparing the topic's log failed ({_cause(e)})",
            resumable=sources[0] != "-",
            not_read=len(sources) - 1,
            lake_dir=lake.uri(),
        ) from None
    return table


def _ingest_file(ctx: _Context, source: str, *, not_read: int, result: IngestResult) -> None:
    """Ingest the file `source` (`not_read`: the sources after it) and add its counts and its entry to `result`.
    A failure raises with `result` attached: the files before it, ingested whole."""
    started = time.monotonic()
    f = _File(ctx, source, not_read=not_read)
    try:
        f.ingest()
    except (IngestFailed, NotStored) as e:
        e.result = result
        raise
    result.accepted += f.accepted
    result.rejected += f.rejected
    result.already_committed += f.already
    entry = {
        "file": f.name,
        "accepted": f.accepted,
        "rejected": f.rejected,
        "commits": f.commits,
        "seconds": round(time.monotonic() - started, 3),
    }
    if f.already:
        entry["already_committed"] = f.already
    result.files.append(entry)
