"""Errors of the changelog layer. Each carries the data needed to act on it."""

from __future__ import annotations

__all__ = ["ChangelogError", "InvalidRecord", "UnknownTopic"]


class ChangelogError(Exception):
    """Root of every error raised by `changelog`."""


class InvalidRecord(ChangelogError):
    """A line that is not a valid record of its topic. `reason` says why, in words a producer can act on."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class UnknownTopic(ChangelogError):
    def __init__(self, topic: str, known: tuple[str, ...]):
        super().__init__(f"unknown topic {topic!r}: choose one of {', '.join(known)}")
        self.topic = topic
        self.known = known
