"""The cost of the jobs' Prometheus metrics (`jobs.core.metrics`): the timeline's throughput and freshness with the
metrics on and off, in one run, each cost judged against its own noise in the same run.

- Direct cost: the time of `JobMetrics.observe` per micro-batch and of one scrape (every metric rendered, the
  status-file metrics read from the lake), against the batch time of the deployed job: an upper bound of what
  the metrics can cost, free of the noise of end-to-end figures.
- Throughput: the job over the throughput logs in the warm JVM, each run into a throw-away generation:
  `WARMUP_RUNS` unmeasured runs, then `throughput_pairs` pairs of runs, one with the metrics on (served, observed every
  batch) and one off, in ABBA order (on-off, off-on, ...). Each run starts after a full garbage collection of
  the driver's JVM and of Python (`_settle`), so that it pays for its own garbage only. Each run's CPU seconds
  (this process and its descendants: the driver's JVM, Redis) are what the metrics would add to; each pair's
  cost is how much more CPU the "on" run used. The wall-clock entries/s of every run and their pairs' costs are reported beside (`wall`).
- Freshness: the job deployed once, its metrics server on, under the same load (`bench.freshness`): an
  unmeasured load of `WARMUP_LOAD_S`, then `pairs` pairs of appends (10 tweets each) in ABBA order, scraped
  every `SCRAPE_S` from the start of an "on" append to the start of the next append and not at all during the
  "off" ones. Every append starts `PHASE_S` after a trigger time of the job (Spark's processing-time trigger
  fires at wall-clock multiples of TRIGGER_INTERVAL), at least 2 s after the previous one and once that one is
  visible, so the job is idle when it lands and the wait for the trigger that picks it up hardly varies. Each
  pair's cost is that of its two appends' median latency (append -> in every follower's timeline): neighbours
  in time, so a drift of the job's speed over the run cancels out. This measures the scrape's cost (serving and rendering the
  metrics); `observe` runs in every batch of both modes and is measured directly.

A cost is how much slower (more CPU, later) a figure is with metrics on, in % of the figure with metrics off.
The figure is the median of the pairs' costs; its noise is how far the distribution-free (sign-test) interval
of that median at `LEVEL` confidence reaches from it: between the k-th smallest and the k-th largest pair cost
(with 16 pairs, the 5th and the 12th; with 200, the 89th and the 112th; none under 5 pairs), which narrows as the pairs grow in number. The
verdict (`verdict`) is "within the 3% goal" when that interval lies under 3%, "within noise" when it reaches 0
or below (no cost shown, but none shown to be under 3% either), and "not shown" otherwise (a cost shown, or no
interval: fewer than 5 pairs).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from bench.common import say

__all__ = ["bench_metrics", "verdict", "GOAL_PCT", "SCRAPE_S"]

GOAL_PCT = 3.0
LEVEL = 0.9  # confidence of the interval of the median pair cost
PHASE_S = 0.05  # each freshness append starts this long after a trigger time of the deployed job
SCRAPE_S = 1.0  # scrape interval while the metrics are on (Prometheus' default is 15 s: this bounds it above)
WARMUP_RUNS = 10  # unmeasured throughput runs before the pairs (a fresh JVM speeds up for about ten)
WARMUP_LOAD_S = 30.0  # unmeasured freshness load before the pairs, in the just deployed job


def _modes(settings):
    on = dataclasses.replace(settings, metrics_port=settings.metrics_port or 9464)
    return {"on": on, "off": dataclasses.replace(settings, metrics_port=None)}


def _order(pairs: int) -> list[tuple[str, str]]:
    """ABBA: (on, off), (off, on), (on, off), ...: a drift over the run adds to half the pairs, subtracts from the
    other half."""
    return [("on", "off") if i % 2 == 0 else ("off", "on") for i in range(max(1, pairs))]


def _pct(on, off, higher_is_better: bool):
    if not on or not off:
        return None
    return round(100 * ((off - on) / off if higher_is_better else (on - off) / off), 2)


def _median_interval(c: list[float]) -> tuple[float, float] | None:
    """The distribution-free (sign test) interval of the median of `c` at `LEVEL` confidence or more: its k-th
    smallest and k-th largest value, for the largest k whose coverage 1 - 2 P(Binomial(n, 1/2) < k) is still at
    least `LEVEL`. It narrows as the pairs grow in number (about as 1/sqrt(n)), where their spread does not.
    None when even [min, max] covers less (fewer than 5 pairs at 90%)."""
    v, n = sorted(c), len(c)
    if 1 - 2 / 2**n < LEVEL:
        return None
    k, tail = 1, 1 / 2**n  # tail: P(Binomial(n, 1/2) < k + 1)
    while k < (n + 1) // 2:
        nxt = tail + math.comb(n, k) / 2**n
        if 1 - 2 * nxt < LEVEL:
            break
        k, tail = k + 1, nxt
    return v[k - 1], v[n - k]


def _paired(costs: list) -> dict:
    """The median of per-pair costs (%), their min and max, the `LEVEL` interval of the median (`ci_pct`) and the
    noise: how far the interval reaches from the median (the larger side)."""
    c = [x for x in costs if x is not None]
    if not c:
        return {"cost_pct": None, "min_pct": None, "max_pct": None, "noise_pct": None, "pairs_pct": costs}
    med, ci = statistics.median(c), _median_interval(c)
    return {
        "cost_pct": round(med, 2),
        "min_pct": min(c),
        "max_pct": max(c),
        "ci_pct": list(ci) if ci else None,
        "noise_pct": round(max(ci[1] - med, med - ci[0]), 2) if ci else None,  # None: too few pairs
        "pairs_pct": costs,
    }


def verdict(fig: dict) -> str:
    """ "within the 3% goal" (the interval of the median pair cost, `ci_pct`, lies under it), "within noise" (the
    interval reaches 0 or below: no cost shown, but none shown under 3% either), or "not shown" (a cost is shown
    that is not shown to be under 3%). Without `ci_pct`, the interval is cost -/+ noise."""
    if fig.get("cost_pct") is None or fig.get("noise_pct") is None:
        return "not shown"
    lo, hi = fig.get("ci_pct") or (fig["cost_pct"] - fig["noise_pct"], fig["cost_pct"] + fig["noise_pct"])
    if hi < GOAL_PCT:
        return f"within the {GOAL_PCT:g}% goal"
    if lo <= 0:
        return "within noise"
    return "not shown"


def _quantile(values: list[float], p: float):
    v = sorted(values)
    return round(v[min(len(v) - 1, int(p * len(v)))], 3) if v else None


def _direct_cost(settings) -> dict:
    """Seconds per `observe` of a typical batch and per scrape of the job's whole registry."""
    from prometheus_client import generate_latest

    from jobs.core.metrics import JobMetrics
    from jobs.core.skeleton import Batch

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
    """Scrapes the deployed timeline job's metrics every `SCRAPE_S` while `on` is set; counts the scrapes."""

    def __init__(self, settings) -> None:
        self.settings, self.stop, self.on, self.scrapes = settings, threading.Event(), threading.Event(), 0
        self.batch_sum = self.batch_count = 0.0  # of mview_batch_duration_seconds at the last scrape
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from jobs.core.runtime import read_status

        while not self.stop.wait(SCRAPE_S):
            if not self.on.is_set():
                continue
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


def _tree_cpu_s() -> float:
    """CPU seconds used so far by this process and its descendants (the driver's JVM, Redis, Python workers),
    with their reaped children: from /proc."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))  # ppid; utime..cstime
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    todo, ticks = [os.getpid()], 0
    while todo:
        pid = todo.pop()
        ticks += stats.get(pid, (0, 0))[1]
        todo += kids.get(pid, [])
    return ticks / os.sysconf("SC_CLK_TCK")


def _settle(spark) -> None:
    """A full collection in Python and in the driver's JVM (`System.gc()`, synchronous under G1): the next run
    starts from the same heap, and the collector's work it pays for is its own garbage's, not the runs' before."""
    from joins.sparkapi import jvm

    gc.collect()
    jvm(spark).java.lang.System.gc()


def _throughput(spark, modes, pairs: int) -> dict:
    from bench.timeline import warm_rates

    warm_rates(spark, modes["off"], WARMUP_RUNS)  # the first runs in a JVM pay its JIT warm-up: discarded
    rates: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}  # CPU seconds per run (the same entries every run)
    wall, costs = [], []
    for i, order in enumerate(_order(pairs)):
        pair, pair_cpu = {}, {}
        for mode in order:
            _settle(spark)
            c0 = _tree_cpu_s()
            pair[mode] = warm_rates(spark, modes[mode], 1)[0]
            used = _tree_cpu_s() - c0
            pair_cpu[mode] = used
            rates[mode].append(pair[mode])
            cpu[mode].append(round(used, 3))
        wall.append(_pct(pair["on"], pair["off"], True))
        costs.append(_pct(pair_cpu["on"], pair_cpu["off"], False))
        say(
            f"metrics: throughput pair {i + 1}/{pairs}: on {pair['on']:,.0f}, off {pair['off']:,.0f} entries/s; "
            f"CPU on {pair_cpu['on']:.2f} s, off {pair_cpu['off']:.2f} s"
        )
    return {
        "entries_per_s": {m: [round(x) for x in r] for m, r in rates.items()},
        "median_entries_per_s": {m: round(statistics.median(r)) for m, r in rates.items()},
        "cpu_s": cpu,
        "wall": _paired(wall),
        **_paired(costs),
    }


def _append_pairs(
    order: list[str], per_append: list[list[float]]
) -> tuple[dict[str, list[float]], list[float]]:
    """({mode: every latency of its appends}, [cost of each pair]) of appends `2i` and `2i + 1`, whose modes
    `order` gives (one "on", one "off"): a pair's cost compares its appends' median latencies. A pair with an
    append none of whose tweets became visible has no cost; an unpaired last append counts in neither."""
    lat: dict[str, list[float]] = {"on": [], "off": []}
    costs = []
    for i in range(0, len(per_append) - 1, 2):
        pair = {order[k]: per_append[k] for k in (i, i + 1)}
        for mode, seconds in pair.items():
            lat[mode] += seconds
        if all(pair.values()):
            costs.append(_pct(*(statistics.median(pair[m]) for m in ("on", "off")), False))
    return lat, costs


def _freshness(spark, modes, tmp: Path, follows, pairs: int) -> dict:
    from bench.freshness import deploy_jobs, ingest_tweets, measure_freshness

    settings = modes["on"]
    append = lambda recs, path: ingest_tweets(spark, settings, recs, path)  # noqa: E731
    order = [mode for pair in _order(pairs) for mode in pair]  # the mode of each append

    def load(prefix: str, **kw) -> dict:
        return measure_freshness(
            settings, tmp, follows, kw.pop("seconds", math.inf), 2.0, prefix, append=append, latencies=True,
            align_phase_s=PHASE_S, **kw,
        )  # fmt: skip

    stop_jobs = deploy_jobs(settings, ("timeline",))
    try:
        with _Scraper(settings) as scraper:
            load("metrics-warm-", seconds=WARMUP_LOAD_S)  # the deployed JVM's first batches: discarded

            def switch(k: int) -> None:
                scraper.on.set() if order[k] == "on" else scraper.on.clear()
                if k % 40 == 0:
                    say(f"metrics: freshness append {k + 1}/{len(order)}")

            per_append = load("metrics-", appends=len(order), before_append=switch)["per_append"]
            scraper.on.clear()
    finally:
        stop_jobs()
    lat, costs = _append_pairs(order, per_append)
    say(f"metrics: freshness: {len(costs)} append pairs compared")
    out: dict = {
        m: {"p50_s": _quantile(lat[m], 0.5), "p99_s": _quantile(lat[m], 0.99), "visible": len(lat[m])}
        for m in ("on", "off")
    }
    out["p99_cost_pct"] = _pct(out["on"]["p99_s"], out["off"]["p99_s"], False)  # pooled: not paired
    out["scrapes"] = scraper.scrapes
    out["mean_batch_s"] = round(scraper.batch_sum / scraper.batch_count, 3) if scraper.batch_count else None
    return {**out, **_paired(costs)}


def bench_metrics(spark, settings, tmp: Path, follows: list[dict], pairs: int, throughput_pairs: int) -> dict:
    """Run after the throughput part (its logs are in `settings`' lake). `pairs`: freshness append pairs;
    `throughput_pairs`: throughput run pairs."""
    direct = _direct_cost(settings)
    say(f"metrics: observe {direct['observe_us']} us per batch, one scrape {direct['scrape_ms']} ms")
    modes = _modes(settings)
    thr = _throughput(spark, modes, throughput_pairs)
    fresh = _freshness(spark, modes, tmp, follows, pairs)
    batch_s = fresh.pop("mean_batch_s")
    # the job's own time per batch spent on metrics, and one core's share spent serving scrapes
    direct["observe_pct_of_batch"] = round(direct["observe_us"] / 1e4 / batch_s, 4) if batch_s else None
    direct["scrape_pct_of_core"] = round(direct["scrape_ms"] / 10 / SCRAPE_S, 3)
    direct["mean_batch_s"] = batch_s
    for name, fig in (
        ("throughput CPU", thr),
        ("throughput wall", thr["wall"]),
        ("freshness p50", fresh),
    ):
        fig["verdict"] = verdict(fig)
        say(f"metrics: {name} cost {fig['cost_pct']}% (noise {fig['noise_pct']}%): {fig['verdict']}")
    return {
        "workload": f"the throughput logs, {WARMUP_RUNS} warm-up runs then {throughput_pairs} on/off pairs (ABBA); one "
        f"deployment under the freshness load, a {WARMUP_LOAD_S:.0f}-s warm-up load then {pairs} pairs of "
        f"appends (ABBA), scraped every {SCRAPE_S:.0f}s during the 'on' appends",
        "command": "run_timeline (warm JVM), METRICS_PORT on / off; mview deploy timeline, scrapes on / off",
        "direct": direct,
        "throughput": thr,
        "freshness": fresh,
        "scrapes": fresh.pop("scrapes"),
    }
