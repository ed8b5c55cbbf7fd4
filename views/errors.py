"""Errors of the views layer."""

from __future__ import annotations

__all__ = ["ViewError", "RedisUnavailable", "UnknownView"]


class ViewError(Exception):
    """Root of every error raised by `views`."""


class RedisUnavailable(ViewError):
    def __init__(self, url: str, cause: Exception | None = None):
        super().__init__(
            f"cannot reach Redis at {url} ({cause}): start one with `make redis` or point REDIS_URL at a running server"
        )
        self.url = url


class UnknownView(ViewError):
    def __init__(self, view: str, known: tuple[str, ...]):
        super().__init__(f"unknown view {view!r}: choose one of {', '.join(known)}")
        self.view = view
