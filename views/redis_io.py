"""Connecting to Redis and the generation pointer: one place for both, used by sinks and readers."""

from __future__ import annotations

import socket
import sys
import time

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from views.errors import RedisUnavailable
from views.keys import gen_key

__all__ = [
    "connect",
    "current_generation",
    "ensure_generation",
    "set_generation",
    "send_packed",
    "WaitingRetry",
]


class WaitingRetry(Retry):
    """Retry forever on connection errors, with exponential backoff (0.1 s doubling to 5 s), logging
    `waiting for Redis at URL (attempt n): error` to stderr (the job's log) at each failed attempt.

    Every command and pipeline of a client built with it blocks while Redis is unreachable and goes on when
    it returns. Sinks may therefore simply repeat a write: every sink write is idempotent or fenced.
    """

    def __init__(self, url: str):
        super().__init__(
            ExponentialBackoff(cap=5.0, base=0.1),
            -1,
            (redis.ConnectionError, redis.TimeoutError, socket.timeout, ConnectionRefusedError),
        )
        self.url = url

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        def logged(error, failures):
            print(
                f"[{time.strftime('%H:%M:%S')}] waiting for Redis at {self.url} (attempt {failures}): {error}",
                file=sys.stderr,
                flush=True,
            )
            return fail(error, failures) if with_failure_count else fail(error)

        return super().call_with_retry(do, logged, is_retryable, with_failure_count=True)


def connect(url: str, *, check: bool = True, wait: bool = True) -> redis.Redis:
    """A client for `url`.

    wait=True (jobs and sinks): every command waits for an unreachable Redis and retries with backoff, forever,
    saying so on stderr (`WaitingRetry`); `check` then waits until Redis answers.
    wait=False (interactive reads): with `check`, raises `RedisUnavailable` (with what to do) if nothing answers.
    """
    if wait:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=3, socket_keepalive=True, retry=WaitingRetry(url)
        )
        if check:
            client.ping()
        return client
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_keepalive=True)
    if check:
        try:
            client.ping()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            raise RedisUnavailable(url, e) from None
    return client


def current_generation(client: redis.Redis, job: str) -> int:
    """The job's serving generation, 0 if the job never published."""
    value = client.get(gen_key(job))
    return int(value) if value is not None else 0


def ensure_generation(client: redis.Redis, job: str) -> int:
    """The serving generation, set to 1 on first use (atomically: SET NX)."""
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
    `scripts` (a restarted Redis has none). Raises RuntimeError naming `what` and the first error any command
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
                raise RuntimeError(f"{what}: a command failed in Redis: {error}")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    client.get_retry().call_with_retry(attempt, lambda _e: None)
