"""The `log` view kind (asof jobs): a Delta output log of the emitted rows.

A Delta table per generation, key `outputs/<view>/g<g>` of the lake (`log_key`; Spark and delta-rs address it
by its URI, `log_path`), one row per emitted event that satisfies the view's `where`: the view's fields in
declared order, plus `_id` (the stream event's identity). Other jobs can read it as a stream. Each micro-batch
appends with Delta's idempotent-write options (`txnAppId` `<job>-g<g>-<view>`, `txnVersion` the batch id), so a
batch Spark replays after a crash is not written twice (`LogSink`). `export_log` reads a generation's log: the
fields of every row, ordered by `_id`.

Read as an event topic by another job (`View.events`: a topic `from: {view: ...}` with `id` and `time`), the log
is stamped as a topic's log is (`changelog.topics`, "The log carries its own watermark"): each row's `MAX_BEFORE`
is the greatest value of the reading topic's time field in the versions before its own (null in its first
append), and each append records the greatest up to and including it in its commit (`userMetadata`), so lateness
downstream is judged by the upstream's batches, the same in every run.

A log without `where` holds every event the job emitted: the job reads it back to drop an event delivered again
after it was emitted (`LogSink.ids`, only the rows whose time lies in a range when the log has the stream's time
among its fields, `time_field`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.storage import Lake
from changelog.topics import MAX_BEFORE, ensure_delta_table, max_time_before, stamp_metadata, table_version
from spec.model import Pipeline, View
from spec.viewfile import ViewCheck, ViewFile, ViewKeys
from spec.viewtable import expr_type
from views.frame import empty_rows, select_view, view_rows

__all__ = [
    "FILE",
    "log_key",
    "log_path",
    "log_rows",
    "log_schema",
    "time_field",
    "whole_log",
    "LogSink",
    "log_sinks",
    "export_log",
]


class LogKeys(ViewKeys):
    """A log view in the file: `log: {fields: {<name>: <expression>, ...}}`."""

    log: dict[str, Any]


def _read(keys: LogKeys, check: ViewCheck) -> dict:
    if check.job_kind == "select" and not check.event:
        check.add(("log",), "a log view of a select is of an event topic (a table's rows change and leave)")
    for extra in sorted(set(keys.log) - {"fields"})[:1]:
        check.add(("log", extra), "unknown key (a log view has `fields`)")
    given = keys.log.get("fields") or {}
    if not isinstance(given, dict):
        check.add(("log", "fields"), "a mapping ({name: expression, ...})")
        given = {}
    fields = check.named(given, ("log", "fields"))
    if not fields:
        check.add(("log", "fields"), "a log view needs `fields`")
    return {"fields": fields}


FILE = ViewFile(
    "log",
    LogKeys,
    _read,
    serves=("asof", "select"),
    serves_note="a log view is for asof and select jobs (an output log of the emitted rows)",
    topic=lambda view, seen: [(n, expr_type(e, seen)) for n, e in view.fields],
    events=True,
)


def log_key(view: str, generation: int) -> str:
    """The lake key of the Delta output log of view `view` for one generation."""
    return f"outputs/{view}/g{generation}"


def log_path(lake: Lake, view: str, generation: int) -> str:
    """The URI of the Delta output log of view `view` for one generation in `lake`: what Spark reads and writes (a
    local path on a local lake)."""
    return lake.uri(log_key(view, generation))


def log_rows(frame: DataFrame, view: View, pipeline: Pipeline) -> DataFrame:
    """The rows of `frame` (`views.frame.view_rows` of emitted rows) the log view `view` keeps: its fields and
    `_id`, where its `where` holds."""
    sel = select_view(frame, view, pipeline, parts=("where", "fields"), keep=("_id",))
    return sel.where("_where").select(*[F.col(quoted(n)) for n, _ in view.fields], "_id")


def log_schema(rows: DataFrame) -> str:
    """`rows`' columns (`log_rows`) as a SQL schema string, for the Delta table."""
    return ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in rows.schema.fields)


def whole_log(views) -> View | None:
    """The first log view of `views` without `where`, if any: it holds every row its job emitted."""
    return next((v for v in views if v.kind == "log" and v.where is None), None)


def time_field(view: View, time: str) -> str | None:
    """The name of a field of `view` that is exactly the stream's time field `time` (its expression the bare name),
    if it has one: a lookup by time range can read only that range of the log."""
    bare = {time, quoted(time)}
    return next((n for n, e in view.fields if e.strip() in bare), None)


class LogSink:
    """Appends a job's emitted rows (`log_rows`) to the output log at `key` (`log_key`) of `lake` (created with
    `schema` if missing), idempotent per batch id (Delta `txnAppId` `app_id`, `txnVersion` the batch id); stamped
    by its field `time` when given (module docstring: `schema` then has `MAX_BEFORE` last)."""

    def __init__(self, spark, lake: Lake, schema: str, app_id: str, *, key: str, time: str | None = None):
        self.spark, self.app_id, self.lake, self.key, self.time = spark, app_id, lake, key, time
        self.path = ensure_delta_table(spark, lake, schema, key=key)

    def write(self, rows: DataFrame, batch_id: int) -> dict:
        """Append `rows`; a batch id already appended adds nothing. Returns {}: the job counts its rows itself."""
        writer = rows
        note = None
        if self.time is not None:
            before = max_time_before(self.lake, self.key)
            top = rows.agg(F.max(F.col(quoted(self.time)).cast("bigint"))).first()[0]
            note = stamp_metadata(max((t for t in (before, top) if t is not None), default=None))
            writer = rows.withColumn(MAX_BEFORE, F.lit(before).cast("bigint"))
        out = writer.write.format("delta").mode("append").option("txnAppId", self.app_id)
        out = out.option("txnVersion", batch_id)
        if note is not None:
            out = out.option("userMetadata", note)
        out.save(self.path)
        return {}

    def ids(self, time: str | None = None, lo: int | None = None, hi: int | None = None) -> DataFrame:
        """`_id` of the log's rows, only those whose column `time` lies in [lo, hi] when given (Delta's file
        statistics then skip the rest of the log)."""
        log = self.spark.read.format("delta").load(self.path)
        if time is not None:
            log = log.where(F.col(quoted(time)).between(lo, hi))
        return log.select("_id")


def log_sinks(spark, lake: Lake, pipeline: Pipeline, job: str, generation: int) -> dict:
    """view name -> a `LogSink` for each log view of `job` in `generation` (its output log at `log_key`), stamped by
    the time of the topic that reads it as events, if one does."""

    empty = view_rows(empty_rows(spark, pipeline, job), pipeline, job)
    out = {}
    for v in (v for v in pipeline.jobs[job].views if v.kind == "log"):
        time = (
            next((t.time for t in pipeline.topics.values() if t.view == v.name), None) if v.events else None
        )
        schema = log_schema(log_rows(empty, v, pipeline))
        out[v.name] = LogSink(
            spark,
            lake,
            f"{schema}, {MAX_BEFORE} bigint" if time is not None else schema,
            f"{job}-g{generation}-{v.name}",
            key=log_key(v.name, generation),
            time=time,
        )
    return out


def export_log(spark, lake: Lake, view: View, generation: int) -> Iterator[dict]:
    """Every row of the generation's log of `view` in `lake`, ordered by `_id`, as dicts of its fields in declared order. Nothing if the job has not published that generation yet (no
    committed version: Spark makes `_delta_log` before it writes version 0)."""
    key = log_key(view.name, generation)
    if table_version(lake, key) < 0:
        return
    names = [n for n, _ in view.fields]
    df = (
        spark.read.format("delta")
        .load(lake.uri(key))
        .orderBy("_id")
        .select(*[F.col(quoted(n)) for n in names])
    )
    for row in df.toLocalIterator():
        values = row.asDict(recursive=True)
        yield {n: values[n] for n in names}
