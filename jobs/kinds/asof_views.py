"""The views of an `asof` job (`jobs.kinds.asof`) and what a batch's emitted events do to them: count views get
their deltas (fenced by batch id; from the driver when a batch's keys are few), row views their entries, agg and
list views the events as row changes (`views.changes.state_views`; a windowed view leaves out late events, its
windows closing under `windows_watermark`), log views an append (idempotent by batch id). Also how the job finds
events it emitted before (a log view without `where` holds them all, else the state's `emitted` table)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import orjson
from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.topics import MAX_BEFORE
from jobs.core.runtime import state_key
from jobs.core.skeleton import JobRun
from joins.asof import AsofResult, AsofSides
from joins.asof_state import AsofState
from spec.model import Pipeline
from views.changes import DeltaViews, state_views
from views.count import CountRows, count_changes, value_types
from views.frame import empty_rows, view_rows
from views.log import log_rows, log_sinks, time_field, whole_log
from views.row import row_changes

__all__ = ["Counted", "AsofViews", "windows_watermark"]

# Up to this many keys of a count view in a batch, its deltas are collected and sent from the driver.
_FEW_KEYS = 10_000


@dataclass(frozen=True)
class Counted:
    """A batch's decided rows counted: emitted, held, emitted with a pin never seen (`unknown`), emitted but late
    for windowed views (`late`)."""

    emitted: int
    held: int
    unknown: int
    late: int = 0


class AsofViews:
    """The views of an asof job with their sinks, and how the job finds events it emitted before."""

    def __init__(self, run: JobRun, pipeline: Pipeline, sides: AsofSides):
        self.run, self.pipeline, self.sides = run, pipeline, sides
        settings, gen, job = run.settings, run.generation, run.job
        self.views = pipeline.jobs[job].views
        self.delta = DeltaViews(pipeline, job, redis_url=settings.redis_url, generation=gen, fence=run.fence)
        self.logs = log_sinks(run.spark, settings.lake, pipeline, job, gen)
        self.aggs = state_views(
            run.spark,
            settings.lake,
            pipeline,
            job,
            state_key(job, gen),
            append_only=True,
            redis_url=settings.redis_url,
            generation=gen,
            fence=run.fence,
        )
        whole = whole_log(self.views)
        self.whole, self.whole_time = whole, whole and time_field(whole, sides.stream.time)

    def emitted_ids(self, state: AsofState, lo: int, hi: int):
        """`_id` of events emitted before whose time may lie in [lo, hi]."""
        if self.whole is None:
            return state.emitted_ids(lo, hi)
        sink = self.logs[self.whole.name]
        return sink.ids(self.whole_time, lo, hi) if self.whole_time else sink.ids()

    def collect(self, result: AsofResult, frame):
        """One Spark job: the decided rows counted, and each count view's deltas (None for a view with more than
        `_FEW_KEYS` keys in this batch: sent from the executors)."""
        d = result.decided
        parts = [
            d.agg(
                F.count(F.when(F.col("_emit"), 1)).alias("emitted"),
                F.count(F.when(~F.col("_emit"), 1)).alias("held"),
                F.count(F.when(F.col("_emit") & F.col("_unknown"), 1)).alias("unknown"),
                F.count(F.when(F.col("_emit") & self._late(), 1)).alias("late"),
            ).select(
                F.lit(None).cast("string").alias("v"),
                F.lit(None).cast("string").alias("k"),
                F.to_json(F.struct("*")).alias("x"),
            )
        ]
        changes = {v.name: count_changes(frame, v, self.pipeline) for v in self.delta.counted}
        for name, ch in changes.items():
            values = F.to_json(F.struct(*[c for c in ch.columns if c != "key"]))
            parts.append(
                ch.limit(_FEW_KEYS + 1).select(
                    F.lit(name).alias("v"), F.col("key").alias("k"), values.alias("x")
                )
            )
        rows = functools.reduce(lambda a, b: a.unionByName(b), parts).collect()
        stats = next(orjson.loads(r["x"]) for r in rows if r["v"] is None)
        found = {name: [] for name in changes}
        for r in rows:
            if r["v"] is not None:
                found[r["v"]].append((r["k"], *orjson.loads(r["x"]).values()))
        counts = {n: (ch, None if len(found[n]) > _FEW_KEYS else found[n]) for n, ch in changes.items()}
        return Counted(stats["emitted"], stats["held"], stats["unknown"], stats["late"]), counts

    def _late(self):
        """Whether an event is late for windowed views: behind its topic's watermark as of the log versions
        before its own (`MAX_BEFORE` minus the lateness); never for a job without windowed views."""
        if not self.sides.carry:
            return F.lit(False)
        t, lateness = F.col(quoted(self.sides.stream.time)), self.run.settings.allowed_lateness_ms
        return F.coalesce(t < F.col(MAX_BEFORE) - F.lit(lateness), F.lit(False))

    def write(self, batch_id: int, frame, counts: dict, watermark: int | None = None) -> None:
        """Every view's part of batch `batch_id` (`frame`: the emitted rows as the views see them); `watermark`:
        the one a windowed view's windows close under (`_windows_watermark`)."""
        by_name = {v.name: v for v in self.views}
        collected = {
            name: ch if rows is None else CountRows(rows, value_types(ch, by_name[name]))
            for name, (ch, rows) in counts.items()
        }
        self.delta.write(
            frame, batch_id, shown=lambda f, v: row_changes(f, v, self.pipeline), counted=collected
        )
        if self.aggs:
            t = quoted(self.sides.stream.time)
            rows = frame.selectExpr("*", "1 AS _sign", f"CAST({t} AS bigint) AS _time")
            if self.sides.carry:
                late = f"coalesce(_time < {MAX_BEFORE} - {self.run.settings.allowed_lateness_ms}, false)"
                rows = rows.withColumn("_late", F.expr(late))
            for agg in self.aggs:
                agg.write(rows, batch_id, watermark=watermark)
        for name, sink in self.logs.items():
            sink.write(log_rows(frame, by_name[name], self.pipeline), batch_id)

    def close_windows(self, batch_id: int, watermark: int | None) -> None:
        """A batch that emitted nothing: the windowed views' windows close under `watermark` all the same (nothing
        for a job without windowed views)."""
        windowed = [agg for agg in self.aggs if agg.view.window is not None]
        if windowed:
            job = self.run.job
            empty = view_rows(empty_rows(self.run.spark, self.pipeline, job), self.pipeline, job)
            for agg in windowed:
                agg.write(empty, batch_id, watermark=watermark)


def windows_watermark(stream_max: int | None, max_ts: int | None, lateness: int) -> int | None:
    """The watermark a windowed view's windows close under: no event before it can still be emitted, so both the
    stream's (its greatest time read minus the lateness: an event behind it is late, left out) and the table's
    (a held event is emitted once the table's watermark reached it). None until both topics have records."""
    if stream_max is None or max_ts is None:
        return None
    return min(stream_max, max_ts) - lateness
