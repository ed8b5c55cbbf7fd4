"""A `join` job: the inner join of two table topics, maintained incrementally (`joins.table`), publishing list, row,
count and agg views (`views.list`, `views.row`, `views.count`, `views.agg`).

Source: both topics' logs, one stream. Per micro-batch N: the join's state before N is restored (from memory, or
from its durable log after a restart or when Spark replays N: `joins.table_state.TableStore`); the batch is joined
with it; each view's operations are applied to Redis while the changed state rows are staged under batch id N; the
state advances past N only when both are done. So a replayed batch computes the same changes and repeats the same
operations: list operations are idempotent per key, a row view's entries are absolute, a count view's deltas are
fenced by N; nothing is lost or doubled.

- A list view of the built-in timeline's shape (its key over one side, its entry the other side's key) runs that
  algorithm (`joins.table_list`, chosen by `views.list.join`), with its posts written before the batch is counted
  in a batch of entries only under a `fanout_limit`; any other list applies the join's delta (`views.list`).
- A row view: a removed row's entry is removed, an added row's entry set (a moved row: both; per key and row the
  added one wins).
- A count view: the values of added rows are added and those of removed rows subtracted, per key, fenced by N.
- An agg view: the removed and added rows are its row changes (`views.agg.AggView`, its state beside the join's).
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import islice

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.topics import read_stream
from jobs.core.runtime import log, state_key
from jobs.core.settings import Settings
from jobs.core.skeleton import Batch, JobRun, Wiring, run_job
from joins.table import JoinChanges, TableJoin, begin_join
from joins.table_state import TableStore
from spec.model import Pipeline
from views.changes import ChangeViews
from views.frame import check_job
from views.list import Few, ListViewSink, join_lists

__all__ = ["run"]


def _source(spark, settings: Settings, join: TableJoin) -> DataFrame:
    """Both topics as one stream: `topic` (its name), side i's log columns as `_<i>_<column>` (else null)."""
    cols = [(i, n, t) for i, topic in enumerate(join.topics) for n, t in topic.columns()]

    def norm(i: int, topic) -> DataFrame:
        own = [f"`{n}` AS `_{j}_{n}`" if j == i else f"CAST(NULL AS {t}) AS `_{j}_{n}`" for j, n, t in cols]
        return read_stream(spark, settings.lake, topic).selectExpr(f"'{topic.name}' AS topic", *own)

    return norm(0, join.topics[0]).unionByName(norm(1, join.topics[1]))


def _split(batch: DataFrame, join: TableJoin, present) -> tuple:
    """Each side's records of the batch (its log's columns), None for a topic not `present`."""
    return tuple(
        batch.where(F.col("topic") == t.name).selectExpr(*[f"`_{i}_{n}` AS `{n}`" for n, _ in t.columns()])
        if t.name in present
        else None
        for i, t in enumerate(join.topics)
    )


def _shown(limit: int | None) -> str:
    return "" if limit is None else str(limit)


class _Views:
    """A join job's views and their sinks: lists (each its own phases, `views.list.join_lists`), every other view
    from the join's delta as row changes (`views.changes.ChangeViews`)."""

    def __init__(self, run: JobRun, pipeline: Pipeline, join: TableJoin):
        url, gen, job = run.settings.redis_url, run.generation, pipeline.jobs[run.job]
        self.lists = join_lists(join, job.views)
        self.list_sinks = {
            lv.view.name: ListViewSink(
                url, lv.view.name, gen, lv.view.cap, descending=lv.descending, fence=run.fence
            )
            for lv in self.lists
        }
        self.others = ChangeViews(
            run.spark,
            run.settings.lake,
            pipeline,
            run.job,
            redis_url=url,
            generation=gen,
            state_key=state_key(run.job, gen),
            append_only=False,
            fence=run.fence,
        )
        self.parts = [p for lv in self.lists for p in lv.parts]
        # posts first: one list of the timeline's shape with a fan-out limit, in a batch of its entries only
        limited = [lv for lv in self.lists if lv.shape is not None and lv.view.fanout_limit is not None]
        self.posting = limited[0] if len(self.lists) == 1 and limited else None
        self.entries_topic = join.topics[self.posting.shape.entry_side].name if self.posting else None
        self.meta = {}
        for lv in self.lists:
            self.meta[f"{lv.view.name}.cap"] = lv.view.cap
            self.meta[f"{lv.view.name}.fanout_limit"] = _shown(lv.view.fanout_limit)

    def delta_ops(self, changes: JoinChanges, join: TableJoin, batch_id: int) -> None:
        """Apply the batch's delta (each removed and added joined row) to the views other than lists."""
        if not (self.others.delta or self.others.aggs):
            return
        signed = [
            join.frame_rows(rows).selectExpr("*", f"{sign} AS _sign", "CAST(NULL AS bigint) AS _time")
            for rows, sign in ((changes.removed, -1), (changes.added, 1))
        ]
        self.others.write(signed[0].unionByName(signed[1]), batch_id)


def _process(
    run: JobRun, views: _Views, join: TableJoin, store: TableStore, batch_df: DataFrame, batch_id: int
):
    # long: the order of a batch's steps is the design (posts, count, plan, write beside staging, advance)
    started = time.monotonic()
    batch = batch_df.localCheckpoint(eager=False)  # read from memory after its first Spark job
    posting = views.posting
    # A batch of entries only under a fan-out limit (the offset log tells) is counted after its posts are written
    posts_first = posting is not None and run.topics_moved(batch_id, [t.name for t in join.topics]) == {
        views.entries_topic
    }
    per_topic = None if posts_first else dict(batch.groupBy("topic").count().collect())
    if per_topic == {}:
        return None
    batches = _split(batch, join, per_topic or {views.entries_topic})
    step = begin_join(join, store.restore(batch_id), batches, views.parts)
    posts = step.posts.get(posting.view.name) if posting else None
    sinks = views.list_sinks
    early = (
        sinks[posting.view.name].write((posting.posts_ops(posts), Few()), batch_id)
        if posts is not None
        else None
    )
    per_topic = per_topic or dict(batch.groupBy("topic").count().collect())
    if not (n_events := sum(per_topic.values())):
        return None
    changes = step.finish()
    t_join = time.monotonic()
    written = {"lists": 0, "entries": 0}
    # The state after the batch is settled and staged while Redis applies it; it advances once both are done.
    with ThreadPoolExecutor(max_workers=1) as pool:
        staged = None
        for lv in views.lists:
            sink, phases = sinks[lv.view.name], lv.phases(changes, posts is not None and lv is posting)
            head = list(islice(phases, 1 if lv is posting and posts is None else 0))
            first = (early if lv is posting else None) or sink.write(head, batch_id)
            staged = staged or pool.submit(store.stage, batch_id, changes)
            got = sink.write(phases, batch_id)
            written = {k: written[k] + got[k] + first[k] for k in written}
        staged = staged or pool.submit(store.stage, batch_id, changes)
        views.delta_ops(changes, join, batch_id)
        t_sink = time.monotonic()
        staged.result()
    store.advance(batch_id, changes)
    t_state = time.monotonic()
    changes.release()
    n_ops, n_entries = written["lists"], written["entries"]
    return Batch(
        events=n_events,
        summary=f"{n_events:,} events -> {n_ops:,} lists, {n_entries:,} entries (join "
        f"{t_join - started:.2f}s, redis {t_sink - t_join:.2f}s, state wait {t_state - t_sink:.2f}s)",
        totals={"list_ops": n_ops, "entries": n_entries},
        meta=views.meta,  # readers cut merged lists to the cap
        inputs=per_topic,
        phases={"join": t_join - started, "sink": t_sink - t_join, "state": t_state - t_sink},
    )


def _wire(run: JobRun, pipeline: Pipeline) -> Wiring:
    lake, key = run.settings.lake, state_key(run.job, run.generation)
    join = TableJoin(run.spark, *pipeline.sides(run.job), pipeline.jobs[run.job].spec.match)
    views = _Views(run, pipeline, join)
    store = TableStore(run.spark, lake, join, key=f"{key}/table")
    run.totals.update(list_ops=0, entries=0)
    started, first = time.monotonic(), run.next_batch_id()
    store.restore(first)
    log(
        f"{run.job} g{run.generation}: state before batch {first} loaded in {time.monotonic() - started:.2f}s"
    )
    process = functools.partial(_process, run, views, join, store)
    return Wiring(source=_source(run.spark, run.settings, join), process=process)


def run(
    spark, settings: Settings, pipeline: Pipeline, job: str, *, once: bool = True, generation=None
) -> dict:
    """Run join job `job` of `pipeline` into `generation` (default: the serving one, rebuilt first if Redis lost
    it or the job's definition changed). Returns this run's totals: batches, events, list_ops, entries, seconds. An
    expression of the job that Spark cannot analyse raises `views.frame.ExpressionError` before anything runs."""
    check_job(spark, pipeline, job)
    return run_job(
        spark, settings, job, functools.partial(_wire, pipeline=pipeline), once=once, generation=generation
    )
