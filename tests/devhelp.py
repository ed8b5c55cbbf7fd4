"""Fixtures of the servers beyond one machine (`jobs.dev`): one real HDFS (`hdfs_server`), one S3Proxy
(`s3_server`) and one Spark standalone cluster of two workers (`spark_cluster`) per test session, each on free
loopback ports, started on first use only, and dying with the test run. A server that cannot start fails the test
with the one line saying what is missing (Java, javac, mvn, Maven Central) and how to install it.

`run_python` runs a script in a fresh interpreter of this venv (a Spark driver of its own: the session's `spark`
is local[2] and in-process, one SparkContext per process) and returns the JSON of its last line;
`s3a_spark_conf_dir` writes the Spark configuration directory that puts S3A (`hadoop-aws` and the AWS SDK from
Maven Central) on a driver's and its executors' class path and points it at `s3_server`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.errors import JobsError

__all__ = [
    "SERVER_FIXTURES",
    "one_store",
    "servers_allowed",
    "hdfs_server",
    "s3_server",
    "spark_cluster",
    "run_python",
    "s3a_spark_conf_dir",
    "job_once",
    "ingest_cli",
    "ROOT",
]

ROOT = Path(__file__).resolve().parents[1]

# The session fixtures of the servers beyond Redis: a test that uses one is `e2e` (tests/conftest.py).
SERVER_FIXTURES = frozenset({"hdfs_server", "s3_server", "spark_cluster", "kafka_broker", "pg_server"})


def one_store() -> str:
    """The remote store ("hdfs" or "s3") of this run's `one_store` tests: the scenarios whose only store-specific
    code is `changelog.storage.Lake`'s primitives and Delta's commit on that store, which tests of their own cover on
    both stores in every run (tests/changelog/test_storage.py, tests/jobs/dev/test_hdfs.py and test_s3.py,
    tests/jobs/core/test_logstore.py). MVIEW_TEST_STORE chooses; by default HDFS on even days (UTC) and S3 on odd
    ones, so runs on consecutive days cover both."""
    import datetime

    store = os.environ.get("MVIEW_TEST_STORE") or (
        "hdfs" if datetime.datetime.now(datetime.timezone.utc).toordinal() % 2 == 0 else "s3"
    )
    if store not in ("hdfs", "s3"):
        raise pytest.UsageError(f"MVIEW_TEST_STORE={store!r}: write hdfs or s3")
    return store


def one_store_param() -> list:
    """The parameter list of a `one_store` test: this run's store, marked (its id says which)."""
    return [pytest.param(one_store(), marks=pytest.mark.one_store)]


def servers_allowed(request, what: str) -> None:
    """Fail the test asking for `what` (a server beyond Redis) in a run that deselects `e2e` (`make test-fast`): it
    got the server by `request.getfixturevalue`, which the e2e marking by fixture name cannot see. Mark it e2e."""
    if "not e2e" in (request.config.option.markexpr or ""):
        pytest.fail(f"this test asks for {what} in a run without e2e tests: mark it pytest.mark.e2e")


@pytest.fixture(scope="session")
def hdfs_server(request, tmp_path_factory):
    """The session's HDFS (`jobs.dev.hdfs.HdfsServer`: `url`, `web_url`, `stop()`, `start()`)."""
    from jobs.dev.hdfs import scratch_hdfs

    servers_allowed(request, "HDFS")
    try:
        server = scratch_hdfs(tmp_path_factory.mktemp("hdfs"))
    except JobsError as e:
        pytest.fail(f"cannot start the test HDFS: {e}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server(request, tmp_path_factory):
    """The session's S3Proxy (`jobs.dev.s3.S3Server`: `endpoint`, `bucket`, `credentials`, `client()`, `env()`,
    `stop()`, `start()`)."""
    from jobs.dev.s3 import scratch_s3

    servers_allowed(request, "the S3 server")
    try:
        server = scratch_s3(tmp_path_factory.mktemp("s3"))
    except JobsError as e:
        pytest.fail(f"cannot start the test S3 server: {e}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_cluster(request, tmp_path_factory):
    """The session's Spark standalone cluster of two workers (`jobs.dev.spark_cluster.SparkCluster`: `master`,
    `web_url`, `worker_dirs`)."""
    from jobs.dev.spark_cluster import scratch_spark_cluster

    servers_allowed(request, "the Spark cluster")
    try:
        cluster = scratch_spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2)
    except JobsError as e:
        pytest.fail(f"cannot start the test Spark cluster: {e}")
    yield cluster
    cluster.stop()


def run_python(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 900) -> dict:
    """Run `script` (Python source) with `args` in a new interpreter of this venv, the repository on its path
    and `env` added to the environment; return the JSON object its last stdout line holds. AssertionError with
    the end of its stderr if it fails."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-c", script, *args], env=full, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-4000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output; stderr: {done.stderr[-2000:]}"
    return json.loads(lines[-1])


def s3a_spark_conf_dir(directory: Path, s3_server) -> Path:
    """A Spark configuration directory (for SPARK_CONF_DIR) whose `spark-defaults.conf` puts S3A's jars
    (`jobs.dev.s3.s3a_jars`) on the driver's and the executors' class path and sets `jobs.dev.s3.s3a_conf` for
    `s3_server`. Returns `directory`."""
    from jobs.dev.s3 import s3a_conf, s3a_jars

    try:
        classpath = ":".join(str(j) for j in s3a_jars())
    except JobsError as e:
        pytest.fail(f"cannot fetch S3A's jars: {e}")
    conf = {
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        **s3a_conf(s3_server.endpoint, s3_server.credentials),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in conf.items()))
    return directory


def job_once(settings, job: str, workdir: Path, *, submit: bool = False, **env: str) -> tuple[dict, str]:
    """`mview run <job> --once --json` in a new driver process started in `workdir` (made if missing), the
    settings' environment and `env` added: by `python -m jobs` or, with `submit`, by spark-submit (`python -m
    jobs.core.submit`). Returns (its JSON totals, its stdout and stderr). AssertionError if it fails."""
    from jobs.ops.deploy import settings_env

    workdir.mkdir(parents=True, exist_ok=True)
    full = {
        **os.environ,
        **settings_env(settings),
        "PYTHONPATH": str(ROOT),
        "PYSPARK_PYTHON": sys.executable,
        **env,
    }
    module = "jobs.core.submit" if submit else "jobs"
    run = subprocess.run(
        [sys.executable, "-m", module, "run", job, "--once", "--json"],
        env=full,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stdout + run.stderr


def ingest_cli(settings, directory: Path, topic: str, records: list[dict]) -> None:
    """`mview ingest <topic>` (the installed CLI, the settings' environment) of `records` written to a new file in
    `directory`. AssertionError if it fails."""
    import uuid

    from tests.conftest import write_jsonl
    from tests.jobs.opshelp import mview

    path = write_jsonl(directory / f"{topic}-{uuid.uuid4().hex[:6]}.jsonl", records)
    r = mview(settings, "ingest", topic, path)
    assert r.returncode == 0, r.stderr[-2000:]
