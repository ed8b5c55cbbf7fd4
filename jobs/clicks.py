"""The built-in `clicks` job (searches x clicks within one hour, `search_clicks` and `ctr`): the built-in pipeline's
interval job, run by `jobs.kinds.interval` (semantics there and in `docs/clicks.md`)."""

from __future__ import annotations

from jobs.kinds import interval
from jobs.settings import Settings
from spec.builtin import builtin_pipeline

__all__ = ["run_clicks", "close_idle_windows", "JOB"]

JOB = "clicks"


def run_clicks(spark, settings: Settings, **kwargs) -> dict:
    """`jobs.kinds.interval.run` of the built-in `clicks` job (`once`, `generation`, `max_files_per_trigger`)."""
    return interval.run(spark, settings, builtin_pipeline(), JOB, **kwargs)


def close_idle_windows(spark, settings: Settings, **kwargs) -> dict:
    """`jobs.kinds.interval.close_idle` of the built-in `clicks` job (`generation`, `now_ms`)."""
    return interval.close_idle(spark, settings, builtin_pipeline(), JOB, **kwargs)
