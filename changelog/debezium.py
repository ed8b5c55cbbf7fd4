"""Debezium change events as records: any table topic with `capture` accepts the events Debezium's PostgreSQL
connector makes of the captured table, as JSON with or without the `{"schema":..,"payload":{..}}` wrapper, and
stores the record the `cdc` job writes for the same change.

- `op` c (insert), u (update), r (a snapshot read): an upsert of `after`; d: a remove of `before`'s key (with the
  topic's `remove_fields`, when `before` holds them). Other ops (t, m) and events without their row are rejected.
- Fields by name: each field of the topic is the row's column of the same name, or the one `capture.columns`
  names (`Capture.column`).
- The time field of an upsert is its column when present and not null, else the commit time; a remove's time is
  the commit time. The commit time is `source.ts_ms`, or the event's `ts_ms` without a source.
- A timestamp column is an ISO-8601 string (`ZonedTimestamp`, Debezium's default for `timestamptz`) or an integer
  in the unit the wrapper's schema names for the column (`io.debezium.time.Timestamp` ms, `MicroTimestamp` us,
  `NanoTimestamp` ns; a column the schema names no time type for: epoch ms); without a schema an integer is in
  microseconds (`MicroTimestamp`, Debezium's default for `timestamp`).

The record is then judged by the topic's rules (`changelog.records`), as any other.
"""

from __future__ import annotations

from typing import Any

from changelog.errors import InvalidRecord
from spec.model import Topic

__all__ = ["from_debezium", "DEBEZIUM_OPS"]

# Debezium's op -> the kind of record it makes (None: not a row change)
DEBEZIUM_OPS: dict[str, str | None] = {
    "c": "upsert",
    "u": "upsert",
    "r": "upsert",
    "d": "remove",
    "t": None,
    "m": None,
}
_TIME_UNITS = {  # Debezium's integer time types -> the divisor to epoch ms
    "io.debezium.time.Timestamp": 1,
    "io.debezium.time.MicroTimestamp": 1_000,
    "io.debezium.time.NanoTimestamp": 1_000_000,
}
_WITHOUT_SCHEMA = 1_000  # an integer timestamp of an event without its schema: microseconds


def _unit(schema: Any, side: str, column: str) -> int:
    """Divisor from `column`'s integer time unit (as the wrapper's `schema` names it for the row `side`) to ms."""
    if schema is None:
        return _WITHOUT_SCHEMA
    try:
        row = next(f for f in schema["fields"] if f.get("field") == side)
        col = next(f for f in row["fields"] if f.get("field") == column)
    except (KeyError, TypeError, AttributeError, StopIteration):
        return _WITHOUT_SCHEMA
    return _TIME_UNITS.get(col.get("name"), 1) if isinstance(col, dict) else _WITHOUT_SCHEMA


def from_debezium(topic: Topic, obj: dict) -> dict | None:
    """The record of `topic` (a table topic with `capture`) for the Debezium change event `obj` (module
    docstring), not yet validated; None if `obj` is not a Debezium change event. Raises `InvalidRecord` for an
    event that is one but makes no record (an op that is no row change, a missing row or commit time, a delete on
    a topic without removes)."""
    schema = None
    if isinstance(obj.get("payload"), dict) and "schema" in obj:
        schema, obj = obj["schema"], obj["payload"]
    op = obj.get("op")
    if not isinstance(op, str) or op not in DEBEZIUM_OPS or not ("before" in obj or "after" in obj):
        return None
    kind = DEBEZIUM_OPS[op]
    if kind is None:
        raise InvalidRecord(f"Debezium event with op {op!r} is not a row change (c, u, r or d)")
    side = "before" if kind == "remove" else "after"
    row = obj.get(side)
    if not isinstance(row, dict):
        raise InvalidRecord(f"Debezium event with op {op!r} has no {side!r} row")
    source = obj.get("source")
    commit = source.get("ts_ms") if isinstance(source, dict) else None
    commit = obj.get("ts_ms") if commit is None else commit
    if commit is None:
        raise InvalidRecord("Debezium event has neither source.ts_ms nor ts_ms (the commit time)")
    column = topic.capture.column
    if kind == "remove":
        if topic.op is None:
            raise InvalidRecord(
                f"Debezium event with op 'd' removes a row, and topic {topic.name!r} has no remove records (no `op:`)"
            )
        kept = set(topic.identity) | set(topic.remove_fields)
        record: dict[str, Any] = {"op": topic.op[1]}
        fields = [(n, t) for n, t in topic.fields if n in kept]
    else:
        record = {"op": topic.op[0]} if topic.op else {}
        fields = list(topic.fields)
    for name, kind_ in fields:
        value = row.get(column(name))
        if kind_ == "timestamp" and type(value) is int:
            value //= _unit(schema, side, column(name))
        record[name] = value
    if kind == "remove" or record.get(topic.time) is None:
        record[topic.time] = commit
    return record
