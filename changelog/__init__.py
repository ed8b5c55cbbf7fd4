"""Logs as Delta tables: topics, validated ingest with dead letters, readers by version and as streams."""

from changelog.errors import ChangelogError, InvalidRecord, NotStored, UnknownTopic
from changelog.records import MAX_RECORD_BYTES, parse_line, parse_ts, validate
from changelog.topics import TOPICS, latest_version, read_batch, read_stream, topic_path

__all__ = [
    "ChangelogError",
    "InvalidRecord",
    "NotStored",
    "MAX_RECORD_BYTES",
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
