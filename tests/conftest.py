"""Shared fixtures: one SparkSession per test session (local[2], UI off, 2 shuffle partitions) and a real
redis-server started on a free port for the session; each test gets an empty Redis db and its own lake dir.

The servers beyond Redis (`tests.devhelp`, `tests.kafkahelp`, `tests.pghelp`: HDFS, S3, Kafka, PostgreSQL, a Spark
cluster) are one each per session too, and a test that uses one is an `e2e` test whether or not its module says
so (`pytest_collection_modifyitems` below): `make test-fast` (-m "not slow and not e2e") starts none of them. The
tests that run on one remote store per run say which (`tests.devhelp.one_store`) at the end of the run."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
import redis

from jobs.core.settings import Settings
from jobs.dev.redis import scratch_redis
from jobs.errors import JobsError
from tests.devhelp import SERVER_FIXTURES, hdfs_server, one_store, s3_server, spark_cluster  # noqa: F401
from tests.kafkahelp import kafka, kafka_broker  # noqa: F401
from tests.pghelp import pg, pg_server  # noqa: F401


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """Mark `e2e` every test whose fixtures include a server beyond Redis (`SERVER_FIXTURES`); then order the modules:
    those with an `e2e` test taking turns with those with a `slow` one, then the rest, each module's tests in their
    order. `make test` hands the two workers whole modules in this order (`--dist loadfile --no-loadscope-reorder`;
    xdist's own order, most tests first, put the longest modules, one scenario each, last), so the long ones start
    early, an end-to-end scenario's extra JVMs tend to run beside a module of the worker's own JVM rather than beside
    another scenario's, and the short modules even out the end; `make test-fast`, which has no e2e or slow test, keeps
    xdist's order."""
    rank: dict = {}
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
        mine = 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2
        rank[item.path] = min(rank.get(item.path, 2), mine)
    turns, taken = {}, [0, 0]
    for path in dict.fromkeys(item.path for item in items):  # the collection order within each rank
        if rank[path] == 2:
            turns[path] = (2, 0, 2)
        else:
            turns[path] = (1, taken[rank[path]], rank[path])
            taken[rank[path]] += 1
    items.sort(key=lambda item: turns[item.path])  # stable: each module's tests keep their order


@pytest.hookimpl(trylast=True)  # after the slowest tests
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Which remote store the `one_store` tests ran on, if any ran."""
    ran = {
        r.nodeid
        for reports in terminalreporter.stats.values()
        for r in reports
        if getattr(r, "when", None) == "call" and "one_store" in getattr(r, "keywords", {})
    }
    if ran:
        terminalreporter.write_line(
            f"{len(ran)} one-store tests ran on {one_store()} (MVIEW_TEST_STORE=hdfs|s3; by default it alternates"
            " by day)"
        )


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    try:
        proc, port = scratch_redis(tmp_path_factory.mktemp("redis"))
    except JobsError as e:
        pytest.fail(str(e))
    url = f"redis://127.0.0.1:{port}/0"
    yield {"url": url, "port": port, "proc": proc}
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A real three-master Redis Cluster for the session (started on first use): {"url", "ports", "procs"}."""
    from jobs.dev.redis import scratch_redis_cluster

    try:
        procs, ports = scratch_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    except JobsError as e:
        pytest.fail(str(e))
    yield {"url": f"redis://127.0.0.1:{ports[0]}/0", "ports": ports, "procs": procs}
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)


@pytest.fixture
def redis_server_url(redis_server):
    """The session redis-server's URL, emptied for the test."""
    client = redis.Redis.from_url(redis_server["url"])
    client.flushall()
    return redis_server["url"]


@pytest.fixture
def redis_url(redis_server_url):
    return redis_server_url


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


# Every JVM of the tests interprets Spark's plans instead of generating Java code for them (the JVMs read `spark.*`
# system properties as their Spark settings; NO_CODEGEN turns off whole-stage code too): on batches of a few rows,
# Spark generated and formatted the source of the projections outside whole-stage code anew in every task (Delta's
# log replay over its wide action schema most), ~13% of a test JVM's CPU. A deployed job and the bench generate code.
# And they collect garbage with the serial collector, not G1, and have C2 inline less and skip escape analysis: on two
# cores busy with two test workers, G1's concurrent threads and C2's compilations (~25% of a session JVM's CPU) cost
# more than they save on these small batches (docs/bench.md, "The test suite's time").
TEST_JVM_OPTIONS = (
    "-Dspark.sql.codegen.factoryMode=NO_CODEGEN -XX:+UseSerialGC"
    " -XX:FreqInlineSize=100 -XX:MaxInlineLevel=9 -XX:-DoEscapeAnalysis"
)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from jobs.core.spark import get_spark

    # A Kafka address, so the session has Spark's Kafka source too: the kafka job's `--once` runs here, not in a JVM
    # of its own (nothing connects to the address).
    lake = tmp_path_factory.mktemp("lake0")
    mine = "JAVA_TOOL_OPTIONS" not in os.environ  # unless you set it yourself
    if mine:
        os.environ["JAVA_TOOL_OPTIONS"] = TEST_JVM_OPTIONS
    s = get_spark(make_settings(lake, "redis://127.0.0.1:1/0", KAFKA_BOOTSTRAP="127.0.0.1:1"), "mview-tests")
    # Every JVM started after this one (deployed jobs, CLI commands, the cluster's) JIT-compiles with C1 only: each
    # lives a minute or two on a few records, where C2's compilations took ~40% of its CPU time and gave none back.
    if mine:
        os.environ["JAVA_TOOL_OPTIONS"] = f"{TEST_JVM_OPTIONS} -XX:TieredStopAtLevel=1"
    yield s
    s.stop()
