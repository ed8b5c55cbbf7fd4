"""The Redis key layout. Every key of one entity carries its id as a hash tag (`{u1}`), so all keys of one user
live in one Redis Cluster slot. `<g>` is the generation number of the job that owns the view.

| key | type | content |
|---|---|---|
| `mv:gen:<job>` | string | the job's current generation (readers follow it) |
| `mv:meta:<job>:<g>` | hash | last applied batch id, batch time, counters of the generation |
| `mv:timeline:<g>:{<user>}` | sorted set | member tweet_id, score ts (epoch ms); newest `TIMELINE_CAP` |
| `mv:tweet:<g>:{<tweet>}` | string | JSON `{"tweet_id","user_id","text","ts"}` of a live tweet |
"""

from __future__ import annotations

__all__ = ["gen_key", "meta_key", "view_key", "view_pattern", "key_id", "timeline_key", "tweet_key"]


def gen_key(job: str) -> str:
    return f"mv:gen:{job}"


def meta_key(job: str, generation: int) -> str:
    return f"mv:meta:{job}:{generation}"


def view_key(view: str, generation: int, key: str) -> str:
    return f"mv:{view}:{generation}:{{{key}}}"


def view_pattern(view: str, generation: int) -> str:
    return f"mv:{view}:{generation}:*"


def key_id(redis_key: str | bytes) -> str:
    """The entity id inside a view key: `mv:timeline:3:{u1}` -> `u1`."""
    if isinstance(redis_key, bytes):
        redis_key = redis_key.decode()
    start = redis_key.index("{")
    return redis_key[start + 1 : -1]


def timeline_key(generation: int, user_id: str) -> str:
    return view_key("timeline", generation, user_id)


def tweet_key(generation: int, tweet_id: str) -> str:
    return view_key("tweet", generation, tweet_id)
