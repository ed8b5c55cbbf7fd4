"""A `select` job: the rows of one topic, no join (`joins.select`), publishing row, count, agg, list and log views.

Source: the topic's log, one stream. Per micro-batch N:
- an event topic: the batch's records, one per id, less the ids an earlier batch selected, are added rows; every
  view gets them (`views.changes.ChangeViews`), then their ids are recorded (`joins.select.SelectedIds`). A record
  whose id was selected before is counted as a duplicate (`duplicates` in `mview status`). A view without a window
  keeps late records (it has no window that closed); a windowed view leaves out a record whose
  time is behind the topic's watermark as of the log versions before its own (`_time < MAX_BEFORE -
  ALLOWED_LATENESS`, the log's stamp: the same in every run however it cuts the log), counted as `late`. The job's
  watermark after N (its windows close under it) is the topic's greatest time in the versions read so far minus
  the lateness: the batch's greatest time or stamp.
- a table topic: the batch's records change the current table (state: `joins.table_state.TableStore`); the keys
  whose row changed give removed and added rows; every view gets them, then the state is staged and advanced.
The views are written before the state, so a crash at any point replays N with the effect of one.
"""

from __future__ import annotations

import functools

from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.topics import MAX_BEFORE
from jobs.core.runtime import state_key
from jobs.core.settings import Settings
from jobs.core.skeleton import Batch, JobRun, Wiring, run_job
from joins.select import EventSelect, SelectedIds, TableSelect
from joins.sides import topic_stream
from joins.table_state import TableStore
from spec.model import Pipeline
from views.changes import ChangeViews
from views.frame import check_job

__all__ = ["run"]


def _batch(
    topic: str, events: int, added: int, removed: int, duplicates: int, late: int | None = None
) -> Batch:
    counters = {"rows_added": added, "rows_removed": removed, "duplicates": duplicates}
    return Batch(
        events=events,
        summary=f"{events:,} records -> {added:,} rows added, {removed:,} removed"
        + (f", {late:,} late (left out of windowed views)" if late else ""),
        counters=counters if late is None else {**counters, "late": late},
        totals={"rows_added": added, "rows_removed": removed},
        inputs={topic: events},
    )


def _events(run: JobRun, select: EventSelect, views: ChangeViews, windowed: bool):
    key = state_key(run.job, run.generation)
    ids = SelectedIds(run.spark, run.settings.lake, key=f"{key}/ids")
    lateness = run.settings.allowed_lateness_ms if windowed else None
    time = quoted(select.topic.time)

    def process(batch_df, batch_id: int) -> Batch | None:
        candidates = select.candidates(batch_df).localCheckpoint(eager=True)
        n = candidates.count()
        if n == 0:
            return None
        rows = select.rows(candidates, ids.among(candidates), lateness_ms=lateness).localCheckpoint(
            eager=True
        )
        if not windowed:
            added, late, records, watermark = rows.count(), None, batch_df.count(), None
        else:
            added, late = rows.selectExpr("count(1)", "count_if(_late)").first()
            # the topic's greatest time so far: the batch's, or before the batch's first version (its stamp)
            records, top = batch_df.selectExpr(
                "count(1)", f"max(greatest(CAST({time} AS bigint), {MAX_BEFORE}))"
            ).first()
            watermark = None if top is None else top - lateness
        views.write(rows, batch_id, watermark=watermark)
        if added:
            ids.record(rows)
        return _batch(select.topic.name, records, added, 0, n - added, late)

    return process


def _table(run: JobRun, select: TableSelect, views: ChangeViews):
    key = state_key(run.job, run.generation)
    store = TableStore(run.spark, run.settings.lake, select, key=f"{key}/table")

    def process(batch_df, batch_id: int) -> Batch | None:
        records = batch_df.localCheckpoint(eager=True)
        n = records.count()
        if n == 0:
            return None
        changes = select.changes(store.restore(batch_id), records)
        rows = changes.rows().localCheckpoint(eager=True)
        signs = dict(rows.groupBy("_sign").count().collect())
        views.write(rows, batch_id)
        store.stage(batch_id, changes)
        store.advance(batch_id, changes)
        return _batch(select.topic.name, n, signs.get(1, 0), signs.get(-1, 0), 0)

    return process


def _wire(run: JobRun, pipeline: Pipeline) -> Wiring:
    (topic,) = pipeline.sides(run.job)
    views = ChangeViews(
        run.spark,
        run.settings.lake,
        pipeline,
        run.job,
        redis_url=run.settings.redis_url,
        generation=run.generation,
        state_key=state_key(run.job, run.generation),
        append_only=topic.kind == "event",
        fence=run.fence,
    )
    run.totals.update(rows_added=0, rows_removed=0)
    windowed = any(v.window is not None for v in pipeline.jobs[run.job].views)
    if topic.kind == "event":
        process = _events(run, EventSelect(topic), views, windowed)
    else:
        process = _table(run, TableSelect(topic), views)
    source = topic_stream(run.spark, run.settings.lake, topic)
    stamp = (
        F.col(MAX_BEFORE) if MAX_BEFORE in source.columns else F.lit(None).cast("bigint").alias(MAX_BEFORE)
    )
    stamp = [stamp] if windowed else []
    return Wiring(
        source=source.select(*[F.col(quoted(n)) for n, _ in topic.columns()], *stamp), process=process
    )


def run(
    spark, settings: Settings, pipeline: Pipeline, job: str, *, once: bool = True, generation=None
) -> dict:
    """Run select job `job` of `pipeline` into `generation` (default: the serving one, rebuilt first if Redis lost
    it or the job's definition changed). Returns this run's totals. An expression of the job that Spark cannot
    analyse raises `views.frame.ExpressionError` before anything runs."""
    check_job(spark, pipeline, job)
    return run_job(
        spark, settings, job, functools.partial(_wire, pipeline=pipeline), once=once, generation=generation
    )
