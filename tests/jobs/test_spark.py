"""The shared SparkSession: the Delta jars (on the JVM's class path, used by every Delta test) are on no Python
path, where each new Python worker had spent about 1 s reading them on its first imports."""

from __future__ import annotations

import sys


def test_delta_jars_are_off_the_python_path_of_driver_and_workers(spark):
    def _worker_jars(_rows):  # pickled by value: runs in a Python worker
        import sys as worker_sys

        yield [p for p in worker_sys.path if p.lower().endswith(".jar") and "delta" in p.lower()]

    assert [p for p in sys.path if p.lower().endswith(".jar")] == []
    per_worker = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_worker_jars).collect()
    assert per_worker == [[], []]
