"""The `peers` bench part (issue #43): the same work done by our jobs and by a peer, on the same events and the same
machine, throughput and final results side by side.

Nexmark against Apache Flink: `events` Nexmark events (`timeline_demo.nexmark.write_nexmark`, seed `SEED`, times
epoch ms) are written once as JSON lines, one file per event kind. Flink runs Nexmark's own SQL of every query but
q6 and q12 on a local mini cluster of `cores` task slots, reading those files (`bench/flink_side.py`, in the
virtual environment of `make peers-setup`, as a subprocess; skipped, with one line saying how to get it, when that
environment is missing). Ours: the files are ingested into a scratch lake (`mview ingest`'s code, not timed) and
each query's jobs of `timeline_demo/pipelines/nexmark.yml` (`timeline_demo.nexmark_sql.QUERIES`, in chain order)
run `--once` in the bench's JVM after an untimed warm-up of every job over `warmup_events` events of their own
(`bench.nexmark`'s helpers). Both sides read pre-split topics (one file, or one log, per event kind; Flink's
source tasks each read a share of each file), and both count all `events` generated Nexmark events for every
query, as Flink's Nexmark does, whatever part of them the query reads. Per query:
- ours: events / (the sum of its jobs' micro-batch seconds x cores);
- Flink: events / (the job's net runtime x parallelism): from its submission to the mini cluster to its end, in
  a JVM that has run the query once (its collecting run); the seconds with planning and the job's mini cluster
  start are beside it;
- agree: our views' export lines as Nexmark's result rows (`nexmark_sql.result`) against the final contents of
  Flink's untimed collecting run (`nexmark_sql.differences`: multisets, floats within 1e-9, the columns a tie
  may choose left out): yes, no (with the first differences), or n.a. (one side missing or failed).

Clicks against Spark's own stream-stream join: `clicks_events` events of the `clicks` workload
(`timeline_demo.clicks_workload.write_clicks_topics`, 4 arrival chunks, one Delta commit per topic and chunk) in a
scratch lake. Ours: the built-in `clicks` job, `run --once` one commit per micro-batch, as `bench.clicks` times it
(events read / (micro-batch seconds x cores)). Spark's: two streams of the same Delta logs (one commit per
micro-batch), `withWatermark` on each (ALLOWED_LATENESS), a `leftOuter` join on the session and
`click.time BETWEEN search.time AND search.time + 1 hour` into a Parquet sink, `trigger(availableNow=True)`, in
the same Spark session; its seconds are the micro-batches' `addBatch` time (what our micro-batch seconds are: the
batch's own work, not the source's planning). They agree when the searches with a click are the same set and the
searches without one, among those closed under both final watermarks (search time + 1 hour before both), too.

`python -m bench.peers --events N [--clicks-events M] [--queries q0 q3 ...] [--out FILE]` runs it alone (a scratch lake and a
redis-server of its own) and prints JSON; `python -m bench --only peers` as a part of the bench.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from bench.common import ROOT, cpu_seconds, say

__all__ = ["run", "flink_python", "PEERS_VENV", "SEED", "SETUP"]

PEERS_VENV = ROOT / ".venv-peers"
FLINK_SIDE = ROOT / "bench" / "flink_side.py"
SEED = 42
SETUP = f"Flink skipped: `make peers-setup` installs it (PyFlink, the `peers` extra) into {PEERS_VENV.name}/"
_FLINK_TIMEOUT_S = 3_600


def flink_python() -> Path | None:
    """The interpreter of `make peers-setup`'s environment, None when it is not there."""
    py = PEERS_VENV / "bin" / "python"
    return py if py.exists() else None


def _queries(wanted: list[str] | None) -> list[str]:
    """The queries both sides have (Flink's that our pipeline declares), in number order, or those of `wanted`."""
    from bench.flink_side import QUERIES as FLINK
    from timeline_demo.nexmark_sql import QUERIES as OURS

    return [q for q in FLINK if q in OURS and (not wanted or q in wanted)]


def _flink(data: Path, work: Path, queries: list[str], parallelism: int) -> dict:
    """Flink's figures (`bench/flink_side.py`'s) with its rows under `work/flink-rows`, or why there are none."""
    py = flink_python()
    if py is None:
        say(f"peers: {SETUP}")
        return {"available": False, "note": SETUP}
    out, rows = work / "flink.json", work / "flink-rows"
    cmd = [str(py), str(FLINK_SIDE), "--data", str(data), "--out", str(out), "--results", str(rows)]
    cmd += ["--queries", ",".join(queries), "--parallelism", str(parallelism)]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_FLINK_TIMEOUT_S, cwd=work)
    if proc.returncode != 0 or not out.exists():
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {"available": True, "error": f"bench/flink_side.py exited {proc.returncode}: {tail[-600:]}"}
    figures = json.loads(out.read_text())
    figures.update(available=True, process_seconds=round(time.monotonic() - started, 1), rows_dir=str(rows))
    return figures


def _ours(spark, settings, client, query: str, events: int, cores: int) -> dict:
    """Run the query's jobs once each, in chain order; their figures and the query's events/s/core."""
    from bench.nexmark import run_job
    from timeline_demo.nexmark_sql import QUERIES

    jobs = [run_job(spark, settings, client, job, events, cores) for job in QUERIES[query].jobs]
    batch_s = sum(float(j["totals"]["seconds"]) for j in jobs)
    return {
        "jobs": [{k: v for k, v in j.items() if k != "totals"} for j in jobs],
        "batch_seconds": round(batch_s, 2),
        "run_seconds": round(sum(j["run_seconds"] for j in jobs), 2),
        "events_per_s_per_core": round(events / batch_s / cores) if batch_s else 0,
    }


def _bids(path: Path) -> dict[str, dict]:
    """The bids of the file by `bid_id` (a list view's entries name them)."""
    out = {}
    with open(path, "rb") as f:
        for line in f:
            rec = json.loads(line)
            out[rec["bid_id"]] = rec
    return out


def _agree(spark, settings, client, query: str, flink: dict, bids) -> dict:
    """Our views' final contents of the query against Flink's (module docstring)."""
    from jobs.core.registry import job_spec
    from timeline_demo.nexmark_sql import QUERIES, differences, result
    from views.read import export_view

    path = Path(flink.get("rows_dir", "")) / f"{query}.json"
    if not flink.get("available") or "error" in flink.get("queries", {}).get(query, {}) or not path.is_file():
        return {"agree": None}
    pipeline = settings.pipeline()
    views = [v for job in QUERIES[query].jobs for v in job_spec(settings, job).views]
    exports = {
        v: list(export_view(client, v, lake=settings.lake, spark=lambda: spark, pipeline=pipeline))
        for v in views
    }
    got = result(query, exports, bids() if query in ("q18", "q19") else None)
    want = json.loads(path.read_text())
    diffs = differences(query, got, want)
    return {"agree": not diffs, "rows": len(got), "flink_rows": len(want), "differences": len(diffs)} | (
        {"first_differences": diffs[:5]} if diffs else {}
    )


def _flink_figures(flink: dict, query: str, events: int) -> dict:
    """Flink's figures of one query and its events/s/core (net runtime), or its error."""
    f = dict(flink.get("queries", {}).get(query) or {})
    if "net_seconds" in f and f["net_seconds"]:
        f["events_per_s_per_core"] = round(events / f["net_seconds"] / flink["parallelism"])
    return f


def _query_row(ours: dict, flink: dict, agree: dict) -> dict:
    out = {"ours": ours, "flink": flink, **agree}
    a, b = ours.get("events_per_s_per_core"), flink.get("events_per_s_per_core")
    out["ratio"] = round(a / b, 3) if a and b else None
    return out


# long: one query after another, each failure kept to its query, then the common figures
def _nexmark(spark, settings, work: Path, events: int, cores: int, queries: list[str], warmup: int) -> dict:
    """Flink's run, then ours, then the comparison, per query (module docstring)."""
    from bench.nexmark import ingest_files, warm_up
    from timeline_demo.nexmark import write_nexmark
    from timeline_demo.nexmark_sql import QUERIES
    from views.redis_io import connect

    data = work / "files"
    made = write_nexmark(
        data, events=events, seed=SEED, iso_ratio=0.0, lateness_ms=settings.allowed_lateness_ms
    )
    say(f"peers: {events:,} Nexmark events written; Flink runs {len(queries)} queries")
    flink = _flink(data, work, queries, cores)
    client = connect(settings.redis_url)
    client.flushdb()
    jobs = [job for q in queries for job in QUERIES[q].jobs]
    warm_s = warm_up(spark, settings, work, warmup, jobs=jobs) if warmup else 0.0
    t0 = time.monotonic()
    ingested = ingest_files(settings, made["files"])
    ingest_s = time.monotonic() - t0
    cached: dict = {}

    def bids():
        if "bids" not in cached:
            cached["bids"] = _bids(data / "bids.jsonl")
        return cached["bids"]

    out = {}
    for q in queries:
        try:
            ours = _ours(spark, settings, client, q, events, cores)
        except Exception as e:  # noqa: BLE001 - one query's failure must not lose the others
            ours = {"error": f"{type(e).__name__}: {e}"[:600]}
        try:
            agree = (
                _agree(spark, settings, client, q, flink, bids) if "error" not in ours else {"agree": None}
            )
        except Exception as e:  # noqa: BLE001
            agree = {"agree": None, "agree_error": f"{type(e).__name__}: {e}"[:600]}
        out[q] = _query_row(ours, _flink_figures(flink, q, events), agree)
        say(
            f"peers {q}: ours {ours.get('events_per_s_per_core')}/s/core, flink "
            f"{out[q]['flink'].get('events_per_s_per_core')}/s/core, agree {out[q]['agree']}"
        )
    return {
        "events": events,
        "seed": SEED,
        "generated": made["counts"],
        "records_ingested": ingested,
        "warmup_events": warmup,
        "warmup_seconds": round(warm_s, 1),
        "ingest_seconds": round(ingest_s, 1),
        "flink": {k: v for k, v in flink.items() if k not in ("queries", "rows_dir")},
        "queries": out,
    }


def _progress(query) -> list[dict]:
    """The streaming query's progress reports as dicts (pyspark gives objects or dicts, by version)."""
    out = []
    for p in query.recentProgress:
        out.append(p if isinstance(p, dict) else json.loads(p.json))
    return out


def _spark_join(spark, settings, path: Path) -> dict:
    """Spark's own stream-stream left outer join of the clicks topics (module docstring): its figures."""
    from pyspark.sql import functions as F

    from changelog.topics import read_stream

    lake, topics, lateness = (
        settings.lake,
        settings.pipeline().topics,
        f"{settings.allowed_lateness_ms} milliseconds",
    )
    s = read_stream(spark, lake, topics["searches"], max_files_per_trigger=1).select(
        "search_id", "session_id", "ts", F.timestamp_millis("ts").alias("s_time")
    )
    c = read_stream(spark, lake, topics["clicks"], max_files_per_trigger=1).select(
        F.col("session_id").alias("c_session"), "click_id", F.timestamp_millis("ts").alias("c_time")
    )
    joined = s.withWatermark("s_time", lateness).join(
        c.withWatermark("c_time", lateness),
        F.expr("session_id = c_session AND c_time BETWEEN s_time AND s_time + INTERVAL 1 HOUR"),
        "leftOuter",
    )
    cpu0, t0 = cpu_seconds(spark), time.monotonic()
    query = (
        joined.select("search_id", "ts", "click_id")
        .writeStream.format("parquet")
        .option("path", str(path / "out"))
        .option("checkpointLocation", str(path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    run_s, cpu_s = time.monotonic() - t0, cpu_seconds(spark) - cpu0
    progress = _progress(query)
    data = [p for p in progress if p.get("numInputRows")]
    watermark = next(
        (p["eventTime"].get("watermark") for p in reversed(progress) if p.get("eventTime")), None
    )
    return {
        "batches": len(data),
        "micro_batches": len(progress),
        "events": sum(int(p["numInputRows"]) for p in progress),
        "batch_seconds": round(sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000, 2),
        "trigger_seconds": round(sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000, 2),
        "run_seconds": round(run_s, 2),
        "cpu_seconds": round(cpu_s, 1),
        "final_watermark": watermark,
    }


def _spark_sets(spark, path: Path) -> tuple[set, dict]:
    """(searches with a click, {search without one: its ts}) of the Spark join's output."""
    from pyspark.sql import functions as F

    out = spark.read.parquet(str(path / "out"))
    clicked = {
        r[0] for r in out.where(F.col("click_id").isNotNull()).select("search_id").distinct().collect()
    }
    unmatched = out.where(F.col("click_id").isNull()).select("search_id", "ts").distinct().collect()
    return clicked, {r[0]: int(r[1]) for r in unmatched}


def _newest(spark, settings) -> int:
    """The greatest event time of the searches and clicks logs."""
    from pyspark.sql import functions as F

    from changelog.topics import read_batch

    topics = settings.pipeline().topics
    return max(
        int(read_batch(spark, settings.lake, topics[t]).agg(F.max("ts")).first()[0])
        for t in ("searches", "clicks")
    )


def _ms(iso: str | None) -> int | None:
    from datetime import datetime

    return None if not iso else round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _compare_clicks(
    lines: list[dict], spark_clicked: set, spark_not: dict, closed_before: int | None
) -> dict:
    """Our `search_clicks` lines against Spark's sets: the clicked searches, and those without a click closed
    under both watermarks (search time + 1 hour < `closed_before`)."""
    from timeline_demo.clicks_workload import WINDOW_MS

    ours_clicked = {x["search_id"] for x in lines if x["clicked"]}
    ours_not = {x["search_id"]: int(x["ts"]) for x in lines if not x["clicked"]}

    def closed(d: dict) -> set:
        return {k for k, ts in d.items() if closed_before is not None and ts + WINDOW_MS < closed_before}

    a, b = closed(ours_not), closed(spark_not)
    return {
        "agree": ours_clicked == spark_clicked and a == b,
        "clicked": {
            "ours": len(ours_clicked),
            "spark": len(spark_clicked),
            "differ": len(ours_clicked ^ spark_clicked),
        },
        "not_clicked": {
            "ours": len(ours_not),
            "spark": len(spark_not),
            "compared_ours": len(a),
            "compared_spark": len(b),
            "differ": len(a ^ b),
        },
    }


# long: the workload, our job, Spark's join and the comparison, in order, in one scratch lake
def _clicks(spark, settings, events: int, cores: int) -> dict:
    """Our clicks job and Spark's own join over the same topics (module docstring)."""
    from bench.clicks import run_clicks
    from timeline_demo.clicks_workload import write_clicks_topics
    from views.read import export_view
    from views.redis_io import connect

    lake = settings.lake_dir / "bench_peers_clicks"
    shutil.rmtree(lake, ignore_errors=True)
    settings = dataclasses.replace(settings, lake_dir=lake, metrics_port=None)
    client = connect(settings.redis_url)
    client.flushdb()
    try:
        wl = write_clicks_topics(spark, settings.lake, settings.pipeline(), events=events, chunks=4)
        cpu0, t0 = cpu_seconds(spark), time.monotonic()
        totals = run_clicks(spark, settings, once=True, max_files_per_trigger=1)
        run_s, cpu_s = time.monotonic() - t0, cpu_seconds(spark) - cpu0
        lines = list(export_view(client, "search_clicks", pipeline=settings.pipeline()))
        ours_w = _newest(spark, settings) - settings.allowed_lateness_ms  # our final watermark
        theirs = _spark_join(spark, settings, lake / "spark_join")
        spark_clicked, spark_not = _spark_sets(spark, lake / "spark_join")
    finally:
        client.flushdb()
        shutil.rmtree(lake, ignore_errors=True)
    n, batch_s = int(totals["events"]), float(totals["seconds"])
    ours = {
        "events": n,
        "batches": totals["batches"],
        "batch_seconds": round(batch_s, 2),
        "run_seconds": round(run_s, 2),
        "cpu_seconds": round(cpu_s, 1),
        "events_per_s_per_core": round(n / batch_s / cores) if batch_s else 0,
    }
    s_batch = theirs["batch_seconds"]
    theirs["events_per_s_per_core"] = round(theirs["events"] / s_batch / cores) if s_batch else 0
    spark_w = _ms(theirs["final_watermark"])
    closed_before = min(ours_w, spark_w) if spark_w is not None else None
    cmp = _compare_clicks(lines, spark_clicked, spark_not, closed_before)
    a, b = ours["events_per_s_per_core"], theirs["events_per_s_per_core"]
    return {
        "generated_events": wl["events"],
        "ours": ours,
        "spark": theirs,
        "ratio": round(a / b, 3) if a and b else None,
        "closed_before": closed_before,
        **cmp,
    }


def run(
    events: int = 200_000,
    *,
    settings,
    clicks_events: int = 1_000_000,
    warmup_events: int = 10_000,
    queries: list[str] | None = None,
) -> dict:
    """The part's figures (module docstring). The settings' lake gets directories of its own (removed afterwards);
    their Redis database is flushed before and after each half."""
    from jobs.core.spark import get_spark
    from timeline_demo.nexmark import PIPELINE
    from views.redis_io import connect

    spark = get_spark(settings, "mview-bench-peers")
    cores = int(spark.sparkContext.defaultParallelism) or os.cpu_count() or 1
    work = settings.lake_dir / "bench_peers"
    shutil.rmtree(work, ignore_errors=True)
    nx = dataclasses.replace(settings, lake_dir=work / "lake", pipeline_file=PIPELINE, metrics_port=None)
    load_before = os.getloadavg()
    try:
        nexmark = _nexmark(spark, nx, work, events, cores, _queries(queries), warmup_events)
    except Exception as e:  # noqa: BLE001 - the clicks half still runs
        nexmark = {"error": f"{type(e).__name__}: {e}"[:600]}
    finally:
        connect(settings.redis_url).flushdb()
        shutil.rmtree(work, ignore_errors=True)
    try:
        clicks = _clicks(spark, settings, clicks_events, cores) if clicks_events else None
    except Exception as e:  # noqa: BLE001
        clicks = {"error": f"{type(e).__name__}: {e}"[:600]}
    return {
        "cores": cores,
        "counted": "both sides read pre-split topics (one file or log per event kind); every query counts all the "
        "generated Nexmark events, as Flink's Nexmark does",
        "nexmark": nexmark,
        "clicks": clicks,
        "load_average_before": [round(x, 1) for x in load_before],
        "load_average_after": [round(x, 1) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from bench.common import scratch_settings, start_redis

    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000, help="Nexmark events")
    p.add_argument("--clicks-events", type=int, default=1_000_000, help="clicks workload events (0: none)")
    p.add_argument("--warmup-events", type=int, default=10_000, help="our jobs' untimed warm-up (0: none)")
    p.add_argument("--queries", nargs="*", default=None, help="only these Nexmark queries")
    p.add_argument(
        "--out", default=None, help="write the JSON there (default: printed after the progress lines)"
    )
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mview-bench-peers-"))
    proc, port = start_redis(tmp)
    try:
        settings = scratch_settings(tmp / "lake", port)
        res = run(
            args.events,
            settings=settings,
            clicks_events=args.clicks_events,
            warmup_events=args.warmup_events,
            queries=args.queries,
        )
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    else:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
