"""`mview replay JOB`: rebuild a job's views from its logs into generation n+1 beside the serving n, switch readers
at once, wait for a deployed job to follow, then remove n (the steps: `jobs.core.replay`, which a deployed job and
`run --once` share for their own rebuilds)."""

from __future__ import annotations

import sys
import time

from jobs.core.generations import drop_generation
from jobs.core.registry import job_spec
from jobs.core.replay import build_and_switch, built_status, replay_lease, serving_or_published, write_replay
from jobs.core.runtime import log, read_status, write_status
from jobs.core.settings import Settings
from jobs.ops.deploy import running
from views.redis_io import connect

__all__ = ["replay"]


def _wait_for_job_on(settings: Settings, job: str, generation: int, timeout_s: float = 300.0) -> bool:
    """Wait until a deployed `job` serves `generation` (or is not running, here or elsewhere). False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not running(settings, job):
            return True
        if int(read_status(settings, job, "status.json").get("generation", -1)) == generation:
            return True
        time.sleep(0.2)
    return False


def replay(spark, settings: Settings, job: str) -> int:
    """Rebuild `job` into generation n+1 and switch to it. Returns the exit code (0 on success)."""
    spec = job_spec(settings, job)
    guard = replay_lease(settings, job, wait=False)
    if guard is None:
        print(f"mview: a replay of {job} is already running", file=sys.stderr)
        return 1
    client = connect(settings.redis_url, cluster=settings.redis_cluster)
    old = serving_or_published(settings, client, job)
    new = old + 1
    started = time.monotonic()
    log(f"replay {job}: building generation {new} from the logs while generation {old} serves")
    try:
        build_s = build_and_switch(spark, settings, job, client, old, new)
        log(f"replay {job}: generation {new} is current (built in {build_s:.1f}s)")
        if not _wait_for_job_on(settings, job, new):
            log(f"replay {job}: the deployed job has not moved to g{new}; leaving g{old} to `mview maintain`")
            return 0
        if read_status(settings, job, "status.json").get("generation") != new:  # no deployed job moved it
            write_status(
                settings, job, file="status.json", generation=new, **built_status(settings, job, new)
            )
        time.sleep(settings.replay_grace_ms / 1000)
        removed = drop_generation(settings, client, spec, old)
        log(f"replay {job}: removed generation {old} ({removed:,} keys)")
        write_replay(
            settings,
            job,
            finished=True,
            generation=new,
            seconds=round(time.monotonic() - started, 2),
            build_seconds=round(build_s, 2),
        )
        print(f"{job}: replayed into generation {new} in {time.monotonic() - started:.1f}s (was {old})")
        return 0
    finally:
        write_replay(settings, job, finished=True)
        guard.release()
