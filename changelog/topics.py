"""Topics as Delta tables: one append-only table per topic under `LAKE_DIR/topics/<topic>`.

A record's offset is (Delta commit version, index in the commit). Consumers read a topic as a stream from a
checkpoint (`read_stream`) or as a batch, optionally as of a version (`read_batch`). `latest_version` reads the
Delta log directory directly, so `mview status` can measure lag without starting Spark.
`ensure_delta_table` creates the lake's other Delta tables (a join's state tables, a view's output log).

A topic's table is created and appended to without Spark (delta-rs, the `deltalake` package), with the plain
protocol Spark writes too (reader 1, writer 2, no table properties), so Spark jobs, their streaming checkpoints
and delta-rs writers share every topic log in both directions. Its schema is `topic_columns`, seen by Spark as
`topic_schema` and by Arrow as `topic_arrow_schema`.

Creating a topic is safe under concurrency: creators of the same topic take turns on an exclusive lock
(`LAKE_DIR/topics/.<topic>.lock`, flock), and a creation that fails because another writer created the table
first counts as done.

Every commit made here is followed by its version checksum (`changelog.checksums`), as Spark's commits are.

Appending is safe under concurrency too. Every append of records (`append_table`: `mview ingest`, the kafka and
cdc jobs, all through delta-rs, whose commits are atomic put-if-absent) holds that lock shared, so appends run
side by side; a Spark writer of a topic (maintenance's compaction and OPTIMIZE) holds it exclusive
(`topic_lock(path, exclusive=True)`), because Spark's commit on a local disk checks and then renames, which is
atomic only among the writers of one JVM.
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from arro3.core import Array, RecordBatch, Table

from changelog.checksums import write_checksums
from changelog.errors import UnknownTopic
from changelog.records import TOPIC_FIELDS

__all__ = [
    "TOPICS",
    "topic_path",
    "topic_columns",
    "topic_schema",
    "topic_arrow_schema",
    "ensure_topic",
    "read_stream",
    "read_batch",
    "latest_version",
    "table_id",
    "ensure_delta_table",
    "append_table",
    "topic_lock",
    "RecordTable",
]

_BATCH_ROWS = 50_000  # records per Arrow record batch of a RecordTable

TOPICS: tuple[str, ...] = tuple(TOPIC_FIELDS)


def _check(topic: str) -> None:
    if topic not in TOPIC_FIELDS:
        raise UnknownTopic(topic, TOPICS)


def topic_path(lake_dir: Path, topic: str) -> Path:
    _check(topic)
    return Path(lake_dir) / "topics" / topic


def topic_columns(topic: str) -> list[tuple[str, str]]:
    """(name, Spark SQL type) of the topic's table, in a fixed order: op first (if any), then fields."""
    _check(topic)
    cols: dict[str, str] = {}
    ops = TOPIC_FIELDS[topic]
    if None not in ops:
        cols["op"] = "string"
    for fields in ops.values():
        for name, (kind, _required) in fields.items():
            cols.setdefault(name, "bigint" if kind == "ts" else "string")
    return list(cols.items())


def topic_schema(topic: str):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType(
        [StructField(n, LongType() if t == "bigint" else StringType(), True) for n, t in topic_columns(topic)]
    )


def topic_arrow_schema(topic: str):
    """The topic's columns as an Arrow schema (arro3): bigint -> int64, string -> utf8, all nullable."""
    from arro3.core import DataType, Field, Schema

    return Schema(
        [
            Field(n, DataType.int64() if t == "bigint" else DataType.string(), True)
            for n, t in topic_columns(topic)
        ]
    )


def _exists(path: Path) -> bool:
    """Whether the Delta table at `path` has a committed version (a `_delta_log` without one is no table)."""
    log = path / "_delta_log"
    return (
        (log / f"{0:020d}.json").exists() or (log / "_last_checkpoint").exists() or table_version(path) >= 0
    )


def ensure_topic(spark, lake_dir: Path, topic: str) -> str:
    """Create the topic's Delta table (version 0, empty) if it does not exist; return its path.

    Needs no Spark: `spark` may be None. Concurrent callers, in this process or others, create it once: the rest
    wait for the creator and go on."""
    path = topic_path(lake_dir, topic)
    if _exists(path):
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{topic}.lock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when the file is closed
        if not _exists(path):
            from deltalake import DeltaTable

            try:
                DeltaTable.create(str(path), topic_arrow_schema(topic), mode="ignore")
            except Exception:
                if not _exists(path):  # not a writer outside the lock that created it first
                    raise
            write_checksums(path, table_version(path))
    return str(path)


@contextmanager
def topic_lock(path: Path | str, *, exclusive: bool) -> Iterator[None]:
    """Hold the writers' lock of the topic log at `path` (see the module docstring), shared or exclusive."""
    path = Path(path)
    with open(path.parent / f".{path.name}.lock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)  # released when the file is closed
        yield


def append_table(
    path: Path | str,
    table,
    *,
    note: str,
    transactions: tuple[tuple[str, int], ...] = (),
    metadata: dict[str, str] | None = None,
    delta_table=None,
) -> None:
    """Append the Arrow `table` (the topic's `topic_arrow_schema`) to the topic log at `path` in one delta-rs
    commit with `userMetadata` `note` and the string fields of `metadata` in its `commitInfo`, recording each Delta
    transaction `(app_id, version)` of `transactions` (the idempotent writes of the kafka and cdc jobs, the
    positions of `mview ingest`), under the shared writers' lock; then the commit's version checksum
    (`changelog.checksums`), which spares every streaming reader a Spark job per new version. `delta_table`, a
    `deltalake.DeltaTable` of `path` already loaded, is written through instead of loading the log again (a
    commit that finds its version taken is retried on the next one either way). An empty `table` makes a commit
    too, holding only its transactions and metadata."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    props = CommitProperties(
        custom_metadata={**(metadata or {}), "userMetadata": note},
        app_transactions=[Transaction(app, version) for app, version in transactions] or None,
        max_commit_retries=100,
    )
    with topic_lock(path, exclusive=False):
        write_deltalake(
            str(path) if delta_table is None else delta_table, table, mode="append", commit_properties=props
        )
        write_checksums(path, table_version(path))


class RecordTable:
    """Validated records of one topic as Arrow record batches of the topic's schema, to be committed at once.

    A record that does not fit the schema exactly (a value Arrow would convert, e.g. a bool as `ts`, or refuse, a
    field that is not a column) sets `unfit`; later records are then not kept. Callers must refuse to commit an unfit table (`NotStored`)."""

    def __init__(self, topic: str):
        self.schema = topic_arrow_schema(topic)
        self._columns = [(n, self.schema.field(n).type, t == "bigint") for n, t in topic_columns(topic)]
        self._known = frozenset(n for n, _t, _i in self._columns)
        self._rows: list[dict] = []
        self._batches: list[RecordBatch] = []
        self.unfit: str | None = None

    def add(self, record: dict) -> None:
        if self.unfit is None:
            self._rows.append(record)
            if len(self._rows) >= _BATCH_ROWS:
                self._flush()

    def _flush(self) -> None:
        rows, self._rows = self._rows, []
        try:
            for r in rows:
                if not r.keys() <= self._known:
                    raise ValueError(f"fields {sorted(r.keys() - self._known)} are not columns of the topic")
            arrays = []
            for name, kind, is_int in self._columns:
                values = [r.get(name) for r in rows]
                if is_int and any(v is not None and type(v) is not int for v in values):
                    raise TypeError(f"field {name!r} holds a value that is not an integer")  # e.g. a bool
                arrays.append(
                    Array(values, type=kind)
                )  # refuses a str for int64, an int for a string, > 64 bits
            self._batches.append(RecordBatch.from_arrays(arrays, schema=self.schema))
        except (ValueError, TypeError, OverflowError, UnicodeError) as e:
            self.unfit = f"{type(e).__name__}: {str(e)[:200]}"

    def table(self) -> Table:
        if self._rows and self.unfit is None:
            self._flush()
        return Table.from_batches(self._batches, schema=self.schema)


def read_stream(spark, lake_dir: Path, topic: str, *, max_files_per_trigger: int | None = None):
    """The topic as a streaming DataFrame, from the start of the log (the checkpoint decides where to resume)."""
    path = ensure_topic(spark, lake_dir, topic)
    reader = spark.readStream.format("delta")
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    return reader.load(path)


def read_batch(spark, lake_dir: Path, topic: str, *, version: int | None = None):
    """The topic as a batch DataFrame: every record, or every record committed up to `version`."""
    path = ensure_topic(spark, lake_dir, topic)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(path)


_COMMIT = re.compile(r"^(\d{20})\.json$")


def table_version(path: Path | str) -> int:
    """Latest committed version of the Delta table at `path` (-1 if none), read from its log dir without Spark."""
    log = Path(path) / "_delta_log"
    if not log.is_dir():
        return -1
    return max((int(m.group(1)) for p in log.iterdir() if (m := _COMMIT.match(p.name))), default=-1)


def latest_version(lake_dir: Path, topic: str) -> int:
    """Latest committed version of the topic's log (-1 if the topic does not exist yet). No Spark needed."""
    return table_version(topic_path(lake_dir, topic))


def table_id(lake_dir: Path, topic: str) -> str | None:
    """The id of the topic's Delta table (its `metaData.id`, fixed at creation; a Delta streaming source's offsets
    name it `reservoirId`), read from the log's first commit without Spark; None when that commit is not there."""
    try:
        with open(topic_path(lake_dir, topic) / "_delta_log" / f"{0:020d}.json") as f:
            for line in f:
                if '"metaData"' in line:
                    return json.loads(line)["metaData"]["id"]
    except (OSError, ValueError, KeyError):
        pass
    return None


def ensure_delta_table(spark, path: Path, schema: str, *, deletion_vectors: bool = False) -> str:
    """Create an empty Delta table with `schema` at `path` if none exists; return the path.

    deletion_vectors: a MERGE then marks replaced rows instead of rewriting whole files (state tables).
    """
    if not _exists(path):
        # A `_delta_log` without a commit (its creator died in between) is no table, but Delta would take it for one.
        shutil.rmtree(path / "_delta_log", ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        props = " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')" if deletion_vectors else ""
        spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({schema}) USING delta{props}")
    return str(path)
