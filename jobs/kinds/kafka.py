"""The `kafka` job: the Kafka topic `<KAFKA_TOPIC_PREFIX><topic>` of every topic of the pipeline, copied into that
topic's Delta log.

A source job (no views, no generations; `jobs.core.skeleton`): one streaming query of Spark's Kafka source over those
Kafka topics (created with `changelog.kafka.PARTITIONS` partitions if missing), from the earliest offset the broker
holds, then from its checkpoint. Each micro-batch (at most `MAX_MESSAGES_PER_BATCH` messages) is validated in the
driver by `mview ingest`'s rules and copied exactly once per batch id (`changelog.kafka.copy_batch`, keyed by this
checkpoint's id and the batch id; a batch replayed after a crash has the same offsets). A topic whose log's records
do not follow its declaration is refused (`TopicChanged`) before the query starts.
- `--once`: what the broker holds at the start (availableNow); returns per topic {"accepted": n, "rejected": m}.
- Broker away: `KafkaUnavailable` (one line naming KAFKA_BOOTSTRAP); deployed, the query restarts with backoff and
  the status says `kafka: "waiting for Kafka at ... since ..."` (`state: "waiting"`) until it answers (`"ok"`); the
  failure is `last_error` until a restarted query completes a trigger. KAFKA_BOOTSTRAP empty: `SourceNotConfigured`.
- Lag (`kafka_lag`, `lag_versions` in `mview status`): messages the broker holds that the checkpoint has not
  committed, summed over partitions; None when the broker does not answer or Kafka is not configured.
"""

from __future__ import annotations

import json
import time

from changelog.errors import KafkaUnavailable
from changelog.kafka import broker_watch, copy_batch, ensure_kafka_topics, kafka_topic, lag
from changelog.topics import ensure_topic
from jobs.core import runtime
from jobs.core.runtime import Restarts, checkpoint_key, log, read_status, write_status
from jobs.core.settings import Settings
from jobs.core.skeleton import Batch, JobRun, Wiring, run_job
from jobs.errors import SourceNotConfigured

__all__ = ["run_kafka", "kafka_lag", "preflight", "MAX_MESSAGES_PER_BATCH"]

# A micro-batch's messages are validated in the driver: this bounds its memory.
MAX_MESSAGES_PER_BATCH = 100_000
# A value reaches the driver as text when it is valid UTF-8 (half the cost of bytes), else as bytes.
_TEXT = "if(is_valid_utf8(value), cast(value AS string), null) AS text"
_BINARY = "if(is_valid_utf8(value), null, value) AS value"


def _names(settings: Settings) -> dict:
    """Kafka topic -> the pipeline's topic (`spec.model.Topic`) it is copied into, for every topic of its own log
    (not one read `from:` another)."""
    topics = settings.pipeline().written.values()
    return {kafka_topic(settings.kafka_topic_prefix, t): t for t in topics}


def preflight(settings: Settings, *, reach: bool = True) -> None:
    """SourceNotConfigured without a KAFKA_BOOTSTRAP; with `reach`, KafkaUnavailable unless the broker answers
    (the job's Kafka topics are then created if missing)."""
    if not settings.kafka_bootstrap:
        raise SourceNotConfigured("kafka", "Kafka", "KAFKA_BOOTSTRAP", "127.0.0.1:9092 after `make kafka`")
    if reach:
        ensure_kafka_topics(settings.kafka_bootstrap, _names(settings))


def kafka_lag(settings: Settings) -> int | None:
    cp, names = checkpoint_key("kafka", 0), _names(settings)
    try:
        if not settings.kafka_bootstrap:
            return None
        return lag(settings.kafka_bootstrap, names, settings.lake, key=cp, timeout=1.0)
    except KafkaUnavailable:
        return None


def _source(run: JobRun, names: dict[str, str]):
    s = run.settings
    return (
        run.spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", s.kafka_bootstrap)
        .option("subscribe", ",".join(names))
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", MAX_MESSAGES_PER_BATCH)
        .option("kafka.default.api.timeout.ms", "15000")
        .option("kafka.request.timeout.ms", "10000")
        .option("kafka.fetch.max.wait.ms", "0")  # docs/architecture.md, "Kafka in front of the logs"
        .load()
        .selectExpr("topic", "partition", "offset", _TEXT, _BINARY)
    )


def _wire(run: JobRun) -> Wiring:
    s = run.settings
    preflight(s)
    names = _names(s)
    for t in names.values():  # a changed declaration is refused here, before the query starts
        ensure_topic(None, s.lake, t)
    write_status(s, "kafka", kafka="ok")
    app: list[str] = []

    def say(broker: str) -> None:
        log(f"kafka: broker: {broker}")
        write_status(s, "kafka", kafka=broker)

    def process(batch_df, batch_id: int) -> Batch | None:
        started = time.monotonic()
        rows = [(t, p, o, v.encode() if v is not None else b) for t, p, o, v, b in batch_df.collect()]
        if not rows:
            return None
        read_s = time.monotonic() - started
        if not app:  # the query's id, kept in its checkpoint: a new checkpoint never matches an old app id
            meta = json.loads(s.lake.read_bytes(checkpoint_key(run.job, run.generation), "metadata"))
            app.append(f"mview.kafka.{meta['id']}")
        copied = copy_batch(s.lake, names, rows, app_id=app[0], version=batch_id)
        copy_s = time.monotonic() - started - read_s
        accepted, rejected = (sum(c[k] for c in copied.values()) for k in ("accepted", "rejected"))
        per_topic = {f"{t}.{k}": n for t, c in copied.items() for k, n in c.items()}
        return Batch(
            events=len(rows),
            summary=f"{len(rows):,} messages (read {read_s:.2f}s, copied {copy_s:.2f}s): {accepted:,} copied, "
            f"{rejected:,} dead-lettered",
            counters={"accepted": accepted, "rejected_messages": rejected},
            totals=per_topic,
            inputs={t: c["accepted"] + c["rejected"] for t, c in copied.items()},
            phases={"read": read_s, "copy": copy_s},
        )

    return Wiring(_source(run, names), process, idle=broker_watch(s.kafka_bootstrap, say))


def _waiting(settings: Settings, e: KafkaUnavailable) -> None:
    """Say in the status that the job waits for the broker (`kafka`), keeping since when if it already did."""
    if not str(read_status(settings, "kafka").get("kafka", "")).startswith("waiting"):
        since = time.strftime("%H:%M:%S")
        write_status(
            settings,
            "kafka",
            kafka=f"waiting for Kafka at KAFKA_BOOTSTRAP={e.bootstrap} since {since} ({e.cause})",
        )


def run_kafka(spark, settings: Settings, *, once: bool = True, generation=None) -> dict:
    """Run the job (see the module docstring); per topic, the messages this run accepted and rejected. Without
    `spark` (the CLI's source-job path) a session is started here, after the broker answered (for `once`)."""
    preflight(settings, reach=once)
    if spark is None:
        from jobs.core.spark import get_spark

        spark = get_spark(settings, "mview-kafka")
    if once:
        totals = run_job(spark, settings, "kafka", _wire, once=True, generation=generation)
        return {
            t: {k: totals.get(f"{t}.{k}", 0) for k in ("accepted", "rejected")}
            for t in settings.pipeline().written  # a topic read `from:` another has no messages of its own
        }
    restarts = Restarts(settings, "kafka")  # a failed query (the broker went away) restarts after a backoff
    while not runtime.STOP.is_set():
        started = time.monotonic()
        try:
            write_status(settings, "kafka", state="running")
            run_job(spark, settings, "kafka", _wire, once=False)
            restarts.failures = 0
        except Exception as e:  # noqa: BLE001 - restart from the checkpoint, saying why in the status
            if runtime.STOP.is_set():
                break
            if isinstance(e, KafkaUnavailable):  # the broker is away: the job waits for it (state "waiting")
                _waiting(settings, e)
            restarts.after(e, started)
    return {}
