"""The `timeline` job: the built-in pipeline's `join` job `timeline` (tweets x follows) and its list view, in Redis.

Wiring until a pipeline-driven runner replaces it: the job and its view come from the built-in pipeline file (with
`TIMELINE_CAP`, `FANOUT_LIMIT` from the settings). Join: `joins.table.begin_join`, state `joins.table_state.TableStore`
(`LAKE_DIR/state/timeline/g<N>/table`); view: `views.list`. Per micro-batch N: the state before N is restored (from
memory, or from the log after a restart or a replay of N); the batch is joined with it; the list operations are
applied to Redis (idempotent per key) while the changed state rows are staged under batch id N; only when both are
done does the state advance past N, so a replayed batch has the effect of one.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.topics import read_stream
from jobs.errors import FanoutLimitChanged, LakeUnusable
from jobs.runtime import log
from jobs.settings import Settings
from jobs.skeleton import Batch, JobRun, Wiring, run_job
from joins.table import TableJoin, begin_join
from joins.table_state import TableStore
from spec import Pipeline, load_pipeline
from views.frame import check_job
from views.keys import meta_key
from views.list import ListView, ListViewSink

__all__ = ["run_timeline", "TOPICS", "pipeline"]

JOB = "timeline"
_FILE = Path(__file__).resolve().parents[1] / "timeline_demo" / "pipelines" / "builtin.yml"
TOPICS = load_pipeline(_FILE, {}).jobs[JOB].topics


def _shown(limit: int | None) -> str:
    return "" if limit is None else str(limit)


def pipeline(settings: Settings) -> Pipeline:
    """The built-in pipeline with the settings' `TIMELINE_CAP` and `FANOUT_LIMIT`."""
    env = {"TIMELINE_CAP": str(settings.timeline_cap), "FANOUT_LIMIT": _shown(settings.fanout_limit)}
    return load_pipeline(_FILE, env)


def _source(spark, settings: Settings) -> DataFrame:
    """Both topics as one stream: `topic` (its name), side i's log columns as `_<i>_<column>` (else null)."""
    sides = pipeline(settings).sides(JOB)
    cols = [(i, n, t) for i, topic in enumerate(sides) for n, t in topic.columns()]

    def norm(i: int, topic) -> DataFrame:
        own = [f"`{n}` AS `_{j}_{n}`" if j == i else f"CAST(NULL AS {t}) AS `_{j}_{n}`" for j, n, t in cols]
        return read_stream(spark, settings.lake_dir, topic.name).selectExpr(f"'{topic.name}' AS topic", *own)

    return norm(0, sides[0]).unionByName(norm(1, sides[1]))


def _split(batch: DataFrame, join: TableJoin, present) -> tuple:
    """Each side's records of the batch (its log's columns), None for a topic not `present`."""
    return tuple(
        batch.where(F.col("topic") == t.name).selectExpr(*[f"`_{i}_{n}` AS `{n}`" for n, _ in t.columns()])
        if t.name in present
        else None
        for i, t in enumerate(join.topics)
    )


def _check(run: JobRun) -> None:
    """A generation keeps the FANOUT_LIMIT it was built with, and a state of an earlier version's layout is refused."""
    meta = run.client.hgetall(meta_key(JOB, run.generation))
    built = meta.get(b"fanout_limit", b"").decode()
    if b"last_batch_id" in meta and built != _shown(run.settings.fanout_limit):
        limit = int(built) if built else None
        raise FanoutLimitChanged(JOB, run.generation, limit, run.settings.fanout_limit)
    if (run.state_dir / "changes").exists() and not (run.state_dir / "table").exists():
        raise LakeUnusable(run.state_dir, f"holds an earlier version's state: `mview replay {JOB}`")


def _wire(run: JobRun) -> Wiring:
    settings = run.settings
    _check(run)
    built_in = pipeline(settings)
    check_job(
        run.spark, built_in, JOB
    )  # an expression Spark cannot analyse: one line with file, line and key
    job, [view] = built_in.jobs[JOB], built_in.jobs[JOB].views
    join = TableJoin(run.spark, *built_in.sides(JOB), job.spec.match)
    lists = ListView(join, view)
    store = TableStore(run.spark, run.state_dir / "table", join)
    sink = ListViewSink(settings.redis_url, view.name, run.generation, view.cap, descending=lists.descending)
    run.totals.update(timeline_ops=0, entries=0)
    limited = lists.shape is not None and view.fanout_limit is not None
    entries_topic = join.topics[lists.shape.entry_side].name if lists.shape else None

    def process(batch_df: DataFrame, batch_id: int) -> Batch | None:
        started = time.monotonic()
        batch = batch_df.localCheckpoint(eager=False)  # read from memory after its first Spark job
        # A batch of entries only under a fan-out limit (the offset log tells) is counted after its posts are written
        posts_first = limited and run.topics_moved(batch_id, TOPICS) == {entries_topic}
        per_topic = None if posts_first else dict(batch.groupBy("topic").count().collect())
        if per_topic == {}:
            return None
        batches = _split(batch, join, per_topic or {entries_topic})
        step = begin_join(join, store.restore(batch_id), batches, lists.parts)
        posts = step.posts.get(view.name)
        early = sink.write_few(lists.posts_ops(posts), batch_id) if posts is not None else None
        per_topic = per_topic or dict(batch.groupBy("topic").count().collect())
        if not (n_events := sum(per_topic.values())):
            return None
        changes = step.finish()
        t_join = time.monotonic()
        # The state after the batch is settled and staged while Redis applies it; it advances once both are done.
        phases = lists.phases(changes, posts is not None)
        head = list(islice(phases, 1 if limited and posts is None else 0))
        with ThreadPoolExecutor(max_workers=1) as pool:
            first = early or sink.write(head, batch_id)
            staged = pool.submit(store.stage, batch_id, changes)
            written = {k: v + first[k] for k, v in sink.write(phases, batch_id).items()}
            t_sink = time.monotonic()
            staged.result()
        store.advance(batch_id, changes)
        t_state = time.monotonic()
        changes.release()
        n_ops, n_entries = written["lists"], written["entries"]
        return Batch(
            events=n_events,
            summary=f"{n_events:,} events -> {n_ops:,} timelines, {n_entries:,} entries (join "
            f"{t_join - started:.2f}s, redis {t_sink - t_join:.2f}s, state wait {t_state - t_sink:.2f}s)",
            totals={"timeline_ops": n_ops, "entries": n_entries},
            meta={"cap": view.cap, "fanout_limit": _shown(view.fanout_limit)},
            inputs=per_topic,
            phases={"join": t_join - started, "sink": t_sink - t_join, "state": t_state - t_sink},
        )

    started, first = time.monotonic(), run.next_batch_id()
    store.restore(first)
    log(f"timeline g{run.generation}: state before batch {first} loaded in {time.monotonic() - started:.2f}s")
    return Wiring(source=_source(run.spark, settings), process=process)


def run_timeline(spark, settings: Settings, *, once: bool = True, generation: int | None = None) -> dict:
    """Run the timeline job into `generation` (default: the serving one, rebuilt first if Redis lost it, see
    `jobs.replay.serving_or_rebuild`). Returns this run's totals: batches, events, timeline_ops, entries, seconds."""
    return run_job(spark, settings, JOB, _wire, once=once, generation=generation)
