"""Connecting to Redis and the generation pointer: one place for both, used by sinks and readers."""

from __future__ import annotations

import redis

from views.errors import RedisUnavailable
from views.keys import gen_key

__all__ = ["connect", "current_generation", "ensure_generation", "set_generation"]


def connect(url: str, *, check: bool = True) -> redis.Redis:
    """A client for `url`; with `check`, raises `RedisUnavailable` (with what to do) if nothing answers."""
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
