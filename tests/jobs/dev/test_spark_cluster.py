"""The development Spark standalone cluster (`jobs.dev.spark_cluster`, fixture `spark_cluster`): a master and two
workers on loopback, each worker in a directory of its own; a driver (a process of its own, `get_spark` with
`SPARK_MASTER` the cluster) runs tasks on both workers, in their own directories, with this venv's python, and
they write a Delta table to the development HDFS, the only storage they share."""

from __future__ import annotations

import json
import sys
import urllib.request

import pytest

from tests.devhelp import run_python

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

_DRIVER = """
import json, sys
from pathlib import Path
from tests.conftest import make_settings
from jobs.core.spark import get_spark

master, lake, work = sys.argv[1:4]
spark = get_spark(make_settings(Path(work), "redis://127.0.0.1:1/0", SPARK_MASTER=master, SPARK_DRIVER_MEMORY="1g"))

def where(_):
    import os, sys
    yield os.getcwd(), sys.executable, os.environ.get("SPARK_LOCAL_DIRS", "")

seen = sorted(set(spark.sparkContext.parallelize(range(8), 8).mapPartitions(where).collect()))
spark.range(100).repartition(4).write.format("delta").save(lake)
print(json.dumps({"seen": seen, "count": spark.read.format("delta").load(lake).count()}))
"""


def test_two_workers_each_in_its_own_directory(spark_cluster):
    with urllib.request.urlopen(f"{spark_cluster.web_url}/json/", timeout=10) as r:
        state = json.load(r)
    assert state["aliveworkers"] == 2
    assert len(spark_cluster.worker_dirs) == 2
    assert all(w["host"] == "127.0.0.1" for w in state["workers"])


def test_tasks_run_on_both_workers_in_their_own_directories_and_write_to_hdfs(
    spark_cluster, hdfs_server, tmp_path
):
    out = run_python(
        _DRIVER,
        spark_cluster.master,
        f"{hdfs_server.url}/from-cluster",
        str(tmp_path / "driver"),
        env={"SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert out["count"] == 100
    by_worker = {}
    for cwd, python, local_dirs in out["seen"]:
        worker = next(d for d in spark_cluster.worker_dirs if cwd.startswith(str(d / "work") + "/"))
        assert python == sys.executable
        assert local_dirs.startswith(str(worker / "local"))
        assert not cwd.startswith(str(tmp_path))
        by_worker[worker] = cwd
    assert set(by_worker) == set(spark_cluster.worker_dirs), "an executor on each worker"
