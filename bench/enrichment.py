"""Benchmark of the `enrichment` job: throughput (events/s per core) and profile-change-to-first-use latency.

`run(events, profiles, settings=...)` writes `profiles` users (each with 1-3 changes, some deletes) and `events`
activity events (10% pinned to a version) straight into the topics' Delta logs with Spark (ingest is not what
is measured), runs `enrichment --once` over them in one micro-batch and reports events per second per core
(core = one Spark task slot), set beside Flink's published Nexmark q20 figure (about 19,000 events/s per core).
Then it deploys the job as a continuous query (TRIGGER_INTERVAL), appends one profile change together with a
change that moves the watermark past it and an event that uses it, and measures the wall time from the append
to the enriched event's commit in the output log.

`python -m bench.enrichment --events N [--profiles M]` runs it alone and prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from changelog.topics import ensure_topic
from jobs.core.settings import Settings

__all__ = ["run", "FLINK_Q20_EVENTS_PER_CORE"]

FLINK_Q20_EVENTS_PER_CORE = 19_000
T0 = 1_767_225_600_000
SPAN_MS = 24 * 3_600_000


def run_enrichment(spark, settings, **kwargs) -> dict:
    """The built-in pipeline's `enrichment` job, as `mview run enrichment` runs it (its kind's runner)."""
    from jobs.core.registry import job_spec

    return job_spec(settings, "enrichment").run(spark, settings, **kwargs)


def _write_topics(spark, settings: Settings, events: int, profiles: int) -> None:
    from pyspark.sql import functions as F

    lake = settings.lake_dir
    ensure_topic(spark, settings.lake, settings.topic("profiles"))
    ensure_topic(spark, settings.lake, settings.topic("activity"))
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
    changes.unionByName(clock).coalesce(2).write.format("delta").mode("append").save(
        str(lake / "topics" / "profiles")
    )
    uid = (F.abs(F.hash(F.col("id"), F.lit(1))) % profiles).cast("bigint")
    user = F.concat(F.lit("u"), uid.cast("string"))
    ts = F.lit(T0) + F.abs(F.hash(F.col("id"), F.lit(2))) % SPAN_MS
    pinned = F.when(
        F.col("id") % 10 == 0,
        F.concat(user, F.lit("@"), (F.lit(T0) + F.abs(F.hash(uid)) % (SPAN_MS // 4)).cast("string")),
    )
    activity = spark.range(0, events, 1, 2).select(
        F.format_string("e%09d", F.col("id")).alias("event_id"),
        user.alias("user_id"),
        F.element_at(
            F.array(F.lit("view"), F.lit("click"), F.lit("buy")), (F.col("id") % 3 + 1).cast("int")
        ).alias("action"),
        ts.alias("ts"),
        pinned.alias("profile_version"),
    )
    activity.write.format("delta").mode("append").save(str(lake / "topics" / "activity"))


def _jvm_cpu_seconds(spark) -> float | None:
    """User + system CPU seconds of the Spark driver JVM (local mode: the executors too), from /proc."""
    try:
        from jobs.core.runtime import process_cpu
        from joins.sparkapi import jvm

        return process_cpu(jvm(spark).java.lang.ProcessHandle.current().pid())[0]
    except (OSError, AttributeError, ValueError):
        return None


def _latency_rows(spark, lake: Path, t: int, lateness: int, tag: str):
    prof = spark.createDataFrame(
        [("upsert", "u1", f"changed-{tag}", "ZZ", t), ("upsert", "~clock", "clock", "ZZ", t + lateness)],
        "op string, user_id string, name string, country string, ts bigint",
    )
    act = spark.createDataFrame(
        [(f"lat-{tag}", "u1", "view", t, None)],
        "event_id string, user_id string, action string, ts bigint, profile_version string",
    )
    act.write.format("delta").mode("append").save(str(lake / "topics" / "activity"))
    prof.write.format("delta").mode("append").save(str(lake / "topics" / "profiles"))
    return time.time()


def _wait_commit(
    out_log: Path, before: set, since: float, timeout: float, alive=lambda: True
) -> float | None:
    while time.time() - since < timeout and alive():
        new = [p for p in out_log.glob("*.json") if p.name not in before]
        if new:
            return max(p.stat().st_mtime for p in new) - since
        time.sleep(0.02)
    return None


def _latency(spark, settings: Settings, lake: Path, *, timeout: float = 60.0) -> dict:
    """Seconds from the append of a profile change (with a change that moves the watermark past it and an
    event that uses it) to the commit of the enriched event in the output log.

    `continuous`: the job deployed as a continuous query (TRIGGER_INTERVAL), measured `samples` times;
    `once`: a `run --once` started right after the append (query start-up included), for comparison and in
    case the continuous query does not pick the commit up within `timeout`."""

    from views.log import log_path

    out_log = Path(log_path(settings.lake, "enriched_activity", 1)) / "_delta_log"
    lateness = settings.allowed_lateness_ms
    res: dict = {"continuous": [], "once": None}
    runner = threading.Thread(target=lambda: run_enrichment(spark, settings, once=False), daemon=True)
    runner.start()
    deadline = time.time() + 60
    while not spark.streams.active and time.time() < deadline:  # the query is up
        time.sleep(0.1)
    time.sleep(2)  # and idle
    for i in range(3):
        before = {p.name for p in out_log.glob("*.json")}
        appended = _latency_rows(spark, lake, T0 + (3 + i) * SPAN_MS, lateness, f"c{i}")
        took = _wait_commit(out_log, before, appended, timeout, runner.is_alive)
        if took is None:
            res["continuous_error"] = "no commit" if runner.is_alive() else "the continuous query ended"
            break
        res["continuous"].append(round(took, 3))
    for q in spark.streams.active:
        q.stop()
    runner.join(60)
    before = {p.name for p in out_log.glob("*.json")}
    t = T0 + 10 * SPAN_MS
    appended = _latency_rows(spark, lake, t, lateness, "once")
    run_enrichment(spark, settings, once=True)
    new = [p for p in out_log.glob("*.json") if p.name not in before]
    res["once"] = max(p.stat().st_mtime for p in new) - appended if new else None
    row = (
        spark.read.format("delta")
        .load(str(log_path(settings.lake, "enriched_activity", 1)))
        .where("event_id = 'lat-once'")
        .first()
    )
    assert row is not None and row["profile_version"] == f"u1@{t}", row
    return res


def _clear_views(client) -> None:
    """Delete the enrichment job's keys (its views and its generation pointer) from Redis."""
    for k in client.scan_iter(match="mv:*enrichment*"):
        client.delete(k)
    for k in client.scan_iter(match="mv:activity_by_country:*"):
        client.delete(k)
    client.delete("mv:gen:enrichment")


def _rows(events: int, profiles: int, per_core: float, batch_s: float, cpu_s, latency: dict) -> list[dict]:
    """The two rows of the bench table: events/s per core against Nexmark q20, and change -> first use."""
    cont = latency["continuous"]
    first_use = cont[0] if cont else None
    measured = f"{round(per_core):,} events/s/core ({events:,} events in {batch_s:.1f}s batch time)"
    if cpu_s:
        measured += f"; {round(events / cpu_s):,} events per JVM CPU-second"
    lat = (
        f"{first_use:.2f}s (continuous query, samples {cont})"
        if first_use is not None
        else f"not measured with the continuous query ({latency.get('continuous_error')})"
    )
    if latency["once"]:
        lat += f"; {latency['once']:.2f}s with `run --once` started after the append"
    command = f"python -m bench.enrichment --events {events} --profiles {profiles}"
    return [
        {
            "figure": "enrichment events/s per core",
            "workload": f"{events:,} activity events x {profiles:,} profiles (1 micro-batch)",
            "command": command,
            "measured": measured,
            "reference": f"Flink Nexmark q20 ~{FLINK_Q20_EVENTS_PER_CORE:,}/s/core",
            "ratio": f"{per_core / FLINK_Q20_EVENTS_PER_CORE:.3f}",
            "goal": ">= 0.25 (4,750/s/core); real goal >= 1",
            "met": "met" if per_core >= FLINK_Q20_EVENTS_PER_CORE / 4 else "**not met**",
        },
        {
            "figure": "enrichment profile change -> first use",
            "workload": "1 change + 1 event after the load",
            "command": command,
            "measured": lat,
            "reference": "",
            "ratio": "",
            "goal": "(none set)",
            "met": "n/a",
        },
    ]


def _bench_settings(settings: Settings, lake: Path) -> Settings:
    """The settings of the measured job: `settings`' Redis, Spark master, shuffle partitions and allowed
    lateness, on the lake `lake`, with a trigger interval of 200 ms."""
    env = {
        "LAKE_DIR": str(lake),
        "REDIS_URL": settings.redis_url,
        "SPARK_MASTER": settings.spark_master,
        "SHUFFLE_PARTITIONS": str(settings.shuffle_partitions),
        "ALLOWED_LATENESS": settings.allowed_lateness,
        "TRIGGER_INTERVAL": "200 ms",
    }
    return Settings.from_env(env)


def run(events: int = 1_000_000, profiles: int = 100_000, *, settings: Settings) -> dict:
    """Measure the enrichment job; returns a dict of figures (see the module docstring)."""

    from jobs.core.spark import get_spark
    from views.redis_io import connect

    spark = get_spark(settings, "mview-bench-enrichment")
    work = Path(
        tempfile.mkdtemp(
            prefix="bench-enrichment-",
            dir=settings.lake_dir.parent if settings.lake_dir.parent.exists() else None,
        )
    )
    lake = work / "lake"
    bench_settings = _bench_settings(settings, lake)
    _clear_views(connect(settings.redis_url))
    try:
        t = time.monotonic()
        _write_topics(spark, bench_settings, events, profiles)
        write_s = time.monotonic() - t
        cpu0, t = _jvm_cpu_seconds(spark), time.monotonic()
        totals = run_enrichment(spark, bench_settings, once=True)
        run_s, cpu1 = time.monotonic() - t, _jvm_cpu_seconds(spark)
        cores = spark.sparkContext.defaultParallelism
        emitted = spark.read.format("delta").load(str(lake / "outputs" / "enriched_activity" / "g1")).count()
        latency = _latency(spark, bench_settings, lake)
        batch_s = totals["seconds"]
        per_core = events / batch_s / cores
        cpu_s = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
        cont = latency["continuous"]
        first_use = cont[0] if cont else None
        out = {
            "bench": "enrichment",
            "events": events,
            "profiles": profiles,
            "emitted": emitted,
            "cores": cores,
            "batches": totals["batches"],
            "write_topics_seconds": round(write_s, 2),
            "run_seconds": round(run_s, 2),
            "batch_seconds": round(batch_s, 2),
            "batch_jvm_cpu_seconds": round(cpu_s, 2) if cpu_s is not None else None,
            "events_per_s": round(events / batch_s),
            "events_per_second_per_core": round(per_core),
            "events_per_jvm_cpu_second": round(events / cpu_s) if cpu_s else None,
            "flink_nexmark_q20_per_core": FLINK_Q20_EVENTS_PER_CORE,
            "ratio_to_flink": round(per_core / FLINK_Q20_EVENTS_PER_CORE, 3),
            "change_to_first_use_seconds": first_use,
            "change_to_first_use_continuous_samples": cont,
            "change_to_first_use_once_seconds": round(latency["once"], 3) if latency["once"] else None,
            "change_to_first_use_continuous_error": latency.get("continuous_error"),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        out["rows"] = _rows(events, profiles, per_core, batch_s, cpu_s, latency)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.enrichment", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--profiles", type=int, default=100_000)
    args = p.parse_args(argv)
    print(json.dumps(run(args.events, args.profiles, settings=Settings.from_env())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
