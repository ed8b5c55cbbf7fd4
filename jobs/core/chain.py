"""Jobs over other jobs' views: which log a topic read from a view is (`resolve`), and what a job runs after.

A topic `from: {view: V}` (`spec.viewtable`) is read from V's table log (`views.table`) in the generation V's job
serves: its pointer `mv:gen:<job>` in Redis, or, when Redis lost it, the generation the lake says served
(`jobs.core.generations.lake_generation`). `Settings.pipeline()` returns the pipeline with each such topic's
`Topic.log` set, so the log a job reads is part of its definition (`spec.model.Pipeline.definition`): when the
upstream job switches to another generation (a replay, a definition change, a rebuild after Redis lost its copy)
the downstream job's definition changes, and it is rebuilt into a new generation from the new log while its old
generation serves readers (`jobs.core.replay.rebuild`); a deployed downstream job notices it between batches
(`jobs.ops.service`). Asked anew at each call: one GET per upstream job. A view whose job has published no
generation, or a Redis that does not answer, leaves the topic's `log` None (`changelog.errors.ViewNotPublished`
when it is read).

A topic read from a log view (an event topic) reads its output log (`views.log.log_key`) the same way. Every view
kind can be read but a row view of an interval job (`views.table.keeps_table`); `jobs.errors.ChainNotRun` names it
when a job over one would run.
"""

from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

from changelog.storage import StorageError
from jobs.core.generations import lake_generation
from jobs.core.settings import Settings
from jobs.errors import ChainNotRun
from spec.model import Pipeline
from views.errors import ViewError
from views.keys import gen_key
from views.log import log_key
from views.redis_io import connect
from views.table import keeps_table, table_key

__all__ = ["resolve", "upstream_generations", "reads", "check_chain"]

_UNANSWERED = (redis.RedisError, RedisClusterException, ViewError, OSError, StorageError)


_CLIENTS: dict[tuple[str, bool | None], object] = {}  # (REDIS_URL, REDIS_CLUSTER) -> a client, made once


def upstream_generations(settings: Settings, jobs) -> dict[str, int]:
    """The generation each job of `jobs` serves (its pointer, else the lake's; jobs that published none left
    out); {} when Redis does not answer."""
    where = (settings.redis_url, settings.redis_cluster)
    out = {}
    try:
        client = _CLIENTS.get(where)
        if client is None:
            client = _CLIENTS[where] = connect(where[0], cluster=where[1], check=False, wait=False)
        for job in jobs:
            pointer = client.get(gen_key(job))
            gen = int(pointer) if pointer is not None else lake_generation(settings, job)
            if gen:
                out[job] = gen
    except _UNANSWERED:
        _CLIENTS.pop(where, None)
        return {}
    return out


def resolve(settings: Settings, pipeline: Pipeline) -> Pipeline:
    """`pipeline` with each topic read from a view reading that view's table log in the generation its job serves
    (module docstring); `pipeline` itself when it has no such topic."""
    reading = {n: t for n, t in pipeline.topics.items() if t.view is not None}
    if not reading:
        return pipeline
    jobs = {pipeline.view_job(t.view) for t in reading.values()}
    serving = upstream_generations(settings, sorted(jobs))
    logs = {}
    for name, t in reading.items():
        gen = serving.get(pipeline.view_job(t.view))
        if gen is not None:
            logs[name] = log_key(t.view, gen) if t.kind == "event" else table_key(t.view, gen)
    return pipeline.reading(logs)


def reads(settings: Settings, job: str) -> dict[str, str | None]:
    """The log each topic of `job` read from a view reads now (`Topic.log`, None while unresolved): what a running
    job compares with what its query started on, to follow its upstream."""
    pipeline = settings.pipeline()
    return {
        t: pipeline.topics[t].log for t in pipeline.jobs[job].topics if pipeline.topics[t].view is not None
    }


def check_chain(pipeline: Pipeline, job: str) -> None:
    """Raise `ChainNotRun` if `job` reads a view whose table log is not kept (`views.table.keeps_table`: a log
    view, a row view of an interval job)."""
    for name in pipeline.jobs[job].topics:
        t = pipeline.topics[name]
        if t.view is None:
            continue
        view, upstream = pipeline.views[t.view], pipeline.jobs[pipeline.view_job(t.view)]
        if not keeps_table(view, upstream.kind):
            raise ChainNotRun(job, t.name, view.name, upstream.name, view.kind, upstream.kind)
