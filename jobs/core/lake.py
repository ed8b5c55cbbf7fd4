"""Checks of `LAKE_DIR` made before a command starts Spark or touches the lake, so a wrong or read-only lake, or one
of another version's format, is one line of error, at once, instead of a JVM traceback after Spark's start-up."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

from changelog.lakeformat import format_problem
from changelog.storage import LakeUnreachable, StorageError
from jobs.core.settings import Settings
from jobs.errors import LakeUnusable

__all__ = ["require_lake"]


def _require_store(settings: Settings, *, write: bool) -> None:
    lake = settings.lake
    try:
        if write:
            probe = f".mview-probe-{uuid.uuid4().hex}"
            lake.write_bytes(b"", probe)
            lake.delete(probe)
        else:
            lake.list()
    except LakeUnreachable as e:
        raise LakeUnusable(lake.uri(), f"does not answer ({e.reason}): {lake.start_hint}") from None
    except StorageError as e:
        what = "be written" if write else "be read"
        raise LakeUnusable(
            lake.uri(), f"cannot {what} ({e.reason}): check LAKE_DIR and the store's credentials"
        ) from None


def require_lake(settings: Settings, *, write: bool) -> Path | None:
    """The lake directory (None for a lake on HDFS or S3), checked for a command: usable, and of the format this
    version reads (`changelog.lakeformat.format_problem`).

    write=False (commands that only read it, e.g. `status`): it must exist; nothing is created.
    write=True (ingest, run, deploy, replay, maintain): it is created if missing, then a probe file is written and
    removed, so a read-only file system or missing permission is found before any work starts.
    A lake on HDFS or S3 is checked the same way through the storage layer: read, it must answer; written, a probe
    object is created and removed (a store that does not answer, a missing bucket or permission fail here).
    Raises `LakeUnusable` saying what is wrong and what to do.
    """
    path = _require_usable(settings, write=write)
    problem = format_problem(settings.lake)
    if problem:
        raise LakeUnusable(settings.lake.uri(), problem)
    return path


def _require_usable(settings: Settings, *, write: bool) -> Path | None:
    path = settings.lake_dir
    if path is None:
        _require_store(settings, write=write)
        return None
    if not write:
        if not path.exists():
            raise LakeUnusable(
                path,
                "does not exist (nothing was ingested or run with it): check LAKE_DIR, or ingest a file first",
            )
        if not path.is_dir():
            raise LakeUnusable(path, "is not a directory: point LAKE_DIR at a directory")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".mview-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise LakeUnusable(
            path, f"cannot be written ({e.strerror or e}): point LAKE_DIR at a writable directory"
        ) from None
    return path
