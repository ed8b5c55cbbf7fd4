"""The `hdfs` part: the timeline's throughput and freshness with the lake on a real HDFS (`jobs.dev.hdfs`, one
NameNode and one DataNode on this machine), the same workloads and commands as the `throughput` and `freshness`
parts, whose local-lake figures of the same run stand beside them.

What differs is only where the lake is: `LAKE_DIR=hdfs://127.0.0.1:<port>/lake-tp`. Topics are written by
delta-rs over the NameNode protocol, the job's checkpoint, state and status go through HDFS, and Redis is the
bench's (its own database). The HDFS server is stopped at the end of the part."""

from __future__ import annotations

from pathlib import Path

from bench.common import say, scratch_settings

__all__ = ["bench_hdfs"]


def bench_hdfs(
    spark,
    tmp: Path,
    port: int,
    zadd_per_s: float,
    *,
    scale: float,
    warm_runs: int,
    freshness_seconds: float,
) -> dict:
    from bench.freshness import bench_freshness
    from bench.timeline import bench_throughput, throughput_workload
    from jobs.dev.hdfs import scratch_hdfs

    server = scratch_hdfs(tmp / "hdfs")
    try:
        settings = scratch_settings(f"{server.url}/lake-tp", port, 13)
        say(f"hdfs: lake at {settings.lake_uri}")
        work = tmp / "hdfs-work"
        work.mkdir(parents=True, exist_ok=True)
        throughput = bench_throughput(spark, settings, work, zadd_per_s, scale, warm_runs)
        say(
            f"hdfs: throughput {throughput['entries_per_s']:,} entries/s cold, {throughput['steady_entries_per_s']:,} steady"
        )
        follows = throughput_workload(scale).follows
        freshness = bench_freshness(spark, settings, work, follows, freshness_seconds, 2.0)
        return {
            "lake": "one NameNode and one DataNode on loopback, jobs.dev.hdfs",
            "throughput": throughput,
            "freshness": freshness,
        }
    finally:
        server.stop()
