"""Shared fixtures: one SparkSession per test session (local[2], UI off, 2 shuffle partitions) and a real
redis-server started on a free port for the session; each test gets an empty Redis db and its own lake dir."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import orjson
import pytest
import redis

from jobs.settings import Settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail(
            "redis-server is not installed: apt-get install -y redis-server (make setup does it as root)"
        )
    port = _free_port()
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(d),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield {"url": url, "port": port, "proc": proc}
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def redis_url(redis_server):
    client = redis.Redis.from_url(redis_server["url"])
    client.flushall()
    return redis_server["url"]


@pytest.fixture
def rclient(redis_url):
    return redis.Redis.from_url(redis_url)


def write_jsonl(path: Path, records) -> str:
    """Write `records` as a JSON-lines file (the ingest input format); return its path."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def split_at_random(records: list, n: int, rng) -> list[list]:
    """`records` cut into `n` non-empty consecutive chunks at random points (a chunking of one arrival order)."""
    cuts = sorted(rng.sample(range(1, len(records)), n - 1)) if n > 1 else []
    bounds = [0, *cuts, len(records)]
    return [records[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def make_settings(lake_dir: Path, redis_url: str, **over) -> Settings:
    env = {
        "LAKE_DIR": str(lake_dir),
        "REDIS_URL": redis_url,
        "SPARK_MASTER": "local[2]",
        "SHUFFLE_PARTITIONS": "2",
        "SPARK_DRIVER_MEMORY": "2g",
    }
    env.update({k: str(v) for k, v in over.items()})
    return Settings.from_env(env)


@pytest.fixture
def settings(tmp_path, redis_url) -> Settings:
    return make_settings(tmp_path / "lake", redis_url)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from jobs.spark import get_spark

    s = get_spark(make_settings(tmp_path_factory.mktemp("lake0"), "redis://127.0.0.1:1/0"), "mview-tests")
    yield s
    s.stop()
