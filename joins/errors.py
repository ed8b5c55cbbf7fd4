"""Errors of the joins layer. Each carries the data needed to act on it."""

from __future__ import annotations

__all__ = ["JoinError", "BadJoinArgument"]


class JoinError(ValueError):
    """Root of every error raised by `joins` (a ValueError: the caller passed something the join cannot use)."""


class BadJoinArgument(JoinError):
    """Argument `argument` of a join has a value it cannot use (`value`); `reason` says what would be right."""

    def __init__(self, argument: str, value, reason: str):
        super().__init__(f"{argument}={value!r}: {reason}")
        self.argument, self.value, self.reason = argument, value, reason
