"""A view's entries as a table topic's log (a topic `from: {view: ...}`, `spec.viewtable`), written by the job that
maintains the view, in the step that writes its Redis keys.

The log of view `<v>` in generation `<g>` is the Delta table `tables/<v>/g<g>` of the lake (`table_key`), its columns
the reading topic's (`spec.model.Topic.columns`: `op`, the view's key name, its values, a windowed view's window,
`_batch`). Each micro-batch appends one record per key whose entry it changed: `upsert` with the key's line after
the batch, or `remove` (the key and, windowed, `window_start`; the rest null) when the view no longer holds the key;
`_batch` the batch id, the record's time, so per key the latest batch's record is the entry (the current-table rule
of any table topic). The append is idempotent per batch id (Delta `txnAppId` `<job>-g<g>-<v>-table`, `txnVersion`
the batch id): a batch written again after a crash adds nothing, and so the log holds each batch's changes once, in
batch order, whatever replays happened. A generation's log is created with the generation (empty until its first
batch), so a reader finds it as soon as the job runs.

Written for the views whose state gives each key's whole line per batch (`views.agg`: agg views, and count views,
which are kept as agg views when read; `views.row.RowTable` for row views): `views.agg.AggView` calls
`ViewTable.write` with its step's lines.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.storage import Lake
from changelog.topics import ensure_delta_table
from spec.model import Pipeline, Topic, View
from spec.viewtable import BATCH

__all__ = ["keeps_table", "table_key", "reading_topic", "ViewTable"]

_WINDOW_KEY = r"^(.*)\|(-?[0-9]+)$"  # `<key>|<window start>`: `views.window.windowed_key`


def keeps_table(view: View, job_kind: str) -> bool:
    """Whether `view`, of a job of kind `job_kind`, has a log a topic can read: an agg or a count view (kept as an
    agg view when read, `views.agg.kept_as_agg`) and a row view but of an interval job (`views.row.RowTable`) their
    table log; a log view its output log (stamped when read, `views.log`). Not a row view of an interval job."""
    return view.kind in ("agg", "count", "log") or (view.kind == "row" and job_kind != "interval")


def table_key(view: str, generation: int) -> str:
    """The lake key of view `view`'s table log in `generation`."""
    return f"tables/{view}/g{generation}"


def reading_topic(pipeline: Pipeline, view: View) -> Topic | None:
    """A table topic of `pipeline` read from `view` (`from: {view: ...}`), if any: the shape of the view's table."""
    return next((t for t in pipeline.topics.values() if t.view == view.name and t.kind == "table"), None)


class ViewTable:
    """The table log of `view` in generation `generation` of `lake`, in the shape of `topic` (`reading_topic`),
    appended by job `job` (see the module docstring)."""

    def __init__(self, spark, lake: Lake, view: View, topic: Topic, job: str, generation: int):
        self.view, self.topic = view, topic
        self.app_id = f"{job}-g{generation}-{view.name}-table"
        self.path = ensure_delta_table(spark, lake, topic.schema(), key=table_key(view.name, generation))

    def records(self, lines: DataFrame, batch_id: int) -> DataFrame:
        """The records of batch `batch_id` from `lines` (`_key`, `line`: the key's export line as JSON after the
        batch, null when the view no longer holds it), in the topic's columns."""
        t, key_name = self.topic, self.view.key_name
        body = ", ".join(f"{quoted(n)} {sql}" for n, sql in t.columns() if n not in ("op", BATCH))
        parsed = lines.select("_key", "line", F.from_json("line", body).alias("_r"))
        cols = [F.when(F.col("line").isNull(), F.lit(t.op[1])).otherwise(F.lit(t.op[0])).alias("op")]
        for name, sql in t.columns()[1:]:
            if name == BATCH:
                cols.append(F.lit(int(batch_id)).cast(sql).alias(name))
                continue
            value = F.col("_r")[name]
            if name == key_name:
                gone = F.regexp_extract("_key", _WINDOW_KEY, 1) if self.view.window else F.col("_key")
                value = F.coalesce(value, gone)
            elif name == "window_start":
                value = F.coalesce(value, F.regexp_extract("_key", _WINDOW_KEY, 2).cast("bigint"))
            cols.append(value.cast(sql).alias(name))
        return parsed.select(*cols)

    def write(self, lines: DataFrame, batch_id: int) -> None:
        """Append batch `batch_id`'s records (`records`); a batch id already appended adds nothing."""
        (
            self.records(lines, batch_id)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", self.app_id)
            .option("txnVersion", batch_id)
            .save(self.path)
        )
