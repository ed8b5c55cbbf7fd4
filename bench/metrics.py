"""The cost of the jobs' Prometheus metrics (`jobs.metrics`): the timeline's throughput and freshness with the
metrics on and off, in one run.

Throughput: the job over the throughput logs in the warm JVM, `pairs` times per mode, the modes alternating
(on, off, off, on, ...), each run into a throw-away generation; the medians compared. Freshness: the job deployed
twice under the same load (`bench.freshness`), once per mode; p50 and p99 compared. The cost is how much slower
(or later) the figure is with metrics on, in % of the figure with metrics off; the goal is under 3%.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from bench.common import say

__all__ = ["bench_metrics", "GOAL_PCT"]

GOAL_PCT = 3.0


def _modes(settings):
    on = dataclasses.replace(settings, metrics_port=settings.metrics_port or 9464)
    return {"on": on, "off": dataclasses.replace(settings, metrics_port=None)}


def bench_metrics(spark, settings, tmp: Path, follows: list[dict], pairs: int, freshness_s: float) -> dict:
    """Run after the throughput part (its logs are in `settings`' lake)."""
    from bench.freshness import bench_freshness
    from bench.timeline import warm_rates

    modes, rates = _modes(settings), {"on": [], "off": []}
    for i in range(max(1, pairs)):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            rates[mode] += warm_rates(spark, modes[mode], 1)
            say(f"metrics: throughput with metrics {mode}: {rates[mode][-1]:,.0f} entries/s")
    fresh = {}
    for mode in ("off", "on"):
        fresh[mode] = bench_freshness(spark, modes[mode], tmp, follows, freshness_s, 2.0, f"metrics-{mode}-")
        say(
            f"metrics: freshness with metrics {mode}: p50 {fresh[mode]['p50_s']} s, p99 {fresh[mode]['p99_s']} s"
        )
    med = {m: statistics.median(r) for m, r in rates.items()}

    def slower(on, off, higher_is_better: bool):
        if not on or not off:
            return None
        return round(100 * ((off - on) / off if higher_is_better else (on - off) / off), 1)

    return {
        "workload": f"the throughput logs, {pairs} runs per mode alternating; freshness load for {freshness_s:.0f}s per mode",
        "command": "run_timeline (warm JVM) and mview deploy timeline, METRICS_PORT on / off",
        "entries_per_s": {m: [round(x) for x in r] for m, r in rates.items()},
        "median_entries_per_s": {m: round(v) for m, v in med.items()},
        "throughput_cost_pct": slower(med["on"], med["off"], True),
        "freshness": {
            m: {k: f[k] for k in ("p50_s", "p99_s", "visible", "tweets")} for m, f in fresh.items()
        },
        "freshness_p50_cost_pct": slower(fresh["on"]["p50_s"], fresh["off"]["p50_s"], False),
        "freshness_p99_cost_pct": slower(fresh["on"]["p99_s"], fresh["off"]["p99_s"], False),
    }
