"""Benchmark of the `clicks` job: join throughput on about `events` input events, state size per batch, and the
micro-batch latency from an append to the outcome in Redis.

Runs in its own lake (`<LAKE_DIR>/bench_clicks`) and its own view generation (cleaned up afterwards), so it
never touches the serving views. `python -m timeline_demo.bench_clicks --events N` runs it alone.

Throughput: the workload (sessions with several searches, clicks inside/outside/before the window, duplicates,
arrival shuffled within the lateness) is ingested in `chunks` pieces; after each, `run_clicks(once=True)`
processes it. Reported: input events / seconds of the job (`run_clicks` wall time, query start included), per
core (`spark.default.parallelism` cores of local[*]), against Flink's published Nexmark q8 figure of about
146,000 events/s per core. Latency: the job runs as a continuous query (trigger `TRIGGER_INTERVAL`); a search and
a matching click are appended; the time from the click's append (its Delta commit) to `clicked: true` in
Redis is measured a few times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import threading
import time

import orjson

__all__ = ["run", "NEXMARK_Q8_PER_CORE"]

NEXMARK_Q8_PER_CORE = 146_000  # Flink, Nexmark q8 (windowed join), events/s per core, published figure


def _write(path, records) -> str:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def _even_pieces(arrivals, chunks: int) -> list[dict[str, list[dict]]]:
    """Cut the arrival order into `chunks` consecutive pieces of equal size: [{topic: records}]."""
    size = -(-len(arrivals) // chunks)
    out = []
    for i in range(0, len(arrivals), size):
        piece: dict[str, list[dict]] = {"searches": [], "clicks": []}
        for topic, r in arrivals[i : i + size]:
            piece[topic].append(r)
        out.append(piece)
    return out


def _cleanup(client, generation: int) -> None:
    for view in ("search_clicks", "ctr"):
        batch = []
        for k in client.scan_iter(match=f"mv:{view}:{generation}:*", count=5000):
            batch.append(k)
            if len(batch) >= 5000:
                client.delete(*batch)
                batch = []
        if batch:
            client.delete(*batch)


def _latency(spark, settings, generation: int, samples: int) -> list[float]:
    from changelog.ingest import ingest
    from jobs.clicks import run_clicks
    from timeline_demo.workload import T0
    from views.clicks import search_clicks_key
    from views.redis_io import connect

    client = connect(settings.redis_url)
    tmp = settings.lake_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    errors: list[BaseException] = []

    def _job():
        try:
            run_clicks(spark, settings, once=False, generation=generation)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=_job, name="bench-clicks-stream", daemon=True)
    t.start()
    # Wait until the query runs (its first trigger has reported progress) before appending.
    name = f"clicks_g{generation}"
    ready = time.monotonic() + 600
    while time.monotonic() < ready and not errors:
        q = next((q for q in spark.streams.active if q.name == name), None)
        if q is not None and q.lastProgress is not None:
            break
        time.sleep(0.2)
    out = []
    far = T0 + 400 * 24 * 3_600_000  # later than every workload event: never late
    try:
        for i in range(samples):
            ts = far + i * 60_000
            sid, sess = f"lat_s{i}", f"lat_sess{i}"
            s = {"search_id": sid, "session_id": sess, "query": "latency", "ts": ts}
            c = {"click_id": f"lat_c{i}", "session_id": sess, "url": "https://x/lat", "ts": ts + 1000}
            ingest(spark, settings.lake_dir, "searches", [_write(tmp / f"lat_s{i}.jsonl", [s])])
            ingest(spark, settings.lake_dir, "clicks", [_write(tmp / f"lat_c{i}.jsonl", [c])])
            appended = time.monotonic()
            key = search_clicks_key(generation, sid)
            deadline = appended + 600
            while time.monotonic() < deadline and not errors:
                v = client.hget(key, "v")
                if v is not None and orjson.loads(v)["clicked"]:
                    out.append(time.monotonic() - appended)
                    break
                time.sleep(0.01)
    finally:
        for q in spark.streams.active:
            if q.name == name:
                q.stop()
        t.join(60)
    if errors:
        raise RuntimeError(f"latency run failed: {errors[0]}")
    return out


def run(events: int = 1_000_000, *, settings, chunks: int = 4, latency_samples: int = 3) -> dict:
    """Measure the clicks job on about `events` events (see the module docstring). Returns the figures."""
    from changelog.ingest import ingest
    from jobs.clicks import run_clicks
    from jobs.runtime import read_status
    from jobs.spark import get_spark
    from timeline_demo.clicks_workload import generate_clicks
    from views.redis_io import connect

    lake = settings.lake_dir / "bench_clicks"
    if lake.exists():
        import shutil

        shutil.rmtree(lake)
    settings = dataclasses.replace(settings, lake_dir=lake)
    (lake / "tmp").mkdir(parents=True, exist_ok=True)
    spark = get_spark(settings, "mview-bench-clicks")
    cores = int(spark.sparkContext.defaultParallelism) or os.cpu_count() or 1
    client = connect(settings.redis_url)
    generation = 900_000 + random.randrange(99_999)

    started = time.monotonic()
    sessions = max(1, int(events / 6.6))
    wl = generate_clicks(seed=42, sessions=sessions, span_ms=max(6, sessions // 2_000) * 3_600_000)
    gen_s = time.monotonic() - started
    pieces = _even_pieces(wl.arrivals, chunks)
    ingest_s = job_s = batch_s = 0.0
    state_rows, per_chunk = [], []
    try:
        for i, piece in enumerate(pieces):
            t0 = time.monotonic()
            for topic in ("searches", "clicks"):
                if piece[topic]:
                    ingest(spark, lake, topic, [_write(lake / "tmp" / f"{topic}_{i}.jsonl", piece[topic])])
            t1 = time.monotonic()
            totals = run_clicks(spark, settings, once=True, generation=generation)
            t2 = time.monotonic()
            ingest_s += t1 - t0
            job_s += t2 - t1
            batch_s += totals["seconds"]
            st = read_status(settings, "clicks")
            state_rows.append(st.get("state_rows"))
            per_chunk.append({"events": totals["events"], "job_seconds": round(t2 - t1, 2)})
        latencies = _latency(spark, settings, generation, latency_samples) if latency_samples else []
    finally:
        _cleanup(client, generation)
    n = wl.events
    eps = n / job_s if job_s else 0.0
    result = {
        "events": n,
        "chunks": chunks,
        "cores": cores,
        "generate_seconds": round(gen_s, 2),
        "ingest_seconds": round(ingest_s, 2),
        "job_seconds": round(job_s, 2),
        "batch_seconds": round(batch_s, 2),
        "events_per_s": round(eps),
        "events_per_s_per_core": round(eps / cores),
        "events_per_s_per_core_batches_only": round(n / batch_s / cores) if batch_s else 0,
        "nexmark_q8_per_core": NEXMARK_Q8_PER_CORE,
        "ratio_to_nexmark_q8": round(eps / cores / NEXMARK_Q8_PER_CORE, 3),
        "state_rows_after_each_chunk": state_rows,
        "per_chunk": per_chunk,
        "latency_append_to_redis_s": [round(x, 3) for x in latencies],
        "latency_median_s": round(statistics.median(latencies), 3) if latencies else None,
        "trigger_interval": settings.trigger_interval,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    from jobs.settings import Settings

    p = argparse.ArgumentParser(
        prog="python -m timeline_demo.bench_clicks", description=__doc__.splitlines()[0]
    )
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--latency-samples", type=int, default=3)
    args = p.parse_args(argv)
    print(
        json.dumps(
            run(
                args.events,
                settings=Settings.from_env(),
                chunks=args.chunks,
                latency_samples=args.latency_samples,
            ),
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
