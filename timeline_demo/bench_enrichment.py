"""Benchmark of the `enrichment` job: throughput (events/s per core) and profile-change-to-first-use latency.

`run(events, profiles, settings=...)` writes `profiles` users (each with 1-3 changes, some deletes) and `events`
activity events (10% pinned to a version) straight into the topics' Delta logs with Spark (ingest is not what
is measured), runs `enrichment --once` over them in one micro-batch and reports events per second per core
(core = one Spark task slot), set beside Flink's published Nexmark q20 figure (about 19,000 events/s per core).
Then it deploys the job as a continuous query (TRIGGER_INTERVAL), appends one profile change together with a
change that moves the watermark past it and an event that uses it, and measures the wall time from the append
to the enriched event's commit in the output log.

`python -m timeline_demo.bench_enrichment --events N [--profiles M]` runs it alone and prints JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

from changelog.topics import ensure_topic
from jobs.settings import Settings

__all__ = ["run", "FLINK_Q20_EVENTS_PER_CORE"]

FLINK_Q20_EVENTS_PER_CORE = 19_000
T0 = 1_767_225_600_000
SPAN_MS = 24 * 3_600_000


def _write_topics(spark, lake: Path, events: int, profiles: int) -> None:
    from pyspark.sql import functions as F

    ensure_topic(spark, lake, "profiles")
    ensure_topic(spark, lake, "activity")
    users = spark.range(profiles).select(
        F.concat(F.lit("u"), F.col("id").cast("string")).alias("user_id"),
        (F.lit(T0) + (F.abs(F.hash("id")) % (SPAN_MS // 4))).alias("t1"),
        (F.abs(F.hash(F.col("id") + 7)) % 3).alias("k"),
    )
    countries = F.array(*[F.lit(c) for c in ("DE", "FR", "US", "JP", "BR", "IN", "NG")])

    def change(n: int, op):
        ts = F.col("t1") + F.lit(n * SPAN_MS // 3)
        return users.where(F.col("k") >= n).select(
            op.alias("op"),
            "user_id",
            F.concat("user_id", F.lit(f"-v{n}")).alias("name"),
            F.element_at(countries, (F.abs(F.hash("user_id", F.lit(n))) % 7 + 1).cast("int")).alias(
                "country"
            ),
            ts.alias("ts"),
        )

    upsert = F.lit("upsert")
    delete = F.when(F.abs(F.hash("user_id")) % 10 == 0, F.lit("delete")).otherwise(F.lit("upsert"))
    changes = change(0, upsert).unionByName(change(1, delete)).unionByName(change(2, upsert))
    clock = spark.createDataFrame(
        [("upsert", "~clock", "clock", "ZZ", T0 + 2 * SPAN_MS)],
        "op string, user_id string, name string, country string, ts bigint",
    )
    changes.unionByName(clock).repartition(2).write.format("delta").mode("append").save(
        str(lake / "topics" / "profiles")
    )
    uid = (F.abs(F.hash(F.col("id"), F.lit(1))) % profiles).cast("bigint")
    user = F.concat(F.lit("u"), uid.cast("string"))
    ts = F.lit(T0) + F.abs(F.hash(F.col("id"), F.lit(2))) % SPAN_MS
    pinned = F.when(
        F.col("id") % 10 == 0,
        F.concat(user, F.lit("@"), (F.lit(T0) + F.abs(F.hash(uid)) % (SPAN_MS // 4)).cast("string")),
    )
    activity = spark.range(events).select(
        F.format_string("e%09d", F.col("id")).alias("event_id"),
        user.alias("user_id"),
        F.element_at(
            F.array(F.lit("view"), F.lit("click"), F.lit("buy")), (F.col("id") % 3 + 1).cast("int")
        ).alias("action"),
        ts.alias("ts"),
        pinned.alias("profile_version"),
    )
    activity.repartition(2).write.format("delta").mode("append").save(str(lake / "topics" / "activity"))


def _latency(spark, settings: Settings, lake: Path) -> float:
    """Seconds from the append of a profile change to the commit of the first enriched event that uses it."""
    from jobs.enrichment import run_enrichment
    from views.enrichment import enriched_path

    out_log = enriched_path(lake, 1) / "_delta_log"
    t = T0 + 3 * SPAN_MS
    lateness = settings.allowed_lateness_ms
    runner = threading.Thread(target=lambda: run_enrichment(spark, settings, once=False), daemon=True)
    runner.start()
    time.sleep(10)  # the query is up and idle
    commits = {p.name for p in out_log.glob("*.json")}
    prof = spark.createDataFrame(
        [("upsert", "u1", "changed", "ZZ", t), ("upsert", "~clock", "clock", "ZZ", t + lateness)],
        "op string, user_id string, name string, country string, ts bigint",
    )
    act = spark.createDataFrame(
        [("lat-1", "u1", "view", t, None)],
        "event_id string, user_id string, action string, ts bigint, profile_version string",
    )
    act.write.format("delta").mode("append").save(str(lake / "topics" / "activity"))
    prof.write.format("delta").mode("append").save(str(lake / "topics" / "profiles"))
    appended = time.time()
    latency = float("nan")
    while time.time() - appended < 120:
        new = [p for p in out_log.glob("*.json") if p.name not in commits]
        if new:
            latency = max(p.stat().st_mtime for p in new) - appended
            break
        time.sleep(0.05)
    for q in spark.streams.active:
        q.stop()
    runner.join(60)
    row = spark.read.format("delta").load(str(enriched_path(lake, 1))).where("event_id = 'lat-1'").first()
    assert row is not None and row["profile_version"] == f"u1@{t}", row
    return latency


def run(events: int = 1_000_000, profiles: int = 100_000, *, settings: Settings) -> dict:
    """Measure the enrichment job; returns a dict of figures (see the module docstring)."""
    from jobs.enrichment import run_enrichment
    from jobs.spark import get_spark
    from views.redis_io import connect

    spark = get_spark(settings, "mview-bench-enrichment")
    work = Path(
        tempfile.mkdtemp(
            prefix="bench-enrichment-",
            dir=settings.lake_dir.parent if settings.lake_dir.parent.exists() else None,
        )
    )
    lake = work / "lake"
    env = {
        "LAKE_DIR": str(lake),
        "REDIS_URL": settings.redis_url,
        "SPARK_MASTER": settings.spark_master,
        "SHUFFLE_PARTITIONS": str(settings.shuffle_partitions),
        "ALLOWED_LATENESS": settings.allowed_lateness,
        "TRIGGER_INTERVAL": "200 ms",
    }
    bench_settings = Settings.from_env(env)
    client = connect(settings.redis_url)
    for k in client.scan_iter(match="mv:*enrichment*"):
        client.delete(k)
    for k in client.scan_iter(match="mv:activity_by_country:*"):
        client.delete(k)
    client.delete("mv:gen:enrichment")
    try:
        t = time.monotonic()
        _write_topics(spark, lake, events, profiles)
        write_s = time.monotonic() - t
        t = time.monotonic()
        totals = run_enrichment(spark, bench_settings, once=True)
        run_s = time.monotonic() - t
        cores = spark.sparkContext.defaultParallelism
        emitted = spark.read.format("delta").load(str(lake / "outputs" / "enriched_activity" / "g1")).count()
        latency = _latency(spark, bench_settings, lake)
        per_core = events / run_s / cores
        return {
            "bench": "enrichment",
            "events": events,
            "profiles": profiles,
            "emitted": emitted,
            "cores": cores,
            "write_topics_seconds": round(write_s, 2),
            "run_seconds": round(run_s, 2),
            "batch_seconds": round(totals["seconds"], 2),
            "events_per_second": round(events / run_s),
            "events_per_second_per_core": round(per_core),
            "flink_nexmark_q20_per_core": FLINK_Q20_EVENTS_PER_CORE,
            "ratio_to_flink": round(per_core / FLINK_Q20_EVENTS_PER_CORE, 3),
            "change_to_first_use_seconds": round(latency, 3),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--profiles", type=int, default=100_000)
    args = p.parse_args(argv)
    print(json.dumps(run(args.events, args.profiles, settings=Settings.from_env())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
