"""Pipelines as data: the topics, jobs and views a pipeline file declares, loaded and checked without Spark (the
loader takes the view kinds; `views.pipeline` is the loader with the registered ones)."""

from spec.durations import parse_duration_ms
from spec.errors import PipelineError, Problem
from spec.load import RESERVED_JOBS
from spec.model import (
    FIELD_TYPES,
    MATCHES,
    SQL_TYPES,
    VERSION,
    Asof,
    Capture,
    Interval,
    Job,
    Join,
    Pipeline,
    Topic,
    View,
)

__all__ = [
    "parse_duration_ms",
    "PipelineError",
    "Problem",
    "RESERVED_JOBS",
    "FIELD_TYPES",
    "MATCHES",
    "SQL_TYPES",
    "VERSION",
    "Asof",
    "Capture",
    "Interval",
    "Job",
    "Join",
    "Pipeline",
    "Topic",
    "View",
]
