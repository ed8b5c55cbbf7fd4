"""A small web page that shows one user's home timeline, read from Redis, updating live (polling, no reload).

`python -m timeline_demo.web [--port 8765] [--live]` (or `make demo-web`) serves:
- `/` (and `/?user=u1`): the page (`timeline_demo/web/index.html` + `app.js`), which polls the JSON endpoint
  every 500 ms and updates the list in place, highlighting new entries;
- `/api/timeline?user=ID[&limit=N]`: `timeline_demo.timeline_view.read_timeline` (the same read as `mview query timeline ID
  --json`) plus the job's `last_batch_id` and `last_batch_ms` from `mv:meta:timeline:<g>`.
With `--live`, the timeline job also runs continuously in this process and a trickle of new tweets and follows
(from the demo's workload generator) is ingested every few seconds, so the page moves by itself.
Only the Python standard library serves HTTP; Redis is read with one client shared by the handler threads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs.ops.httpd import page_server, serve_until_interrupted
from jobs.ops.httpd import serve_in_thread as _serve
from timeline_demo.timeline_view import read_timeline
from views.keys import meta_key
from views.redis_io import connect, redact_url

__all__ = ["make_server", "serve_in_thread", "main"]

_STATIC = Path(__file__).with_name("web")
_MAX_LIMIT = 800


def _timeline_payload(client, user: str, limit: int) -> dict:
    result = read_timeline(client, user, limit)
    meta = client.hgetall(meta_key("timeline", result["generation"]))
    result["last_batch_id"] = int(meta[b"last_batch_id"]) if b"last_batch_id" in meta else None
    result["last_batch_ms"] = int(meta[b"last_batch_ms"]) if b"last_batch_ms" in meta else None
    return result


def make_server(redis_url: str, host: str = "127.0.0.1", port: int = 0):
    """An HTTP server (not started) for the page and its JSON endpoint; port 0 picks a free port."""
    client = connect(redis_url)

    def timeline(params: dict) -> tuple[int, dict]:
        user = params.get("user", "")
        if not user:
            return 400, {"error": "give ?user=ID"}
        try:
            limit = max(0, min(_MAX_LIMIT, int(params.get("limit", "50"))))
        except ValueError:
            return 400, {"error": "limit must be an integer"}
        return 200, _timeline_payload(client, user, limit)

    return page_server(_STATIC, ("app.js",), {"/api/timeline": timeline}, host, port)


def serve_in_thread(redis_url: str, host: str = "127.0.0.1", port: int = 0):
    """Start `make_server(...)` in a daemon thread; call `.shutdown()` to stop. `.server_port` is the port."""
    return _serve(make_server(redis_url, host, port), "timeline-web")


def main(argv: list[str] | None = None) -> int:
    from jobs.core.settings import Settings

    p = argparse.ArgumentParser(prog="python -m timeline_demo.web", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--live", action="store_true", help="also run the job and ingest a trickle of new events")
    p.add_argument("--every", type=float, default=3.0, help="seconds between trickle ingests (--live)")
    p.add_argument("--kafka", action="store_true", help="--live through KAFKA_BOOTSTRAP and the kafka job")
    args = p.parse_args(argv)
    settings = Settings.from_env()
    server = serve_in_thread(settings.redis_url, args.host, args.port)
    url = f"http://{args.host}:{server.server_port}/"
    print(
        f"timeline page at {url}?user=u1  (reading {redact_url(settings.redis_url)}; Ctrl-C stops)",
        flush=True,
    )
    live = None
    if args.live:
        from timeline_demo.live import run_live

        def live():
            run_live(
                settings,
                every=args.every,
                on_ready=lambda u: print(f"watch {url}?user={u}", flush=True),
                kafka=args.kafka,
            )

    serve_until_interrupted(server, live)
    return 0


if __name__ == "__main__":
    sys.exit(main())
