"""The built-in `enrichment` job (activity x versioned profiles, `enriched_activity` and `activity_by_country`): the
built-in pipeline's asof job, run by `jobs.kinds.asof` (semantics there and in `docs/enrichment.md`)."""

from __future__ import annotations

from jobs.kinds import asof
from jobs.settings import Settings
from spec.builtin import builtin_pipeline

__all__ = ["run_enrichment", "JOB"]

JOB = "enrichment"


def run_enrichment(spark, settings: Settings, **kwargs) -> dict:
    """`jobs.kinds.asof.run` of the built-in `enrichment` job (`once`, `generation`)."""
    return asof.run(spark, settings, builtin_pipeline(), JOB, **kwargs)
