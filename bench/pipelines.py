"""The `pipelines` part of `python -m bench`: two jobs of a user's pipeline (the shop,
`timeline_demo/pipelines/shop.yml`, run through the generic path exactly as `mview run JOB` runs any pipeline's
jobs), beside the built-in `timeline` job measured the same way in the same run.

The jobs:
- `customer_orders`: the incremental table-table join `open_orders JOIN customers`, views `newest_orders` (list),
  `open_by_tier` (count) and `open_by_country` (agg; rows leave as orders close and customers change);
- `order_totals`: a `select` of `orders` (no join), views `by_currency` (agg), `leaderboard` (list) and three
  windowed ones: `hourly` (agg, tumbling hours), `visits` (count, sessions) and `best_recent` (list, hopping).

The workload is the shop's seeded generator (`timeline_demo.shop.generate_shop`, seed `SEED`, no faults, no clock
records) in its arrival order; each job reads only its topics' records (`customer_orders`: `open_orders` and
`customers`, `order_totals`: `orders`). Measured per job, in this JVM and on one scratch lake and Redis database:

- per-batch time: a base of records is ingested (`mview ingest`'s code) and caught up by `run --once` (not timed);
  then, for each batch size of `SIZES` (times `scale`, at least 10), `REPEATS` times: the next that many records
  of the job's topics are ingested (not timed) and the job runs `--once` (`job_spec(...).run(once=True)`, what
  `mview run JOB --once` does); timed is the run's micro-batch time (its `seconds`), the wall time is kept too.
  The median per size, and the per-record cost (median / records);
- the reference: the built-in `timeline` job (a lake and database of its own, the built-in pipeline) over the
  incrementality part's kind of workload (`timeline_demo.workload.generate`, tweets and follows in one shuffled
  arrival order), its base caught up, then `REPEATS` batches of the middle size (1,000 records at scale 1),
  timed the same way: its per-record cost. The ratio is the join job's per-record cost at that size over it;
- a no-op `mview run JOB --once` (nothing new in the logs): the whole command (`python -m jobs run JOB --once`, a
  new process; it starts no Spark when the job has caught up, `jobs.core.replay.caught_up`) and the same run in
  this warm JVM;
- freshness: each job's probe customer (a customer with a tier and a country no other has) is ingested before
  both jobs are deployed (`mview deploy`, `TRIGGER_INTERVAL` as set, 500 ms by default). Then, per probe and job
  in turn, one record is appended (`customer_orders`: an open order of the probe customer; `order_totals`: an
  order in a currency no other has) and the time from the append's return (its Delta commit) to the moment
  **every** view of the job answers `mview query` at the probe's keys exactly as the brute force of the probe's
  records alone says (`timeline_demo.brute`; the keys are the probe's own, so nothing else is in them) is
  measured, polling every 10 ms. A first probe per job waits for the deployment to be up and is not counted;
  between probes a random pause of up to one trigger interval, so that appends do not lock to its phase. p50, p99;
- correctness: after the jobs are stopped, `mview export` of every view of both jobs against the brute force of
  every record appended, in the same batches (doubles to a relative 1e-9). A view that differs is reported and
  the part's rows say so.

Goals (issue #42): the join job's 1,000-record batch within 1.5x the timeline's per-record cost, freshness p50 <=
1.5 s and p99 <= 3 s, a no-op `run --once` under 10 s (the whole command).

`python -m bench --only pipelines --scale F` runs it alone.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import statistics
import time
from pathlib import Path

from bench.common import ingest_records, say

__all__ = ["run", "rows", "JOBS", "SIZES", "GOALS"]

JOBS = ("customer_orders", "order_totals")
WHAT = {
    "customer_orders": "join open_orders x customers: list + count + agg views",
    "order_totals": "select orders: agg + list views and three windowed ones (hourly agg, session count, hopping list)",
}
SIZES = (100, 1_000, 10_000)
REPEATS = 3
BASE_ORDERS = 20_000  # orders of the base state at scale 1 (about 1.6 join records and 1 order record each)
SEED = 42
GOALS = {"ratio_to_timeline": 1.5, "p50_s": 1.5, "p99_s": 3.0, "noop_s": 10.0}
_DB_SHOP, _DB_TIMELINE = 13, 14


def sizes_at(scale: float) -> list[int]:
    """The batch sizes of `SIZES` times `scale`, at least 10 records."""
    return [max(10, int(n * scale)) for n in SIZES]


class _Appends:
    """Records appended to a scratch lake (`mview ingest`'s code, one file per topic and append), every append kept
    in order as a brute-force batch ({topic: [record, ...]})."""

    def __init__(self, spark, settings, tmp: Path) -> None:
        self.spark, self.settings, self.tmp = spark, settings, tmp
        self.batches: list[dict[str, list]] = []

    def add(self, pairs: list[tuple[str, dict]]) -> None:
        batch: dict[str, list] = {}
        for topic, rec in pairs:
            batch.setdefault(topic, []).append(rec)
        for topic, recs in batch.items():
            path = self.tmp / f"append-{len(self.batches)}-{topic}.jsonl"
            ingest_records(self.spark, self.settings, topic, recs, path)
            path.unlink(missing_ok=True)
        self.batches.append(batch)


def _shop_records(pipeline, scale: float, measured: int) -> dict[str, list[tuple[str, dict]]]:
    """Per job, the (topic, record) pairs of its topics in the shop feed's arrival order: a base, then at least
    `measured` more."""
    from timeline_demo.shop import generate_shop

    orders = max(500, int(BASE_ORDERS * scale)) + measured
    feed = generate_shop(orders=orders, seed=SEED, customers=max(60, orders // 50), close=False)
    out = {}
    for job in JOBS:
        topics = set(pipeline.jobs[job].topics)
        out[job] = [(t, r) for t, r in feed.arrivals if t in topics]
    return out


def _timed_batches(spark, lake: _Appends, job: str, pairs: list, sizes: list[int], repeats: int) -> dict:
    """Catch `job` up on all of `pairs` but the measured batches, then per size `repeats` batches of the next
    records, each ingested and run once (timed); per size the runs' figures, median and per-record cost."""
    from jobs.core.registry import job_spec

    spec = job_spec(lake.settings, job)
    base = len(pairs) - repeats * sum(sizes)
    lake.add(pairs[:base])
    spec.run(spark, lake.settings, once=True)
    at, out = base, {}
    for size in sizes:
        runs = []
        for _ in range(repeats):
            lake.add(pairs[at : at + size])
            at += size
            t0 = time.monotonic()
            totals = spec.run(spark, lake.settings, once=True)
            runs.append((float(totals["seconds"]), time.monotonic() - t0, int(totals["events"])))
        median = statistics.median(s for s, _, _ in runs)
        out[str(size)] = {
            "batch_seconds": [round(s, 3) for s, _, _ in runs],
            "wall_seconds": [round(w, 3) for _, w, _ in runs],
            "records_read": [n for _, _, n in runs],
            "median_s": round(median, 3),
            "per_record_ms": round(1000 * median / size, 4),
        }
        say(f"pipelines: {job} batches of {size:,}: {out[str(size)]['batch_seconds']} s")
    return {"base_records": base, "batches": out}


def _timeline(spark, settings, tmp: Path, scale: float, size: int, repeats: int) -> dict:
    """The built-in timeline job's per-record cost at batches of `size` records (see the module docstring)."""
    from timeline_demo.workload import generate

    base = max(1_000, int(BASE_ORDERS * scale))
    need = base + repeats * size
    wl = generate(seed=21, users=max(500, need // 10), celebrities=4, follows=need // 2, tweets=need // 2)
    seq = [("tweets", r) for r in wl.tweets] + [("follows", r) for r in wl.follows]
    random.Random(21).shuffle(seq)  # one arrival order across both topics
    got = _timed_batches(spark, _Appends(spark, settings, tmp), "timeline", seq, [size], repeats)
    return {"workload": f"{len(seq):,} timeline events (tweets and follows, 4 celebrities), seed 21", **got}


def _noop(spark, settings, job: str) -> dict:
    """A run of `job` with nothing new in its logs: the whole command in a new process, and in this JVM."""
    from bench.cdc import _mview  # the whole `python -m jobs ...` command, timed
    from jobs.core.registry import job_spec

    _, command_s = _mview(settings, "run", job, "--once")
    t0 = time.monotonic()
    job_spec(settings, job).run(spark, settings, once=True)
    return {"command_seconds": round(command_s, 2), "in_jvm_seconds": round(time.monotonic() - t0, 2)}


def _probe(job: str, k: int, now_ms: int) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
    """Probe `k` of `job`: (records ingested before the jobs are deployed, the record appended and timed)."""
    if job == "customer_orders":
        who = {"op": "upsert", "customer_id": f"probe{k}", "name": "probe", "tier": f"probe-tier-{k}"}
        before = [("customers", {**who, "country": f"P{k}", "ts": now_ms})]
        order = {"op": "open", "order_id": f"probe-o{k}", "customer_id": f"probe{k}", "amount": 10.0 + k}
        return before, [("open_orders", {**order, "ts": now_ms})]
    order = {"order_id": f"probe-o{k}", "customer_id": f"probe{k}", "amount": 10.0 + k, "currency": f"P{k}"}
    return [], [("orders", {**order, "ts": now_ms})]


def _expected(pipeline, job: str, before: list, appended: list) -> dict[tuple[str, str], dict]:
    """{(view, key): `mview query --json` without its generation} of every view of `job` at the keys the probe's
    records alone give (the brute force of them)."""
    from timeline_demo.brute import brute_force

    batches = [dict(_grouped(before)), dict(_grouped(appended))]
    want = brute_force(_only(pipeline, (job,)), batches)
    out = {}
    for view in pipeline.jobs[job].views:
        keys = want.keys(view.name)
        if not keys:
            raise RuntimeError(f"probe of {job} gives no key of view {view.name}")
        for key in keys:
            line = want.query(view.name, key)
            line.pop("generation", None)
            out[(view.name, key)] = line
    return out


def _grouped(pairs: list[tuple[str, dict]]) -> dict[str, list]:
    out: dict[str, list] = {}
    for topic, rec in pairs:
        out.setdefault(topic, []).append(rec)
    return out


def _only(pipeline, jobs: tuple[str, ...]):
    """`pipeline` with only `jobs` (the brute force computes every job it has)."""
    import dataclasses

    return dataclasses.replace(pipeline, jobs={j: pipeline.jobs[j] for j in jobs})


def _shown(client, pipeline, want: dict) -> bool:
    """Whether every (view, key) of `want` answers exactly its line."""
    from views.read import query_view

    for (view, key), line in want.items():
        got = query_view(client, view, key, pipeline=pipeline)
        got.pop("generation", None)
        if got != line:
            return False
    return True


def _until_shown(client, pipeline, want: dict, t0: float, timeout_s: float) -> float | None:
    """Seconds from `t0` until `_shown`, polling every 10 ms; None after `timeout_s`."""
    while not _shown(client, pipeline, want):
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(0.01)
    return time.monotonic() - t0


def _freshness(lake: _Appends, probes: int) -> dict[str, dict]:
    """Per job, append -> every view shows it, with both jobs deployed (see the module docstring)."""
    from bench.freshness import deploy_jobs
    from views.redis_io import connect

    settings, pipeline = lake.settings, lake.settings.pipeline()
    client, now = connect(settings.redis_url), int(time.time() * 1000)
    plan = {(job, k): _probe(job, k, now + k) for job in JOBS for k in range(probes + 1)}
    lake.add([p for before, _ in plan.values() for p in before])
    want = {jk: _expected(pipeline, jk[0], *plan[jk]) for jk in plan}
    lat: dict[str, list] = {job: [] for job in JOBS}
    rng, trigger_s = random.Random(7), settings.trigger_interval_ms / 1000
    stop_jobs = deploy_jobs(settings, JOBS)
    try:
        for k in range(probes + 1):
            for job in JOBS:
                lake.add(plan[(job, k)][1])
                took = _until_shown(client, pipeline, want[(job, k)], time.monotonic(), 300 if k == 0 else 60)
                if k == 0 and took is None:
                    raise TimeoutError(
                        f"deployed {job} did not show its first probe within 300 s (see its log)"
                    )
                if k == 0:
                    say(f"pipelines: {job} deployed, its first probe shown after {took:.1f}s (not counted)")
                else:
                    lat[job].append(took)
                time.sleep(rng.uniform(0, trigger_s))
    finally:
        stop_jobs()
    return {job: _percentiles(lat[job]) for job in JOBS}


def _percentiles(lat: list[float | None]) -> dict:
    seen = sorted(x for x in lat if x is not None)

    def pct(p: float):
        return round(seen[min(len(seen) - 1, int(p * len(seen)))], 3) if seen else None

    return {"probes": len(lat), "shown": len(seen), "p50_s": pct(0.5), "p99_s": pct(0.99), "max_s": pct(1.0)}


def _differs(got, want) -> bool:
    """Whether two export values differ: the same JSON types and values, doubles to a relative 1e-9."""
    if isinstance(want, float):
        return not isinstance(got, float) or not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(want, dict):
        return (
            not isinstance(got, dict)
            or list(got) != list(want)
            or any(_differs(got[k], want[k]) for k in want)
        )
    if isinstance(want, list):
        return not isinstance(got, list) or len(got) != len(want) or any(map(_differs, got, want))
    return type(got) is not type(want) or got != want


def _check(spark, lake: _Appends) -> dict:
    """`mview export` of every view of `JOBS` against the brute force of every record appended, in its batches."""
    from timeline_demo.brute import brute_force
    from views.read import export_view
    from views.redis_io import connect

    settings, pipeline = lake.settings, lake.settings.pipeline()
    want = brute_force(_only(pipeline, JOBS), lake.batches, lateness_ms=settings.allowed_lateness_ms)
    client, lines, wrong = connect(settings.redis_url), 0, {}
    for job in JOBS:
        for view in pipeline.jobs[job].views:
            got = list(
                export_view(client, view.name, lake=settings.lake, spark=lambda: spark, pipeline=pipeline)
            )
            expected = want.export(view.name)
            lines += len(expected)
            bad = [i for i, (g, w) in enumerate(zip(got, expected, strict=False)) if _differs(g, w)]
            if bad or len(got) != len(expected):
                first = bad[0] if bad else min(len(got), len(expected))
                wrong[view.name] = {
                    "lines": len(got),
                    "expected": len(expected),
                    "first_difference": first,
                    "got": got[first] if first < len(got) else None,
                    "want": expected[first] if first < len(expected) else None,
                }
    return {
        "views": sum(len(pipeline.jobs[j].views) for j in JOBS),
        "lines": lines,
        "equal": not wrong,
        "wrong": wrong,
    }


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def _batch_row(res: dict, job: str) -> dict:
    """The job's per-batch times, and its per-record cost at the middle size against the timeline's."""
    f, tl, mid = res["jobs"][job], res["timeline"], str(res["sizes"][1])
    times = ", ".join(f"{int(n):,}: {b['median_s']:g}s" for n, b in f["batches"].items())
    ratio = f["batches"][mid]["per_record_ms"] / tl["batches"][mid]["per_record_ms"]
    goal = GOALS["ratio_to_timeline"] if job == "customer_orders" else None
    return {
        "figure": f"shop {job} per-batch time ({WHAT[job]})",
        "workload": f"shop generator (seed {SEED}), base of {f['base_records']:,} records of the job's topics, then "
        f"{res['repeats']} batches per size",
        "command": f"python -m bench --only pipelines (mview run {job} --once, MVIEW_PIPELINE=shop.yml)",
        "measured": f"{times} (medians); {f['batches'][mid]['per_record_ms']:g} ms/record at {int(mid):,}",
        "reference": f"timeline {tl['batches'][mid]['per_record_ms']:g} ms/record at {int(mid):,} "
        f"({tl['batches'][mid]['median_s']:g}s per batch, same run)",
        "ratio": f"{ratio:.2f}x",
        "goal": f"<= {goal}x the timeline's per-record cost" if goal else "(none set)",
        "met": _met(ratio <= goal if goal else None)
        if res["check"]["equal"]
        else "**not met** (views wrong)",
    }


def _latency_row(res: dict, job: str) -> dict:
    fr, noop = res["jobs"][job]["freshness"], res["jobs"][job]["noop"]
    ok = fr["p50_s"] is not None and fr["shown"] == fr["probes"]
    ok = ok and fr["p50_s"] <= GOALS["p50_s"] and fr["p99_s"] <= GOALS["p99_s"]
    ok = ok and noop["command_seconds"] < GOALS["noop_s"]
    return {
        "figure": f"shop {job} freshness p50 / p99 (append -> every view), no-op run --once",
        "workload": f"{fr['probes']} single-record appends, both shop jobs deployed",
        "command": f"mview deploy customer_orders order_totals; mview run {job} --once (nothing new)",
        "measured": f"{fr['p50_s']} s / {fr['p99_s']} s ({fr['shown']}/{fr['probes']} shown, max {fr['max_s']} s); "
        f"no-op run {noop['command_seconds']}s (command), {noop['in_jvm_seconds']}s (warm JVM)",
        "reference": "",
        "ratio": "",
        "goal": f"p50 <= {GOALS['p50_s']} s, p99 <= {GOALS['p99_s']} s, no-op < {GOALS['noop_s']:g} s",
        "met": _met(ok),
    }


def rows(res: dict) -> list[dict]:
    """Per job, a row of its per-batch times and one of its freshness and no-op run (this table's columns)."""
    return [row(res, job) for job in JOBS for row in (_batch_row, _latency_row)]


def run(scale: float = 1.0, *, tmp: Path, port: int, probes: int = 100) -> dict:
    """Measure the shop's `JOBS` and the timeline's reference (see the module docstring) on scratch lakes under
    `tmp` and databases of the redis-server on `port` (flushed before and after)."""
    from bench.common import scratch_settings
    from jobs.core.spark import get_spark
    from timeline_demo.shop import PIPELINE
    from views.redis_io import connect

    work = tmp / "bench_pipelines"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shop = scratch_settings(
        work / "lake-shop", port, _DB_SHOP, METRICS_PORT="off", MVIEW_PIPELINE=str(PIPELINE)
    )
    builtin = scratch_settings(work / "lake-timeline", port, _DB_TIMELINE, METRICS_PORT="off")
    spark = get_spark(shop, "mview-bench-pipelines")
    sizes, load_before = sizes_at(scale), os.getloadavg()
    clients = [connect(s.redis_url) for s in (shop, builtin)]
    for c in clients:
        c.flushdb()
    try:
        lake, out = _Appends(spark, shop, work), {"jobs": {}}
        records = _shop_records(shop.pipeline(), scale, REPEATS * sum(sizes))
        for job in JOBS:
            out["jobs"][job] = {
                "what": WHAT[job],
                **_timed_batches(spark, lake, job, records[job], sizes, REPEATS),
            }
            out["jobs"][job]["noop"] = _noop(spark, shop, job)
        out["timeline"] = _timeline(spark, builtin, work, scale, sizes[1], REPEATS)
        fresh = _freshness(lake, max(10, int(probes * scale)))
        for job in JOBS:
            out["jobs"][job]["freshness"] = fresh[job]
        out["check"] = _check(spark, lake)
    finally:
        for c in clients:
            c.flushdb()
        shutil.rmtree(work, ignore_errors=True)
    out.update(scale=scale, sizes=sizes, repeats=REPEATS, seed=SEED)
    out["load_average_before"] = [round(x, 1) for x in load_before]
    out["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    out["rows"] = rows(out)
    return out
