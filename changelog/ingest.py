"""Validated ingest: JSON lines -> the topic's Delta log, one commit per file; bad lines -> dead letters.

Every line is decoded with orjson and validated (`changelog.records`). Valid records are appended to the topic's
table in one Delta commit per input file (a file with no valid line makes no commit). A rejected line is
appended to `LAKE_DIR/deadletter/<topic>.jsonl` as `{"file","line","reason","raw","at"}` and never reaches a
view; ingestion goes on with the next line. Blank (whitespace-only) lines are skipped, not rejected.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from changelog.errors import InvalidRecord
from changelog.records import parse_line
from changelog.topics import ensure_topic, topic_schema

__all__ = ["IngestResult", "ingest", "deadletter_path", "AFTER_APPEND"]

# topic -> hook(spark, lake_dir, appended_df) run after each append (the profiles table applies its changes here).
AFTER_APPEND: dict[str, Callable] = {}


@dataclass
class IngestResult:
    topic: str
    accepted: int = 0
    rejected: int = 0
    files: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {"topic": self.topic, "accepted": self.accepted, "rejected": self.rejected}


def deadletter_path(lake_dir: Path, topic: str) -> Path:
    return Path(lake_dir) / "deadletter" / f"{topic}.jsonl"


def _lines(source: str) -> Iterable[bytes]:
    if source == "-":
        yield from sys.stdin.buffer
    else:
        with open(source, "rb") as fh:
            yield from fh


def ingest(
    spark, lake_dir: Path, topic: str, sources: list[str], *, progress: Callable[[str], None] | None = None
) -> IngestResult:
    """Append the valid records of each source file (`-` = stdin) to `topic`; return the counts."""
    lake_dir = Path(lake_dir)
    path = ensure_topic(spark, lake_dir, topic)
    schema = topic_schema(topic)
    dl_path = deadletter_path(lake_dir, topic)
    dl_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = lake_dir / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    result = IngestResult(topic)
    for source in sources:
        name = "<stdin>" if source == "-" else str(source)
        accepted = rejected = 0
        started = time.monotonic()
        with (
            tempfile.NamedTemporaryFile("wb", dir=tmp_dir, suffix=".jsonl", delete=False) as good,
            open(dl_path, "ab") as dead,
        ):
            for lineno, raw in enumerate(_lines(source), start=1):
                if not raw.strip():
                    continue
                try:
                    record = parse_line(topic, raw)
                except InvalidRecord as e:
                    rejected += 1
                    dead.write(
                        orjson.dumps(
                            {
                                "file": name,
                                "line": lineno,
                                "reason": e.reason,
                                "raw": raw.decode("utf-8", "replace").rstrip("\r\n"),
                                "at": int(time.time() * 1000),
                            }
                        )
                        + b"\n"
                    )
                    continue
                good.write(orjson.dumps(record) + b"\n")
                accepted += 1
                if progress and lineno % 200_000 == 0:
                    progress(f"{topic}: {name}: {lineno:,} lines read")
        try:
            if accepted:
                df = spark.read.schema(schema).json(good.name)
                (df.write.format("delta").mode("append").option("userMetadata", f"ingest {name}").save(path))
                hook = AFTER_APPEND.get(topic)
                if hook is not None:
                    hook(spark, lake_dir, spark.read.schema(schema).json(good.name))
        finally:
            Path(good.name).unlink(missing_ok=True)
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


import changelog.cdc  # noqa: E402,F401  (registers AFTER_APPEND["profiles"]: the profiles table applies changes)
