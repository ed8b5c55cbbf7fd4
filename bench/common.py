"""What every benchmark part shares: the progress line, the bench's own redis-server, settings for a scratch
lake on it, ingesting generated records, and the CPU time the hypervisor took from this machine."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

__all__ = [
    "ROOT",
    "say",
    "start_redis",
    "scratch_settings",
    "ingest_records",
    "cpu_ticks",
    "stolen_pct",
    "cpu_seconds",
]

ROOT = Path(__file__).resolve().parent.parent


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start_redis(workdir: Path) -> tuple[subprocess.Popen, int]:
    """A throw-away redis-server on a free port with its files under `workdir`: (process, port)."""
    from jobs.dev.redis import scratch_redis
    from jobs.errors import JobsError

    try:
        return scratch_redis(workdir)
    except JobsError as e:
        raise SystemExit(f"bench: {e}") from None


def scratch_settings(lake: Path, port: int, db: int = 0, **env):
    """Settings of the environment with LAKE_DIR `lake`, REDIS_URL the bench's redis-server (db `db`) and `env`."""
    from jobs.core.settings import Settings

    base = dict(os.environ)
    base.update({"LAKE_DIR": str(lake), "REDIS_URL": f"redis://127.0.0.1:{port}/{db}"})
    base.update({k: str(v) for k, v in env.items()})
    return Settings.from_env(base)


def ingest_records(spark, settings, topic: str, records: list[dict], path: Path) -> int:
    """Write `records` as JSON lines to `path` and ingest them into the settings' topic `topic`; the number
    accepted."""
    from changelog.ingest import ingest
    from timeline_demo.workload import write_jsonl

    if not records:
        return 0
    return ingest(spark, settings.lake, settings.topic(topic), [write_jsonl(records, path)]).accepted


def cpu_ticks() -> tuple[int, int]:
    """(stolen, total) CPU ticks of the machine so far (/proc/stat); (0, 0) where there is none."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def stolen_pct(since: tuple[int, int]) -> float | None:
    """The share of CPU time the hypervisor gave to other machines since `since` (`cpu_ticks()`), in %."""
    stolen, total = cpu_ticks()
    return round(100 * (stolen - since[0]) / (total - since[1]), 1) if total > since[1] else None


def cpu_seconds(spark) -> float:
    """CPU seconds (user + sys) used so far by this process, the Spark JVM and its children (Python workers)."""
    from jobs.core.runtime import process_cpu
    from joins.sparkapi import driver_jvm

    total = sum(os.times()[:2])
    proc = driver_jvm(spark)
    if proc is None:
        return total
    try:
        return total + sum(process_cpu(proc.pid, waited=True))
    except OSError:
        return total
