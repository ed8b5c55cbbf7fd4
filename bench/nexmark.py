"""Benchmark of the Nexmark queries q3, q8, q13 and q20 (`timeline_demo/pipelines/nexmark.yml`): events per second
per core of each query's job, beside Flink's published per-core figures.

`run(events, settings=...)` writes `events` Nexmark events with the seeded generator (`timeline_demo.nexmark`,
Nexmark's 1:3:46 person:auction:bid mix, seed 42, its default 10,000 events/s of event time, each written once:
`person_table` and `auction_table` read the `persons` and `auctions` logs), q13's 10,000-row side table, and the
clock records that close every q8 window and let q13 emit every bid) and ingests them into a scratch lake (`mview ingest`'s
code, not timed). Then each query's job runs `--once` over them, in this JVM, as `mview run <job> --once` does
(`jobs.core.registry.job_spec(settings, job).run(spark, settings, once=True)`, with MVIEW_PIPELINE the Nexmark file):

- q3, local item suggestion: `q3`, the incremental join of the current `auction_table` and `person_table`, views
  `q3_auctions` (rows) and `q3_by_state` (counts), filtered to category 10 and the states OR, ID, CA;
- q8, monitor new users: `q8`, the interval join of `persons` and `auctions` in the same 10-s window, views
  `q8_new_sellers` and `q8_by_window`;
- q13, bounded side input join: `q13`, each bid with the side table's value (asof), log view `q13_bids`;
- q20, expand bid with auction: `q20`, the incremental join of the current `bid_table` and `auction_table`,
  category 10: views `q20_bids` (rows) and `q20_by_auction` (counts).

Reported per query, like `bench.clicks`: Nexmark events / (micro-batch seconds x cores), cores = Spark's task slots.
The events are all `events` of the generated stream, as Flink counts them (its source generates every event and
each query filters the kinds it reads); here the split into topics happened at ingest, untimed, and each job reads
only its topics' records (q3 and q8 about 8% of them, q13 and q20 92% and the side rows): those records per second
per core are reported too. Also the CPU seconds of this process and the Spark JVM, and of the Redis server the
views are written to, which shares the same cores.

Before the measured runs, the four jobs run once over a small lake of their own (`warmup_events`, not timed), so
the measured batches run in a warm JVM as a deployed job's do, whatever ran before in this JVM.

Flink's figures (nexmark/nexmark GUIDE_V1.md, Flink 1.13 on 8-core workers: q3 152,000, q8 146,000, q13 131,000,
q20 19,000 events/s per core) were measured on other hardware; ours are 2 cores that also run Redis's writes.
No goal is set: the ratio is shown.

`python -m bench.nexmark --events N` runs it alone (a scratch lake and a redis-server of its own, as `python -m bench`
gives it) and prints JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from bench.common import cpu_seconds

__all__ = ["run", "FLINK_PER_CORE", "QUERIES", "rows", "ingest_files", "warm_up", "run_job"]

QUERIES = ("q3", "q8", "q13", "q20")
# Flink's published Nexmark throughput per core (nexmark/nexmark GUIDE_V1.md, 8-core workers), events/s.
FLINK_PER_CORE = {"q3": 152_000, "q8": 146_000, "q13": 131_000, "q20": 19_000}
WHAT = {
    "q3": "incremental join auction_table x person_table, category 10 in OR/ID/CA",
    "q8": "interval join persons x auctions in the same 10-s window",
    "q13": "bids x side table (asof)",
    "q20": "incremental join bid_table x auction_table, category 10",
}
SEED = 42
_CAVEAT = "other hardware; Flink per core on 8-core workers, ours 2 cores incl. Redis writes"


def _redis_cpu(client) -> float:
    """CPU seconds (user + sys, main thread and children) the Redis server has used so far."""
    info = client.info("cpu")
    return float(info.get("used_cpu_user", 0.0)) + float(info.get("used_cpu_sys", 0.0))


def _ingest(settings, directory: Path, events: int) -> dict:
    """Write `events` Nexmark events (seed `SEED`) as JSON lines under `directory` and ingest every topic's file
    into the settings' lake. Returns the generator's counts and the records ingested per topic."""
    from timeline_demo.nexmark import write_nexmark

    made = write_nexmark(directory, events=events, seed=SEED, lateness_ms=settings.allowed_lateness_ms)
    accepted = ingest_files(settings, made["files"])
    shutil.rmtree(directory, ignore_errors=True)
    return {"counts": made["counts"], "records": accepted}


def ingest_files(settings, files: dict[str, list]) -> dict[str, int]:
    """Ingest each topic's files (`{topic: [path, ...]}`, as `write_nexmark` returns them) into the settings' lake
    (`mview ingest`'s code); the records accepted per topic."""
    from changelog.ingest import ingest

    topics = settings.pipeline().topics
    return {
        topic: ingest(None, settings.lake, topics[topic], paths, quiet=True).accepted
        for topic, paths in files.items()
    }


def _records(totals: dict) -> int:
    """Input records a job's run read: its events (both sides of a join) and an asof job's table changes."""
    return int(totals.get("events", 0)) + int(totals.get("changes", 0))


def warm_up(spark, settings, work: Path, events: int, jobs=QUERIES) -> float:
    """Run `jobs` (in their order; by default the four queries' jobs) over `events` events in a lake of their own,
    then forget their Redis keys. Seconds."""
    from jobs.core.registry import job_spec
    from views.redis_io import connect

    started = time.monotonic()
    warm = dataclasses.replace(settings, lake_dir=work / "lake-warmup")
    _ingest(warm, work / "files-warmup", events)
    for job in jobs:
        job_spec(warm, job).run(spark, warm, once=True)
    connect(settings.redis_url).flushdb()
    shutil.rmtree(warm.lake_dir, ignore_errors=True)
    return time.monotonic() - started


def run_job(spark, settings, client, job: str, events: int, cores: int) -> dict:
    """Run `job` once over the lake (`mview run JOB --once`, in this JVM); its figures, per core of `events`."""
    from jobs.core.registry import job_spec

    spec = job_spec(settings, job)
    cpu0, redis0, t0 = cpu_seconds(spark), _redis_cpu(client), time.monotonic()
    totals = spec.run(spark, settings, once=True)
    run_s = time.monotonic() - t0
    cpu_s, redis_s = cpu_seconds(spark) - cpu0, _redis_cpu(client) - redis0
    batch_s, records = float(totals["seconds"]), _records(totals)
    per_core = events / batch_s / cores if batch_s else 0.0
    return {
        "job": job,
        "views": list(spec.views),
        "topics": list(spec.topics),
        "batches": totals["batches"],
        "records_read": records,
        "batch_seconds": round(batch_s, 2),
        "run_seconds": round(run_s, 2),
        "cpu_seconds": round(cpu_s, 1),
        "redis_cpu_seconds": round(redis_s, 1),
        "events_per_s_per_core": round(per_core),
        "records_per_s_per_core": round(records / batch_s / cores) if batch_s else 0,
        "events_per_s_per_core_run": round(events / run_s / cores) if run_s else 0,
        "events_per_cpu_s": round(events / cpu_s) if cpu_s else 0,
        "totals": {k: v for k, v in totals.items() if isinstance(v, (int, float))},
    }


def _one(spark, settings, client, q: str, events: int, cores: int) -> dict:
    """Run job `q` once over the lake; its figures beside Flink's published one."""
    f = run_job(spark, settings, client, q, events, cores)
    totals = f.pop("totals")
    batch_s = float(totals["seconds"])
    per_core = events / batch_s / cores if batch_s else 0.0
    return {
        "job": q,
        "what": WHAT[q],
        **{k: v for k, v in f.items() if k != "job"},
        "flink_per_core": FLINK_PER_CORE[q],
        "ratio_to_flink": round(per_core / FLINK_PER_CORE[q], 3),
        "totals": totals,
    }


def rows(res: dict) -> list[dict]:
    """One bench-table row per query: its events/s per core beside Flink's, the caveat in the reference."""
    out = []
    n = res["events"]
    for q in QUERIES:
        f = res["queries"].get(q)
        if f is None:
            continue
        out.append(
            {
                "figure": f"Nexmark {q} events/s per core ({f['what']})",
                "workload": f"{n:,} Nexmark events (1:3:46, seed {SEED}); the job reads {f['records_read']:,} "
                f"records of its topics (split at ingest, not timed), {f['batches']} micro-batch(es)",
                "command": f"python -m bench --only nexmark (mview run {q} --once, MVIEW_PIPELINE=nexmark.yml)",
                "measured": f"{f['events_per_s_per_core']:,}/s/core ({f['batch_seconds']}s of batches, "
                f"{res['cores']} cores; {f['records_per_s_per_core']:,} records read/s/core; "
                f"{f['cpu_seconds']:g} CPU s + Redis {f['redis_cpu_seconds']:g} CPU s)",
                "reference": f"Flink Nexmark {q} {f['flink_per_core']:,}/s/core ({_CAVEAT})",
                "ratio": f"{f['ratio_to_flink']:.3f}",
                "goal": "(none set)",
                "met": "n/a",
            }
        )
    return out


def run(events: int = 2_500_000, *, settings, warmup_events: int = 10_000) -> dict:
    """Measure q3, q8, q13 and q20 over `events` Nexmark events (see the module docstring). The settings' lake gets
    a directory of its own (removed afterwards); their Redis database is flushed before and after."""
    from jobs.core.spark import get_spark
    from timeline_demo.nexmark import PIPELINE
    from views.redis_io import connect

    work = settings.lake_dir / "bench_nexmark"
    shutil.rmtree(work, ignore_errors=True)
    settings = dataclasses.replace(
        settings, lake_dir=work / "lake", pipeline_file=PIPELINE, metrics_port=None
    )
    spark = get_spark(settings, "mview-bench-nexmark")
    cores = int(spark.sparkContext.defaultParallelism) or os.cpu_count() or 1
    client = connect(settings.redis_url)
    client.flushdb()
    load_before = os.getloadavg()
    try:
        warm_s = warm_up(spark, settings, work, warmup_events) if warmup_events else 0.0
        t0 = time.monotonic()
        ingested = _ingest(settings, work / "files", events)
        ingest_s = time.monotonic() - t0
        queries = {q: _one(spark, settings, client, q, events, cores) for q in QUERIES}
        redis_mb = client.info("memory")["used_memory"] / 1e6
    finally:
        client.flushdb()
        shutil.rmtree(work, ignore_errors=True)
    rec = ingested["records"]
    out = {
        "events": events,
        "seed": SEED,
        "cores": cores,
        "records_ingested": rec,
        "generated": ingested["counts"],
        "warmup_events": warmup_events,
        "warmup_seconds": round(warm_s, 1),
        "generate_and_ingest_seconds": round(ingest_s, 1),
        "queries": queries,
        "checks": {
            "q8_windows_closed_all_persons": queries["q8"]["totals"].get("closed") == rec.get("persons"),
            "q13_every_bid_emitted": queries["q13"]["totals"].get("emitted") == rec.get("bids"),
            "q20_read_every_bid": queries["q20"]["records_read"] >= rec.get("bids", 0),
        },
        "redis_used_mb": round(redis_mb, 1),
        "load_average_before": [round(x, 1) for x in load_before],
        "load_average_after": [round(x, 1) for x in os.getloadavg()],
        "flink_reference": f"nexmark/nexmark GUIDE_V1.md, events/s per core ({_CAVEAT})",
    }
    out["rows"] = rows(out)
    return out


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from bench.common import scratch_settings, start_redis

    p = argparse.ArgumentParser(prog="python -m bench.nexmark", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=2_500_000)
    p.add_argument("--warmup-events", type=int, default=10_000)
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mview-bench-nexmark-"))
    proc, port = start_redis(tmp)
    try:
        settings = scratch_settings(tmp / "lake", port)
        res = run(args.events, settings=settings, warmup_events=args.warmup_events)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
