"""The cost of the jobs' Prometheus metrics (`jobs.metrics`): the timeline's throughput and freshness with the
metrics on and off, in one run, judged against the run-to-run noise of the same figures.

- Direct cost: the time of `JobMetrics.observe` per micro-batch and of one scrape (every metric rendered, the
  status-file metrics read from the lake), against the batch time of the job: an upper bound of what the metrics
  can cost, free of the noise of end-to-end figures.
- Throughput: the job over the throughput logs in the warm JVM, `pairs` times per mode, the modes alternating
  (on, off, off, on, ...), each run into a throw-away generation; the medians compared.
- Freshness: the job deployed four times under the same load (`bench.freshness`), in the order off, on, on, off,
  with the metrics scraped every `SCRAPE_S` while they are on; the latencies of both rounds of a mode pooled and
  their p50 and p99 compared. The noise is the difference between the two rounds of one mode (an A/A test).

A cost is how much slower (or later) the figure is with metrics on, in % of the figure with metrics off; the
goal is under 3%, or within the noise measured in the same run.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from bench.common import say

__all__ = ["bench_metrics", "GOAL_PCT", "SCRAPE_S"]

GOAL_PCT = 3.0
SCRAPE_S = 1.0  # scrape interval while the metrics are on (Prometheus' default is 15 s: this bounds it above)


def _modes(settings):
    on = dataclasses.replace(settings, metrics_port=settings.metrics_port or 9464)
    return {"on": on, "off": dataclasses.replace(settings, metrics_port=None)}


def _pct(on, off, higher_is_better: bool):
    if not on or not off:
        return None
    return round(100 * ((off - on) / off if higher_is_better else (on - off) / off), 1)


def _quantile(values: list[float], p: float):
    v = sorted(values)
    return round(v[min(len(v) - 1, int(p * len(v)))], 3) if v else None


def _direct_cost(settings) -> dict:
    """Seconds per `observe` of a typical batch and per scrape of the job's whole registry."""
    from prometheus_client import generate_latest

    from jobs.metrics import JobMetrics
    from jobs.skeleton import Batch

    m = JobMetrics(settings, "timeline")  # not served: only its registry is used
    batch = Batch(
        events=100,
        summary="",
        inputs={"tweets": 90, "follows": 10},
        phases={"join": 0.2, "sink": 0.1, "state": 0.1},
        totals={"entries": 5000, "timeline_ops": 300},
    )
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        m.observe(batch, 0.4)
    observe_s = (time.perf_counter() - t0) / n
    scrapes = 50
    t0 = time.perf_counter()
    for _ in range(scrapes):
        generate_latest(m.registry)
    scrape_s = (time.perf_counter() - t0) / scrapes
    return {"observe_us": round(observe_s * 1e6, 2), "scrape_ms": round(scrape_s * 1e3, 2)}


class _Scraper:
    """Scrapes the deployed timeline job's metrics every `SCRAPE_S` until stopped; counts the scrapes."""

    def __init__(self, settings) -> None:
        self.settings, self.stop, self.scrapes = settings, threading.Event(), 0
        self.batch_sum = self.batch_count = 0.0  # of mview_batch_duration_seconds at the last scrape
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from jobs.runtime import read_status

        while not self.stop.wait(SCRAPE_S):
            url = read_status(self.settings, "timeline").get("metrics_url")
            if not url:
                continue
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    text = r.read().decode()
                self.scrapes += 1
                self._batch_times(text)
            except OSError:
                pass  # the job is starting or stopping

    def _batch_times(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        for fam in text_string_to_metric_families(text):
            if fam.name == "mview_batch_duration_seconds":
                for sample in fam.samples:
                    if sample.name.endswith("_sum"):
                        self.batch_sum = sample.value
                    elif sample.name.endswith("_count"):
                        self.batch_count = sample.value

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


def _freshness(spark, modes, tmp: Path, follows, seconds: float) -> dict:
    from bench.freshness import bench_freshness

    rounds: dict[str, list[dict]] = {"off": [], "on": []}
    scrapes, batch_sum, batch_count = 0, 0.0, 0.0
    for i, mode in enumerate(("off", "on", "on", "off")):
        prefix = f"metrics-{mode}{i}-"
        if mode == "on":
            with _Scraper(modes[mode]) as scraper:
                r = bench_freshness(spark, modes[mode], tmp, follows, seconds, 2.0, prefix, latencies=True)
            scrapes += scraper.scrapes
            batch_sum, batch_count = batch_sum + scraper.batch_sum, batch_count + scraper.batch_count
        else:
            r = bench_freshness(spark, modes[mode], tmp, follows, seconds, 2.0, prefix, latencies=True)
        rounds[mode].append(r)
        say(f"metrics: freshness round {i + 1}/4, metrics {mode}: p50 {r['p50_s']} s, p99 {r['p99_s']} s")
    out: dict = {
        "scrapes": scrapes,
        "mean_batch_s": round(batch_sum / batch_count, 3) if batch_count else None,
    }
    for mode, rs in rounds.items():
        pooled = [x for r in rs for x in r["latencies"]]
        out[mode] = {
            "p50_s": _quantile(pooled, 0.5),
            "p99_s": _quantile(pooled, 0.99),
            "visible": len(pooled),
            "tweets": sum(r["tweets"] for r in rs),
            "rounds_p50_s": [r["p50_s"] for r in rs],
            "rounds_p99_s": [r["p99_s"] for r in rs],
        }
    for q in ("p50", "p99"):
        out[f"{q}_cost_pct"] = _pct(out["on"][f"{q}_s"], out["off"][f"{q}_s"], False)
        # A/A: how far apart two rounds of the same mode are, in % of their mean (the larger of the two modes)
        out[f"{q}_noise_pct"] = max(
            round(100 * abs(a - b) / ((a + b) / 2), 1) if a and b else 0.0
            for a, b in (out[m][f"rounds_{q}_s"] for m in ("off", "on"))
        )
    return out


def bench_metrics(spark, settings, tmp: Path, follows: list[dict], pairs: int, freshness_s: float) -> dict:
    """Run after the throughput part (its logs are in `settings`' lake)."""
    from bench.timeline import warm_rates

    direct = _direct_cost(settings)
    say(f"metrics: observe {direct['observe_us']} us per batch, one scrape {direct['scrape_ms']} ms")
    modes, rates = _modes(settings), {"on": [], "off": []}
    for i in range(max(1, pairs)):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            rates[mode] += warm_rates(spark, modes[mode], 1)
            say(f"metrics: throughput with metrics {mode}: {rates[mode][-1]:,.0f} entries/s")
    med = {m: statistics.median(r) for m, r in rates.items()}
    spread = {m: round(100 * (max(r) - min(r)) / statistics.median(r), 1) for m, r in rates.items() if r}
    fresh = _freshness(spark, modes, tmp, follows, freshness_s / 2)
    batch_s = fresh["mean_batch_s"]
    # the job's own time per batch spent on metrics, and one core's share spent serving scrapes
    direct["observe_pct_of_batch"] = round(direct["observe_us"] / 1e4 / batch_s, 4) if batch_s else None
    direct["scrape_pct_of_core"] = round(direct["scrape_ms"] / 10 / SCRAPE_S, 3)
    direct["mean_batch_s"] = batch_s
    return {
        "workload": f"the throughput logs, {pairs} runs per mode alternating; freshness load in 4 rounds of "
        f"{freshness_s / 2:.0f}s (off, on, on, off), scraped every {SCRAPE_S:.0f}s while on",
        "command": "run_timeline (warm JVM) and mview deploy timeline, METRICS_PORT on / off",
        "direct": direct,
        "entries_per_s": {m: [round(x) for x in r] for m, r in rates.items()},
        "median_entries_per_s": {m: round(v) for m, v in med.items()},
        "throughput_cost_pct": _pct(med["on"], med["off"], True),
        "throughput_noise_pct": max(spread.values()) if spread else None,
        "freshness": {m: fresh[m] for m in ("off", "on")},
        "scrapes": fresh["scrapes"],
        "freshness_p50_cost_pct": fresh["p50_cost_pct"],
        "freshness_p99_cost_pct": fresh["p99_cost_pct"],
        "freshness_p50_noise_pct": fresh["p50_noise_pct"],
        "freshness_p99_noise_pct": fresh["p99_noise_pct"],
    }
