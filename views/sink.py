"""The one sink contract every view implements, and an in-memory sink for unit tests.

A sink takes one micro-batch of a view's changes (made by the view's module from a job's rows) and the batch's id,
and applies them:

    sink.write(changes, batch_id) -> dict   # counts of what was applied, for the job's log and status

Contract:
- *Idempotent per batch id*: Spark replays a micro-batch with the same id after a crash, possibly after it was
  partly applied; writing it again leaves exactly the effect of one application. Ids grow: a write with an older
  id than one already applied never undoes a newer outcome. Every Redis write is also fenced by the writer's lease
  epoch (`views.fence`).
- *Nothing is returned before it is applied*: when `write` returns, readers can see the batch (a failure raises).
- The sink does not keep the changes: the caller may release them once `write` returns.
- A sink whose writes are Redis commands made on the executors also gives them without sending them
  (`CommandSink.commands(changes, batch_id)`, `cmd` and `tag` columns), so that `views.changes` sends every such
  view of a job in one Spark job; its `write` is its commands sent.

Implementations, one per view kind, each in its kind's module: `views.row.RowSink` and `views.count.CountSink`
(command sinks; a count sink also takes `CountRows`, a step's few keys already collected on the driver, applied from
there), `views.agg.AggView` and `views.list.rows.TopList` (their own state on the lake, `views.state.StateView`; `write`
takes the job's row changes and the watermark windows close under), `views.list.ListViewSink` (a join job's list:
`write` takes its write phases, each with what is known of its size), and the Delta output log `views.log.LogSink`.
`views.changes` applies a batch to every view of a job; `ListSink` keeps the rows in memory, for tests of the
transforms that make the changes.
"""

from __future__ import annotations

from typing import Protocol

from pyspark.sql import DataFrame

__all__ = ["Sink", "CommandSink", "ListSink"]


class Sink(Protocol):
    def write(self, changes: DataFrame, batch_id: int) -> dict:
        """Apply one micro-batch of changes (idempotent per `batch_id`); return counts of what was applied."""
        ...


class CommandSink(Sink, Protocol):
    def commands(self, changes: DataFrame, batch_id: int) -> DataFrame:
        """The batch's writes as Redis commands (`cmd`, `tag`: `views.wire.payload_rows`' input), not sent."""
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
