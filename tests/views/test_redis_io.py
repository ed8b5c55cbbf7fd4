"""The waiting Redis client every job and sink uses: a command issued while Redis is down blocks, says so, and
completes once Redis is back, with nothing lost, or gives up when the process stops; interactive reads
(wait=False) fail at once with advice. Refused credentials and TLS on one side only are told apart from an
unreachable server and never waited for; no message shows a password."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time

import pytest

from jobs.dev.redis import free_port
from tests.jobs.opshelp import OwnRedis
from views.errors import RedisAuthFailed, RedisMisconfigured, RedisTLSMismatch, RedisUnavailable, redact
from views.redis_io import STOP, connect, probe, redact_url


def test_commands_wait_for_redis_and_complete_when_it_returns(tmp_path, capfd):
    own = OwnRedis(tmp_path / "redis").start()
    try:
        client = connect(own.url())
        client.set("before", 1)
        own.stop()
        with pytest.raises(RedisUnavailable, match="make redis"):
            connect(own.url(), wait=False)
        restart = threading.Timer(1.5, own.start)
        restart.start()
        pipe = client.pipeline(transaction=False)
        pipe.set("during", 2)
        pipe.zadd("z", {"a": 1})
        assert pipe.execute() == [True, 1]
        restart.join()
        assert client.mget("before", "during") == [b"1", b"2"]  # the AOF kept the write before the outage
        assert f"waiting for Redis at {own.url()} (attempt 1)" in capfd.readouterr().err
    finally:
        own.stop()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:s3cret@h:6380/2?ssl_cert_reqs=none", "rediss://user:***@h:6380/2?ssl_cert_reqs=none"),
        ("redis://:p@ss/w?rd#s3cret@h/0", "redis://:***@h/0"),  # unencoded "@", "/", "?", "#" in the password
        ("redis://user@h/0", "redis://user@h/0"),
        ("redis://h/1?password=s3cret&db=1", "redis://h/1?password=***&db=1"),
        ("redis://[::1:s3cret@h/0", "redis://[:***@h/0"),  # not a valid URL: still masked
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_redact_url_masks_the_password_and_keeps_the_rest(url, shown):
    assert redact_url(url) == shown
    assert "s3cret" not in redact(f"failed at {url}", url)
    assert redact("AUTH s3cret failed", "redis://:s3cret@h/0") == "AUTH *** failed"
    advice = str(RedisAuthFailed("redis://:s3cret@h/0", "WRONGPASS"))
    assert redact(advice) == advice and "redis://[USER]:PASSWORD@host" in advice  # the placeholder stays


@pytest.fixture
def protected(tmp_path):
    own = OwnRedis(tmp_path / "redis")
    own.password = "pw-S3cret"
    own.start()
    yield own
    own.stop()


def _in_thread(fn, timeout_s: float = 60.0, threads: list | None = None):
    """Run `fn` in a thread; (finished, its result or exception). A call that waits forever does not finish (the
    thread is appended to `threads` for the caller to wait for)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - the error is the result
            out["value"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    if threads is not None:
        threads.append(t)
    return not t.is_alive(), out.get("value")


def test_permanent_errors_are_classified_and_never_waited_for(protected, capfd):
    url = protected.url()
    wrong = url.replace("pw-S3cret", "wr0ng-pw")
    none = url.replace(":pw-S3cret@", "")
    tls = url.replace("redis://", "rediss://")
    assert connect(url).ping()
    for bad, kind, advice in [
        (wrong, RedisAuthFailed, "refused the credentials"),
        (none, RedisAuthFailed, "requires a password: put it in REDIS_URL as redis://:PASSWORD@"),
        (tls, RedisTLSMismatch, "use redis:// for a plain port"),
    ]:
        for wait in (True, False):  # a job's waiting client and the CLI's client alike
            finished, error = _in_thread(lambda bad=bad, wait=wait: connect(bad, wait=wait))
            assert finished, f"{redact_url(bad)}: still retrying a permanent error"
            assert isinstance(error, kind), repr(error)
            assert advice in str(error) and "\n" not in str(error)
            assert "S3cret" not in str(error) and "wr0ng" not in str(error)
            assert error.url == redact_url(bad)
        assert isinstance(probe(bad), kind)
    assert "waiting for Redis" not in capfd.readouterr().err
    protected.stop()
    error = probe(wrong)
    assert isinstance(error, RedisUnavailable) and "make redis" in str(error) and "wr0ng" not in str(error)


def test_a_waiting_call_gives_up_when_the_process_stops(protected, capfd):
    client = connect(protected.url())
    protected.stop()
    waiting: list[threading.Thread] = []
    try:
        finished, _ = _in_thread(client.ping, timeout_s=2.0, threads=waiting)
        assert not finished  # waits for Redis ...
        STOP.set()  # ... until the process stops
        finished, error = _in_thread(client.ping, timeout_s=30.0)
        waiting[0].join(30.0)  # the first call gives up too (else it would retry for the rest of the session)
        assert not waiting[0].is_alive()
    finally:
        STOP.clear()
    assert finished and isinstance(error, RedisUnavailable) and "stopping" in str(error)
    err = capfd.readouterr().err
    assert f"waiting for Redis at {redact_url(protected.url())} (attempt 1)" in err
    assert "S3cret" not in err


def _tls_redis(tmp_path):
    """A redis-server with TLS only, on a free port, with a self-signed certificate; skips without TLS support."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert]
        + ["-days", "2", "-subj", "/CN=localhost"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server"), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"]
        + [
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            cert,
            "--tls-auth-clients",
            "no",
        ]
        + ["--save", "", "--appendonly", "no", "--dir", tmp_path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        if proc.poll() is not None:
            pytest.skip("this redis-server has no TLS support")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port, cert
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    pytest.fail("the TLS redis-server did not start")


def test_plain_url_to_a_tls_port_says_use_rediss(tmp_path):
    proc, port, cert = _tls_redis(tmp_path)
    try:
        error = probe(f"redis://127.0.0.1:{port}/0")
        assert isinstance(error, RedisTLSMismatch) and "use rediss://" in str(error)
        assert connect(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}&ssl_check_hostname=false").ping()
        error = probe(f"rediss://127.0.0.1:{port}/0")  # a certificate nobody vouches for
        assert isinstance(error, RedisTLSMismatch) and "certificate verify failed" in str(error)
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_mode_is_read_from_the_server_and_redis_cluster_true_refuses_a_single_server(
    redis_server_url, redis_cluster
):
    from redis.cluster import RedisCluster

    from views.errors import RedisNotCluster
    from views.redis_io import connect

    assert isinstance(connect(redis_cluster["url"]), RedisCluster)
    assert isinstance(connect(redis_cluster["url"], cluster=True), RedisCluster)
    assert not isinstance(connect(redis_server_url), RedisCluster)
    with pytest.raises(RedisNotCluster, match="REDIS_CLUSTER=true .* is not a Redis Cluster node"):
        connect(redis_server_url, cluster=True)
    with pytest.raises(RedisMisconfigured, match="a cluster has only database 0"):
        connect(redis_cluster["url"].rsplit("/", 1)[0] + "/2")
