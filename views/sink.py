"""The one sink contract every view implements, and an in-memory sink for unit tests.

A sink takes one micro-batch of a view's changes (a DataFrame in the view's change schema, made by the view
module from a join's output) and the batch's id, and applies them:

    sink.write(changes, batch_id) -> dict   # counts of what was applied, for the job's log and status

Contract:
- *Idempotent per batch id*: Spark replays a micro-batch with the same id after a crash, possibly after it was
  partly applied; writing it again leaves exactly the effect of one application. Ids grow: a write with an older
  id than one already applied never undoes a newer outcome.
- *Nothing is returned before it is applied*: when `write` returns, readers can see the batch (a failure raises).
- The sink does not keep the DataFrame: the caller may release it once `write` returns.

Implementations, one per view kind: the Redis sinks `views.row.RowSink` (from the executors),
`views.count.CountSink` (fenced; from the executors, or from the driver for rows already collected there),
`views.agg.AggView` (its own state on the lake; the touched keys' whole lines) and the list kind's; the Delta output
log `views.log.LogSink`; `views.changes.ChangeViews` applies a batch's row changes to every view of a job;
`ListSink` keeps the rows in memory, for tests of the transforms that make the changes.
"""

from __future__ import annotations

from typing import Protocol

from pyspark.sql import DataFrame

__all__ = ["Sink", "ListSink"]


class Sink(Protocol):
    def write(self, changes: DataFrame, batch_id: int) -> dict:
        """Apply one micro-batch of changes (idempotent per `batch_id`); return counts of what was applied."""
        ...


class ListSink:
    """Keeps every batch's rows in memory, as dicts (`batches`: batch id -> rows). A batch written again replaces
    the earlier write of it, as a replay does in Redis."""

    def __init__(self) -> None:
        self.batches: dict[int, list[dict]] = {}

    def write(self, changes: DataFrame, batch_id: int) -> dict:
        rows = [r.asDict(recursive=True) for r in changes.collect()]
        self.batches[batch_id] = rows
        return {"rows": len(rows)}

    @property
    def rows(self) -> list[dict]:
        """Every row written, in batch id order."""
        return [r for b in sorted(self.batches) for r in self.batches[b]]
