"""The `enrichment` job: activity x versioned profiles -> `enriched_activity` (Delta log), `activity_by_country`
(Redis). Semantics in `joins.asof`, its state in `joins.asof_state`, the views in `views.enrichment`.

Sources: the `activity` topic and the `profiles` topic (the raw change log, every change in arrival order), in
one streaming query. The versioned copy is built from that log, the one record of the profiles: a change that
arrives after a newer one is still a version, so which versions exist never depends on arrival order.

Per micro-batch, in this order (so that a crash anywhere replays the batch with the same effect):
1. the batch's changes are appended to the versioned copy (`AsofState.stage`, idempotent by batch id);
2. watermark = max change `ts` seen minus `ALLOWED_LATENESS`;
3. candidates = held events + the batch's events not already in `enriched_activity` (dedup by `event_id`;
   only events the watermark had reached before the batch can be there, and only those are looked up), joined
   as of their `ts` (`joins.asof.asof_join`): those the watermark has reached are emitted;
4. per-country counts go to Redis (fenced by batch id), the emitted rows are appended to `enriched_activity`
   (idempotent by batch id), then the held set is replaced by the events still waiting (idempotent by batch
   id, only when something was or is held) and the mark is written (`AsofState.advance`).
Activity events that arrive after the watermark passed their `ts` are still enriched correctly (every change
they could use is known) and counted as `late_events`; profile changes older than the watermark on arrival are
kept as versions and counted as `late_changes` (events already emitted do not see them).
A record is a duplicate of an emitted one if it has the same `event_id` and its `ts` lies in the range of `ts`
of this batch's events that the watermark had already reached (a record delivered again has the same `ts`).
"""

from __future__ import annotations

from pyspark.sql import functions as F

from changelog.topics import read_stream
from jobs.settings import Settings
from jobs.skeleton import Batch, JobRun, Wiring, run_job
from joins.asof import EVENT_COLUMNS, AsofResult, asof_join, dedupe_events
from joins.asof_state import AsofProgress, AsofSnapshot, AsofState
from views.enrichment import CountryCounts, CountrySink, EnrichedLogSink, country_counts, enriched_path

__all__ = ["run_enrichment", "TOPICS", "JOB"]

JOB = "enrichment"
TOPICS = ("activity", "profiles")
_SOURCE_COLUMNS = ["event_id", "user_id", "action", "profile_version", "op", "name", "country"]
# Up to this many candidates, only their users' versions are sorted (broadcast semi-join), not the whole copy.
_FEW_EVENTS = 20_000


def _is(topic: str):
    """The batch's rows of `topic`. The batch is not cached: `topic` is a literal of each side of the union, so
    every filter on it reads only that topic's files (and only the columns used)."""
    return F.col("topic") == topic


def _source(spark, settings: Settings):
    def norm(topic):
        df = read_stream(spark, settings.lake_dir, topic)
        cols = set(df.columns)
        return df.select(
            F.lit(topic).alias("topic"),
            *[F.col(c) if c in cols else F.lit(None).cast("string").alias(c) for c in _SOURCE_COLUMNS],
            F.col("ts"),
        )

    return norm("activity").unionByName(norm("profiles"))


def _summary(batch_df, watermark: int | None):
    """Counts of the batch, its newest change ts, and the `ts` range of its events `watermark` had reached."""
    late = F.col("ts") < F.lit(watermark).cast("bigint")
    seen = _is("activity") & (F.col("ts") <= F.lit(watermark).cast("bigint"))
    return batch_df.agg(
        F.count(F.when(_is("activity"), 1)).alias("events"),
        F.count(F.when(_is("profiles"), 1)).alias("changes"),
        F.max(F.when(_is("profiles"), F.col("ts"))).alias("max_ts"),
        F.count(F.when(_is("activity") & late, 1)).alias("late_events"),
        F.count(F.when(_is("profiles") & late, 1)).alias("late_changes"),
        F.min(F.when(seen, F.col("ts"))).alias("seen_lo"),
        F.max(F.when(seen, F.col("ts"))).alias("seen_hi"),
    ).first()


def _batch(s, n: CountryCounts, wm: int | None) -> Batch:
    """What the skeleton records of a batch with summary `s`, counts `n` and watermark `wm` after it."""
    return Batch(
        events=s["events"],
        summary=f"{s['events']:,} events, {s['changes']:,} changes -> {n.emitted:,} emitted, "
        f"{n.held:,} held, watermark {wm}",
        status={"last_batch_changes": s["changes"], "watermark": wm, "held": n.held},
        counters={"emitted": n.emitted, "unknown_versions": n.unknown}
        | {k: s[k] for k in ("late_events", "late_changes")},
        meta={"watermark": wm},
        totals={"changes": s["changes"], "emitted": n.emitted},
        inputs={"activity": s["events"], "profiles": s["changes"]},
    )


def _wire(run: JobRun) -> Wiring:
    settings, gen, lateness = run.settings, run.generation, run.settings.allowed_lateness_ms
    app_id = f"mview-{JOB}-g{gen}"
    state = AsofState(run.spark, run.state_dir, app_id)
    out = EnrichedLogSink(run.spark, enriched_path(settings.lake_dir, gen), app_id)
    countries = CountrySink(settings.redis_url, gen)
    run.totals.update(changes=0, emitted=0, held=0, seconds=run.totals.pop("seconds"))  # in printed order

    def decide(batch_df, s, before: AsofSnapshot, wm: int | None) -> AsofResult:
        """The candidates joined as of their ts; materialized once (lineage cut): counted, written, held."""
        fresh = batch_df.where(_is("activity")).select(*EVENT_COLUMNS)
        if s["seen_lo"] is not None:
            fresh = fresh.join(out.event_ids(s["seen_lo"], s["seen_hi"]), "event_id", "left_anti")
        if before.held:
            fresh = before.held_events().unionByName(fresh)
        few = s["events"] + before.held <= _FEW_EVENTS
        result = asof_join(dedupe_events(fresh), before.versions(), watermark_ms=wm, few_users=few)
        return AsofResult(result.decided.localCheckpoint())

    def publish(batch_id: int, result: AsofResult, before: AsofSnapshot, max_ts) -> CountryCounts:
        n = country_counts(result.decided)
        if n.counts:
            countries.write(n.counts, batch_id)
            out.write(result.emitted, batch_id)
        held = result.held if n.held or before.held else None
        state.advance(batch_id, AsofProgress(max_ts, n.held, held))
        return n

    def process(batch_df, batch_id: int) -> Batch | None:
        before = state.restore(batch_id)
        wm_before = before.watermark(lateness)
        s = _summary(batch_df, wm_before)
        if s["events"] == 0 and s["changes"] == 0:
            return None
        if s["changes"]:
            state.stage(batch_id, batch_df.where(_is("profiles")))
        max_ts = max((x for x in (before.max_ts, s["max_ts"]) if x is not None), default=None)
        wm = None if max_ts is None else max_ts - lateness
        if s["events"] or (before.held and wm != wm_before):
            n = publish(batch_id, decide(batch_df, s, before, wm), before, max_ts)
        else:
            n = CountryCounts([], 0, before.held, 0)
            state.advance(batch_id, AsofProgress(max_ts, before.held))
        run.totals["held"] = n.held
        return _batch(s, n, wm)

    return Wiring(source=_source(run.spark, settings), process=process)


def run_enrichment(spark, settings: Settings, *, once: bool = True, generation: int | None = None) -> dict:
    """Run the enrichment job into `generation` (default: the serving one, rebuilt first if Redis lost it, see
    `jobs.replay.serving_or_rebuild`). Returns totals of this run."""
    return run_job(spark, settings, JOB, _wire, once=once, generation=generation)
