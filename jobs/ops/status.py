"""`mview status`: per job, from the lake (status file, the driver's lease, checkpoint, Delta logs, dead letters),
this machine's pid file of a deployed job, and the generation pointer in Redis (if Redis does not answer, the last
generation the job recorded). Never starts Spark.

Fields: `running` (a driver deployed from this machine lives, or the job's lease has a live holder), `pid` (the
driver's pid on this machine, or null), `driver` (only for a driver on another machine: its host and pid),
`generation` (serving), `lag_versions` (log versions of the job's topics that the serving generation's checkpoint
has not fully processed; 0 when caught up), `rejected`
(dead-lettered lines of the job's topics), `last_batch_ms`, `last_batch_seconds`, `redis` ("ok", "waiting for
Redis at ...", or why Redis cannot be used, the URL without its password; for a stopped job whose serving copy
Redis lost, "lost the serving copy ..." with what to run),
`replay` (progress of a replay in flight), `upstream` (a job over other jobs' views: per such job, the versions of
its views' logs the serving generation has not processed, null while it has published nothing), and whatever the job writes: counters (an interval job's `late`:
dropped; an asof job's `late_events_kept` and `late_changes_kept`: kept, joined as of their time; held ...), `state`
("rebuilding" while a deployed job rebuilds a serving copy Redis lost, with `rebuilding`: the reason and since
when), `rebuilds` (how many times it did) and `last_rebuild` (reason, generation, seconds).

`state` of a running job is "waiting" while it waits for a dependency: its `redis` or `kafka` field says
"waiting for ..." (the `cdc` job writes "waiting" itself while PostgreSQL does not answer, with `error`). Errors
are one line each, credentials masked (`jobs.core.runtime.error_line`): `last_error` (with `last_error_ms`) is why the
query last failed, null again once the job works again (a micro-batch applied, or the restarted query's first
trigger completed; it is then `previous_error`, with `at_ms` and `cleared_ms`); `error` is why the job failed or,
for `cdc`, waits.
"""

from __future__ import annotations

import redis

from jobs.core.generations import lake_generation, replay_in_progress
from jobs.core.lease import this_node
from jobs.core.progress import lag_versions, rejected, upstream_lag
from jobs.core.registry import jobs
from jobs.core.runtime import read_status
from jobs.core.settings import Settings
from views.errors import ViewError
from views.keys import gen_key
from views.redis_io import classify, connect, is_cluster, quick_client

# What a running job's `state` may say while it waits for a dependency, and the fields that say it waits.
_ACTIVE = ("starting", "running", "restarting")
_DEPENDENCIES = ("redis", "kafka")

__all__ = [
    "job_status",
    "drivers_here",
    "pid_of",
    "lag_versions",
]


def pid_of(settings: Settings, job: str) -> int | None:
    """The pid of the job's driver deployed from this machine if it is alive, else None."""
    from jobs.ops.deploy import pid_of as _pid_of

    return _pid_of(settings, job)


def driver_of(settings: Settings, job: str) -> dict | None:
    """The lease record of the job's live driver on any machine (`jobs.ops.deploy.driver_of`), else None."""
    from jobs.ops.deploy import driver_of as _driver_of

    return _driver_of(settings, job)


def _serving_generations(settings: Settings) -> dict[str, int] | ViewError:
    """The serving generation of each job that has one, or why Redis cannot tell (URL redacted)."""
    try:
        names = list(jobs(settings))
        url, quick = settings.redis_url, quick_client(settings.redis_url)
        pipe = (connect(url, wait=False, check=False) if is_cluster(url, quick) else quick).pipeline(False)
        for j in names:
            pipe.get(
                gen_key(j)
            )  # one key per command: on a Redis Cluster the pointers live on several masters
        values = pipe.execute()
    except ViewError as e:
        return e
    except (redis.RedisError, OSError) as e:  # unreachable, or a cluster that is down
        return classify(settings.redis_url, e)
    return {j: int(v) for j, v in zip(names, values, strict=True) if v is not None}


def job_status(settings: Settings) -> dict:
    serving = _serving_generations(settings)
    pipeline = settings.pipeline()
    out = {}
    for name, spec in jobs(settings).items():
        s = read_status(settings, name, "status.json")
        if not isinstance(serving, ViewError):
            gen = serving.get(name, 0)
        else:
            gen = int(s.get("generation", 0))
            if not spec.source:  # a source job writes only the lake: Redis is none of its business
                s.setdefault("redis", str(serving))
        pid = pid_of(settings, name)
        driver = driver_of(settings, name) if pid is None else None  # a driver deployed elsewhere
        live = pid is not None or driver is not None
        if driver is not None and driver.get("node") == this_node():
            pid = driver.get("pid")  # deployed from another HOME of this machine (a remote lake)
        row = {
            "running": live,
            "pid": pid,
            "generation": gen,
            "lag_versions": lag_versions(settings, name, gen),
            "rejected": rejected(settings, spec.topics),
            "metrics_url": s.get("metrics_url") if live else None,  # served while it runs
            "spark_ui_url": s.get("spark_ui_url") if live else None,  # with SPARK_UI=true
        }
        if name in pipeline.jobs and pipeline.upstream(name):  # its lag behind each job it reads views of
            row["upstream"] = upstream_lag(settings, name, gen)
        if driver is not None and driver.get("node") != this_node():
            row["driver"] = f"{driver.get('host')} pid {driver.get('pid')}"
        row.update({k: v for k, v in s.items() if k not in row})
        if isinstance(serving, dict) and name not in serving and not live:
            published = lake_generation(settings, spec.name)
            if published:  # a running job rebuilds by itself (state "rebuilding"); a stopped one cannot
                row["redis"] = (
                    f"lost the serving copy ({gen_key(name)} is gone; the lake has generation {published}): "
                    f"`mview deploy {name}` or `mview run {name} --once` rebuilds it"
                )
        if not live and row.get("state") == "stopped":
            row.pop("kafka", None)  # the broker as a running kafka job last saw it: stale once it stopped
        if not live and row.get("state") in ("running", "starting", "restarting", "rebuilding"):
            row["state"] = "dead (killed or crashed: `mview deploy` resumes from the checkpoint)"
        if (
            live
            and row.get("state") in _ACTIVE
            and any(str(row.get(dependency, "")).startswith("waiting") for dependency in _DEPENDENCIES)
        ):
            row["state"] = "waiting"  # for Redis or Kafka: `redis` / `kafka` says which, since when
        replay = read_status(settings, name, "replay.json")
        if replay_in_progress(settings, name) is not None:
            row["replay"] = {k: replay.get(k) for k in ("building", "processed_versions", "total_versions")}
        out[name] = row
    return out


def drivers_here(settings: Settings) -> dict[str, dict]:
    """What this machine knows of its deployed jobs without the lake (`mview status` while the store does not
    answer): per job whose driver deployed from here lives, its `pid` and the last line of its `job.log` (e.g.
    "the job's lease cannot be renewed (the lake does not answer): waiting"). Reads only machine-local files."""
    from jobs.ops.deploy import log_path

    out = {}
    for job in jobs(settings):
        pid = pid_of(settings, job)
        if pid is None:
            continue
        out[job] = {"pid": pid, "log": _last_line(log_path(settings, job))}
    return out


def _last_line(path) -> str:
    """The last line of the file at `path` (read from its last 4 KiB: a deployed job's log only grows), or ""."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""
