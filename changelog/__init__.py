"""Logs as Delta tables: topics as data (a topic's records and log follow its `spec.model.Topic`), validated
ingest with dead letters, Kafka and PostgreSQL sources, readers by version and as streams."""

from changelog.errors import ChangelogError, InvalidRecord, NotStored, TopicChanged, UnknownTopic
from changelog.records import MAX_RECORD_BYTES, parse_line, parse_ts, validate
from changelog.topics import latest_version, read_batch, read_stream, topic_path

__all__ = [
    "ChangelogError",
    "InvalidRecord",
    "NotStored",
    "MAX_RECORD_BYTES",
    "TopicChanged",
    "UnknownTopic",
    "parse_line",
    "parse_ts",
    "validate",
    "latest_version",
    "read_batch",
    "read_stream",
    "topic_path",
]
