"""`python -m jobs.dev.redis`: start a development redis-server at REDIS_URL unless one already answers there;
`python -m jobs.dev.redis --cluster`: a local three-master Redis Cluster whose first node is at REDIS_URL.
`scratch_redis` / `scratch_redis_cluster`: throw-away ones for tests and benchmarks."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

from jobs.core.settings import Settings
from jobs.errors import RedisServerMissing
from views.errors import RedisMisconfigured
from views.redis_io import probe, redact_url

__all__ = [
    "main",
    "scratch_redis",
    "scratch_redis_cluster",
    "start_cluster_node",
    "free_port",
    "CLUSTER_MASTERS",
]

CLUSTER_MASTERS = 3

_MISSING = "redis-server is not installed: apt-get install -y redis-server (or run `make setup` as root)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scratch_redis(workdir: Path) -> tuple[subprocess.Popen, int]:
    """Start a redis-server on a free local port, without persistence, files under `workdir`; return the process
    (the caller terminates it) and the port once it answers. RedisServerMissing (saying what to do) if it cannot."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RedisServerMissing(_MISSING)
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if _wait_answer(port):
        return proc, port
    proc.terminate()
    raise RedisServerMissing(f"redis-server did not answer on port {port} within 5 s")


def _cluster_node_args(port: int, workdir: Path) -> list[str]:
    return [
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        f"nodes-{port}.conf",
        "--cluster-node-timeout",
        "2000",
        "--dir",
        str(workdir),
    ]


def _create_cluster(ports: list[int]) -> None:
    """Join the masters at `ports` into one cluster (`redis-cli --cluster create`, no replicas) and wait until
    every node reports the cluster `ok`."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RedisServerMissing("redis-cli is not installed: apt-get install -y redis-tools")
    nodes = [f"127.0.0.1:{p}" for p in ports]
    done = subprocess.run(
        [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RedisServerMissing(
            f"redis-cli --cluster create failed: {done.stdout[-300:]}{done.stderr[-300:]}"
        )
    for _ in range(200):
        if all(b"cluster_state:ok" in redis.Redis(port=p).execute_command("CLUSTER", "INFO") for p in ports):
            return
        time.sleep(0.05)
    raise RedisServerMissing(f"the Redis Cluster at {', '.join(nodes)} did not reach state ok within 10 s")


def _wait_answer(port: int) -> bool:
    """Whether a Redis answers PING on `port` within 5 s (a process there that is not one does not hold it up)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return True
        except OSError:  # refused, reset or timed out
            pass
        time.sleep(0.05)
    return False


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _ephemeral_low() -> int:
    """The lowest port the OS hands out for port 0 and outgoing connections (Linux's ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _cluster_ports() -> list[int]:
    """`CLUSTER_MASTERS` free ports whose cluster bus ports (port + 10000) are free too, both below the OS's
    ephemeral range where it can (ports 12768-32767 by default): a port is chosen before its node binds it, and in
    that range a server started on port 0 or an outgoing connection could take it in between."""
    rng = random.Random()
    top = _ephemeral_low() - 10000
    lo, hi = (max(1024, top - 10000), top) if top - 1024 >= 1000 else (20000, 55000)
    ports: list[int] = []
    while len(ports) < CLUSTER_MASTERS:
        p = rng.randrange(lo, hi)
        if p not in ports and _free(p) and _free(p + 10000):
            ports.append(p)
    return ports


def start_cluster_node(port: int, workdir: Path, *, persist: bool = False) -> subprocess.Popen:
    """Start (or start again, with its saved cluster config) the cluster node on `port`, files under `workdir`;
    with `persist`, every write is in its append-only file before it is acknowledged (it survives a kill -9)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RedisServerMissing(_MISSING)
    durability = ["--appendonly", "no"]
    if persist:  # one append-only directory per node: they share `workdir`
        durability = ["--appendonly", "yes", "--appendfsync", "always", "--appenddirname", f"aof-{port}"]
    return subprocess.Popen(
        [exe, *_cluster_node_args(port, workdir), "--save", "", *durability],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def scratch_redis_cluster(
    workdir: Path, *, persist: bool = False
) -> tuple[list[subprocess.Popen], list[int]]:
    """Start a Redis Cluster of `CLUSTER_MASTERS` masters (no replicas; persistence as `start_cluster_node`) on
    free local ports, files under `workdir`; return the processes (the caller terminates them) and their ports, in
    the order of the slots they serve. RedisServerMissing (saying what to do) if it cannot."""
    ports = _cluster_ports()
    procs = [start_cluster_node(p, workdir, persist=persist) for p in ports]
    try:
        for p in ports:
            if not _wait_answer(p):
                raise RedisServerMissing(f"redis-server (cluster node) did not answer on port {p} within 5 s")
        _create_cluster(ports)
    except BaseException:
        for proc in procs:
            proc.terminate()
        raise
    return procs, ports


def _start_cluster(s: Settings, port: int, exe: str) -> int:
    """`make redis-cluster`: masters on `port`, `port`+1, ... daemonized, data and logs under LAKE_DIR/redis-cluster."""
    data = s.lake_dir / "redis-cluster"
    data.mkdir(parents=True, exist_ok=True)
    ports = [port + i for i in range(CLUSTER_MASTERS)]
    fresh = not any((data / f"nodes-{p}.conf").exists() for p in ports)
    for p in ports:
        log = str(data / f"redis-{p}.log")
        subprocess.run(
            [exe, *_cluster_node_args(p, data), "--daemonize", "yes", "--logfile", log], check=True
        )
        if not _wait_answer(p):
            print(f"redis-server did not answer on port {p}; see {log}", file=sys.stderr)
            return 1
    if fresh:
        _create_cluster(ports)
    nodes = ", ".join(f"127.0.0.1:{p}" for p in ports)
    print(f"started a Redis Cluster of {CLUSTER_MASTERS} masters at {nodes} (data and logs in {data})")
    print(f"use it with REDIS_URL=redis://127.0.0.1:{ports[0]}/0 REDIS_CLUSTER=true")
    return 0


def _listpack_entries(settings) -> int:
    """Redis's `zset-max-listpack-entries` for the pipeline's list views: their greatest cap, at least Redis's 128."""
    from spec import PipelineError
    from views.list import list_caps

    try:
        caps = list_caps(settings.pipeline().views.values())
    except PipelineError:
        caps = []
    return max([128, *caps])


def main() -> int:
    s = Settings.from_env()
    shown = redact_url(s.redis_url)
    problem = probe(s.redis_url)
    if problem is None:
        print(f"redis answers at {shown}")
        return 0
    if isinstance(problem, RedisMisconfigured):  # a server answers there: starting another cannot help
        print(problem, file=sys.stderr)
        return 1
    u = urlparse(s.redis_url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        print(f"nothing answers at {shown} and it is not local: start that server", file=sys.stderr)
        return 1
    exe = shutil.which("redis-server")
    if exe is None:
        print(_MISSING, file=sys.stderr)
        return 1
    if "--cluster" in sys.argv[1:]:
        return _start_cluster(s, u.port or 6379, exe)
    data = s.lake_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            exe,
            "--port",
            str(u.port or 6379),
            "--bind",
            "127.0.0.1",
            "--daemonize",
            "yes",
            "--dir",
            str(data),
            "--logfile",
            str(data / "redis.log"),
            "--save",
            "60 1000",
            "--appendonly",
            "no",
            # capped lists stay compact listpacks (22 B per entry instead of 104 B: docs/bench.md)
            "--zset-max-listpack-entries",
            str(_listpack_entries(s)),
        ],
        check=True,
    )
    for _ in range(50):
        try:
            redis.Redis.from_url(s.redis_url, socket_connect_timeout=1).ping()
            print(f"started redis-server at {shown} (data and log in {data})")
            return 0
        except (redis.ConnectionError, OSError):
            time.sleep(0.1)
    print(f"redis-server did not answer at {shown}; see {data / 'redis.log'}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
