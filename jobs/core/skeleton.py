"""The shape every job shares: source -> join (with its state) -> view, one micro-batch at a time.

A job module only wires its parts: `run_job(spark, settings, name, wire, once=..., generation=...)` connects to
Redis, picks the generation (the serving one, rebuilt first if Redis lost it: `jobs.core.replay.serving_or_rebuild`),
calls `wire(run)` for the job's source and per-batch function, and runs the streaming query with exactly-once
checkpointing (`jobs.core.runtime.run_stream`). Per micro-batch it times the job's function and, for a batch that
did something, records the batch id in Redis with the job's metadata (`jobs.core.generations.record_batch`, before
Spark commits the batch), merges the job's fields into the status file and logs one line; an empty batch only
records its id. Steps of one run (micro-batches and idle ticks) never overlap: they hold `run.lock`.

A source job (`JobSpec.source`: it copies an outside system into the topics' logs) has no views and no
generations: it runs without Redis, always as generation 0 (its checkpoint `checkpoints/<job>/g0`), and records
nothing in Redis; status file, log line, metrics and lock are as above.

A micro-batch applied, or a continuous run's first trigger completed (the query answered: sources read), means the
job recovered from whatever made an earlier query of the process fail: the status's `last_error` becomes
`previous_error` (`jobs.core.runtime.recovered`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame

from changelog.topics import table_id
from jobs.core.fencing import check_lease, writer_fence
from jobs.core.generations import last_committed_batch, record_batch, record_definition
from jobs.core.metrics import metrics_for
from jobs.core.registry import job_spec
from jobs.core.replay import serving_or_rebuild
from jobs.core.runtime import (
    checkpoint_dir,
    checkpoint_key,
    log,
    log_sources,
    moved_sources,
    read_status,
    recovered,
    run_stream,
    state_dir,
    write_status,
)
from jobs.core.settings import Settings
from views.fence import UNFENCED, Fence, raise_fence
from views.redis_io import connect

__all__ = ["JobRun", "Batch", "Wiring", "run_job"]


@dataclass(frozen=True)
class JobRun:
    """One run of job `job` into generation `generation`: what its wiring needs."""

    spark: object
    settings: Settings
    job: str
    generation: int
    client: object  # redis client of the serving Redis (None for a source job)
    totals: dict = field(default_factory=lambda: {"batches": 0, "events": 0, "seconds": 0.0})
    lock: threading.Lock = field(default_factory=threading.Lock)
    fingerprint: str = (
        ""  # the job's definition (`spec.model.Pipeline.fingerprint`), recorded with every batch
    )
    fence: Fence = UNFENCED  # what every Redis write of the run carries (`writer_fence`)

    @property
    def state_dir(self) -> str:
        """The URI of this run's join state (`state/<job>/g<generation>` in the lake)."""
        return state_dir(self.settings, self.job, self.generation)

    @property
    def checkpoint(self) -> str:
        """The URI of this run's streaming checkpoint (`checkpoints/<job>/g<generation>` in the lake)."""
        return checkpoint_dir(self.settings, self.job, self.generation)

    def topics_moved(self, batch_id: int, topics) -> frozenset[str] | None:
        """Which of `topics` (the query's Delta topic sources) have input in micro-batch `batch_id`, told from the
        offset log without a Spark job (`jobs.core.runtime.moved_sources`): the topics whose log advanced, a superset of
        those with records in the batch. None when it cannot be told (see there, or a log without its first
        commit)."""
        moved = moved_sources(self.settings.lake, checkpoint_key(self.job, self.generation), batch_id)
        ids = {table_id(self.settings.lake, self.settings.topic(t)): t for t in topics}
        if moved is None or None in ids or any(o.get("reservoirId") not in ids for o in moved):
            return None
        return frozenset(ids[o["reservoirId"]] for o in moved)

    def next_batch_id(self) -> int:
        """The id of the next micro-batch the query runs: one past the checkpoint's last committed batch."""
        last = last_committed_batch(self.settings, self.job, self.generation)
        return 0 if last is None else last + 1


@dataclass
class Batch:
    """What one micro-batch did.

    events: input records of the batch. summary: the log line's text after `<job> g<g> batch <id>: `.
    status: fields merged into the status file. counters: added to the generation's running totals in the
    status file. meta: recorded with the batch id in Redis. totals: added to the run's totals (and, the numbers,
    to the metrics' view writes). inputs: records per topic. phases: seconds per phase of the batch (metrics).
    """

    events: int
    summary: str
    status: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    totals: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)


@dataclass
class Wiring:
    """A job's parts for one run. `process(batch_df, batch_id)` returns a Batch, or None when the batch was empty.
    `idle()` (optional) runs every trigger interval of a continuous run and once at the end of a `--once` run."""

    source: DataFrame
    process: Callable[[DataFrame, int], Batch | None]
    idle: Callable[[], None] | None = None


def _record(run: JobRun, batch_id: int, b: Batch, took: float) -> None:
    now = int(time.time() * 1000)
    check_lease(run.job)
    if run.client is not None:
        meta = {"fingerprint": run.fingerprint, "last_batch_ms": now, **b.meta}
        record_batch(run.client, run.job, run.generation, batch_id, fence=run.fence, **meta)
    prev = read_status(run.settings, run.job) if b.counters else {}  # only running totals need it
    same = prev.get("generation") == run.generation
    running = {k: (prev.get(k, 0) if same else 0) + v for k, v in b.counters.items()}
    write_status(
        run.settings,
        run.job,
        generation=run.generation,
        last_batch_id=batch_id,
        last_batch_ms=now,
        last_batch_seconds=round(took, 3),
        last_batch_events=b.events,
        **b.status,
        **running,
    )
    log(f"{run.job} g{run.generation} batch {batch_id}: {b.summary} in {took:.2f}s")


def _ticker(run: JobRun, idle: Callable[[], None], stop: threading.Event) -> threading.Thread:
    every = max(0.5, run.settings.trigger_interval_ms / 1000)

    def loop() -> None:
        while not stop.wait(every):
            try:
                with run.lock:
                    idle()
            except Exception as e:  # noqa: BLE001 - a failed tick is retried at the next interval
                log(f"{run.job} g{run.generation}: idle tick failed: {e}")

    t = threading.Thread(target=loop, name=f"{run.job}-idle", daemon=True)
    t.start()
    return t


def _fingerprint(settings: Settings, job: str, source: bool) -> str:
    return "" if source else settings.pipeline().fingerprint(job)


def _begin(spark, settings: Settings, job: str, generation, source: bool) -> JobRun:
    """The run of `job` into `generation` (default: the serving one), its Redis fence raised to the epoch of the
    lease this process holds (`jobs.core.fencing.writer_fence`) before anything is written."""
    client = None if source else connect(settings.redis_url, cluster=settings.redis_cluster)
    if source:
        gen = 0
    else:
        gen = generation if generation is not None else serving_or_rebuild(spark, settings, job)
    fence = writer_fence(job)
    if client is not None:
        raise_fence(client, fence)  # before this holder's first write
    return JobRun(
        spark, settings, job, gen, client, fingerprint=_fingerprint(settings, job, source), fence=fence
    )


def run_job(
    spark, settings: Settings, job: str, wire: Callable[[JobRun], Wiring], *, once: bool, generation=None
) -> dict:
    """Run `job` into `generation` (default: the serving one); returns the run's totals (see the module
    docstring). once: everything available now, then return; else until stopped (`jobs.core.runtime.run_stream`)."""
    source = job_spec(settings, job).source
    run = _begin(spark, settings, job, generation, source)
    client, gen, fence = run.client, run.generation, run.fence
    metrics = metrics_for(settings, job)
    ui = spark.sparkContext.uiWebUrl if settings.spark_ui else None
    write_status(settings, job, metrics_url=metrics.url if metrics else None, spark_ui_url=ui)
    w = wire(run)

    def each(batch_df, batch_id: int) -> None:
        with run.lock:
            check_lease(job)
            started = time.monotonic()
            b = w.process(batch_df, batch_id)
            if b is None:
                check_lease(job)
                if client is not None:
                    record_batch(client, job, gen, batch_id, fence=fence, fingerprint=run.fingerprint)
                recovered(settings, job)
                return
            took = time.monotonic() - started
            run.totals["batches"] += 1
            run.totals["events"] += b.events
            run.totals["seconds"] += took
            for k, v in b.totals.items():
                run.totals[k] = run.totals.get(k, 0) + v
            _record(run, batch_id, b, took)
            recovered(settings, job)
            if metrics is not None:
                metrics.observe(b, took)

    if not source:
        record_definition(settings, job, gen)  # what the generation is built from, for a later change to name
        log_sources(settings, job, gen, job_spec(settings, job).topics)
    stop = threading.Event()
    ticker = _ticker(run, w.idle, stop) if w.idle is not None and not once else None
    try:
        run_stream(
            w.source,
            each,
            checkpoint=run.checkpoint,
            once=once,
            settings=settings,
            name=f"{job}_g{gen}",
            healthy=None if once else lambda: recovered(settings, job),  # from a failure, if there was one
        )
    finally:
        stop.set()
        if ticker is not None:
            ticker.join(5)
    if once and w.idle is not None:
        with run.lock:
            w.idle()
    return run.totals
