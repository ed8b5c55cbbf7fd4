"""A small loopback HTTP server for the pages (the operations page, the demo's timeline page): static files of one
directory and JSON endpoints, standard library only, quiet (the pages poll). It answers only requests whose Host
header names it (`names_this_server`): a web page elsewhere that points its own DNS name at 127.0.0.1 (DNS
rebinding) gets 421 and none of the pages' data."""

from __future__ import annotations

import ipaddress
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

__all__ = ["page_server", "serve_in_thread", "serve_until_interrupted", "names_this_server"]

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
# An endpoint gets the query's parameters (first value of each) and returns (HTTP status, JSON body).
Endpoint = Callable[[dict[str, str]], tuple[int, dict]]
# A Host header: a name or IPv4 address, or an IPv6 address in brackets, and an optional port.
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>[0-9]{1,5}))?")


def names_this_server(host: str | None, address: tuple[str, int]) -> bool:
    """Whether the Host header `host` names the server bound at `address` (IP, port): the server's port (absent
    only for port 80), and as host `localhost` (when bound to a loopback address or to every address) or an IP
    address: the bound one (`127.0.0.1:8764`; `[::1]:8764` when bound to ::1), or any when bound to every address
    (0.0.0.0, ::). A DNS name never does, however it resolves: that is what DNS rebinding relies on. A missing or
    malformed header does not either."""
    m = _HOST.fullmatch(host.strip()) if host else None
    if m is None or int(m["port"] or 80) != address[1]:
        return False
    bound = ipaddress.ip_address(address[0])
    name = (m["v6"] or m["name"]).lower()
    if name == "localhost":
        return bound.is_loopback or bound.is_unspecified
    try:
        named = ipaddress.ip_address(name)
    except ValueError:  # a DNS name
        return False
    if (m["v6"] is not None) != (named.version == 6):  # an IPv6 address, and only one, is in brackets
        return False
    return bound.is_unspecified or named == bound


def page_server(static: Path, files: tuple[str, ...], api: dict[str, Endpoint], host: str, port: int):
    """An HTTP server (not started): `/` is `static/index.html`, `/<name>` one of `files` in `static`, and each
    path of `api` its endpoint's JSON. An endpoint that raises answers 503 with the error (the page polls again).
    A request whose Host header does not name the server (`names_this_server`) gets 421 Misdirected Request with a
    one-line body, whatever its path. Port 0 picks a free port."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            address = self.server.server_address[:2]
            if not names_this_server(self.headers.get("Host"), address):
                ip = ipaddress.ip_address(address[0])
                shown = "127.0.0.1" if ip.is_unspecified else f"[{ip}]" if ip.version == 6 else str(ip)
                body = f"misdirected request: use http://{shown}:{address[1]}/\n"
                return self._send(421, body.encode(), "text/plain; charset=utf-8")
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
