"""The `clicks` job: searches x clicks, a stream-stream interval join within one hour -> `search_clicks`, `ctr`.

A search is joined with every click of its `session_id` whose `ts` is in `[search.ts, search.ts + 1 hour]`
(`joins.interval`, `how="left"`). Per micro-batch (one *step*):
1. The watermark at the start of the batch, W0, is the job's: max event time seen so far on *either* topic
   minus `ALLOWED_LATENESS` (kept in the job's state, not Spark's per-stream minimum). A record with
   `ts < W0` is late: it is dropped from the join, written to `LAKE_DIR/jobs/clicks/late/g<g>/<batch>.jsonl`
   with the reason, and counted (`late` in `mview status`).
2. The watermark after the batch, W1 = max(W0, max ts of the batch's non-late records - lateness).
3. The join publishes each search that got new clicks (`clicked: true` with the clicks so far) and, once its
   window has closed under W1 (`ts + 1 hour < W1`), its final record, and adds it to `ctr` of its query, exactly
   once. A search is never published with `clicked: false` before its window has closed. Closing under W1
   within the same batch means `run clicks --once` leaves every search whose window closed under the final
   watermark published, with no extra empty batch.
4. Redis is written first (fenced, see `views.clicks`), then the new state version is committed. A crash in
   between replays the batch from the same state version: same outcome, nothing counted twice.

Duplicates (same `search_id` / `click_id`) count once (see `joins.interval`). State is one Parquet snapshot per
step under `LAKE_DIR/state/clicks/g<g>/v<fence>/`, holding only open searches and clicks that may still match,
so it stays flat as event time advances.

Idle streams: with `CLICKS_IDLE_TIMEOUT` set, when no record has arrived for that long (processing time), the
watermark advances with the wall clock: W = max event time - lateness + (now - time of the last arrival), and
windows that close under it are published (`close_idle_windows`). A deployed job checks this every trigger
interval; `run --once` checks once at the end. Off by default: then "not clicked" waits for newer events.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import orjson
from pyspark.sql import Observation
from pyspark.sql import functions as F

from changelog.ingest import deadletter_path
from changelog.topics import read_stream
from jobs.generations import record_batch
from jobs.replay import serving_or_rebuild
from jobs.runtime import (
    checkpoint_dir,
    job_dir,
    log,
    log_sources,
    process_cpu,
    run_stream,
    state_dir,
    write_status,
)
from jobs.settings import Settings
from joins.interval import MATCHES, MIN_WATERMARK, JoinSide, batch_constant, interval_join
from views.clicks import CLICKS_OPS_SCHEMA, ClicksSink
from views.redis_io import connect

__all__ = ["run_clicks", "close_idle_windows", "TOPICS", "WINDOW_MS"]

JOB = "clicks"
TOPICS = ("searches", "clicks")
WINDOW_MS = 3_600_000
FENCE_STEP = 1_000_000  # fence of batch b = b * FENCE_STEP; idle ticks after it: + 1, + 2, ...
_STATE_SCHEMA = "side string, id string, session_id string, text string, ts bigint, _matches bigint"
_LOCK = threading.Lock()  # one step at a time: a micro-batch or an idle tick

_INITIAL_META = {
    "watermark": MIN_WATERMARK,
    "max_ts": None,
    "last_event_ms": None,
    "late": 0,
    "duplicates": 0,
    "searches_final": 0,
    "held": 0,
    "state_rows": 0,
}


class _Phases:
    """Wall time, JVM CPU time (driver + local executors; local mode only) and Python worker CPU time (the JVM's
    descendant processes: the sink's workers) of the phases of one step, and the number of generated-code
    compilations, for the batch log line."""

    def __init__(self, spark):
        self._cpu = lambda: (float("nan"), float("nan"))
        # local mode: the JVM started by this driver runs the executors too
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        if proc is not None:

            def cpu() -> tuple[float, float]:
                try:
                    return process_cpu(proc.pid)
                except (OSError, IndexError, ValueError):
                    return float("nan"), float("nan")

            self._cpu = cpu
        try:
            hist = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
            self._compiles = hist.getCount
            self._compiles()
        except Exception:  # noqa: BLE001
            self._compiles = lambda: 0
        self.marks: list[tuple[str, float, float, float]] = []
        self._t, self._c, self._n = time.monotonic(), self._cpu(), self._compiles()
        self._k = self._n

    def mark(self, name: str) -> None:
        t, c, k = time.monotonic(), self._cpu(), self._compiles()
        self.marks.append((name, t - self._t, c[0] - self._c[0], c[1] - self._c[1], k - self._k))
        self._t, self._c, self._k = t, c, k

    def __str__(self) -> str:
        parts = ", ".join(f"{n} {w:.2f}s/{c:.2f}cpu/{p:.2f}py/{k}cc" for n, w, c, p, k in self.marks)
        return f"{parts}; {self._compiles() - self._n} code compilations (cc)"


class _Store:
    """State versions `v<fence>/` each with `state/` (Parquet, `_STATE_SCHEMA`) and `meta.json` (written last:
    a version without it does not exist)."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _dir(self, fence: int) -> Path:
        return self.root / f"v{fence:020d}"

    def versions(self) -> list[int]:
        return sorted(
            int(p.name[1:])
            for p in self.root.iterdir()
            if p.name.startswith("v") and (p / "meta.json").exists()
        )

    def latest(self, below: int | None = None) -> tuple[int | None, dict]:
        vs = [v for v in self.versions() if below is None or v < below]
        if not vs:
            return None, dict(_INITIAL_META)
        return vs[-1], json.loads((self._dir(vs[-1]) / "meta.json").read_text())

    def read(self, spark, fence: int | None):
        """(searches state, clicks state) of version `fence`, or (None, None) before the first step."""
        if fence is None:
            return None, None
        df = spark.read.schema(_STATE_SCHEMA).parquet(str(self._dir(fence) / "state"))
        left = df.where(F.col("side") == "s").select(
            F.col("id").alias("search_id"), "session_id", F.col("text").alias("query"), "ts", MATCHES
        )
        right = df.where(F.col("side") == "c").select(
            F.col("id").alias("click_id"), "session_id", F.col("text").alias("url"), "ts", MATCHES
        )
        return left, right

    def write(self, fence: int, left_state, right_state) -> None:
        """Write the state of version `fence`; the version exists once `rewrite_meta` wrote its meta."""
        d = self._dir(fence)
        (d / "meta.json").unlink(missing_ok=True)
        state = left_state.select(
            F.lit("s").alias("side"),
            F.col("search_id").alias("id"),
            "session_id",
            F.col("query").alias("text"),
            "ts",
            MATCHES,
        ).unionByName(
            right_state.select(
                F.lit("c").alias("side"),
                F.col("click_id").alias("id"),
                "session_id",
                F.col("url").alias("text"),
                "ts",
                MATCHES,
            )
        )
        state.coalesce(1).write.mode("overwrite").parquet(str(d / "state"))

    def rewrite_meta(self, fence: int, meta: dict) -> None:
        tmp = self._dir(fence) / "meta.tmp"
        tmp.write_text(json.dumps(meta))
        tmp.replace(self._dir(fence) / "meta.json")

    def prune(self, below: int | None) -> None:
        """Drop versions older than `below` (the base of the last batch: a replay of it still finds its base)."""
        if below is None:
            return
        for p in self.root.iterdir():
            if p.name.startswith("v") and p.name[1:].isdigit() and int(p.name[1:]) < below:
                shutil.rmtree(p, ignore_errors=True)


def _source(spark, settings: Settings, max_files_per_trigger: int | None):
    s = read_stream(spark, settings.lake_dir, "searches", max_files_per_trigger=max_files_per_trigger)
    c = read_stream(spark, settings.lake_dir, "clicks", max_files_per_trigger=max_files_per_trigger)
    return s.select(
        F.lit("searches").alias("topic"),
        F.col("search_id").alias("id"),
        "session_id",
        F.col("query").alias("text"),
        "ts",
    ).unionByName(
        c.select(
            F.lit("clicks").alias("topic"),
            F.col("click_id").alias("id"),
            "session_id",
            F.col("url").alias("text"),
            "ts",
        )
    )


def _sides(batch):
    searches = batch.where(F.col("topic") == "searches").select(
        F.col("id").alias("search_id"), "session_id", F.col("text").alias("query"), "ts"
    )
    clicks = batch.where(F.col("topic") == "clicks").select(
        F.col("id").alias("click_id"), "session_id", F.col("text").alias("url"), "ts"
    )
    return searches, clicks


def _ops(left):
    """Sink operations (`CLICKS_OPS_SCHEMA`) from the searches after a step."""
    body = F.to_json(
        F.struct(
            "search_id",
            "session_id",
            "query",
            "ts",
            (F.col(MATCHES) > 0).alias("clicked"),
            F.col(MATCHES).alias("clicks"),
        )
    )
    null_l = F.lit(None).cast("bigint")
    records = left.where(F.col("_changed") | F.col("_closed")).select(
        F.lit("search").alias("kind"),
        F.col("search_id").alias("key"),
        body.alias("body"),
        F.col("_closed").alias("final"),
        null_l.alias("d_searches"),
        null_l.alias("d_clicked"),
    )
    ctr = (
        left.where(F.col("_closed"))
        .groupBy("query")
        .agg(F.count("*").alias("d_searches"), F.sum((F.col(MATCHES) > 0).cast("bigint")).alias("d_clicked"))
        .select(
            F.lit("ctr").alias("kind"),
            F.col("query").alias("key"),
            F.lit(None).cast("string").alias("body"),
            F.lit(None).cast("boolean").alias("final"),
            "d_searches",
            "d_clicked",
        )
    )
    return records.unionByName(ctr).select(*[c.split()[0] for c in CLICKS_OPS_SCHEMA.split(", ")])


def _step(
    spark, store: _Store, sink: ClicksSink, *, fence, base, meta, searches, clicks, w0, w1, phases=None
) -> dict:
    """Join, publish, commit the new state version. Returns the step's counts."""
    phases = phases or _Phases(spark)
    s_state, c_state = store.read(spark, base)
    res = interval_join(
        JoinSide(searches, s_state, "search_id"),
        JoinSide(clicks, c_state, "click_id"),
        on="session_id",
        lower_ms=0,
        upper_ms=WINDOW_MS,
        how="left",
        watermark_before=w0,
        watermark_after=w1,
    )
    try:
        sink.write(_ops(res.left), fence)
        phases.mark("join+publish")

        # The counts the status needs are observed while the state is written (no job of their own): the
        # observations sit on every row of each side, before the filter to the rows kept in the state.
        def n(c):
            return F.sum(F.col(c).cast("bigint"))

        obs_l, obs_r = Observation(f"clicks_left_{fence}"), Observation(f"clicks_right_{fence}")
        left = res.left.observe(
            obs_l,
            n("_new").alias("new"),
            n("_closed").alias("closed"),
            F.sum((F.col("_changed") & ~F.col("_closed")).cast("bigint")).alias("provisional"),
            n("_keep").alias("kept"),
            F.min(F.when(F.col("_keep"), F.col("ts"))).alias("min_kept_ts"),
        )
        right = res.right.observe(obs_r, n("_new").alias("new"), n("_keep").alias("kept"))
        store.write(
            fence,
            left.where("_keep").select(*res.left_state.columns),
            right.where("_keep").select(*res.right_state.columns),
        )
        cl, cr = obs_l.get, obs_r.get
        out = {
            "new_searches": int(cl["new"] or 0),
            "new_clicks": int(cr["new"] or 0),
            "closed": int(cl["closed"] or 0),
            "provisional": int(cl["provisional"] or 0),
            "held": int(cl["kept"] or 0),
            "state_rows": int(cl["kept"] or 0) + int(cr["kept"] or 0),
        }
        meta.update(
            watermark=w1,
            searches_final=meta["searches_final"] + out["closed"],
            held=out["held"],
            state_rows=out["state_rows"],
            # the earliest window end still open: an idle tick does nothing before the watermark passes it
            next_close=(cl["min_kept_ts"] + WINDOW_MS) if cl["min_kept_ts"] is not None else None,
            fence=fence,
        )
        store.rewrite_meta(fence, meta)
        phases.mark("state+counts")
    finally:
        res.release()
    return out


def _rejected(settings: Settings) -> int:
    n = 0
    for t in TOPICS:
        try:
            with open(deadletter_path(settings.lake_dir, t), "rb") as fh:
                n += sum(1 for _ in fh)
        except FileNotFoundError:
            pass
    return n


def _late_log(settings: Settings, gen: int) -> Path:
    d = job_dir(settings, JOB) / "late" / f"g{gen}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _status(settings, gen, client, meta, **extra) -> None:
    now = int(time.time() * 1000)
    # a micro-batch records its id; an idle tick only updates the fields of a meta hash that exists
    record_batch(
        client, JOB, gen, extra.get("last_batch_id"), last_fence=meta.get("fence", 0), last_batch_ms=now
    )
    write_status(
        settings,
        JOB,
        generation=gen,
        last_batch_ms=now,
        watermark=meta["watermark"],
        late=meta["late"],
        duplicates=meta["duplicates"],
        held=meta["held"],
        state_rows=meta["state_rows"],
        searches_final=meta["searches_final"],
        rejected=_rejected(settings),
        **extra,
    )


def close_idle_windows(
    spark, settings: Settings, *, generation: int | None = None, now_ms: int | None = None
) -> dict:
    """The idle-stream rule (`CLICKS_IDLE_TIMEOUT`): if no record arrived for that long, advance the watermark
    with the wall clock and publish the windows that close under it. Returns the step's counts ({} if nothing
    to do: the option is off, nothing arrived yet, the stream is not idle, or the watermark would not move)."""
    timeout = settings.clicks_idle_timeout_ms
    if timeout is None:
        return {}
    client = connect(settings.redis_url)
    gen = generation if generation is not None else serving_or_rebuild(spark, settings, JOB)
    store = _Store(state_dir(settings, JOB, gen))
    now = int(time.time() * 1000) if now_ms is None else now_ms
    with _LOCK:
        base, meta = store.latest()
        last = meta.get("last_event_ms")
        if base is None or last is None or meta["max_ts"] is None or now - last < timeout:
            return {}
        w0 = meta["watermark"]
        w1 = max(w0, meta["max_ts"] - settings.allowed_lateness_ms + (now - last))
        if w1 <= w0 or meta.get("next_close") is None or w1 <= meta["next_close"]:
            return {}  # no open window would close: nothing to publish
        s_empty = spark.createDataFrame([], "search_id string, session_id string, query string, ts bigint")
        c_empty = spark.createDataFrame([], "click_id string, session_id string, url string, ts bigint")
        out = _step(
            spark,
            store,
            ClicksSink(settings.redis_url, gen),
            fence=base + 1,
            base=base,
            meta=meta,
            searches=s_empty,
            clicks=c_empty,
            w0=w0,
            w1=w1,
        )
        _status(settings, gen, client, meta, idle_watermark_ms=w1)
        log(
            f"clicks g{gen} idle for {(now - last) / 1000:.0f}s: watermark -> {w1}, {out['closed']:,} searches closed"
        )
        return out


def run_clicks(
    spark,
    settings: Settings,
    *,
    once: bool = True,
    generation: int | None = None,
    max_files_per_trigger: int | None = None,
) -> dict:
    """Run the clicks job into `generation` (default: the serving one). Returns totals of this run."""
    client = connect(settings.redis_url)
    gen = generation if generation is not None else serving_or_rebuild(spark, settings, JOB)
    store = _Store(state_dir(settings, JOB, gen))
    sink = ClicksSink(settings.redis_url, gen)
    lateness = settings.allowed_lateness_ms
    totals = {
        "batches": 0,
        "events": 0,
        "late": 0,
        "duplicates": 0,
        "closed": 0,
        "provisional": 0,
        "seconds": 0.0,
        "state_rows": [],  # after each micro-batch of this run: flat while event time advances
    }

    def process(batch_df, batch_id: int) -> None:
        with _LOCK:
            _process(batch_df, batch_id)

    def _process(batch_df, batch_id: int) -> None:
        started = time.monotonic()
        phases = _Phases(batch_df.sparkSession)
        fence = batch_id * FENCE_STEP
        base, meta = store.latest(below=fence)
        w0 = int(meta["watermark"])
        # `_ok` in a projection: the batch constant is nondeterministic for the analyzer, so it may not appear
        # inside an aggregate function's arguments.
        batch = batch_df.select("*", (F.col("ts") >= batch_constant(w0)).alias("_ok")).persist()
        ok = F.col("_ok")
        st = batch.agg(
            F.count("*").alias("n"),
            F.sum((~ok).cast("int")).alias("late"),
            F.max(F.when(ok, F.col("ts"))).alias("max_ts"),
            F.sum((ok & (F.col("topic") == "searches")).cast("int")).alias("ok_searches"),
            F.sum((ok & (F.col("topic") == "clicks")).cast("int")).alias("ok_clicks"),
        ).first()
        phases.mark("read+stats")
        n = st["n"]
        if not n:
            batch.unpersist()
            record_batch(client, JOB, gen, batch_id)
            return
        n_late = st["late"] or 0
        if n_late:
            rows = batch.where(~ok).orderBy("topic", "id").collect()
            at = int(time.time() * 1000)
            lines = [
                orjson.dumps(
                    {
                        "topic": r["topic"],
                        "id": r["id"],
                        "session_id": r["session_id"],
                        "ts": r["ts"],
                        "reason": f"late: ts {r['ts']} is older than the watermark {w0} at arrival",
                        "batch_id": batch_id,
                        "at": at,
                    }
                )
                for r in rows
            ]
            (_late_log(settings, gen) / f"{batch_id:012d}.jsonl").write_bytes(
                b"".join(x + b"\n" for x in lines)
            )
        max_ts = st["max_ts"]
        if max_ts is not None:
            meta["max_ts"] = max(max_ts, meta["max_ts"] if meta["max_ts"] is not None else max_ts)
            meta["last_event_ms"] = int(time.time() * 1000)
        w1 = max(w0, meta["max_ts"] - lateness) if meta["max_ts"] is not None else w0
        dups = (st["ok_searches"] or 0) + (st["ok_clicks"] or 0)
        meta["late"] = meta["late"] + n_late
        searches, clicks = _sides(batch.where(ok))
        out = _step(
            spark,
            store,
            sink,
            fence=fence,
            base=base,
            meta=meta,
            searches=searches,
            clicks=clicks,
            w0=w0,
            w1=w1,
            phases=phases,
        )
        batch.unpersist()
        n_dups = dups - out["new_searches"] - out["new_clicks"]
        meta["duplicates"] = meta["duplicates"] + n_dups
        store.rewrite_meta(fence, meta)
        store.prune(base)
        took = time.monotonic() - started
        totals["batches"] += 1
        totals["events"] += n
        totals["late"] += n_late
        totals["duplicates"] += n_dups
        totals["closed"] += out["closed"]
        totals["provisional"] += out["provisional"]
        totals["seconds"] += took
        totals["state_rows"].append(out["state_rows"])
        _status(
            settings,
            gen,
            client,
            meta,
            last_batch_id=batch_id,
            last_batch_seconds=round(took, 3),
            last_batch_events=n,
        )
        log(
            f"clicks g{gen} batch {batch_id}: {n:,} events ({n_late:,} late, {n_dups:,} duplicate), watermark {w1}: "
            f"{out['closed']:,} searches final, {out['provisional']:,} clicked so far, {out['state_rows']:,} state rows "
            f"in {took:.2f}s ({phases})"
        )

    log_sources(settings, JOB, gen, TOPICS)
    stop = threading.Event()
    ticker = None
    if not once and settings.clicks_idle_timeout_ms is not None:
        every = max(0.5, settings.trigger_interval_ms / 1000)

        def _tick_loop():
            while not stop.wait(every):
                try:
                    close_idle_windows(spark, settings, generation=gen)
                except Exception as e:  # noqa: BLE001 - a failed tick is retried at the next interval
                    log(f"clicks g{gen}: idle tick failed: {e}")

        ticker = threading.Thread(target=_tick_loop, name="clicks-idle", daemon=True)
        ticker.start()
    try:
        run_stream(
            _source(spark, settings, max_files_per_trigger),
            process,
            checkpoint=checkpoint_dir(settings, JOB, gen),
            once=once,
            settings=settings,
            name=f"clicks_g{gen}",
        )
    finally:
        stop.set()
        if ticker is not None:
            ticker.join(5)
    if once:
        idle = close_idle_windows(spark, settings, generation=gen)
        totals["closed"] += idle.get("closed", 0)
    return totals
