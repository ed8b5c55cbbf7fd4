"""Record validation: one JSON line in, one normalized record (dict) out, or `InvalidRecord` with the reason.

Normalization: `ts` becomes epoch milliseconds (int), whether given as an ISO-8601 string with a zone or as an
integer; fields a topic does not know are dropped.

Limits, the same for every topic and every source (a line of a file, a Kafka message, a captured row):
- a record holds at most `MAX_RECORD_BYTES` bytes, measured as its JSON line: the line as read, without its
  terminator, or for a record that comes as a value (a captured row), the compact JSON `orjson` makes of it.
  `validate` enforces it, so no source can pass a larger record (`RecordTooLarge`, with the size);
- `ts`, in either form, lies in [1970-01-01T00:00:00Z, 2100-01-01T00:00:00Z): `TS_MIN_MS` <= ts < `TS_END_MS`;
- an id is a string that is not empty, not only whitespace, and holds no ASCII control character
  (U+0000-U+001F, U+007F). Other string fields may hold any text.

Debezium change events on `profiles`: a JSON object with `op` c/u/r/d and `before`/`after` (with or without
Debezium's `{"schema":..,"payload":{..}}` wrapper) becomes the record the `cdc` job writes for the same change:
c/u/r an upsert of `after` (`user_id`, `name`, `country`), d a delete of `before`'s `user_id`. Its `ts` is
`after.updated_at` when present and not null -- an ISO-8601 string (Debezium's `ZonedTimestamp`, its default for
`timestamptz`) or an integer in the unit the schema names (`io.debezium.time.Timestamp` ms, `MicroTimestamp`
us, `NanoTimestamp` ns; microseconds without a schema) -- else the commit time: `source.ts_ms`, or the event's
`ts_ms` without it. A delete's `ts` is the commit time. Other ops (t, m) and events without the row are rejected.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from changelog.errors import InvalidRecord, RecordTooLarge

__all__ = [
    "MAX_RECORD_BYTES",
    "DEADLETTER_RAW_CHARS",
    "TS_MIN_MS",
    "TS_END_MS",
    "TOPIC_FIELDS",
    "check_record_size",
    "record_size",
    "dead_letter_raw",
    "parse_ts",
    "parse_line",
    "validate",
]

# The largest record accepted: the bytes of its JSON line, without the line terminator. Larger ones are rejected,
# never truncated.
MAX_RECORD_BYTES = 1_048_576
# A dead letter of a record over the maximum keeps this many characters of its line (`dead_letter_raw`).
DEADLETTER_RAW_CHARS = 1_000

TS_MIN_MS = 0  # 1970-01-01T00:00:00Z, the first valid `ts` (epoch ms)
TS_END_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z, the first `ts` past the valid range
_TS_RANGE = (
    "from 1970-01-01T00:00:00Z (0) up to, not including, 2100-01-01T00:00:00Z (4102444800000 epoch ms)"
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# field name -> (kind, required). kind: "id" (a string under the id rule above), "str" (any string), "ts".
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


def check_record_size(nbytes: int) -> None:
    """Raise `RecordTooLarge` if a record whose JSON line holds `nbytes` bytes (without its terminator) exceeds
    `MAX_RECORD_BYTES`."""
    if nbytes > MAX_RECORD_BYTES:
        raise RecordTooLarge(nbytes, MAX_RECORD_BYTES)


def dead_letter_raw(raw: bytes, size: int) -> str:
    """What a dead letter keeps of a rejected record whose JSON line is `raw` (at least its first bytes) and holds
    `size` bytes: the line as text, or for one over `MAX_RECORD_BYTES` only its first `DEADLETTER_RAW_CHARS`
    characters. The same for every source: a line of a file, a Kafka message, a captured row."""
    if size <= MAX_RECORD_BYTES:
        return raw[:size].decode("utf-8", "replace")
    return raw[: 4 * DEADLETTER_RAW_CHARS].decode("utf-8", "replace")[:DEADLETTER_RAW_CHARS]


def record_size(obj: Any) -> int:
    """The bytes of the JSON line of a record that comes as a value: the compact JSON orjson makes of it (what
    `mview ingest` reads back as the same record), without a line terminator."""
    try:
        return len(orjson.dumps(obj, default=str))
    except orjson.JSONEncodeError as e:  # e.g. an integer over 64 bits: no JSON line holds it as a number
        raise InvalidRecord(f"not representable as JSON: {e}") from None


def _in_range(ms: int, given: Any) -> int:
    if not TS_MIN_MS <= ms < TS_END_MS:
        raise InvalidRecord(f"field 'ts' out of range: {given!r}; it must lie {_TS_RANGE}")
    return ms


def parse_ts(value: Any) -> int:
    """Event time -> epoch milliseconds. Accepts an int (epoch ms) or an ISO-8601 string that carries a zone;
    either must lie in [`TS_MIN_MS`, `TS_END_MS`)."""
    if isinstance(value, bool):
        raise InvalidRecord(
            "field 'ts' must be an ISO-8601 string with zone or integer epoch milliseconds, got a boolean"
        )
    if isinstance(value, int):
        return _in_range(value, value)
    if isinstance(value, str):
        text = value.strip()
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidRecord(f"field 'ts' is not an ISO-8601 timestamp: {value!r}") from None
        if dt.tzinfo is None or dt.utcoffset() is None:
            raise InvalidRecord(f"field 'ts' has no zone (add Z or +hh:mm): {value!r}")
        return _in_range((dt - _EPOCH) // timedelta(milliseconds=1), value)
    raise InvalidRecord(
        f"field 'ts' must be an ISO-8601 string with zone or integer epoch milliseconds, got {type(value).__name__}"
    )


_DEBEZIUM_OPS = {"c": "upsert", "u": "upsert", "r": "upsert", "d": "delete", "t": None, "m": None}
_DEBEZIUM_TIME = {
    "io.debezium.time.Timestamp": 1,
    "io.debezium.time.MicroTimestamp": 1_000,
    "io.debezium.time.NanoTimestamp": 1_000_000,
}


def _debezium_unit(schema: Any) -> int:
    """Divisor from `after.updated_at`'s integer unit (as the wrapper's schema names it) to milliseconds."""
    try:
        after = next(f for f in schema["fields"] if f.get("field") == "after")
        col = next(f for f in after["fields"] if f.get("field") == "updated_at")
        return _DEBEZIUM_TIME[col["name"]]
    except (KeyError, TypeError, StopIteration):
        return 1_000


def _from_debezium(obj: dict) -> dict | None:
    """The `profiles` record of a Debezium change event (see the module's docstring), None if `obj` is not one."""
    schema = None
    if isinstance(obj.get("payload"), dict) and "schema" in obj:
        schema, obj = obj["schema"], obj["payload"]
    op = obj.get("op")
    if not isinstance(op, str) or op not in _DEBEZIUM_OPS or not ("before" in obj or "after" in obj):
        return None
    if _DEBEZIUM_OPS[op] is None:
        raise InvalidRecord(f"Debezium event with op {op!r} is not a row change (c, u, r or d)")
    side = "before" if op == "d" else "after"
    row = obj.get(side)
    if not isinstance(row, dict):
        raise InvalidRecord(f"Debezium event with op {op!r} has no {side!r} row")
    source = obj.get("source")
    commit = source.get("ts_ms") if isinstance(source, dict) else None
    commit = obj.get("ts_ms") if commit is None else commit
    if commit is None:
        raise InvalidRecord("Debezium event has neither source.ts_ms nor ts_ms (the commit time)")
    if op == "d":
        return {"op": "delete", "user_id": row.get("user_id"), "ts": commit}
    ts = row.get("updated_at")
    if isinstance(ts, int) and not isinstance(ts, bool):
        ts //= _debezium_unit(schema)
    fields = {k: row.get(k) for k in ("user_id", "name", "country")}
    return {"op": "upsert", **fields, "ts": commit if ts is None else ts}


def validate(topic: str, obj: Any, *, size: int | None = None) -> dict[str, Any]:
    """Check one record against `topic`'s record definition and return the normalized record.

    `obj` is the decoded JSON value, whatever its source. Its size is checked first, the same rule for every
    source: `size` is the bytes of the line it was decoded from (`parse_line` gives it), and without a line it is
    `record_size(obj)`; over `MAX_RECORD_BYTES` it is rejected with `RecordTooLarge`."""
    check_record_size(record_size(obj) if size is None else size)
    if not isinstance(obj, dict):
        raise InvalidRecord(f"not a JSON object but {type(obj).__name__}")
    if topic == "profiles" and obj.get("op") not in ("upsert", "delete"):
        obj = _from_debezium(obj) or obj
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
        else:
            if kind == "id":
                _check_id(name, v)
            out[name] = v
    return out


def _check_id(name: str, v: str) -> None:
    if not v:
        raise InvalidRecord(f"field {name!r} is empty")
    if v.isspace():
        raise InvalidRecord(f"field {name!r} is blank (only whitespace): {v!r}")
    if m := _CONTROL.search(v):
        raise InvalidRecord(
            f"field {name!r} contains the control character U+{ord(m.group()):04X} at position {m.start()}:"
            " ids must not contain U+0000-U+001F or U+007F"
        )


def _size(line: bytes | str) -> int:
    """Bytes of `line` without its line terminator (UTF-8 for a str)."""
    if isinstance(line, str):
        line = line.encode("utf-8", "surrogatepass")
    if line.endswith(b"\r\n"):
        return len(line) - 2
    return len(line) - 1 if line.endswith(b"\n") else len(line)


def parse_line(topic: str, line: bytes | str) -> dict[str, Any]:
    """Check one line's size, decode it with orjson and validate it. Raises `InvalidRecord` with the reason.

    A line terminator at its end is not part of the line: the verdict and reason of a line are the same with or
    without it (a line of a file, a Kafka message)."""
    size = _size(line)
    check_record_size(size)
    if isinstance(line, bytes):
        line = line[:size]
    elif line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise InvalidRecord(f"not valid JSON: {e}") from None
    return validate(topic, obj, size=size)
