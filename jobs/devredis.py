"""`python -m jobs.devredis`: start a development redis-server at REDIS_URL unless one already answers there.
`scratch_redis`: a throw-away one for tests and benchmarks."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

from jobs.errors import RedisServerMissing
from jobs.settings import Settings
from views.errors import RedisMisconfigured
from views.redis_io import probe, redact_url

__all__ = ["main", "scratch_redis", "free_port"]

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
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.terminate()
    raise RedisServerMissing(f"redis-server did not answer on port {port} within 5 s")


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
