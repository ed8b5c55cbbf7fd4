"""The state of an interval job's join (`joins.interval`) between steps: `IntervalStore`, a `JoinState`.

The job's two event topics (`spec.model.Interval`: left and right, `match` pairs, `within` bounds) travel as one
stream (`joins.sides.TwoTopics`, laid out by `IntervalSides`): per record `_side` (0 left, 1 right), the match keys
`_k0..` (the left expressions on a left record, the right ones on a right record, cast to one type per pair), the
identity `_id` (`joins.sides.identity_sql`: the topic's `id` fields as text) and the time `_t` (the topic's time
field); a left record also carries its topic's fields (as `_0_<field>`), a right one nothing more: no view sees a
right event's fields, the join only counts them. Each side's rows as the join sees them (`IntervalSides.rows`):
left `<left fields>, _k0.., _id, _t`, right `_k0.., _id, _t` (id `_id`, time `_t`). Copies of one left record
resolve by its fields in declared order (`joins.interval`: the smallest wins); copies of one right record by its
time and match keys (the only columns it keeps).

Every step of the join (a micro-batch, or an idle tick between two) has a *fence*, a number that grows with every
step. The state after step `fence` is the version `v<fence:020d>/` under the store's key in the lake
(`changelog.storage.Lake`; Spark reads and writes `state/` by its URI, so the store works on every kind of lake):
- `state/`: the rows both sides keep (Parquet, the stream's layout plus `_matches`: each side's rows with their
  own columns, `_side` telling which);
- `meta.json`: the join's progress after the step (`IntervalProgress`: its watermark, what it saw, counters),
  written last: a version without it does not exist.
Steps per fence: `restore(fence)` is the newest version before `fence` (a step replayed after a crash, with the
same fence, restores what its first attempt restored); `stage(fence, result)` writes the rows of a join result
that stay in the state (the version does not exist yet); `advance(fence, progress)` writes its meta, which makes it
exist, and drops the versions older than `prune_below`. Only rows that may still match are kept (see
`joins.interval`), so a version stays flat as event time advances. `exclusive()` serializes steps on one store
among the threads of a process (a job's micro-batches and its idle ticks): one process steps a store, the driver
of its job, of which one runs at a time (the job's lease on the lake, `jobs.core.lease`); nothing here guards two
processes stepping one store at once.

The steps themselves: `step` (join a step's records with the state, publish through the caller's `publish`, then
stage), `batch_step` (one micro-batch: the watermark rule, late records and duplicates, `step`, `advance`) and
`idle_step` (the idle rule: a step without records that closes the windows the wall clock has passed).

The watermark is one per job, over both topics: the greatest time seen on either minus the allowed lateness
(`IntervalProgress.saw`), not Spark's per-stream minimum.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.storage import Lake
from joins.interval import MATCHES, MIN_WATERMARK, IntervalJoinResult, JoinSide, batch_constant, interval_join
from joins.sides import TwoTopics, identity_sql, own_columns, sql_type
from joins.state import empty_frame, read_json, write_json
from spec.model import Interval, Pipeline

__all__ = [
    "IntervalSides",
    "IntervalStore",
    "IntervalSnapshot",
    "IntervalProgress",
    "StepOutcome",
    "common_type",
]


def common_type(spark, a: str, b: str) -> str:
    """The SQL type both `a` and `b` (SQL types) are compared as: `a` when equal, else the type Spark's `coalesce`
    gives them, else `string`."""
    if a == b:
        return a
    try:
        df = spark.range(0).selectExpr(f"coalesce(CAST(NULL AS {a}), CAST(NULL AS {b})) AS x")
        return sql_type(df, "x")
    except AnalysisException:
        return "string"


@dataclass(frozen=True)
class IntervalSides:
    """How an interval job's records are laid out (see the module docstring): `topics` (the stream of both),
    `keys` (`_k0..`), the `within` bounds and whether unmatched left events are published."""

    topics: TwoTopics
    keys: tuple[str, ...]
    lower_ms: int
    upper_ms: int
    unmatched: bool = False

    @classmethod
    def of(cls, spark, pipeline: Pipeline, job: str) -> IntervalSides:
        """The layout of interval job `job`; the match keys' types are read from Spark (expressions analysed on
        empty frames: check them first, `views.frame.check_job`, for one-line errors)."""
        spec: Interval = pipeline.jobs[job].spec
        left, right = pipeline.sides(job)
        keys = tuple(f"_k{i}" for i in range(len(spec.match)))
        empties = [empty_frame(spark, t.schema()) for t in (left, right)]
        types = []
        for k, (a, b) in zip(keys, spec.match, strict=True):
            ta, tb = (
                sql_type(e.selectExpr(f"(\n{x}\n) AS x"), "x") for e, x in zip(empties, (a, b), strict=True)
            )
            types.append((k, common_type(spark, ta, tb)))
        types += [("_id", "string"), ("_t", "bigint")]

        def side(topic, exprs) -> tuple[tuple[str, str], ...]:
            own = (("_id", identity_sql(topic)), ("_t", quoted(topic.time)))
            return (*zip(keys, exprs, strict=True), *own)

        computed = (side(left, [a for a, _ in spec.match]), side(right, [b for _, b in spec.match]))
        both = TwoTopics((left, right), computed, tuple(types), (own_columns(left), ()))
        return cls(both, keys, spec.lower_ms, spec.upper_ms, spec.unmatched)

    @property
    def left(self):
        return self.topics.topics[0]

    @property
    def right(self):
        return self.topics.topics[1]

    def rows(self, batch: DataFrame, side: int, *, extra: tuple[str, ...] = ()) -> DataFrame:
        """Side `side`'s rows of `batch` (the stream's layout) as the join sees them (plus `extra` columns)."""
        return self.topics.rows(batch, side, extra=extra)

    def state_schema(self) -> str:
        return f"{self.topics.schema()}, {MATCHES} bigint"

    def to_state(self, rows: DataFrame, side: int) -> DataFrame:
        """A side's kept rows (`rows`, with `_matches`) in the state's layout (`state_schema`)."""
        cols = [F.lit(side).alias("_side"), *[F.col(n) for n, _ in self.topics.types]]
        types = dict(self.left.columns())
        for c in self.topics.carried(0):
            value = F.col(quoted(c)) if side == 0 else F.lit(None).cast(types[c])
            cols.append(value.alias(f"_0_{c}"))
        return rows.select(*cols, MATCHES)


@dataclass
class IntervalProgress:
    """The join's progress after a step (`meta.json` of its version; the defaults are the state before the first).

    watermark: the event-time watermark (see `joins.interval`). max_ts: the newest time of a record that was not
    late, on either side (None before any). last_event_ms: when the last batch with such a record arrived
    (processing time). next_close: the earliest window end of a left event still open (None: none open). fence: the
    version's step. late, duplicates: records dropped as late / counted once as duplicates so far. closed: left
    events closed so far. held: left events still open. state_rows: rows kept in the state."""

    watermark: int = MIN_WATERMARK
    max_ts: int | None = None
    last_event_ms: int | None = None
    next_close: int | None = None
    fence: int | None = None
    late: int = 0
    duplicates: int = 0
    closed: int = 0
    held: int = 0
    state_rows: int = 0

    def saw(self, max_ts: int | None, now_ms: int, lateness_ms: int) -> int:
        """Record a batch that arrived at `now_ms` whose newest record not late has time `max_ts` (None: it has
        none). Returns the watermark after it: max(the watermark before, `self.max_ts` - lateness)."""
        if max_ts is not None:
            self.max_ts = max_ts if self.max_ts is None else max(self.max_ts, max_ts)
            self.last_event_ms = now_ms
        return self.watermark if self.max_ts is None else max(self.watermark, self.max_ts - lateness_ms)

    def idle_watermark(self, now_ms: int, timeout_ms: int, lateness_ms: int) -> int | None:
        """The idle rule: when no record arrived for `timeout_ms` before `now_ms`, the watermark moves with the
        wall clock, `max_ts` - lateness + (now - last arrival). That watermark if it closes an open window (it
        passes `next_close`), else None: not idle yet, nothing seen yet, or nothing would close."""
        last, w0 = self.last_event_ms, self.watermark
        if last is None or self.max_ts is None or now_ms - last < timeout_ms:
            return None
        w1 = max(w0, self.max_ts - lateness_ms + (now_ms - last))
        if w1 <= w0 or self.next_close is None or w1 <= self.next_close:
            return None
        return w1

    def _stepped(self, fence: int, watermark: int, counts: dict, upper_ms: int) -> None:
        """Step `fence` ran with the watermark after it `watermark`, staged with `counts` (`IntervalStore.stage`),
        windows ending `upper_ms` after a left event."""
        first = counts["min_kept_ts"]
        self.fence, self.watermark = fence, watermark
        self.closed += counts["closed"]
        self.held, self.state_rows = counts["held"], counts["state_rows"]
        self.next_close = None if first is None else first + upper_ms

    def counters(self) -> dict:
        """The watermark and the counters: late, duplicates, held, state_rows, closed."""
        keep = ("watermark", "late", "duplicates", "held", "state_rows", "closed")
        return {k: getattr(self, k) for k in keep}


class IntervalSnapshot(NamedTuple):
    """The state before a step: each side's rows (`joins.interval.state_schema`; None before the first step), the
    progress of the version restored (a new object, the caller may change it for `advance`) and its fence (None
    before the first step)."""

    left: DataFrame | None
    right: DataFrame | None
    progress: IntervalProgress
    fence: int | None


class StepOutcome(NamedTuple):
    """What a step did: its fence, the progress after it (the state's watermark and counters) and the counts of
    `IntervalStore.stage`; for a micro-batch also `events`, `late`, `duplicates`, `left` and `right` (of this
    batch)."""

    fence: int
    progress: IntervalProgress
    counts: dict


def _no_mark(name: str) -> None:
    pass


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_of(uri: str) -> threading.Lock:
    """The process's one lock of the store at `uri` (shared by every `IntervalStore` object of it)."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(uri, threading.Lock())


class IntervalStore:
    """The interval join's state of one job generation, versioned by fence under key `key` of `lake` (see the
    module docstring), for the job laid out by `sides` and a watermark `lateness_ms` behind the newest event.
    Implements
    `joins.state.JoinState[IntervalSnapshot]`: `stage` takes the step's `IntervalJoinResult`, `advance` the step's
    `IntervalProgress`."""

    def __init__(
        self,
        spark,
        lake: Lake,
        *,
        sides: IntervalSides,
        lateness_ms: int,
        key: str = "",
    ):
        self.spark, self.lake, self.key, self.sides = spark, lake, key.strip("/"), sides
        self.upper_ms, self.lateness_ms = sides.upper_ms, lateness_ms
        self._lock = _lock_of(self.lake.uri(self.key))

    def _version(self, fence: int) -> str:
        """The key of version `fence`."""
        name = f"v{fence:020d}"
        return f"{self.key}/{name}" if self.key else name

    def _dirs(self) -> list[int]:
        """The fences of the version directories, complete or not."""
        return sorted(
            int(e.name[1:])
            for e in self.lake.list(self.key)
            if e.is_dir and e.name.startswith("v") and e.name[1:].isdigit()
        )

    def meta(self, fence: int) -> dict | None:
        """The meta of version `fence` as written (None: the version does not exist)."""
        return read_json(self.lake, None, f"{self._version(fence)}/meta.json")

    def latest(self, below: int | None = None) -> tuple[int | None, IntervalProgress]:
        """(fence, progress) of the newest version (before `below`), or (None, the progress before the first
        step); reads no rows."""
        for v in reversed([v for v in self._dirs() if below is None or v < below]):
            meta = self.meta(v)
            if meta is not None:
                return v, IntervalProgress(
                    **{f.name: meta[f.name] for f in fields(IntervalProgress) if f.name in meta}
                )
        return None, IntervalProgress()

    def restore(self, fence: int) -> IntervalSnapshot:
        """The state before step `fence`: the newest version before it."""
        base, progress = self.latest(below=fence)
        if base is None:
            return IntervalSnapshot(None, None, progress, None)
        df = self.spark.read.schema(self.sides.state_schema()).parquet(
            self.lake.uri(self._version(base), "state")
        )
        left, right = (self.sides.rows(df, i, extra=(MATCHES,)) for i in (0, 1))
        return IntervalSnapshot(left, right, progress, base)

    def step(
        self,
        fence: int,
        before: IntervalSnapshot,
        new: DataFrame,
        watermark_after: int,
        publish: Callable[[DataFrame, int, int], object],
    ) -> dict:
        """Step `fence` of the join: the step's records `new` (the stream's layout, none late) joined with the state
        `before` (`joins.interval.interval_join`: a right event matches a left event of equal keys when its time
        is in [left time + lower, left time + upper]); `publish(result.left, fence, watermark_after)` (the views'
        write, first),
        then `stage(fence, result)`; `before.progress` moves past the step. The caller advances the store once its
        own part is done. Returns the counts of `stage`."""
        p, s = before.progress, self.sides
        res = interval_join(
            JoinSide(s.rows(new, 0), before.left, "_id", "_t"),
            JoinSide(s.rows(new, 1), before.right, "_id", "_t"),
            on=list(s.keys),
            lower_ms=s.lower_ms,
            upper_ms=s.upper_ms,
            how="left",
            watermark_before=p.watermark,
            watermark_after=watermark_after,
        )
        try:
            publish(res.left, fence, watermark_after)
            out = self.stage(fence, res)
        finally:
            res.release()
        p._stepped(fence, watermark_after, out, self.upper_ms)
        return out

    def batch_step(
        self,
        fence: int,
        batch: DataFrame,
        publish: Callable[[DataFrame, int, int], object],
        on_late: Callable[[DataFrame, int], object],
        mark: Callable[[str], None] = _no_mark,
    ) -> StepOutcome | None:
        """Micro-batch `batch` (the stream's layout) as step `fence`; None when it is empty.

        A record with a time below the watermark before the batch (W0) is late: not joined, counted, and passed
        to `on_late(rows, W0)` (rows: `_side`, `_id`, `_t`). The watermark after it is `IntervalProgress.saw`'s
        (W1). The others are joined by `step` (`publish` as there); one whose id the state or the batch already
        had counts as a duplicate. Then the store advances and drops the versions a replay of this step does not
        need. `mark(name)` is called at the end of the phases "read+stats" and "state+counts"."""
        w0 = self.latest(below=fence)[1].watermark
        # `_ok` in a projection: `batch_constant` may not appear in an aggregate function's arguments
        marked = batch.select("*", (F.col("_t") >= batch_constant(w0)).alias("_ok")).persist()
        try:
            ok = F.col("_ok")
            is_left = (F.col("_side") == 0).cast("int")
            n, late, max_ts, lefts = marked.agg(
                F.count("*"), F.sum((~ok).cast("int")), F.max(F.when(ok, F.col("_t"))), F.sum(is_left)
            ).first()
            mark("read+stats")
            if not n:
                return None
            if late:
                on_late(marked.where(~ok).select("_side", "_id", "_t"), w0)
            before, late = self.restore(fence), late or 0
            w1 = before.progress.saw(max_ts, int(time.time() * 1000), self.lateness_ms)
            out = self.step(fence, before, marked.where(ok), w1, publish)
            mark("state+counts")
        finally:
            marked.unpersist()
        p, dups = before.progress, n - late - out["new_left"] - out["new_right"]
        p.late, p.duplicates = p.late + late, p.duplicates + dups
        self.advance(fence, p, prune_below=before.fence)
        counts = {**out, "events": n, "late": late, "duplicates": dups, "left": lefts, "right": n - lefts}
        return StepOutcome(fence, p, counts)

    def idle_step(
        self, now_ms: int, timeout_ms: int, publish: Callable[[DataFrame, int, int], object]
    ) -> StepOutcome | None:
        """The idle rule (`IntervalProgress.idle_watermark`) at `now_ms`: a step with no new records, fenced
        right after the newest version (its fence + 1), that closes the windows the idle watermark passes;
        `publish` as for `step`. Advances the store. None when there is nothing to do."""
        base, progress = self.latest()
        w1 = None if base is None else progress.idle_watermark(now_ms, timeout_ms, self.lateness_ms)
        if w1 is None:
            return None
        before, empty = self.restore(base + 1), empty_frame(self.spark, self.sides.topics.schema())
        out = self.step(base + 1, before, empty, w1, publish)
        self.advance(base + 1, before.progress)
        return StepOutcome(base + 1, before.progress, out)

    def stage(self, fence: int, result: IntervalJoinResult) -> dict:
        """Write the state of version `fence`: the rows of `result.left` / `result.right` that stay (`_keep`),
        replacing an earlier attempt (whose meta is removed first). Returns counts observed while writing (no
        Spark job of their own): `new_left`, `new_right` (first seen in this step), `closed` (left events closed
        in this step), `provisional` (left events whose matches grew, not closed), `held` (left events kept),
        `state_rows` (rows kept) and `min_kept_ts` (the earliest kept left event's time, None if none)."""
        d = self._version(fence)
        self.lake.delete(d, "meta.json")

        def n(c):
            return F.sum(F.col(c).cast("bigint"))

        # observed on every row of each side, before the filter to the rows kept
        obs_l, obs_r = Observation(f"interval_left_{fence}"), Observation(f"interval_right_{fence}")
        left = result.left.observe(
            obs_l,
            n("_new").alias("new"),
            n("_closed").alias("closed"),
            F.sum((F.col("_changed") & ~F.col("_closed")).cast("bigint")).alias("provisional"),
            n("_keep").alias("kept"),
            F.min(F.when(F.col("_keep"), F.col("_t"))).alias("min_kept_ts"),
        )
        right = result.right.observe(obs_r, n("_new").alias("new"), n("_keep").alias("kept"))
        kept = self.sides.to_state(left.where("_keep"), 0).unionByName(
            self.sides.to_state(right.where("_keep"), 1)
        )
        kept.coalesce(1).write.mode("overwrite").parquet(self.lake.uri(d, "state"))
        cl, cr = obs_l.get, obs_r.get
        return {
            "new_left": int(cl["new"] or 0),
            "new_right": int(cr["new"] or 0),
            "closed": int(cl["closed"] or 0),
            "provisional": int(cl["provisional"] or 0),
            "held": int(cl["kept"] or 0),
            "state_rows": int(cl["kept"] or 0) + int(cr["kept"] or 0),
            "min_kept_ts": cl["min_kept_ts"],
        }

    def advance(self, fence: int, progress: IntervalProgress, *, prune_below: int | None = None) -> None:
        """Write the progress of version `fence` (staged before) as its meta: the version exists, the next step
        restores it. Then drop the versions older than `prune_below` (pass the base a replay of this step would
        restore)."""
        write_json(self.lake, asdict(progress), f"{self._version(fence)}/meta.json")
        if prune_below is None:
            return
        for v in self._dirs():
            if v < prune_below:
                self.lake.delete_tree(self._version(v))

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the store alone for one step: the other threads of this process that step it (a job's micro-batch
        and its idle tick) wait. A lock of the process, not of the lake: one process steps a store, its job's
        driver, one at a time by the job's lease (see the module docstring)."""
        with self._lock:
            yield
