"""The pages' HTTP server answers only requests whose Host header names it: a page of another site that points its
own DNS name at 127.0.0.1 (DNS rebinding) is refused with 421 on every path, the page's own address answered."""

from __future__ import annotations

import http.client
import json

import pytest

from jobs.ops.httpd import page_server, serve_in_thread


def get(port: int, path: str, host: str | None) -> tuple[int, bytes]:
    """GET `path` from 127.0.0.1:`port` with exactly this Host header (None: no Host header at all)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def assert_refuses_other_hosts(port: int, path: str) -> bytes:
    """The server on `port` refuses `path` for a foreign or missing Host header (421, one short line, none of the
    page's data) and answers it for 127.0.0.1:PORT and localhost:PORT; returns what it answered."""
    for host in (
        f"evil.example:{port}",
        "evil.example",
        f"127.0.0.1.nip.io:{port}",
        f"127.0.0.1:{port + 1}",
        None,
    ):
        code, body = get(port, path, host)
        assert code == 421, (host, code, body[:200])
        assert body == f"misdirected request: use http://127.0.0.1:{port}/\n".encode(), body
    answers = [
        get(port, path, host) for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}")
    ]
    assert [code for code, _ in answers] == [200, 200, 200], answers
    return answers[0][1]


def test_a_foreign_host_header_is_refused_on_every_path(tmp_path):
    (tmp_path / "index.html").write_text("<p>page</p>")
    (tmp_path / "app.js").write_text("// js")
    server = serve_in_thread(
        page_server(tmp_path, ("app.js",), {"/api/x": lambda params: (200, {"x": 1})}, "127.0.0.1", 0), "t"
    )
    try:
        port = server.server_port
        assert assert_refuses_other_hosts(port, "/") == b"<p>page</p>"
        assert assert_refuses_other_hosts(port, "/app.js") == b"// js"
        assert json.loads(assert_refuses_other_hosts(port, "/api/x?y=1")) == {"x": 1}
        assert get(port, "/nothing", f"evil.example:{port}")[0] == 421  # no hint of what exists either
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("host", "bound", "ok"),
    [
        ("127.0.0.1:8764", ("127.0.0.1", 8764), True),
        ("localhost:8764", ("127.0.0.1", 8764), True),
        ("localhost:8765", ("127.0.0.1", 8764), False),
        ("[::1]:8764", ("127.0.0.1", 8764), False),
        ("[::1]:8764", ("::1", 8764), True),
        ("localhost:8764", ("::1", 8764), True),
        ("127.0.0.1:8764", ("::1", 8764), False),
        ("::1:8764", ("::1", 8764), False),  # unbracketed
        ("localhost", ("127.0.0.1", 80), True),  # port 80 may be left out
        ("localhost", ("127.0.0.1", 8764), False),
        ("192.0.2.7:8765", ("0.0.0.0", 8765), True),  # bound to every address: any address of the machine
        ("localhost:8765", ("0.0.0.0", 8765), True),
        ("myhost.lan:8765", ("0.0.0.0", 8765), False),  # a name: could be rebound
        ("192.0.2.7:8765", ("192.0.2.7", 8765), True),
        ("localhost:8765", ("192.0.2.7", 8765), False),
        ("evil.example:8764", ("127.0.0.1", 8764), False),
        ("localhost.:8764", ("127.0.0.1", 8764), False),
        ("user@127.0.0.1:8764", ("127.0.0.1", 8764), False),
        ("127.0.0.1:8764/x", ("127.0.0.1", 8764), False),
        ("", ("127.0.0.1", 8764), False),
        (None, ("127.0.0.1", 8764), False),
    ],
)
def test_which_host_headers_name_the_server(host, bound, ok):
    from jobs.ops.httpd import names_this_server

    assert names_this_server(host, bound) is ok
