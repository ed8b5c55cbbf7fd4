"""`python -m jobs.dev.warmup`: start Spark once so the Delta jars and Spark's Kafka source are fetched into the Ivy
cache at set-up time (a KAFKA_BOOTSTRAP adds the Kafka source; nothing connects to it here)."""

from __future__ import annotations

import tempfile

from jobs.core.settings import Settings
from jobs.core.spark import get_spark

if __name__ == "__main__":
    spark = get_spark(
        Settings.from_env({"SPARK_MASTER": "local[1]", "KAFKA_BOOTSTRAP": "127.0.0.1:9092"}), "mview-warmup"
    )
    with tempfile.TemporaryDirectory() as d:
        spark.range(3).write.format("delta").save(f"{d}/t")
        assert spark.read.format("delta").load(f"{d}/t").count() == 3
    spark.stop()
    print("spark and delta ready")
