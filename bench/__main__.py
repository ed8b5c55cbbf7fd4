"""`make bench` (`python -m bench`): every benchmark, each against a reference measured in the same run.

The workloads are generated. Writes `bench/results.json`, the plot `docs/bench.png`, the table of docs/bench.md
between `<!-- bench:start -->` and `<!-- bench:end -->` and the README's five-line summary between
`<!-- bench-summary:start -->` and `<!-- bench-summary:end -->` (each printed if its markers are missing).

Parts, each with a time budget (the whole run must stay under 15 minutes on a 2-core machine):
- redis: `redis-benchmark -t zadd -P 16 -n 1000000 -q` on the bench's own redis-server (the reference).
- throughput: the timeline job (`run_timeline(once=True)`, i.e. `mview run timeline --once`) over ~50k events
  of a celebrity-heavy graph that make ~1M timeline entries; entries/s of its micro-batch time vs ZADD/s.
- replay: rebuilding the timeline view from the logs into a new generation vs a batch Spark evaluation of the
  same SQL (`timeline_demo.verify.TIMELINE_SQL`) over the same logs.
- incrementality: per-batch time of a fixed-size batch while the state doubles, and the same SQL recomputed
  from scratch at each size.
- freshness: with the job deployed (continuous) under a steady load of tweets, the time from a tweet's append
  (its Delta commit) to its presence in every current follower's timeline in Redis; p50 and p99.
- hdfs: the throughput and freshness parts again with the lake on a real HDFS of the bench's own (`bench.hdfs`),
  beside the local lake's figures of the same run.
- baseline: the redis, throughput and freshness parts of an older commit (`--baseline`, `bench.baseline`), run from
  a git worktree in the same run, beside this code's: what the changes since cost on a local lake.
- metrics: the cost of the jobs' Prometheus metrics, throughput and freshness with them on and off (`bench.metrics`).
- clicks, enrichment: `bench.clicks.run` / `bench.enrichment.run`.
- cdc: change data capture from the bench's own PostgreSQL, `bench.cdc.run`: changes/s of `mview run cdc --once`
  for a bulk UPDATE of 100k rows, and COMMIT of a profile change -> first enriched event using it (deployed jobs).
- kafka: the bench's own Kafka broker, `bench.kafka`: records/s per core of `mview run kafka --once` copying ~300k
  messages beside the producer's messages/s, and freshness through Kafka (produce -> every follower's timeline,
  `kafka` and `timeline` deployed) beside the Delta path's.
- nexmark: `bench.nexmark`: Nexmark q3, q8, q13 and q20 (`timeline_demo/pipelines/nexmark.yml`), events/s per core
  of each job's `run --once` over 2.5M seeded Nexmark events (10M over the four queries), beside Flink's figures.
- pipelines: `bench.pipelines`: two jobs of the shop pipeline (`timeline_demo/pipelines/shop.yml`), the join
  `customer_orders` and the select `order_totals` (aggregates, a leaderboard and three windowed views): per-batch time of 100-, 1,000- and
  10,000-record batches beside the built-in timeline's per-record cost at 1,000, a no-op `run --once`, freshness
  (append -> every view of the job, both deployed) p50/p99, and every view checked against the brute force.
- peers: `bench.peers`: the same events through our jobs and through a peer on this machine: Apache Flink 1.20's
  own SQL of Nexmark q0-q22 but q6 and q12 (PyFlink on a local mini cluster of as many task slots as Spark has,
  `bench/flink_side.py` in the environment of `make peers-setup`; skipped with a note without it) beside our jobs of
  `timeline_demo/pipelines/nexmark.yml` over 200k events (`--peers-events`), and Spark's own stream-stream join
  beside our `clicks` job over 1M clicks events (`--peers-clicks-events`): events/s per core of each, the ratio,
  and whether the final results agree. In the default selection, as issue #43 asks; its sizes bound its time.
- fanout: celebrities, `bench.fanout`: a 1M-follower tweet to visible everywhere, fan-out on write vs FANOUT_LIMIT
  (deployed); `read_timeline` reads/s and p50/p99 plain vs hybrid while the jobs write; Redis bytes per entry.

The parts are in `bench.timeline`, `bench.freshness`, `bench.clicks`, `bench.enrichment`, `bench.nexmark`,
`bench.pipelines` and the modules named above; the table and the plot in `bench.report`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, cpu_ticks, say, scratch_settings, start_redis, stolen_pct
from bench.report import (
    END,
    NEXMARK_END,
    NEXMARK_START,
    START,
    SUMMARY_END,
    SUMMARY_START,
    markdown_table,
    nexmark_table,
    plot,
    summary,
    update_block,
)

__all__ = ["main"]

PARTS = (
    "redis",
    "throughput",
    "replay",
    "incrementality",
    "freshness",
    "hdfs",
    "baseline",
    "metrics",
    "clicks",
    "enrichment",
    "cdc",
    "nexmark",
    "pipelines",
    "kafka",
    "fanout",
    "peers",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=None, help="run only these parts: " + " ".join(PARTS))
    p.add_argument("--out", default=str(ROOT / "bench" / "results.json"))
    p.add_argument("--plot", default=str(ROOT / "docs" / "bench.png"))
    p.add_argument("--doc", default=str(ROOT / "docs" / "bench.md"), help="the page whose table is replaced")
    p.add_argument("--readme", default=str(ROOT / "README.md"), help="the page whose summary is replaced")
    p.add_argument("--freshness-seconds", type=float, default=90.0)
    p.add_argument("--baseline", default=None, help="the commit the baseline part compares with")
    p.add_argument("--incrementality-budget", type=float, default=240.0)
    p.add_argument(
        "--metrics-pairs", type=int, default=200, help="metrics: freshness on/off append pairs, ABBA"
    )
    p.add_argument(
        "--metrics-throughput-pairs", type=int, default=32, help="metrics: throughput on/off run pairs, ABBA"
    )
    p.add_argument(
        "--clicks-events",
        type=int,
        default=1_000_000,
        help="events of the clicks bench (1M: the part took 234 s alone on 2 cores at load 5, under the ~4 min budget)",
    )
    p.add_argument("--enrichment-events", type=int, default=1_000_000, help="events of the enrichment bench")
    p.add_argument("--profiles", type=int, default=100_000, help="profiles of the enrichment bench")
    p.add_argument("--events", type=int, default=None, help="events of both (profiles = events / 10)")
    p.add_argument(
        "--nexmark-events",
        type=int,
        default=2_500_000,
        help="nexmark: Nexmark events each of q3, q8, q13, q20 runs over (10M over the four)",
    )
    p.add_argument(
        "--nexmark-warmup-events",
        type=int,
        default=10_000,
        help="nexmark: events of the untimed warm-up run of the four jobs (0: none, e.g. for a smoke run)",
    )
    _peers_options(p)
    p.add_argument("--pipelines-probes", type=int, default=100, help="pipelines: freshness probes per job")
    p.add_argument("--cdc-rows", type=int, default=100_000, help="rows of the cdc bench's bulk UPDATE")
    p.add_argument(
        "--cdc-seconds", type=float, default=60.0, help="cdc: seconds of profile changes (one every 2 s)"
    )
    p.add_argument(
        "--kafka-seconds", type=float, default=60.0, help="kafka: seconds of tweets produced (10 every 2 s)"
    )
    p.add_argument(
        "--fanout-followers", type=int, default=1_000_000, help="fanout: the celebrity's followers"
    )
    p.add_argument(
        "--scale", type=float, default=1.0, help="workload size factor (e.g. 0.05 for a smoke run)"
    )
    p.add_argument(
        "--warm-runs",
        type=int,
        default=10,
        help="throughput: runs of the same job again in the warm JVM (the median of the last 3 is the steady state)",
    )
    return p


def _peers_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--peers-events",
        type=int,
        default=200_000,
        help="peers: Nexmark events every query of both sides runs over (Flink's and ours)",
    )
    p.add_argument(
        "--peers-clicks-events",
        type=int,
        default=1_000_000,
        help="peers: clicks workload events of our clicks job and Spark's own join (0: none)",
    )
    p.add_argument("--peers-queries", nargs="*", default=None, help="peers: only these Nexmark queries")


def _part(res: dict, name: str, fn, *args, **kwargs) -> None:
    """Run one part into res[name]: its figures, or {"error": ...} when it failed, with its time and CPU steal."""
    started, ticks = time.monotonic(), cpu_ticks()
    say(f"{name}: start")
    try:
        res[name] = fn(*args, **kwargs)
    except Exception as e:  # one failed part must not lose the others' figures
        res[name] = {"error": f"{type(e).__name__}: {e}"}
    res[name]["part_seconds"] = round(time.monotonic() - started, 1)
    # A virtual machine's CPU can be taken by its neighbours: every figure of a part says how much, so a slow
    # run can be told from a slow program.
    res[name]["cpu_stolen_pct"] = stolen_pct(ticks)
    say(f"{name}: {json.dumps(res[name])[:400]}")


def _other(run, settings, args: tuple, **kwargs) -> dict:
    """The clicks, enrichment or nexmark bench (`run`, given `args`, `settings` and `kwargs`): its figures and its
    seconds."""
    started = time.monotonic()
    out = run(*args, settings=settings, **kwargs)
    return {"available": True, "seconds": round(time.monotonic() - started, 1), **out}


def _jvm(spark) -> str:
    """The driver JVM's Java version and whether it started with the AOT cache of `make jvm-cache`."""
    from joins.sparkapi import jvm as driver

    jvm = driver(spark).java.lang
    args = jvm.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    aot = [a for a in args if "AOTCache" in a]
    cache = "AOT cache of `make jvm-cache`" if aot else "no AOT cache"
    return f"Java {jvm.System.getProperty('java.version')}, {cache}"


def _start_kafka(res: dict, tmp: Path):
    """The kafka part's broker (process, bootstrap), or None with the part's error in `res` if it cannot start."""
    from bench.kafka import start_kafka

    try:
        return start_kafka(tmp)
    except Exception as e:  # noqa: BLE001 - the other parts still run
        res["kafka"] = {"error": f"{type(e).__name__}: {e}"}
        return None


def _with_kafka(settings, bootstrap: str):
    import dataclasses

    return dataclasses.replace(settings, kafka_bootstrap=bootstrap)


def _timeline_parts(res: dict, want: set, args, spark, settings, tmp: Path, port: int, broker=None) -> None:
    """The wanted parts over the timeline job, in this order: those on this run's lake (throughput, replay,
    incrementality, freshness), then those that run it elsewhere or compare it (hdfs, baseline, metrics,
    fanout, kafka)."""
    _timeline_lake_parts(res, want, args, spark, settings, tmp, port)
    _timeline_compared_parts(res, want, args, spark, settings, tmp, port, broker)


def _timeline_lake_parts(res: dict, want: set, args, spark, settings, tmp: Path, port: int) -> None:
    """throughput (or, for freshness, metrics or kafka alone, only the workload ingested for the job to catch up),
    replay, incrementality, freshness."""
    from bench.freshness import bench_freshness
    from bench.timeline import (
        bench_incrementality,
        bench_replay,
        bench_throughput,
        ingest_workload,
        throughput_workload,
    )

    if want & {"freshness", "metrics", "kafka"} and not want & {
        "throughput",
        "replay",
    }:  # freshness alone: the job catches up
        ingest_workload(spark, settings, throughput_workload(args.scale), tmp)
    elif want & {"throughput", "replay", "freshness", "metrics"}:
        zadd_per_s = res.get("redis", {}).get("zadd_per_s", 0.0)
        _part(
            res, "throughput", bench_throughput, spark, settings, tmp, zadd_per_s, args.scale, args.warm_runs
        )
    if "replay" in want:
        _part(res, "replay", bench_replay, spark, settings)
    if "incrementality" in want:
        inc_settings = scratch_settings(tmp / "lake-inc", port, 1)
        budget = args.incrementality_budget
        _part(res, "incrementality", bench_incrementality, spark, inc_settings, tmp, budget, args.scale)
    if "freshness" in want:
        follows = throughput_workload(args.scale).follows
        _part(res, "freshness", bench_freshness, spark, settings, tmp, follows, args.freshness_seconds, 2.0)


def _timeline_compared_parts(
    res: dict, want: set, args, spark, settings, tmp: Path, port: int, broker=None
) -> None:
    """hdfs, baseline, metrics, fanout, kafka (on `broker`, then stopped)."""
    from bench.timeline import throughput_workload

    if "hdfs" in want:
        from bench.hdfs import bench_hdfs

        zadd_per_s = res.get("redis", {}).get("zadd_per_s", 0.0)
        kw = {"scale": args.scale, "warm_runs": args.warm_runs, "freshness_seconds": args.freshness_seconds}
        _part(res, "hdfs", bench_hdfs, spark, tmp, port, zadd_per_s, **kw)
    if "baseline" in want:
        from bench.baseline import BASELINE, bench_baseline

        ref = args.baseline or BASELINE
        _part(res, "baseline", bench_baseline, tmp, ref, args.freshness_seconds)
    if "metrics" in want:
        from bench.metrics import bench_metrics

        follows, pairs = throughput_workload(args.scale).follows, args.metrics_pairs
        _part(
            res, "metrics", bench_metrics, spark, settings, tmp, follows, pairs, args.metrics_throughput_pairs
        )
    if "fanout" in want:
        from bench.fanout import bench_fanout

        n = max(1_000, int(args.fanout_followers * args.scale))
        _part(
            res,
            "fanout",
            bench_fanout,
            spark,
            tmp,
            port,
            followers=n,
            limit=min(10_000, n // 10),
            scale=args.scale,
        )
    if "kafka" in want and res.get("kafka") is None:  # else the broker did not start: its error is there
        from bench.kafka import bench_kafka, stop_kafka

        follows, fr = throughput_workload(args.scale).follows, res.get("freshness")
        delta = fr if fr and "error" not in fr else None  # the Delta-path figures of this run, if any
        kw = {"scale": args.scale, "seconds": args.kafka_seconds, "delta": delta}
        _part(res, "kafka", bench_kafka, spark, settings, tmp, port, broker, follows, **kw)
        stop_kafka(broker[0])  # its memory back for the parts after it (main's `finally` stops it too)


def _other_parts(res: dict, want: set, args, tmp: Path, port: int) -> None:
    if "clicks" in want:
        from bench.clicks import run

        events = max(1_000, int(args.clicks_events * args.scale))
        _part(res, "clicks", _other, run, scratch_settings(tmp / "lake-clicks", port, 2), (events,))
    if "enrichment" in want:
        from bench.enrichment import run

        events = max(1_000, int(args.enrichment_events * args.scale))
        profiles = max(100, int(args.profiles * args.scale))
        settings = scratch_settings(tmp / "lake-enrich", port, 3)
        _part(res, "enrichment", _other, run, settings, (events, profiles))
    if "nexmark" in want:
        from bench.nexmark import run as run_nexmark

        events = max(5_000, int(args.nexmark_events * args.scale))
        settings = scratch_settings(tmp / "lake-nexmark", port, 12)
        kw = {"warmup_events": args.nexmark_warmup_events}
        _part(res, "nexmark", _other, run_nexmark, settings, (events,), **kw)
    if "peers" in want:
        from bench.peers import run as run_peers

        settings = scratch_settings(tmp / "lake-peers", port, 15)
        kw = {
            "clicks_events": max(1_000, int(args.peers_clicks_events * args.scale))
            if args.peers_clicks_events
            else 0,
            "warmup_events": args.nexmark_warmup_events,
            "queries": args.peers_queries,
        }
        events = max(5_000, int(args.peers_events * args.scale))
        _part(res, "peers", _other, run_peers, settings, (events,), **kw)
    if "pipelines" in want:
        from bench.pipelines import run as run_pipelines

        _part(res, "pipelines", run_pipelines, args.scale, tmp=tmp, port=port, probes=args.pipelines_probes)
    if "cdc" in want:
        from bench.cdc import run as run_cdc

        rows = max(1_000, int(args.cdc_rows * args.scale))
        settings = scratch_settings(tmp / "lake-cdc", port, 4)
        _part(res, "cdc", run_cdc, settings, rows=rows, seconds=args.cdc_seconds)


def _write(res: dict, args) -> None:
    """results.json, the plot, the table of docs/bench.md and the README's summary (both printed too; said when a
    page has no markers)."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    plot(res, Path(args.plot))
    table, short = markdown_table(res), summary(res)
    if not update_block(Path(args.doc), table, START, END):
        say(f"no {START} ... {END} markers in {args.doc}: here is the table")
    if not update_block(Path(args.readme), short, SUMMARY_START, SUMMARY_END):
        say(f"no {SUMMARY_START} ... {SUMMARY_END} markers in {args.readme}: here is the summary")
    nexmark = nexmark_table(res)
    if nexmark is not None and not update_block(Path(args.readme), nexmark, NEXMARK_START, NEXMARK_END):
        say(f"no {NEXMARK_START} ... {NEXMARK_END} markers in {args.readme}: here is the Nexmark table")
        print(nexmark)
    print(table)
    print(short)
    say(f"wrote {out}, {args.plot}; whole run {res['meta']['seconds']:.0f}s")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.events is not None:
        args.clicks_events = args.enrichment_events = args.events
        args.profiles = max(100, args.events // 10)
    want = set(args.only) if args.only else set(PARTS)

    t_start, ticks = time.monotonic(), cpu_ticks()
    tmp = Path(tempfile.mkdtemp(prefix="mview-bench-"))
    proc, port = start_redis(tmp)
    res: dict = {
        "meta": {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        }
    }
    broker = None
    try:
        if "redis" in want or "throughput" in want:
            from bench.timeline import bench_redis

            _part(res, "redis", bench_redis, port)
        from jobs.core.spark import get_spark

        settings = scratch_settings(tmp / "lake-tp", port, 0)
        broker = _start_kafka(res, tmp) if "kafka" in want else None
        # With a broker the bench's JVM gets Spark's Kafka source (a JVM's packages are fixed at its start).
        spark = get_spark(settings if broker is None else _with_kafka(settings, broker[1]), "mview-bench")
        res["meta"]["jvm"] = _jvm(spark)
        _timeline_parts(res, want, args, spark, settings, tmp, port, broker)
        _other_parts(res, want, args, tmp, port)
    finally:
        if broker is not None:
            from bench.kafka import stop_kafka

            stop_kafka(broker[0])
        proc.terminate()
        proc.wait(10)
    res["meta"]["seconds"] = round(time.monotonic() - t_start, 1)
    res["meta"]["cpu_stolen_pct"] = stolen_pct(ticks)
    _write(res, args)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
