"""`python -m bench.trigger_probe [--appends N]`: how soon a deployed job sees a new commit.

Runs the deployed-job supervisor (`jobs.ops.service.serve`, exactly as `mview deploy` runs it) on a throw-away
`probe` job whose foreachBatch records, for each row, the time from the Delta commit that brought it (the commit
file's mtime) to the start of the foreachBatch call that received it, and then the batch in the probe's meta
hash, as a view's sink does. Another process (its own SparkSession, `local[1]`) appends one record per commit,
one commit a second, to the probe's `tweets` topic (the built-in pipeline's).
The probe job is known to this process only: the registry (`jobs.core.registry.jobs`) is the pipeline's jobs, so
the probe wraps it to add its own `JobSpec` (`_register`); neither the pipeline file nor jobs/ know of it.
Prints `append->batch-start` p50/p90/max in seconds and the load average, as one JSON line.

Everything lives in a temporary LAKE_DIR and a redis-server of its own on a free port; nothing of a real lake
or Redis is touched. TRIGGER_INTERVAL is taken from the environment (default 500 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from jobs.dev.redis import scratch_redis

__all__ = ["main"]

_SCHEMA = "op string, tweet_id string, user_id string, text string, ts bigint"


def _write(table: str, n: int) -> None:
    """The appending process: n commits of one tweet each, tweet_id = the commit's version, one a second."""
    from jobs.core.settings import Settings
    from jobs.core.spark import get_spark

    spark = get_spark(
        Settings.from_env({"SPARK_MASTER": "local[1]", "SPARK_DRIVER_MEMORY": "512m"}), "writer"
    )
    version = int(spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").first()["version"])
    for i in range(version + 1, version + 1 + n):
        row = [("post", str(i), "u1", "probe", i)]
        spark.createDataFrame(row, _SCHEMA).write.format("delta").mode("append").save(table)
        time.sleep(1.0)


def _summary(appends: int, settings, latencies: list[float], seen: int) -> dict:
    """The probe's result: append -> batch start p50/p90/max and every sample, in seconds, and the load."""
    lat = sorted(latencies)
    k = len(lat)

    def q(f):
        return round(lat[min(k - 1, int(f * k))], 2) if k else None

    return {
        "appends": appends,
        "seen": seen,
        "trigger_interval": settings.trigger_interval,
        "append_to_batch_start_s": {"p50": q(0.5), "p90": q(0.9), "max": q(1.0)},
        "all_s": [round(x, 2) for x in lat],
        "load1": round(os.getloadavg()[0], 1),
    }


def _register(registry, spec) -> None:
    """Make `spec` a job of this process's registry: `registry.jobs(settings)` (which `job_spec` and so the
    supervisor, replay and generations read) gives the pipeline's jobs and `spec` after them."""
    pipeline_jobs = registry.jobs

    def jobs(settings):
        return {**pipeline_jobs(settings), spec.name: spec}

    registry.jobs = jobs


def _probe_runner(table: Path, client, latencies: list[float], seen: set[int]):
    """A pipeline job's runner (`JobSpec.run` passes the pipeline and the job's name) that streams the tweets log:
    for each row of a batch, the seconds from its commit file's mtime to the batch's start go to `latencies` and
    its tweet id to `seen`; the batch id is recorded in the meta hash, as a view's sink does (the supervisor
    checks it)."""
    from changelog.topics import read_stream
    from jobs.core import runtime
    from views.keys import meta_key

    def run_probe(spark, settings, pipeline, job, *, once=True, generation=None):
        def process(df, batch_id):
            start = time.time()
            for r in df.select("tweet_id").collect():
                v = int(r["tweet_id"])
                latencies.append(start - (table / "_delta_log" / f"{v:020d}.json").stat().st_mtime)
                seen.add(v)
            client.hset(meta_key("probe", generation), "last_batch_id", batch_id)

        runtime.run_stream(
            read_stream(spark, settings.lake, settings.topic("tweets")),
            process,
            checkpoint=runtime.checkpoint_dir(settings, "probe", generation),
            once=once,
            settings=settings,
            name=f"probe_g{generation}",
        )
        return {}

    return run_probe


def _drive(table: Path, env: dict, appends: int, seen: set[int]) -> None:
    """Once the supervisor's query is up (3 s), make `appends` commits to `table` from a subprocess, wait until
    the probe has seen them all (at most 120 s), then stop the supervisor."""
    from jobs.core import runtime

    time.sleep(3.0)
    subprocess.run(
        [sys.executable, "-m", "bench.trigger_probe", "--write", str(table), str(appends)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while len(seen) < appends and time.monotonic() < deadline:
        time.sleep(0.2)
    runtime.STOP.set()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.trigger_probe", description=__doc__.splitlines()[0])
    p.add_argument("--appends", type=int, default=15)
    p.add_argument("--write", nargs=2, metavar=("TABLE", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write:
        _write(args.write[0], int(args.write[1]))
        return 0

    from changelog.topics import ensure_topic, topic_path
    from jobs.core import registry
    from jobs.core.settings import Settings
    from jobs.core.spark import get_spark
    from jobs.ops import service
    from views.redis_io import connect

    work = Path(tempfile.mkdtemp(prefix="trigger_probe_"))
    rs, port = scratch_redis(work)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        env = {**os.environ, "LAKE_DIR": str(work / "lake"), "REDIS_URL": url}
        env.setdefault("SPARK_MASTER", "local[2]")
        settings = Settings.from_env(env)
        spark = get_spark(settings, "trigger-probe")
        table = Path(topic_path(settings.lake, settings.topic("tweets")))  # a local lake
        client = connect(url)
        ensure_topic(spark, settings.lake, settings.topic("tweets"))
        latencies: list[float] = []
        seen: set[int] = set()

        run_probe = _probe_runner(table, client, latencies, seen)
        sys.modules.setdefault("bench.trigger_probe", sys.modules[__name__])
        globals()["run_probe"] = run_probe
        _register(registry, registry.JobSpec("probe", ("tweets",), (), "bench.trigger_probe:run_probe"))

        threading.Thread(target=_drive, args=(table, env, args.appends, seen), daemon=True).start()
        service.serve(spark, settings, "probe")
        print(json.dumps(_summary(args.appends, settings, latencies, len(seen))), flush=True)
        return 0 if len(seen) == args.appends else 1
    finally:
        rs.terminate()
        rs.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
