"""Connecting to Redis and the generation pointer: one place for both, used by sinks and readers.

Connection failures are classified (`classify`): a server that does not answer is `RedisUnavailable` (jobs
wait for it); credentials it refuses (`RedisAuthFailed`) and TLS on one side only (`RedisTLSMismatch`) are
`RedisMisconfigured`, permanent: nothing waits for them. Every message shows the URL without its password.
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
import time

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from views.errors import (
    RedisAuthFailed,
    RedisCommandFailed,
    RedisMisconfigured,
    RedisTLSMismatch,
    RedisUnavailable,
    ViewError,
    redact,
    redact_url,
)
from views.keys import gen_key

__all__ = [
    "connect",
    "quick_client",
    "probe",
    "classify",
    "redact_url",
    "STOP",
    "TLS_HANDSHAKE_S",
    "current_generation",
    "ensure_generation",
    "set_generation",
    "send_packed",
    "WaitingRetry",
]

# Set when this process is stopping (a deployed job's SIGTERM: `jobs.runtime.STOP` is this event): a
# `WaitingRetry` then stops waiting and raises `RedisUnavailable`.
STOP = threading.Event()

# A TLS server answers a ClientHello at once; a plain Redis port never does. Longer than this: not TLS.
TLS_HANDSHAKE_S = 2.0

_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, socket.timeout, ConnectionRefusedError)


class _TLSConnection(redis.SSLConnection):
    """An SSL connection whose handshake gives up after TLS_HANDSHAKE_S (a plain port never answers it)."""

    def _wrap_socket_with_ssl(self, sock):
        sock.settimeout(TLS_HANDSHAKE_S)
        try:
            wrapped = super()._wrap_socket_with_ssl(sock)
        except TimeoutError as e:
            raise ssl.SSLError(f"no TLS handshake answer within {TLS_HANDSHAKE_S:g} s") from e
        wrapped.settimeout(self.socket_timeout)
        return wrapped


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _speaks_tls(url: str) -> bool:
    """Whether the server of a redis:// `url` completes a TLS handshake (it reset a plain connection)."""
    try:
        pool = redis.ConnectionPool.from_url(url)
        host, port = pool.connection_kwargs.get("host"), pool.connection_kwargs.get("port", 6379)
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection((host, port), timeout=TLS_HANDSHAKE_S) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                return True
    except (OSError, ValueError):
        return False


def classify(url: str, error: BaseException) -> ViewError:
    """The error to report for a failure to talk to Redis at `url`: `RedisAuthFailed` or `RedisTLSMismatch`
    (permanent) or `RedisUnavailable` (possibly temporary). The messages show `url` redacted."""
    if isinstance(error, ViewError):
        return error
    chain = list(_chain(error))
    if any(isinstance(e, ssl.SSLError) for e in chain):
        tls = next(e for e in chain if isinstance(e, ssl.SSLError))
        return RedisTLSMismatch(url, tls.args[0] if len(tls.args) == 1 else tls)
    text = " ".join(str(e) for e in chain)
    if isinstance(error, redis.AuthenticationError) or any(
        word in text for word in ("NOAUTH", "WRONGPASS", "invalid username-password", "must be called with")
    ):
        return RedisAuthFailed(url, error)
    plain = not str(url).lower().startswith(("rediss://", "unix://"))
    reset = any(isinstance(e, (ConnectionResetError, BrokenPipeError)) for e in chain) or (
        "Connection closed by server" in text
    )
    if plain and reset and _speaks_tls(url):
        return RedisTLSMismatch(url, error)
    return RedisUnavailable(url, error)


class WaitingRetry(Retry):
    """Retry on connection errors with exponential backoff (0.1 s doubling to 5 s), logging
    `waiting for Redis at URL (attempt n): error` (URL redacted) to stderr (the job's log) at each failed
    attempt, until Redis answers or `STOP` is set (then `RedisUnavailable`). Permanent errors (refused
    credentials, TLS mismatch: `RedisMisconfigured`) are raised at once, never retried.

    Every command and pipeline of a client built with it blocks while Redis is unreachable and goes on when
    it returns. Sinks may therefore simply repeat a write: every sink write is idempotent or fenced.
    """

    def __init__(self, url: str):
        super().__init__(ExponentialBackoff(cap=5.0, base=0.1), -1, _TRANSIENT)
        self.url = url

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        self._backoff.reset()
        failures = 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if is_retryable and not is_retryable(error):
                    raise
                failures += 1
                fail(error, failures) if with_failure_count else fail(error)
                problem = classify(self.url, error)
                if isinstance(problem, RedisMisconfigured):
                    raise problem from None
                if STOP.is_set():
                    raise RedisUnavailable(
                        self.url, f"{error}; not waiting: this process is stopping"
                    ) from None
                print(
                    f"[{time.strftime('%H:%M:%S')}] waiting for Redis at {redact_url(self.url)} "
                    f"(attempt {failures}): {redact(error, self.url)}",
                    file=sys.stderr,
                    flush=True,
                )
                STOP.wait(self._backoff.compute(failures))


def _options(url: str) -> dict:
    return {"connection_class": _TLSConnection} if str(url).lower().startswith("rediss://") else {}


def connect(url: str, *, check: bool = True, wait: bool = True) -> redis.Redis:
    """A client for `url`.

    wait=True (jobs and sinks): every command waits for an unreachable Redis and retries with backoff until it
    answers or the process stops, saying so on stderr (`WaitingRetry`); `check` then waits until Redis answers.
    wait=False (interactive reads): with `check`, raises at once if Redis cannot be used. Either way a
    permanent problem raises `RedisAuthFailed` or `RedisTLSMismatch` at once (one line, saying what to do).
    """
    if wait:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=3, socket_keepalive=True, retry=WaitingRetry(url), **_options(url)
        )
        if check:
            client.ping()
        return client
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_keepalive=True, **_options(url))
    if check:
        try:
            client.ping()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            raise classify(url, e) from None
    return client


def quick_client(url: str) -> redis.Redis:
    """A client that fails at once (no retry, 1 s to connect, 2 s per reply): for watchers and probes."""
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2, retry=None, **_options(url))


def probe(url: str, client: redis.Redis | None = None) -> ViewError | None:
    """None if Redis at `url` answers a PING now, else what is wrong (`classify`). Never waits."""
    try:
        (client or quick_client(url)).ping()
        return None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        return classify(url, e)


def current_generation(client: redis.Redis, job: str) -> int:
    """The job's serving generation, 0 if the job never published."""
    value = client.get(gen_key(job))
    return int(value) if value is not None else 0


def ensure_generation(client: redis.Redis, job: str) -> int:
    """The serving generation, set to 1 on first use (atomically: SET NX).

    A missing pointer means "never published" only if Redis kept its data: jobs call it only after
    `jobs.generations.serving_copy_lost` found nothing lost (via `jobs.replay.serving_or_rebuild`), so a Redis
    that lost the pointer gets a rebuilt generation, not an empty generation 1."""
    client.set(gen_key(job), 1, nx=True)
    return current_generation(client, job)


def set_generation(client: redis.Redis, job: str, generation: int) -> None:
    client.set(gen_key(job), generation)


def _failure(reply):
    """The first error in a reply (an error inside a MULTI/EXEC reply counts), or None."""
    if isinstance(reply, Exception):
        return reply
    if isinstance(reply, list):
        return next((x for x in reply if isinstance(x, Exception)), None)
    return None


def send_packed(
    client: redis.Redis, payload: bytes, n: int, *, scripts: tuple[str, ...] = (), what: str
) -> None:
    """Send `payload` (`n` commands already in the wire protocol) pipelined and read its `n` replies, after loading
    `scripts` (a restarted Redis has none). Raises RedisCommandFailed naming `what` and the first error any command
    returned (every reply is read first, so the connection stays usable). Retried as a whole on a connection error
    (`WaitingRetry`): callers send only idempotent or fenced commands, so a repeat is harmless."""
    pool = client.connection_pool

    def attempt():
        conn = pool.get_connection()
        try:
            for script in scripts:
                conn.send_command("SCRIPT", "LOAD", script)
            conn.send_packed_command([payload], check_health=False)
            for _ in scripts:
                conn.read_response()
            error = None
            for _ in range(n):
                try:
                    reply = conn.read_response()
                except redis.ResponseError as e:
                    reply = e
                error = error or _failure(reply)
            if error is not None:
                raise RedisCommandFailed(what, str(error))
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    client.get_retry().call_with_retry(attempt, lambda _e: None)
