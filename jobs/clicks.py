"""The `clicks` job: searches x clicks, a stream-stream interval join within one hour -> `search_clicks`, `ctr`.

A search is joined with every click of its `session_id` whose `ts` is in `[search.ts, search.ts + 1 hour]`
(`joins.interval`, `how="left"`, run over its state by `joins.interval_state`; the views: `views.clicks`).
Per micro-batch, with W0 = the job's watermark at its start (max event time seen so far on *either* topic minus
`ALLOWED_LATENESS`, kept in the job's state, not Spark's per-stream minimum):
1. A record with `ts < W0` is late: dropped from the join, written to `LAKE_DIR/jobs/clicks/late/g<g>/<batch>.jsonl`
   with the reason, and counted (`late` in `mview status`). Duplicates (same `search_id` / `click_id`) count once.
2. The watermark after the batch is W1 = max(W0, max ts of the batch's non-late records - lateness).
3. Each search that got new clicks is published (`clicked: true` with the clicks so far); once its window has
   closed under W1 (`ts + 1 hour < W1`), its final record, added to `ctr` of its query exactly once. Never
   `clicked: false` before the window closed; `run --once` leaves every search whose window closed under the
   final watermark published (no extra empty batch).
4. Redis is written first (fenced), then the new state version is committed: a crash in between replays the
   batch from the same state version, with the same outcome and nothing counted twice.
Idle streams (`CLICKS_IDLE_TIMEOUT`; off by default: "not clicked" waits for newer events): when no record has
arrived for that long, the watermark advances with the wall clock (max event time - lateness + time since the last
arrival); windows closing under it are published (`close_idle_windows`) each trigger interval and at --once's end.
"""

from __future__ import annotations

import functools
import time

import orjson

from changelog.topics import read_stream
from jobs.generations import record_batch
from jobs.phases import Phases
from jobs.replay import serving_or_rebuild
from jobs.runtime import job_dir, log, state_dir, write_status
from jobs.settings import Settings
from jobs.skeleton import Batch, JobRun, Wiring, run_job
from jobs.status import rejected
from joins.interval_state import IntervalProgress, IntervalStore, topic_rows
from views.clicks import ClicksSink, clicks_ops
from views.redis_io import connect

__all__ = ["run_clicks", "close_idle_windows", "TOPICS", "WINDOW_MS", "FENCE_STEP"]

JOB, TOPICS, WINDOW_MS = "clicks", ("searches", "clicks"), 3_600_000
FENCE_STEP = 1_000_000  # fence of batch b = b * FENCE_STEP; idle ticks after it: + 1, + 2, ...


def _store(spark, settings: Settings, gen: int) -> IntervalStore:
    dir_ = state_dir(settings, JOB, gen)
    return IntervalStore(spark, dir_, upper_ms=WINDOW_MS, lateness_ms=settings.allowed_lateness_ms)


def _publisher(settings: Settings, gen: int):
    """`publish(left, fence)` of `IntervalStore.step`: the view's write of one step."""
    sink = ClicksSink(settings.redis_url, gen)
    return lambda left, fence: sink.write(clicks_ops(left), fence)


def _log_late(run: JobRun, batch_id: int, rows, w0: int) -> None:
    """Write the batch's late records `rows`, with the reason, to `late/g<g>/<batch_id>.jsonl`."""
    at, d = int(time.time() * 1000), job_dir(run.settings, JOB) / "late" / f"g{run.generation}"
    why = "late: ts {} is older than the watermark " + str(w0) + " at arrival"
    lines = [
        orjson.dumps({**r.asDict(), "reason": why.format(r["ts"]), "batch_id": batch_id, "at": at}) + b"\n"
        for r in rows.orderBy("topic", "id").collect()
    ]
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{batch_id:012d}.jsonl").write_bytes(b"".join(lines))


def _status(settings: Settings, p: IntervalProgress) -> dict:
    return {**p.counters(), "rejected": rejected(settings, TOPICS)}


def _process(run: JobRun, store: IntervalStore, batch_df, batch_id: int) -> Batch | None:
    phases = Phases(batch_df.sparkSession)
    publish = phases.after("join+publish", _publisher(run.settings, run.generation))
    on_late = functools.partial(_log_late, run, batch_id)
    step = store.batch_step(batch_id * FENCE_STEP, batch_df, publish, on_late, phases.mark)
    if step is None:
        return None
    c, w1 = step.counts, step.progress.watermark
    summary = (
        f"{c['events']:,} events ({c['late']:,} late, {c['duplicates']:,} duplicate), watermark {w1}: "
        f"{c['closed']:,} searches final, {c['provisional']:,} clicked so far, {c['state_rows']:,} state rows "
        f"({phases})"
    )
    totals = {k: c[k] for k in ("late", "duplicates", "closed", "provisional")}
    totals["state_rows"] = [c["state_rows"]]  # a list: the state's size after each batch of the run
    b = Batch(c["events"], summary, _status(run.settings, step.progress), meta={"last_fence": step.fence})
    b.totals, b.inputs, b.phases = totals, {t: c[t] for t in TOPICS}, phases.seconds()
    return b


def _wire(run: JobRun, max_files: int | None) -> Wiring:
    store, settings = _store(run.spark, run.settings, run.generation), run.settings
    seconds = run.totals.pop("seconds")  # keys in the order `mview run clicks --once` prints them
    run.totals.update(late=0, duplicates=0, closed=0, provisional=0, seconds=seconds, state_rows=[])

    def process(batch_df, batch_id: int) -> Batch | None:
        with store.exclusive():
            return _process(run, store, batch_df, batch_id)

    def idle() -> None:
        closed = close_idle_windows(run.spark, settings, generation=run.generation).get("closed", 0)
        run.totals["closed"] += closed

    def topic(t: str):
        return topic_rows(read_stream(run.spark, settings.lake_dir, t, max_files_per_trigger=max_files), t)

    on = settings.clicks_idle_timeout_ms is not None
    return Wiring(topic("searches").unionByName(topic("clicks")), process, idle if on else None)


def run_clicks(
    spark,
    settings: Settings,
    *,
    once: bool = True,
    generation: int | None = None,
    max_files_per_trigger: int | None = None,
) -> dict:
    """Run the clicks job into `generation` (default: the serving one). Returns totals of this run: batches,
    events, late, duplicates, closed, provisional, seconds, state_rows (after each micro-batch)."""
    wire = functools.partial(_wire, max_files=max_files_per_trigger)
    return run_job(spark, settings, JOB, wire, once=once, generation=generation)


def close_idle_windows(
    spark, settings: Settings, *, generation: int | None = None, now_ms: int | None = None
) -> dict:
    """The idle rule (`CLICKS_IDLE_TIMEOUT`, `IntervalProgress.idle_watermark`) at `now_ms` (default: now): if
    no record arrived for that long, advance the watermark with the wall clock and publish the windows that close
    under it. Returns the step's counts ({} if nothing to do: the option is off, nothing arrived yet, the stream
    is not idle, or no window would close)."""
    if settings.clicks_idle_timeout_ms is None:
        return {}
    gen = generation if generation is not None else serving_or_rebuild(spark, settings, JOB)
    store, now = _store(spark, settings, gen), int(time.time() * 1000) if now_ms is None else now_ms
    with store.exclusive():
        step = store.idle_step(now, settings.clicks_idle_timeout_ms, _publisher(settings, gen))
        if step is None:
            return {}
        p, at = step.progress, int(time.time() * 1000)
        client = connect(settings.redis_url, cluster=settings.redis_cluster)  # no batch id below: fields only
        record_batch(client, JOB, gen, None, last_fence=step.fence, last_batch_ms=at)
        fields = {**_status(settings, p), "idle_watermark_ms": p.watermark}
        write_status(settings, JOB, generation=gen, last_batch_ms=at, **fields)
    closed, idle_s = step.counts["closed"], (now - p.last_event_ms) / 1000
    log(f"clicks g{gen} idle for {idle_s:.0f}s: watermark -> {p.watermark}, {closed:,} searches closed")
    return step.counts
