"""Development and test servers, each a real server started on loopback, and the driver JVM's cache: `redis`
(`make redis`, `make redis-cluster`), `kafka` (`make kafka`), `connect` (Kafka Connect with Debezium, for tests),
`postgres` (`make postgres`), `jvmcache` (`make jvm-cache`), `warmup` (`make setup` fetches the jars); and for a lake
beyond one machine:

- `jobs.dev.hdfs` (`make hdfs`, `make hdfs-stop`): Hadoop's own NameNode and DataNode in one JVM
  (`MiniDFSCluster` of the Hadoop version PySpark ships) at `HDFS_URL` (default `hdfs://127.0.0.1:9000`).
- `jobs.dev.s3` (`make s3`, `make s3-stop`): S3Proxy with its filesystem backend at `S3_ENDPOINT` (default
  `http://127.0.0.1:9100`), the development credentials `DEV_CREDENTIALS` and the bucket `DEV_BUCKET`.
- `jobs.dev.spark_cluster` (`make spark-cluster`, `make spark-cluster-stop`): a Spark standalone master at the
  port of `SPARK_MASTER` (default `spark://127.0.0.1:7077`) and `SPARK_WORKERS` (default 2) workers, each in a
  working directory of its own.

Each module has a `scratch_*` function for tests (free ports, files in a directory the caller gives, the server
dying with the process that started it) and a `main` for its make targets. A make target's server keeps its files
(data, log, pid) in `dev_dir(name)`. Every failure to start is `DevServerFailed`, one line saying what is missing
and how to install it. This module holds what they share.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from jobs.errors import JobsError

__all__ = [
    "DevServerFailed",
    "dev_dir",
    "free_port",
    "port_answers",
    "java_exe",
    "jar_lib",
    "spawn",
    "wait_until",
    "stop_pid_file",
]

_JAVA_MISSING = "java is not installed, {what} needs Java 17+: apt-get install -y openjdk-17-jre-headless"


class DevServerFailed(JobsError):
    """A development or test server of `jobs.dev` cannot be set up or started (`reason` says why and what to
    do, in one line)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def dev_dir(name: str, env: dict[str, str] | None = None) -> Path:
    """The directory where `make <name>` keeps its server's files: `LAKE_DIR/<name>` when LAKE_DIR is a local
    path (default `./lake`), else (LAKE_DIR a URI such as `hdfs://...`, which may live on that very server)
    `./lake/<name>`. Absolute. LAKE_DIR is read as the settings read it (`jobs.core.settings.lake_location`)."""
    from jobs.core.settings import lake_location

    local, _uri = lake_location(env)
    return ((local or Path("./lake")) / name).resolve()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def java_exe(what: str) -> str:
    """The `java` of JAVA_HOME, else of PATH; DevServerFailed (naming `what` needs it, and how to install it)."""
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    exe = str(java) if java and java.is_file() else shutil.which("java")
    if exe is None:
        raise DevServerFailed(_JAVA_MISSING.format(what=what))
    return exe


def jar_lib(name: str, version: str, pom: str, what: str) -> Path:
    """`<venv>/mview-<name>/<version>/lib`, holding the runtime jars of `pom`'s dependencies, copied from Maven
    Central by `mvn dependency:copy-dependencies` on first use (as `jobs.dev.kafka` does for Kafka's jars);
    DevServerFailed if mvn is missing or cannot fetch them."""
    from jobs.dev.kafka import maven_lib

    lib = Path(sys.prefix) / f"mview-{name}" / version / "lib"
    try:
        return maven_lib(lib, pom, what, DevServerFailed)
    except DevServerFailed as e:
        if "could not fetch" in e.reason:
            raise DevServerFailed(f"{e.reason} (is Maven Central reachable from here?)") from None
        raise


def spawn(cmd: list[str], log: Path, *, detach: bool, cwd: Path | None = None, env=None) -> subprocess.Popen:
    """Start `cmd` with stdout and stderr appended to `log`. detach: in its own session, outliving this process
    (a make target's server); else in its own process group, killed by the kernel when the thread that started
    it ends (Linux, `setpriv`), so a test run never leaves one behind."""
    setpriv = shutil.which("setpriv")
    if not detach and setpriv:
        cmd = [setpriv, "--pdeathsig", "KILL", *cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )


def wait_until(ready, procs: list[subprocess.Popen], log: Path, what: str, timeout_s: float) -> None:
    """Return once `ready()` is true; DevServerFailed (with the end of `log`) if one of `procs` exits first or
    `timeout_s` passes (then every one of `procs` is killed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise DevServerFailed(f"{what} exited (code {proc.returncode}); see {log}: {_tail(log)}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.25)
    for proc in procs:
        _kill_group(proc.pid, signal.SIGKILL)
    raise DevServerFailed(f"{what} did not answer within {timeout_s:.0f} s; see {log}: {_tail(log)}")


def _tail(log: Path, lines: int = 2) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    wanted = [ln for ln in text if "ERROR" in ln or "Exception" in ln] or text
    return " | ".join(ln.strip()[:300] for ln in wanted[-lines:]) or "empty log"


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_pid_file(pid_file: Path, marker: str, timeout_s: float = 30.0) -> list[int]:
    """Stop the processes whose ids `pid_file` lists (one a line; each the leader of its own process group, as
    `spawn` starts them) and whose command line still contains `marker` (so a reused id is never signalled):
    SIGTERM to each group, SIGKILL to what still runs after `timeout_s`. Removes the file; returns the ids that
    were running."""
    try:
        pids = [int(p) for p in pid_file.read_text().split()]
    except (FileNotFoundError, ValueError):
        pid_file.unlink(missing_ok=True)
        return []
    running = [p for p in pids if marker in _cmdline(p)]
    for pid in running:
        _kill_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in running):
        time.sleep(0.2)
    for pid in running:
        if Path(f"/proc/{pid}").exists():
            _kill_group(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return running
