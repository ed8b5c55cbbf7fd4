"""The built-in pipeline's jobs as the tests run them: `run_timeline(spark, settings, once=True)` is what `mview
run timeline --once` runs (the job of that name in the settings' pipeline, by its kind's runner)."""

from __future__ import annotations

import functools

from jobs.core.registry import job_spec

__all__ = ["run_job", "run_timeline", "run_clicks", "run_enrichment"]


def run_job(name: str, spark, settings, **kwargs) -> dict:
    return job_spec(settings, name).run(spark, settings, **kwargs)


run_timeline = functools.partial(run_job, "timeline")
run_clicks = functools.partial(run_job, "clicks")
run_enrichment = functools.partial(run_job, "enrichment")
