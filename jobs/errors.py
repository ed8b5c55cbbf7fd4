"""Errors of the jobs layer. Each carries the data needed to act on it; the CLI prints them as one line."""

from __future__ import annotations

from pathlib import Path

__all__ = ["JobsError", "LakeUnusable"]


class JobsError(Exception):
    """Root of every error raised by `jobs`."""


class LakeUnusable(JobsError):
    """LAKE_DIR cannot be used by a command: it does not exist (for a command that only reads it) or cannot be
    written (for one that writes). `path` is the directory, `reason` what is wrong."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"LAKE_DIR {path} {reason}")
        self.path = Path(path)
        self.reason = reason
