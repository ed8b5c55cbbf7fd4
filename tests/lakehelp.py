"""The edge the tests call the changelog from: a topic given by name, as the tests have always named them.

The service's functions take a `spec.model.Topic` (and a `changelog.storage.Lake`: a test holding a path opens it
with `changelog.storage.as_lake`)."""

from __future__ import annotations

from pathlib import Path

from spec.builtin import default_pipeline
from spec.load import load_pipeline
from spec.model import Pipeline, Topic


def as_topic(topic: Topic | str, pipeline: Pipeline | Path | None = None) -> Topic:
    """`topic` itself, or the topic of that name in `pipeline` (a Pipeline or its file; default: the pipeline of
    this process's `MVIEW_PIPELINE`, the built-in pipeline when unset)."""
    if isinstance(topic, Topic):
        return topic
    if isinstance(pipeline, Path):
        pipeline = load_pipeline(pipeline)
    return (pipeline or default_pipeline()).topics[topic]
