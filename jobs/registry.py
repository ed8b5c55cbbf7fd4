"""The jobs this service runs, the topics each reads and the views each publishes. One table, read by the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

from jobs.errors import UnknownName

__all__ = ["JobSpec", "JOBS", "VIEWS", "job_spec", "view_job"]


@dataclass(frozen=True)
class JobSpec:
    name: str
    topics: tuple[str, ...]
    views: tuple[str, ...]
    runner: str  # "module:function" taking (spark, settings, *, once, generation) and returning a dict
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

    def call(self, attr: str, *args, **kwargs):
        module, func = getattr(self, attr).split(":")
        return getattr(import_module(module), func)(*args, **kwargs)

    def run(self, spark, settings, **kwargs) -> dict:
        return self.call("runner", spark, settings, **kwargs)


def _source_topics() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every topic, the captured topics) of the pipeline of the environment (`MVIEW_PIPELINE`): what the kafka
    and cdc jobs copy into. An invalid pipeline has none here: every command refuses it before it starts."""
    from changelog.postgres import captured_topics
    from spec import PipelineError
    from spec.builtin import default_pipeline

    try:
        topics = default_pipeline().topics
    except PipelineError:
        return (), ()
    return tuple(topics), tuple(t.name for t in captured_topics(topics.values()))


_ALL, _CAPTURED = _source_topics()

JOBS: dict[str, JobSpec] = {
    "timeline": JobSpec(
        "timeline",
        ("tweets", "follows"),
        ("timeline",),
        "jobs.timeline:run_timeline",
        ("timeline.entry", "timeline.heavy", "timeline.follows"),  # views.list's other keys
    ),
    "clicks": JobSpec("clicks", ("searches", "clicks"), ("search_clicks", "ctr"), "jobs.clicks:run_clicks"),
    "enrichment": JobSpec(
        "enrichment",
        ("activity", "profiles"),
        ("enriched_activity", "activity_by_country"),
        "jobs.enrichment:run_enrichment",
    ),
    "kafka": JobSpec(
        "kafka",
        _ALL,
        (),
        "jobs.kafka:run_kafka",
        lag="jobs.kafka:kafka_lag",
        lag_unit="messages",
        source=True,
    ),
    "cdc": JobSpec(
        "cdc",
        _CAPTURED,
        (),
        "jobs.cdc:run_cdc",
        lag="jobs.cdc:lag",
        lag_unit="bytes",
        source=True,
        probe="jobs.cdc:probe",
    ),
}

VIEWS: dict[str, str] = {view: spec.name for spec in JOBS.values() for view in spec.views}


def job_spec(name: str) -> JobSpec:
    if name not in JOBS:
        raise UnknownName("job", name, JOBS)
    return JOBS[name]


def view_job(view: str) -> str:
    if view not in VIEWS:
        raise UnknownName("view", view, VIEWS)
    return VIEWS[view]
