"""The one settings object, read from the environment. Every key is documented here and in the README."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from changelog.errors import UnknownTopic
from changelog.storage import Lake, open_lake
from spec import Pipeline
from spec.durations import parse_duration_ms
from spec.model import Topic
from views.pipeline import BUILTIN_FILE, pipeline_at

__all__ = ["Settings", "lake_location", "parse_duration_ms"]


_DURATIONS = (
    "allowed_lateness",
    "trigger_interval",
    "maintenance_interval",
    "log_retention",
    "replay_grace",
    "stop_timeout",
)


def _duration(name: str, text: str) -> int:
    """`text` (the value of setting `name`) in milliseconds; ValueError names the environment variable."""
    try:
        return parse_duration_ms(text)
    except ValueError as e:
        raise ValueError(f"{name.upper()}: {e}") from None


def _port(text: str) -> int | None:
    if text.strip().lower() in ("off", "false", "no", ""):
        return None
    port = int(text)
    if not 1 <= port <= 65535 - 16:
        raise ValueError(f"METRICS_PORT must be a TCP port (1-65519) or off, got {text!r}")
    return port


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def lake_location(env: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """LAKE_DIR of `env` (default: the process's environment), the one place it is read and normalized: (its
    local directory, resolved, or None when it is the URI of another store; the URI the service addresses the
    lake by: that directory's path, or the URI as given, stripped). Unset or blank is `./lake`; `file://` and `~`
    are a local path."""
    e = os.environ if env is None else env
    text = e.get("LAKE_DIR", "").strip() or "./lake"
    if "://" in text and not text.lower().startswith("file://"):
        return None, text
    local = Path(text.removeprefix("file://")).expanduser().resolve()
    return local, str(local)


def _pipeline_file(text: str) -> Path:
    return Path(text).expanduser().resolve() if text.strip() else BUILTIN_FILE


def _jvm_cache(text: str) -> Path | None:
    if text.strip().lower() in ("off", "false", "no", "0"):
        return None
    return Path(text).resolve() if text.strip() else Path(sys.prefix) / "mview-jvm"


@dataclass(frozen=True)
class Settings:
    """Configuration of every job and command. What a pipeline declares (a list's cap, a fan-out limit) is in its
    file; the built-in file reads TIMELINE_CAP and FANOUT_LIMIT from the environment the settings were read from.

    lake_dir: LAKE_DIR when it is a local path (resolved), else None; where logs, state, dead letters and
        checkpoints live (default ./lake).
    lake_uri: LAKE_DIR as the service addresses it: the resolved local path, `hdfs://host:port/path` or
        `s3a://bucket/path`. `lake` is its `changelog.storage.Lake`, through which every lake file is read and
        written (S3's endpoint and credentials from S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).
    redis_url: REDIS_URL, the serving Redis (default redis://127.0.0.1:6379/0).
    spark_master: SPARK_MASTER, the Spark master URL (default local[*]).
    allowed_lateness: ALLOWED_LATENESS, watermark delay of every event-time stream (default "10 minutes").
    shuffle_partitions: SHUFFLE_PARTITIONS, spark.sql.shuffle.partitions (default 2; 200 is ~15x slower here), and the
        tasks that list a table's files (spark.sql.sources.parallelPartitionDiscovery.parallelism, at least 2).
    trigger_interval: TRIGGER_INTERVAL, micro-batch interval of deployed jobs (default "500 ms").
    idle_timeout: IDLE_TIMEOUT, processing-time idle timeout after which the watermark of every interval job
        may advance without new events (default empty = off).
    driver_memory: SPARK_DRIVER_MEMORY (default 4g).
    maintenance_interval: MAINTENANCE_INTERVAL, period of the scheduled maintenance (default "1 hour").
    maintenance_in_job: MAINTENANCE_IN_JOB, run the maintenance inside each deployed job too (default false).
    log_retention: LOG_RETENTION, VACUUM keeps files removed from logs and state for this long (default
        "7 days"); a consumer lagging further behind than this cannot resume (replay it).
    compact_topics: COMPACT_TOPICS, table topics whose logs maintenance compacts to the deciding record per key
        (default "auto": every table topic no asof job reads, since an asof job needs every version; empty = none).
    pipeline_file: MVIEW_PIPELINE, the pipeline file (default: the built-in pipeline, `views.pipeline.BUILTIN_FILE`).
        `pipeline()` loads it, with `${VAR}` taken from the environment the settings were read from.
    replay_grace: REPLAY_GRACE, how long a replay waits after the switch before deleting the old generation's
        keys, so reads that resolved the old pointer finish (default "2 s").
    stop_timeout: STOP_TIMEOUT, how long `mview stop` waits for the batch in flight before SIGKILL (default
        "10 minutes").
    metrics_port: METRICS_PORT, first port of the jobs' Prometheus metrics on 127.0.0.1, one per job in registry
        order (default 9464; "off" = none). See `jobs.core.metrics`.
    spark_ui: SPARK_UI, serve Spark's own web UI from jobs this process starts (default false: off for speed).
    kafka_bootstrap: KAFKA_BOOTSTRAP, bootstrap servers of the Kafka cluster (default empty = no Kafka: records
        enter only through `mview ingest`).
    kafka_topic_prefix: KAFKA_TOPIC_PREFIX, topic T is the Kafka topic <prefix>T (default "mview.").
    pg_dsn: PG_DSN, libpq connection string of the PostgreSQL database the `cdc` job captures (default empty =
        no CDC). May hold a password: never in a repr, log, status or error message.
    pg_slot: PG_SLOT, the logical replication slot and publication the `cdc` job owns (default empty:
        `mview_<the first topic with capture>`, `mview_profiles` for the built-in pipeline; `jobs.kinds.cdc`). The tables
        it captures are the pipeline's (`capture: {postgres: ...}`); the built-in file reads PG_TABLE for its own.
    redis_cluster: REDIS_CLUSTER, REDIS_URL names a node of a Redis Cluster (default false). The mode is read
        from the server either way; true makes every connection refuse a server that is not a cluster node.
    jvm_cache: JVM_CACHE, directory of the driver JVM's AOT cache built by `make jvm-cache` (default
        <venv>/mview-jvm; "off" = never use one). Used by local-master jobs when present and current.
    """

    lake_dir: Path | None
    redis_url: str = field(repr=False)  # may hold a password: never in a repr or traceback
    spark_master: str
    allowed_lateness: str
    shuffle_partitions: int
    trigger_interval: str
    idle_timeout: str
    driver_memory: str
    maintenance_interval: str = "1 hour"
    maintenance_in_job: bool = False
    log_retention: str = "7 days"
    compact_topics: tuple[str, ...] = ("auto",)
    replay_grace: str = "2 s"
    stop_timeout: str = "10 minutes"
    jvm_cache: Path | None = None
    pipeline_file: Path = BUILTIN_FILE
    # the environment the settings were read from (a pipeline file's ${VAR}); may hold secrets: never shown
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    metrics_port: int | None = 9464
    spark_ui: bool = False
    kafka_bootstrap: str = ""
    kafka_topic_prefix: str = "mview."
    pg_dsn: str = field(default="", repr=False)  # may hold a password
    pg_slot: str = ""
    redis_cluster: bool = False
    lake_uri: str = ""  # set from lake_dir when that is given
    # The durations above, parsed once when the settings are made (a bad one raises ValueError naming it).
    allowed_lateness_ms: int = field(init=False)
    trigger_interval_ms: int = field(init=False)
    idle_timeout_ms: int | None = field(init=False)  # None: off
    maintenance_interval_ms: int = field(init=False)
    log_retention_ms: int = field(init=False)
    replay_grace_ms: int = field(init=False)
    stop_timeout_ms: int = field(init=False)

    def __post_init__(self) -> None:
        if self.lake_dir is not None:
            object.__setattr__(self, "lake_uri", str(self.lake_dir))
        elif not self.lake_uri:
            raise ValueError("LAKE_DIR: a local path, hdfs://host:port/path or s3a://bucket/path is needed")
        for name in _DURATIONS:
            object.__setattr__(self, f"{name}_ms", _duration(name, getattr(self, name)))
        idle = self.idle_timeout
        object.__setattr__(self, "idle_timeout_ms", _duration("idle_timeout", idle) if idle.strip() else None)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        lake_dir, lake_uri = lake_location(e)
        s = cls(
            lake_dir=lake_dir,
            lake_uri=lake_uri,
            redis_url=e.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            spark_master=e.get("SPARK_MASTER", "local[*]"),
            allowed_lateness=e.get("ALLOWED_LATENESS", "10 minutes"),
            shuffle_partitions=int(e.get("SHUFFLE_PARTITIONS", "2")),
            trigger_interval=e.get("TRIGGER_INTERVAL", "500 ms"),
            idle_timeout=e.get("IDLE_TIMEOUT", ""),
            driver_memory=e.get("SPARK_DRIVER_MEMORY", "4g"),
            maintenance_interval=e.get("MAINTENANCE_INTERVAL", "1 hour"),
            maintenance_in_job=_flag(e.get("MAINTENANCE_IN_JOB", "false")),
            log_retention=e.get("LOG_RETENTION", "7 days"),
            compact_topics=tuple(t.strip() for t in e.get("COMPACT_TOPICS", "auto").split(",") if t.strip()),
            replay_grace=e.get("REPLAY_GRACE", "2 s"),
            stop_timeout=e.get("STOP_TIMEOUT", "10 minutes"),
            jvm_cache=_jvm_cache(e.get("JVM_CACHE", "")),
            metrics_port=_port(e.get("METRICS_PORT", "9464")),
            spark_ui=_flag(e.get("SPARK_UI", "false")),
            kafka_bootstrap=e.get("KAFKA_BOOTSTRAP", "").strip(),
            kafka_topic_prefix=e.get("KAFKA_TOPIC_PREFIX", "mview."),
            pg_dsn=e.get("PG_DSN", "").strip(),
            pg_slot=e.get("PG_SLOT", "").strip(),
            redis_cluster=_flag(e.get("REDIS_CLUSTER", "false")),
        )
        object.__setattr__(s, "pipeline_file", _pipeline_file(e.get("MVIEW_PIPELINE", "")))
        object.__setattr__(s, "env", dict(e))
        return s

    @property
    def lake(self) -> Lake:
        """The lake at `lake_uri` (one per settings object and process)."""
        got = self.__dict__.get("_lake")
        if got is None or got.text != self.lake_uri:
            got = open_lake(self.lake_uri, self.env or None)
            object.__setattr__(self, "_lake", got)
        return got

    def pipeline(self) -> Pipeline:
        """The pipeline of `pipeline_file` (loaded once per file content and environment; `spec.PipelineError`
        with every problem, one line each, when it is not valid), each topic read from a view reading that view's
        table log in the generation its job serves (`jobs.core.chain.resolve`: asked anew at each call)."""
        from jobs.core.chain import resolve

        return resolve(self, pipeline_at(str(self.pipeline_file), self.env))

    def topic(self, name: str) -> Topic:
        """The topic `name` of the settings' pipeline: how a topic's name (a command's argument, a job's topic
        list) becomes the `spec.model.Topic` the changelog's functions take. `UnknownTopic` names the pipeline's
        topics."""
        pipeline = self.pipeline()
        try:
            return pipeline.topics[name]
        except KeyError:
            raise UnknownTopic(name, tuple(pipeline.topics), Path(pipeline.file).name) from None
