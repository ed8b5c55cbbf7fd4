"""An `asof` job: each event of a stream topic joined with the version of its key in a table topic in force at the
event's time, or the one it pins (`joins.asof`), publishing row, count, agg, list and log views.

Sources: the stream topic and the table topic (the raw changelog, every change in arrival order), in one streaming
query. The versioned copy is built from that log, the one record of the table: a change that arrives after a newer
one is still a version, so which versions exist never depends on arrival order.

Per micro-batch, in this order (so that a crash anywhere replays the batch with the same effect):
1. the batch's changes are appended to the versioned copy (`AsofState.stage`, idempotent by batch id);
2. watermark = the greatest change time seen minus `ALLOWED_LATENESS`;
3. candidates = held events + the batch's events not already emitted (by identity: only events the watermark had
   reached before the batch can have been, and only those are looked up, in a log view without `where`, which
   holds every emitted event, else in the state's `emitted` table), joined as of their time
   (`joins.asof.asof_join`): those the watermark has reached are emitted;
4. the views get the emitted rows: count views their deltas (fenced by batch id; from the driver when a batch's
   keys are few), row views their entries (from the executors), log views an append (idempotent by batch id);
   then the held set is replaced by the events still waiting (idempotent by batch id, only when something was or
   is held) and the mark is written (`AsofState.advance`).
Late data is kept, never dropped (an as-of lookup's answer is determined by the table's history, not by when the
event arrived): stream events that arrive after the watermark passed their time are joined as of their time like any
other (every change they could use is known) and counted as `late_events_kept`; table changes older than the
watermark on arrival are kept as versions and counted as `late_changes_kept` (events already emitted do not see
them).
Windowed views (`views.window`): the stream's events carry the log's stamp (`MAX_BEFORE`, through the held set); an
emitted event behind its topic's watermark as of the log versions before its own is left out of them and counted
as `late`. Their windows close under the lesser of the stream's watermark (its greatest time read, kept in the
mark, minus the lateness) and the table's: no event before it can still be emitted. A batch that emits nothing
closes windows too.
"""

from __future__ import annotations

import functools

from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.topics import MAX_BEFORE
from jobs.core.runtime import state_key
from jobs.core.settings import Settings
from jobs.core.skeleton import Batch, JobRun, Wiring, run_job
from jobs.kinds.asof_views import AsofViews, Counted, windows_watermark
from joins.asof import AsofResult, AsofSides, asof_join, dedupe_events, with_identity
from joins.asof_state import AsofProgress, AsofSnapshot, AsofState
from joins.sides import TwoTopics, own_columns
from spec.model import Pipeline
from views.frame import check_job, view_rows

__all__ = ["run"]

# Up to this many candidates, only their keys' versions are sorted (broadcast semi-join), not the whole copy.
_FEW_EVENTS = 20_000


def _summary(batch_df, sides: AsofSides, watermark: int | None):
    """Counts of the batch, its newest change time, the time range of its events `watermark` had reached, and (a
    job with windowed views: its events carry the log's stamp) the stream's greatest time up to the batch."""
    is_ev, is_ch = F.col("_side") == 0, F.col("_side") == 1
    t = F.when(is_ev, F.col(quoted(f"_0_{sides.stream.time}"))).otherwise(
        F.col(quoted(f"_1_{sides.table.time}"))
    )
    late = t < F.lit(watermark).cast("bigint")
    seen = is_ev & (t <= F.lit(watermark).cast("bigint"))
    return batch_df.agg(
        F.count(F.when(is_ev, 1)).alias("events"),
        F.count(F.when(is_ch, 1)).alias("changes"),
        F.max(F.when(is_ch, t)).alias("max_ts"),
        F.count(F.when(is_ev & late, 1)).alias("late_events_kept"),
        F.count(F.when(is_ch & late, 1)).alias("late_changes_kept"),
        F.min(F.when(seen, t)).alias("seen_lo"),
        F.max(F.when(seen, t)).alias("seen_hi"),
        F.max(F.when(is_ev, F.greatest(t, F.col(f"_0_{MAX_BEFORE}")) if sides.carry else t)).alias(
            "stream_max"
        ),
    ).first()


def _batch(s, n: Counted, wm: int | None, sides: AsofSides) -> Batch:
    """What the skeleton records of a batch with summary `s`, counts `n` and watermark `wm` after it."""
    return Batch(
        events=s["events"],
        summary=f"{s['events']:,} events, {s['changes']:,} changes -> {n.emitted:,} emitted, "
        f"{n.held:,} held, watermark {wm}",
        status={"last_batch_changes": s["changes"], "watermark": wm, "held": n.held},
        counters={"emitted": n.emitted, "unknown_versions": n.unknown}
        | {k: s[k] for k in ("late_events_kept", "late_changes_kept")}
        | ({"late": n.late} if sides.carry else {}),
        meta={"watermark": wm},
        totals={"changes": s["changes"], "emitted": n.emitted},
        inputs={sides.stream.name: s["events"], sides.table.name: s["changes"]},
    )


def _sides(pipeline: Pipeline, job: str) -> tuple[AsofSides, TwoTopics, bool]:
    """The job's roles, its two topics read as one stream, and whether it has windowed views (its events then carry
    the log's stamp `MAX_BEFORE`)."""
    windowed = any(v.window is not None for v in pipeline.jobs[job].views)
    sides = AsofSides.of(pipeline, job, ((MAX_BEFORE, "bigint"),) if windowed else ())
    keep = ((*own_columns(sides.stream), MAX_BEFORE), own_columns(sides.table)) if windowed else None
    return sides, TwoTopics((sides.stream, sides.table), ((), ()), (), keep), windowed


def _wire(run: JobRun, pipeline: Pipeline) -> Wiring:
    settings, gen, lateness = run.settings, run.generation, run.settings.allowed_lateness_ms
    sides, topics, windowed = _sides(pipeline, run.job)
    views = AsofViews(run, pipeline, sides)
    key, emitted = state_key(run.job, gen), views.whole is None
    state = AsofState(run.spark, settings.lake, f"mview-{run.job}-g{gen}", sides, key=key, emitted=emitted)
    run.totals.update(changes=0, emitted=0, held=0, seconds=run.totals.pop("seconds"))  # in printed order

    def decide(batch_df, s, before: AsofSnapshot, wm: int | None) -> AsofResult:
        """The candidates joined as of their time; materialized once (lineage cut): counted, written, held."""
        fresh = with_identity(topics.rows(batch_df, 0), sides)
        if s["seen_lo"] is not None:
            fresh = fresh.join(views.emitted_ids(state, s["seen_lo"], s["seen_hi"]), "_id", "left_anti")
        if before.held:
            fresh = with_identity(before.held_events(), sides).unionByName(fresh)
        few = s["events"] + before.held <= _FEW_EVENTS
        result = asof_join(
            dedupe_events(fresh, sides), before.versions(), sides, watermark_ms=wm, few_keys=few
        )
        return AsofResult(result.decided.localCheckpoint(), sides.stream_fields)

    def publish(batch_id: int, result: AsofResult, before: AsofSnapshot, max_ts, stream_max) -> Counted:
        frame = view_rows(result.emitted, pipeline, run.job)
        n, counts = views.collect(result, frame)
        closes = windows_watermark(stream_max, max_ts, lateness)
        if n.emitted:
            views.write(batch_id, frame, counts, closes)
            if views.whole is None:
                t = F.col(quoted(sides.stream.time)).alias("_t")
                state.record_emitted(batch_id, result.emitted.select("_id", t))
        else:
            views.close_windows(batch_id, closes)
        held = result.held if n.held or before.held else None
        state.advance(batch_id, AsofProgress(max_ts, n.held, held, stream_max))
        return n

    def process(batch_df, batch_id: int) -> Batch | None:
        before = state.restore(batch_id)
        wm_before = before.watermark(lateness)
        s = _summary(batch_df, sides, wm_before)
        if s["events"] == 0 and s["changes"] == 0:
            return None
        if s["changes"]:
            state.stage(batch_id, topics.rows(batch_df, 1))
        max_ts = max((x for x in (before.max_ts, s["max_ts"]) if x is not None), default=None)
        top = (before.stream_max, s["stream_max"]) if windowed else ()
        stream_max = max((x for x in top if x is not None), default=None)
        wm = None if max_ts is None else max_ts - lateness
        if s["events"] or (before.held and wm != wm_before):
            n = publish(batch_id, decide(batch_df, s, before, wm), before, max_ts, stream_max)
        else:
            n = Counted(0, before.held, 0)
            views.close_windows(batch_id, windows_watermark(stream_max, max_ts, lateness))
            state.advance(batch_id, AsofProgress(max_ts, before.held, None, stream_max))
        run.totals["held"] = n.held
        return _batch(s, n, wm, sides)

    return Wiring(source=topics.stream(run.spark, settings.lake), process=process)


def run(
    spark, settings: Settings, pipeline: Pipeline, job: str, *, once: bool = True, generation=None
) -> dict:
    """Run asof job `job` of `pipeline` into `generation` (default: the serving one, rebuilt first if Redis lost
    it, see `jobs.core.replay.serving_or_rebuild`). Returns totals of this run. An expression of the job that Spark
    cannot analyse raises `views.frame.ExpressionError` before anything runs."""
    check_job(spark, pipeline, job)
    return run_job(
        spark, settings, job, functools.partial(_wire, pipeline=pipeline), once=once, generation=generation
    )
