"""Scheduled maintenance (`mview maintain [--once]`, or inside deployed jobs with MAINTENANCE_IN_JOB=true),
run by apscheduler every MAINTENANCE_INTERVAL. One round does, in this order:

1. Log compaction of COMPACT_TOPICS (default `auto`: every table topic of the pipeline that no asof job reads,
   since an asof job needs every version): the topic's current snapshot is rewritten keeping, per key, the one
   record that decides the current table (`changelog.current`: the greatest time, a remove winning ties, then the
   non-key fields; with `final_deletes` also the greatest remove, so a tombstone is never dropped). The
   rewrite is committed with `dataChange=false`, like OPTIMIZE: running consumers skip it (they have seen or
   will see the original records), while a replay, which reads from the log's current snapshot, starts from the
   compacted snapshot plus the versions after it. Views are unchanged because every job's result depends only
   on these deciding records. Appends committed while it runs (producers, the kafka and cdc jobs, on any
   machine) neither fail nor make it fail: the rewrite removes only the files of the snapshot it read, so their
   records stay beside the compacted ones (a commit that changes no data is checked by Delta for files it
   removed, not for files added meanwhile). On a local lake Spark's commit takes the topic's `flock`; on HDFS
   and S3 the store's create-if-absent of each version is the only guard (`jobs.core.logstore` on S3).
2. OPTIMIZE (bin-packing small files) of every topic log, and of the Delta state tables of jobs that are not
   running (a running job's MERGE would conflict; the timeline's state is a Parquet change log that the job
   compacts itself); VACUUM of every Delta table under LAKE_DIR except checkpoints,
   keeping files for LOG_RETENTION. Files older than that, no longer in a table's current version, are gone:
   time travel and a consumer lagging by more than LOG_RETENTION cannot reach them any more (replay instead).
3. Removal of generations that are not current: every generation of every job other than the serving one, the
   one a live replay is building and the one a deployed job still runs on: its Redis keys, checkpoint and state.
4. Checkpoint and temp clean-up: Spark's temporary files (`.*.tmp`) in checkpoints and leftovers in the lake's
   `tmp/` older than an hour (left by killed processes). Spark itself keeps only the last 100 batches'
   metadata of a live checkpoint (spark.sql.streaming.minBatchesToRetain).

Each step's failure is reported and does not stop the others. The lake is listed and cleaned through
`settings.lake` by key (any store); Spark and Delta get its URIs.
"""

from __future__ import annotations

import threading
import time

from pyspark.sql import functions as F

from changelog.current import compaction_keys, compaction_order
from changelog.storage import Lake
from changelog.topics import topic_key, topic_lock
from jobs.core.generations import drop_generation, generations, replay_in_progress
from jobs.core.registry import jobs
from jobs.core.runtime import log, read_status
from jobs.core.settings import Settings
from jobs.ops.deploy import running
from spec.model import Topic
from views.redis_io import connect, current_generation

__all__ = ["maintain", "start_scheduler", "compact_topic", "compacted", "delta_tables"]

_LOCK = threading.Lock()  # one round at a time per process


def delta_tables(lake: Lake) -> list[str]:
    """The keys of every Delta table in `lake`, checkpoints excluded."""
    found = []

    def walk(key: str) -> None:
        dirs = [e.name for e in lake.list(key) if e.is_dir]
        if "_delta_log" in dirs:
            found.append(key)
            return
        for name in dirs:
            if not (key == "" and name == "checkpoints"):
                walk(f"{key}/{name}" if key else name)

    walk("")
    return sorted(found)


def compact_topic(spark, lake: Lake, topic: Topic) -> tuple[int, int]:
    """Rewrite the table topic `topic`'s snapshot in `lake` to the deciding record per key (dataChange=false).
    Returns (rows before, rows after); nothing is written when nothing would be removed."""
    key = topic_key(topic)
    path = lake.uri(key)
    df = spark.read.format("delta").load(path)
    keys = ", ".join(compaction_keys(topic))
    kept = (
        df.selectExpr(
            "*", f"row_number() OVER (PARTITION BY {keys} ORDER BY {compaction_order(topic)}) AS _r"
        )
        .where("_r = 1")
        .drop("_r")
    )
    counts = df.agg(F.count("*").alias("n")).crossJoin(kept.agg(F.count("*").alias("k"))).first()
    before, after = counts["n"], counts["k"]
    if after < before:
        with topic_lock(lake, key=key, exclusive=True):  # no delta-rs append beside Spark's (a local lake)
            kept.write.format("delta").mode("overwrite").option("dataChange", "false").option(
                "userMetadata", f"compaction {before}->{after}"
            ).save(path)
    return before, after


def _running_jobs(settings: Settings) -> set[str]:
    """The jobs with a live driver, deployed here or holding its lease elsewhere (`jobs.ops.deploy.running`)."""
    return {job for job in jobs(settings) if running(settings, job)}


def compacted(settings: Settings) -> list[Topic]:
    """The table topics COMPACT_TOPICS names (`auto`: those no asof job of the pipeline reads); never one read
    `from:` an event topic (its log is that topic's, every event kept)."""
    pipeline = settings.pipeline()
    tables = [t for t in pipeline.written.values() if t.kind == "table"]
    if settings.compact_topics == ("auto",):
        versioned = {j.spec.table for j in pipeline.jobs.values() if j.kind == "asof"}
        return [t for t in tables if t.name not in versioned]
    return [t for t in tables if t.name in settings.compact_topics]


def _compact_topics(spark, settings: Settings, report: dict) -> None:
    """Compact each topic of COMPACT_TOPICS to its deciding record per key."""
    for topic in compacted(settings):
        if settings.lake.exists(topic_key(topic), "_delta_log"):
            try:
                before, after = compact_topic(spark, settings.lake, topic)
                report["compacted"][topic.name] = f"{before}->{after}"
            except Exception as e:  # noqa: BLE001 - e.g. a concurrent append: retried next round
                report["errors"].append(f"compact {topic.name}: {str(e)[:300]}")


def _optimize_and_vacuum(spark, settings: Settings, report: dict) -> None:
    """OPTIMIZE topics and the state tables of jobs that are not running (OPTIMIZE would race a running job's
    MERGE), VACUUM every Delta table with LOG_RETENTION."""
    from delta.tables import DeltaTable

    lake = settings.lake
    hours = settings.log_retention_ms / 3_600_000
    if hours < 168:
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    live = _running_jobs(settings)
    for rel in delta_tables(lake):
        parts = rel.split("/")
        is_topic = parts[0] == "topics"
        is_idle_state = parts[0] == "state" and len(parts) > 1 and parts[1] not in live
        table = lake.uri(rel)
        try:
            dt = DeltaTable.forPath(spark, table)
            if is_topic:
                with topic_lock(lake, key=rel, exclusive=True):  # no delta-rs append beside Spark's (local)
                    dt.optimize().executeCompaction()
            elif is_idle_state:
                dt.optimize().executeCompaction()
            if is_topic or is_idle_state:
                report["optimized"].append(rel)
            dt.vacuum(hours)
            report["vacuumed"].append(rel)
        except Exception as e:  # noqa: BLE001 - report and go on with the next table
            report["errors"].append(f"{rel}: {str(e)[:300]}")


def _drop_old_generations(settings: Settings, report: dict) -> None:
    """Drop every generation that is not serving, not being replayed, and not the one a running job writes."""
    try:
        client = connect(settings.redis_url, cluster=settings.redis_cluster)
        for name, spec in jobs(settings).items():
            serving = current_generation(client, name)
            if serving == 0:
                continue
            keep = {serving, replay_in_progress(settings, name)}
            if running(settings, name):
                keep.add(read_status(settings, name, "status.json").get("generation"))
            dropped = []
            for g in sorted(generations(settings, client, spec)):
                if g not in keep:
                    drop_generation(settings, client, spec, g)
                    dropped.append(g)
            if dropped:
                report["dropped_generations"][name] = dropped
    except Exception as e:  # noqa: BLE001
        report["errors"].append(f"generations: {str(e)[:300]}")


def maintain(spark, settings: Settings, *, inside: str | None = None) -> dict:
    """One maintenance round; returns what was done. `inside`: the job whose deployed process runs it."""
    with _LOCK:
        started = time.monotonic()
        report: dict = {
            "compacted": {},
            "optimized": [],
            "vacuumed": [],
            "dropped_generations": {},
            "errors": [],
        }
        _compact_topics(spark, settings, report)
        _optimize_and_vacuum(spark, settings, report)
        _drop_old_generations(settings, report)
        report["removed_temp_files"] = _clean_temp(settings.lake)
        report["seconds"] = round(time.monotonic() - started, 2)
        log(f"maintenance: {report}")
        return report


def _clean_temp(lake: Lake, older_than_s: float = 3600) -> int:
    """Remove the files in `tmp/` and Spark's `.*.tmp` files under `checkpoints/` older than `older_than_s`;
    returns how many. A file the store gives no time for (0) is left alone."""
    cutoff_ms = (time.time() - older_than_s) * 1000
    old = [f"tmp/{e.name}" for e in lake.list("tmp") if not e.is_dir and 0 < e.mtime_ms < cutoff_ms]

    def walk(key: str) -> None:
        for e in lake.list(key):
            if e.is_dir:
                walk(f"{key}/{e.name}")
            elif e.name.startswith(".") and e.name.endswith(".tmp") and 0 < e.mtime_ms < cutoff_ms:
                old.append(f"{key}/{e.name}")

    walk("checkpoints")
    for key in old:
        lake.delete(key)
    return len(old)


def start_scheduler(spark, settings: Settings, *, background: bool, jobs: tuple[str, ...] = ()):
    """Run `maintain` every MAINTENANCE_INTERVAL with apscheduler (one round at a time, missed rounds coalesced).

    background=False (`mview maintain`): a first round now, then blocks until SIGTERM/SIGINT.
    background=True (inside a deployed job): returns the started scheduler; the first round after one interval.
    """
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.schedulers.blocking import BlockingScheduler

    seconds = settings.maintenance_interval_ms / 1000
    inside = jobs[0] if background and jobs else None
    sched = BackgroundScheduler() if background else BlockingScheduler()
    kwargs = {} if background else {"next_run_time": __import__("datetime").datetime.now()}
    sched.add_job(
        lambda: _safe_round(spark, settings, inside),
        "interval",
        seconds=seconds,
        max_instances=1,
        coalesce=True,
        id="maintenance",
        **kwargs,
    )
    log(f"maintenance every {settings.maintenance_interval} (LOG_RETENTION {settings.log_retention})")
    if background:
        sched.start()
        return sched
    try:
        sched.start()
    except (KeyboardInterrupt, SystemExit):
        pass
    return sched


def _safe_round(spark, settings: Settings, inside: str | None) -> None:
    try:
        maintain(spark, settings, inside=inside)
    except Exception as e:  # noqa: BLE001 - a failed round must not end the scheduler
        log(f"maintenance round failed: {e}")
