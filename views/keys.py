"""The Redis key layout. Every key of one entity carries its id as a hash tag (`{u1}`), so all keys of one user
live in one Redis Cluster slot. `<g>` is the generation number of the job that owns the view.

Inside the braces an id is written with `%`, `{` and `}` percent-encoded (`%25`, `%7B`, `%7D`), so every id, one
that contains or starts with a brace too, is exactly the hash tag of its keys (Redis hashes the text between the
first `{` and the next `}`), and `key_id` reads it back unchanged.

| key | type | content |
|---|---|---|
| `mv:gen:<job>` | string | the job's current generation (readers follow it) |
| `mv:meta:<job>:<g>` | hash | last applied batch id, batch time, counters of the generation |
| `mv:<view>:<g>:{<key>}` | sorted set | a list view's key: member the entry id, score the order value; the first `cap` |
| `mv:<view>:<g>:{<key>}` | string | an agg view's key: its export line (JSON), absent when the key has no live row |
| `mv:<view>.entry:<g>:{<entry>}` | string | JSON of a list view's `fields` of a live entry |
| `mv:<view>.heavy:<g>:{<value>}` | sorted set | a heavy match value's (fan-out limit) first `cap` entries: member the entry id, score the order value |
| `mv:<view>.reads:<g>:{<key>}` | set | the heavy match values a list key reads (their entries are merged in at read time) |
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
    "list_key",
    "entry_key",
    "heavy_key",
    "reads_key",
    "ENTRY",
    "HEAVY",
    "READS",
    "WINDOW",
    "window_key",
    "extra_keys",
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


# A list view's other keys are `mv:<view>.<part>:<g>:{<id>}`, part one of these (the design's names).
ENTRY, HEAVY, READS = "entry", "heavy", "reads"
WINDOW = "window"  # a windowed list's window of a list key: `{"<key name>", "window_start", "window_end", "final"}`


def list_key(view: str, generation: int, key: str) -> str:
    """A list view's sorted set of list key `key`."""
    return view_key(view, generation, key)


def entry_key(view: str, generation: int, entry: str) -> str:
    """A list view's body of entry `entry` (the JSON of its fields)."""
    return view_key(f"{view}.{ENTRY}", generation, entry)


def window_key(view: str, generation: int, key: str) -> str:
    """A windowed list view's window of list key `key` (JSON: the view's key, the window's bounds, `final`)."""
    return view_key(f"{view}.{WINDOW}", generation, key)


def heavy_key(view: str, generation: int, value: str) -> str:
    """A list view's entries of heavy match value `value` (a fan-out limit)."""
    return view_key(f"{view}.{HEAVY}", generation, value)


def reads_key(view: str, generation: int, key: str) -> str:
    """A list view's set of the heavy match values list key `key` reads (`mv:<view>.reads:<g>:{<key>}`)."""
    return view_key(f"{view}.{READS}", generation, key)


def extra_keys(views) -> tuple[str, ...]:
    """The names, besides the views' own, under which `views` keep Redis keys (`<name>:<g>:{...}`): each list view's
    `.entry`, `.heavy`, `.reads` and `.window` keys."""
    return tuple(
        f"{v.name}.{part}" for v in views if v.kind == "list" for part in (ENTRY, HEAVY, READS, WINDOW)
    )
