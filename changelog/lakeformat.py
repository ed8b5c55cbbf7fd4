"""The lake's format: the one layout of logs, dead letters, state, checkpoints and job files this version reads.

A lake records its format in the object `format.json` at its root, `{"format": LAKE_FORMAT}`, created (once, by
whichever writer comes first) just before its first topic log (`changelog.topics`), so every lake with a topic log
records one. Every command checks it before it starts (`jobs.core.lake.require_lake`, `mview check`):
`format_problem` refuses a lake of another format, or one whose topic logs exist without the record (written by a
version before it), in one line that says what to run. Nothing reads an earlier layout: a lake changes format
only by being built again from its sources.
"""

from __future__ import annotations

import orjson

from changelog.storage import Lake, NotFound

__all__ = ["LAKE_FORMAT", "record_format", "format_problem"]

LAKE_FORMAT = (
    2  # raised with every change of the lake's layout that this version cannot read the old way (2: each
)
# topic log carries its watermark, `changelog.topics.MAX_BEFORE`)
_KEY = "format.json"


def record_format(lake: Lake) -> None:
    """Record `LAKE_FORMAT` as the lake's format unless it records one (of racing writers, one creates it)."""
    lake.create(orjson.dumps({"format": LAKE_FORMAT}), _KEY, mode=0o644)


def format_problem(lake: Lake) -> str | None:
    """Why this version cannot use `lake`, in words that follow "LAKE_DIR <uri>" and say what to run; None when it
    records `LAKE_FORMAT`, or records none and holds no topic log yet (a new lake). Raises
    `changelog.storage.StorageError` when the store cannot be read."""
    try:
        found = orjson.loads(lake.read_bytes(_KEY)).get("format")
    except NotFound:
        if not any(e.is_dir for e in lake.list("topics")):
            return None
        found = None
    except (orjson.JSONDecodeError, AttributeError):
        found = "unreadable"
    if found == LAKE_FORMAT:
        return None
    what = "records no lake format" if found is None else f"has lake format {found}"
    return (
        f"was written by another version of mview (it {what}; this one reads format {LAKE_FORMAT}): build the lake "
        "again from its sources: `make clean` (or set LAKE_DIR to a new directory), then `mview ingest` each file "
        "again and `mview deploy` the jobs"
    )
