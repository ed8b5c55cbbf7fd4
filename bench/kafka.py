"""The kafka part of `python -m bench`, against the bench's own Kafka broker (`start_kafka`, a scratch broker under
the bench's tmp dir, stopped at the end of the run):

- copy rate: a mixed workload of tweets and follows (the timeline demo's generator) is produced to Kafka
  (`changelog.kafka.produce`, what `mview produce` runs, in this process: messages/s from the first call to the
  last acknowledgement), then the `kafka` job copies it into the Delta logs (`mview run kafka --once`, run
  in-process in the bench's JVM by the job skeleton): twice, each into a lake of its own, the first in this JVM
  (cold: the Kafka source's classes are loaded and its code is not yet compiled) and again in the now warm JVM.
  Per run: records / batch seconds / cores (Spark's parallelism), records per CPU second of the Spark JVM and
  this Python process (the driver validates every message), and the broker's CPU seconds.
- freshness through Kafka: with the `timeline` and `kafka` jobs deployed (`mview deploy`, both at `TRIGGER`), 10
  tweets produced every 2 s by authors with followers; per tweet, the produce call's return (every message
  acknowledged) -> in every follower's timeline: p50 and p99 after `WARMUP_S` of the same load unmeasured, beside
  the Delta-path freshness of a shorter load with the same jobs deployed just before it (and, when it ran, the
  `freshness` part's figures at the default trigger).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

from bench.common import say, scratch_settings

__all__ = ["start_kafka", "stop_kafka", "bench_kafka", "COPY_WORKLOAD", "WARMUP_S"]

# ~300k messages at scale 1: 200k tweets and 100k follows (posts, deletes, follows, unfollows, duplicates).
COPY_WORKLOAD = {"users": 20_000, "celebrities": 3, "follows": 100_000, "tweets": 200_000}
# Freshness through Kafka is measured after this much of the same load, unmeasured: both jobs were just deployed
# (cold JVMs, the timeline job restored from its checkpoint), unlike the freshness part's timeline job, which
# has caught up on the whole throughput workload before its load starts.
WARMUP_S = 30.0
# The micro-batch interval of both deployed jobs while freshness is measured (TRIGGER_INTERVAL, default 500 ms): a
# user who wants fresh views through Kafka sets it, at the cost of more idle polling (see README).
TRIGGER = "200 ms"


def start_kafka(tmp: Path) -> tuple[subprocess.Popen, str]:
    """A throw-away broker under `tmp`/kafka on free loopback ports: (process, bootstrap). Raises JobsError
    (saying what is missing) when it cannot start."""
    from jobs.dev.kafka import scratch_kafka

    return scratch_kafka(tmp / "kafka")


def stop_kafka(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _cpu(spark) -> tuple[float, float]:
    """(CPU seconds of this Python process, of the Spark JVM and its descendants), user + system."""
    from jobs.core.runtime import process_cpu
    from joins.sparkapi import jvm as driver

    own = sum(os.times()[:2])
    try:
        jvm = sum(process_cpu(driver(spark).java.lang.ProcessHandle.current().pid()))
    except (OSError, AttributeError, ValueError):
        jvm = float("nan")
    return own, jvm


def _broker_cpu(pid: int) -> float:
    from jobs.core.runtime import process_cpu

    try:
        return process_cpu(pid)[0]
    except OSError:
        return float("nan")


def _produce(settings, broker_pid: int, files: dict[str, str], n: int) -> dict:
    """`mview produce` of each file (in this process), the Kafka topics created beforehand (not timed)."""
    from changelog.kafka import ensure_kafka_topics, kafka_topic, produce

    prefix = settings.kafka_topic_prefix
    topics = {name: settings.topic(name) for name in files}
    ensure_kafka_topics(settings.kafka_bootstrap, [kafka_topic(prefix, t) for t in topics.values()])
    cpu0, broker0, started = sum(os.times()[:2]), _broker_cpu(broker_pid), time.monotonic()
    sent = sum(
        produce(settings.kafka_bootstrap, prefix, topics[name], [path]) for name, path in files.items()
    )
    took = time.monotonic() - started
    if sent != n:
        raise RuntimeError(f"produced {sent:,} of {n:,} messages")
    return {
        "command": "mview produce tweets FILE; mview produce follows FILE (in-process)",
        "messages": sent,
        "seconds": round(took, 2),
        "messages_per_s": round(sent / took),
        "python_cpu_seconds": round(sum(os.times()[:2]) - cpu0, 2),
        "broker_cpu_seconds": round(_broker_cpu(broker_pid) - broker0, 2),
    }


def _copy(spark, settings, broker_pid: int, n: int) -> dict:
    """One `kafka --once` run (the job skeleton in this JVM) into the lake of `settings`: its figures."""
    from jobs.core.skeleton import run_job
    from jobs.kinds import kafka as kafka_job

    cores = int(spark.sparkContext.defaultParallelism) or os.cpu_count() or 1
    (py0, jvm0), broker0, started = _cpu(spark), _broker_cpu(broker_pid), time.monotonic()
    totals = run_job(spark, settings, "kafka", kafka_job._wire, once=True)
    wall = time.monotonic() - started
    (py1, jvm1), broker1 = _cpu(spark), _broker_cpu(broker_pid)
    accepted = sum(v for k, v in totals.items() if k.endswith(".accepted"))
    if totals["events"] != n:
        raise RuntimeError(f"the kafka job read {totals['events']:,} of {n:,} messages")
    batch_s, cpu_s = totals["seconds"], (py1 - py0) + (jvm1 - jvm0)
    return {
        "messages": totals["events"],
        "accepted": accepted,
        "batches": totals["batches"],
        "batch_seconds": round(batch_s, 2),
        "wall_seconds": round(wall, 2),
        "cores": cores,
        "records_per_s": round(n / batch_s) if batch_s else None,
        "records_per_s_per_core": round(n / batch_s / cores) if batch_s else None,
        "python_cpu_seconds": round(py1 - py0, 2),
        "jvm_cpu_seconds": round(jvm1 - jvm0, 2),
        "records_per_cpu_s": round(n / cpu_s) if cpu_s == cpu_s and cpu_s > 0 else None,
        "cores_busy": round(cpu_s / wall, 2) if wall else None,
        "broker_cpu_seconds": round(broker1 - broker0, 2),
    }


def _copy_rate(spark, tmp: Path, port: int, bootstrap: str, broker_pid: int, scale: float) -> dict:
    """Produce the copy workload, then copy it with the kafka job twice (cold, then warm): the figures."""
    from timeline_demo.workload import generate, write_jsonl

    p = dict(COPY_WORKLOAD)
    for k in ("users", "follows", "tweets"):
        p[k] = max(100, int(p[k] * scale))
    wl = generate(seed=31, **p)
    files = {
        "tweets": write_jsonl(wl.tweets, tmp / "kafka-tweets.jsonl"),
        "follows": write_jsonl(wl.follows, tmp / "kafka-follows.jsonl"),
    }
    n = len(wl.tweets) + len(wl.follows)
    env = {"KAFKA_BOOTSTRAP": bootstrap, "KAFKA_TOPIC_PREFIX": "copy."}
    settings = [scratch_settings(tmp / f"lake-kafka-{i}", port, 5 + i, **env) for i in (1, 2)]
    produced = _produce(settings[0], broker_pid, files, n)
    say(f"kafka: produced {n:,} messages at {produced['messages_per_s']:,}/s")
    cold = _copy(spark, settings[0], broker_pid, n)
    say(f"kafka: copied (cold) at {cold['records_per_s_per_core']:,} records/s/core")
    warm = _copy(spark, settings[1], broker_pid, n)
    say(f"kafka: copied (warm) at {warm['records_per_s_per_core']:,} records/s/core")
    return {
        "workload": f"{n:,} messages ({len(wl.tweets):,} tweets, {len(wl.follows):,} follows, timeline demo "
        f"generator, {p['users']:,} users), 3 partitions per topic",
        "produce": produced,
        "copy_cold": cold,
        "copy_warm": warm,
    }


def _produce_tweets(settings):
    """The Kafka path's append of a batch of tweets: `mview produce tweets` of a file holding them."""
    from changelog.kafka import produce
    from timeline_demo.workload import write_jsonl

    tweets = settings.topic("tweets")

    def append(records: list[dict], path: Path) -> None:
        produce(settings.kafka_bootstrap, settings.kafka_topic_prefix, tweets, [write_jsonl(records, path)])

    return append


def _freshness(spark, settings, tmp: Path, bootstrap: str, follows, seconds: float) -> dict:
    """Freshness through Kafka and through the Delta path (a shorter load), with `timeline` and `kafka` deployed
    once for both, at `TRIGGER`."""
    from bench.freshness import deploy_jobs, ingest_tweets, measure_freshness

    settings = dataclasses.replace(settings, trigger_interval=TRIGGER)
    ksettings = dataclasses.replace(settings, kafka_bootstrap=bootstrap, kafka_topic_prefix="live.")
    stop_timeline = deploy_jobs(settings, ("timeline",))
    try:
        stop_kafka_job = deploy_jobs(ksettings, ("kafka",))
        try:
            out = {"trigger_interval": TRIGGER}
            out["delta"] = measure_freshness(
                settings,
                tmp,
                follows,
                min(seconds, 30.0),
                2.0,
                "kd",
                append=lambda recs, path: ingest_tweets(spark, settings, recs, path),
                command=f"TRIGGER_INTERVAL={TRIGGER}: mview deploy timeline; mview deploy kafka; mview ingest tweets FILE",
            )
            out["delta"]["source"] = f"a shorter Delta-path load in this part, the same jobs at {TRIGGER}"
            out["kafka"] = measure_freshness(
                ksettings,
                tmp,
                follows,
                seconds,
                2.0,
                "kk",
                append=_produce_tweets(ksettings),
                command=f"TRIGGER_INTERVAL={TRIGGER}: mview deploy timeline; mview deploy kafka; mview produce tweets FILE",
                how="produced to Kafka",
                warmup_s=WARMUP_S,
            )
            return out
        finally:
            stop_kafka_job()
    finally:
        stop_timeline()


def bench_kafka(
    spark,
    settings,
    tmp: Path,
    port: int,
    broker: tuple[subprocess.Popen, str],
    follows: list[dict],
    *,
    scale: float = 1.0,
    seconds: float = 60.0,
    delta: dict | None = None,
) -> dict:
    """The kafka part (module docstring). `settings`: the timeline lake (the throughput workload ingested);
    `broker`: the bench's broker; `delta`: the freshness part's figures of this run, if it ran."""
    proc, bootstrap = broker
    out = _copy_rate(spark, tmp, port, bootstrap, proc.pid, scale)
    fresh = _freshness(spark, settings, tmp, bootstrap, follows, seconds)
    out["freshness"], out["delta_freshness"] = fresh["kafka"], fresh["delta"]
    if delta is not None:  # the freshness part of this run, at the default trigger
        out["delta_freshness_default_trigger"] = {
            k: delta.get(k) for k in ("p50_s", "p99_s", "tweets", "command")
        }
    return out
