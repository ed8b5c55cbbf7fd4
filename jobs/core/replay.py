"""`mview replay JOB`: rebuild a job's views from its logs into a new generation, then switch atomically.

1. n = the serving generation; the new generation is n+1. Whatever a crashed earlier replay left of n+1 (keys,
   checkpoint, state) is removed first, so the rebuild starts from a fresh checkpoint.
2. The job's own runner (same join and sink code as the live job) runs with `once=True, generation=n+1`:
   every topic is read from the start of its log, i.e. from the log's current snapshot (compacted by
   `mview maintain` if it ran, see `jobs.ops.maintain`) and every version after it. Generation n keeps
   serving reads, and a deployed job keeps updating n, meanwhile. A progress bar on stderr shows the log
   versions processed so far; `mview status` shows it too (`replay` field).
3. Catch-up: while the logs have versions n+1 has not processed (appended during the rebuild), run again.
4. Switch: one `SET mv:gen:<job> n+1`. Readers resolve the pointer per read, so each read sees n or n+1, whole.
5. A deployed job notices the pointer (within half a second), finishes its batch in flight on n and continues
   on n+1 from n+1's checkpoint, which has everything up to the switch. The replay waits for that
   (`status.json` generation = n+1), then REPLAY_GRACE for reads still on n, then removes n's Redis keys
   (SCAN + UNLINK) and its checkpoint and state dirs.

A replay that crashes before the switch leaves n serving, untouched; run it again. One replay per job at a time,
on any machine: a replay holds the job's replay lease (`jobs/<job>/replay-lease`, `jobs.core.lease`); a second one
exits at once when the holder is alive on this machine, after at most one heartbeat when it renews elsewhere, and
takes over a holder that stopped renewing (killed) after the lease's TTL. A replay that loses its lease stops
before its switch (`runtime.STOP`).

`rebuild` is the same build and switch, run in-process by a deployed job (`jobs.ops.service`) and by `run --once`
when Redis lost the serving copy (`jobs.core.generations.serving_copy_lost`): n is then the generation the lake
says was serving, and what is left of it in Redis is dropped right after the switch.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from changelog.topics import latest_version
from jobs.core import runtime
from jobs.core.fencing import writer_fence
from jobs.core.generations import (
    DEFINITION_CHANGED,
    definition_changed,
    drop_generation,
    lake_generation,
    last_committed_batch,
    replay_in_progress,
    serving_copy_lost,
)
from jobs.core.lease import Lease
from jobs.core.progress import lag_versions, processed_versions
from jobs.core.registry import job_spec
from jobs.core.runtime import (
    checkpoint_key,
    job_key,
    log,
    read_status,
    replay_lease_key,
    status_file,
    write_status,
)
from jobs.core.settings import Settings
from views.fence import fenced_call
from views.keys import gen_key
from views.redis_io import connect, ensure_generation

__all__ = [
    "rebuild",
    "rebuild_reason",
    "serving_or_rebuild",
    "caught_up",
    "lag_of",
    "built_status",
    "replay_lease",
    "serving_or_published",
    "build_and_switch",
    "write_replay",
]

_MAX_CATCH_UP_ROUNDS = 5


def lag_of(settings: Settings, job: str, generation: int) -> tuple[int, int]:
    """(versions processed, versions in the logs) of `generation`'s checkpoint, summed over the job's topics."""
    spec = job_spec(settings, job)
    done = processed_versions(settings.lake, checkpoint_key(job, generation))
    processed = total = 0
    for i, topic in enumerate(spec.topics):
        latest = latest_version(settings.lake, settings.topic(topic)) + 1
        nxt = done[i] if i < len(done) and done[i] is not None else 0
        total += latest
        processed += min(nxt, latest)
    return processed, total


class _Progress(threading.Thread):
    """Draws `replay timeline g2 [#####.....] 12/40 log versions 31s` on stderr and records it in replay.json."""

    def __init__(self, settings: Settings, job: str, generation: int, spark):
        super().__init__(daemon=True, name="replay-progress")
        self.settings, self.job, self.generation, self.spark = settings, job, generation, spark
        self.done = threading.Event()
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.last_line = ""

    def draw(self, final: bool = False) -> None:
        processed, total = lag_of(self.settings, self.job, self.generation)
        width = 30
        filled = width if total == 0 else int(width * processed / total)
        busy = ""
        try:
            active = self.spark.streams.active
            if active and active[0].status.get("isTriggerActive"):
                busy = " (batch in flight)"
        except Exception:  # noqa: BLE001 - the query may end while we ask
            pass
        line = (
            f"replay {self.job} g{self.generation} [{'#' * filled}{'.' * (width - filled)}] "
            f"{processed}/{total} log versions {time.monotonic() - self.started:.0f}s{busy}"
        )
        write_replay(self.settings, self.job, processed_versions=processed, total_versions=total)
        if self.tty:
            print(
                "\r" + line.ljust(len(self.last_line)), end="\n" if final else "", file=sys.stderr, flush=True
            )
        elif final or line.split(" (")[0] != self.last_line.split(" (")[0]:
            print(line, file=sys.stderr, flush=True)
        self.last_line = line

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.draw()


def write_replay(settings: Settings, job: str, **fields) -> None:
    """Merge `fields` into `jobs/<job>/replay.json` (atomic replace; safe from any thread)."""
    write_status(settings, job, file="replay.json", **fields)


# What `replay.json` says of the replay itself; its other fields are what the build's runs wrote (`status_file`).
_REPLAY_OWN = frozenset(
    {"pid", "building", "serving", "started_ms", "processed_versions", "total_versions", "finished", "reason"}
    | {"seconds", "build_seconds", "generation", "metrics_url", "spark_ui_url"}
)


def built_status(settings: Settings, job: str, generation: int) -> dict:
    """The status fields of `generation` as the build that made it left them (`last_batch_*`, the job's counters
    and watermark ...), for `status.json` once it serves; a `last_batch_*` field the build did not write is None
    (no batch yet). {} when the replay record is of another generation."""
    record = read_status(settings, job, "replay.json")
    if record.get("building") != generation:
        return {}
    current = read_status(settings, job, "status.json")
    stale = {k: None for k in current if k.startswith("last_batch_")}
    return stale | {k: v for k, v in record.items() if k not in _REPLAY_OWN}


def replay_lease(settings: Settings, job: str, *, wait: bool) -> Lease | None:
    """The job's replay lease (`replay_lease_key`), held until the caller releases it; None if `wait` is False and
    a live replay holds it, or if this process stops (`runtime.STOP`) while it waits. Lost to another holder (it
    expired here), this process stops: a replay then ends before its switch."""

    def lost(lease: Lease) -> None:
        log(f"replay {job}: lost the replay lease ({lease.lost_reason}): stopping")
        runtime.STOP.set()

    holder = f"replay of {job} (pid {os.getpid()})"
    return Lease.acquire(
        settings.lake,
        replay_lease_key(job),
        holder,
        wait_for_holder=wait,
        stop=runtime.STOP,
        on_lost=lost,
    )


def serving_or_published(settings: Settings, client, job: str) -> int:
    """The serving generation; if the pointer is gone, the generation the lake says was serving (else 1)."""
    value = client.get(gen_key(job))
    if value is not None:
        return int(value)
    return lake_generation(settings, job) or ensure_generation(client, job)


def build_and_switch(spark, settings: Settings, job: str, client, old: int, new: int) -> float:
    """Build generation `new` of `job` from the logs (catching up with versions appended meanwhile), then point
    `mv:gen:<job>` at it. Returns the seconds it took. Raises InterruptedError, without switching, if a
    stop (`runtime.STOP`) arrives meanwhile."""
    spec = job_spec(settings, job)
    started = time.monotonic()
    cleared = drop_generation(settings, client, spec, new)
    if cleared:
        log(f"replay {job}: removed {cleared:,} keys left by an earlier, unfinished replay of g{new}")
    settings.lake.delete(job_key(job), "replay.json")
    write_replay(
        settings, job, pid=os.getpid(), building=new, serving=old, started_ms=int(time.time() * 1000)
    )
    progress = _Progress(settings, job, new, spark)
    progress.start()
    try:
        with status_file("replay.json"):
            for round_ in range(1, _MAX_CATCH_UP_ROUNDS + 1):
                totals = spec.run(spark, settings, once=True, generation=new)
                if runtime.STOP.is_set():
                    raise InterruptedError(f"replay {job}: stopped before generation {new} was complete")
                processed, total = lag_of(settings, job, new)
                log(f"replay {job}: round {round_}: {totals}; {processed}/{total} log versions")
                if processed >= total:
                    break
        progress.done.set()
        progress.draw(final=True)
        # the one atomic step: readers and the deployed job follow it (fenced: a replaced writer switches nothing)
        fenced_call(
            client, writer_fence(job), gen_key(job), "SET", gen_key(job), new, what=f"switching {job}"
        )
        return time.monotonic() - started
    finally:
        progress.done.set()


def rebuild(spark, settings: Settings, job: str, reason: str) -> int:
    """Rebuild `job`'s serving copy from the logs into generation n+1 (n: the serving generation, or the one the
    lake says served if the pointer is gone), switch to it and drop n. `reason`: why (`serving_copy_lost`: Redis
    lost it; `definition_changed`: the job's definition changed, and n keeps serving readers until the switch).
    Waits for a replay of the same job in flight. Returns n+1."""
    spec = job_spec(settings, job)
    guard = replay_lease(settings, job, wait=True)
    if guard is None:
        raise InterruptedError(f"replay {job}: stopped while waiting for the replay lease")
    try:
        client = connect(settings.redis_url, cluster=settings.redis_cluster)
        pointer = client.get(gen_key(job))
        old = int(pointer) if pointer is not None else lake_generation(settings, spec.name)
        new = old + 1
        if reason.startswith(DEFINITION_CHANGED):
            log(f"{job}: {reason}: building generation {new} from the logs while generation {old} serves")
        else:
            log(f"Redis lost the serving copy of {job} ({reason}): rebuilding generation {new} from the logs")
        try:
            started = time.time()
            build_s = build_and_switch(spark, settings, job, client, old, new)
            log(f"replay {job}: generation {new} is current (rebuilt in {build_s:.1f}s)")
            if pointer is not None:  # readers may still be on `old`: let them finish
                time.sleep(settings.replay_grace_ms / 1000)
            removed = drop_generation(settings, client, spec, old)
            log(f"replay {job}: removed generation {old} ({removed:,} keys)")
            write_replay(settings, job, generation=new, seconds=round(build_s, 2), reason=reason)
            last = {
                "reason": reason,
                "generation": new,
                "seconds": round(build_s, 1),
                "at_ms": int(started * 1000),
            }
            built = built_status(settings, job, new)
            write_status(settings, job, file="status.json", generation=new, last_rebuild=last, **built)
        finally:
            write_replay(settings, job, finished=True)
        return new
    finally:
        guard.release()


def rebuild_reason(settings: Settings, client, spec) -> str | None:
    """Why `spec`'s serving generation must be rebuilt before the job writes again, or None: Redis lost it
    (`serving_copy_lost`), or the job's definition changed (`definition_changed`)."""
    return serving_copy_lost(settings, client, spec) or definition_changed(settings, client, spec)


def caught_up(settings: Settings, job: str) -> bool:
    """Whether a `--once` run of pipeline job `job` would find nothing to do, told without Spark: its serving
    generation has published, Redis holds all of it and it was built from the pipeline's definition
    (`rebuild_reason`), no replay is under way, and its checkpoint has every version of its logs (`lag_versions`
    0). An interval job with an idle timeout is never caught up (its watermark moves with the clock)."""
    spec = job_spec(settings, job)
    if spec.source or (spec.kind == "interval" and settings.idle_timeout_ms is not None):
        return False
    client = connect(settings.redis_url, cluster=settings.redis_cluster)
    pointer = client.get(gen_key(job))
    if pointer is None or replay_in_progress(settings, job) is not None:
        return False
    serving = int(pointer)
    if last_committed_batch(settings, job, serving) is None:
        return False
    return rebuild_reason(settings, client, spec) is None and lag_versions(settings, job, serving) == 0


def serving_or_rebuild(spark, settings: Settings, job: str) -> int:
    """The generation a run of `job` writes into: the serving one, 1 on the job's first run, or, if Redis lost
    the serving copy or the job's definition changed, a new one built from the logs first (`rebuild`)."""
    client = connect(settings.redis_url, cluster=settings.redis_cluster)
    reason = rebuild_reason(settings, client, job_spec(settings, job))
    if reason is not None:
        return rebuild(spark, settings, job, reason)
    return ensure_generation(client, job)
