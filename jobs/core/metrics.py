"""Prometheus metrics of a running job, served over HTTP on loopback.

Every process that runs a job (`mview run`, a deployed job, a replay) serves `/metrics` on 127.0.0.1, port
`METRICS_PORT` + the job's place in `jobs.core.registry.jobs` (timeline 9464, clicks 9465, enrichment 9466 by default);
if that port is taken (a replay beside the deployed job) an ephemeral port is used. The URL is written to the
job's status file (`metrics_url`, shown by `mview status` while the job runs). `METRICS_PORT=off` serves nothing.

Two sources, so that `mview status` and the metrics never disagree:
- per micro-batch, the skeleton calls `observe(batch, seconds)`: input records per topic, batch duration and the
  phases of a batch (histograms), and what the batch wrote to its views (`Batch.totals` counts such as
  `entries`, `timeline_ops`, `emitted`); the `cdc` job calls `count(inputs, seconds)` per Delta commit of the
  log (its input records are the changes captured);
- at each scrape, the rest is read where `mview status` reads it: the job's status file (late, held, state rows,
  generation, last batch time, restarts, rebuilds), the dead-letter logs (rejected records) and the lag, the one
  `mview status` shows as `lag_versions`: of the checkpoint behind the logs, or a source job's own (in its
  `JobSpec.lag_unit`).

| metric | type | labels | meaning |
|---|---|---|---|
| `mview_input_records_total` | counter | job, topic | records of the topic processed by micro-batches |
| `mview_batches_total` | counter | job | micro-batches that processed records |
| `mview_batch_duration_seconds` | histogram | job | wall time of a micro-batch that processed records |
| `mview_batch_phase_seconds` | histogram | job, phase | wall time of a phase of a micro-batch (join, sink, state, ...) |
| `mview_view_writes_total` | counter | job, kind | what micro-batches wrote to the views (`entries`, `timeline_ops`, `emitted`, ...) |
| `mview_rejected_records_total` | counter | job, topic | dead-lettered lines of the topic |
| `mview_late_records_total` | counter | job | records that arrived behind the watermark |
| `mview_held_records` | gauge | job | records waiting for a watermark |
| `mview_state_rows` | gauge | job | rows of the join's state (where the job reports them) |
| `mview_state_bytes` | gauge | job | bytes of the generation's state directory |
| `mview_lag_versions` | gauge | job | log versions of the job's topics not yet processed (a view job) |
| `mview_lag_messages` | gauge | job | messages the broker holds that the `kafka` job has not copied |
| `mview_lag_bytes` | gauge | job | WAL bytes the `cdc` job's replication slot has not confirmed |
| `mview_last_batch_timestamp_seconds` | gauge | job | when the last micro-batch finished (Unix time) |
| `mview_generation` | gauge | job | the generation the job writes |
| `mview_restarts_total` | counter | job | query restarts of the deployed job |
| `mview_rebuilds_total` | counter | job | rebuilds of a serving copy Redis lost |
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from changelog.storage import StorageError
from jobs.core.progress import lag_versions, rejected_per_topic
from jobs.core.registry import job_spec, jobs
from jobs.core.runtime import log, read_status, state_key
from jobs.core.settings import Settings

__all__ = ["JobMetrics", "metrics_for"]

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# The status fields that count late records, per job (an interval job's dropped, an asof job's kept).
_LATE = ("late", "late_events_kept", "late_changes_kept")
_LAG_DOC = {
    "versions": "log versions of the job's topics not yet processed",
    "messages": "messages the broker holds that the job has not copied",
    "bytes": "WAL bytes the replication slot has not confirmed",
}
_LOCK = threading.Lock()
_SERVING: dict[
    str, JobMetrics
] = {}  # job -> its metrics in this process (one HTTP server per job and process)


class _StatusCollector:
    """The metrics read at scrape time from where `mview status` reads them."""

    def __init__(self, settings: Settings, job: str):
        self.settings, self.job = settings, job

    def collect(self):
        job, st = self.job, read_status(self.settings, self.job)
        gen = st.get("generation")
        rej = CounterMetricFamily(
            "mview_rejected_records", "dead-lettered lines of the topic", labels=["job", "topic"]
        )
        for topic, n in rejected_per_topic(self.settings, job_spec(self.settings, job).topics).items():
            rej.add_metric([job, topic], n)
        yield rej
        yield _counter(
            "mview_late_records",
            "records that arrived behind the watermark",
            job,
            sum(st.get(k) or 0 for k in _LATE),
        )
        yield _counter("mview_restarts", "query restarts of the deployed job", job, st.get("restarts") or 0)
        yield _counter(
            "mview_rebuilds", "rebuilds of a serving copy Redis lost", job, st.get("rebuilds") or 0
        )
        yield _gauge("mview_held_records", "records waiting for a watermark", job, st.get("held") or 0)
        if st.get("state_rows") is not None:
            yield _gauge("mview_state_rows", "rows of the join's state", job, st["state_rows"])
        if gen is not None:
            yield _gauge("mview_generation", "the generation the job writes", job, gen)
            try:
                state = self.settings.lake.tree_bytes(state_key(job, gen))
            except StorageError:  # a store that does not answer now: the next scrape reads it
                state = None
            if state is not None:
                yield _gauge("mview_state_bytes", "bytes of the generation's state directory", job, state)
        spec = job_spec(self.settings, job)
        if gen is not None or spec.lag:
            try:
                lag = lag_versions(self.settings, job, gen or 0)
            except Exception:  # noqa: BLE001 - a log being written: the next scrape reads it
                lag = None
            if lag is not None:
                unit = spec.lag_unit
                yield _gauge(f"mview_lag_{unit}", _LAG_DOC.get(unit, unit + " not yet processed"), job, lag)
        if st.get("last_batch_ms"):
            yield _gauge(
                "mview_last_batch_timestamp_seconds",
                "when the last micro-batch finished",
                job,
                st["last_batch_ms"] / 1000,
            )


def _counter(name: str, doc: str, job: str, value) -> CounterMetricFamily:
    m = CounterMetricFamily(name, doc, labels=["job"])
    m.add_metric([job], value)
    return m


def _gauge(name: str, doc: str, job: str, value) -> GaugeMetricFamily:
    m = GaugeMetricFamily(name, doc, labels=["job"])
    m.add_metric([job], value)
    return m


class JobMetrics:
    """The metrics of job `job` in this process (see the module docstring); `url` is where they are served."""

    def __init__(self, settings: Settings, job: str):
        self.job, self.registry, self.url = job, CollectorRegistry(), None
        r = self.registry
        self.inputs = Counter(
            "mview_input_records", "records processed, per topic", ["job", "topic"], registry=r
        )
        self.batches = Counter("mview_batches", "micro-batches that processed records", ["job"], registry=r)
        self.duration = Histogram(
            "mview_batch_duration_seconds",
            "wall time of a micro-batch",
            ["job"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.phases = Histogram(
            "mview_batch_phase_seconds",
            "wall time of a phase of a micro-batch",
            ["job", "phase"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.writes = Counter(
            "mview_view_writes", "what micro-batches wrote to the views", ["job", "kind"], registry=r
        )
        for topic in job_spec(settings, job).topics:  # every series exists from the start, at 0
            self.inputs.labels(job, topic)
        self.batches.labels(job)
        r.register(_StatusCollector(settings, job))

    def observe(self, batch, seconds: float) -> None:
        """Count one micro-batch that processed records (`jobs.core.skeleton.Batch`) and took `seconds`."""
        job = self.job
        self.count(batch.inputs, seconds)
        for phase, s in batch.phases.items():
            self.phases.labels(job, phase).observe(s)
        for kind, n in batch.totals.items():
            if isinstance(n, (int, float)) and not isinstance(n, bool):
                self.writes.labels(job, kind).inc(n)

    def count(self, inputs: dict[str, int], seconds: float) -> None:
        """Count one batch that processed `inputs` (records per topic) in `seconds`."""
        for topic, n in inputs.items():
            self.inputs.labels(self.job, topic).inc(n)
        self.batches.labels(self.job).inc()
        self.duration.labels(self.job).observe(seconds)

    def serve(self, port: int) -> str:
        """Serve on 127.0.0.1:`port`, or an ephemeral port if it is taken; returns the URL."""
        try:
            server, _thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        except OSError:
            server, _thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
            log(f"{self.job}: metrics port {port} is taken: serving on {server.server_port} instead")
        self.url = f"http://127.0.0.1:{server.server_port}/metrics"
        return self.url


def metrics_for(settings: Settings, job: str) -> JobMetrics | None:
    """The metrics of `job` in this process, serving from the first call on; None with `METRICS_PORT=off`."""
    if settings.metrics_port is None:
        return None
    with _LOCK:
        m = _SERVING.get(job)
        if m is None:
            m = _SERVING[job] = JobMetrics(settings, job)
            m.serve(settings.metrics_port + list(jobs(settings)).index(job))
        return m
