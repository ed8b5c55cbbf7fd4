"""`mview deploy JOB` / `mview stop JOB`: a job as a background process with a pid file and a log.

What a deployed process leaves is of two kinds. In the lake, under `jobs/<job>/` (through `settings.lake`, any
store): `status.json` (written by the job) and the driver's lease `lease.<epoch>` (held by the running job on
whatever machine it runs, see `jobs.ops.service` and `jobs.core.lease`). Machine-local, on the machine that
deployed it (`local_dir`): `pid` (the driver's pid, which is also its process group), `job.log` (stdout and stderr
of the driver, the Spark JVM and local executors, appended across runs) and `deploy.lock` (a flock held while a
deploy starts it, guarding the pid file). On a local lake the local directory is the job's directory in the lake,
`LAKE_DIR/jobs/<job>/`, exactly as before; on HDFS or S3 it is `$XDG_STATE_HOME/mview/<lake>/jobs/<job>/`
(default `~/.local/state/...`, `<lake>` a digest of LAKE_DIR). The directory is its owner's only (0700) and so is
every file in it (0600, `runtime.open_private`, and the local store's mode for lake files); the job itself runs with
umask 077, so what Spark writes in a local lake is owner-only too.

A job runs once, on any machine: the driver's lease decides (`jobs.ops.service`). `deploy` says a job runs when
its pid file names a live driver here, or when the lease has a live holder (another machine, or another HOME of
this one: `running`, `driver_of`); otherwise it starts one, which takes the lease over from a driver that was
killed (at once on this machine, after the lease's TTL when it ran elsewhere).

- deploy: if Redis answers but cannot be used (refused credentials, TLS mismatch), a one-line error, exit 1,
  nothing started; a job with its own check (`JobSpec.probe`: `cdc` checks PG_DSN, which must parse and whose
  credentials the server must accept) is refused the same way by what that check raises. If the job runs, says
  so and does nothing (exit 0), unless its serving generation was built from another definition than the pipeline
  file's (`jobs.core.generations.definition_changed`): then it says what changed and restarts the driver, whose
  start rebuilds into generation n+1 while n serves (`mview run` does the same); a driver on another machine is
  left alone, exit 1, saying to stop it there. Otherwise removes what a killed run may have left (its JVM, its process group),
  starts `python -m jobs run JOB` in a new session with the settings in its environment, writes the pid file and
  returns 0 once the process is up (1, with the log's tail, if it died; the tail with every password masked).
- stop: SIGTERM to the driver, which finishes its micro-batch in flight and exits; waits up to STOP_TIMEOUT,
  then writes the stacks of the driver's threads and of its JVM's threads to its log (`dump_stacks`) and SIGKILLs
  the process group (safe: the next start replays the interrupted batch). Not running: says so, exit 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from changelog.errors import PostgresUnavailable
from jobs.core.lease import holder_of, this_node
from jobs.core.registry import job_spec
from jobs.core.runtime import job_lease_key, open_private, read_status
from jobs.core.settings import Settings
from views.errors import RedisMisconfigured, ViewError, redact
from views.redis_io import probe

__all__ = ["deploy", "stop", "pid_of", "running", "driver_of", "local_dir", "log_path", "settings_env"]

# Settings fields whose environment variable is not simply the field name in upper case.
_ENV_NAMES = {
    "driver_memory": "SPARK_DRIVER_MEMORY",
    "pipeline_file": "MVIEW_PIPELINE",
    "lake_uri": "LAKE_DIR",
}


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment variables that reproduce `settings` in a child process: the environment they were read
    from (what the pipeline file's `${VAR}` read, e.g. the built-in file's PG_TABLE), then one variable per
    setting."""
    env = dict(settings.env)
    for f in dataclasses.fields(settings):
        if not f.init or f.name in ("env", "lake_dir"):  # derived; the environment, above; LAKE_DIR: lake_uri
            continue
        value = getattr(settings, f.name)
        if value is None:  # an optional feature turned off (JVM_CACHE, METRICS_PORT)
            value = "off"
        elif isinstance(value, tuple):
            value = ",".join(value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        env[_ENV_NAMES.get(f.name, f.name.upper())] = str(value)
    return env


def _local_root(settings: Settings, job: str) -> Path:
    if settings.lake_dir is not None:
        return settings.lake_dir / "jobs" / job
    home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    digest = hashlib.sha256(settings.lake.uri().encode()).hexdigest()[:16]
    return Path(home, "mview", digest, "jobs", job)


def local_dir(settings: Settings, job: str) -> Path:
    """The directory of the deployed job's machine-local files (see the module docstring), made if missing: its
    owner's only (0700, also where an older version made it 0755), whichever process makes it, with its umask."""
    d = _local_root(settings, job)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    if d.stat().st_mode & 0o077:
        try:
            d.chmod(0o700)
        except PermissionError:  # another user's directory (a shared lake): its files are 0600 all the same
            pass
    return d


def log_path(settings: Settings, job: str) -> Path:
    """The deployed job's log on this machine (stdout and stderr of its driver, appended across runs)."""
    return local_dir(settings, job) / "job.log"


def _pid_file(settings: Settings, job: str) -> Path:
    return _local_root(settings, job) / "pid"  # not local_dir(): reading a status must create nothing


def driver_of(settings: Settings, job: str) -> dict | None:
    """The lease record of `job`'s live driver on any machine (`host`, `pid`, `node`: `jobs.core.lease.holder_of`),
    None when no driver holds the job's lease. By wall clock for a driver elsewhere: for display and decisions that
    leave a live driver alone, never for mutual exclusion (the lease itself is that)."""
    return holder_of(settings.lake, job_lease_key(job))


def running(settings: Settings, job: str) -> bool:
    """Whether `job` has a live driver: the one this machine deployed (`pid_of`) or a holder of its lease."""
    return pid_of(settings, job) is not None or driver_of(settings, job) is not None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a live process, None if gone. Zombies count as gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    state, pgrp = fields[0], int(fields[2])
    return None if state in ("Z", "X") else (state, pgrp)


def _group_members(pgid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            st = _proc_stat(int(p.name))
            if st is not None and st[1] == pgid:
                out.append(int(p.name))
    return out


def _is_java(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def dump_stacks(pid: int, wait_s: float = 1.0) -> None:
    """Have the deployed driver `pid` write the stack of every thread to its log: its Python threads' (SIGUSR1,
    which `jobs.ops.service.serve` hands to `faulthandler`), then, `wait_s` later (the two would interleave in the
    file), its JVM's (SIGQUIT to each `java` process of its process group: the JVM prints a thread dump to its
    stdout, the log, and runs on); waits `wait_s` again for that. For a driver that does not stop: what each thread
    was waiting on."""
    for signum, members in (
        (signal.SIGUSR1, [pid]),
        (signal.SIGQUIT, [m for m in _group_members(pid) if _is_java(m)]),
    ):
        for member in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signum)
        time.sleep(wait_s)


def pid_of(settings: Settings, job: str) -> int | None:
    """The pid of the deployed job's driver if it is alive (and is this job's driver), else None."""
    try:
        pid = int(_pid_file(settings, job).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if _proc_stat(pid) is None:
        return None
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return pid if b"jobs" in cmd and job.encode() in cmd else None  # a recycled pid is someone else


def _reap_group(pgid: int, *, grace_s: float) -> None:
    """Wait up to `grace_s` for the processes of group `pgid` to exit, then SIGKILL the rest."""
    deadline = time.monotonic() + grace_s
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_members(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while _group_members(pgid):
            time.sleep(0.05)


def _says_running(settings: Settings, job: str) -> bool:
    """True, having said so, when `job` runs: its process here, or a driver holding its lease elsewhere."""
    pid = pid_of(settings, job)
    if pid is not None:
        print(f"{job}: already running (pid {pid}); nothing to do")
        return True
    driver = driver_of(settings, job)
    if driver is not None:  # deployed from another machine, or from another HOME on a remote lake
        where = "" if driver.get("node") == this_node() else f" on {driver.get('host')}"
        print(f"{job}: already running{where} (pid {driver.get('pid')}); nothing to do")
        return True
    return False


def _changed_definition(settings: Settings, spec, problem) -> str | None:
    """Why the serving generation of `spec` is not built from the pipeline as `settings` read it
    (`jobs.core.generations.definition_changed`), or None: it is, or Redis cannot tell now (`problem`)."""
    if spec.source or problem is not None:
        return None
    import redis

    from jobs.core.generations import definition_changed
    from views.redis_io import connect

    try:
        return definition_changed(settings, connect(settings.redis_url, wait=False), spec)
    except (
        redis.RedisError,
        OSError,
        ViewError,
    ):  # Redis stopped answering meanwhile: the driver checks at start
        return None


def _restart_if_changed(settings: Settings, spec, problem) -> int | None:
    """For a running job whose serving generation has another definition (`_changed_definition`): stop its driver
    here so the start that follows rebuilds into a new generation while the serving one keeps serving, saying so in
    one line; None then, and when the job does not run or its definition did not change. Otherwise the exit code,
    having said why: 0 when the driver rebuilds for this change already, 1 when it runs on another machine."""
    job = spec.name
    changed = _changed_definition(settings, spec, problem) if running(settings, job) else None
    if changed is None:
        return None
    driver = driver_of(settings, job) if pid_of(settings, job) is None else None
    if driver is not None and driver.get("node") != this_node():
        print(
            f"{job}: runs on {driver.get('host')} (pid {driver.get('pid')}) and its serving generation has another "
            f"definition ({changed}): `mview stop {job}` there, then deploy again",
            file=sys.stderr,
        )
        return 1
    rebuilding = read_status(settings, job, "status.json").get("rebuilding") or {}
    if rebuilding.get("reason") == changed:
        print(f"{job}: already running and rebuilding ({changed}); nothing to do")
        return 0
    print(f"{job}: {changed}: restarting it to rebuild into a new generation while the serving one serves")
    with contextlib.redirect_stdout(io.StringIO()):
        stop(settings, job)
    return None


def deploy(settings: Settings, job: str) -> int:
    """Start `job` in the background unless it runs. Returns the exit code.

    Raises `RedisMisconfigured` (refused credentials, TLS mismatch: one line saying what to do) and starts
    nothing if Redis answers but cannot be used; an unreachable Redis does not prevent the start (the job waits
    for it, and says so). A job with its own check (`JobSpec.probe`) instead raises what that check raises
    (`cdc`: `PostgresMisconfigured`) and waits for what it returns (`PostgresUnavailable`).
    """
    spec = job_spec(settings, job)
    if spec.probe:
        problem = spec.call("probe", settings)  # raises what no retry can fix
    else:
        problem = None if spec.source else probe(settings.redis_url)  # a source job writes only the lake
        if isinstance(problem, RedisMisconfigured):
            raise problem
    if (code := _restart_if_changed(settings, spec, problem)) is not None:
        return code
    d = local_dir(settings, spec.name)
    with os.fdopen(open_private(d / "deploy.lock"), "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # two deploys here at once: the second sees the first's process
        if _says_running(settings, spec.name):
            return 0
        try:  # a killed driver's JVM may outlive it for a moment: it must be gone before a new start
            old = int(_pid_file(settings, spec.name).read_text().strip())
            _reap_group(old, grace_s=10)
        except (FileNotFoundError, ValueError):
            pass
        env = {**os.environ, **settings_env(settings)}
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        log = log_path(settings, spec.name)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # also a log an older version created world-readable
        with os.fdopen(fd, "ab") as out:
            out.write(f"\n==== deploy {spec.name} at {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
            out.flush()
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobs", "run", spec.name],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                umask=0o077,  # the job's files (status, logs, checkpoints) are readable by their owner only
            )
        tmp = _pid_file(settings, spec.name).with_suffix(".tmp")
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as fh:
            fh.write(f"{proc.pid}\n")
        tmp.replace(_pid_file(settings, spec.name))
    time.sleep(1.0)
    if proc.poll() is not None:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print(f"{spec.name}: exited at start (code {proc.returncode}); end of {log}:", file=sys.stderr)
        print(redact("\n".join(tail), settings.redis_url, settings.pg_dsn), file=sys.stderr)
        return 1
    print(f"{spec.name}: deployed (pid {proc.pid}); log {log}; `mview status` shows progress")
    if isinstance(problem, PostgresUnavailable):
        print(f"{spec.name}: PostgreSQL at PG_DSN ({problem.dsn}) does not answer yet: the job waits for it")
    elif problem is not None:
        print(f"{spec.name}: {problem.url} does not answer yet: the job waits for Redis and then catches up")
    return 0


def stop(settings: Settings, job: str) -> int:
    """Stop the deployed `job` after its micro-batch in flight. Returns the exit code."""
    spec = job_spec(settings, job)
    pid = pid_of(settings, spec.name)
    if pid is None:
        driver = driver_of(settings, spec.name)
        if driver is not None and driver.get("node") != this_node():
            print(
                f"{spec.name}: runs on {driver.get('host')} (pid {driver.get('pid')}): stop it there",
                file=sys.stderr,
            )
            return 1
        if driver is not None:  # deployed from another HOME of this machine (a remote lake)
            pid = int(driver["pid"])
    if pid is None:
        print(f"{spec.name}: not running; nothing to do")
        return 0
    os.kill(pid, signal.SIGTERM)
    print(f"{spec.name}: stopping pid {pid} after the batch in flight ...", flush=True)
    deadline = time.monotonic() + settings.stop_timeout_ms / 1000
    while _proc_stat(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = _proc_stat(pid) is not None
    if killed:
        dump_stacks(pid)
        print(
            f"{spec.name}: still running after {settings.stop_timeout}: SIGKILL (its threads' stacks are in "
            f"{log_path(settings, spec.name)})",
            file=sys.stderr,
        )
    _reap_group(pid, grace_s=0 if killed else 15)
    _pid_file(settings, spec.name).unlink(missing_ok=True)
    print(f"{spec.name}: stopped")
    return 0
