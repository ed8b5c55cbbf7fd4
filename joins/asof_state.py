"""The state of the as-of join (`joins.asof`) between micro-batches: the versioned copy and the held events.

Files, under the job's state directory of one generation (`LAKE_DIR/state/enrichment/g<g>/`):
- `versions`: Delta table, the versioned local copy (SCD type 2), one row per change received
  (`joins.asof.VERSION_SCHEMA`; a change delivered twice is stored twice and resolved on read, so the append
  needs no lookup);
- `held`: Delta table, the events waiting for the profiles watermark (`joins.asof.EVENT_COLUMNS`);
- `mark.json`: `{"max_ts": newest change ts in the copy (null before any), "held": number of held events}`.

Per micro-batch N (`joins.state.JoinState`):
- `restore(N)`: the mark, with readers of `versions` and `held`;
- `stage(N, changes)`: appends the batch's profile changes to `versions` (Delta `txnAppId` `<app>-versions`,
  `txnVersion` N: a replayed batch is not appended twice), before the join reads the copy;
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
from pathlib import Path

from pyspark.sql import DataFrame

from changelog.topics import ensure_delta_table
from joins.asof import VERSION_SCHEMA, version_rows
from joins.state import read_json, write_json

__all__ = ["AsofSnapshot", "AsofProgress", "AsofState"]

_HELD_SCHEMA = "event_id string, user_id string, action string, ts bigint, profile_version string"
_MARK = "mark.json"


@dataclass(frozen=True)
class AsofSnapshot:
    """The state before a micro-batch: `max_ts` (newest change ts seen, None before any), `held` (number of
    held events), and readers that load the tables when called (`versions()` includes what `stage` appended)."""

    max_ts: int | None
    held: int
    versions: Callable[[], DataFrame]
    held_events: Callable[[], DataFrame]

    def watermark(self, lateness_ms: int) -> int | None:
        """The profiles watermark of this state: `max_ts` minus the allowed lateness (None before any change)."""
        return None if self.max_ts is None else self.max_ts - lateness_ms


@dataclass(frozen=True)
class AsofProgress:
    """What a micro-batch leaves to the next: newest change ts seen, number of held events and, when the held
    set changed, the events still waiting (`EVENT_COLUMNS`; None: `held` stays as it is)."""

    max_ts: int | None
    held: int
    held_events: DataFrame | None = None


class AsofState:
    """The as-of join's `JoinState` in `directory` (see the module docstring). `app_id` names the job and
    generation in the Delta idempotent-write options (`<app_id>-versions`, `<app_id>-held`)."""

    def __init__(self, spark, directory: Path, app_id: str):
        self.spark, self.dir, self.app_id = spark, Path(directory), app_id
        self._versions = ensure_delta_table(spark, self.dir / "versions", VERSION_SCHEMA)
        self._held = ensure_delta_table(spark, self.dir / "held", _HELD_SCHEMA)

    def _read(self, path: str) -> Callable[[], DataFrame]:
        return lambda: self.spark.read.format("delta").load(path)

    def restore(self, batch_id: int) -> AsofSnapshot:
        mark = read_json(self.dir / _MARK, {})
        return AsofSnapshot(
            mark.get("max_ts"), mark.get("held", 0), self._read(self._versions), self._read(self._held)
        )

    def stage(self, batch_id: int, changes: DataFrame) -> None:
        """Append the batch's profile change records (`op, user_id, name, country, ts`) to the copy."""
        (
            version_rows(changes)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", f"{self.app_id}-versions")
            .option("txnVersion", batch_id)
            .save(self._versions)
        )

    def advance(self, batch_id: int, changes: AsofProgress) -> None:
        if changes.held_events is not None:
            (
                changes.held_events.write.format("delta")
                .mode("overwrite")
                .option("txnAppId", f"{self.app_id}-held")
                .option("txnVersion", batch_id)
                .save(self._held)
            )
        write_json(self.dir / _MARK, {"max_ts": changes.max_ts, "held": changes.held})
