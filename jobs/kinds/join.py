"""A `join` job: the incremental inner join of two table topics, publishing list, row and count views.

(Interim: runs the built-in pipeline's join job through the built-in join job's module until the runner over roles replaces it.)
"""

from __future__ import annotations

from jobs.settings import Settings
from spec.model import Pipeline

__all__ = ["run"]


def run(spark, settings: Settings, pipeline: Pipeline, job: str, **kwargs) -> dict:
    from jobs.timeline import run_timeline

    return run_timeline(spark, settings, **kwargs)
