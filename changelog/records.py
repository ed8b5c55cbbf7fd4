"""Record validation, derived from a topic's declaration (`spec.model.Topic`): one JSON line (or decoded value) in,
one normalized record (dict) out, or `InvalidRecord` with the reason. The one definition of a valid record: `mview
ingest`, the `kafka` job and the `cdc` job all judge a record here.

A valid record of a topic:
- is a JSON object; fields the topic does not declare are dropped;
- for a topic with `op: {upsert: U, remove: R}`, has a field `op` holding U or R (kept in the record as given);
  without `op:`, every record is an upsert (an event, or a table row) and a field `op` is just an undeclared one;
- an upsert (or an event) holds every declared field that is not `optional`; an optional field that is absent
  or null is null; a remove holds only the topic's key, its time and its `remove_fields` (the other fields are
  not kept);
- each field holds a value of its declared type:
  - `id`: a string that is not empty, not only whitespace, and holds no ASCII control character (U+0000-U+001F,
    U+007F);
  - `string`: any string;
  - `long`: an integer (not a boolean) in the 64-bit range;
  - `double`: a finite number (an integer or a float, not a boolean), stored as a float;
  - `boolean`: true or false;
  - `timestamp`: an ISO-8601 string with a zone (`Z`, `+02:00`; optional fraction) or an integer of epoch
    milliseconds, in [1970-01-01T00:00:00Z, 2100-01-01T00:00:00Z) (`TS_MIN_MS` <= ms < `TS_END_MS`), stored as
    epoch milliseconds.

A record holds at most `MAX_RECORD_BYTES` bytes, the same for every topic and every source (a line of a file, a
Kafka message, a captured row), measured as its JSON line: the line as read, without its terminator, or for a
record that comes as a value (a captured row), the compact JSON `orjson` makes of it. `validate` enforces it, so no
source can pass a larger record (`RecordTooLarge`, with the size).

A table topic with `capture` also accepts Debezium change events (`changelog.debezium`), turned into the record
the `cdc` job writes for the same change before they are judged by the same rules.

The reasons are the words a producer acts on (`missing field 'user_id'`, `unknown op 'edit' (one of post,
delete)`, `field 'ts' has no zone (add Z or +hh:mm): ...`); each names the field it is about.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from changelog.debezium import from_debezium
from changelog.errors import InvalidRecord, RecordTooLarge
from spec.model import Topic

__all__ = [
    "MAX_RECORD_BYTES",
    "DEADLETTER_RAW_CHARS",
    "TS_MIN_MS",
    "TS_END_MS",
    "check_record_size",
    "record_size",
    "dead_letter_raw",
    "parse_ts",
    "parse_line",
    "line_parser",
    "validate",
]

# The largest record accepted: the bytes of its JSON line, without the line terminator. Larger ones are rejected,
# never truncated.
MAX_RECORD_BYTES = 1_048_576
# A dead letter of a record over the maximum keeps this many characters of its line (`dead_letter_raw`).
DEADLETTER_RAW_CHARS = 1_000

TS_MIN_MS = 0  # 1970-01-01T00:00:00Z, the first valid timestamp (epoch ms)
TS_END_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z, the first timestamp past the valid range
_TS_RANGE = (
    "from 1970-01-01T00:00:00Z (0) up to, not including, 2100-01-01T00:00:00Z (4102444800000 epoch ms)"
)
_LONG_MIN, _LONG_END = -(2**63), 2**63

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
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


def _in_range(ms: int, given: Any, name: str) -> int:
    if not TS_MIN_MS <= ms < TS_END_MS:
        raise InvalidRecord(f"field {name!r} out of range: {given!r}; it must lie {_TS_RANGE}")
    return ms


def parse_ts(value: Any, name: str = "ts") -> int:
    """A timestamp field's value -> epoch milliseconds. Accepts an int (epoch ms) or an ISO-8601 string that
    carries a zone; either must lie in [`TS_MIN_MS`, `TS_END_MS`). `name` is the field's, for the reason."""
    if isinstance(value, bool):
        raise InvalidRecord(
            f"field {name!r} must be an ISO-8601 string with zone or integer epoch milliseconds, got a boolean"
        )
    if isinstance(value, int):
        return _in_range(value, value, name)
    if isinstance(value, str):
        text = value.strip()
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidRecord(f"field {name!r} is not an ISO-8601 timestamp: {value!r}") from None
        if dt.tzinfo is None or dt.utcoffset() is None:
            raise InvalidRecord(f"field {name!r} has no zone (add Z or +hh:mm): {value!r}")
        return _in_range((dt - _EPOCH) // timedelta(milliseconds=1), value, name)
    raise InvalidRecord(
        f"field {name!r} must be an ISO-8601 string with zone or integer epoch milliseconds, got"
        f" {type(value).__name__}"
    )


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


# A field's check, by declared type: the normalized value of a non-null `v`, or InvalidRecord.
def _as_id(name: str, v: Any) -> str:
    if type(v) is not str:
        raise InvalidRecord(f"field {name!r} must be a string, got {type(v).__name__}")
    if not v or v.isspace() or _CONTROL.search(v):
        _check_id(name, v)
    return v


def _as_string(name: str, v: Any) -> str:
    if type(v) is not str:
        raise InvalidRecord(f"field {name!r} must be a string, got {type(v).__name__}")
    return v


def _as_long(name: str, v: Any) -> int:
    if type(v) is not int:
        raise InvalidRecord(f"field {name!r} must be an integer, got {type(v).__name__}")
    if not _LONG_MIN <= v < _LONG_END:
        raise InvalidRecord(f"field {name!r} is out of the 64-bit integer range: {v}")
    return v


def _as_double(name: str, v: Any) -> float:
    kind = type(v)
    if kind is float:
        if not math.isfinite(v):
            raise InvalidRecord(f"field {name!r} must be a finite number, got {v!r}")
        return v
    if kind is int:
        return float(v)
    raise InvalidRecord(f"field {name!r} must be a number, got {kind.__name__}")


def _as_boolean(name: str, v: Any) -> bool:
    if type(v) is not bool:
        raise InvalidRecord(f"field {name!r} must be true or false, got {type(v).__name__}")
    return v


def _as_timestamp(name: str, v: Any) -> int:
    return parse_ts(v, name)


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "id": _as_id,
    "string": _as_string,
    "long": _as_long,
    "double": _as_double,
    "boolean": _as_boolean,
    "timestamp": _as_timestamp,
}

# (name, check, required) of each field a record keeps, in declared order
_Fields = tuple[tuple[str, Callable[[str, Any], Any], bool], ...]


class _Rules:
    """A topic's record rules, compiled once: the fields of an upsert (or event) and of a remove."""

    __slots__ = ("topic", "op", "upsert", "remove", "ops_text", "debezium")

    def __init__(self, topic: Topic):
        self.topic = topic
        self.op = topic.op
        self.upsert: _Fields = tuple((n, _CHECKS[t], n not in topic.optional) for n, t in topic.fields)
        kept = set(topic.identity) | {topic.time} | set(topic.remove_fields)
        self.remove: _Fields = tuple((n, _CHECKS[t], True) for n, t in topic.fields if n in kept)
        self.ops_text = ", ".join(topic.op) if topic.op else ""
        self.debezium = topic.capture is not None and topic.kind == "table"


_RULES: dict[
    int, _Rules
] = {}  # id(topic) -> its rules (the topic object is kept in them, so the id stays its own)


def _rules(topic: Topic) -> _Rules:
    rules = _RULES.get(id(topic))
    if rules is None or rules.topic is not topic:
        if not isinstance(topic, Topic):
            raise TypeError(f"a record is validated against a spec.model.Topic, not {type(topic).__name__}")
        if len(_RULES) > 256:  # topics of pipelines loaded and dropped by a long-lived process
            _RULES.clear()
        rules = _RULES[id(topic)] = _Rules(topic)
    return rules


def _judge(rules: _Rules, obj: Any) -> dict[str, Any]:
    """`obj` (size already checked) as a record of the rules' topic, or InvalidRecord."""
    if type(obj) is not dict:
        raise InvalidRecord(f"not a JSON object but {type(obj).__name__}")
    op = rules.op
    if op is None:
        out: dict[str, Any] = {}
        fields = rules.upsert
        if rules.debezium and "op" in obj and (record := from_debezium(rules.topic, obj)) is not None:
            obj = record
    else:
        given = obj.get("op")
        if given != op[0] and given != op[1] and rules.debezium:
            record = from_debezium(rules.topic, obj)
            if record is not None:
                obj, given = record, record["op"]
        if given == op[0]:
            fields = rules.upsert
        elif given == op[1]:
            fields = rules.remove
        elif given is None:
            raise InvalidRecord(f"missing field 'op' (one of {rules.ops_text})")
        else:
            raise InvalidRecord(f"unknown op {given!r} (one of {rules.ops_text})")
        out = {"op": given}
    get = obj.get
    for name, check, required in fields:
        v = get(name)
        if v is None:
            if required:
                raise InvalidRecord(f"missing field {name!r}")
            out[name] = None
        else:
            out[name] = check(name, v)
    return out


def validate(topic: Topic, obj: Any, *, size: int | None = None) -> dict[str, Any]:
    """Check one record against `topic`'s declaration (module docstring) and return the normalized record.

    `obj` is the decoded JSON value, whatever its source. Its size is checked first, the same rule for every
    source: `size` is the bytes of the line it was decoded from (`parse_line` gives it), and without a line it is
    `record_size(obj)`; over `MAX_RECORD_BYTES` it is rejected with `RecordTooLarge`."""
    rules = _rules(topic)
    check_record_size(record_size(obj) if size is None else size)
    return _judge(rules, obj)


def _size(line: bytes | str) -> int:
    """Bytes of `line` without its line terminator (UTF-8 for a str)."""
    if isinstance(line, str):
        line = line.encode("utf-8", "surrogatepass")
    if line.endswith(b"\r\n"):
        return len(line) - 2
    return len(line) - 1 if line.endswith(b"\n") else len(line)


def line_parser(topic: Topic) -> Callable[[bytes | str], dict[str, Any]]:
    """`parse_line` bound to `topic`: for a source that judges many lines of one topic (its rules are looked up
    once)."""
    rules = _rules(topic)
    loads, decode_error = orjson.loads, orjson.JSONDecodeError

    def parse(line: bytes | str) -> dict[str, Any]:
        size = _size(line)
        check_record_size(size)
        if isinstance(line, bytes):
            line = line[:size]
        elif line.endswith("\n"):
            line = line[:-2] if line.endswith("\r\n") else line[:-1]
        try:
            obj = loads(line)
        except decode_error as e:
            raise InvalidRecord(f"not valid JSON: {e}") from None
        return _judge(rules, obj)

    return parse


def parse_line(topic: Topic, line: bytes | str) -> dict[str, Any]:
    """Check one line's size, decode it with orjson and validate it against `topic`. Raises `InvalidRecord` with
    the reason.

    A line terminator at its end is not part of the line: the verdict and reason of a line are the same with or
    without it (a line of a file, a Kafka message)."""
    return line_parser(topic)(line)
