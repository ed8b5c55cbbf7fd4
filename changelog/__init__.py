"""Logs as Delta tables: topics, validated ingest with dead letters, readers by version and as streams."""

from changelog.errors import ChangelogError, InvalidRecord, UnknownTopic
from changelog.records import parse_line, parse_ts, validate
from changelog.topics import TOPICS, latest_version, read_batch, read_stream, topic_path

__all__ = [
    "ChangelogError",
    "InvalidRecord",
    "UnknownTopic",
    "TOPICS",
    "parse_line",
    "parse_ts",
    "validate",
    "latest_version",
    "read_batch",
    "read_stream",
    "topic_path",
]
