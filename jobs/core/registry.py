"""The jobs this service runs: every job of the pipeline (`Settings.pipeline()`), then the source jobs `kafka` and
`cdc`. A job's spec is derived from its declaration: the topics it reads, the views it publishes, its runner (one
per join kind, `jobs.kinds.<kind>:run`) and the Redis keys its views keep besides their own."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

from jobs.errors import UnknownName
from spec.model import Pipeline
from views.keys import extra_keys

__all__ = ["JobSpec", "jobs", "job_spec", "view_job", "views"]


@dataclass(frozen=True)
class JobSpec:
    name: str
    topics: tuple[str, ...]
    views: tuple[str, ...]
    # "module:function": a pipeline job's runner takes (spark, settings, pipeline, job, *, once, generation), a
    # source job's (spark, settings, *, once, generation); both return the run's totals
    runner: str
    # Redis key kinds the job writes per generation besides its views (`mv:<kind>:<g>:{id}`): replay and
    # maintenance remove them with the views when a generation is dropped.
    extra_keys: tuple[str, ...] = ()
    # "module:function" taking (settings) and returning the job's lag as an int (None: unknown), for a job whose
    # input is not the Delta logs of `topics` (a source job: Kafka messages, WAL bytes). Empty: log versions.
    lag: str = ""
    # The unit of the lag (the metric `mview_lag_<unit>`): log versions, or a source job's own (messages, bytes).
    lag_unit: str = "versions"
    # A source job copies an outside system into the topics' logs: no views, no generations, never replayed.
    source: bool = False
    # "module:function" taking (settings), checked by `mview deploy` before it starts the job: raises a problem no
    # retry can fix (the job is not started), returns one the job will wait out (an error, printed), or None.
    # Empty: Redis is checked (`views.redis_io.probe`), unless the job is a source job.
    probe: str = ""
    kind: str = ""  # the join kind of a pipeline job (interval, asof, join); empty for a source job

    def call(self, attr: str, *args, **kwargs):
        module, func = getattr(self, attr).split(":")
        return getattr(import_module(module), func)(*args, **kwargs)

    def run(self, spark, settings, **kwargs) -> dict:
        if self.source:
            return self.call("runner", spark, settings, **kwargs)
        return self.call("runner", spark, settings, settings.pipeline(), self.name, **kwargs)


def _of(pipeline: Pipeline) -> dict[str, JobSpec]:
    from changelog.postgres import captured_topics

    out = {}
    for job in pipeline.jobs.values():
        views_ = tuple(v.name for v in job.views)
        out[job.name] = JobSpec(
            job.name, job.topics, views_, f"jobs.kinds.{job.kind}:run", extra_keys(job.views), kind=job.kind
        )
    # the topics of a log of their own (a `from:` topic reads another's)
    everything = tuple(pipeline.written)
    captured = tuple(t.name for t in captured_topics(pipeline.topics.values()))
    out["kafka"] = JobSpec(
        "kafka",
        everything,
        (),
        "jobs.kinds.kafka:run_kafka",
        lag="jobs.kinds.kafka:kafka_lag",
        lag_unit="messages",
        source=True,
    )
    out["cdc"] = JobSpec(
        "cdc",
        captured,
        (),
        "jobs.kinds.cdc:run_cdc",
        lag="jobs.kinds.cdc:lag",
        lag_unit="bytes",
        source=True,
        probe="jobs.kinds.cdc:probe",
    )
    return out


def jobs(settings) -> dict[str, JobSpec]:
    """Every job, in order: the pipeline's jobs as the file declares them, then `kafka` and `cdc` (the order gives
    each job its metrics port)."""
    return _of(settings.pipeline())


def job_spec(settings, name: str) -> JobSpec:
    known = jobs(settings)
    if name not in known:
        raise UnknownName("job", name, known)
    return known[name]


def views(settings) -> dict[str, str]:
    """view -> the job that publishes it."""
    return {view: spec.name for spec in jobs(settings).values() for view in spec.views}


def view_job(settings, view: str) -> str:
    known = views(settings)
    if view not in known:
        raise UnknownName("view", view, known)
    return known[view]
