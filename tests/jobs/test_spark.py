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


def test_vacuum_lists_a_small_table_in_as_few_tasks_as_cores(spark, tmp_path):
    """Delta's VACUUM lists files in spark.sql.sources.parallelPartitionDiscovery.parallelism tasks (10,000 by
    default): on two cores that was 1-2 minutes per small table in `mview maintain`."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    spark.range(10).write.format("delta").save(path)
    sc = spark.sparkContext
    sc.setJobGroup("vacuum-tasks", "VACUUM of a small table")
    try:
        DeltaTable.forPath(spark, path).vacuum(168)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup("vacuum-tasks") for s in tracker.getJobInfo(j).stageIds]
    tasks = [tracker.getStageInfo(s).numTasks for s in stages if tracker.getStageInfo(s)]
    assert tasks and max(tasks) <= 2, tasks
