"""Job `cdc`: the PostgreSQL tables of the pipeline's topics with `capture: {postgres: <table>}`, captured by
logical replication into those topics' logs (`changelog.postgres`: snapshot, then every committed change, exactly
once), through one publication and slot: PG_SLOT, default `mview_<the first captured topic>` (`mview_profiles`
for the built-in pipeline). A source job: no Spark, no views.

- `run_cdc(once=True)`: everything committed before the start, then returns the counts.
- Deployed (`once=False`, see `jobs.ops.source`): streams until SIGTERM; each commit of the log updates the status
  (`appended`, `rejected`, `lsn`). The database unreachable: the log and the status say so (PG_DSN without its
  password) and it tries again after 2, 4, ... 60 s. PG_DSN unusable as it is (`PostgresMisconfigured`: it does
  not parse, or the server refuses its credentials): never retried; `run_cdc` raises it, so the job ends with
  `state: "failed"` and the reason in `error` (`jobs.ops.source`).
- `probe`: what `mview deploy cdc` checks first: it raises the permanent problems (nothing is started) and
  returns the `PostgresUnavailable` the job will wait for, if any.
- `lag`: WAL bytes the slot has not confirmed (`mview status`); `drop`: removes the slot and the publication
  (`mview stop cdc --drop-slot`).
- Metrics (`jobs.core.metrics`, `metrics_url` in the status), `mview run` and deployed alike: per Delta commit of the
  logs (the snapshot's, then the stream's), `mview_input_records_total{topic=...}` counts the changes each
  topic's commits hold (appended or dead-lettered), `mview_batches_total` and `mview_batch_duration_seconds` the commit; at each
  scrape `mview_lag_bytes` is `lag`, `mview_rejected_records_total` the dead letters and
  `mview_last_batch_timestamp_seconds` the last commit.
"""

from __future__ import annotations

import time

import psycopg2

from changelog.errors import CdcFailed, PostgresMisconfigured, PostgresUnavailable, redact
from changelog.postgres import PgSource, capture, captured_topics, drop_slot, shown_dsn, wal_lag
from changelog.postgres import probe as _probe
from jobs.core import runtime
from jobs.core.metrics import metrics_for
from jobs.core.runtime import job_key, log, write_status
from jobs.core.settings import Settings

__all__ = ["run_cdc", "lag", "drop", "probe", "slot_name"]


def slot_name(settings: Settings) -> str:
    """PG_SLOT, or `mview_<the first topic of the pipeline with capture>` (`mview` when none has one)."""
    if settings.pg_slot:
        return settings.pg_slot
    topics = captured_topics(settings.pipeline().topics.values())
    return f"mview_{topics[0].name}" if topics else "mview"


def _source(settings: Settings) -> PgSource:
    if not settings.pg_dsn:
        raise CdcFailed(
            "PG_DSN is empty: set it to the database to capture (`make postgres` starts a local one)"
        )
    pipeline = settings.pipeline()
    topics = captured_topics(pipeline.topics.values())
    if not topics:
        raise CdcFailed(
            f"no topic of the pipeline {pipeline.file} has `capture: {{postgres: <table>}}`: declare the table a"
            " topic captures, or do not run the cdc job"
        )
    return PgSource(settings.pg_dsn, topics, slot_name(settings))


def run_cdc(spark, settings: Settings, *, once: bool = True, generation: int | None = None) -> dict:
    """Capture the pipeline's captured tables into their topics' logs; `spark` and `generation` are not used (a
    source job)."""
    source = _source(settings)
    metrics = metrics_for(settings, "cdc")
    write_status(settings, "cdc", metrics_url=metrics.url if metrics else None)
    if once:
        return capture(source, settings.lake, job_key("cdc"), once=True, progress=_meter(metrics, {}, None))
    totals = {"appended": 0, "rejected": 0}
    failures = 0
    while not runtime.STOP.is_set():
        base = dict(totals)

        def status(p: dict, base=base) -> None:
            totals.update(
                appended=base["appended"] + p["appended"], rejected=base["rejected"] + p["rejected"]
            )
            write_status(settings, "cdc", **totals, lsn=p["lsn"], last_batch_ms=int(time.time() * 1000))

        started = time.monotonic()
        try:
            write_status(settings, "cdc", state="running", error=None, retry_in_s=None)
            log(
                f"cdc: capturing {source.shown_tables} (slot {source.slot}) at PG_DSN ({shown_dsn(source.dsn)})"
            )
            capture(
                source,
                settings.lake,
                job_key("cdc"),
                once=False,
                stop=runtime.STOP.is_set,
                progress=_meter(metrics, {}, status),
            )
        except PostgresMisconfigured as e:  # retrying cannot help: PG_DSN must change
            log(f"cdc: {e}; not retrying: stopping")
            write_status(settings, "cdc", retry_in_s=None)
            raise
        except (PostgresUnavailable, CdcFailed, OSError, psycopg2.Error) as e:
            failures = 1 if time.monotonic() - started > 300 else failures + 1
            delay = min(60, 2**failures)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if not isinstance(e, (PostgresUnavailable, CdcFailed)):
                reason = redact(f"PostgreSQL at PG_DSN ({shown_dsn(source.dsn)}): {reason}", source.dsn)
            log(f"cdc: {reason}; trying again in {delay}s")
            write_status(settings, "cdc", state="waiting", error=reason, retry_in_s=delay)
            runtime.STOP.wait(delay)
    return totals


def _meter(metrics, seen: dict, then):
    """The progress callback of one capture: counts each Delta commit's changes per topic in `metrics` (the
    capture's counts are cumulative: `seen` keeps the last), then calls `then`."""

    def progress(p: dict) -> None:
        counts = p.get("topics", {})
        if metrics is not None:
            metrics.count({t: n - seen.get(t, 0) for t, n in counts.items()}, p.get("seconds", 0.0))
        seen.update(counts)
        if then is not None:
            then(p)

    return progress


def lag(settings: Settings) -> int | None:
    """WAL bytes not yet captured; None without PG_DSN, a captured topic, a slot, or an answering database."""
    if not settings.pg_dsn:
        return None
    try:
        return wal_lag(_source(settings))
    except CdcFailed:  # no topic to capture
        return None


def drop(settings: Settings) -> list[str]:
    return drop_slot(_source(settings))


def probe(settings: Settings) -> PostgresUnavailable | None:
    """`changelog.postgres.probe` of PG_DSN: raises what the job could never get past (an empty or unparseable
    PG_DSN, refused credentials), returns the unreachable server it would wait for, or None."""
    return _probe(_source(settings))
