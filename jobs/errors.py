"""Errors of the jobs layer. Each carries the data needed to act on it; the CLI prints them as one line."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "JobsError",
    "LakeUnusable",
    "UnknownName",
    "QueryFailed",
    "RedisServerMissing",
    "PostgresServerFailed",
    "KafkaBrokerFailed",
    "KafkaConnectFailed",
    "SourceNotConfigured",
    "LeaseLost",
    "ChainNotRun",
]


class JobsError(Exception):
    """Root of every error raised by `jobs`."""


class LakeUnusable(JobsError):
    """LAKE_DIR cannot be used by a command: it does not exist (for a command that only reads it) or cannot be
    written (for one that writes), or its store does not answer. `path` is the directory or URI (no credentials),
    `reason` what is wrong."""

    def __init__(self, path: Path | str, reason: str):
        super().__init__(f"LAKE_DIR {path} {reason}")
        self.path = path if isinstance(path, str) else Path(path)
        self.reason = reason


class UnknownName(JobsError):
    """A job or view name that does not exist. `kind` is "job" or "view", `name` the name given, `choices` the
    names there are."""

    def __init__(self, kind: str, name: str, choices):
        super().__init__(f"unknown {kind} {name!r}: choose one of {', '.join(choices)}")
        self.kind, self.name, self.choices = kind, name, tuple(choices)


class QueryFailed(JobsError):
    """A job's streaming query `name` ended with an error (`cause`: Spark's exception)."""

    def __init__(self, name: str, cause: BaseException):
        super().__init__(f"{name}: streaming query failed: {cause}")
        self.name, self.cause = name, cause


class RedisServerMissing(JobsError):
    """A scratch or development redis-server cannot be started (`reason` says why and what to do)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class PostgresServerFailed(JobsError):
    """A scratch or development PostgreSQL server cannot be set up or started (`reason` says why and what to do)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class KafkaBrokerFailed(JobsError):
    """A scratch or development Kafka broker cannot be set up or started (`reason` says why and what to do)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class KafkaConnectFailed(JobsError):
    """A scratch Kafka Connect worker (with the Debezium connector) cannot be set up or started (`reason` says why
    and what to do)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class SourceNotConfigured(JobsError):
    """Source job `job` reads `system`, which `variable` (empty) would name; `example` is a value to set."""

    def __init__(self, job: str, system: str, variable: str, example: str):
        super().__init__(f"{system} is not configured: set {variable} (e.g. {example}) to run the {job} job")
        self.job, self.system, self.variable, self.example = job, system, variable, example


class ChainNotRun(JobsError):
    """Job `job` reads topic `topic`, which is view `view` (of kind `kind`) of job `upstream` (of kind
    `upstream_kind`; `from: {view: ...}`): `mview check` checks such a chain, but a job over a view whose log is
    not kept (`views.table.keeps_table`: a row view of an interval job) does not run yet."""

    def __init__(self, job: str, topic: str, view: str, upstream: str, kind: str, upstream_kind: str):
        super().__init__(
            f"{job} reads {topic!r}, {kind} view {view!r} of {upstream_kind} job {upstream!r}: a job over an agg, "
            f"count or log view, or a row view of a join, select or asof job, runs; over this one it is checked "
            "(mview check) but does not run yet; read the topics of its job instead"
        )
        self.job, self.topic, self.view, self.upstream, self.kind = job, topic, view, upstream, kind
        self.upstream_kind = upstream_kind


class JobRunning(JobsError):
    """`mview run <job> --once` while another driver of the job holds its lease (deployed, or `mview run` without
    --once, on this machine or another): both would write the job's checkpoint. `holder` says which driver."""

    def __init__(self, job: str, holder: str):
        super().__init__(
            f"{job} runs in another driver ({holder}): stop it (mview stop {job}) before a --once, "
            "which would write its checkpoint too"
        )
        self.job, self.holder = job, holder


class LeaseLost(JobsError):
    """A driver of job `job` is not sure to hold the job's lease any more (`reason`): it must not commit or write
    the micro-batch in flight (another driver may have taken over and replays it)."""

    def __init__(self, job: str, reason: str):
        super().__init__(f"{job}: the job's lease is not valid ({reason}): not committing the micro-batch")
        self.job, self.reason = job, reason
