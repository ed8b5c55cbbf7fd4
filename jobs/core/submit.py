"""`python -m jobs.core.submit ARGS...`: run any `mview` command (e.g. `run timeline --once`) under `spark-submit`
against SPARK_MASTER (`spark://host:7077`, `yarn`, `k8s://...`, `local[*]`).

The command is `spark-submit --master $SPARK_MASTER --packages <Delta jars[,Spark's Kafka source with a
KAFKA_BOOTSTRAP][,Hadoop's S3A with an s3a:// LAKE_DIR]> --conf spark.pyspark.python=<this
interpreter> .../jobs/__main__.py ARGS`, with an s3a:// LAKE_DIR also `--jars` the Delta log store
that commits by conditional put (`jobs.core.logstore`). The executors must be able to import this project and its
dependencies with that interpreter (same machine, or the same venv path on every node). On a cluster whose machines
share no disk, LAKE_DIR is `hdfs://...` or `s3a://...` (a local LAKE_DIR works on one machine only).

With a local master (`local[*]`) the driver listens on 127.0.0.1 only, as in `jobs.core.spark.get_spark`: the command
adds `jobs.core.spark.loopback_conf` as `--conf`s and `main` starts it with `jobs.core.spark.loopback_env` (Spark's web UI).
With a cluster master nothing is added: what to set there is in docs/security.md ("What listens on the network").
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from jobs.core.settings import Settings

__all__ = ["delta_packages", "submit_command"]


def delta_packages() -> str:
    """The Maven coordinates `configure_spark_with_delta_pip` would add (io.delta:delta-spark_<v>:<version>)."""
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    from joins.sparkapi import builder_option

    return builder_option(configure_spark_with_delta_pip(SparkSession.builder), "spark.jars.packages")


def submit_command(settings: Settings, args: list[str]) -> list[str]:
    """The spark-submit command line that runs `mview ARGS` against SPARK_MASTER (see the module docstring)."""
    import pyspark

    from jobs.core.logstore import logstore_jar
    from jobs.core.spark import kafka_package, loopback_conf, s3a_package

    spark_submit = shutil.which("spark-submit") or str(Path(pyspark.__file__).parent / "bin" / "spark-submit")
    local_bin = Path(sys.executable).parent / "spark-submit"
    if local_bin.exists():
        spark_submit = str(local_bin)
    s3 = settings.lake.kind == "s3"
    return [
        spark_submit,
        "--master",
        settings.spark_master,
        *(["--jars", str(logstore_jar())] if s3 else []),  # Delta's log store for S3
        "--packages",
        delta_packages()
        + (f",{kafka_package()}" if settings.kafka_bootstrap else "")
        + (f",{s3a_package()}" if s3 else ""),
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        f"spark.pyspark.driver.python={sys.executable}",
        "--driver-memory",
        settings.driver_memory,
        *[
            arg
            for key, value in loopback_conf(settings.spark_master).items()
            for arg in ("--conf", f"{key}={value}")
        ],
        str(Path(__file__).parent.parent / "__main__.py"),  # jobs/__main__.py: `mview`
        *args,
    ]


def main(argv: list[str]) -> int:
    from jobs.core.spark import loopback_env

    settings = Settings.from_env()
    cmd = submit_command(settings, argv)
    print(" ".join(cmd), file=sys.stderr, flush=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.update(loopback_env(settings.spark_master))  # the driver JVM is spark-submit's own
    os.execv(cmd[0], cmd)
    return 0  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
