"""`python -m jobs.dev.spark_cluster start|stop` (`make spark-cluster`, `make spark-cluster-stop`): a Spark
standalone cluster on this machine; `scratch_spark_cluster` for tests.

The master and the workers are the classes pyspark ships, started with pyspark's own `bin/spark-class`
(`org.apache.spark.deploy.master.Master`, `org.apache.spark.deploy.worker.Worker`), each its own JVM
(`SPARK_DAEMON_MEMORY`, default here 256m) listening on 127.0.0.1 only. Each worker runs in a directory of its own
(`worker-<i>`: its current directory, `work/` its `SPARK_WORKER_DIR` where executors run, `local/` its
`SPARK_LOCAL_DIRS` for shuffle and spill files, `worker.log`), so executors share no directory with each other or
with the driver: whatever a job needs must come through the lake (HDFS, S3) or Spark itself. Executors run this
venv's python (`PYSPARK_PYTHON`). Each worker offers `SPARK_WORKER_CORES` cores (default 1) and
`SPARK_WORKER_MEMORY` of executor memory (default 1g).

- start: if something accepts connections at SPARK_MASTER's port (default `spark://127.0.0.1:7077`), nothing is
  done; else, for a loopback address, the master starts there (web UI on 8080 when free, else a port the OS
  picks) and `SPARK_WORKERS` workers (default 2), files under `dev_dir("spark-cluster")`
  (LAKE_DIR/spark-cluster), pids in `pids`, the web UI's URL in `web.url`; returns once every worker has
  registered. Not loopback: an error.
- stop: SIGTERM to the master and the workers (and their executors), SIGKILL after 30 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pyspark

from jobs.dev import (
    DevServerFailed,
    dev_dir,
    free_port,
    java_exe,
    port_answers,
    spawn,
    stop_pid_file,
    wait_until,
)

__all__ = [
    "DEFAULT_MASTER",
    "DEFAULT_WORKERS",
    "SPARK_HOME",
    "SparkCluster",
    "start_cluster",
    "wait_cluster",
    "scratch_spark_cluster",
    "main",
]

DEFAULT_MASTER = "spark://127.0.0.1:7077"
DEFAULT_WORKERS = 2
WEB_PORT = 8080  # Spark's default master web UI port, used by `make spark-cluster` when free
SPARK_HOME = Path(pyspark.__file__).parent
_MASTER_CLASS, _WORKER_CLASS = (
    "org.apache.spark.deploy.master.Master",
    "org.apache.spark.deploy.worker.Worker",
)


class SparkCluster:
    """A running standalone cluster: `master` (`spark://127.0.0.1:<port>`), `web_url` (the master's web UI, whose
    `/json/` lists the workers), `worker_dirs` (one per worker: `work/` holds its executors' directories),
    `procs` (master first); `stop()` stops them all."""

    def __init__(self, base: Path, port: int, web_port: int, procs: list[subprocess.Popen]):
        self.base, self.port, self.web_port, self.procs = base, port, web_port, procs
        self.master = f"spark://127.0.0.1:{port}"
        self.web_url = f"http://127.0.0.1:{web_port}"
        self.worker_dirs = [base / f"worker-{i}" for i in range(1, len(procs))]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)


def _env(local_dirs: Path | None = None, worker_dir: Path | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_MASTER_HOST": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_DAEMON_MEMORY": os.environ.get("SPARK_DAEMON_MEMORY", "256m"),
    }
    if local_dirs is not None and worker_dir is not None:
        env.update(SPARK_LOCAL_DIRS=str(local_dirs), SPARK_WORKER_DIR=str(worker_dir))
    return env


def start_cluster(
    base: Path, port: int, web_port: int, workers: int, *, detach: bool
) -> list[subprocess.Popen]:
    """Start a master on 127.0.0.1:`port` (web UI on `web_port`) and `workers` workers, each in `base/worker-<i>`;
    return their processes, master first (not yet registered: `wait_cluster`). detach: as `jobs.dev.spawn`."""
    java_exe("Spark's standalone cluster")
    cls = str(SPARK_HOME / "bin" / "spark-class")
    master_dir = base / "master"
    master_dir.mkdir(parents=True, exist_ok=True)
    cmd = [cls, _MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web_port)]
    procs = [spawn(cmd, master_dir / "master.log", detach=detach, cwd=master_dir, env=_env())]
    cores, memory = os.environ.get("SPARK_WORKER_CORES", "1"), os.environ.get("SPARK_WORKER_MEMORY", "1g")
    for i in range(1, workers + 1):
        wdir = base / f"worker-{i}"
        (wdir / "work").mkdir(parents=True, exist_ok=True)
        (wdir / "local").mkdir(exist_ok=True)
        cmd = [cls, _WORKER_CLASS, "--host", "127.0.0.1", "--cores", cores, "--memory", memory]
        cmd += [
            "--webui-port",
            str(free_port()),
            "--work-dir",
            str(wdir / "work"),
            f"spark://127.0.0.1:{port}",
        ]
        env = _env(wdir / "local", wdir / "work")
        procs.append(spawn(cmd, wdir / "worker.log", detach=detach, cwd=wdir, env=env))
    return procs


def _alive_workers(web_url: str) -> int:
    """The workers the master's web UI says are alive; 0 while the UI is starting (an empty or partial answer)."""
    with urllib.request.urlopen(f"{web_url}/json/", timeout=2) as r:
        try:
            return int(json.load(r).get("aliveworkers", 0))
        except ValueError:
            return 0


def wait_cluster(procs: list[subprocess.Popen], base: Path, web_port: int, timeout_s: float = 300.0) -> None:
    """Return once every worker of `procs` has registered with the master (its web UI's `/json/` says so);
    DevServerFailed (with the end of a log) if one exits first or it takes longer than `timeout_s`."""
    want = len(procs) - 1

    def ready() -> bool:
        return _alive_workers(f"http://127.0.0.1:{web_port}") >= want

    wait_until(
        ready, procs, base / "master" / "master.log", f"the Spark master and {want} workers", timeout_s
    )


def scratch_spark_cluster(base: Path, workers: int = DEFAULT_WORKERS) -> SparkCluster:
    """Start a master and `workers` workers on free loopback ports with their files under `base`; return the
    cluster once every worker has registered (the caller stops it). DevServerFailed if it cannot."""
    port, web_port = free_port(), free_port()
    procs = start_cluster(Path(base), port, web_port, workers, detach=False)
    wait_cluster(procs, Path(base), web_port)
    return SparkCluster(Path(base), port, web_port, procs)


def _start(master: str, workers: int) -> int:
    parsed = urlparse(master)
    if parsed.scheme != "spark" or not parsed.port:
        print(f"make spark-cluster: SPARK_MASTER={master} is not spark://host:port", file=sys.stderr)
        return 1
    if port_answers(parsed.hostname or "", parsed.port):
        print(f"something answers at {master} (taken to be a Spark master); nothing started")
        return 0
    if parsed.hostname not in ("127.0.0.1", "localhost"):
        print(
            f"make spark-cluster: nothing answers at SPARK_MASTER={master} and it is not loopback",
            file=sys.stderr,
        )
        return 1
    base = dev_dir("spark-cluster")
    web_port = WEB_PORT if not port_answers("127.0.0.1", WEB_PORT) else free_port()
    try:
        procs = start_cluster(base, parsed.port, web_port, workers, detach=True)
        (base / "pids").write_text("".join(f"{p.pid}\n" for p in procs))
        wait_cluster(procs, base, web_port)
    except DevServerFailed as e:
        print(f"make spark-cluster: {e}", file=sys.stderr)
        return 1
    (base / "web.url").write_text(f"http://127.0.0.1:{web_port}\n")
    print(
        f"started a Spark {pyspark.__version__} standalone master at spark://127.0.0.1:{parsed.port} (web UI "
        f"http://127.0.0.1:{web_port}) and {workers} workers, each in its own directory under {base}; "
        "`make spark-cluster-stop` stops them"
    )
    return 0


def _stop() -> int:
    stopped = stop_pid_file(dev_dir("spark-cluster") / "pids", marker="org.apache.spark.deploy.")
    print(
        f"stopped the Spark master and workers (pids {', '.join(map(str, stopped))})"
        if stopped
        else "no Spark cluster started by `make spark-cluster` runs; nothing to do"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    action = args[0] if args else "start"
    if action not in ("start", "stop"):
        print("usage: python -m jobs.dev.spark_cluster start|stop", file=sys.stderr)
        return 2
    if action == "stop":
        return _stop()
    master = os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    if not master.startswith("spark://"):  # e.g. local[*] in the environment: the target's default
        master = DEFAULT_MASTER
    try:
        workers = int(os.environ.get("SPARK_WORKERS") or DEFAULT_WORKERS)
    except ValueError:
        print(
            f"make spark-cluster: SPARK_WORKERS must be a number, got {os.environ['SPARK_WORKERS']!r}",
            file=sys.stderr,
        )
        return 1
    return _start(master, workers)


if __name__ == "__main__":
    sys.exit(main())
