"""Event-time windows of a view (`spec.model.Window`): which windows a row is in, how a key's sessions merge, and when
a window is final or removed. Shared by the view kinds that take a window (`views.agg`: count and agg views).

A windowed view's rows are a job's added rows with their event time `_time` (rows are never removed: a select of an
event topic, interval, asof) and `_late` (the job's judgement: the row's time is behind its topic's watermark as of
the log versions before its own, `changelog.topics.MAX_BEFORE`). A late row is left out of every windowed view.

What a window's state row holds besides the view's own payload (`COLUMNS`): `_k0` the view's key (its text),
`_ws`/`_we` the window's start and end (epoch ms; a tumbling or hopping window holds `[_ws, _we)`, a session ends at
its last row's time plus the gap), `_fin` whether the watermark had passed its end. The state row's key (`_key`, and
its identity) is `<_k0>|<_ws>`: the view's Redis key.

- `tumble`/`hop` (`in_windows`): a row at time t is in every window `[s, s + size)` with s a multiple of the step
  (`every`, a tumbling window's size) and `s <= t < s + size`.
- `session` (`merge_sessions`): a row at time t is a session `[t, t + gap)` of its own; sessions of a key that
  overlap (a start before another's end) are one, whose start is the least and end the greatest; so a row joins
  every session it is less than the gap away from. Final sessions take no part: a row that is not late can never
  be less than the gap away from a final session (its time is at least the watermark, which passed the session's
  end), and a final entry never changes.
- `settle(state, log, watermark, retain_ms)`: after a batch whose rows gave the state rows `log`, a window whose end
  is at or before the watermark becomes final (`_fin`), and one final whose end is more than `retain_ms` behind the
  watermark leaves the state (and Redis). The watermark is the job's (`W`: its inputs' greatest time minus the
  lateness), after the batch.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spec.model import Window as EventWindow

__all__ = ["COLUMNS", "in_windows", "merge_sessions", "sessions_of", "settle", "windowed_key", "not_late"]

COLUMNS = [("_k0", "string"), ("_ws", "bigint"), ("_we", "bigint"), ("_fin", "boolean")]


def not_late(rows: DataFrame) -> DataFrame:
    """The rows of `rows` a windowed view takes: with a time, and not `_late` (when the job judged it)."""
    late = " AND NOT coalesce(_late, false)" if "_late" in rows.columns else ""
    return rows.where("_time IS NOT NULL" + late)


def windowed_key(k0: str = "_k0", start: str = "_ws") -> str:
    """SQL of a window's key: the view's key, `|`, the window's start (ms)."""
    return f"concat({k0}, '|', CAST({start} AS string))"


def in_windows(rows: DataFrame, window: EventWindow) -> DataFrame:
    """`rows` (with `_key` the view's key and `_time`) once per window it is in: `_k0` (the view's key), `_ws`,
    `_we` and `_key` the window's key. A session gives each row its own session `[t, t + gap)`, keyed by its start
    (`merge_sessions` merges them)."""
    rows = rows.withColumnRenamed("_key", "_k0")
    if window.kind == "session":
        spans = rows.selectExpr("*", "_time AS _ws", f"_time + {window.size_ms} AS _we")
    else:
        size, step = window.size_ms, window.step_ms
        last = f"(_time - pmod(_time, {step}))"
        starts = (
            f"filter(sequence({last} - {(size // step) * step}, {last}, {step}), s -> s + {size} > _time)"
        )
        spans = rows.selectExpr("*", f"explode({starts}) AS _ws").selectExpr("*", f"_ws + {size} AS _we")
    return spans.withColumn("_key", F.expr(windowed_key()))


def _grouped(spans: DataFrame) -> DataFrame:
    """`spans` with `_g`: the number of the merged session each belongs to, per `_k0` (a span starts a new one when
    it starts at or after the end of every span before it, sorted by start)."""
    order = Window.partitionBy("_k0").orderBy("_ws", "_we")
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    upto = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    starts = spans.withColumn("_end0", F.max("_we").over(before)).withColumn(
        "_new", F.expr("CASE WHEN _end0 IS NULL OR _ws >= _end0 THEN 1 ELSE 0 END")
    )
    return starts.withColumn("_g", F.sum("_new").over(upto)).drop("_end0", "_new")


def merge_sessions(spans: DataFrame, merges: list[tuple[str, str]]) -> DataFrame:
    """`spans` (`_k0`, `_ws`, `_we` and payload columns: the open sessions of the batch's keys and the batch's rows'
    own sessions) merged where they overlap: one row per merged session, `_k0`, `_ws`, `_we`, `_key` and each
    `(column, SQL merging it over the merged spans)` of `merges`."""
    merged = (
        _grouped(spans)
        .groupBy("_k0", "_g")
        .agg(F.min("_ws").alias("_ws"), F.max("_we").alias("_we"), *[F.expr(m).alias(c) for c, m in merges])
    )
    return merged.drop("_g").withColumn("_key", F.expr(windowed_key()))


def sessions_of(spans: DataFrame) -> DataFrame:
    """`spans` (as for `merge_sessions`) each under its merged session: `_ws`, `_we` and `_key` the merged one's,
    the other columns kept (for a view that keeps rows per session, not parts)."""
    grouped = _grouped(spans)
    group = Window.partitionBy("_k0", "_g")
    out = grouped.withColumn("_ws", F.min("_ws").over(group)).withColumn("_we", F.max("_we").over(group))
    return out.drop("_g").withColumn("_key", F.expr(windowed_key()))


def settle(state: DataFrame, log: DataFrame, watermark: int | None, retain_ms: int | None) -> DataFrame:
    """The batch's state rows `log` (`views.state`: `_sid`, `_gone`, `_was`, `_key`, payload with `COLUMNS`) with,
    under `watermark` (None: none yet), `_fin` set where a window's end is at or before it, the state rows of
    `state` (before the batch) it does not name that become final now, and the final windows whose end is more than
    `retain_ms` behind it gone (`_gone`, `_was` their key). Null `_we` never: every window has an end."""
    if watermark is None:
        return log
    w = int(watermark)
    fin = f"(_fin OR _we <= {w})"
    closes = f"NOT _fin AND _we <= {w}"
    if retain_ms is not None:
        closes = f"({closes}) OR (_fin AND _we < {w - int(retain_ms)})"
    # the state rows that close or leave now, unless the batch's rows name them: per `_sid` the batch's row first,
    # in the one Spark job that makes the rows (an anti join would compute `log` once more for its side)
    cols = log.columns
    both = log.withColumn("_p", F.lit(1)).unionByName(
        state.where(closes).selectExpr("_sid", "false AS _gone", "CAST(NULL AS string) AS _was", *state.columns[1:])
        .select(*cols).withColumn("_p", F.lit(0))
    )  # fmt: skip
    rows = both.groupBy("_sid").agg(F.max_by(F.struct(*cols[1:]), "_p").alias("_v")).select("_sid", "_v.*")
    rows = rows.withColumn("_fin", F.expr(f"CASE WHEN _gone THEN _fin ELSE {fin} END"))
    if retain_ms is None:
        return rows
    old = f"NOT _gone AND _fin AND _we < {w - int(retain_ms)}"
    return rows.selectExpr(
        "_sid",
        f"_gone OR ({old}) AS _gone",
        f"CASE WHEN {old} THEN coalesce(_was, _key) ELSE _was END AS _was",
        f"CASE WHEN {old} THEN CAST(NULL AS string) ELSE _key END AS _key",
        *[c for c in rows.columns if c not in ("_sid", "_gone", "_was", "_key")],
    )
