"""An `interval` job: two event topics joined within a time interval (`joins.interval`), publishing row, count, agg
and list views (an agg or list view takes a left event once its window closed).

A right event r matches a left event l when every `match` pair is equal and `lower <= r.time - l.time <= upper`
(`within`). The join runs over its state (`joins.interval_state`); per micro-batch, with W0 = the job's watermark
at its start (the greatest time seen so far on *either* topic minus `ALLOWED_LATENESS`, kept in the job's state,
not Spark's per-stream minimum):
1. A record with a time below W0 is late: dropped from the join, written to the lake's
   `jobs/<job>/late/g<g>/<batch>.jsonl` with the reason (one object per batch, created once: a batch Spark
   replays leaves its first attempt's), and counted (`late` in `mview status`).
   Duplicates (same identity) count once (`duplicates`).
2. The watermark after the batch is W1 = max(W0, the greatest time of the batch's records not late - lateness).
3. A view sees each left event's fields and `matches`, its matching right events so far. A row view publishes a
   left event as soon as it has a match and updates it as more arrive (`final` false), then once its window has
   closed under W1 (`time + upper < W1`) its final record (`final` true; with `unmatched: true` also one that never
   matched, `matches = 0`, and never before its window closed); a count view adds it once, when its window closes
   (with `unmatched: false` only if it matched). `run --once` leaves every left event whose window closed under
   the final watermark published (no extra empty batch).
4. Redis is written first (row entries are absolute, count keys fenced by the step), then the new state version
   is committed: a crash in between replays the batch from the same state version, with the same outcome and
   nothing counted twice.
Idle streams (`IDLE_TIMEOUT`; off by default: an unmatched event waits for newer events): when no record has
arrived for that long, the watermark advances with the wall clock (greatest time - lateness + time since the last
arrival); windows closing under it are published (`close_idle`) each trigger interval and at `--once`'s end.
"""

from __future__ import annotations

import functools
import time

import orjson

from changelog.current import quoted
from jobs.core.fencing import writer_fence
from jobs.core.generations import record_batch
from jobs.core.phases import Phases
from jobs.core.progress import rejected
from jobs.core.replay import serving_or_rebuild
from jobs.core.runtime import job_key, log, state_key, write_status
from jobs.core.settings import Settings
from jobs.core.skeleton import Batch, JobRun, Wiring, run_job
from joins.interval_state import IntervalProgress, IntervalSides, IntervalStore
from spec.model import MATCHES, Pipeline
from views.changes import DeltaViews, state_views
from views.count import count_changes
from views.frame import check_job, mentions, view_rows
from views.redis_io import connect
from views.row import row_changes

__all__ = ["run", "close_idle", "FENCE_STEP"]

FENCE_STEP = 1_000_000  # fence of batch b = b * FENCE_STEP; idle ticks after it: + 1, + 2, ...


def _store(spark, settings: Settings, pipeline: Pipeline, job: str, gen: int) -> IntervalStore:
    sides = IntervalSides.of(spark, pipeline, job)
    return IntervalStore(
        spark,
        settings.lake,
        key=state_key(job, gen),
        sides=sides,
        lateness_ms=settings.allowed_lateness_ms,
    )


def _changes(pipeline: Pipeline, unmatched: str) -> dict:
    """How a step's frame of left events (those that got new matches or closed in it) becomes the row and count
    views' changes (`views.changes.DeltaViews.commands`' `shown` and `counted`)."""

    def rows(frame, view):
        # a key or where over `matches` may change with it: the row's entry before the step may have to go
        before = {MATCHES: "_matches_before"} if mentions(view, [MATCHES]) else None
        return row_changes(
            frame,
            view,
            pipeline,
            shown=f"_matches > 0 OR (_closed AND {unmatched})",
            final="_closed",
            before=before,
            shown_before="NOT _new AND _matches_before > 0",
        )

    def counts(frame, view):
        return count_changes(frame, view, pipeline, counted=f"_closed AND (_matches > 0 OR {unmatched})")

    return {"shown": rows, "counted": counts}


def _aggs(spark, settings: Settings, pipeline: Pipeline, job: str, gen: int, epoch) -> list:
    """The job's agg and list views (a left event is a row once its window closed: rows are never removed)."""
    return state_views(
        spark,
        settings.lake,
        pipeline,
        job,
        state_key(job, gen),
        append_only=True,
        redis_url=settings.redis_url,
        generation=gen,
        fence=epoch,
    )


def _publisher(settings: Settings, pipeline: Pipeline, job: str, gen: int, aggs: list | None = None):
    """`publish(left, fence, watermark)` of `IntervalStore.step`: every view's write of one step, the row and
    count views' in one Spark job, then each agg and list view's (`aggs`: made here when None), its batch id the
    step's fence. A windowed view's window is final once every left event before its end closed: the view's
    watermark is the job's minus `upper`."""
    j = pipeline.jobs[job]
    unmatched = "true" if j.spec.unmatched else "false"
    epoch = writer_fence(job)  # the lease this process holds for the job: its writes' fence
    delta = DeltaViews(pipeline, job, redis_url=settings.redis_url, generation=gen, fence=epoch)
    changes = _changes(pipeline, unmatched)
    time_sql = quoted(pipeline.sides(job)[0].time)

    def publish(left, fence: int, watermark: int | None = None) -> None:
        frame = view_rows(left.where("_changed OR _closed"), pipeline, job)
        delta.write(frame, fence, **changes)
        views = aggs if aggs is not None else _aggs(left.sparkSession, settings, pipeline, job, gen, epoch)
        if views:
            closed = frame.where(f"_closed AND (_matches > 0 OR {unmatched})")
            rows = closed.selectExpr("*", "1 AS _sign", f"CAST({time_sql} AS bigint) AS _time")
            closes = None if watermark is None else watermark - j.spec.upper_ms
            for agg in views:
                agg.write(rows, fence, watermark=closes)

    return publish


def _log_late(run: JobRun, sides: IntervalSides, batch_id: int, rows, w0: int) -> None:
    """Write the batch's late records `rows` (`_side`, `_id`, `_t`), with the reason, to the job's
    `late/g<g>/<batch_id>.jsonl`: `{"topic", "id", <the topic's time field>, "reason", "batch_id", "at"}`. Created
    once per batch id: a replay of the batch (the same records) keeps the first attempt's object."""
    at = int(time.time() * 1000)
    topics = (sides.left, sides.right)
    why = "late: ts {} is older than the watermark " + str(w0) + " at arrival"
    lines = []
    for side, ident, t in sorted((r["_side"], r["_id"], r["_t"]) for r in rows.collect()):
        topic = topics[side]
        line = {
            "topic": topic.name,
            "id": ident,
            topic.time: t,
            "reason": why.format(t),
            "batch_id": batch_id,
        }
        lines.append(orjson.dumps({**line, "at": at}) + b"\n")
    key = f"{job_key(run.job)}/late/g{run.generation}/{batch_id:012d}.jsonl"
    run.settings.lake.create(b"".join(lines), key)


def _status(settings: Settings, sides: IntervalSides, p: IntervalProgress) -> dict:
    return {
        **p.counters(),
        "rejected": rejected(settings, dict.fromkeys((sides.left.name, sides.right.name))),
    }


def _process(
    run: JobRun, pipeline: Pipeline, store: IntervalStore, aggs: list, batch_df, batch_id: int
) -> Batch | None:
    phases, sides = Phases(batch_df.sparkSession), store.sides
    publish = phases.after("join+publish", _publisher(run.settings, pipeline, run.job, run.generation, aggs))
    on_late = functools.partial(_log_late, run, sides, batch_id)
    step = store.batch_step(batch_id * FENCE_STEP, batch_df, publish, on_late, phases.mark)
    if step is None:
        return None
    c, w1 = step.counts, step.progress.watermark
    summary = (
        f"{c['events']:,} events ({c['late']:,} late, {c['duplicates']:,} duplicate), watermark {w1}: "
        f"{c['closed']:,} final, {c['provisional']:,} matched so far, {c['state_rows']:,} state rows "
        f"({phases})"
    )
    totals = {k: c[k] for k in ("late", "duplicates", "closed", "provisional")}
    totals["state_rows"] = [c["state_rows"]]  # a list: the state's size after each batch of the run
    status = _status(run.settings, sides, step.progress)
    b = Batch(c["events"], summary, status, meta={"last_fence": step.fence})
    inputs = {sides.left.name: 0, sides.right.name: 0}
    inputs[sides.left.name] += c["left"]
    inputs[sides.right.name] += c["right"]
    b.totals, b.inputs, b.phases = totals, inputs, phases.seconds()
    return b


def _wire(run: JobRun, pipeline: Pipeline, max_files: int | None) -> Wiring:
    settings = run.settings
    store = _store(run.spark, settings, pipeline, run.job, run.generation)
    seconds = run.totals.pop("seconds")  # keys in the order `mview run <job> --once` prints them
    run.totals.update(late=0, duplicates=0, closed=0, provisional=0, seconds=seconds, state_rows=[])

    aggs = _aggs(run.spark, settings, pipeline, run.job, run.generation, run.fence)

    def process(batch_df, batch_id: int) -> Batch | None:
        with store.exclusive():
            return _process(run, pipeline, store, aggs, batch_df, batch_id)

    def idle() -> None:
        now = int(time.time() * 1000)
        run.totals["closed"] += _idle(settings, pipeline, run.job, run.generation, store, now).get(
            "closed", 0
        )

    source = store.sides.topics.stream(run.spark, settings.lake, max_files_per_trigger=max_files)
    return Wiring(source, process, idle if settings.idle_timeout_ms is not None else None)


def run(
    spark,
    settings: Settings,
    pipeline: Pipeline,
    job: str,
    *,
    once: bool = True,
    generation: int | None = None,
    max_files_per_trigger: int | None = None,
) -> dict:
    """Run interval job `job` of `pipeline` into `generation` (default: the serving one). Returns totals of this
    run: batches, events, late, duplicates, closed, provisional, seconds, state_rows (after each micro-batch).
    An expression of the job that Spark cannot analyse raises `views.frame.ExpressionError` before anything runs."""
    check_job(spark, pipeline, job)
    wire = functools.partial(_wire, pipeline=pipeline, max_files=max_files_per_trigger)
    return run_job(spark, settings, job, wire, once=once, generation=generation)


def close_idle(
    spark, settings: Settings, pipeline: Pipeline, job: str, *, generation: int | None = None, now_ms=None
) -> dict:
    """The idle rule (`IDLE_TIMEOUT`, `IntervalProgress.idle_watermark`) at `now_ms` (default: now): if no record
    arrived for that long, advance the watermark with the wall clock and publish the windows that close under it.
    Returns the step's counts ({} if nothing to do: the option is off, nothing arrived yet, the stream is not
    idle, or no window would close)."""
    if settings.idle_timeout_ms is None:
        return {}
    gen = generation if generation is not None else serving_or_rebuild(spark, settings, job)
    store, now = (
        _store(spark, settings, pipeline, job, gen),
        int(time.time() * 1000) if now_ms is None else now_ms,
    )
    return _idle(settings, pipeline, job, gen, store, now)


def _idle(settings: Settings, pipeline: Pipeline, job: str, gen: int, store: IntervalStore, now: int) -> dict:
    """`close_idle` on `store` (generation `gen`) at `now`."""
    with store.exclusive():
        step = store.idle_step(now, settings.idle_timeout_ms, _publisher(settings, pipeline, job, gen))
        if step is None:
            return {}
        p, at = step.progress, int(time.time() * 1000)
        client = connect(settings.redis_url, cluster=settings.redis_cluster)  # no batch id below: fields only
        fence = writer_fence(job)
        record_batch(client, job, gen, None, fence=fence, last_fence=step.fence, last_batch_ms=at)
        fields = {**_status(settings, store.sides, p), "idle_watermark_ms": p.watermark}
        write_status(settings, job, generation=gen, last_batch_ms=at, **fields)
    closed, idle_s = step.counts["closed"], (now - p.last_event_ms) / 1000
    log(f"{job} g{gen} idle for {idle_s:.0f}s: watermark -> {p.watermark}, {closed:,} closed")
    return step.counts
