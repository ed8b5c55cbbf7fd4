"""The one state contract of every join, and the helpers the join states share.

A join that runs one micro-batch at a time keeps state between batches (the current tables of a table-table join,
the open rows of an interval join, the versioned copy and held events of an as-of join). Each join module has one
state class, local to the job (files under the job's state key of one generation, `state/<job>/g<g>`, in the lake:
small files through `changelog.storage.Lake`, Spark's Parquet and Delta files by the lake's URIs), with three steps
per micro-batch N (`N`: the batch id, or any number that orders the steps, like the interval join's fence):

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
from typing import Any, Protocol, TypeVar

from changelog.storage import Lake, NotFound
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


def write_json(lake: Lake, value: Any, key: str) -> None:
    """Replace the object at `key` of `lake` with `value` as JSON (sorted keys), whole
    (`changelog.storage.Lake.write_bytes`: a reader sees the old object or the new one), owner-only on a local
    lake. Of writers racing, the last replace wins."""
    lake.write_bytes(json.dumps(value, sort_keys=True).encode(), key)


def read_json(lake: Lake, default: Any, key: str) -> Any:
    """The JSON value at `key` of `lake`, or `default` when there is none."""
    try:
        return json.loads(lake.read_bytes(key))
    except NotFound:
        return default


def complete_dirs(
    lake: Lake, root: str, prefix: str, below: int, known: set[str] | None = None
) -> list[tuple[int, str]]:
    """(id, key) of the complete `<prefix><id>` directories under key `root` of `lake` (with a `_SUCCESS` marker,
    as a Spark write leaves it) whose id < `below`, by id. One listing of `root`, then one look per directory not in
    `known` (names found complete are added to it: a complete directory stays so until it is deleted)."""
    found = []
    for e in lake.list(root):
        n = e.name[len(prefix) :]
        if not (e.is_dir and e.name.startswith(prefix) and n.isdigit() and int(n) < below):
            continue
        key = f"{root}/{e.name}" if root else e.name
        if known is not None and e.name in known:
            found.append((int(n), key))
        elif lake.exists(key, "_SUCCESS"):
            found.append((int(n), key))
            if known is not None:
                known.add(e.name)
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
