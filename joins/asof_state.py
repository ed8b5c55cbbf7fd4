"""The state of an asof job's join (`joins.asof`) between micro-batches: the versioned copy and the held events.

Files, under the job's state key of one generation (`state/<job>/g<g>/` in the lake; the Delta tables by their
URIs, the mark through `changelog.storage.Lake`):
- `versions`: Delta table, the versioned local copy of the table topic (SCD type 2), one row per change received
  (`joins.asof.AsofSides.version_schema`; a change delivered twice is stored twice and resolved on read, so the
  append needs no lookup);
- `held`: Delta table, the stream events waiting for the table's watermark (the stream topic's columns);
- `emitted` (only for a job without a log view that records every emitted event): Delta table of the emitted
  events' `_id` and time `_t`, read to drop an event delivered again after it was emitted;
- `mark.json`: `{"max_ts": newest change time in the copy (null before any), "held": number of held events, "stream_max": the stream's greatest time read, for a job with windowed views}`.

Per micro-batch N (`joins.state.JoinState`):
- `restore(N)`: the mark, with readers of `versions` and `held`;
- `stage(N, changes)`: appends the batch's table changes to `versions` (Delta `txnAppId` `<app>-versions`,
  `txnVersion` N: a replayed batch is not appended twice), before the join reads the copy;
- `record_emitted(N, rows)` (with `emitted`): appends the batch's emitted ids (`<app>-emitted`, N);
- `advance(N, progress)`: once the views have the batch, replaces `held` by the events still waiting (`txnAppId`
  `<app>-held`, `txnVersion` N; only when something was or is held), then writes the mark.
The held set is replaced only after the views were written: a crash between the two replays batch N with the
held events it emitted still in `held`, so none is lost.

This state is idempotent per row, so a replay of batch N may restore what N's first attempt already staged or
advanced: the copy is a set of changes (a version seen again changes nothing), and events that N held or
emitted are in `held` or in the views (which skip a batch id they have), so the replay decides the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.storage import Lake
from changelog.topics import ensure_delta_table
from joins.asof import AsofSides, version_rows
from joins.state import read_json, write_json

__all__ = ["AsofSnapshot", "AsofProgress", "AsofState"]

_MARK = "mark.json"
_EMITTED_SCHEMA = "_id string, _t bigint"


@dataclass(frozen=True)
class AsofSnapshot:
    """The state before a micro-batch: `max_ts` (newest change time seen, None before any), `held` (number of
    held events), and readers that load the tables when called (`versions()` includes what `stage` appended)."""

    max_ts: int | None
    held: int
    versions: Callable[[], DataFrame]
    held_events: Callable[[], DataFrame]
    stream_max: int | None = None

    def watermark(self, lateness_ms: int) -> int | None:
        """The table's watermark of this state: `max_ts` minus the allowed lateness (None before any change)."""
        return None if self.max_ts is None else self.max_ts - lateness_ms


@dataclass(frozen=True)
class AsofProgress:
    """What a micro-batch leaves to the next: newest change time seen, number of held events and, when the held
    set changed, the events still waiting (the stream's columns; None: `held` stays as it is); `stream_max`: the
    stream's greatest time read (kept for a job with windowed views, None otherwise)."""

    max_ts: int | None
    held: int
    held_events: DataFrame | None = None
    stream_max: int | None = None


class AsofState:
    """The asof join's `JoinState` under key `key` of `lake` (the lake's root when `key` is empty) for the job
    laid out by `sides` (see the module docstring). `app_id` names the job and generation in the Delta
    idempotent-write options; `emitted`: keep the `emitted` table (the job has no log view that records every
    emitted event)."""

    def __init__(
        self,
        spark,
        lake: Lake,
        app_id: str,
        sides: AsofSides,
        *,
        key: str = "",
        emitted: bool = False,
    ):
        self.spark, self.app_id, self.sides = spark, app_id, sides
        self.lake, self.key = lake, key.strip("/")
        self._mark = f"{self.key}/{_MARK}" if self.key else _MARK

        def table(name: str, schema: str) -> str:
            return ensure_delta_table(spark, self.lake, schema, key=f"{self.key}/{name}".lstrip("/"))

        self._versions = table("versions", sides.version_schema())
        self._held = table("held", sides.stream_schema())
        self._emitted = table("emitted", _EMITTED_SCHEMA) if emitted else None

    def _read(self, path: str) -> Callable[[], DataFrame]:
        return lambda: self.spark.read.format("delta").load(path)

    def _append(self, rows: DataFrame, path: str, name: str, batch_id: int, mode: str = "append") -> None:
        (
            rows.write.format("delta")
            .mode(mode)
            .option("txnAppId", f"{self.app_id}-{name}")
            .option("txnVersion", batch_id)
            .save(path)
        )

    def restore(self, batch_id: int) -> AsofSnapshot:
        mark = read_json(self.lake, {}, self._mark)
        return AsofSnapshot(
            mark.get("max_ts"),
            mark.get("held", 0),
            self._read(self._versions),
            self._read(self._held),
            mark.get("stream_max"),
        )

    def stage(self, batch_id: int, changes: DataFrame) -> None:
        """Append the batch's table change records (the table topic's columns) to the copy."""
        self._append(version_rows(changes, self.sides), self._versions, "versions", batch_id)

    def record_emitted(self, batch_id: int, rows: DataFrame) -> None:
        """Append the batch's emitted events (`_id`, `_t`) to `emitted` (a state with it only)."""
        self._append(rows.select("_id", "_t"), self._emitted, "emitted", batch_id)

    def emitted_ids(self, lo: int, hi: int) -> DataFrame:
        """`_id` of the emitted events recorded with a time in [lo, hi] (a state with `emitted` only)."""
        return self._read(self._emitted)().where(F.col("_t").between(lo, hi)).select("_id")

    def advance(self, batch_id: int, changes: AsofProgress) -> None:
        if changes.held_events is not None:
            self._append(changes.held_events, self._held, "held", batch_id, mode="overwrite")
        mark = {"max_ts": changes.max_ts, "held": changes.held}
        if changes.stream_max is not None:
            mark["stream_max"] = changes.stream_max
        write_json(self.lake, mark, self._mark)
