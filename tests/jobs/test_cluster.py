"""Cluster mode: a real Spark standalone master and worker on loopback (the classes shipped in pyspark's jars,
started with pyspark's `bin/spark-class`), the timeline job submitted to `spark://127.0.0.1:PORT` with
`spark-submit` (`python -m jobs.core.submit run timeline --once`), and the same views as `local[2]`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark

from changelog.ingest import ingest
from jobs.ops.deploy import settings_env
from tests.builtin import run_timeline
from tests.conftest import make_settings
from tests.jobs.opshelp import free_port, redis_content, write_jsonl
from timeline_demo.workload import generate
from views.redis_io import connect

SPARK_HOME = Path(pyspark.__file__).parent


def _standalone(tmp_path: Path):
    """Start a master and a worker (in the background: the caller works meanwhile); `_registered` waits."""
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_MASTER_HOST": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp_path / "spark-logs"),
        "SPARK_WORKER_DIR": str(tmp_path / "spark-work"),
        "SPARK_NO_DAEMONIZE": "1",
        "PYSPARK_PYTHON": sys.executable,
    }
    port, ui, wui = free_port(), free_port(), free_port()
    cls = str(SPARK_HOME / "bin" / "spark-class")
    logs = open(tmp_path / "standalone.log", "wb")  # noqa: SIM115 - closed by the caller
    master = subprocess.Popen(
        [
            cls,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        env=env,
        stdout=logs,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker = subprocess.Popen(
        [
            cls,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--cores",
            "2",
            "--memory",
            "1536m",
            "--webui-port",
            str(wui),
            "--work-dir",
            str(tmp_path / "spark-work"),
            f"spark://127.0.0.1:{port}",
        ],
        env=env,
        stdout=logs,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return f"spark://127.0.0.1:{port}", ui, (master, worker), logs


def _registered(tmp_path: Path, ui: int, procs) -> None:
    """Wait until the worker has registered with the master (its web UI's JSON says so)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                if json.load(r).get("aliveworkers", 0) >= 1:
                    return
        except OSError:
            pass
        assert all(p.poll() is None for p in procs), (tmp_path / "standalone.log").read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError(
        "the standalone worker did not register: " + (tmp_path / "standalone.log").read_text()[-3000:]
    )


def _shutdown(procs, logs) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 15)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait(10)
    logs.close()


def test_timeline_on_a_standalone_cluster_equals_local(spark, tmp_path, redis_url):
    # The master and worker JVMs start while the local[2] reference runs.
    master_url, ui, procs, logs = _standalone(tmp_path)
    try:
        wl = generate(seed=5, users=40, celebrities=2, follows=240, tweets=240)
        files = write_jsonl(tmp_path / "t.jsonl", wl.tweets), write_jsonl(tmp_path / "f.jsonl", wl.follows)
        local = make_settings(tmp_path / "lake_local", redis_url.replace("/0", "/1"), TIMELINE_CAP=10)
        ingest(spark, local.lake_dir, "tweets", [files[0]])
        ingest(spark, local.lake_dir, "follows", [files[1]])
        run_timeline(spark, local, once=True)
        cluster = make_settings(
            tmp_path / "lake_cluster",
            redis_url,
            TIMELINE_CAP=10,
            SPARK_MASTER=master_url,
            SPARK_DRIVER_MEMORY="1g",
        )
        shutil.copytree(
            local.lake_dir / "topics", cluster.lake_dir / "topics"
        )  # the same logs, commit by commit
        env = {
            **os.environ,
            **settings_env(cluster),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
        _registered(tmp_path, ui, procs)
        run = subprocess.run(
            [sys.executable, "-m", "jobs.core.submit", "run", "timeline", "--once", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        totals = json.loads(run.stdout.strip().splitlines()[-1])
        assert totals["job"] == "timeline" and totals["events"] > 0
        app_dirs = list((tmp_path / "spark-work").glob("app-*"))
        assert app_dirs, "no executor ran on the standalone worker"
    finally:
        _shutdown(procs, logs)
    got = redis_content(connect(redis_url), "timeline", 1)
    want = redis_content(connect(redis_url.replace("/0", "/1")), "timeline", 1)
    assert len(want) > 50
    assert got == want
