"""Record validation: one JSON line in, one normalized record (dict) out, or `InvalidRecord` with the reason.

Normalization: `ts` becomes epoch milliseconds (int), whether given as an ISO-8601 string with a zone or as an
integer; fields a topic does not know are dropped. Ids must be non-empty strings.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from changelog.errors import InvalidRecord

__all__ = ["TOPIC_FIELDS", "parse_ts", "parse_line", "validate"]

# field name -> (kind, required). kind: "id" (non-empty string), "str" (string), "ts".
_F = dict[str, tuple[str, bool]]

# Per topic: the allowed `op` values (None = topic has no op) and the fields per op.
TOPIC_FIELDS: dict[str, dict[str | None, _F]] = {
    "tweets": {
        "post": {
            "tweet_id": ("id", True),
            "user_id": ("id", True),
            "text": ("str", True),
            "ts": ("ts", True),
        },
        "delete": {"tweet_id": ("id", True), "user_id": ("id", True), "ts": ("ts", True)},
    },
    "follows": {
        op: {"follower_id": ("id", True), "followee_id": ("id", True), "ts": ("ts", True)}
        for op in ("follow", "unfollow")
    },
    "searches": {
        None: {
            "search_id": ("id", True),
            "session_id": ("id", True),
            "query": ("str", True),
            "ts": ("ts", True),
        }
    },
    "clicks": {
        None: {
            "click_id": ("id", True),
            "session_id": ("id", True),
            "url": ("str", True),
            "ts": ("ts", True),
            "search_id": ("id", False),
        }
    },
    "activity": {
        None: {
            "event_id": ("id", True),
            "user_id": ("id", True),
            "action": ("str", True),
            "ts": ("ts", True),
            "profile_version": ("id", False),
        }
    },
    "profiles": {
        "upsert": {
            "user_id": ("id", True),
            "name": ("str", True),
            "country": ("str", True),
            "ts": ("ts", True),
        },
        "delete": {"user_id": ("id", True), "ts": ("ts", True)},
    },
}

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_MS_MIN = -62_135_596_800_000  # 0001-01-01
_EPOCH_MS_MAX = 253_402_300_799_999  # 9999-12-31


def parse_ts(value: Any) -> int:
    """Event time -> epoch milliseconds. Accepts an int (epoch ms) or an ISO-8601 string that carries a zone."""
    if isinstance(value, bool):
        raise InvalidRecord(
            "field 'ts' must be an ISO-8601 string with zone or integer epoch milliseconds, got a boolean"
        )
    if isinstance(value, int):
        if not _EPOCH_MS_MIN <= value <= _EPOCH_MS_MAX:
            raise InvalidRecord(f"field 'ts' out of range: {value}")
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidRecord(f"field 'ts' is not an ISO-8601 timestamp: {value!r}") from None
        if dt.tzinfo is None or dt.utcoffset() is None:
            raise InvalidRecord(f"field 'ts' has no zone (add Z or +hh:mm): {value!r}")
        return (dt - _EPOCH) // timedelta(milliseconds=1)
    raise InvalidRecord(
        f"field 'ts' must be an ISO-8601 string with zone or integer epoch milliseconds, got {type(value).__name__}"
    )


def validate(topic: str, obj: Any) -> dict[str, Any]:
    """Check one decoded JSON value against `topic`'s record definition and return the normalized record."""
    if not isinstance(obj, dict):
        raise InvalidRecord(f"not a JSON object but {type(obj).__name__}")
    ops = TOPIC_FIELDS[topic]
    out: dict[str, Any] = {}
    if None in ops:
        fields = ops[None]
    else:
        op = obj.get("op")
        if op is None:
            raise InvalidRecord(f"missing field 'op' (one of {', '.join(ops)})")
        if not isinstance(op, str) or op not in ops:
            raise InvalidRecord(f"unknown op {op!r} (one of {', '.join(ops)})")
        fields = ops[op]
        out["op"] = op
    for name, (kind, required) in fields.items():
        v = obj.get(name)
        if v is None:
            if required:
                raise InvalidRecord(f"missing field {name!r}")
            out[name] = None
            continue
        if kind == "ts":
            out[name] = parse_ts(v)
        elif not isinstance(v, str):
            raise InvalidRecord(f"field {name!r} must be a string, got {type(v).__name__}")
        elif kind == "id" and not v:
            raise InvalidRecord(f"field {name!r} is empty")
        else:
            out[name] = v
    return out


def parse_line(topic: str, line: bytes | str) -> dict[str, Any]:
    """Decode one JSON line with orjson and validate it. Raises `InvalidRecord` with the reason."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise InvalidRecord(f"not valid JSON: {e}") from None
    return validate(topic, obj)
