"""The edge the tests call the changelog from: a topic given by name, as the tests have always named them.

The service's functions take a `spec.model.Topic` (and a `changelog.storage.Lake`: a test holding a path opens it
with `changelog.storage.as_lake`)."""

from __future__ import annotations

from pathlib import Path

from spec.model import Pipeline, Topic
from views.pipeline import default_pipeline, load_pipeline


def as_topic(topic: Topic | str, pipeline: Pipeline | Path | None = None) -> Topic:
    """`topic` itself, or the topic of that name in `pipeline` (a Pipeline or its file; default: the pipeline of
    this process's `MVIEW_PIPELINE`, the built-in pipeline when unset)."""
    if isinstance(topic, Topic):
        return topic
    if isinstance(pipeline, Path):
        pipeline = load_pipeline(pipeline)
    return (pipeline or default_pipeline()).topics[topic]


def log_rows(
    lake, topic: Topic | str, version: int | None = None, sql: str = "SELECT * FROM t", stamp: bool = False
) -> list[dict]:
    """The rows of `sql` over `topic`'s log (table `t`) in a local `lake` (a Lake or a path), at `version` (default: the
    latest), read with delta-rs as a reader without Spark would: [] when the log has no commit yet. Without `stamp`,
    the log's own per-record stamp (`changelog.topics.MAX_BEFORE`, tested on its own) is left out."""
    from deltalake import DeltaTable, QueryBuilder

    from changelog.storage import as_lake
    from changelog.topics import MAX_BEFORE, table_version, topic_path

    path = topic_path(as_lake(lake), as_topic(topic))
    if table_version(as_lake(path)) < 0:  # not created yet, or _delta_log made before its first commit
        return []
    t = QueryBuilder().register("t", DeltaTable(str(path), version=version)).execute(sql).read_all()
    cols = {n: t.column(n).to_pylist() for n in t.column_names if stamp or n != MAX_BEFORE}
    return [dict(zip(cols, row, strict=True)) for row in zip(*cols.values(), strict=True)]
