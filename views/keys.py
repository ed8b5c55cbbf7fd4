"""The Redis key layout. Every key of one entity carries its id as a hash tag (`{u1}`), so all keys of one user
live in one Redis Cluster slot. `<g>` is the generation number of the job that owns the view.

Inside the braces an id is written with `%`, `{` and `}` percent-encoded (`%25`, `%7B`, `%7D`), so every id, one
that contains or starts with a brace too, is exactly the hash tag of its keys (Redis hashes the text between the
first `{` and the next `}`), and `key_id` reads it back unchanged.

| key | type | content |
|---|---|---|
| `mv:gen:<job>` | string | the job's current generation (readers follow it) |
| `mv:meta:<job>:<g>` | hash | last applied batch id, batch time, counters of the generation |
| `mv:timeline:<g>:{<user>}` | sorted set | member tweet_id, score ts (epoch ms); newest `TIMELINE_CAP` |
| `mv:tweet:<g>:{<tweet>}` | string | JSON `{"tweet_id","user_id","text","ts"}` of a live tweet |
| `mv:authored:<g>:{<author>}` | sorted set | a celebrity's (`FANOUT_LIMIT`) newest `TIMELINE_CAP` live tweets: member tweet_id, score ts |
| `mv:celebs:<g>:{<user>}` | set | the celebrities the user currently follows (their tweets are merged in at read time) |
"""

from __future__ import annotations

__all__ = [
    "gen_key",
    "meta_key",
    "view_key",
    "view_pattern",
    "key_id",
    "encode_id",
    "decode_id",
    "timeline_key",
    "tweet_key",
    "authored_key",
    "celebs_key",
]

# `%` first when encoding and last when decoding, so an id holding the text "%7D" survives both ways.
_ESCAPES = (("%", "%25"), ("{", "%7B"), ("}", "%7D"))


def encode_id(ident: str) -> str:
    """An entity id as written inside a key's hash tag: `%`, `{`, `}` percent-encoded."""
    for raw, enc in _ESCAPES:
        ident = ident.replace(raw, enc)
    return ident


def decode_id(text: str) -> str:
    """The inverse of `encode_id`."""
    for raw, enc in reversed(_ESCAPES):
        text = text.replace(enc, raw)
    return text


def gen_key(job: str) -> str:
    return f"mv:gen:{job}"


def meta_key(job: str, generation: int) -> str:
    return f"mv:meta:{job}:{generation}"


def view_key(view: str, generation: int, key: str) -> str:
    return f"mv:{view}:{generation}:{{{encode_id(key)}}}"


def view_pattern(view: str, generation: int) -> str:
    return f"mv:{view}:{generation}:*"


def key_id(redis_key: str | bytes) -> str:
    """The entity id inside a view key: `mv:timeline:3:{u1}` -> `u1`."""
    if isinstance(redis_key, bytes):
        redis_key = redis_key.decode()
    start = redis_key.index("{")
    return decode_id(redis_key[start + 1 : -1])


def timeline_key(generation: int, user_id: str) -> str:
    return view_key("timeline", generation, user_id)


def tweet_key(generation: int, tweet_id: str) -> str:
    return view_key("tweet", generation, tweet_id)


def authored_key(generation: int, author: str) -> str:
    return view_key("authored", generation, author)


def celebs_key(generation: int, user_id: str) -> str:
    return view_key("celebs", generation, user_id)
