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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import orjson
from pyspark.sql import functions as F

from changelog.current import quoted
from jobs.core.runtime import state_key
from jobs.core.settings import Settings
from jobs.core.skeleton import Batch, JobRun, Wiring, run_job
from joins.asof import AsofResult, AsofSides, asof_join, dedupe_events, with_identity
from joins.asof_state import AsofProgress, AsofSnapshot, AsofState
from joins.sides import TwoTopics
from spec.model import Pipeline
from views.changes import state_views
from views.count import COUNT_LUA, CountSink, count_changes, value_types
from views.fence import GATE_LUA
from views.frame import check_job, view_rows
from views.log import log_rows, log_sinks, time_field
from views.redis_io import is_cluster
from views.row import RowSink, row_changes
from views.wire import forward, payload_rows

__all__ = ["run"]

# Up to this many candidates, only their keys' versions are sorted (broadcast semi-join), not the whole copy.
_FEW_EVENTS = 20_000
# Up to this many keys of a count view in a batch, its deltas are collected and sent from the driver.
_FEW_KEYS = 10_000


@dataclass(frozen=True)
class _Counted:
    """A batch's decided rows counted: emitted, held, emitted with a pin never seen (`unknown`)."""

    emitted: int
    held: int
    unknown: int


def _summary(batch_df, sides: AsofSides, watermark: int | None):
    """Counts of the batch, its newest change time, and the time range of its events `watermark` had reached."""
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
    ).first()


def _batch(s, n: _Counted, wm: int | None, sides: AsofSides) -> Batch:
    """What the skeleton records of a batch with summary `s`, counts `n` and watermark `wm` after it."""
    return Batch(
        events=s["events"],
        summary=f"{s['events']:,} events, {s['changes']:,} changes -> {n.emitted:,} emitted, "
        f"{n.held:,} held, watermark {wm}",
        status={"last_batch_changes": s["changes"], "watermark": wm, "held": n.held},
        counters={"emitted": n.emitted, "unknown_versions": n.unknown}
        | {k: s[k] for k in ("late_events_kept", "late_changes_kept")},
        meta={"watermark": wm},
        totals={"changes": s["changes"], "emitted": n.emitted},
        inputs={sides.stream.name: s["events"], sides.table.name: s["changes"]},
    )


class _Views:
    """The views of an asof job with their sinks, and how the job finds events it emitted before."""

    def __init__(self, run: JobRun, pipeline: Pipeline, sides: AsofSides):
        self.run, self.pipeline, self.sides = run, pipeline, sides
        settings, gen, job = run.settings, run.generation, run.job
        self.views = pipeline.jobs[job].views
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
        whole = next((v for v in self.views if v.kind == "log" and v.where is None), None)
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
            ).select(
                F.lit(None).cast("string").alias("v"),
                F.lit(None).cast("string").alias("k"),
                F.to_json(F.struct("*")).alias("x"),
            )
        ]
        changes = {v.name: count_changes(frame, v, self.pipeline) for v in self.views if v.kind == "count"}
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
        return _Counted(stats["emitted"], stats["held"], stats["unknown"]), counts

    def write(self, batch_id: int, frame, counts: dict) -> None:
        """Every view's part of batch `batch_id` (`frame`: the emitted rows as the views see them)."""
        settings, gen, by_name = self.run.settings, self.run.generation, {v.name: v for v in self.views}
        commands = []
        for name, (ch, rows) in counts.items():
            sink = CountSink(settings.redis_url, by_name[name], gen, self.run.fence)
            if rows is None:
                commands.append(sink.commands(ch, batch_id))
            elif rows:
                sink.write_rows(rows, batch_id, value_types(ch, by_name[name]))
        for v in self.views:
            if v.kind == "row":
                commands.append(
                    RowSink(settings.redis_url, v.name, gen, self.run.fence).commands(
                        row_changes(frame, v, self.pipeline)
                    )
                )
        if commands:
            cmds = functools.reduce(lambda a, b: a.unionByName(b), commands)
            scripts = (GATE_LUA, COUNT_LUA) if counts else (GATE_LUA,)
            forward(
                payload_rows(cmds, cluster=is_cluster(settings.redis_url)),
                settings.redis_url,
                what=f"{self.run.job} views",
                scripts=scripts,
            )
        if self.aggs:
            t = quoted(self.sides.stream.time)
            rows = frame.selectExpr("*", "1 AS _sign", f"CAST({t} AS bigint) AS _time")
            for agg in self.aggs:
                agg.write(rows, batch_id)
        for name, sink in self.logs.items():
            sink.write(log_rows(frame, by_name[name], self.pipeline), batch_id)


def _wire(run: JobRun, pipeline: Pipeline) -> Wiring:
    settings, gen, lateness = run.settings, run.generation, run.settings.allowed_lateness_ms
    sides = AsofSides.of(pipeline, run.job)
    topics = TwoTopics((sides.stream, sides.table), ((), ()), ())
    views = _Views(run, pipeline, sides)
    state = AsofState(
        run.spark,
        settings.lake,
        f"mview-{run.job}-g{gen}",
        sides,
        key=state_key(run.job, gen),
        emitted=views.whole is None,
    )
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

    def publish(batch_id: int, result: AsofResult, before: AsofSnapshot, max_ts) -> _Counted:
        frame = view_rows(result.emitted, pipeline, run.job)
        n, counts = views.collect(result, frame)
        if n.emitted:
            views.write(batch_id, frame, counts)
            if views.whole is None:
                t = F.col(quoted(sides.stream.time)).alias("_t")
                state.record_emitted(batch_id, result.emitted.select("_id", t))
        held = result.held if n.held or before.held else None
        state.advance(batch_id, AsofProgress(max_ts, n.held, held))
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
        wm = None if max_ts is None else max_ts - lateness
        if s["events"] or (before.held and wm != wm_before):
            n = publish(batch_id, decide(batch_df, s, before, wm), before, max_ts)
        else:
            n = _Counted(0, before.held, 0)
            state.advance(batch_id, AsofProgress(max_ts, before.held))
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
