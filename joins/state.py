"""The one state contract of every join, and the file helpers the join states share.

A join that runs one micro-batch at a time keeps state between batches (the current tables of a table-table join,
the open rows of an interval join, the versioned copy and held events of an as-of join). Each join module has one
state class, local to the job (files under the job's state directory of one generation), with three steps per
micro-batch N (`N`: the batch id, or any number that orders the steps, like the interval join's fence):

    state = store.restore(N)      # the state before batch N
    changes = <join>(state, batch)
    store.stage(N, changes)       # durable, keyed by N; before or while the sink writes the view
    sink.write(view_changes, N)
    store.advance(N, changes)     # the state after N is current (only after the sink returned)

Contract:
- `restore(N)` is the state after every batch before N. Spark commits batch N only after its function returned,
  so every batch before the first one of a run was advanced; a batch that Spark replays after a crash restores
  the same state as its first attempt and computes the same changes.
- `stage(N, ...)` replaces any earlier, partial staging of N, and is invisible to `restore(M)` for M <= N
  (except where a join's own docstring says its state is idempotent per row, so a replay may see it).
- `advance(N, ...)` keeps the state in memory for `restore(N + 1)` and may compact or drop what no restore
  can need any more.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from pathlib import Path
from typing import Any, Protocol, TypeVar

from joins.sparkapi import with_size_estimate

__all__ = ["JoinState", "write_json", "read_json", "complete_dirs", "empty_frame", "with_row_count"]

S = TypeVar("S")


class JoinState(Protocol[S]):
    def restore(self, batch_id: int) -> S:
        """The state before micro-batch `batch_id` (see the module docstring)."""
        ...

    def stage(self, batch_id: int, changes: Any) -> Any:
        """Make batch `batch_id`'s state changes durable (replacing an earlier staging of it). May return what it
        counted while writing (the interval join's status counts)."""
        ...

    def advance(self, batch_id: int, changes: Any) -> None:
        """Batch `batch_id` is applied to the view: its state becomes the current one."""
        ...


def write_json(path: Path, value: Any) -> None:
    """Replace `path` with `value` as JSON, atomically (a reader sees the old file or the new one), owner-only.
    Writers in other threads or processes use temporary files of their own: the last replace wins."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(value, sort_keys=True))
    tmp.replace(path)


def read_json(path: Path, default: Any = None) -> Any:
    """The JSON value in `path`, or `default` when it does not exist or is not complete JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def complete_dirs(root: Path, prefix: str, below: int) -> list[tuple[int, Path]]:
    """(id, dir) of the complete `<prefix><id>` directories under `root` (with a `_SUCCESS` marker, as a Spark
    write leaves it) whose id < `below`, by id."""
    found = []
    for d in Path(root).glob(f"{prefix}*"):
        n = d.name[len(prefix) :]
        if n.isdigit() and int(n) < below and (d / "_SUCCESS").exists():
            found.append((int(n), d))
    return sorted(found)


@functools.lru_cache(maxsize=32)
def empty_frame(spark, schema: str):
    """An empty DataFrame of `schema` (DDL text), made once per session. It is an empty relation of the JVM, so the
    optimizer prunes the plan branches it empties (a join with it, a union member) and no Python task ever runs for
    it, unlike `spark.createDataFrame([], schema)`, which is a Python RDD of no rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DataType

    fields = DataType.fromDDL(schema).fields
    return spark.range(0).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in fields])


def with_row_count(df, rows: int):
    """`df`, a local checkpoint (any other DataFrame is returned as it is), with the optimizer's size estimate made
    from `rows`, its row count, as for a plan known to hold `rows` rows (Spark's estimate for a `LIMIT rows` of it).
    The same data: the checkpoint's RDD is shared, not recomputed.

    A local checkpoint keeps the size estimate of the plan it was computed from, and a join's estimate is that of its
    larger input or more. A state kept across micro-batches as a checkpoint of (state joined with the batch) would
    see its estimate grow by a factor every batch, however few rows it holds, until every join with it was planned
    as a sort-merge join that shuffles the whole state."""
    return with_size_estimate(df, rows)
