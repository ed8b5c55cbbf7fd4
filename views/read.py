"""The read side of every view: `query_view` (one key, one round trip to Redis) and `export_view` (all keys).

Readers resolve the job's serving generation first, so a replay that switches generations is seen atomically.
"""

from __future__ import annotations

from collections.abc import Iterator

from views import enrichment as _enrichment
from views.clicks import export_ctr, export_search_clicks, query_ctr, query_search_clicks
from views.errors import ViewError
from views.redis_io import current_generation
from views.timeline import export_timeline, read_timeline

__all__ = ["query_view", "export_view", "format_result", "printable"]


def query_view(client, view: str, key: str, *, limit: int | None = None, job: str) -> dict:
    if view == "timeline":
        return read_timeline(client, key, limit, job=job)
    if view == "search_clicks":
        return query_search_clicks(client, key, job=job)
    if view == "ctr":
        return query_ctr(client, key, job=job)
    if view == _enrichment.COUNTRY_VIEW:
        return _enrichment.query_activity_by_country(client, key, job=job)
    if view == _enrichment.ENRICHED_VIEW:
        raise ViewError(
            "enriched_activity is an output log, not a Redis view: use `mview export enriched_activity`"
        )
    raise ViewError(f"view {view!r} has no query")


def export_view(client, view: str, *, job: str, lake_dir=None, spark=None) -> Iterator[dict]:
    """Every key of `view` as export lines. `enriched_activity` is an output log in the lake: it needs `lake_dir`
    and `spark`, a callable returning a SparkSession, called only for that view."""
    if view == "timeline":
        return export_timeline(client, job=job)
    if view == "search_clicks":
        return export_search_clicks(client, job=job)
    if view == "ctr":
        return export_ctr(client, job=job)
    if view == _enrichment.COUNTRY_VIEW:
        return _enrichment.export_activity_by_country(client, job=job)
    if view == _enrichment.ENRICHED_VIEW:
        return _enrichment.export_enriched(spark(), lake_dir, current_generation(client, job))
    raise ViewError(f"view {view!r} has no export")


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}
_CONTROL.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})


def printable(text) -> str:
    """`text` with every control character (C0, DEL, C1: terminal escape sequences among them) shown as `\\xNN`,
    so printing data from a view can never drive the reader's terminal."""
    return str(text).translate(_CONTROL)


def format_result(view: str, result: dict) -> str:
    """Human-readable form of a query result; empty string for an empty result. Control characters in the data are
    shown escaped (`printable`)."""
    if view == "timeline":
        return "\n".join(
            printable(f"{t['ts']}  {t['tweet_id']}  @{t['user_id']}: {t['text']}")
            for t in result.get("tweets", [])
        )
    if view in ("search_clicks", "ctr"):
        import json

        return json.dumps(result) if result else ""
    if view == _enrichment.COUNTRY_VIEW:
        return printable(f"{result['country']}  {result['events']}") if result.get("events") else ""
    return "" if not result else printable(result)
