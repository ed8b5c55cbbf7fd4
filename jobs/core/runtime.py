"""What every job shares: where its checkpoint, state and status live, how its streaming query runs and stops.

A job's lake state is addressed by key through `settings.lake` (`changelog.storage.Lake`): `jobs/<job>/` (status
files, replay records, leases: `job_key`), `checkpoints/<job>/g<g>` (`checkpoint_key`; Spark gets its URI,
`checkpoint_dir`) and `state/<job>/g<g>` (`state_key`, `state_dir`). Machine-local, never in a remote lake: /proc
(`process_cpu`) and the files `open_private` opens (a deployed process's pid file and log, `jobs.ops.deploy`)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from changelog.storage import Lake, LakeUnreachable, NotFound
from jobs.core.settings import Settings
from jobs.errors import QueryFailed
from joins.state import read_json, write_json
from views.redis_io import STOP as _REDIS_STOP
from views.redis_io import redact

__all__ = [
    "Restarts",
    "job_dir",
    "job_key",
    "job_lease_key",
    "replay_lease_key",
    "checkpoint_key",
    "state_key",
    "checkpoint_dir",
    "state_dir",
    "write_status",
    "read_status",
    "error_line",
    "record_error",
    "recovered",
    "clear_error",
    "run_stream",
    "moved_sources",
    "offsets",
    "committed_batches",
    "log",
    "log_sources",
    "STOP",
    "REDIS_DOWN",
    "status_file",
    "process_cpu",
    "open_private",
]

# Set by SIGTERM/SIGINT in a continuous run_stream and in a deployed job's supervisor (`jobs.ops.service`). It is
# `views.redis_io.STOP`: a Redis call of this process waiting for Redis gives up when it is set.
STOP = _REDIS_STOP
# Set while a deployed job's watcher finds Redis unreachable (`jobs.ops.service`): a stop then does not wait for the
# micro-batch in flight, which may be waiting for Redis (it is interrupted and replayed at the next start).
REDIS_DOWN = threading.Event()
_STATUS_FILE = ["status.json"]  # a replay writes its own file (`status_file`), not the serving job's
_STATUS_LOCK = threading.Lock()


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3 onwards, so index 1 is the parent pid)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def process_cpu(pid: int, *, waited: bool = False) -> tuple[float, float]:
    """(CPU seconds of process `pid`, CPU seconds of its live descendants), user + system, from /proc (Linux).

    With `waited`, each process also counts the CPU of its children that have exited and were waited for
    (cutime, cstime). Raises OSError when `pid` does not exist; descendants that vanish meanwhile are skipped.
    """
    tick = os.sysconf("SC_CLK_TCK")
    last = 15 if waited else 13

    def seconds(f: list[str]) -> float:
        return sum(int(x) for x in f[11:last]) / tick

    own = seconds(_stat(pid))
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                kids.setdefault(int(_stat(d)[1]), []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0.0, list(kids.get(pid, ()))
    while todo:
        p = todo.pop()
        todo += kids.get(p, ())
        try:
            total += seconds(_stat(p))
        except (OSError, IndexError, ValueError):
            pass
    return own, total


def log(msg: str) -> None:
    """A timestamped line on stderr (a deployed job's `job.log`), with the credentials of any URL or connection
    string masked (the passwords of REDIS_URL and PG_DSN wherever they appear)."""
    shown = redact(msg, os.environ.get("REDIS_URL"), os.environ.get("PG_DSN"))
    print(
        f"[{time.strftime('%H:%M:%S')}] {shown}",
        file=sys.stderr,
        flush=True,
    )


def log_sources(settings: Settings, job: str, generation: int, topics) -> None:
    """Log where a run of `job` starts: each topic's latest Delta version (read without Spark)."""
    from changelog.topics import latest_version

    versions = ", ".join(f"{t}@v{latest_version(settings.lake, settings.topic(t))}" for t in topics)
    log(f"{job} g{generation}: reading {versions}")


def job_dir(settings: Settings, job: str) -> str:
    """The URI of the job's directory in the lake (`job_key`): status, replay records, leases. Nothing is created:
    its objects are written through `settings.lake` by key, owner-only (0600) on a local lake."""
    return settings.lake.uri(job_key(job))


def open_private(path: Path, flags: int = os.O_WRONLY) -> int:
    """A descriptor of the machine-local file `path` opened with `flags`, the file created if missing, readable and
    writable by its owner only (0600) whatever the umask, and made so if it exists with a wider mode (an older
    version's). Lake files get the same mode from the local store (`Lake.write_bytes`)."""
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def job_key(job: str) -> str:
    """The lake key of a job's directory (status, replay records, leases): `jobs/<job>`."""
    return f"jobs/{job}"


def job_lease_key(job: str) -> str:
    """The lease a deployed job's driver holds for its lifetime (`jobs.core.lease`): one driver per job, on any
    machine (`jobs.ops.service`)."""
    return f"{job_key(job)}/lease"


def replay_lease_key(job: str) -> str:
    """The lease a replay or rebuild of `job` holds (`jobs.core.lease`): one at a time, on any machine."""
    return f"{job_key(job)}/replay-lease"


def checkpoint_key(job: str, generation: int) -> str:
    """The lake key of a generation's streaming checkpoint: `checkpoints/<job>/g<generation>`."""
    return f"checkpoints/{job}/g{generation}"


def state_key(job: str, generation: int) -> str:
    """The lake key of a generation's join state: `state/<job>/g<generation>`."""
    return f"state/{job}/g{generation}"


def checkpoint_dir(settings: Settings, job: str, generation: int) -> str:
    """The URI Spark checkpoints `generation` of `job` at (`checkpoint_key` in the lake)."""
    return settings.lake.uri(checkpoint_key(job, generation))


def state_dir(settings: Settings, job: str, generation: int) -> str:
    """The URI of `generation`'s join state of `job` (`state_key` in the lake)."""
    return settings.lake.uri(state_key(job, generation))


# The longest error line a status holds (an error class and message fit; a stack trace never does).
ERROR_LINE_MAX = 600
# Status fields that hold a message about a problem: always stored as `error_line` makes them.
_MESSAGE_FIELDS = ("error", "last_error", "redis", "kafka")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_PY4J_PROXY = re.compile(r"An exception was raised by the Python Proxy\. Return Message:\s*$")
_QUERY_IDS = re.compile(r"Query \[id = [^,\]]*, runId = [^\]]*\]")
_IDENTIFIER = re.compile(r"^Identifier: (\S+)", re.M)
_LIBPQ_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.I)


def error_line(error, *urls: str | None) -> str:
    """`error` (an exception or a text) as one line a status can show: its first non-blank line, never a stack
    trace, credentials masked, at most ERROR_LINE_MAX characters.

    A Spark query failure keeps its error class and message (`[STREAM_FAILED] Query timeline_g1 terminated with
    exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] ...`, the query's name for its ids); where that line ends in a
    Python traceback (an error raised in a micro-batch's function), the traceback is replaced by its last line, the
    exception that was raised (`views.errors.RedisCommandFailed: ...`). Java frames, Spark's plan dump and
    SQLSTATE lines are dropped. The passwords of `urls` (URLs or DSNs) and of REDIS_URL and PG_DSN in the
    environment, any `scheme://user:password@` and any `password=...` are shown as `***` (`views.errors.redact`)."""
    text = str(error).replace("\r", "")
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    head = lines[first].strip()
    if _TRACEBACK in head or (first + 1 < len(lines) and lines[first + 1].startswith(_TRACEBACK)):
        head = head.split(_TRACEBACK, 1)[0].rstrip()
        raised = None
        for line in lines[first + 1 :]:
            if line.startswith(("===", " SQLSTATE", "SQLSTATE")):
                break
            if line.strip() and not line[0].isspace() and not line.startswith((_TRACEBACK, *_CHAINED)):
                raised = line.strip()
        head = _PY4J_PROXY.sub("", head).rstrip()
        head = f"{head} {raised}" if head and raised else head or raised or type(error).__name__
    ident = _IDENTIFIER.search(text)
    if ident is not None:
        head = _QUERY_IDS.sub(f"Query {ident[1]}", head)
    head = re.sub(r"\s+", " ", head)
    head = redact(head)
    for url in {*urls, os.environ.get("REDIS_URL"), os.environ.get("PG_DSN")} - {None, ""}:
        head = redact(head, url)
    head = _LIBPQ_PASSWORD.sub(r"\1***", head)
    return head if len(head) <= ERROR_LINE_MAX else head[: ERROR_LINE_MAX - 3] + "..."


def write_status(settings: Settings, job: str, *, file: str | None = None, **fields) -> None:
    """Merge `fields` into the job's status file (atomic replace, readable by its owner only), read by
    `mview status`. `file`: that file of the job's directory rather than the one `status_file` routes to (what the
    deployed process itself reports, e.g. Redis's state, belongs in `status.json` even while it rebuilds).

    The messages (`error`, `last_error`, `redis`, `kafka`) are stored as `error_line` makes them, one line with
    credentials masked, whatever the caller passes; None removes nothing but says "no problem"."""
    for key in _MESSAGE_FIELDS:
        if fields.get(key) is not None:
            fields[key] = error_line(fields[key], settings.redis_url, settings.pg_dsn)
    name = file or _STATUS_FILE[0]
    # the batch loop, the Redis watcher and a replay's progress each merge their own fields
    with _STATUS_LOCK:
        _update(settings, job, name, lambda current: {**current, **fields})


_FAILING: set[str] = set()  # jobs whose `last_error` this process recorded and has not cleared


def record_error(settings: Settings, job: str, error, **fields) -> str:
    """Record `error` as the job's current problem in `status.json`: `last_error` (one line, `error_line`) and
    `last_error_ms` (when), with `fields`; returns the line. It stays until the job recovered (`recovered`)."""
    line = error_line(error, settings.redis_url, settings.pg_dsn)
    write_status(
        settings, job, file="status.json", last_error=line, last_error_ms=int(time.time() * 1000), **fields
    )
    _FAILING.add(job)
    return line


def recovered(settings: Settings, job: str) -> None:
    """`job` works again (a micro-batch applied, or its restarted query completed a trigger): if this process
    recorded an error for it (`record_error`), `clear_error`, and say so in the log. Costs nothing otherwise, so the
    batch loop calls it every batch."""
    if job in _FAILING:
        _FAILING.discard(job)
        line = read_status(settings, job, "status.json").get("last_error")
        clear_error(settings, job)
        log(f"{job}: recovered from: {line}")


def clear_error(settings: Settings, job: str) -> None:
    """The job recovered (`recovered`: it applied a micro-batch, or its restarted query completed a trigger), or
    starts afresh: the current problem (`last_error`, else `error`), if any, moves to `previous_error` ({"error",
    "at_ms", "cleared_ms"}) and both fields become null, so `mview status` no longer shows it as current. Always
    in `status.json` (what the deployed process reports), even while a rebuild routes its status elsewhere."""

    def cleared(current: dict) -> dict | None:
        line = current.get("last_error") or current.get("error")
        if line is None:
            return None
        current["previous_error"] = {
            "error": line,
            "at_ms": current.get("last_error_ms") if current.get("last_error") else current.get("stopped_ms"),
            "cleared_ms": int(time.time() * 1000),
        }
        current["last_error"] = current["last_error_ms"] = current["error"] = None
        return current

    with _STATUS_LOCK:
        _update(settings, job, "status.json", cleared)


class status_file:
    """`with status_file("replay.json"):` routes this process's write_status/read_status to another file."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.before = _STATUS_FILE[0]
        _STATUS_FILE[0] = self.name

    def __exit__(self, *exc):
        _STATUS_FILE[0] = self.before


def read_status(settings: Settings, job: str, name: str | None = None) -> dict:
    """The job's status file `name` (default: the one `status_file` routes to), {} when there is none. Raises
    `changelog.storage.LakeUnreachable` when the store does not answer."""
    got = read_json(settings.lake, None, f"{job_key(job)}/{name or _STATUS_FILE[0]}")
    return got if isinstance(got, dict) else {}


_UNWRITTEN: set[str] = set()  # status files whose last update failed because the store did not answer


def _update(settings: Settings, job: str, name: str, change: Callable[[dict], dict | None]) -> None:
    """Replace the status file `name` of `job` with `change(its content)` (nothing when that is None). A store that
    does not answer loses the update (the status is a report: its fields are written again as they change), said
    once in the log until an update lands."""
    key = f"{job_key(job)}/{name}"
    try:
        new = change(read_status(settings, job, name))
        if new is None:
            return
        write_json(settings.lake, new, key)
    except LakeUnreachable as e:
        if key not in _UNWRITTEN:
            _UNWRITTEN.add(key)
            log(f"{job}: cannot update {key} now: {e.reason}")
        return
    if key in _UNWRITTEN:
        _UNWRITTEN.discard(key)
        log(f"{job}: {key} updated again")


def _stop_between_batches(q, patience_s: float = 600.0) -> None:
    """Stop `q` once no micro-batch is in flight (waits up to `patience_s`; not at all when the process is
    stopping while Redis is down, `REDIS_DOWN`: that batch may wait for Redis indefinitely, and its Spark jobs are
    cancelled too, since tasks waiting for Redis in the executors' Python workers would run on after the query
    stopped and hold the process). An interrupted batch is replayed at the next start (its effect is idempotent)."""
    deadline = time.monotonic() + patience_s
    while q.isActive and time.monotonic() < deadline and not (STOP.is_set() and REDIS_DOWN.is_set()):
        try:
            if not q.status.get("isTriggerActive", False):
                break
        except Exception:  # noqa: BLE001 - the query may end while we ask
            break
        time.sleep(0.05)
    q.stop()
    if STOP.is_set() and REDIS_DOWN.is_set():
        _cancel_until_quiet()


def _cancel_until_quiet(quiet_s: float = 3.0, patience_s: float = 20.0) -> None:
    """Cancel every Spark job until none has been active for `quiet_s` (at most `patience_s`). `q.stop()` returns
    while the batch's Python callback may still run and submit a job (which then waits for Redis in the executors,
    where `STOP` is not seen); one cancel would miss it."""
    from pyspark import SparkContext

    sc = SparkContext.getOrCreate()
    started = quiet = time.monotonic()
    while time.monotonic() - started < patience_s:
        sc.cancelAllJobs()
        if sc.statusTracker().getActiveJobsIds():
            quiet = time.monotonic()
        elif time.monotonic() - quiet >= quiet_s:
            return
        time.sleep(0.2)


def offsets(lake: Lake, checkpoint: str, batch_id: int) -> list[dict | None] | None:
    """The end offset of each source of the query checkpointed at key `checkpoint` of `lake` after micro-batch
    `batch_id` (None: no offset yet), from the query's offset log (`offsets/<batch_id>`: a version line, the
    batch's metadata, one line per source); None when that file is not there or not readable."""
    try:
        lines = lake.read_bytes(checkpoint, "offsets", str(batch_id)).decode().splitlines()
        return [None if x.strip() == "-" else json.loads(x) for x in lines[2:]]
    except (NotFound, ValueError):
        return None


def committed_batches(lake: Lake, checkpoint: str) -> list[int]:
    """The ids of the micro-batches the checkpoint at key `checkpoint` of `lake` lists as committed (its
    `commits/` log, Spark keeping the last hundred or so), ascending; [] for none or no checkpoint."""
    return sorted(int(e.name) for e in lake.list(checkpoint, "commits") if e.name.isdigit() and not e.is_dir)


def moved_sources(lake: Lake, checkpoint: str, batch_id: int) -> list[dict] | None:
    """The end offsets of the sources whose offset moved in micro-batch `batch_id` of the query checkpointed at
    key `checkpoint` of `lake`: the only sources with input in it (a source whose offset did not move has none).
    Read from the offset log, which Spark writes before it runs the batch, without a Spark job. None when it cannot
    be told: the first batch of a checkpoint, or a log that is not there or not readable."""
    before, after = offsets(lake, checkpoint, batch_id - 1), offsets(lake, checkpoint, batch_id)
    if before is None or after is None or len(before) != len(after):
        return None
    return [a for b, a in zip(before, after, strict=True) if a != b]


def run_stream(
    stream_df,
    process,
    *,
    checkpoint: str,
    once: bool,
    settings: Settings,
    name: str,
    healthy: Callable[[], None] | None = None,
):
    """Run `process(batch_df, batch_id)` over `stream_df` with exactly-once checkpointing; the query is `name`.

    once: process everything available now (possibly several micro-batches, availableNow) and return.
    Otherwise one long-lived query with a processingTime trigger of TRIGGER_INTERVAL: a commit to a source log
    is planned at the next trigger, i.e. within one interval after the batch in flight. It runs until
    SIGTERM/SIGINT (`STOP`), then stops after the micro-batch in flight, or until another thread stops it (the
    deployed job's guard on a generation switch); both return normally. A failed query raises QueryFailed.
    `healthy` (continuous runs) is called once, when the query completed its first trigger (Spark reported
    progress: its sources answered and the micro-batch it ran, if any, succeeded).
    """
    writer = (
        stream_df.writeStream.queryName(name)
        .foreachBatch(process)
        .option("checkpointLocation", str(checkpoint))  # a URI (tests may pass a local Path)
    )
    if once:
        q = writer.trigger(availableNow=True).start()
        q.awaitTermination()
        return q
    interval_ms = settings.trigger_interval_ms
    q = writer.trigger(processingTime=f"{interval_ms} milliseconds").start()
    stopping = STOP

    def _stop(signum, _frame):
        log(f"{name}: signal {signum}, stopping after the batch in flight")
        stopping.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    while q.isActive and not stopping.is_set():
        q.awaitTermination(0.5)
        if healthy is not None and q.isActive and q.lastProgress is not None:
            healthy()
            healthy = None
    if q.isActive:
        _stop_between_batches(q)
    if q.exception() is not None:
        raise QueryFailed(name, q.exception())
    return q


# a query that ran this long before failing counts as healthy: its restart waits 2 s again
HEALTHY_S = 300.0


class Restarts:
    """Restarts after a failed query: from the checkpoint, after 2, 4, ... 60 s (reset after a run of HEALTHY_S
    seconds); each failure recorded in `status` (`restarting`, the error in one line), `running` again after the wait."""

    def __init__(self, settings: Settings, job: str):
        self.settings, self.job, self.failures, self.total = settings, job, 0, 0

    def after(self, e: Exception, started: float) -> None:
        if time.monotonic() - started > HEALTHY_S:
            self.failures = 0
        self.failures += 1
        self.total += 1
        delay = min(60, 2**self.failures)
        log(
            f"{self.job}: query failed, restarting from its checkpoint in {delay}s (failure {self.failures}): {e}"
        )
        record_error(self.settings, self.job, e, restarts=self.total, state="restarting")
        STOP.wait(delay)
        if not STOP.is_set():
            write_status(self.settings, self.job, state="running")
