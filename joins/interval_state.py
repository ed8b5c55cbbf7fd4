"""The state of the searches x clicks interval join (`joins.interval`) between steps: `IntervalStore`, a `JoinState`.

Every step of the join (a micro-batch, or an idle tick between two) has a *fence*, a number that grows with every
step. The state after step `fence` is the version `v<fence:020d>/` under the store's directory:
- `state/`: the rows both sides keep (Parquet, `STATE_SCHEMA`: `side` "s" for a search, "c" for a click; `id`
  and `text` hold `search_id`/`query` or `click_id`/`url`);
- `meta.json`: the join's progress after the step (`IntervalProgress`: its watermark, what it saw, counters),
  written last: a version without it does not exist.
Steps per fence: `restore(fence)` is the newest version before `fence` (a step replayed after a crash, with the
same fence, restores what its first attempt restored); `stage(fence, result)` writes the rows of a join result
that stay in the state (the version does not exist yet); `advance(fence, progress)` writes its meta, which makes it
exist, and drops the versions older than `prune_below`. Only rows that may still match are kept (see
`joins.interval`), so a version stays flat as event time advances. `exclusive()` serializes steps on one store,
across threads and processes.

The steps themselves: `step` (join a step's records with the state, publish through the caller's `publish`, then
stage), `batch_step` (one micro-batch: the watermark rule, late records and duplicates, `step`, `advance`) and
`idle_step` (the idle rule: a step without records that closes the windows the wall clock has passed). Records
of both topics travel as one DataFrame in `BATCH_SCHEMA` (`topic_rows`).
"""

from __future__ import annotations

import fcntl
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import NamedTuple

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from joins.interval import MATCHES, MIN_WATERMARK, IntervalJoinResult, JoinSide, batch_constant, interval_join
from joins.state import empty_frame, read_json, write_json

__all__ = [
    "IntervalStore",
    "IntervalSnapshot",
    "IntervalProgress",
    "StepOutcome",
    "STATE_SCHEMA",
    "BATCH_SCHEMA",
    "topic_rows",
]

STATE_SCHEMA = "side string, id string, session_id string, text string, ts bigint, _matches bigint"
BATCH_SCHEMA = "topic string, id string, session_id string, text string, ts bigint"
# topic: (its side tag in STATE_SCHEMA, its id column, its text column)
_TOPICS = {"searches": ("s", "search_id", "query"), "clicks": ("c", "click_id", "url")}


def topic_rows(df: DataFrame, topic: str) -> DataFrame:
    """Records of `topic` ("searches" or "clicks", in the topic's own columns) in `BATCH_SCHEMA`, so that one
    stream carries both topics."""
    _, id_col, text_col = _TOPICS[topic]
    return df.select(
        F.lit(topic).alias("topic"),
        F.col(id_col).alias("id"),
        "session_id",
        F.col(text_col).alias("text"),
        "ts",
    )


def _side(df: DataFrame, topic: str, *, by_tag: bool) -> DataFrame:
    """The rows of `topic` in `df` (`STATE_SCHEMA` when `by_tag`, with `_matches`; else `BATCH_SCHEMA`), in the
    topic's own columns."""
    tag, id_col, text_col = _TOPICS[topic]
    rows = df.where(F.col("side") == tag) if by_tag else df.where(F.col("topic") == topic)
    cols = [F.col("id").alias(id_col), "session_id", F.col("text").alias(text_col), "ts"]
    return rows.select(*cols, *([MATCHES] if by_tag else []))


def _state_rows(df: DataFrame, topic: str) -> DataFrame:
    """Kept rows of `topic`'s side (its own columns and `_matches`) in `STATE_SCHEMA`."""
    tag, id_col, text_col = _TOPICS[topic]
    cols = [F.col(id_col).alias("id"), "session_id", F.col(text_col).alias("text"), "ts", MATCHES]
    return df.select(F.lit(tag).alias("side"), *cols)


@dataclass
class IntervalProgress:
    """The join's progress after a step (`meta.json` of its version; the defaults are the state before the first).

    watermark: the event-time watermark (see `joins.interval`). max_ts: the newest `ts` of a record that was not
    late, on either side (None before any). last_event_ms: when the last batch with such a record arrived
    (processing time). next_close: the earliest window end of a search still open (None: none open). fence: the
    version's step. late, duplicates: records dropped as late / counted once as duplicates so far.
    searches_final: searches closed so far. held: searches still open. state_rows: rows kept in the state."""

    watermark: int = MIN_WATERMARK
    max_ts: int | None = None
    last_event_ms: int | None = None
    next_close: int | None = None
    fence: int | None = None
    late: int = 0
    duplicates: int = 0
    searches_final: int = 0
    held: int = 0
    state_rows: int = 0

    def saw(self, max_ts: int | None, now_ms: int, lateness_ms: int) -> int:
        """Record a batch that arrived at `now_ms` whose newest record not late has `ts` `max_ts` (None: it has
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
        windows of `upper_ms` after a search."""
        first = counts["min_kept_ts"]
        self.fence, self.watermark = fence, watermark
        self.searches_final += counts["closed"]
        self.held, self.state_rows = counts["held"], counts["state_rows"]
        self.next_close = None if first is None else first + upper_ms

    def counters(self) -> dict:
        """The watermark and the counters: late, duplicates, held, state_rows, searches_final."""
        keep = ("watermark", "late", "duplicates", "held", "state_rows", "searches_final")
        return {k: getattr(self, k) for k in keep}


class IntervalSnapshot(NamedTuple):
    """The state before a step: each side's rows (`joins.interval.state_schema`; None before the first step), the
    progress of the version restored (a new object, the caller may change it for `advance`) and its fence (None
    before the first step)."""

    searches: DataFrame | None
    clicks: DataFrame | None
    progress: IntervalProgress
    fence: int | None


class StepOutcome(NamedTuple):
    """What a step did: its fence, the progress after it (the state's watermark and counters) and the counts of
    `IntervalStore.stage`; for a micro-batch also `events`, `late` and `duplicates` (of this batch)."""

    fence: int
    progress: IntervalProgress
    counts: dict


def _no_mark(name: str) -> None:
    pass


class IntervalStore:
    """The interval join's state of one job generation, versioned by fence under `root` (see the module
    docstring), for clicks within `upper_ms` after their search and a watermark `lateness_ms` behind the newest
    event. Implements `joins.state.JoinState[IntervalSnapshot]`: `stage` takes the step's `IntervalJoinResult`,
    `advance` the step's `IntervalProgress`."""

    def __init__(self, spark, root: Path, *, upper_ms: int, lateness_ms: int):
        self.spark, self.root = spark, Path(root)
        self.upper_ms, self.lateness_ms = upper_ms, lateness_ms
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, fence: int) -> Path:
        return self.root / f"v{fence:020d}"

    def _versions(self) -> list[int]:
        return sorted(
            int(p.name[1:])
            for p in self.root.iterdir()
            if p.name.startswith("v") and p.name[1:].isdigit() and (p / "meta.json").exists()
        )

    def latest(self, below: int | None = None) -> tuple[int | None, IntervalProgress]:
        """(fence, progress) of the newest version (before `below`), or (None, the progress before the first
        step); reads no rows."""
        vs = [v for v in self._versions() if below is None or v < below]
        if not vs:
            return None, IntervalProgress()
        meta = read_json(self._dir(vs[-1]) / "meta.json")
        return vs[-1], IntervalProgress(
            **{f.name: meta[f.name] for f in fields(IntervalProgress) if f.name in meta}
        )

    def restore(self, fence: int) -> IntervalSnapshot:
        """The state before step `fence`: the newest version before it."""
        base, progress = self.latest(below=fence)
        if base is None:
            return IntervalSnapshot(None, None, progress, None)
        df = self.spark.read.schema(STATE_SCHEMA).parquet(str(self._dir(base) / "state"))
        return IntervalSnapshot(
            _side(df, "searches", by_tag=True), _side(df, "clicks", by_tag=True), progress, base
        )

    def step(
        self,
        fence: int,
        before: IntervalSnapshot,
        new: DataFrame,
        watermark_after: int,
        publish: Callable[[DataFrame, int], object],
    ) -> dict:
        """Step `fence` of the join: the step's records `new` (`BATCH_SCHEMA`, none late) joined with the state
        `before` (`joins.interval.interval_join`, how="left": a click matches a search of its `session_id` when
        its ts is in [search ts, search ts + `upper_ms`]); `publish(result.left, fence)` (the view's write,
        first), then `stage(fence, result)`; `before.progress` moves past the step. The caller advances the store
        once its own part is done. Returns the counts of `stage`."""
        p = before.progress
        res = interval_join(
            JoinSide(_side(new, "searches", by_tag=False), before.searches, "search_id"),
            JoinSide(_side(new, "clicks", by_tag=False), before.clicks, "click_id"),
            on="session_id",
            lower_ms=0,
            upper_ms=self.upper_ms,
            how="left",
            watermark_before=p.watermark,
            watermark_after=watermark_after,
        )
        try:
            publish(res.left, fence)
            out = self.stage(fence, res)
        finally:
            res.release()
        p._stepped(fence, watermark_after, out, self.upper_ms)
        return out

    def batch_step(
        self,
        fence: int,
        batch: DataFrame,
        publish: Callable[[DataFrame, int], object],
        on_late: Callable[[DataFrame, int], object],
        mark: Callable[[str], None] = _no_mark,
    ) -> StepOutcome | None:
        """Micro-batch `batch` (`BATCH_SCHEMA`) as step `fence`; None when it is empty.

        A record with `ts` below the watermark before the batch (W0) is late: not joined, counted, and passed to
        `on_late(rows, W0)` (rows: topic, id, session_id, ts). The watermark after it is `IntervalProgress.saw`'s
        (W1). The others are joined by `step` (`publish` as there); one whose id the state or the batch already
        had counts as a duplicate. Then the store advances and drops the versions a replay of this step does not
        need. `mark(name)` is called at the end of the phases "read+stats" and "state+counts"."""
        w0 = self.latest(below=fence)[1].watermark
        # `_ok` in a projection: `batch_constant` may not appear in an aggregate function's arguments
        marked = batch.select("*", (F.col("ts") >= batch_constant(w0)).alias("_ok")).persist()
        try:
            ok = F.col("_ok")
            is_search = (F.col("topic") == "searches").cast("int")
            n, late, max_ts, searches = marked.agg(
                F.count("*"), F.sum((~ok).cast("int")), F.max(F.when(ok, F.col("ts"))), F.sum(is_search)
            ).first()
            mark("read+stats")
            if not n:
                return None
            if late:
                on_late(marked.where(~ok).select("topic", "id", "session_id", "ts"), w0)
            before, late = self.restore(fence), late or 0
            w1 = before.progress.saw(max_ts, int(time.time() * 1000), self.lateness_ms)
            out = self.step(fence, before, marked.where(ok), w1, publish)
            mark("state+counts")
        finally:
            marked.unpersist()
        p, dups = before.progress, n - late - out["new_searches"] - out["new_clicks"]
        p.late, p.duplicates = p.late + late, p.duplicates + dups
        self.advance(fence, p, prune_below=before.fence)
        counts = {
            **out,
            "events": n,
            "late": late,
            "duplicates": dups,
            "searches": searches,
            "clicks": n - searches,
        }
        return StepOutcome(fence, p, counts)

    def idle_step(
        self, now_ms: int, timeout_ms: int, publish: Callable[[DataFrame, int], object]
    ) -> StepOutcome | None:
        """The idle rule (`IntervalProgress.idle_watermark`) at `now_ms`: a step with no new records, fenced
        right after the newest version (its fence + 1), that closes the windows the idle watermark passes;
        `publish` as for `step`. Advances the store. None when there is nothing to do."""
        base, progress = self.latest()
        w1 = None if base is None else progress.idle_watermark(now_ms, timeout_ms, self.lateness_ms)
        if w1 is None:
            return None
        before, empty = self.restore(base + 1), empty_frame(self.spark, BATCH_SCHEMA)
        out = self.step(base + 1, before, empty, w1, publish)
        self.advance(base + 1, before.progress)
        return StepOutcome(base + 1, before.progress, out)

    def stage(self, fence: int, result: IntervalJoinResult) -> dict:
        """Write the state of version `fence`: the rows of `result.left` / `result.right` that stay (`_keep`),
        replacing an earlier attempt (whose meta is removed first). Returns counts observed while writing (no
        Spark job of their own): `new_searches`, `new_clicks` (first seen in this step), `closed` (searches closed
        in this step), `provisional` (searches whose matches grew, not closed), `held` (searches kept),
        `state_rows` (rows kept) and `min_kept_ts` (the earliest kept search's ts, None if none)."""
        d = self._dir(fence)
        (d / "meta.json").unlink(missing_ok=True)

        def n(c):
            return F.sum(F.col(c).cast("bigint"))

        # observed on every row of each side, before the filter to the rows kept
        obs_l, obs_r = Observation(f"clicks_left_{fence}"), Observation(f"clicks_right_{fence}")
        left = result.left.observe(
            obs_l,
            n("_new").alias("new"),
            n("_closed").alias("closed"),
            F.sum((F.col("_changed") & ~F.col("_closed")).cast("bigint")).alias("provisional"),
            n("_keep").alias("kept"),
            F.min(F.when(F.col("_keep"), F.col("ts"))).alias("min_kept_ts"),
        )
        right = result.right.observe(obs_r, n("_new").alias("new"), n("_keep").alias("kept"))
        kept = _state_rows(left.where("_keep"), "searches").unionByName(
            _state_rows(right.where("_keep"), "clicks")
        )
        kept.coalesce(1).write.mode("overwrite").parquet(str(d / "state"))
        cl, cr = obs_l.get, obs_r.get
        return {
            "new_searches": int(cl["new"] or 0),
            "new_clicks": int(cr["new"] or 0),
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
        write_json(self._dir(fence) / "meta.json", asdict(progress))
        if prune_below is None:
            return
        for p in self.root.iterdir():
            if p.name.startswith("v") and p.name[1:].isdigit() and int(p.name[1:]) < prune_below:
                shutil.rmtree(p, ignore_errors=True)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the store alone for one step (a flock on `<root>/.lock`: other threads and processes wait)."""
        with open(self.root / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file is closed
            yield
