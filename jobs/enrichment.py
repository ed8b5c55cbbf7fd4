"""The `enrichment` job: activity x versioned profiles -> `enriched_activity` (Delta log) and
`activity_by_country` (Redis). Semantics in `joins.asof`; views in `views.enrichment`.

Sources: the `activity` topic and the `profiles` topic (the raw change log, every change in arrival order), in
one streaming query. The versioned copy is built from the raw change log, not from the `profiles` table's
change feed: the table applies changes with `SEQUENCE BY ts`, so a change that arrives after a newer one never
appears in its feed, and whether a version exists would depend on arrival order (docs/enrichment.md).

State (Delta tables under `LAKE_DIR/state/enrichment/g<g>/`):
- `versions`: the versioned local copy (SCD type 2), one row per change received (`joins.asof.VERSION_SCHEMA`;
  a change delivered twice is stored twice and resolved on read, so the append needs no lookup);
- `held`: events waiting for the profiles watermark (`joins.asof.EVENT_COLUMNS`).

Per micro-batch, in this order (so that a crash anywhere replays the batch with the same effect):
1. the batch's changes are appended to `versions` (idempotent: Delta `txnAppId`/`txnVersion` = batch id);
2. watermark = max change `ts` seen minus `ALLOWED_LATENESS`;
3. candidates = held events + the batch's events not already in `enriched_activity` (dedup by `event_id`;
   only events the watermark had reached before the batch can be there, and only those are looked up), joined
   as of their `ts` in one sorted pass (`joins.asof.asof_join`): those the watermark has reached are emitted;
4. per-country counts go to Redis (fenced by batch id), the emitted rows are appended to `enriched_activity`
   (idempotent by batch id), and `held` is replaced by the events still waiting (idempotent by batch id),
   only when something was or is held.
Cost per batch: 5-8 Spark jobs (one scan for the batch's counts, the versions append, the as-of pass, the
output append; Delta's own), at most 3 Delta commits (versions if changes arrived, output if events were
emitted, held if events were or are held); no Python on the executors.
Activity events that arrive after the watermark passed their `ts` are still enriched correctly (every change
they could use is known) and counted as `late_events`; profile changes older than the watermark on arrival are
kept as versions and counted as `late_changes` (events already emitted do not see them).
A record is a duplicate of an emitted one if it has the same `event_id` and its `ts` lies in the range of `ts`
of this batch's events that the watermark had already reached (a record delivered again has the same `ts`).
"""

from __future__ import annotations

import json
import time

from pyspark.sql import functions as F

from changelog.topics import ensure_delta_table, read_stream
from jobs.generations import record_batch
from jobs.replay import serving_or_rebuild
from jobs.runtime import (
    checkpoint_dir,
    log,
    log_sources,
    read_status,
    run_stream,
    state_dir,
    write_status,
)
from jobs.settings import Settings
from joins.asof import (
    ENRICHED_COLUMNS,
    EVENT_COLUMNS,
    VERSION_SCHEMA,
    AsofResult,
    asof_join,
    dedupe_events,
    version_rows,
)
from views.enrichment import UNKNOWN_COUNTRY, CountrySink, enriched_path
from views.redis_io import connect

__all__ = ["run_enrichment", "TOPICS", "JOB"]

JOB = "enrichment"
TOPICS = ("activity", "profiles")
_HELD_SCHEMA = "event_id string, user_id string, action string, ts bigint, profile_version string"
_OUT_SCHEMA = (
    "event_id string, user_id string, action string, ts bigint, profile_version string, name string, "
    "country string"
)
_SOURCE_COLUMNS = ["event_id", "user_id", "action", "profile_version", "op", "name", "country"]


def _source(spark, settings: Settings, *, max_files_per_trigger: int | None = None):
    def norm(df, topic):
        cols = set(df.columns)
        return df.select(
            F.lit(topic).alias("topic"),
            *[F.col(c) if c in cols else F.lit(None).cast("string").alias(c) for c in _SOURCE_COLUMNS],
            F.col("ts"),
        )

    activity = read_stream(spark, settings.lake_dir, "activity", max_files_per_trigger=max_files_per_trigger)
    profiles = read_stream(spark, settings.lake_dir, "profiles", max_files_per_trigger=max_files_per_trigger)
    return norm(activity, "activity").unionByName(norm(profiles, "profiles"))


# Up to this many candidates, only their users' versions are sorted (broadcast semi-join), not the whole copy.
_FEW_EVENTS = 20_000


def _read_mark(sdir) -> dict:
    """The job's progress mark: newest change ts in the versioned copy and the number of held events."""
    try:
        return json.loads((sdir / "mark.json").read_text())
    except FileNotFoundError:
        return {}


def _write_mark(sdir, mark: dict) -> None:
    tmp = sdir / "mark.tmp"
    tmp.write_text(json.dumps(mark))
    tmp.replace(sdir / "mark.json")


def run_enrichment(spark, settings: Settings, *, once: bool = True, generation: int | None = None) -> dict:
    """Run the enrichment job into `generation` (default: the serving one, rebuilt first if Redis lost it, see
    `jobs.replay.serving_or_rebuild`). Returns totals of this run."""
    client = connect(settings.redis_url)
    gen = generation if generation is not None else serving_or_rebuild(spark, settings, JOB)
    lateness = settings.allowed_lateness_ms
    sdir = state_dir(settings, JOB, gen)
    versions_path = ensure_delta_table(spark, sdir / "versions", VERSION_SCHEMA)
    held_path = ensure_delta_table(spark, sdir / "held", _HELD_SCHEMA)
    out_path = ensure_delta_table(spark, enriched_path(settings.lake_dir, gen), _OUT_SCHEMA)
    sink = CountrySink(settings.redis_url, gen)
    app_id = f"mview-{JOB}-g{gen}"
    totals = {"batches": 0, "events": 0, "changes": 0, "emitted": 0, "held": 0, "seconds": 0.0}

    def process(batch_df, batch_id: int) -> None:
        started = time.monotonic()
        mark = _read_mark(sdir)
        max_before, held_before_n = mark.get("max_ts"), mark.get("held", 0)
        wm_before = max_before - lateness if max_before is not None else None
        # The batch is not cached: `topic` is a literal of each side of the union, so every filter on it below
        # reads only that topic's files (and only the columns used).
        is_act, is_prof = F.col("topic") == "activity", F.col("topic") == "profiles"
        late = F.col("ts") < F.lit(wm_before).cast("bigint")
        seen = is_act & (F.col("ts") <= F.lit(wm_before).cast("bigint"))
        s = batch_df.agg(
            F.count(F.when(is_act, 1)).alias("events"),
            F.count(F.when(is_prof, 1)).alias("changes"),
            F.max(F.when(is_prof, F.col("ts"))).alias("max_ts"),
            F.count(F.when(is_act & late, 1)).alias("late_events"),
            F.count(F.when(is_prof & late, 1)).alias("late_changes"),
            F.min(F.when(seen, F.col("ts"))).alias("seen_lo"),
            F.max(F.when(seen, F.col("ts"))).alias("seen_hi"),
        ).first()
        if s["events"] == 0 and s["changes"] == 0:
            record_batch(client, JOB, gen, batch_id)
            return
        # 1. The batch's changes into the local copy, as they are (duplicates are resolved on read).
        if s["changes"]:
            (
                version_rows(batch_df.where(is_prof))
                .write.format("delta")
                .mode("append")
                .option("txnAppId", f"{app_id}-versions")
                .option("txnVersion", batch_id)
                .save(versions_path)
            )
        # 2. The profiles watermark after this batch.
        known = [x for x in (max_before, s["max_ts"]) if x is not None]
        max_after = max(known) if known else None
        wm = max_after - lateness if max_after is not None else None
        n_emitted = hs = unknown = 0
        if s["events"] or (held_before_n and wm != wm_before):
            # 3. Candidates: held + the batch's events not emitted yet. Only an event whose ts the watermark had
            #    already reached before this batch can be in the output log (a record delivered again has the
            #    same ts), so only those are looked up there, in the ts range the output's file statistics skip to.
            fresh = batch_df.where(is_act).select(*EVENT_COLUMNS)
            if s["seen_lo"] is not None:
                emitted_before = (
                    spark.read.format("delta")
                    .load(out_path)
                    .where(F.col("ts").between(s["seen_lo"], s["seen_hi"]))
                    .select("event_id")
                )
                fresh = fresh.join(emitted_before, "event_id", "left_anti")
            if held_before_n:
                fresh = spark.read.format("delta").load(held_path).unionByName(fresh)
            candidates = dedupe_events(fresh)
            versions = spark.read.format("delta").load(versions_path)
            few = s["events"] + held_before_n <= _FEW_EVENTS
            # Materialized once (lineage cut): the stats, the output and the held set are read from it, never
            # recomputed (a persisted plan was partly recomputed by the Delta writes).
            decided = asof_join(
                candidates, versions, watermark_ms=wm, few_users=few
            ).decided.localCheckpoint()
            result = AsofResult(decided)
            country = F.coalesce("country", F.lit(UNKNOWN_COUNTRY)).alias("country")
            stats = (
                decided.groupBy("emit", country)
                .agg(F.count("*").alias("n"), F.count(F.when(F.col("unknown_version"), 1)).alias("u"))
                .collect()
            )
            counts = [(r["country"], r["n"]) for r in stats if r["emit"]]
            n_emitted = sum(n for _, n in counts)
            hs = sum(r["n"] for r in stats if not r["emit"])
            unknown = sum(r["u"] for r in stats if r["emit"])
            # 4. Publish: Redis counters (fenced by batch id; a handful of keys, already on the driver), then the
            #    output log and the held set (both idempotent by batch id).
            if counts:
                sink.apply(counts, batch_id)
                (
                    result.emitted.select(*ENRICHED_COLUMNS)
                    .write.format("delta")
                    .mode("append")
                    .option("txnAppId", f"{app_id}-out")
                    .option("txnVersion", batch_id)
                    .save(out_path)
                )
            if hs or held_before_n:
                (
                    result.held.write.format("delta")
                    .mode("overwrite")
                    .option("txnAppId", f"{app_id}-held")
                    .option("txnVersion", batch_id)
                    .save(held_path)
                )
            del decided, result  # its blocks are freed by Spark's ContextCleaner once unreferenced
        else:
            hs = held_before_n
        _write_mark(sdir, {"max_ts": max_after, "held": hs})
        took = time.monotonic() - started
        totals["batches"] += 1
        totals["events"] += s["events"]
        totals["changes"] += s["changes"]
        totals["emitted"] += n_emitted
        totals["held"] = hs
        totals["seconds"] += took
        now = int(time.time() * 1000)
        record_batch(client, JOB, gen, batch_id, last_batch_ms=now, watermark=wm)
        prev = read_status(settings, JOB)
        same_gen = prev.get("generation") == gen

        def total(key: str, add: int) -> int:
            return (prev.get(key, 0) if same_gen else 0) + add

        write_status(
            settings,
            JOB,
            generation=gen,
            last_batch_id=batch_id,
            last_batch_ms=now,
            last_batch_seconds=round(took, 3),
            last_batch_events=s["events"],
            last_batch_changes=s["changes"],
            watermark=wm,
            held=hs,
            emitted=total("emitted", n_emitted),
            unknown_versions=total("unknown_versions", unknown),
            late_events=total("late_events", s["late_events"]),
            late_changes=total("late_changes", s["late_changes"]),
        )
        log(
            f"enrichment g{gen} batch {batch_id}: {s['events']:,} events, {s['changes']:,} changes -> "
            f"{n_emitted:,} emitted, {hs:,} held, watermark {wm} in {took:.2f}s"
        )

    log_sources(settings, JOB, gen, TOPICS)
    run_stream(
        _source(spark, settings),
        process,
        checkpoint=checkpoint_dir(settings, JOB, gen),
        once=once,
        settings=settings,
        name=f"enrichment_g{gen}",
    )
    return totals
