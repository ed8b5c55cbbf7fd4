"""What a job has done, read from the lake without Spark: the log versions its checkpoint has fully processed, its
lag behind its logs, and the lines of its topics that went to the dead-letter logs. Shared by the job kinds (their batch summaries), the
replay (its progress) and `mview status`."""

from __future__ import annotations

import json

from changelog.deadletters import count_dead_letters
from changelog.storage import Lake
from changelog.topics import latest_version
from jobs.core.registry import jobs
from jobs.core.runtime import checkpoint_key, committed_batches
from jobs.core.settings import Settings

__all__ = [
    "processed_versions",
    "lag_versions",
    "upstream_lag",
    "rejected",
    "rejected_per_topic",
]


def _next_version(offset: dict) -> int | None:
    """The first Delta version a source offset has not fully processed.

    A Delta source offset is (reservoirVersion, index, isStartingVersion): with isStartingVersion the source is
    reading the snapshot *of* reservoirVersion (versions 0..reservoirVersion at once), which is done only when
    the offset moves on to (reservoirVersion + 1, -1); otherwise files up to `index` of reservoirVersion are
    processed, index -1 meaning none of it, and the sentinel index END (Long.MAX_VALUE) all of it.
    """
    if "reservoirVersion" not in offset:
        return None
    v, index = int(offset["reservoirVersion"]), int(offset.get("index", -1))
    if offset.get("isStartingVersion"):
        return 0
    if index >= 2**62:  # END_INDEX: the version is complete
        return v + 1
    return v


def processed_versions(lake: Lake, checkpoint: str) -> list[int | None]:
    """Per source of the query checkpointed at key `checkpoint` of `lake`, the first log version not yet fully
    processed by the last committed batch ([] before the first commit)."""
    done = committed_batches(lake, checkpoint)
    if not done:
        return []
    lines = lake.read_bytes(checkpoint, "offsets", str(done[-1])).decode().splitlines()
    out: list[int | None] = []
    for line in lines[2:]:
        try:
            o = json.loads(line)
        except json.JSONDecodeError:
            out.append(None)
            continue
        out.append(_next_version(o) if isinstance(o, dict) else None)
    return out


def rejected_per_topic(settings: Settings, topics) -> dict[str, int]:
    """Dead-lettered lines of each of `topics` (names of the settings' pipeline;
    `changelog.deadletters.count_dead_letters`)."""
    return {topic: count_dead_letters(settings.lake, settings.topic(topic)) for topic in topics}


def rejected(settings: Settings, topics) -> int:
    """Dead-lettered lines of `topics`, all together."""
    return sum(rejected_per_topic(settings, topics).values())


def _topic_lags(settings: Settings, pipeline, job: str, generation: int) -> dict[str, int | None]:
    """Per topic of job `job` of `pipeline` (the settings', resolved once by the caller), its log versions not yet
    fully processed by `generation` (0 when caught up); None for a topic read from a view whose job has published
    nothing yet (`jobs.core.chain`)."""
    done = processed_versions(settings.lake, checkpoint_key(job, generation)) if generation else []
    out: dict[str, int | None] = {}
    for i, name in enumerate(pipeline.jobs[job].topics):
        topic = pipeline.topics[name]
        if topic.view is not None and topic.log is None:
            out[name] = None
            continue
        nxt = done[i] if i < len(done) and done[i] is not None else 0
        out[name] = max(0, latest_version(settings.lake, topic) + 1 - nxt)
    return out


def lag_versions(settings: Settings, job: str, generation: int) -> int | None:
    """Log versions of `job`'s topics not yet fully processed by `generation` (0 when caught up; a view no job has
    published counts nothing); for a job with its own lag (`JobSpec.lag`: a source job), that lag (None when it
    cannot be measured now)."""
    spec = jobs(settings)[job]
    if spec.lag:
        return spec.call("lag", settings)
    return sum(lag or 0 for lag in _topic_lags(settings, settings.pipeline(), job, generation).values())


def upstream_lag(settings: Settings, job: str, generation: int) -> dict[str, int | None]:
    """Per job whose views pipeline job `job` reads, the versions of those views' logs `generation` has not fully
    processed: its lag behind that job (None while that job has published nothing); {} for a job that reads no
    view."""
    pipeline = settings.pipeline()
    out: dict[str, int | None] = {}
    for name, lag in _topic_lags(settings, pipeline, job, generation).items():
        view = pipeline.topics[name].view
        if view is not None:
            up = pipeline.view_job(view)
            before = out.get(up, 0)
            out[up] = None if lag is None or before is None else before + lag
    return out
