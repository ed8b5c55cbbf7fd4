"""The built-in pipeline's `timeline` view as the demo, the benchmarks and the tests read it: `views.list` over the
view the built-in pipeline file declares (`pipelines/builtin.yml`), with its key names (`user_id`, `tweets`,
`tweet_ids`) and its Redis keys by their old roles (a user's timeline, a tweet's body, a celebrity's tweets, the
celebrities a user follows)."""

from __future__ import annotations

from pathlib import Path

from views.keys import entry_key, heavy_key, list_key, reads_key
from views.list import export_list, read_list
from views.pipeline import load_pipeline

__all__ = [
    "BUILTIN_FILE",
    "TIMELINE",
    "read_timeline",
    "query_timeline",
    "export_timeline",
    "timeline_key",
    "tweet_key",
    "authored_key",
    "celebs_key",
    "run_timeline",
]

BUILTIN_FILE = Path(__file__).resolve().parent / "pipelines" / "builtin.yml"
TIMELINE = load_pipeline(BUILTIN_FILE, {}).views[
    "timeline"
]  # (its cap and fan-out limit are read from Redis)


def read_timeline(client, user_id: str, limit: int | None = None, *, job: str = "timeline") -> dict:
    """`{"user_id","generation","tweet_ids":[...],"tweets":[{"tweet_id","user_id","text","ts"}, ...]}`:
    `views.list.read_list` (`job`, when not the view's, raises `views.errors.WrongJob`)."""
    return read_list(client, TIMELINE, user_id, limit, job=job)


def query_timeline(client, user_id: str, *, limit: int | None = None, job: str = "timeline") -> dict:
    return read_timeline(client, user_id, limit, job=job)


def export_timeline(client, *, job: str = "timeline"):
    """`{"user_id","tweet_ids":[newest first]}` per user: `views.list.export_list`."""
    return export_list(client, TIMELINE, job)


def timeline_key(generation: int, user_id: str) -> str:
    return list_key(TIMELINE.name, generation, user_id)


def tweet_key(generation: int, tweet_id: str) -> str:
    return entry_key(TIMELINE.name, generation, tweet_id)


def authored_key(generation: int, author: str) -> str:
    return heavy_key(TIMELINE.name, generation, author)


def celebs_key(generation: int, user_id: str) -> str:
    return reads_key(TIMELINE.name, generation, user_id)


def run_timeline(spark, settings, **kwargs) -> dict:
    """The built-in `timeline` job as `mview run timeline` runs it: the job of that name in the settings' pipeline,
    by its kind's runner (`jobs.kinds.join.run`). Returns the run's totals."""
    from jobs.core.registry import job_spec

    return job_spec(settings, "timeline").run(spark, settings, **kwargs)
