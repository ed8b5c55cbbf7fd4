"""Stream-stream interval join, maintained one micro-batch at a time with state bounded by the watermark.

`interval_join(left, right, on=..., lower_ms=..., upper_ms=..., how=..., watermark_before=..., watermark_after=...)`
joins the new rows of one micro-batch of each side with each other and with the rows kept from earlier batches
(the *state*). A left row `l` and a right row `r` match when every `on` column is equal and

    l.ts + lower_ms <= r.ts <= l.ts + upper_ms          (both bounds inclusive)

An `interval` job of a pipeline passes its `within` bounds (the built-in clicks job: `lower_ms=0, upper_ms=1 hour`,
a click within an hour after its search) and its match keys as `on`. A self-join of one
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

Execution: two shuffles, all in the JVM. Each side's state and new rows are reduced to one row per id (one
shuffle by id, a window keeps the first row per id), then both sides are shuffled by the join keys and sorted by
`ts`, and each row's new matches are window sums over range frames of `ts` (the other side's rows within the
interval: no Python, no self-join); every output DataFrame is a projection of that one persisted result (`pairs`
is a range join over it, computed only if used). Work per key is a sort of its rows plus a sliding frame, linear
in the rows of the key within the state's time span.

The result is a function of the state and the batch only; the caller persists `left_state`/`right_state` and
feeds them back as the next batch's state (`joins.interval_state` does, for every interval job). Nothing here
depends on arrival order within the lateness bound. An argument the join cannot use (an unknown `how`, an empty
interval, a watermark that goes back, a missing column) raises `joins.errors.BadJoinArgument`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from joins.errors import BadJoinArgument

__all__ = [
    "JoinHow",
    "JoinSide",
    "IntervalJoinResult",
    "interval_join",
    "state_schema",
    "MATCHES",
    "MATCHES_BEFORE",
    "MIN_WATERMARK",
    "batch_constant",
]

JoinHow = Literal["inner", "left", "right", "full"]
"""inner: matched pairs only. left: plus closed left rows that never matched (right = null). right: the mirror.
full: both."""

_HOWS: tuple[str, ...] = ("inner", "left", "right", "full")
MATCHES = "_matches"
MATCHES_BEFORE = "_matches_before"
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
    """What one micro-batch produced. All DataFrames are lazy over one persisted grouping of both sides by the
    join keys (computed by the first action, shared by the others; call `release()` when done).

    rows: the join's output this batch: `left` and `right` struct columns (one null for an unmatched outer row).
    pairs: the new matched pairs, `left` and `right` structs.
    left / right: every row of the side's state or batch after this batch (late and duplicate rows excluded),
        with `_matches` (distinct matches so far), `_matches_before` (before this batch), `_new` (first seen in
        this batch), `_changed` (`_matches` grew in this batch), `_closed` (closed in this batch: its `_matches` is
        final) and `_keep` (stays in state).
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


def batch_constant(value: int) -> Column:
    """`value` (a bigint that changes every micro-batch, e.g. a watermark) as a column whose value is not written
    into generated code, so plans that differ only in it reuse the same compiled code.

    Spark inlines a primitive literal (also a cast of a string literal, which the optimizer folds) into the Java
    source it generates per stage and caches compiled classes by their source. An array literal is passed to the
    generated code by reference instead, and its element is read per row at an index the optimizer cannot fold
    (a nondeterministic zero). Being nondeterministic, it is rejected inside an aggregate function's arguments:
    compute it in a projection first."""
    return F.array(F.lit(int(value)).cast("bigint"))[F.spark_partition_id() * F.lit(0)]


def state_schema(schema: StructType) -> StructType:
    """The state schema of a side whose new rows have `schema`: the same columns plus `_matches`."""
    return StructType([*schema.fields, StructField(MATCHES, LongType(), False)])


def _prepare(side: JoinSide, w_before: int, name: str):
    """(columns, late rows, every row of the side after dedup with `_matches` and `_new`).

    State rows and this batch's non-late rows are unioned and reduced to one row per id in one aggregation:
    a row already in the state wins (`_new` false sorts first), else the smallest (ts, other columns) of the
    batch's copies, so the choice does not depend on arrival order."""
    cols = side.new.columns
    for attr in ("id", "ts"):
        if getattr(side, attr) not in cols:
            why = f"not a column of the {name} side (columns: {', '.join(cols)})"
            raise BadJoinArgument(f"{name}.{attr}", getattr(side, attr), why)
    ts = F.col(side.ts)
    w0 = batch_constant(w_before)
    late = side.new.where(ts < w0).withColumn(
        "reason",
        F.format_string("late: ts %d is older than the watermark %d at arrival", ts, w0),
    )
    fresh = side.new.where(ts >= w0).select(
        *cols, F.lit(0).cast("bigint").alias(MATCHES), F.lit(True).alias("_new")
    )
    both = fresh
    if side.state is not None:
        both = side.state.select(
            *cols, F.col(MATCHES).cast("bigint"), F.lit(False).alias("_new")
        ).unionByName(fresh)
    others = [c for c in cols if c not in (side.id, side.ts)]
    # The first row of each id in (_new, ts, other columns) order, i.e. the row before which there is none. Not
    # `row_number() == 1`: Spark would add a sort and top-1 per id before the shuffle (WindowGroupLimit), which
    # costs more than it saves when few rows are duplicates; not `min(struct(...))` per id: a sort-based
    # aggregation on both sides of the shuffle.
    first = Window.partitionBy(side.id).orderBy("_new", side.ts, *others, MATCHES)
    rows = (
        both.select("*", F.lag(F.lit(1)).over(first).isNull().alias("_first"))
        .where("_first")
        .select(*cols, MATCHES, "_new")
    )
    return cols, late, rows


def _check(how: str, lower_ms: int, upper_ms: int, watermark_before: int, watermark_after: int) -> None:
    if how not in _HOWS:
        raise BadJoinArgument("how", how, f"choose one of {', '.join(_HOWS)}")
    if lower_ms > upper_ms:
        raise BadJoinArgument("lower_ms", lower_ms, f"an empty interval: greater than upper_ms={upper_ms}")
    if watermark_after < watermark_before:
        why = f"the watermark cannot go back (watermark_before={watermark_before})"
        raise BadJoinArgument("watermark_after", watermark_after, why)


def _struct_type(df: DataFrame):
    """The type of a struct of all of `df`'s columns."""
    return df.select(F.struct("*").alias("x")).schema["x"].dataType


def _tagged(l_rows: DataFrame, r_rows: DataFrame, keys: list[str], kn: list[str], l_ts: str, r_ts: str):
    """Both sides' rows in one DataFrame: the join keys as `kn`, `_t` (event time), `_is_l`, `_new`, and the
    side's row as struct `l` or `r` (the other one null)."""
    l_type, r_type = _struct_type(l_rows), _struct_type(r_rows)

    def side(rows: DataFrame, ts: str, is_l: bool) -> DataFrame:
        this = F.struct(*rows.columns)
        return rows.select(
            *[F.col(k).alias(n) for k, n in zip(keys, kn, strict=True)],
            F.col(ts).alias("_t"),
            F.lit(is_l).alias("_is_l"),
            F.col("_new"),
            (this if is_l else F.lit(None).cast(l_type)).alias("l"),
            (F.lit(None).cast(r_type) if is_l else this).alias("r"),
        )

    return side(l_rows, l_ts, True).unionByName(side(r_rows, r_ts, False))


def _increments(kn: list[str], lower_ms: int, upper_ms: int) -> Column:
    """Each row's new matches (`_inc`): window sums over range frames of `_t` (the other side's rows within the
    interval), in the JVM. A pair counts once, in the batch of its later row: a new row counts every match in its
    frame, a state row only the new ones. Rows with a null key match nothing."""
    key_ok = F.lit(True)
    for n in kn:
        key_ok = key_ok & F.col(n).isNotNull()
    by_ts = Window.partitionBy(*kn).orderBy("_t")
    # a left row's frame: right rows in [ts + lower, ts + upper]; a right row's: left rows in [ts - upper, ts - lower]
    of_left, of_right = by_ts.rangeBetween(lower_ms, upper_ms), by_ts.rangeBetween(-upper_ms, -lower_ms)
    is_l, new = F.col("_is_l"), F.col("_new")

    # 0, not null, over an empty frame (an interval that excludes the row itself: 0 < lower)
    def n(cond, frame):
        return F.coalesce(F.sum(cond.cast("int")).over(frame), F.lit(0))

    return F.when(
        key_ok,
        F.when(is_l, F.when(new, n(~is_l, of_left)).otherwise(n(~is_l & new, of_left))).otherwise(
            F.when(new, n(is_l, of_right)).otherwise(n(is_l & new, of_right))
        ),
    ).otherwise(F.lit(0))


def _side_out(
    grouped: DataFrame, side_col: str, is_side: Column, cols, closed, closed_before, keep
) -> DataFrame:
    """Every row of one side after the batch (`IntervalJoinResult.left` / `right`): its columns, `_matches`
    grown by `_inc`, `_matches_before` (before this batch: 0 for a new row), `_new`, `_changed`, `_closed` (closed
    now and not before, or new) and `_keep`."""
    x = grouped.where(is_side).select(F.col(side_col).alias("x"), "_inc")
    return x.select(
        *[F.col("x")[c].alias(c) for c in cols],
        (F.col("x")[MATCHES] + F.col("_inc")).alias(MATCHES),
        F.col("x")[MATCHES].alias(MATCHES_BEFORE),
        F.col("x")["_new"].alias("_new"),
        (F.col("_inc") > 0).alias("_changed"),
    ).select(
        "*",
        (closed & (F.col("_new") | ~closed_before)).alias("_closed"),
        keep.alias("_keep"),
    )


def _pairs(grouped: DataFrame, kn: list[str], lcols, rcols, lower_ms: int, upper_ms: int) -> DataFrame:
    """The new matched pairs (`left`, `right` structs): a range join over the grouped rows, computed only if
    used (the counts do not need it)."""
    is_l = F.col("_is_l")
    a = grouped.where(is_l).select(*[F.col(n).alias(f"a{n}") for n in kn], F.col("_t").alias("a_t"), "l")
    b = grouped.where(~is_l).select(*[F.col(n).alias(f"b{n}") for n in kn], F.col("_t").alias("b_t"), "r")
    cond = (F.col("b_t") >= F.col("a_t") + F.lit(lower_ms)) & (F.col("b_t") <= F.col("a_t") + F.lit(upper_ms))
    for n in kn:
        cond = cond & (F.col(f"a{n}") == F.col(f"b{n}"))
    return a.join(b, cond & (F.col("l")["_new"] | F.col("r")["_new"])).select(
        F.struct(*[F.col("l")[c].alias(c) for c in lcols]).alias("left"),
        F.struct(*[F.col("r")[c].alias(c) for c in rcols]).alias("right"),
    )


def _outer_rows(pairs, how: str, l_out, r_out, left: JoinSide, right: JoinSide, lcols, rcols) -> DataFrame:
    """The join's output: the pairs, plus the closed rows of the outer side(s) that never matched (the other side
    null). l_out / r_out: each side's rows after the batch; lcols / rcols: each side's columns."""
    rows = pairs
    if how in ("left", "full"):
        lonely = l_out.where(F.col("_closed") & (F.col(MATCHES) == 0))
        r_type = StructType([right.new.schema[c] for c in rcols])
        rows = rows.unionByName(
            lonely.select(F.struct(*lcols).alias("left"), F.lit(None).cast(r_type).alias("right"))
        )
    if how in ("right", "full"):
        lonely = r_out.where(F.col("_closed") & (F.col(MATCHES) == 0))
        l_type = StructType([left.new.schema[c] for c in lcols])
        rows = rows.unionByName(
            lonely.select(F.lit(None).cast(l_type).alias("left"), F.struct(*rcols).alias("right"))
        )
    return rows


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
    _check(how, lower_ms, upper_ms, watermark_before, watermark_after)
    keys = [on] if isinstance(on, str) else list(on)
    w0, w1 = int(watermark_before), int(watermark_after)
    lcols, l_late, l_rows = _prepare(left, w0, "left")
    rcols, r_late, r_rows = _prepare(right, w0, "right")
    for k in keys:
        if k not in lcols or k not in rcols:
            raise BadJoinArgument("on", k, "a join key must be a column of both sides")

    # One shuffle by the join keys, one sort by event time within each key: every row's new matches are counted
    # by window aggregates over range frames of `ts`.
    kn = [f"_k{i}" for i in range(len(keys))]
    tagged = _tagged(l_rows, r_rows, keys, kn, left.ts, right.ts)
    inc = _increments(kn, lower_ms, upper_ms)
    grouped = tagged.select(*kn, "_t", "_is_l", "l", "r", inc.cast("bigint").alias("_inc")).persist()

    is_l, lts, rts = F.col("_is_l"), F.col(left.ts), F.col(right.ts)
    l_out = _side_out(
        grouped,
        "l",
        is_l,
        lcols,
        lts < batch_constant(w1 - upper_ms),
        lts < batch_constant(w0 - upper_ms),
        lts >= batch_constant(w1 - max(upper_ms, 0)),
    )
    r_out = _side_out(
        grouped,
        "r",
        ~is_l,
        rcols,
        rts < batch_constant(w1 + lower_ms),
        rts < batch_constant(w0 + lower_ms),
        rts >= batch_constant(w1 + min(lower_ms, 0)),
    )
    pairs = _pairs(grouped, kn, lcols, rcols, lower_ms, upper_ms)
    return IntervalJoinResult(
        rows=_outer_rows(pairs, how, l_out, r_out, left, right, lcols, rcols),
        pairs=pairs,
        left=l_out,
        right=r_out,
        left_state=l_out.where("_keep").select(*lcols, MATCHES),
        right_state=r_out.where("_keep").select(*rcols, MATCHES),
        left_late=l_late,
        right_late=r_late,
        _cached=(grouped,),
    )
