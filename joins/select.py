"""The `select` kind: the rows of one topic, no join, as row changes (`views.frame`'s layout).

An event topic (`EventSelect`): each event is a row, once. A batch's records get their identity `_id`
(`joins.sides.identity_sql`); of records sharing an `_id` one is kept (`joins.sides.dedupe_records`: the smallest by
time, then the other fields); a record whose `_id` an earlier batch selected is dropped. The ids selected so far
are state (`SelectedIds`: a Delta table of `_id` and time `_t`), looked up by the batch's ids (a copy delivered
again may carry another time). A selected event is an added row: `_sign` 1, `_time` its time.
Rows never leave.

A table topic (`TableSelect`): the rows are the topic's current table (`changelog.current`'s rule, through
`joins.table.side_changes`), kept as state (`joins.table_state.TableStore` with one side). A batch changes some
keys: a key live before gives a removed row with its values before (`_sign` -1), a key live after an added row
with its values after (`_sign` 1); a key that stays live but changes gives both. `_id` is the key's text
(`joins.sides.key_text_sql`: values joined by `|`), `_time` null. A record delivered twice changes nothing.

Per micro-batch N the job writes the views first, then the state (`SelectedIds.record`, or the table
store's stage and advance), so a crash before the state is written replays N from the state before it with the
same changes, and a replay after it finds nothing new (the views already hold N).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.storage import Lake
from changelog.topics import MAX_BEFORE, ensure_delta_table
from joins.errors import BadJoinArgument
from joins.sides import dedupe_records, identity_sql, key_text_sql
from joins.table import BORN, DIED, TableState, replace_rows, side_changes, state_columns
from spec.model import Topic

__all__ = ["EventSelect", "SelectedIds", "TableSelect", "TableChanges", "ROW_CHANGE_COLUMNS"]

ROW_CHANGE_COLUMNS = ("_id", "_sign", "_time")  # what a row change adds to the topic's fields (`views.frame`)


@dataclass(frozen=True)
class EventSelect:
    """The select of event topic `topic` (see the module docstring)."""

    topic: Topic

    def __post_init__(self):
        if self.topic.kind != "event":
            raise BadJoinArgument("from", self.topic.name, "an event select reads an event topic")

    def candidates(self, records: DataFrame) -> DataFrame:
        """The batch's records (the topic's log columns, and the log's stamp `MAX_BEFORE` when they have it), one
        per `_id`, with `_id` and `_time` (and the stamp: the earliest copy's)."""
        t = self.topic
        stamp = (MAX_BEFORE,) if MAX_BEFORE in records.columns else ()
        ided = records.selectExpr(*[quoted(n) for n in t.names], f"{identity_sql(t)} AS _id", *stamp)
        return dedupe_records(ided, t, least=stamp).withColumn("_time", F.col(quoted(t.time)).cast("bigint"))

    def rows(
        self, candidates: DataFrame, seen: DataFrame | None, *, lateness_ms: int | None = None
    ) -> DataFrame:
        """The row changes of `candidates` (`candidates`) whose `_id` is not in `seen` (a frame of `_id`, or None).
        With `lateness_ms` (the candidates carry the stamp), each with `_late`: its time is behind its topic's
        watermark as of the log versions before its own (`_time` < stamp - lateness)."""
        fresh = candidates if seen is None else candidates.join(seen, "_id", "left_anti")
        late = (
            []
            if lateness_ms is None
            else [F.expr(f"coalesce(_time < {MAX_BEFORE} - {int(lateness_ms)}, false)").alias("_late")]
        )
        return fresh.select(
            *[quoted(n) for n in self.topic.names], "_id", F.lit(1).alias("_sign"), "_time", *late
        )


class SelectedIds:
    """The ids an event select has selected, with their times: Delta table `key` of `lake`, read as a set (`among`).
    Appended without Delta's idempotent-write options: a batch appended again (replayed after a crash between this
    append and Spark's commit of the batch, or by a driver that lost its lease) adds copies, which change no lookup;
    so no append pays for the snapshot's whole state, which Delta reconstructs to check a `txnVersion`."""

    def __init__(self, spark, lake: Lake, *, key: str):
        self.spark, self.lake = spark, lake
        self.path = ensure_delta_table(spark, self.lake, "_id string, _t bigint", key=key)

    def among(self, candidates: DataFrame) -> DataFrame:
        """`_id` of the selected rows among `candidates`' `_id` (whatever their time: a copy delivered again may
        carry another one). The ids are read whole (one column); the batch's, broadcast, pick the few that match."""
        rows = self.spark.read.format("delta").load(self.path).select("_id")
        return rows.join(F.broadcast(candidates.select("_id")), "_id", "left_semi")

    def record(self, rows: DataFrame) -> None:
        """Append the ids (and times) of `rows` (row changes)."""
        rows.select("_id", F.col("_time").alias("_t")).write.format("delta").mode("append").save(self.path)


@dataclass
class TableChanges:
    """One batch of a table select: the changed keys' state rows (`changed`: `joins.table.side_changes`) over the
    state before (`before`); `removed`/`added` row changes; the state after, computed once by `settle`."""

    select: TableSelect
    before: TableState
    changed: DataFrame
    _after: TableState | None = field(default=None, repr=False)

    def rows(self) -> DataFrame:
        """Removed rows (values before) and added rows (values after) as row changes."""
        t = self.select.topic
        key = key_text_sql([quoted(k) for k in t.key])
        names = [quoted(n) for n in t.names]
        gone = (
            self.changed.where(DIED).selectExpr("_old.*").selectExpr(*names, f"{key} AS _id", "-1 AS _sign")
        )
        new = self.changed.where(BORN).selectExpr(*names, f"{key} AS _id", "1 AS _sign")
        return gone.unionByName(new).withColumn("_time", F.lit(None).cast("bigint"))

    def side_rows(self, i: int) -> DataFrame:
        """The changed state rows (`joins.table_state.TableStore.stage`)."""
        return self.changed.selectExpr(*state_columns(self.select.topic))

    def settle(self) -> TableState:
        """The state after the batch (materialized once, the next batch's state)."""
        if self._after is None:
            t = self.select.topic
            cols = state_columns(t)
            after = replace_rows(self.before.sides[0], self.changed, list(t.key), cols)
            self._after = TableState(sides=(after.localCheckpoint(eager=True),))
        return self._after


@dataclass(frozen=True)
class TableSelect:
    """The select of table topic `topic` (see the module docstring); `topics` and `key_columns` are what
    `joins.table_state.TableStore` needs of it."""

    topic: Topic

    def __post_init__(self):
        if self.topic.key is None:
            raise BadJoinArgument("from", self.topic.name, "a table select reads a table topic")

    @property
    def topics(self) -> tuple[Topic]:
        return (self.topic,)

    def key_columns(self, i: int) -> list[str]:
        return list(self.topic.key)

    def changes(self, before: TableState, records: DataFrame) -> TableChanges:
        """The batch's `records` (the topic's log columns) against the state `before`."""
        changed = side_changes(self.topic, before.sides[0], records).localCheckpoint(eager=True)
        return TableChanges(self, before, changed)
