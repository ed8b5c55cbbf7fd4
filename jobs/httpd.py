"""A small loopback HTTP server for the pages (the operations page, the demo's timeline page): static files of one
directory and JSON endpoints, standard library only, quiet (the pages poll)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

__all__ = ["page_server", "serve_in_thread", "serve_until_interrupted"]

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
# An endpoint gets the query's parameters (first value of each) and returns (HTTP status, JSON body).
Endpoint = Callable[[dict[str, str]], tuple[int, dict]]


def page_server(static: Path, files: tuple[str, ...], api: dict[str, Endpoint], host: str, port: int):
    """An HTTP server (not started): `/` is `static/index.html`, `/<name>` one of `files` in `static`, and each
    path of `api` its endpoint's JSON. An endpoint that raises answers 503 with the error (the page polls again).
    Port 0 picks a free port."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            if url.path in api:
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                try:
                    code, body = api[url.path](params)
                except Exception as e:  # noqa: BLE001 - Redis down, the lake being written: say so
                    code, body = 503, {"error": str(e)}
                return self._send(code, json.dumps(body).encode(), "application/json")
            name = "index.html" if url.path in ("/", "/index.html") else url.path.lstrip("/")
            path = static / name
            if name not in ("index.html", *files) or not path.is_file():
                return self._send(404, b"not found", "text/plain")
            return self._send(200, path.read_bytes(), _TYPES[path.suffix])

        def log_message(self, fmt, *args) -> None:  # quiet: the pages poll
            pass

    return ThreadingHTTPServer((host, port), Handler)


def serve_in_thread(server: ThreadingHTTPServer, name: str) -> ThreadingHTTPServer:
    """Serve `server` from a daemon thread; `.shutdown()` stops it, `.server_port` is its port."""
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def serve_until_interrupted(server: ThreadingHTTPServer, wait: Callable[[], None] | None = None) -> None:
    """Run `wait()` (default: forever) until it returns or Ctrl-C, then shut `server` down."""
    try:
        (wait or threading.Event().wait)()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
