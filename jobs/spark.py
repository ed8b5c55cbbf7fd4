"""The SparkSession every job and test uses: Delta enabled, UI off, few shuffle partitions."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path

from jobs.jvmcache import driver_java
from jobs.settings import Settings

__all__ = ["get_spark"]


def get_spark(settings: Settings, app_name: str = "mview", *, master: str | None = None):
    """Return the active SparkSession or build one configured for this project.

    Executors run this interpreter (PYSPARK_PYTHON), so the venv's packages (redis, orjson) are importable.
    The Delta jars are resolved by `configure_spark_with_delta_pip` from Maven Central into the Ivy cache.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    driver_opts = "-Dlog4j2.level=ERROR -Xss16m"
    master = master or settings.spark_master
    aot = driver_java(settings, master)
    if aot is not None:  # `make jvm-cache` built an AOT cache: a JDK 25 that maps it (see jobs/jvmcache.py)
        os.environ["JAVA_HOME"], extra = aot
        driver_opts = f"{driver_opts} {extra}"
    java_home = os.environ.get("JAVA_HOME")
    if master.startswith("local"):
        _java_dies_with_driver()
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # PySpark's DataFrame debugging records the Python call site of every DataFrame and Column function in the
        # JVM: three more Py4J round trips and a stack walk per call. The jobs build their plans anew in every
        # micro-batch, and this doubled the driver's round trips (measured: 4,100 -> 2,000 per timeline batch of
        # 10 tweets, and the batch 3.2-3.5 s -> 2.4-2.7 s warm). Analysis errors still name the failing expression.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.default.parallelism", str(max(2, settings.shuffle_partitions)))
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.databricks.delta.optimizeWrite.enabled", "false")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
        )
        .config("spark.sql.session.timeZone", "UTC")
        # Plans here are wide (many joins) over small micro-batches: adaptive re-planning cost more CPU than it
        # saved (measured: 26 s vs 42 s of JVM CPU for one timeline batch).
        .config("spark.sql.adaptive.enabled", "false")
        # Compiled generated code is cached by its source, 100 classes by default: a micro-batch job compiles
        # ~40-60 per batch (plus Delta's own queries), more than the cache keeps under its LRU segments, so the
        # same code was compiled again in every batch (measured: 37 of a clicks batch's 38 compilations were code
        # compiled in an earlier batch). Compilation and the JIT of the new classes were most of a batch's CPU.
        .config("spark.sql.codegen.cache.maxEntries", "2000")
        .config("spark.sql.autoBroadcastJoinThreshold", str(64 * 1024 * 1024))
        # Delta's VACUUM lists a table's files in as many Spark tasks as this (Spark's default: 10,000). On two
        # local cores that made one VACUUM of a small topic log take 1-2 minutes (measured: 116 s per table in
        # `mview maintain`). It now takes as many tasks as shuffle partitions (SHUFFLE_PARTITIONS, at least 2).
        .config(
            "spark.sql.sources.parallelPartitionDiscovery.parallelism",
            str(max(2, settings.shuffle_partitions)),
        )
        # -Xss: a long-lived streaming query's thread overflowed the default 1 MB stack in java.util.regex
        # (StackOverflowError in the enrichment job's third continuous batch); threads get 16 MB of stack.
        .config("spark.driver.extraJavaOptions", driver_opts)
        .config("spark.executor.extraJavaOptions", "-Xss16m")
    )
    try:
        spark = configure_spark_with_delta_pip(builder).getOrCreate()
    finally:  # the wrapper is for this driver only, not for JVMs that later child processes start
        if java_home is None:
            os.environ.pop("JAVA_HOME", None)
        else:
            os.environ["JAVA_HOME"] = java_home
    atexit.register(spark.stop)  # a clean exit stops Spark (its temporary files go) before the JVM is killed
    spark.sparkContext.setLogLevel("ERROR")
    _jars_off_python_path(spark.sparkContext)
    return spark


def _jars_off_python_path(sc) -> None:
    """Take the Delta jars (and their dependencies) off the Python path of the driver and of every Python worker.

    spark-submit puts each `--packages` jar on the Python path, in case it ships Python code; none of these does.
    Every import and package-metadata lookup then read the jars' directories first (hadoop-client-runtime alone
    has tens of thousands of entries): about 1 s of CPU in each new Python worker, before it handled a row, and
    0.6 s in redis-py's first connection (measured). The jars stay on the JVM's class path."""
    includes = getattr(sc, "_python_includes", None)
    if includes:
        sc._python_includes = [p for p in includes if not p.lower().endswith(".jar")]
    sys.path[:] = [p for p in sys.path if not p.lower().endswith(".jar")]


_DEATHSIG = """#!/bin/sh
# Written by jobs/spark.py: the JVM below, killed by the kernel the moment the process that started it dies.
exec setpriv --pdeathsig KILL "@JAVA@" "$@"
"""


def _java_dies_with_driver() -> None:
    """Point JAVA_HOME at a wrapper that starts Spark's driver JVM with a parent-death signal (SIGKILL).

    PySpark's JVM exits on its own only when it reads the end of its stdin, and then runs Spark's shutdown hooks
    for seconds while its tasks may still be writing; after a SIGKILL of the Python driver it went on for 4-25 s.
    With the signal it dies with the driver. The kernel sends it when the *thread* that started the JVM ends, so
    this is done only from the main thread (whose end is the process's end), on Linux with `setpriv`."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return
    home = os.environ.get("JAVA_HOME", "")
    java = Path(home, "bin", "java") if home else Path(shutil.which("java") or "")
    root = Path(sys.prefix) / "mview-java"
    if not java.is_file() or java.is_relative_to(root):
        return
    wrapper_home = root / hashlib.sha256(str(java).encode()).hexdigest()[:12]
    wrapper = wrapper_home / "bin" / "java"
    text = _DEATHSIG.replace("@JAVA@", str(java))
    if not wrapper.is_file() or wrapper.read_text() != text:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        tmp = wrapper.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(wrapper)
    os.environ["JAVA_HOME"] = str(wrapper_home)
