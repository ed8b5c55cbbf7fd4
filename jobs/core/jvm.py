"""The driver JVM's ahead-of-time cache, when `make jvm-cache` (`jobs.dev.jvmcache`) built one: `driver_java`
tells `jobs.core.spark.get_spark` which Java to start and with which options. Without a cache, or with one built for
other jars or another JDK, the driver starts on the default `java` as it would without it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jobs.core.settings import Settings

__all__ = ["driver_java", "spark_jars_stamp", "RECORD"]

RECORD = "MVIEW_JVM_RECORD"  # set by the cache's training run: the AOT configuration file to record


def spark_jars_stamp() -> str:
    """What the cache was built for: the PySpark version and the size of its jars (another Spark: a stale cache)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return f"pyspark {pyspark.__version__}, {sum(p.stat().st_size for p in jars.glob('*.jar'))} bytes of jars"


def driver_java(settings: Settings, master: str | None = None) -> tuple[str, str] | None:
    """(JAVA_HOME, extra driver JVM options) that start the driver with the AOT cache, or None: no cache, a stale
    one (other jars or JDK than it was built with), JVM_CACHE=off, or a master other than local (`master`, else
    SPARK_MASTER), whose executors run their own Java."""
    if settings.jvm_cache is None or not (master or settings.spark_master).startswith("local"):
        return None
    d = settings.jvm_cache
    home = d / "jdk"
    record = os.environ.get(RECORD)
    if record:
        return str(home), f"-XX:AOTMode=record -XX:AOTConfiguration={record} -Xlog:aot*=error"
    try:
        stamp = json.loads((d / "stamp.json").read_text())
    except (OSError, ValueError):
        return None
    if not (d / "spark.aot").is_file() or not (home / "bin" / "java").is_file():
        return None
    if not Path(stamp.get("java", "")).is_file():
        return None
    if stamp.get("jars") != spark_jars_stamp():
        return None
    return str(home), f"-XX:AOTCache={d / 'spark.aot'} -Xlog:aot*=error"
