"""The edge the tests call the changelog from: a topic given by name, as the tests have always named them.

The service's functions take a `spec.model.Topic` (and a `changelog.storage.Lake`: a test holding a path opens it
with `changelog.storage.as_lake`)."""

from __future__ import annotations

from spec.builtin import default_pipeline
from spec.model import Topic


def as_topic(topic: Topic | str) -> Topic:
    """`topic` itself, or the topic of that name in the pipeline of this process's `MVIEW_PIPELINE` (the built-in
    pipeline when unset)."""
    return topic if isinstance(topic, Topic) else default_pipeline().topics[topic]
