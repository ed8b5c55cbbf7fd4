"""Version checksums (`_delta_log/<version>.crc`) for the Delta logs delta-rs writes.

Spark writes a checksum with every commit it makes; delta-rs writes none. Without one, every reader that builds
a snapshot of a new version (a streaming job, once per micro-batch that has new records) runs a Spark job over
the log to find the table's protocol and metadata; with one, Delta takes them from the checksum
(`readProtocolAndMetadataFromChecksum`). So after each commit of a topic log, `write_checksums` writes the
checksum of every version that lacks one, each derived from its predecessor's checksum and the commit's actions,
the way Delta derives its own incrementally: files and bytes added minus removed, the protocol and metadata the
commit sets or the predecessor's.

A checksum is written only when it is exact: Delta validates checksums against the table's state (before some
commits, at checkpoints) and a wrong one fails those. The chain stops (no checksum for that version or later
ones, until a Spark commit writes one) at a commit it cannot account for exactly: a `remove` without its size,
deletion vectors, in-commit timestamps, a protocol with table features, an operation it does not know, or a
commit file that is gone (log cleanup). It starts only from a checksum at most `_MAX_WALK` versions back, or from
version 0 of a table that has no more versions than that: a log that grew without checksums (written before
this module, or past a break in the chain) gets them again after a Spark commit (`mview maintain`), and an
append pays at most that many file checks to find out. Readers then read the protocol and metadata with a job,
as before.

Writers may race: every writer of the same version derives the same checksum, and a checksum is created only if
absent (`Lake.create`: a complete object, or none), so a reader never sees half of one. A checksum is written just
after its commit, so a reader that lists the log in between builds that snapshot the slow way.

The log is read and the checksums are written through the lake's store (`changelog.storage`), so this holds on a
local, HDFS or S3 lake alike.
"""

from __future__ import annotations

import json

from changelog.storage import Lake, StorageError

__all__ = ["write_checksums"]

_MAX_WALK = 64  # versions walked back for a checksum to start from, or from version 0 (else none is written)
_KNOWN_OPS = frozenset(
    {"CREATE TABLE", "WRITE", "STREAMING UPDATE", "MERGE", "DELETE", "UPDATE", "OPTIMIZE", "ADD COLUMN"}
)


class _Inexact(Exception):
    """A commit the incremental checksum cannot account for exactly."""


def _crc(version: int) -> str:
    return f"{version:020d}.crc"


def _apply(state: dict | None, commit: bytes) -> dict:
    """The checksum after `commit` (a commit file's bytes), from `state` (the predecessor's; None before
    version 0)."""
    s = dict(state) if state else {"tableSizeBytes": 0, "numFiles": 0, "metadata": None, "protocol": None}
    for line in commit.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if (a := action.get("add")) is not None:
            if a.get("deletionVector") or not isinstance(a.get("size"), int):
                raise _Inexact("add with a deletion vector or without a size")
            s["tableSizeBytes"] += a["size"]
            s["numFiles"] += 1
        elif (r := action.get("remove")) is not None:
            if (
                r.get("deletionVector")
                or not r.get("extendedFileMetadata")
                or not isinstance(r.get("size"), int)
            ):
                raise _Inexact("remove without its size")
            s["tableSizeBytes"] -= r["size"]
            s["numFiles"] -= 1
        elif (p := action.get("protocol")) is not None:
            if p.get("minReaderVersion") != 1 or p.get("readerFeatures") or p.get("writerFeatures"):
                raise _Inexact("a protocol with table features")
            s["protocol"] = p
        elif (m := action.get("metaData")) is not None:
            s["metadata"] = m
        elif (ci := action.get("commitInfo")) is not None:
            if "inCommitTimestamp" in ci or ci.get("operation") not in _KNOWN_OPS:
                raise _Inexact(f"operation {ci.get('operation')!r}")
    if s["metadata"] is None or s["protocol"] is None or s["numFiles"] < 0 or s["tableSizeBytes"] < 0:
        raise _Inexact("no protocol or metadata")
    return s


def _read(lake: Lake, log: str, version: int) -> dict | None:
    """The fields this module derives, from a checksum (its own or Spark's); None if unusable."""
    try:
        c = json.loads(lake.read_bytes(log, _crc(version)))
    except (StorageError, ValueError):
        return None
    if (
        not isinstance(c, dict)
        or not isinstance(c.get("tableSizeBytes"), int)
        or not isinstance(c.get("numFiles"), int)
    ):
        return None
    if not c.get("metadata") or not c.get("protocol"):
        return None
    return {k: c[k] for k in ("tableSizeBytes", "numFiles", "metadata", "protocol")}


def _write(lake: Lake, log: str, version: int, state: dict) -> None:
    body = {
        "tableSizeBytes": state["tableSizeBytes"],
        "numFiles": state["numFiles"],
        "numMetadata": 1,
        "numProtocol": 1,
        "metadata": state["metadata"],
        "protocol": state["protocol"],
    }
    data = (json.dumps(body, separators=(",", ":")) + "\n").encode()
    lake.create(data, log, _crc(version), mode=0o644)  # only if absent: a racing writer's is the same


def write_checksums(lake: Lake, version: int, *, key: str = "") -> int:
    """Write the checksum of every version up to `version` (a committed version of the Delta table at `key` of
    `lake`, at the lake's root when `key` is empty) that lacks one, walking back to the newest
    version that has one (or to version 0). Returns how many were written. Writes nothing where the chain cannot
    be exact (module docstring); never raises for that or for an unreadable or unwritable log: a missing checksum
    only makes readers slower."""
    log = f"{key}/_delta_log" if key else "_delta_log"
    written = 0
    try:
        start = version
        while start >= 0 and not lake.exists(log, _crc(start)):
            start -= 1
            if version - start > _MAX_WALK:
                return 0
        state = _read(lake, log, start) if start >= 0 else None
        if start >= 0 and state is None:
            return 0
        for v in range(start + 1, version + 1):
            state = _apply(state, lake.read_bytes(log, f"{v:020d}.json"))
            _write(lake, log, v, state)
            written += 1
    except (_Inexact, StorageError, OSError, ValueError):
        pass
    return written
