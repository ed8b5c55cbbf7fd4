"""Stream-stream interval join, maintained one micro-batch at a time with state bounded by the watermark.

`interval_join(left, right, on=..., lower_ms=..., upper_ms=..., how=..., watermark_before=..., watermark_after=...)`
joins the new rows of one micro-batch of each side with each other and with the rows kept from earlier batches
(the *state*). A left row `l` and a right row `r` match when every `on` column is equal and

    l.ts + lower_ms <= r.ts <= l.ts + upper_ms          (both bounds inclusive)

The clicks job uses `lower_ms=0, upper_ms=1 hour`: a click within an hour after its search. A self-join of one
stream passes the same DataFrames as both sides (pairs of a row with itself are included when the interval
contains 0; filter them out if unwanted).

Watermark. The caller owns the event-time watermark (one per job, e.g. max event time seen on *either* input
minus the allowed lateness, the contract's definition, rather than Spark's default per-query minimum of the
inputs' watermarks). `watermark_before` is the watermark at the start of the micro-batch, `watermark_after` the
one after it (>= before). Semantics, per micro-batch:
- Late: a new row with `ts < watermark_before` is late. It is not joined and not kept; it is returned in
  `left_late` / `right_late` with a `reason`, for the caller to log and count.
- Duplicates: a new row whose `id` is already in the state, or repeated within the batch, has no effect (one row
  per id is kept: the smallest `(ts, ...)`). A duplicate of a row already evicted from the state is older than
  the watermark, hence late: it never counts twice.
- Matches: every (left, right) pair is found exactly once, in the batch where its later row arrives
  (`pairs`). Each row carries `_matches`, the number of distinct ids matched on the other side so far.
- Closing: a left row is *closed* once no future right row can match it, i.e. `l.ts + upper_ms <
  watermark_after` (any right row that could still match would be late). A right row is closed once
  `r.ts - lower_ms < watermark_after`. Each row is reported closed exactly once (`_closed` in `left`/`right`),
  with its final `_matches`. The join output `rows` carries the matched pairs as they are found, plus, for
  `how="left"`/`"right"`/`"full"`, the closed rows of the outer side(s) that never matched (other side null),
  exactly like Spark's stream-stream outer join, but closing under `watermark_after` of the *same* batch (so no
  extra empty batch is needed to flush the outcome).
- State: a left row is kept while `l.ts + max(upper_ms, 0) >= watermark_after` (it may still match, or a
  duplicate of it would not be late); a right row while `r.ts >= watermark_after + min(lower_ms, 0)`. Rows older than that are dropped, so the state holds only the
  rows of the last `upper_ms - lower_ms + lateness` of event time: it stays flat as event time advances.

The result is a function of the state and the batch only; the caller persists `left_state`/`right_state` and
feeds them back as the next batch's state. Nothing here depends on arrival order within the lateness bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

__all__ = [
    "JoinHow",
    "JoinSide",
    "IntervalJoinResult",
    "interval_join",
    "state_schema",
    "MATCHES",
    "MIN_WATERMARK",
]

JoinHow = Literal["inner", "left", "right", "full"]
"""inner: matched pairs only. left: plus closed left rows that never matched (right = null). right: the mirror.
full: both."""

_HOWS: tuple[str, ...] = ("inner", "left", "right", "full")
MATCHES = "_matches"
MIN_WATERMARK = -(2**62)  # the watermark before any event was seen


@dataclass(frozen=True)
class JoinSide:
    """One input of the join for one micro-batch.

    new: this batch's rows (any columns; `id` and `ts` among them, `ts` epoch milliseconds).
    state: the side's state returned by the previous batch (`state_schema(new.schema)`), or None at the start.
    id: the column that identifies a record; a second row with the same id is a duplicate delivery.
    ts: the event-time column (bigint epoch ms).
    """

    new: DataFrame
    state: DataFrame | None
    id: str
    ts: str = "ts"


@dataclass(frozen=True)
class IntervalJoinResult:
    """What one micro-batch produced. All DataFrames are lazy over the inputs; `left`, `right` and `pairs` are
    persisted (call `release()` when done).

    rows: the join's output this batch: `left` and `right` struct columns (one null for an unmatched outer row).
    pairs: the new matched pairs, `left` and `right` structs.
    left / right: every row of the side's state or batch after this batch (late and duplicate rows excluded),
        with `_matches` (distinct matches so far), `_new` (first seen in this batch), `_changed` (`_matches`
        grew in this batch), `_closed` (closed in this batch: its `_matches` is final) and `_keep` (stays in state).
    left_state / right_state: the state to pass to the next batch.
    left_late / right_late: new rows older than `watermark_before`, plus a `reason` column.
    """

    rows: DataFrame
    pairs: DataFrame
    left: DataFrame
    right: DataFrame
    left_state: DataFrame
    right_state: DataFrame
    left_late: DataFrame
    right_late: DataFrame
    _cached: tuple = field(default=(), repr=False)

    def release(self) -> None:
        for df in self._cached:
            df.unpersist()


def state_schema(schema: StructType) -> StructType:
    """The state schema of a side whose new rows have `schema`: the same columns plus `_matches`."""
    return StructType([*schema.fields, StructField(MATCHES, LongType(), False)])


def _dedup(df: DataFrame, id_col: str, ts: str) -> DataFrame:
    """One row per id: the smallest (ts, other columns), so the choice does not depend on arrival order."""
    others = [c for c in df.columns if c not in (id_col, ts)]
    return df.groupBy(id_col).agg(F.min(F.struct(ts, *others)).alias("_r")).select(id_col, "_r.*")


def _prepare(side: JoinSide, w_before: int, name: str):
    cols = side.new.columns
    for c in (side.id, side.ts):
        if c not in cols:
            raise ValueError(f"{name} side has no column {c!r} (columns: {', '.join(cols)})")
    ts = F.col(side.ts)
    late = side.new.where(ts < F.lit(w_before)).withColumn(
        "reason",
        F.format_string("late: ts %d is older than the watermark %d at arrival", ts, F.lit(w_before)),
    )
    spark = side.new.sparkSession
    state = side.state
    if state is None:
        state = spark.createDataFrame([], state_schema(side.new.schema))
    state = state.select(*cols, MATCHES)
    fresh = _dedup(side.new.where(ts >= F.lit(w_before)), side.id, side.ts).select(*cols)
    fresh = fresh.join(state.select(side.id), side.id, "left_anti")
    old = state.withColumn("_new", F.lit(False))
    new = fresh.withColumn(MATCHES, F.lit(0).cast("bigint")).withColumn("_new", F.lit(True))
    return cols, late, old, new


def _prefixed(df: DataFrame, cols: list[str], p: str) -> DataFrame:
    return df.select(*[F.col(c).alias(p + c) for c in cols])


def _apply(
    all_rows: DataFrame, inc: DataFrame, id_col: str, closed, closed_before, keep, cols: list[str]
) -> DataFrame:
    j = all_rows.join(inc, id_col, "left")
    inc_n = F.coalesce(F.col("_inc"), F.lit(0).cast("bigint"))
    return j.select(
        *cols,
        (F.col(MATCHES) + inc_n).alias(MATCHES),
        "_new",
        (inc_n > 0).alias("_changed"),
        (closed & (F.col("_new") | ~closed_before)).alias("_closed"),
        keep.alias("_keep"),
    )


def interval_join(
    left: JoinSide,
    right: JoinSide,
    *,
    on: str | list[str],
    lower_ms: int,
    upper_ms: int,
    how: JoinHow = "inner",
    watermark_before: int,
    watermark_after: int,
) -> IntervalJoinResult:
    """Join one micro-batch of `left` and `right` (see the module docstring for the exact semantics)."""
    if how not in _HOWS:
        raise ValueError(f"how={how!r}: choose one of {', '.join(_HOWS)}")
    if lower_ms > upper_ms:
        raise ValueError(f"empty interval: lower_ms={lower_ms} > upper_ms={upper_ms}")
    if watermark_after < watermark_before:
        raise ValueError(f"the watermark cannot go back: {watermark_before} -> {watermark_after}")
    keys = [on] if isinstance(on, str) else list(on)
    w0, w1 = int(watermark_before), int(watermark_after)
    lcols, l_late, l_old, l_new = _prepare(left, w0, "left")
    rcols, r_late, r_old, r_new = _prepare(right, w0, "right")
    for k in keys:
        if k not in lcols or k not in rcols:
            raise ValueError(f"join key {k!r} must be a column of both sides")

    def cond(lp: DataFrame, rp: DataFrame):
        c = (F.col("r_" + right.ts) >= F.col("l_" + left.ts) + F.lit(lower_ms)) & (
            F.col("r_" + right.ts) <= F.col("l_" + left.ts) + F.lit(upper_ms)
        )
        for k in keys:
            c = c & (F.col("l_" + k) == F.col("r_" + k))
        return c

    l_all = l_old.unionByName(l_new)
    r_all = r_old.unionByName(r_new)
    lp_all, lp_new = _prefixed(l_all, lcols, "l_"), _prefixed(l_new, lcols, "l_")
    rp_new, rp_old = _prefixed(r_new, rcols, "r_"), _prefixed(r_old, rcols, "r_")
    # Each pair once: (every left row x new right rows) + (new left rows x right rows kept from before).
    found = lp_all.join(rp_new, cond(lp_all, rp_new)).unionByName(lp_new.join(rp_old, cond(lp_new, rp_old)))
    pairs = found.select(
        F.struct(*[F.col("l_" + c).alias(c) for c in lcols]).alias("left"),
        F.struct(*[F.col("r_" + c).alias(c) for c in rcols]).alias("right"),
    ).persist()
    inc_l = pairs.groupBy(F.col("left")[left.id].alias(left.id)).agg(F.count("*").alias("_inc"))
    inc_r = pairs.groupBy(F.col("right")[right.id].alias(right.id)).agg(F.count("*").alias("_inc"))

    lts, rts = F.col(left.ts), F.col(right.ts)
    l_closed = lts + F.lit(upper_ms) < F.lit(w1)
    l_closed_before = lts + F.lit(upper_ms) < F.lit(w0)
    l_keep = lts + F.lit(max(upper_ms, 0)) >= F.lit(w1)
    r_closed = rts - F.lit(lower_ms) < F.lit(w1)
    r_closed_before = rts - F.lit(lower_ms) < F.lit(w0)
    r_keep = rts >= F.lit(w1 + min(lower_ms, 0))
    l_out = _apply(l_all, inc_l, left.id, l_closed, l_closed_before, l_keep, lcols).persist()
    r_out = _apply(r_all, inc_r, right.id, r_closed, r_closed_before, r_keep, rcols).persist()

    rows = pairs
    if how in ("left", "full"):
        lonely = l_out.where(F.col("_closed") & (F.col(MATCHES) == 0))
        rows = rows.unionByName(
            lonely.select(
                F.struct(*lcols).alias("left"),
                F.lit(None).cast(StructType([right.new.schema[c] for c in rcols])).alias("right"),
            )
        )
    if how in ("right", "full"):
        lonely = r_out.where(F.col("_closed") & (F.col(MATCHES) == 0))
        rows = rows.unionByName(
            lonely.select(
                F.lit(None).cast(StructType([left.new.schema[c] for c in lcols])).alias("left"),
                F.struct(*rcols).alias("right"),
            )
        )
    return IntervalJoinResult(
        rows=rows,
        pairs=pairs,
        left=l_out,
        right=r_out,
        left_state=l_out.where("_keep").select(*lcols, MATCHES),
        right_state=r_out.where("_keep").select(*rcols, MATCHES),
        left_late=l_late,
        right_late=r_late,
        _cached=(pairs, l_out, r_out),
    )
