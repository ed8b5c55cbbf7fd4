"""Errors of the changelog layer. Each carries the data needed to act on it."""

from __future__ import annotations

__all__ = [
    "ChangelogError",
    "InvalidRecord",
    "RecordTooLarge",
    "NotStored",
    "UnknownTopic",
    "KafkaUnavailable",
    "NotProduced",
    "PostgresUnavailable",
    "CdcFailed",
]


class ChangelogError(Exception):
    """Root of every error raised by `changelog`."""


class InvalidRecord(ChangelogError):
    """A line that is not a valid record of its topic. `reason` says why, in words a producer can act on."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RecordTooLarge(InvalidRecord):
    """A record whose JSON line holds `size` bytes, more than the maximum record size `limit`."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"record of {size:,} bytes exceeds the maximum record size of {limit:,} bytes")
        self.size, self.limit = size, limit


class NotStored(ChangelogError):
    """The validated records of `file` could not be stored exactly as validated; none of them was committed."""

    def __init__(self, topic: str, file: str, accepted: int, cause: str):
        super().__init__(
            f"{topic}: {file}: nothing was committed: the file's {accepted:,} validated record(s) do not fit the"
            f" topic's schema exactly ({cause}); this is a bug in mview's validation, please report it with the file"
        )
        self.topic, self.file, self.accepted, self.cause = topic, file, accepted, cause


class UnknownTopic(ChangelogError):
    def __init__(self, topic: str, known: tuple[str, ...]):
        super().__init__(f"unknown topic {topic!r}: choose one of {', '.join(known)}")
        self.topic = topic
        self.known = known


class KafkaUnavailable(ChangelogError):
    """No Kafka broker answers at `bootstrap` (KAFKA_BOOTSTRAP); `cause` is the client's reason."""

    def __init__(self, bootstrap: str, cause: str):
        super().__init__(
            f"Kafka does not answer at KAFKA_BOOTSTRAP={bootstrap} ({cause}): start a broker there (`make kafka`) "
            "or point KAFKA_BOOTSTRAP at one"
        )
        self.bootstrap, self.cause = bootstrap, cause


class NotProduced(ChangelogError):
    """Messages to Kafka topic `topic` were not all acknowledged: `acknowledged` were, `cause` says why not."""

    def __init__(self, topic: str, acknowledged: int, cause: str):
        super().__init__(
            f"{topic}: only {acknowledged:,} message(s) were acknowledged ({cause}): produce the input again "
            "(the `kafka` job copies a message produced twice twice)"
        )
        self.topic, self.acknowledged, self.cause = topic, acknowledged, cause


class PostgresUnavailable(ChangelogError):
    """The database to capture cannot be reached or refuses us. `dsn` is PG_DSN as shown (never its password),
    `cause` the server's or libpq's reason."""

    def __init__(self, dsn: str, cause: str):
        super().__init__(
            f"PostgreSQL at PG_DSN ({dsn}) cannot be used: {cause}; start it (`make postgres` starts a local one) or"
            " point PG_DSN at the database to capture"
        )
        self.dsn, self.cause = dsn, cause


class CdcFailed(ChangelogError):
    """Change data capture cannot go on (the table, publication or slot is not as it needs them). `reason` says
    why and what to do."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
