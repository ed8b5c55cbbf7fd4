"""A deployed job's main loop (`python -m jobs run JOB` without `--once`): the job as a long-running service.

- Runs the job's streaming query as one long-lived query with a processingTime trigger (TRIGGER_INTERVAL,
  default 500 ms) on the serving generation (`mv:gen:<job>`), from that generation's checkpoint. A Delta commit
  to one of its topics, by any process, is planned at the next trigger: within one trigger interval (plus the
  micro-batch in flight, if any). Idle, each trigger only reads the topics' `_delta_log` listings.
- Follows replays: a guard thread checks the pointer every half second; when it moves, the query stops between
  micro-batches (the batch in flight finishes on the old generation) and a new query starts on the new
  generation's checkpoint and state. The guard reads Redis with the cluster-aware client (`watch_client`: on a
  Redis Cluster each key on the master of its slot) and takes any Redis error as "ask again"; it never hangs.
- The threads that guard correctness (that guard and the Redis watcher) never die silently: one that stops on an
  unexpected error fails the job (`state: "failed"`, `error` saying which thread and why, exit 1) rather than let
  it run unguarded.
- SIGTERM/SIGINT: the micro-batch in flight finishes, the query stops, the process exits 0. A batch that is
  planned in the instant the stop is decided is interrupted and replayed at the next start (idempotent).
  SIGUSR1: every Python thread's stack is written to stderr (the log), and the job runs on (`mview stop` asks for
  it, and for the JVM's, before it SIGKILLs a driver that did not stop in time: `jobs.ops.deploy.dump_stacks`).
- A failed query (e.g. a Redis restart lost a Lua script cache, an executor died) restarts from its checkpoint
  after a backoff (2, 4, ... 60 s; back to 2 s once a query has run for 5 minutes); the batch is replayed and,
  every sink write being idempotent or fenced, has the effect of one application. Restarts are counted in the
  status, the failure is `last_error` (one line, `jobs.core.runtime.error_line`) until the job works again (a
  micro-batch applied, or the restarted query's first trigger completed), then `previous_error`.
- Redis unreachable: every Redis call waits with backoff (`views.redis_io.WaitingRetry`), the log says
  `waiting for Redis at URL (attempt n)`, and a watcher thread records it in the status (`redis`:
  `"waiting since ..."`, which `mview status` shows as `state: "waiting"`) until Redis answers again; then the
  job catches up from its checkpoint.
  A stop while Redis is down does not wait for it: the waiting calls give up, the query stops at once, and the
  interrupted micro-batch is replayed at the next start. URLs in the log and the status show no password.
- Redis refuses the credentials or TLS is on one side only (`views.errors.RedisMisconfigured`, permanent): no
  retrying; the log and the status say why (`state: "failed"`, `error`), and the process exits 1.
- Redis lost the serving copy (restarted without its data, flushed, restored from an older snapshot; see
  `jobs.core.generations.serving_copy_lost`), seen by the guard within a second and before every query start: the
  query stops at once (its batch in flight wrote only into the lost copy), the log says `Redis lost the
  serving copy of <job> (<reason>): rebuilding generation N+1 from the logs`, the status says `state:
  rebuilding` (with the reason, a `rebuilds` count and the replay's progress), the job rebuilds its views from
  the logs into generation N+1 (`jobs.core.replay.rebuild`), switches to it, records `last_rebuild` and continues
  there. Until the switch, readers get what Redis holds (for a lost pointer: generation 0, empty).
- Holds the job's lease on the lake (`jobs/<job>/lease.<epoch>`, `jobs.core.lease`) for its lifetime, so two
  drivers of a job never run at once, whatever machines, working directories or HOMEs they start from and however
  deploys race: a driver that finds a live holder exits 1 (at once when the holder runs on this machine, after at
  most one heartbeat when it renews elsewhere); one that finds the holder dead (its process gone on this machine)
  or expired (not renewed for the lease's TTL, 30 s: killed elsewhere) takes over and continues from the lake's
  checkpoint. While the lease cannot be renewed (the store does not answer), and once that lasted 20 s, the query
  is stopped and the job waits, logging it once, until the lease is renewed (then it continues) or found taken
  over: a driver that lost its lease stops at once, writing nothing more to the status (the new driver's), the
  log saying why, and exits 1 (a restart policy around `mview run` brings it back, to wait for the lease). A clean
  stop releases the lease (the next driver takes it at once).
- Optionally runs the scheduled maintenance (`MAINTENANCE_IN_JOB`, see `jobs.ops.maintain`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
import time
import traceback

import redis
from redis.exceptions import RedisClusterException

from changelog.storage import StorageError
from jobs.core import runtime
from jobs.core.chain import reads
from jobs.core.generations import serving_copy_lost
from jobs.core.lease import Lease, holder_of
from jobs.core.registry import job_spec
from jobs.core.runtime import (
    Restarts,
    clear_error,
    error_line,
    job_lease_key,
    log,
    read_status,
    write_status,
)
from jobs.core.settings import Settings
from jobs.errors import JobRunning
from views.errors import RedisMisconfigured, RedisUnavailable, ViewError
from views.keys import gen_key
from views.redis_io import connect, ensure_generation, probe, quick_client, redact_url, watch_client

__all__ = ["serve", "once_lease"]

# A query that ran this long before failing was healthy: its failure starts the backoff again at 2 s.


# Whatever a Redis client (or the lake, read beside it) may raise: a guard takes each as "cannot tell now" and
# asks again.
_REDIS_ERRORS = (redis.RedisError, RedisClusterException, ViewError, OSError, StorageError)


class _Failure:
    """Why the deployed job must stop for good, the first reason wins: a permanent Redis problem, or a guarding
    thread that died. `set` logs it, records `state: "failed"` with the reason (`error`) in `status.json` and stops
    the process (`runtime.STOP`); `serve` then exits 1."""

    def __init__(self, settings: Settings, job: str):
        self.settings, self.job = settings, job
        self.reason: str | None = None
        self._lock = threading.Lock()

    def set(self, reason, *, report: bool = True) -> None:
        """Fail the job for `reason`; `report=False` writes nothing to the status (another driver owns it now)."""
        with self._lock:
            if self.reason is None:
                self.reason = error_line(reason, self.settings.redis_url)
                log(f"{self.job}: {self.reason}; not retrying: stopping")
                if report:
                    write_status(
                        self.settings, self.job, file="status.json", state="failed", error=self.reason
                    )
        runtime.STOP.set()


class _Sentinel(threading.Thread):
    """A thread that guards the deployed job's correctness: `check()` every `every_s` seconds until `done`. It
    never dies silently: an error escaping `check` (each handles the Redis errors it expects) is logged with its
    traceback and fails the job (`_Failure`), so the job never runs on without its guard."""

    every_s = 1.0

    def __init__(self, name: str, settings: Settings, job: str, failure: _Failure):
        super().__init__(daemon=True, name=name)
        self.settings, self.job, self.failure = settings, job, failure
        self.done = threading.Event()

    def check(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            while not self.done.wait(self.every_s):
                self.check()
        except BaseException as e:  # noqa: BLE001 - a guard that stops must stop the job, whatever the error
            if self.done.is_set():  # the job is ending (its Spark session may be stopping under the check)
                return
            log(f"{self.job}: the {self.name} thread stopped:\n{traceback.format_exc()}")
            self.failure.set(
                f"the {self.name} thread stopped ({error_line(e)}): the job cannot run unguarded"
            )


class _RedisWatch(_Sentinel):
    """Checks Redis every second on a new connection (so changed credentials show at once) and records what it
    finds in the status file and the log, the URL always redacted:

    - unreachable (any error of the check): `redis: "waiting for Redis at URL since ..."` (shown as `state:
      "waiting"` by `mview status`) and `runtime.REDIS_DOWN` set, until it answers (always in the deployed job's
      `status.json`, also while a rebuild routes the process's status elsewhere);
    - a permanent problem (`RedisMisconfigured`: refused credentials, TLS mismatch): `fail` - the job stops
      retrying, the status says `state: "failed"` with the reason (`error`), and the process exits 1.
    """

    def __init__(self, settings: Settings, job: str, failure: _Failure):
        super().__init__("redis-watch", settings, job, failure)
        self.client = quick_client(settings.redis_url)
        self.down_since: float | None = None
        self.attempt = 0

    def fail(self, problem) -> None:
        """Record a permanent Redis problem and stop the job (`serve` then exits 1 with `state: "failed"`)."""
        self.failure.set(problem)
        write_status(self.settings, self.job, file="status.json", redis=self.failure.reason)

    def _probe(self) -> ViewError | None:
        try:
            return probe(self.settings.redis_url, self.client)
        except _REDIS_ERRORS as e:  # a reply probe does not expect (e.g. a cluster node still loading)
            return RedisUnavailable(self.settings.redis_url, e)
        finally:
            self.client.connection_pool.disconnect()

    def check(self) -> None:
        url = redact_url(self.settings.redis_url)
        problem = self._probe()
        if problem is None:
            runtime.REDIS_DOWN.clear()
            if self.down_since is not None:
                log(f"{self.job}: Redis at {url} answers again after {self.attempt} attempts")
                write_status(
                    self.settings,
                    self.job,
                    file="status.json",
                    redis="ok",
                    redis_outages_s=round(time.time() - self.down_since, 1),
                )
                self.down_since, self.attempt = None, 0
        elif isinstance(problem, RedisMisconfigured):
            self.fail(problem)
            self.done.set()
        else:
            runtime.REDIS_DOWN.set()
            self.attempt += 1
            if self.down_since is None:
                self.down_since = time.time()
            cause = getattr(problem, "cause", None) or problem
            log(f"{self.job}: waiting for Redis at {url} (attempt {self.attempt}): {cause}")
            write_status(
                self.settings,
                self.job,
                file="status.json",
                redis=f"waiting for Redis at {url} since "
                f"{time.strftime('%H:%M:%S', time.localtime(self.down_since))} (attempt {self.attempt})",
            )


def _serving(client, job: str) -> int | None:
    """The serving generation (`mv:gen:<job>`), None if there is none. Raises what the client raises."""
    value = client.get(gen_key(job))
    return None if value is None else int(value)


class _Guard(_Sentinel):
    """Stops the job's query between micro-batches when SIGTERM arrives, the generation pointer moves, a job whose
    views it reads switches generation (`jobs.core.chain`: the supervisor then rebuilds it), or Redis lost the
    serving copy (`jobs.core.generations.serving_copy_lost`), so a stop waits only for the batch in flight and
    nothing is written to a generation that is no longer current. On a loss the query is stopped at once, its
    batch in flight interrupted (it writes into a copy that is being replaced anyway), and `lost` names why.

    Redis is read every half second with `views.redis_io.watch_client` (a Redis Cluster client on a cluster: the
    pointer and the meta hash live on whichever masters own their slots). Any error reading it means "Redis cannot
    tell now": the check is skipped, the client is dropped and made again (a cluster's layout read anew) at the
    next one, and the log says once that the guard cannot read Redis and once that it can again; the same for the
    lake (read to tell a lost copy), named as such when it is what failed. Any other error
    ends the thread and fails the job (`_Sentinel`).

    Queries are named `<job>_g<generation>` (`run_stream`'s name). Only the supervisor's own query, on
    `self.generation`, is stopped on a pointer move or a loss (never the query of a rebuild in the same
    process), so the query the supervisor starts on the new generation is never hit by a stale check.
    """

    every_s = 0.5

    def __init__(self, spark, job: str, settings: Settings, failure: _Failure, lease: Lease | None = None):
        super().__init__("query-guard", settings, job, failure)
        self.spark, self.lease = spark, lease
        self.generation: int | None = None  # what the supervisor's query serves; None between queries
        self.reads: dict[str, str | None] = {}  # the logs of views its query reads (`jobs.core.chain.reads`)
        self.lost: str | None = None
        self.client = None
        self.blind_since: float | None = None  # when reading Redis (or the lake) started failing
        self.blind_on = ""  # what it could not read: the pointer's key, or the lake

    def _read(self) -> tuple[int | None, str | None]:
        """(the serving generation, why the serving copy is lost or None); (None, None) if Redis cannot tell."""
        try:
            if self.client is None:
                self.client = watch_client(self.settings.redis_url, cluster=self.settings.redis_cluster)
            serving = _serving(self.client, self.job)
            lost = serving_copy_lost(self.settings, self.client, job_spec(self.settings, self.job))
        except _REDIS_ERRORS as e:
            client, self.client = self.client, None
            if client is not None:
                with contextlib.suppress(Exception):  # its connections may be broken already
                    client.close()
            if self.blind_since is None:
                self.blind_since = time.monotonic()
                lake = isinstance(e, StorageError)  # the lake, read beside the pointer, is what failed
                self.blind_on = f"the lake ({self.settings.lake.uri()})" if lake else gen_key(self.job)
                log(
                    f"{self.job}: the query guard cannot read {self.blind_on} now ({error_line(e)}); retrying"
                )
            return None, None
        if self.blind_since is not None:
            what = "the lake" if self.blind_on.startswith("the lake") else "Redis"
            log(
                f"{self.job}: the query guard reads {what} again after {time.monotonic() - self.blind_since:.1f}s"
            )
            self.blind_since = None
        return serving, lost

    def check(self) -> None:
        stopping = runtime.STOP.is_set()
        own = self.generation
        serving = lost = None
        doubt = self.lease is not None and not self.lease.valid
        if not stopping and own is not None and not doubt:
            serving, lost = self._read()
            # a job whose views it reads serves another generation: stop, to be rebuilt from its log (jobs.core.chain)
            if self.reads and serving == own and reads(self.settings, self.job) != self.reads:
                serving = -1
        for q in self.spark.streams.active:
            if q.name == f"{self.job}_g{own}" and doubt and not stopping:
                q.stop()  # the lease may be another driver's by now: not one more batch (it is replayed)
            elif q.name == f"{self.job}_g{own}" and lost is not None and not stopping:
                self.lost = lost
                q.stop()
            elif stopping or (q.name == f"{self.job}_g{own}" and serving not in (None, own)):
                runtime._stop_between_batches(q)


def _rebuild(spark, settings: Settings, job: str, reason: str) -> int:
    """Rebuild the serving copy Redis lost (`jobs.core.replay.rebuild`), saying so in the status; the new generation."""
    from jobs.core.replay import rebuild

    rebuilds = int(read_status(settings, job, "status.json").get("rebuilds", 0)) + 1
    since = time.time()
    write_status(
        settings,
        job,
        state="rebuilding",
        rebuilds=rebuilds,
        rebuilding={"reason": reason, "since_ms": int(since * 1000)},
    )
    new = rebuild(spark, settings, job, reason)
    took = round(time.time() - since, 1)
    write_status(
        settings, job, state="running", generation=new, rebuilding=None
    )  # `rebuild` wrote last_rebuild
    log(f"{job}: serving generation {new}, rebuilt from the logs in {took}s")
    return new


def _single_instance(settings: Settings, job: str, on_lost=None) -> Lease | None:
    """The job's lease (`job_lease_key`), held for the life of the process (see the module docstring); None if a
    live driver holds it. `on_lost(lease)`: what to do when another driver took it over (default: stop)."""

    def lost(lease: Lease) -> None:
        log(f"{job}: lost the job's lease ({lease.lost_reason}): stopping")
        runtime.STOP.set()

    holder = f"{job} driver (pid {os.getpid()})"
    lease = Lease.acquire(settings.lake, job_lease_key(job), holder, on_lost=on_lost or lost)
    if lease is None:
        log(f"{job}: another driver of this job holds its lease ({job_lease_key(job)}); exiting")
    return lease


def once_lease(settings: Settings, job: str) -> Lease:
    """The job's lease for one `mview run <job> --once`, released when it returns (use it as a context manager):
    a live driver of the job anywhere (deployed, or a continuous `mview run`) holds it and makes this raise
    `JobRunning` before anything is written; a driver killed on this machine does not."""
    lease = Lease.acquire(
        settings.lake,
        job_lease_key(job),
        f"{job} run --once (pid {os.getpid()})",
        on_lost=lambda lost: log(f"{job}: lost the job's lease ({lost.lost_reason})"),
    )
    if lease is None:
        held = holder_of(settings.lake, job_lease_key(job)) or {}
        raise JobRunning(job, f"{held.get('holder', 'a driver')} on {held.get('node', 'another machine')}")
    return lease


def _stop_on_signals(job: str) -> None:
    runtime.STOP.clear()

    def _stop(signum, _frame):
        log(f"{job}: signal {signum}, stopping after the batch in flight")
        runtime.STOP.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


def _follow_generations(spark, settings: Settings, job: str, guard: _Guard, watch: _RedisWatch) -> None:
    """Run the job's query on the serving generation until STOP; after each return (the guard stopped it: the
    pointer moved, Redis lost the serving copy) follow the pointer or rebuild (also when the job's definition
    changed); after a failure restart."""
    from jobs.core.replay import built_status, rebuild_reason

    spec = job_spec(settings, job)
    client = connect(settings.redis_url, cluster=settings.redis_cluster, check=False)
    restarts = Restarts(settings, job)
    gen = None
    while not runtime.STOP.is_set():
        if guard.lease is not None and not guard.lease.valid:
            since = time.monotonic()
            log(f"{job}: the job's lease cannot be renewed (the lake does not answer): waiting")
            if not guard.lease.wait_valid(runtime.STOP):
                break
            log(f"{job}: the job's lease is renewed after {time.monotonic() - since:.1f}s: continuing")
        started = time.monotonic()
        try:
            reason = rebuild_reason(settings, client, spec)  # waits for Redis
            if reason is not None:
                gen = _rebuild(spark, settings, job, reason)
                continue
            serving = ensure_generation(client, job)  # the job's first run: generation 1
            if serving != gen:
                built = {}
                if gen is not None:  # a replay switched: the status tells the new generation's batches
                    log(f"{job}: generation pointer moved from {gen}: continuing on generation {serving}")
                    built = built_status(settings, job, serving)
                gen = serving
                write_status(settings, job, generation=gen, state="running", **built)
                log(f"{job}: serving generation {gen}")
            guard.generation, guard.reads = gen, reads(settings, job)
            spec.run(spark, settings, once=False, generation=gen)
            restarts.failures = 0
        except Exception as e:  # noqa: BLE001 - any query failure: restart from the checkpoint
            if isinstance(e, RedisMisconfigured):  # refused credentials, TLS: retrying cannot help
                watch.fail(e)
            if runtime.STOP.is_set():
                break
            if guard.lost is not None:  # the guard interrupted the batch in flight: rebuild now
                log(f"{job}: query stopped: Redis lost the serving copy ({guard.lost})")
                continue
            restarts.after(e, started)
        finally:
            guard.generation, guard.lost = None, None


def serve(spark, settings: Settings, job: str) -> int:
    """Run `job` continuously until SIGTERM/SIGINT, following generation switches. Returns the exit code: 0 after
    a stop, 1 when the job failed (`_Failure`: a permanent Redis problem, a guarding thread that died, the job's
    lease lost to another driver) or another driver holds the lease."""
    failure = _Failure(settings, job)

    def lost(lease: Lease) -> None:  # another driver runs the job now: write nothing more to its status
        failure.set(f"lost the job's lease ({lease.lost_reason})", report=False)

    try:
        lease = _single_instance(settings, job, on_lost=lost)  # held until this function returns
    except StorageError as e:
        log(f"{job}: cannot take the job's lease: {e}")
        return 1
    if lease is None:
        return 1
    _stop_on_signals(job)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stderr: the log
    clear_error(settings, job)  # why an earlier run failed or restarted: history now
    watch = _RedisWatch(settings, job, failure)
    watch.start()
    scheduler = None
    if settings.maintenance_in_job:
        from jobs.ops.maintain import start_scheduler

        scheduler = start_scheduler(spark, settings, background=True, jobs=(job,))
    write_status(
        settings, job, pid=os.getpid(), state="starting", redis="ok", started_ms=int(time.time() * 1000)
    )
    guard = _Guard(spark, job, settings, failure, lease)
    guard.start()
    try:
        _follow_generations(spark, settings, job, guard, watch)
    finally:
        guard.done.set()
        watch.done.set()
        if scheduler is not None:
            scheduler.shutdown(wait=True)
        state = "failed" if failure.reason else "stopped"
        if not lease.lost.is_set():
            write_status(settings, job, state=state, stopped_ms=int(time.time() * 1000))
        log(f"{job}: {state}")
        lease.release()
    return 1 if failure.reason else 0
