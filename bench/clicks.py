"""Benchmark of the `clicks` job: join throughput on about `events` input events, state size per batch, and the
micro-batch latency from an append to the outcome in Redis.

Runs in its own lake (`<LAKE_DIR>/bench_clicks`) and a throw-away view generation (deleted afterwards), so it
never touches the serving views. `python -m bench.clicks --events N` runs it alone.

Workload: `timeline_demo.clicks_workload.write_clicks_topics` builds it in Spark (sessions with 1-4 searches;
clicks inside, on the bounds of, after and before the window; 3% duplicate deliveries; arrival = event time + up
to 9 minutes) and appends it straight to the topic logs, one Delta commit per topic and arrival chunk (ingest's
JSON validation is not what this measures).

Throughput: one `run_clicks(once=True, max_files_per_trigger=1)` processes the `chunks` commits as `chunks`
micro-batches. Reported: input events per second per core (core = one Spark task slot) over the micro-batch
time (`events_per_s_per_core`), over the whole run including the streaming query's start
(`events_per_s_per_core_run`), and per CPU second of the whole process tree (JVM, Python driver and workers:
`events_per_cpu_s`), beside Flink's published Nexmark q8 figure of about 146,000 events/s per core. The result is
checked against a plain Spark SQL evaluation of the contract over the same logs (`verified`).

Latency: a search and a matching click are appended (Delta commits) and the time until `clicked: true` is in
Redis is measured, (a) through a continuous query (`run_clicks(once=False)`, trigger `TRIGGER_INTERVAL`),
giving up after `latency_timeout_s`, and (b) through `run_clicks(once=True)` started right after the append
(query start + one micro-batch: what `mview run clicks --once` costs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import threading
import time

from bench.common import cpu_seconds

__all__ = ["run", "NEXMARK_Q8_PER_CORE"]

NEXMARK_Q8_PER_CORE = 146_000  # Flink, Nexmark q8 (windowed join), events/s per core, published figure


def run_clicks(spark, settings, **kwargs) -> dict:
    """The built-in pipeline's `clicks` job, as `mview run clicks` runs it (its kind's runner)."""
    from jobs.core.registry import job_spec

    return job_spec(settings, "clicks").run(spark, settings, **kwargs)


def _cleanup(client, generation: int) -> None:
    for pattern in (
        f"mv:search_clicks:{generation}:*",
        f"mv:ctr:{generation}:*",
        f"mv:meta:clicks:{generation}",
    ):
        batch = []
        for k in client.scan_iter(match=pattern, count=5000):
            batch.append(k)
            if len(batch) >= 5000:
                client.delete(*batch)
                batch = []
        if batch:
            client.delete(*batch)


def _reference(spark, settings, lateness_ms: int) -> dict:
    """The contract over the whole logs in plain Spark SQL: closed searches and closed clicked searches."""
    from pyspark.sql import functions as F

    from changelog.topics import read_batch
    from timeline_demo.clicks_workload import WINDOW_MS

    lake, pipeline = settings.lake, settings.pipeline()
    s = read_batch(spark, lake, pipeline.topics["searches"]).dropDuplicates(["search_id"])
    c = read_batch(spark, lake, pipeline.topics["clicks"]).dropDuplicates(["click_id"])
    w = s.select("ts").unionByName(c.select("ts")).agg(F.max("ts")).first()[0] - lateness_ms
    closed = s.where(F.col("ts") + WINDOW_MS < w).alias("s")
    hit = closed.join(
        c.alias("c"),
        (F.col("s.session_id") == F.col("c.session_id"))
        & F.col("c.ts").between(F.col("s.ts"), F.col("s.ts") + WINDOW_MS),
        "left_semi",
    ).count()
    return {"searches": closed.count(), "clicked": hit}


def _append(spark, settings, i: int, ts: int) -> str:
    from changelog.topics import topic_path

    lake, pipeline = settings.lake, settings.pipeline()
    sid, sess = f"lat_s{i}", f"lat_sess{i}"
    spark.createDataFrame(
        [(sid, sess, "latency", ts)], "search_id string, session_id string, query string, ts bigint"
    ).write.format("delta").mode("append").save(str(topic_path(lake, pipeline.topics["searches"])))
    spark.createDataFrame(
        [(f"lat_c{i}", sess, "https://x/lat", ts + 1000, None)],
        "click_id string, session_id string, url string, ts bigint, search_id string",
    ).write.format("delta").mode("append").save(str(topic_path(lake, pipeline.topics["clicks"])))
    return sid


def _wait_clicked(client, generation: int, sid: str, started: float, timeout_s: float) -> float | None:
    """Seconds since `started` until the search `sid` is `clicked: true` in `search_clicks` (a row view: its key's
    hash holds `[final, line]` under the search's id), None if not within `timeout_s`."""
    import orjson

    from views.keys import view_key

    key = view_key("search_clicks", generation, sid)
    while time.monotonic() - started < timeout_s:
        v = client.hget(key, sid)
        if v is not None and orjson.loads(v)[1]["clicked"]:
            return time.monotonic() - started
        time.sleep(0.01)
    return None


def _latency_continuous(spark, settings, generation: int, samples: int, timeout_s: float, far: int) -> list:
    """Append -> `clicked: true` in Redis with the job running as a continuous query; None = not seen in time."""

    from views.redis_io import connect

    client = connect(settings.redis_url)
    errors: list[BaseException] = []

    def _job():
        try:
            run_clicks(spark, settings, once=False, generation=generation)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=_job, name="bench-clicks-stream", daemon=True)
    t.start()
    name = f"clicks_g{generation}"
    ready = time.monotonic() + 120
    while time.monotonic() < ready and not errors:
        q = next((q for q in spark.streams.active if q.name == name), None)
        if q is not None and q.lastProgress is not None:
            break
        time.sleep(0.1)
    out: list = []
    try:
        for i in range(samples):
            sid = _append(spark, settings, 100 + i, far + i * 60_000)
            got = _wait_clicked(client, generation, sid, time.monotonic(), timeout_s)
            out.append(got)
            if got is None:
                break  # the query does not see new commits: do not wait again
    finally:
        for q in spark.streams.active:
            if q.name == name:
                q.stop()
        t.join(60)
    if errors:
        raise RuntimeError(f"latency run failed: {errors[0]}")
    return out


def _latency_once(spark, settings, generation: int, samples: int, far: int) -> list[float]:
    """Append -> `clicked: true` in Redis through `run_clicks(once=True)` started right after the append."""

    from views.redis_io import connect

    client = connect(settings.redis_url)
    out = []
    for i in range(samples):
        started = time.monotonic()
        sid = _append(spark, settings, i, far + i * 60_000)
        run_clicks(spark, settings, once=True, generation=generation)
        got = _wait_clicked(client, generation, sid, started, time.monotonic() - started + 5)
        out.append(got)
    return out


def _latencies(spark, settings, generation: int, samples: int, timeout_s: float) -> tuple[list, list]:
    """(`_latency_once`, `_latency_continuous`) with `samples` each, on events later than every workload event."""
    from timeline_demo.clicks_workload import T0

    if not samples:
        return [], []
    far = T0 + 400 * 24 * 3_600_000  # later than every workload event: never late
    once_lat = _latency_once(spark, settings, generation, samples, far)
    return once_lat, _latency_continuous(spark, settings, generation, samples, timeout_s, far + 3_600_000)


def _verify(spark, settings, client, generation: int) -> dict:
    """The clicks and clicked searches of the CTR view in Redis (`generation`) against `_reference`."""
    from views.read import export_view
    from views.redis_io import set_generation

    ref = _reference(spark, settings, settings.allowed_lateness_ms)
    real = client.get("mv:gen:clicks")
    set_generation(client, "clicks", generation)  # the export reads the pointed-to generation
    try:
        rows = list(export_view(client, "ctr"))
    finally:
        if real is None:
            client.delete("mv:gen:clicks")
        else:
            client.set("mv:gen:clicks", real)
    got = {"searches": sum(r["searches"] for r in rows), "clicked": sum(r["clicked"] for r in rows)}
    return {"reference": ref, "redis_ctr": got, "equal": ref == got}


def _rows(
    events: int, chunks: int, n: int, batches: int, rate, once_lat, cont_lat, latency_timeout_s
) -> list[dict]:
    """The two rows of the bench table: throughput per core against Nexmark q8, and the append latency.
    `rate` is (events/s per core, seconds of batches, CPU seconds); `once_lat`, `cont_lat` the latencies
    (None: not seen) after `run --once` and in the continuous query."""
    eps_core, batch_s, cpu_s = rate
    seen = [x for x in cont_lat if x is not None]
    once_seen = [x for x in once_lat if x is not None]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    command = f"python -m bench.clicks --events {events} --chunks {chunks}"
    workload = f"{n:,} events (searches + clicks, 3% duplicates), {batches} micro-batches"
    return [
        {
            "figure": "clicks join events/s per core (micro-batch time)",
            "workload": workload,
            "command": command,
            "measured": f"{eps_core:,.0f}/s/core ({batch_s:.1f}s of batches, {cpu_s:.0f} CPU s; load {load})",
            "reference": f"Flink Nexmark q8 {NEXMARK_Q8_PER_CORE:,}/s/core",
            "ratio": f"{eps_core / NEXMARK_Q8_PER_CORE:.3f}",
            "goal": ">= 0.1",
            "met": "met" if eps_core / NEXMARK_Q8_PER_CORE >= 0.1 else "**not met**",
        },
        {
            "figure": "clicks latency append -> Redis (continuous query)",
            "workload": "1 search + 1 click appended to a running job",
            "command": command,
            "measured": f"median {statistics.median(seen):.2f}s of {len(seen)}"
            if seen
            else f"not seen within {latency_timeout_s:.0f}s",
            "reference": f"`run --once` after the append: {statistics.median(once_seen):.2f}s"
            if once_seen
            else "",
            "ratio": "",
            "goal": "(none set)",
            "met": "n/a",
        },
    ]


def _rate_figures(n: int, cores: int, batch_s: float, run_s: float, cpu_s: float) -> dict:
    """Events per second (of micro-batches, per core, per core of the whole run, per CPU second) and the ratio
    to Nexmark q8 per core; 0 where a time is 0."""
    eps_core = n / batch_s / cores if batch_s else 0.0
    return {
        "events_per_s": round(n / batch_s) if batch_s else 0,
        "events_per_s_per_core": round(eps_core),
        "events_per_s_per_core_run": round(n / run_s / cores) if run_s else 0,
        "events_per_cpu_s": round(n / cpu_s) if cpu_s else 0,
        "nexmark_q8_per_core": NEXMARK_Q8_PER_CORE,
        "ratio_to_nexmark_q8": round(eps_core / NEXMARK_Q8_PER_CORE, 3),
    }


def _latency_figures(once_lat: list, cont_lat: list, timeout_s: float) -> dict:
    """The latencies after `run --once` and in the continuous query (None: not seen) and their medians over
    those seen; a note when the continuous query published none."""
    seen = [x for x in cont_lat if x is not None]
    once_seen = [x for x in once_lat if x is not None]
    return {
        "latency_once_s": [round(x, 3) if x is not None else None for x in once_lat],
        "latency_once_median_s": round(statistics.median(once_seen), 3) if once_seen else None,
        "latency_append_to_redis_s": [round(x, 3) if x is not None else None for x in cont_lat],
        "latency_median_s": round(statistics.median(seen), 3) if seen else None,
        "latency_note": None
        if seen
        else f"the continuous query did not publish an appended click within {timeout_s:.0f} s",
    }


def _run_once(spark, settings, generation: int) -> tuple[dict, float, float]:
    """Run the clicks job once over its topics, one file per micro-batch, into `generation`: its totals, the
    wall seconds and the Spark CPU seconds it took."""
    cpu0, t1 = cpu_seconds(spark), time.monotonic()
    totals = run_clicks(spark, settings, once=True, generation=generation, max_files_per_trigger=1)
    return totals, time.monotonic() - t1, cpu_seconds(spark) - cpu0


def run(
    events: int = 1_000_000,
    *,
    settings,
    chunks: int = 4,
    latency_samples: int = 3,
    latency_timeout_s: float = 30.0,
    verify: bool = True,
) -> dict:
    """Measure the clicks job on about `events` events (see the module docstring). Returns the figures."""
    from jobs.core.runtime import read_status
    from jobs.core.spark import get_spark
    from timeline_demo.clicks_workload import write_clicks_topics
    from views.redis_io import connect

    lake = settings.lake_dir / "bench_clicks"
    shutil.rmtree(lake, ignore_errors=True)
    settings = dataclasses.replace(settings, lake_dir=lake)
    spark = get_spark(settings, "mview-bench-clicks")
    cores = int(spark.sparkContext.defaultParallelism) or os.cpu_count() or 1
    client = connect(settings.redis_url)
    generation = 900_000 + random.randrange(99_999)
    load_before = os.getloadavg()

    t0 = time.monotonic()
    wl = write_clicks_topics(spark, settings.lake, settings.pipeline(), events=events, chunks=chunks)
    write_s = time.monotonic() - t0
    try:
        totals, run_s, cpu_s = _run_once(spark, settings, generation)
        status = read_status(settings, "clicks")
        n, batch_s = totals["events"], totals["seconds"]
        verified = _verify(spark, settings, client, generation) if verify else None
        once_lat, cont_lat = _latencies(spark, settings, generation, latency_samples, latency_timeout_s)
    finally:
        _cleanup(client, generation)
    eps_core = n / batch_s / cores if batch_s else 0.0
    rate = (eps_core, batch_s, cpu_s)
    rows = _rows(events, chunks, n, totals["batches"], rate, once_lat, cont_lat, latency_timeout_s)
    return {
        "rows": rows,
        "events": n,
        "generated_events": wl["events"],
        "chunks": chunks,
        "batches": totals["batches"],
        "cores": cores,
        "load_average_before": [round(x, 1) for x in load_before],
        "load_average_after": [round(x, 1) for x in os.getloadavg()],
        "write_topics_seconds": round(write_s, 2),
        "run_seconds": round(run_s, 2),
        "batch_seconds": round(batch_s, 2),
        "cpu_seconds": round(cpu_s, 1),
        **_rate_figures(n, cores, batch_s, run_s, cpu_s),
        "late": status.get("late"),
        "duplicates": status.get("duplicates"),
        "searches_final": status.get("closed"),
        "state_rows_after_each_batch": totals["state_rows"],
        "verified": verified,
        **_latency_figures(once_lat, cont_lat, latency_timeout_s),
        "trigger_interval": settings.trigger_interval,
    }


def main(argv: list[str] | None = None) -> int:
    from jobs.core.settings import Settings

    p = argparse.ArgumentParser(prog="python -m bench.clicks", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--latency-samples", type=int, default=3)
    p.add_argument("--latency-timeout", type=float, default=30.0)
    p.add_argument("--no-verify", action="store_true")
    args = p.parse_args(argv)
    print(
        json.dumps(
            run(
                args.events,
                settings=Settings.from_env(),
                chunks=args.chunks,
                latency_samples=args.latency_samples,
                latency_timeout_s=args.latency_timeout,
                verify=not args.no_verify,
            ),
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
