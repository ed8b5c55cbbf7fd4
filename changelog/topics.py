"""Topics as Delta tables: one append-only table per topic under `LAKE_DIR/topics/<topic>`, its columns those of
the topic's declaration (`spec.model.Topic.columns()`: `op` first when the topic has one, then its fields; a
timestamp or long as bigint, a double as double, a boolean as boolean, an id or string as string).

A record's offset is (Delta commit version, index in the commit). Consumers read a topic as a stream from a
checkpoint (`read_stream`) or as a batch, optionally as of a version (`read_batch`). `latest_version` lists the
Delta log itself, so `mview status` can measure lag without starting Spark.
`ensure_delta_table` creates the lake's other Delta tables (a join's state tables, a view's output log).

A topic is given as its `spec.model.Topic`: a caller that holds a name resolves it through the pipeline it runs
(`Settings.pipeline().topics[name]`).

A topic's table is created and appended to without Spark (delta-rs, the `deltalake` package), with the plain
protocol Spark writes too (reader 1, writer 2, no table properties), so Spark jobs, their streaming checkpoints
and delta-rs writers share every topic log in both directions. Its schema is `topic_columns`, seen by Spark as
`topic_schema` and by Arrow as `topic_arrow_schema`.

**A declaration that changes.** `ensure_topic` (which ingest, the kafka and cdc jobs and every reader go through)
compares the log's columns with the declaration's (`log_change`):
- the same columns (in any order): nothing to do. Columns of the log marked optional (field metadata
  `mview.optional`, set for an optional field when the log is created or grows) that the declaration leaves out
  do not count: another declaration of the topic (another pipeline on the lake) made them; appends through this
  one hold null there (`append_table`), and its jobs read only the declared columns;
- the declaration adds optional fields, and nothing else: the log's schema grows by those columns (a delta-rs
  `ADD COLUMN` commit, appended at the end of the log's schema); old records hold null in them, for delta-rs and
  Spark readers alike;
- any other change (a field removed, renamed, of another type, a new field that is not optional, `op` added or
  removed): refused with `TopicChanged` (one line that says what to do) when the log holds records; a log that
  holds none takes the new columns (an overwrite of its schema).
`check_topic` makes the same comparison without writing (for `mview produce` and `mview check`).

A topic is addressed through the lake, a `changelog.storage.Lake` (the settings' `lake`; a caller holding a local
path or a URI opens it once with `as_lake`): `topic_path` is the URI Spark reads and writes (a local path,
`hdfs://...`, `s3a://...`), delta-rs gets `Lake.delta_uri` with `Lake.delta_options`, and the Delta log's own
files (its versions, its first commit, the checksums) are listed and read as objects of the lake, never through the
local file system.

Every commit made here is followed by its version checksum (`changelog.checksums`), as Spark's commits are.

**The log carries its own watermark.** Each log has, besides its declared columns, the column `MAX_BEFORE`
(`_max_before`, bigint, marked optional so no declaration needs it): in every record, the greatest time of the
topic's records in the versions committed before the record's own (null for the records of a log's first append).
`append_table` stamps it and records the greatest time including its own records in the commit's `commitInfo`
(`mview.maxTime`), so the next append reads it from the log's newest commit that has it (commits without it, a
compaction, an OPTIMIZE, a schema change, add no records). To stamp the right value an append is one attempt at
its version: one that finds its version taken reads the log again, stamps again and tries the next. Whether an
event is behind its topic's watermark (`MAX_BEFORE` minus `ALLOWED_LATENESS`) is so a property of the log, the
same for every run that reads it, however it cuts the log into batches: a replay judges each event as the first
run did. Readers take the declared columns, so the stamp reaches only a job that asks for it.

**Concurrent writers.** Creating a topic is safe under concurrency: a creation (or a schema change) is one
attempt at its version, never retried at the next one, and one that fails because another writer made it first
counts as done; creators and schema changes take the writers' lock exclusive (`topic_lock`). Appends of records (`append_table`: `mview ingest`, the kafka and cdc jobs, all through delta-rs)
hold it shared, so appends run side by side; a Spark writer of a topic (maintenance's compaction and OPTIMIZE)
holds it exclusive. What that lock is, and what makes concurrent commits safe, depends on the store:
- **local disk**: delta-rs commits a version by a hard link that fails if the version exists; Spark's local log
  store checks, then renames, which is atomic only among the writers of one JVM. So the lock is a `flock` of
  `LAKE_DIR/topics/.<topic>.lock`, a file of this machine (the one place this module touches the local file
  system, and only on a local lake): shared by delta-rs appenders, exclusive for a Spark writer, so no delta-rs
  commit lands beside Spark's. All writers of a local lake run on one machine.
- **HDFS**: Delta's `HDFSLogStore` (Spark) and delta-rs both commit a version by the NameNode's rename without
  overwrite, which refuses atomically a version that exists: any number of writers on any machines commit
  safely (a loser retries on the next version). No lock is taken.
- **S3**: delta-rs commits by conditional PUT (`If-None-Match: *`, `Lake.delta_options`), safe with any number of
  delta-rs writers: no lock is taken. Spark's default S3 log store is safe for one driver only, and nothing here
  keeps a delta-rs commit from racing a Spark commit of the same version: a Spark write to a topic on S3
  (`mview maintain`'s compaction and OPTIMIZE) is safe only while no other process writes that topic (stop the
  kafka and cdc jobs and the ingest producers of the topic during maintenance).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

from arro3.core import Array, ChunkedArray, DataType, RecordBatch, Table

from changelog.checksums import write_checksums
from changelog.errors import TopicChanged, UnknownTopic, ViewNotPublished
from changelog.lakeformat import record_format
from changelog.storage import Lake, NotFound
from spec.model import Topic

__all__ = [
    "topic_key",
    "topic_path",
    "topic_columns",
    "topic_schema",
    "topic_arrow_schema",
    "ensure_topic",
    "open_topic",
    "check_topic",
    "log_change",
    "read_stream",
    "read_batch",
    "latest_version",
    "table_id",
    "ensure_delta_table",
    "append_table",
    "topic_lock",
    "RecordTable",
    "table_version",
    "MAX_BEFORE",
    "max_time_before",
    "stamp_metadata",
]

MAX_BEFORE = "_max_before"  # per record: the topic's greatest time in the versions before the record's own
_MAX_TIME = "mview.maxTime"  # commitInfo: the topic's greatest time up to and including the commit
_APPEND_ATTEMPTS = 1000  # versions an append tries before it gives up (each one taken by another writer)

_BATCH_ROWS = 50_000  # records per Arrow record batch of a RecordTable
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")  # a topic's name (spec.load's rule): safe as a directory name

# A log column's SQL type (`Topic.columns()`) as Arrow's and as Delta's (what delta-rs and Spark write).
_ARROW = {
    "bigint": DataType.int64(),
    "double": DataType.float64(),
    "boolean": DataType.bool(),
    "string": DataType.string(),
}
_DELTA = {"long": "bigint", "integer": "bigint", "double": "double", "boolean": "boolean", "string": "string"}

# The field metadata that marks a log column as optional (`topic_arrow_schema`, `_change`).
_OPTIONAL_KEY = "mview.optional"
_OPTIONAL = {_OPTIONAL_KEY: "true"}

# The functions on one Delta table take the lake and the table's `key` in it (empty: the table is at the lake's
# root, a `Lake` opened at the table's own path).


def _name(topic: Topic) -> str:
    name = topic.name
    if not isinstance(name, str) or not _NAME.match(name):
        raise UnknownTopic(str(name), ())
    return name


def topic_key(topic: Topic) -> str:
    """`topics/<name>`: the key of the topic's log in the lake (a topic read `from:` another: that one's log; a
    topic read from a view: the view's table log a job resolved, `Topic.log`; `ViewNotPublished` when none was)."""
    if topic.view is not None:
        if topic.log is None:
            raise ViewNotPublished(topic.name, topic.view)
        return topic.log
    return f"topics/{topic.source}" if topic.source is not None else f"topics/{_name(topic)}"


def topic_path(lake: Lake, topic: Topic) -> str:
    """The URI of the topic's log for Spark (`Lake.uri`: a local path, `hdfs://...`, `s3a://...`), whether or not it
    exists."""
    return lake.uri(topic_key(topic))


def topic_columns(topic: Topic) -> list[tuple[str, str]]:
    """(name, SQL type) of the topic's table as declared: `op` first (if the topic has one), then its fields."""
    return topic.columns()


def topic_schema(topic: Topic):
    """The topic's columns as a Spark schema (every column nullable)."""
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

    spark = {"bigint": LongType(), "double": DoubleType(), "boolean": BooleanType(), "string": StringType()}
    return StructType([StructField(n, spark[t], True) for n, t in topic_columns(topic)])


def topic_arrow_schema(topic: Topic):
    """The topic's columns as an Arrow schema (arro3): bigint -> int64, double -> float64, boolean -> bool,
    string -> utf8, all nullable; an optional field's column carries the field metadata `OPTIONAL` (the log keeps
    it: a declaration may leave that column out)."""
    from arro3.core import Field, Schema

    return Schema(
        [
            Field(n, _ARROW[t], True, metadata=_OPTIONAL if n in topic.optional else None)
            for n, t in topic.columns()
        ]
    )


def _log_schema(topic: Topic):
    """The Arrow schema a new log of `topic` is created with: `topic_arrow_schema` and the stamp `MAX_BEFORE`."""
    from arro3.core import Field, Schema

    fields = list(topic_arrow_schema(topic))
    return Schema([*fields, Field(MAX_BEFORE, _ARROW["bigint"], True, metadata=_OPTIONAL)])


def _log(key: str) -> str:
    return f"{key}/_delta_log" if key else "_delta_log"


def _exists(lake: Lake, key: str) -> bool:
    """Whether the Delta table at `key` has a committed version (a `_delta_log` without one is no table)."""
    log = _log(key)
    return (
        lake.exists(log, f"{0:020d}.json")
        or lake.exists(log, "_last_checkpoint")
        or table_version(lake, key=key) >= 0
    )


def _delta_table(lake: Lake, key: str):
    """The Delta table at `key`, loaded by delta-rs."""
    from deltalake import DeltaTable

    return DeltaTable(lake.delta_uri(key), storage_options=lake.delta_options() or None)


def _once():
    """Commit properties of a commit made at most once: a writer that finds its version taken fails instead of
    making it again at the next version (delta-rs retries a CREATE TABLE that lost its race as a second one, with
    another table id, which other writers then refuse as a metadata change)."""
    from deltalake import CommitProperties

    return CommitProperties(max_commit_retries=0)


def _create(lake: Lake, key: str, topic: Topic) -> None:
    """Create the log at `key` with the topic's columns unless it exists (under the exclusive lock; on HDFS and S3,
    of racing creators the one whose version 0 lands creates it), the lake's format recorded first if it records
    none (`changelog.lakeformat`)."""
    with topic_lock(lake, key=key, exclusive=True):
        if not _exists(lake, key):
            from deltalake import DeltaTable

            record_format(lake)  # before the log: a lake with a topic log records its format
            try:
                DeltaTable.create(
                    lake.delta_uri(key),
                    _log_schema(topic),
                    mode="ignore",
                    storage_options=lake.delta_options() or None,
                    commit_properties=_once(),
                )
            except Exception:
                if not _exists(lake, key):  # not a writer outside the lock that created it first
                    raise
            write_checksums(lake, table_version(lake, key=key), key=key)


def _log_columns(table) -> dict[str, str]:
    """The columns of the loaded log `table` (a `deltalake.DeltaTable`) as name -> SQL type (an unknown type as
    Delta names it)."""
    out = {}
    for f in table.schema().fields:
        kind = getattr(f.type, "type", None)
        out[f.name] = _DELTA.get(kind, str(kind if kind is not None else f.type))
    return out


def _optional_columns(table) -> set[str]:
    """The columns of the loaded log `table` that a declaration may leave out: those marked `OPTIONAL` (made by an
    optional field, at the log's creation or when it grew)."""
    return {f.name for f in table.schema().fields if (f.metadata or {}).get(_OPTIONAL_KEY) == "true"}


def log_change(table, topic: Topic) -> tuple[str, list] | None:
    """How the declaration of `topic` differs from its loaded log `table` (a `deltalake.DeltaTable`): None when the
    columns are the same (in any order), the log's optional columns (`_optional_columns`) the declaration leaves out
    aside (its records hold null there; readers take the declared columns); ("grow", [(name, SQL type), ...]) when
    it only adds optional fields; else ("change", [each change in words])."""
    log, want = _log_columns(table), dict(topic.columns())
    if log == want:
        return None
    if not log.keys() <= want.keys():
        optional = _optional_columns(table)
        log = {n: t for n, t in log.items() if n in want or n not in optional}
        if log == want:
            return None
    added = [n for n in want if n not in log]
    removed = [n for n in log if n not in want]
    retyped = [n for n in log if n in want and log[n] != want[n]]
    if not removed and not retyped and all(n in topic.optional for n in added):
        return "grow", [(n, want[n]) for n in added]
    changes = []
    for n in removed:
        changes.append(
            "`op` is not declared any more" if n == "op" else f"field {n!r} is not declared any more"
        )
    for n in retyped:
        changes.append(f"field {n!r} is declared {topic.type_of(n)}, the log holds {log[n]}")
    for n in added:
        if n == "op":
            changes.append("`op` is new")
        elif n not in topic.optional:
            changes.append(f"field {n!r} is new and not optional")
        else:
            changes.append(f"field {n!r} is new (optional)")
    return "change", changes


def _holds_records(table) -> bool:
    return bool(table.file_uris())


def open_topic(lake: Lake, topic: Topic):
    """The topic's log, ready for records of its declaration: (its URI for Spark, the log loaded as a
    `deltalake.DeltaTable`).

    Creates it (version 0, empty) if it does not exist; otherwise brings its schema to the declaration (module
    docstring): grows it by new optional fields, takes any new columns when it holds no record, and raises
    `TopicChanged` for any other change of a log that holds records (naming the declaration's place,
    `Topic.declared_at`). Needs no Spark. Concurrent callers, in this
    process or others, create or change it once: the rest wait for the first (or lose the race to commit) and go
    on."""
    key = topic_key(topic)
    if not _exists(lake, key):
        _create(lake, key, topic)
    table = _delta_table(lake, key)
    if log_change(table, topic) is None:
        return lake.uri(key), table
    with topic_lock(lake, key=key, exclusive=True):
        table.update_incremental()
        change = log_change(table, topic)
        if change is None:
            return lake.uri(key), table
        if change[0] != "grow" and _holds_records(table):
            raise TopicChanged(topic.name, lake.uri(key), change[1], topic.declared_at)
        try:
            _change(lake, key, table, topic, change)
        except Exception:
            table = _delta_table(lake, key)
            if (
                log_change(table, topic) is not None
            ):  # not a racing writer (HDFS, S3) that made the change first
                raise
        write_checksums(lake, table_version(lake, key=key), key=key)
    return lake.uri(key), _delta_table(lake, key)


def _change(lake: Lake, key: str, table, topic: Topic, change: tuple[str, list]) -> None:
    """Bring the log `table` (at `key`) to the declaration of `topic`: `change` is its `log_change`, a growth or
    a change of a log without records."""
    kind, what = change
    if kind == "grow":
        from deltalake import Field

        delta = {"bigint": "long", "double": "double", "boolean": "boolean", "string": "string"}
        table.alter.add_columns(
            [Field(n, delta[t], nullable=True, metadata=_OPTIONAL) for n, t in what],
            commit_properties=_once(),
        )
    else:
        from deltalake import write_deltalake

        write_deltalake(
            lake.delta_uri(key),
            Table.from_batches([], schema=_log_schema(topic)),
            mode="overwrite",
            schema_mode="overwrite",
            storage_options=lake.delta_options() or None,
            commit_properties=_once(),
        )


def ensure_topic(spark, lake: Lake, topic: Topic) -> str:
    """`open_topic`'s URI: the topic's log created if it does not exist, its schema brought to the declaration.
    `spark` is not used (None is fine); it stays first so callers holding a session need not change."""
    return open_topic(lake, topic)[0]


def check_topic(lake: Lake, topic: Topic) -> tuple[str, list] | None:
    """What `open_topic` would do to the topic's log, without writing: None (nothing, or no log yet), ("grow",
    columns) or ("replace", changes) for a log without records; raises `TopicChanged` as `open_topic` would."""
    key = topic_key(topic)
    if not _exists(lake, key):
        return None
    table = _delta_table(lake, key)
    change = log_change(table, topic)
    if change is None or change[0] == "grow":
        return change
    if not _holds_records(table):
        return "replace", change[1]
    raise TopicChanged(topic.name, lake.uri(key), change[1], topic.declared_at)


@contextmanager
def topic_lock(lake: Lake, *, exclusive: bool, key: str = "") -> Iterator[None]:
    """Hold the writers' lock of the Delta table at `key` of `lake` (the lake's root when `key` is empty), shared
    or exclusive: on a local lake a `flock` of the file `.<name>.lock` beside the table; on HDFS and S3 nothing
    (module docstring: what makes concurrent commits safe there)."""
    path = lake.local_path(key)
    if path is None:
        yield
        return
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)  # released when the file is closed
        yield


def append_table(
    lake: Lake,
    table,
    *,
    note: str,
    time: str,
    transactions: tuple[tuple[str, int], ...] = (),
    metadata: dict[str, str] | None = None,
    delta_table=None,
    key: str = "",
) -> None:
    """Append the Arrow `table` (the topic's `topic_arrow_schema`; `time`, the name of its time column) to the topic
    log at `key` of `lake` (the lake's root when `key` is empty) in one delta-rs commit with `userMetadata` `note`
    and the string fields of `metadata` in its `commitInfo`, recording each Delta transaction `(app_id, version)` of
    `transactions` (the idempotent writes of the kafka and cdc jobs, the positions of `mview ingest`), under the
    shared writers' lock; each record stamped with `MAX_BEFORE` (module docstring); then the commit's version
    checksum (`changelog.checksums`), which spares every streaming reader a Spark job per new version.
    `delta_table`, a `deltalake.DeltaTable` of that log already loaded, is written through instead of loading the
    log again. A commit that finds its version taken is stamped again and tried on the next one. An empty `table`
    makes a commit too, holding only its transactions and metadata."""
    from deltalake import CommitProperties, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError

    with topic_lock(lake, key=key, exclusive=False):
        log = delta_table if delta_table is not None else _delta_table(lake, key)
        table = _fitted(table, log.schema().to_arrow())
        stamped = MAX_BEFORE in table.column_names
        top = _max_time(table, time) if stamped else None
        for _ in range(_APPEND_ATTEMPTS):
            before = _max_time_before(log) if stamped else None
            done = max((t for t in (before, top) if t is not None), default=None)
            props = CommitProperties(
                custom_metadata={
                    **(metadata or {}),
                    "userMetadata": note,
                    **({_MAX_TIME: str(done)} if done is not None else {}),
                },
                app_transactions=[Transaction(app, version) for app, version in transactions] or None,
                max_commit_retries=0,
            )
            rows = _stamped(table, before) if stamped else table
            try:
                write_deltalake(log, rows, mode="append", commit_properties=props)
                break
            except CommitFailedError:
                log.update_incremental()  # another writer took the version: read what it added, try the next
        else:
            raise CommitFailedError(f"no version of {lake.uri(key)} taken in {_APPEND_ATTEMPTS} attempts")
        write_checksums(lake, log.version(), key=key)  # the table's state after its own commit: no listing


def _max_time(table: Table, time: str) -> int | None:
    """The greatest non-null value of the column `time` of the Arrow `table`, or None."""
    best = None
    for chunk in table.column(time).chunks:
        if chunk.null_count == 0:
            top = int(chunk.to_numpy().max()) if len(chunk) else None
        else:
            top = max((v for v in chunk.to_pylist() if v is not None), default=None)
        if top is not None:
            best = top if best is None else max(best, top)
    return best


def _max_time_before(log) -> int | None:
    """The topic's greatest time up to the loaded log's version: `mview.maxTime` of its newest commit that records
    one, in its `commitInfo` (delta-rs) or its `userMetadata` JSON (a Spark writer's, `stamp_metadata`); None: no
    commit does, a log with no stamped append yet."""
    depth = 1
    while True:
        infos = log.history(depth)
        for info in infos:
            if _MAX_TIME in info:
                return int(info[_MAX_TIME])
            note = info.get("userMetadata")
            if isinstance(note, str) and note.startswith("{") and _MAX_TIME in note:
                return int(json.loads(note)[_MAX_TIME])
        if len(infos) < depth:
            return None
        depth *= 8


def max_time_before(lake: Lake, key: str) -> int | None:
    """The greatest time of the stamped log at `key` of `lake` up to its newest version (`_max_time_before`): the
    `MAX_BEFORE` of records appended next."""
    return _max_time_before(_delta_table(lake, key))


def stamp_metadata(done: int | None) -> str | None:
    """The `userMetadata` a Spark writer gives a commit of a stamped log whose greatest time up to and including
    the commit is `done` (None: none to record)."""
    return None if done is None else json.dumps({_MAX_TIME: str(done)})


def _stamped(table: Table, before: int | None) -> Table:
    """`table` with each record's `MAX_BEFORE` set to `before`."""
    i = table.column_names.index(MAX_BEFORE)
    field = table.schema.field(MAX_BEFORE)
    return table.set_column(i, field, _filled(before, [len(c) for c in table.column(i).chunks], field.type))


def _filled(value, lengths: list[int], kind) -> ChunkedArray:
    """A column of Arrow type `kind` holding `value` in every row, in chunks of `lengths` rows."""
    return ChunkedArray([Array([value] * n, type=kind) for n in lengths], type=kind)


def _fitted(table: Table, schema) -> Table:
    """The Arrow `table` in the log's `schema`: its columns in the log's order, null in each column of the log it
    lacks (an optional column another declaration gave the log: `log_change`)."""
    have = set(table.column_names)
    if [f.name for f in schema] == table.column_names or not have <= {f.name for f in schema}:
        return table  # the same columns, or ones the log lacks (delta-rs refuses them, as before)
    lengths = [len(c) for c in table.column(0).chunks] if table.column_names else []
    cols = [table.column(f.name) if f.name in have else _filled(None, lengths, f.type) for f in schema]
    return Table.from_arrays(cols, schema=schema)


class RecordTable:
    """Validated records of one topic as Arrow record batches of the topic's schema, to be committed at once.

    A record that does not fit the schema exactly (a value Arrow would convert, e.g. a bool as a bigint or an int
    as a double, or refuse, a field that is not a column) sets `unfit`; later records are then not kept. Callers
    must refuse to commit an unfit table (`NotStored`)."""

    def __init__(self, topic: Topic):
        self.schema = topic_arrow_schema(topic)
        exact = {
            "bigint": int,
            "double": float,
            "boolean": bool,
        }  # the one Python type a column's values have
        self._columns = [(n, self.schema.field(n).type, exact.get(t)) for n, t in topic.columns()]
        self._known = frozenset(n for n, _t, _e in self._columns)
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
            for name, kind, exact in self._columns:
                values = [r.get(name) for r in rows]
                if exact is not None and any(v is not None and type(v) is not exact for v in values):
                    raise TypeError(
                        f"field {name!r} holds a value that is not a {exact.__name__}"
                    )  # e.g. a bool
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


def _ready(lake: Lake, topic: Topic) -> str:
    """The URI of the topic's log, made ready for the declaration (`ensure_topic`); a topic read from a view: as
    its job made it (a view's table or output log, created with the generation, its columns the job's)."""
    return lake.uri(topic_key(topic)) if topic.view is not None else ensure_topic(None, lake, topic)


def read_stream(spark, lake: Lake, topic: Topic, *, max_files_per_trigger: int | None = None):
    """The topic as a streaming DataFrame, from the start of the log (the checkpoint decides where to resume). The
    log is made ready for the declaration first (`_ready`: a changed declaration is refused here)."""
    path = _ready(lake, topic)
    reader = spark.readStream.format("delta")
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    return reader.load(path)


def read_batch(spark, lake: Lake, topic: Topic, *, version: int | None = None):
    """The topic as a batch DataFrame: every record, or every record committed up to `version`."""
    path = _ready(lake, topic)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(path)


_COMMIT = re.compile(r"^(\d{20})\.json$")


def table_version(lake: Lake, key: str = "") -> int:
    """Latest committed version of the Delta table at `key` of `lake` (the lake's root when `key` is empty), -1
    if none: the newest commit its `_delta_log` lists, without Spark."""
    entries = lake.list(_log(key))
    return max((int(m.group(1)) for e in entries if (m := _COMMIT.match(e.name))), default=-1)


def latest_version(lake: Lake, topic: Topic) -> int:
    """Latest committed version of the topic's log (-1 if the topic does not exist yet). No Spark needed."""
    return table_version(lake, topic_key(topic))


def table_id(lake: Lake, topic: Topic) -> str | None:
    """The id of the topic's Delta table (its `metaData.id`, fixed at creation; a Delta streaming source's offsets
    name it `reservoirId`), read from the log's first commit without Spark; None when that commit is not there."""
    try:
        first = lake.read_bytes(_log(topic_key(topic)), f"{0:020d}.json")
        for line in first.splitlines():
            if b'"metaData"' in line:
                return json.loads(line)["metaData"]["id"]
    except (NotFound, ValueError, KeyError):
        pass
    return None


def ensure_delta_table(
    spark, lake: Lake, schema: str, *, deletion_vectors: bool = False, key: str = ""
) -> str:
    """Create an empty Delta table with `schema` at `key` of `lake` (the lake's root when `key` is empty) if none
    exists; return its URI for Spark.

    deletion_vectors: a MERGE then marks replaced rows instead of rewriting whole files (state tables).
    """
    uri = lake.uri(key)
    if not _exists(lake, key):
        # A `_delta_log` without a commit (its creator died in between) is no table, but Delta would take it for one.
        lake.delete_tree(_log(key))
        props = " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')" if deletion_vectors else ""
        spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{uri}` ({schema}) USING delta{props}")
    return uri
