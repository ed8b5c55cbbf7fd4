"""The operations page (`mview ui`, `make ui`): every job at a glance, live, on 127.0.0.1.

`/` is one page (`jobs/ui/index.html` + `app.js`) that polls `/api/status` every second and, without a reload,
shows per job: running or not, generation, lag in log versions, the last batch, rejected/late/held counts, and
charts of batch duration, input rate and lag over the last five minutes (kept in the page), with a link to the
live timeline page (`make demo-web`). With no job running it says so; during a replay it shows the replay's
progress and follows the generation switch.

`/api/status` is `mview status --json` (`jobs.ops.status.job_status`, the same function), plus, for each running job
that serves metrics (`jobs.core.metrics`), the totals the charts need from its `/metrics`: input records, batches and
the summed batch duration. Only the standard library serves HTTP; nothing here starts Spark.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from jobs.core.settings import Settings
from jobs.ops.httpd import page_server
from jobs.ops.httpd import serve_in_thread as _serve
from jobs.ops.status import job_status

__all__ = ["snapshot", "make_server", "serve_in_thread"]

_STATIC = Path(__file__).with_name("ui")
_TOTALS = {
    "mview_input_records_total": "input_records",
    "mview_batches_total": "batches",
    "mview_batch_duration_seconds_sum": "batch_seconds",
}


def _scrape(url: str) -> dict:
    """The chart totals of one job's metrics: input records (all topics), batches, summed batch seconds."""
    text = urllib.request.urlopen(url, timeout=2).read().decode()
    out = dict.fromkeys(_TOTALS.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in _TOTALS:
                out[_TOTALS[s.name]] += s.value
    return out


def snapshot(settings: Settings) -> dict:
    """`{"at_ms", "jobs": {job: status row + "metrics" (totals, or null)}, "running": n}`."""
    jobs = job_status(settings)
    for row in jobs.values():
        row["metrics"] = None
        if row.get("metrics_url"):
            try:
                row["metrics"] = _scrape(row["metrics_url"])
            except Exception:  # noqa: BLE001 - the job is stopping or starting: the next poll reads it
                pass
    return {
        "at_ms": int(time.time() * 1000),
        "jobs": jobs,
        "running": sum(r["running"] for r in jobs.values()),
    }


def make_server(settings: Settings, host: str = "127.0.0.1", port: int = 0, *, page_url: str = ""):
    """An HTTP server (not started) for the page and `/api/status`; port 0 picks a free port."""

    def status(_params: dict) -> tuple[int, dict]:
        return 200, {**snapshot(settings), "page_url": page_url}

    return page_server(_STATIC, ("app.js",), {"/api/status": status}, host, port)


def serve_in_thread(settings: Settings, host: str = "127.0.0.1", port: int = 0, **kwargs):
    """Start `make_server(...)` in a daemon thread; `.shutdown()` stops it, `.server_port` is its port."""
    return _serve(make_server(settings, host, port, **kwargs), "ops-page")
