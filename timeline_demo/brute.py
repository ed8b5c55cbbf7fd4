"""Brute-force reference of the contract's pipeline semantics (section "Pipelines", and of "Beyond joins" the `select`
jobs and `agg` views), for ANY pipeline, in plain Python: what `mview export` and `mview query --json` must show
after the service has processed the same records.

`brute_force(pipeline, batches, lateness_ms=...)` takes a `spec.model.Pipeline` and the records delivered to its
topics, in arrival order, cut into batches (a batch: `{topic: [record, ...]}`; a record is a decoded JSON value or
a raw line, `str`/`bytes`, exactly as a line of an ingested file), and returns a `BruteResult`: every view's export
lines (`export(view)`, sorted as `mview export` sorts them: by key; a log view by the stream event's id) and any
key's `query(view, key)`. A batch is what one micro-batch of every job sees: records ingested, then `run --once`.
Only the interval join's late events, the asof join's held events and which copy of an event delivered twice with
different fields wins depend on the batches; everything else is a function of the set of records.

The definitions, taken from the contract's wording (and docs/architecture.md, "Pipelines as data (issue #34)", where the contract is silent):
- Records: a record is valid when it is a JSON object (a line at most `MAX_RECORD_BYTES` bytes) whose fields
  have their declared types (`id`: a non-empty string, not only whitespace, without a control character U+0000-001F
  or U+007F; `string`; `long`: an integer in int64, not a boolean; `double`: a finite number, not a boolean;
  `boolean`; `timestamp`: an ISO-8601 string with a zone or an integer of epoch ms, in [1970, 2100)); `optional`
  fields are null when absent; extra fields are ignored; a topic with `op` needs `op` to be one of its two names,
  and a remove record needs only the key, the time and `remove_fields` (its other fields are null). A captured
  table topic also accepts Debezium change events (c/u/r: an upsert of `after`, d: a remove of `before`; the time
  from `after`'s time column, else the commit time `source.ts_ms`/`ts_ms`). Other records are rejected and
  counted (`rejected`).
- Event topics: a record delivered twice (same `id` fields) has the effect of one: the copy of the earliest batch
  wins; among copies in one batch, the smallest by (time, other fields in declared order, null first).
- Table topics, the current table: per key, the record with the greatest time wins; on equal times a remove wins,
  then the record whose non-key fields, compared in declared order, are greatest (null smallest). With
  `final_deletes`, a key with any remove is not live. A version of a key is its winning change at one time; its
  id is `<key>@<time in epoch ms>`, a composite key's values joined by `|`.
- interval: the watermark is the greatest time seen on either topic minus the lateness; an event whose time is
  below the watermark at the start of its batch is late: dropped and counted (`late`). A right event r matches a
  left event l when every `match` pair is equal (null equals nothing) and `lower <= r.time - l.time <= upper`;
  `matches` counts l's matching right events. l is *closed* once `l.time + upper` < the watermark after the last
  batch. Row views hold the left events with `matches > 0`, and with `unmatched: true` the closed ones with
  `matches = 0` (`query` adds `final`: closed); count views count closed left events only (with `unmatched:
  false`, only those that matched).
- asof: per batch, the table's records of the batch join the versions (late ones too), the table's watermark
  becomes its greatest time minus the lateness, and every held or new stream event whose time the watermark has
  reached (`watermark >= time`) is emitted, the others held (`held` at the end). A stream event behind the
  watermark at the start of its batch is late, counted (`late_kept`) and kept: it is joined like any other. An
  emitted event is joined with
  the version of its key (the `match` expressions' values as text, in the table key's order, joined by `|`) in
  force at its time (the latest change with time <= the event's), or with the version its `pin` names: a remove,
  no version or a null key gives null table fields and `version` null; a pinned event keeps the pin as `version`,
  with the version's fields when it was seen (null for a remove) and null fields otherwise; a pin that names a
  version not (yet) seen waits until the watermark has also reached the pin's time. A pin that is not of the form
  `<key>@<ms>` is emitted at once with null fields.
- join: the inner join of the two current tables on `match`.
- select (no join): of an event topic, each event once (the rule of duplicates above: the earliest batch's copy,
  within a batch the smallest; late records are kept, nothing closes); of a table topic, its current table (with
  `final_deletes` as above), a row's identity its key's text. The rows see the topic's fields (bare and
  `<topic>.<field>`).
- Views (`where`: only rows for which it is true; a row, count, agg or list view's key is its expression's value
  cast to string; a row with a null key is left out): `row`: one line per key, the greatest fields (in declared
  order, null smallest) win; `count`: per key the sums of `values` (bigint or double by the expression's type; null
  adds 0), a key whose sums are all 0 is absent; `agg`: per key with at least one row, each value one aggregate
  over the key's rows (`spec.sql.parse_aggregate`; its expression evaluated per row): `count(*)` the rows,
  `count(EXPR)` the non-null values, `count(distinct EXPR)` the distinct non-null values, `sum`/`min`/`max` of the
  non-null values (a sum of bigints a bigint, of doubles a double; min/max the expression's type; null when there
  is none), `avg` their mean as a double (null when none); the line `{"<key name>": key, <value>: v, ...}` in
  declared order, nulls kept; an interval job's left event is a row of count, agg and list views once
  closed; `list`: per
  key the first `cap` entries by (`order`, entry) in the order's direction, an entry (cast to string) once per key
  (its first place), rows with a null entry or order left out; `log` (asof jobs and selects of an event topic):
  the emitted (selected) rows' fields, by the stream event's id (one id field: its text; several: a JSON array).
- `query --json`: row: the line plus `final` (interval jobs) and `generation`; count and agg: the line plus
  `generation`;
  list: `{"<key name>": key, "generation": g, "<items>": [item, ...]}` (at most `limit`; an item is the entry's
  fields, the entry first under `_item_entry`'s name unless a field is it); a key with no entry (or none within
  `limit`) gives `{}`, in every kind.

Limits: expressions are those of `timeline_demo.brute_sql` (anything else raises `ExprError` naming it);
integers are 64-bit everywhere (Spark's 32-bit INT literals are not modelled); decimals (`1.5`) are doubles;
double sums (and so double avgs) are summed in one order here, in another by the service (compare them with a
tolerance, as the contract's 1e-9 for avg); a list entry
whose fields differ between the rows that give it keeps those of its first place; with `final_deletes`, an asof
join still uses the versions as they are (a remove ends a version, it does not erase the key's history).
`python -m timeline_demo.brute PIPELINE DIR --view V` prints a view's export lines for the files a generator
wrote to DIR (`<topic>.jsonl`, or `<topic>-<i>.jsonl` for batch i).
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson

from spec.durations import parse_duration_ms
from spec.model import MATCHES, SQL_TYPES, VERSION, Job, Pipeline, Topic, View
from spec.sql import Aggregate, parse_aggregate
from spec.viewtable import BATCH
from timeline_demo.brute_sql import Expr, ExprError, cast_string, compile_expr, order_key, sql_compare
from views.pipeline import load_pipeline

__all__ = [
    "BruteError",
    "BruteResult",
    "ExprError",
    "Rejected",
    "MAX_RECORD_BYTES",
    "DEFAULT_LATENESS_MS",
    "brute_force",
    "validate",
    "parse_time",
    "current_table",
    "versions",
    "batches_from_dir",
    "batches_of",
    "main",
]

MAX_RECORD_BYTES = 1_048_576
DEFAULT_LATENESS_MS = 600_000  # ALLOWED_LATENESS's default, 10 minutes
_TS_END_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
_LONG = (-(2**63), 2**63 - 1)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_PIN = re.compile(r"^(.*)@(-?\d{1,18})$")
_DEBEZIUM = {"c": "upsert", "u": "upsert", "r": "upsert", "d": "remove"}
_DEBEZIUM_TIME = {
    "io.debezium.time.Timestamp": 1,
    "io.debezium.time.MicroTimestamp": 1_000,
    "io.debezium.time.NanoTimestamp": 1_000_000,
}


class BruteError(ValueError):
    """The brute force cannot answer (an unknown topic or view, a query of a log view, ...)."""


class Rejected(ValueError):
    """A record that is not valid for its topic; the message is the reason."""


# --- records ---------------------------------------------------------------------------------------------------


def parse_time(value: Any, name: str = "ts") -> int:
    """A timestamp field's value as epoch ms: an integer of epoch ms, or an ISO-8601 string with a zone; either in
    [1970-01-01, 2100-01-01). Raises `Rejected`."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise Rejected(f"field {name!r} must be an ISO-8601 string with zone or integer epoch ms")
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip())
        except ValueError:
            raise Rejected(f"field {name!r} is not an ISO-8601 timestamp: {value!r}") from None
        if dt.tzinfo is None or dt.utcoffset() is None:
            raise Rejected(f"field {name!r} has no zone: {value!r}")
        value = (dt - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= value < _TS_END_MS:
        raise Rejected(f"field {name!r} out of range: {value!r}")
    return value


def _typed(name: str, kind: str, v: Any) -> Any:
    if kind == "timestamp":
        return parse_time(v, name)
    if kind in ("id", "string"):
        if not isinstance(v, str):
            raise Rejected(f"field {name!r} must be a string, got {type(v).__name__}")
        if kind == "id" and (not v or v.isspace() or _CONTROL.search(v)):
            raise Rejected(f"field {name!r} is not an id (empty, blank or with a control character): {v!r}")
        return v
    if kind == "long":
        if isinstance(v, bool) or not isinstance(v, int) or not _LONG[0] <= v <= _LONG[1]:
            raise Rejected(f"field {name!r} must be an integer in int64, got {v!r}")
        return v
    if kind == "double":
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or v != v
            or v in (float("inf"), -float("inf"))
        ):
            raise Rejected(f"field {name!r} must be a finite number, got {v!r}")
        return float(v)
    if kind == "boolean":
        if not isinstance(v, bool):
            raise Rejected(f"field {name!r} must be a boolean, got {v!r}")
        return v
    raise Rejected(f"field {name!r} has an unknown type {kind!r}")  # pragma: no cover


def _debezium(topic: Topic, obj: dict) -> dict | None:
    """The record a Debezium change event stands for on a captured table topic, or None if `obj` is not one."""
    schema = None
    if isinstance(obj.get("payload"), dict) and "schema" in obj:
        schema, obj = obj["schema"], obj["payload"]
    op = obj.get("op")
    if not isinstance(op, str) or op not in (*_DEBEZIUM, "t", "m") or not ("before" in obj or "after" in obj):
        return None
    if op not in _DEBEZIUM:
        raise Rejected(f"Debezium event with op {op!r} is not a row change")
    side = "before" if op == "d" else "after"
    row = obj.get(side)
    if not isinstance(row, dict):
        raise Rejected(f"Debezium event with op {op!r} has no {side!r} row")
    source = obj.get("source")
    commit = source.get("ts_ms") if isinstance(source, dict) else None
    commit = obj.get("ts_ms") if commit is None else commit
    if commit is None:
        raise Rejected("Debezium event without a commit time (source.ts_ms or ts_ms)")
    col = topic.capture.column
    if op == "d":
        if topic.op is None:
            raise Rejected("a Debezium delete on a topic without `op` (no remove records)")
        keep = (*topic.key, *topic.remove_fields)
        return {"op": topic.op[1], **{f: row.get(col(f)) for f in keep}, topic.time: commit}
    t = row.get(col(topic.time))
    if isinstance(t, int) and not isinstance(t, bool):
        t //= _debezium_unit(schema, col(topic.time))
    out = {f: row.get(col(f)) for f in topic.names if f != topic.time}
    out[topic.time] = commit if t is None else t
    return {"op": topic.op[0], **out} if topic.op else out


def _debezium_unit(schema: Any, column: str) -> int:
    try:
        after = next(f for f in schema["fields"] if f.get("field") == "after")
        spec = next(f for f in after["fields"] if f.get("field") == column)
        return _DEBEZIUM_TIME[spec["name"]]
    except (KeyError, TypeError, StopIteration):
        return 1_000


def _decode(raw: Any) -> Any:
    """A record as a JSON value, its size checked: a line (str/bytes, terminator ignored) or a decoded value."""
    if isinstance(raw, (str, bytes)):
        line = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        line = line[:-2] if line.endswith(b"\r\n") else line[:-1] if line.endswith(b"\n") else line
        if len(line) > MAX_RECORD_BYTES:
            raise Rejected(f"record of {len(line)} bytes exceeds {MAX_RECORD_BYTES}")
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise Rejected(f"not valid JSON: {e}") from None
    try:
        size = len(orjson.dumps(raw, default=str))
    except (orjson.JSONEncodeError, TypeError) as e:
        raise Rejected(f"not representable as JSON: {e}") from None
    if size > MAX_RECORD_BYTES:
        raise Rejected(f"record of {size} bytes exceeds {MAX_RECORD_BYTES}")
    return raw


def validate(topic: Topic, raw: Any) -> dict[str, Any]:
    """The normalized record (`op` first when the topic has one, then every field; timestamps in epoch ms, doubles
    as float, absent optional fields None) of `raw` on `topic`, or `Rejected` with the reason."""
    obj = _decode(raw)
    if not isinstance(obj, dict):
        raise Rejected(f"not a JSON object but {type(obj).__name__}")
    if topic.capture is not None and (topic.op is None or obj.get("op") not in topic.op):
        obj = _debezium(topic, obj) or obj
    out: dict[str, Any] = {}
    remove = False
    if topic.op is not None:
        op = obj.get("op")
        if op is None:
            raise Rejected(f"missing field 'op' (one of {', '.join(topic.op)})")
        if not isinstance(op, str) or op not in topic.op:
            raise Rejected(f"unknown op {op!r} (one of {', '.join(topic.op)})")
        out["op"] = op
        remove = op == topic.op[1]
    needed = {*topic.identity, topic.time, *topic.remove_fields} if remove else None
    for name, kind in topic.fields:
        v = obj.get(name)
        if needed is not None and name not in needed:
            out[name] = None
        elif v is None:
            if name in topic.optional:
                out[name] = None
            else:
                raise Rejected(f"missing field {name!r}")
        else:
            out[name] = _typed(name, kind, v)
    return out


def _is_remove(topic: Topic, rec: Mapping[str, Any]) -> bool:
    return topic.op is not None and rec.get("op") == topic.op[1]


def _key_text(values: Iterable[Any]) -> str:
    """A key's text: its values cast to string, joined by `|` (a version id is `<key text>@<time>`)."""
    return "|".join(cast_string(v) for v in values)


def _rank(topic: Topic, rec: Mapping[str, Any]) -> tuple:
    """What decides between two changes of one key: (time, is remove, non-key fields in declared order)."""
    return (rec[topic.time], _is_remove(topic, rec), *order_key(rec[f] for f in topic.values))


def current_table(topic: Topic, records: Iterable[Mapping[str, Any]]) -> dict[tuple, dict]:
    """The current table of a table topic's normalized records: {key tuple: winning record}, live rows only."""
    best: dict[tuple, dict] = {}
    removed: set[tuple] = set()
    for rec in records:
        key = tuple(rec[f] for f in topic.key)
        if _is_remove(topic, rec):
            removed.add(key)
        if key not in best or _rank(topic, rec) > _rank(topic, best[key]):
            best[key] = rec
    return {
        k: r
        for k, r in best.items()
        if not _is_remove(topic, r) and not (topic.final_deletes and k in removed)
    }


class _Versions:
    """The versions of a table topic, growing batch by batch: per key text, its changes by time (one per time)."""

    def __init__(self, topic: Topic):
        self.topic = topic
        self.by_key: dict[str, dict[int, dict]] = defaultdict(dict)
        self.times: dict[str, list[int]] = defaultdict(list)

    def add(self, rec: dict) -> None:
        key = _key_text(rec[f] for f in self.topic.key)
        t = rec[self.topic.time]
        at = self.by_key[key]
        if t not in at:
            bisect.insort(self.times[key], t)
            at[t] = rec
        elif _rank(self.topic, rec) > _rank(self.topic, at[t]):
            at[t] = rec

    def at(self, key: str, t: int) -> dict | None:
        """The change of `key` at exactly `t`, or None."""
        return self.by_key.get(key, {}).get(t)

    def in_force(self, key: str, t: int) -> tuple[int, dict] | None:
        """(time, change) of the latest change of `key` with time <= `t`, or None."""
        times = self.times.get(key, [])
        i = bisect.bisect_right(times, t)
        return (times[i - 1], self.by_key[key][times[i - 1]]) if i else None


def versions(topic: Topic, records: Iterable[dict]) -> dict[str, dict]:
    """Every version of a table topic's normalized records: {`<key>@<ms>`: winning change at that time}."""
    v = _Versions(topic)
    for rec in records:
        v.add(rec)
    return {f"{k}@{t}": rec for k, at in v.by_key.items() for t, rec in at.items()}


# --- the rows a job's join gives ------------------------------------------------------------------------------


@dataclass
class _Row:
    """One row a view sees: `cols` (bare names and `topic.field`), `ident` (its identity's text: the left or stream
    event's id, or the two keys of a join row) and, for an interval job, `final` (closed) and `counted`."""

    cols: dict[str, Any]
    ident: str
    final: bool | None = None
    counted: bool = True
    time: int | None = None
    late: bool = False
    batch: int | None = None  # the batch that emitted it (select and asof events): its version of a log view


def _columns(pipeline: Pipeline, job: Job) -> dict[str, str]:
    """The SQL types of the names a view of `job` sees: `row_columns`, plus `<topic>.<field>` of its sides."""
    cols = dict(pipeline.row_columns(job.name))
    sides = pipeline.sides(job.name)[:1] if job.kind == "interval" else pipeline.sides(job.name)
    for t in sides:
        cols.update({f"{t.name}.{n}": SQL_TYPES[k] for n, k in t.fields})
    return cols


def _side_cols(topic: Topic) -> dict[str, str]:
    """What a `match` expression of one side sees: the side's fields, bare and as `<topic>.<field>`."""
    cols = {n: SQL_TYPES[k] for n, k in topic.fields}
    return cols | {f"{topic.name}.{n}": t for n, t in cols.items()}


def _side_row(topic: Topic, rec: Mapping[str, Any]) -> dict[str, Any]:
    row = {n: rec[n] for n, _ in topic.fields}
    return row | {f"{topic.name}.{n}": v for n, v in row.items()}


def _ident(topic: Topic, rec: Mapping[str, Any]) -> str:
    values = [rec[f] for f in topic.identity]
    if len(values) == 1:
        return cast_string(values[0])
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False)


def _dedupe(topic: Topic, records: list[dict], kept: dict[tuple, dict]) -> dict[tuple, dict]:
    """The batch's event records not already `kept`, one per id: the smallest (time, other fields)."""
    others = [n for n, _ in topic.fields if n not in topic.id and n != topic.time]

    def rank(rec):
        return (rec[topic.time], *order_key(rec[f] for f in others))

    fresh: dict[tuple, dict] = {}
    for rec in records:
        ident = tuple(rec[f] for f in topic.id)
        if ident in kept:
            continue
        if ident not in fresh or rank(rec) < rank(fresh[ident]):
            fresh[ident] = rec
    return fresh


def _matcher(pipeline: Pipeline, job: Job) -> tuple[list[Expr], list[Expr]]:
    first, second = pipeline.sides(job.name)
    a = [compile_expr(x, _side_cols(first)) for x, _ in job.spec.match]
    b = [compile_expr(y, _side_cols(second)) for _, y in job.spec.match]
    for x, y in zip(a, b, strict=True):
        known = {x.type, y.type} - {"null"}
        if len(known) > 1 and not known <= {"bigint", "double"}:
            raise ExprError(f"match {x.text!r}: {y.text!r} compares a {x.type} with a {y.type}")
    return a, b


def _match_key(exprs: list[Expr], row: Mapping[str, Any]) -> tuple | None:
    values = tuple(e(row) for e in exprs)
    if any(v is None or (isinstance(v, float) and v != v) for v in values):
        return None  # null equals nothing (NaN: left out, a corner the examples never reach)
    return values


@dataclass
class _JobOut:
    rows: list[_Row]
    late: int = 0
    held: int = 0
    watermark: int | None = None


def _interval(pipeline: Pipeline, job: Job, batches: list[dict], lateness: int) -> _JobOut:
    spec = job.spec
    left, right = pipeline.sides(job.name)
    watermark, late = None, 0
    kept: dict[str, dict[tuple, dict]] = {left.name: {}, right.name: {}}
    for batch in batches:
        w0, newest = watermark, None
        for side in (left, right):
            fresh = []
            for rec in batch.get(side.name, ()):
                t = rec[side.time]
                if w0 is not None and t < w0:
                    late += 1
                    continue
                newest = t if newest is None else max(newest, t)
                fresh.append(rec)
            kept[side.name].update(_dedupe(side, fresh, kept[side.name]))
        if newest is not None:
            w1 = newest - lateness
            watermark = w1 if watermark is None else max(watermark, w1)
    on_left, on_right = _matcher(pipeline, job)
    times: dict[tuple, list[int]] = defaultdict(list)
    for rec in kept[right.name].values():
        key = _match_key(on_right, _side_row(right, rec))
        if key is not None:
            times[key].append(rec[right.time])
    for ts in times.values():
        ts.sort()
    rows = []
    for rec in kept[left.name].values():
        cols = _side_row(left, rec)
        key = _match_key(on_left, cols)
        t = rec[left.time]
        found = times.get(key, []) if key is not None else []
        n = bisect.bisect_right(found, t + spec.upper_ms) - bisect.bisect_left(found, t + spec.lower_ms)
        closed = watermark is not None and t + spec.upper_ms < watermark
        if n > 0 or (spec.unmatched and closed):
            row = _Row({**cols, MATCHES: n}, _ident(left, rec), final=closed, time=t)
            row.counted = closed
            rows.append(row)
    # a window of left events is final once every left event before its end closed
    return _JobOut(rows, late=late, watermark=None if watermark is None else watermark - spec.upper_ms)


def _beside(first: Topic, second: Topic) -> list[tuple[str, str, bool]]:
    """How `second`'s fields join `first`'s in a row: (field, `<topic>.<field>`, also bare: `first` lacks it)."""
    taken = set(first.names)
    return [(n, f"{second.name}.{n}", n not in taken) for n in second.names]


def _asof_row(stream: Topic, beside: list, rec: dict, table_rec: dict | None, version: str | None) -> _Row:
    cols = rec["_cols"]
    for n, qualified, bare in beside:
        v = None if table_rec is None else table_rec[n]
        cols[qualified] = v
        if bare:
            cols[n] = v
    cols[VERSION] = version
    return _Row(cols, _ident(stream, rec))


# long: the asof join's batch loop, one decision per held or new event
def _asof(pipeline: Pipeline, job: Job, batches: list[dict], lateness: int) -> _JobOut:
    spec = job.spec
    stream, table = pipeline.sides(job.name)
    on_stream, _ = _matcher(pipeline, job)
    order = [dict((b, i) for i, (_, b) in enumerate(spec.match))[k] for k in table.key]
    on_stream = [on_stream[i] for i in order]  # the key's values in the table key's order
    beside = _beside(stream, table)
    store, newest, top = _Versions(table), None, None
    held: dict[tuple, dict] = {}
    seen: dict[tuple, dict] = {}
    # per event: behind the stream's greatest time of the batches before its own
    behind: dict[tuple, bool] = {}
    rows, late = [], 0
    for bi, batch in enumerate(batches):
        if newest is not None:  # late: behind the table's watermark at the start of its batch, and kept
            late += sum(r[stream.time] < newest - lateness for r in batch.get(stream.name, ()))
        for rec in batch.get(table.name, ()):
            store.add(rec)
            newest = rec[table.time] if newest is None else max(newest, rec[table.time])
        events = list(batch.get(stream.name, ()))
        fresh = _dedupe(stream, events, seen)
        seen.update(fresh)
        held.update(fresh)
        behind.update({i: top is not None and r[stream.time] < top - lateness for i, r in fresh.items()})
        top = max([r[stream.time] for r in events] + ([] if top is None else [top]), default=None)
        wm = None if newest is None else newest - lateness
        for ident, rec in list(held.items()):
            if wm is None or wm < rec[stream.time]:
                continue
            rec = {**rec, "_cols": _side_row(stream, rec)}
            pin = rec[spec.pin] if spec.pin else None
            if pin is not None:
                m = _PIN.match(pin)
                found = store.at(m.group(1), int(m.group(2))) if m else None
                if m and found is None and wm < int(m.group(2)):
                    continue  # the pinned version may still arrive
                live = found if found is not None and not _is_remove(table, found) else None
                rows.append(_asof_row(stream, beside, rec, live, pin))
            else:
                key = _match_key(on_stream, rec["_cols"])
                hit = store.in_force(_key_text(key), rec[stream.time]) if key is not None else None
                if hit is None or _is_remove(table, hit[1]):
                    rows.append(_asof_row(stream, beside, rec, None, None))
                else:
                    rows.append(_asof_row(stream, beside, rec, hit[1], f"{_key_text(key)}@{hit[0]}"))
            rows[-1].time, rows[-1].late, rows[-1].batch = rec[stream.time], behind[ident], bi
            del held[ident]
    # a window is final once no event before its end can still come: both watermarks passed it
    closes = None if top is None or newest is None else min(top, newest) - lateness
    return _JobOut(rows, late=late, held=len(held), watermark=closes)


def _join(pipeline: Pipeline, job: Job, batches: list[dict]) -> _JobOut:
    left, right = pipeline.sides(job.name)
    tables = {
        t.name: current_table(t, (r for b in batches for r in b.get(t.name, ()))) for t in (left, right)
    }
    on_left, on_right = _matcher(pipeline, job)
    index: dict[tuple, list[tuple]] = defaultdict(list)
    for k, rec in tables[right.name].items():
        key = _match_key(on_right, _side_row(right, rec))
        if key is not None:
            index[key].append((k, rec))
    extra = _beside(left, right)
    rows = []
    for lk, lrec in tables[left.name].items():
        cols = _side_row(left, lrec)
        key = _match_key(on_left, cols)
        for rk, rrec in index.get(key, []) if key is not None else []:
            both = dict(cols)
            for n, qualified, bare in extra:
                both[qualified] = rrec[n]
                if bare:
                    both[n] = rrec[n]
            rows.append(_Row(both, repr((lk, rk))))
    return _JobOut(rows)


def _select(pipeline: Pipeline, job: Job, batches: list[dict], lateness: int) -> _JobOut:
    """A select's rows: each event of an event topic once (the dedupe rule across and within batches), or the
    current table of a table topic (a row's identity: its key's text). An event's row is late when its time is
    below the topic's greatest time in the batches before its own (each batch is one commit of the topic's log)
    minus the lateness; the watermark is the greatest time of all minus the lateness."""
    (topic,) = pipeline.sides(job.name)
    if topic.kind == "table":
        table = current_table(topic, (r for b in batches for r in b.get(topic.name, ())))
        return _JobOut([_Row(_side_row(topic, rec), _key_text(k)) for k, rec in table.items()])
    kept: dict[tuple, dict] = {}
    rows, top = [], None
    for i, batch in enumerate(batches):
        records = list(batch.get(topic.name, ()))
        fresh = _dedupe(topic, records, kept)
        kept.update(fresh)
        for rec in fresh.values():
            t = rec[topic.time]
            late = top is not None and t < top - lateness
            rows.append(_Row(_side_row(topic, rec), _ident(topic, rec), time=t, late=late, batch=i))
        times = [r[topic.time] for r in records] + ([] if top is None else [top])
        top = max(times, default=None)
    windowed = any(v.window is not None for v in job.views)
    late = sum(r.late for r in rows) if windowed else 0
    return _JobOut(rows, late=late, watermark=None if top is None else top - lateness)


# --- views -----------------------------------------------------------------------------------------------------


@dataclass
class _ViewOut:
    """A view's content: `lines` {key or id: export line}; `final` (row views) and `items` (list views) per key;
    `batches` (log views) the batch that emitted each line."""

    view: View
    lines: dict[str, dict] = field(default_factory=dict)
    batches: dict[str, int | None] = field(default_factory=dict)
    final: dict[str, bool | None] = field(default_factory=dict)
    items: dict[str, list[dict]] = field(default_factory=dict)


def _true(where: Expr | None, row: _Row) -> bool:
    return where is None or where(row.cols) is True


# long: one branch per view kind, as the module docstring states them
def _view(
    view: View, rows: list[_Row], cols: dict[str, str], interval: bool, watermark: int | None = None
) -> _ViewOut:
    out = _ViewOut(view)
    where = compile_expr(view.where, cols) if view.where else None
    key = compile_expr(view.key[1], cols) if view.key else None
    fields = [(n, compile_expr(e, cols)) for n, e in view.fields]
    if view.kind == "log":
        for row in rows:
            if _true(where, row):
                out.lines[row.ident] = {n: e(row.cols) for n, e in fields}
                out.batches[row.ident] = row.batch
        return out
    chosen: dict[str, list] = defaultdict(list)
    for row in rows:
        if view.kind in ("count", "agg", "list") and interval and not row.counted:
            continue
        if not _true(where, row) or (view.window is not None and row.late):
            continue
        k = cast_string(key(row.cols))
        if k is not None:
            chosen[k].append(row)
    groups = {k: (k, group, {}) for k, group in chosen.items()}
    if view.window is not None:
        groups = _windows(view, chosen, watermark)
    if view.kind == "row":
        for k, group in chosen.items():
            lines = [(row, {n: e(row.cols) for n, e in fields}) for row in group]
            row, line = max(lines, key=lambda x: order_key(x[1].values()))
            out.lines[k] = {view.key_name: k, **line}
            out.final[k] = row.final
    elif view.kind == "count":
        values = [(n, compile_expr(e, cols)) for n, e in view.values]
        for n, e in values:
            if e.type not in ("bigint", "double", "null"):
                raise ExprError(f"view {view.name}: value {n} = {e.text!r} is a {e.type}, not a number")
        for at, (k, group, extra) in groups.items():
            sums = {n: 0.0 if e.type == "double" else 0 for n, e in values}
            for row in group:
                for n, e in values:
                    v = e(row.cols)
                    sums[n] += v if v is not None else 0
            if any(v != 0 for v in sums.values()):
                out.lines[at] = {view.key_name: k, **sums, **extra}
    elif view.kind == "agg":
        aggs = _aggregates(view, cols)
        for at, (k, group, extra) in groups.items():
            out.lines[at] = {view.key_name: k, **{n: _aggregate(a, e, group) for n, a, e in aggs}, **extra}
    else:
        entry = compile_expr(view.entry, cols)
        (order_text, desc), *_ = view.order
        order = compile_expr(order_text, cols)
        if order.type not in ("bigint", "double"):
            raise ExprError(f"view {view.name}: order {order_text!r} is a {order.type}, not a number")
        for at, (k, group, extra) in groups.items():
            cand = []
            for row in group:
                e, o = cast_string(entry(row.cols)), order(row.cols)
                if e is not None and o is not None:
                    cand.append(((o, e.encode("utf-8", "surrogatepass")), e, row))
            cand.sort(key=lambda c: c[0], reverse=desc)
            ids, items, taken = [], [], set()
            for _, e, row in cand:
                if e not in taken:
                    taken.add(e)
                    ids.append(e)
                    items.append({n: f(row.cols) for n, f in fields})
                if len(ids) == view.cap:
                    break
            if ids:
                out.lines[at] = {view.key_name: k, view.entries: ids, **extra}
                out.items[at] = items
    return out


def _windows(view: View, chosen: dict[str, list[_Row]], watermark: int | None) -> dict[str, tuple]:
    """A windowed view's groups: `{"<key>|<window start>": (key, rows, {"window_start", "window_end", "final"})}`
    from each key's rows (not late): a tumbling or hopping window `[s, s + size)` (s a multiple of the step) holds
    the rows whose time it holds; a session, a key's rows sorted by time, cut where two are the gap or more apart
    (its end: the last row's time plus the gap). Final: the watermark is at or beyond the end; a final window whose
    end is more than `retain` behind the watermark is left out."""
    w = view.window
    spans: dict[tuple, list[_Row]] = defaultdict(list)
    for k, group in chosen.items():
        if w.kind == "session":
            run: list[_Row] = []
            for row in sorted(group, key=lambda r: r.time):
                if run and row.time - run[-1].time >= w.size_ms:
                    spans[(k, run[0].time, run[-1].time + w.size_ms)] = run
                    run = []
                run.append(row)
            if run:
                spans[(k, run[0].time, run[-1].time + w.size_ms)] = run
            continue
        for row in group:
            s = row.time - row.time % w.step_ms
            while s + w.size_ms > row.time:
                spans[(k, s, s + w.size_ms)].append(row)
                s -= w.step_ms
    out = {}
    for (k, start, end), rows in spans.items():
        final = watermark is not None and end <= watermark
        if final and view.retain_ms is not None and end < watermark - view.retain_ms:
            continue
        out[f"{k}|{start}"] = (k, rows, {"window_start": start, "window_end": end, "final": final})
    return out


def _aggregates(view: View, cols: dict[str, str]) -> list[tuple[str, Aggregate, Expr | None]]:
    """(name, aggregate, its compiled expression or None for `count(*)`) of an agg view, in declared order."""
    out = []
    for name, text in view.values:
        agg = parse_aggregate(text)
        expr = None if agg.expr is None else compile_expr(agg.expr, cols)
        if agg.func in ("sum", "avg") and expr.type not in ("bigint", "double"):
            raise ExprError(f"view {view.name}: value {name} = {text!r} sums a {expr.type}, not a number")
        out.append((name, agg, expr))
    return out


def _aggregate(agg: Aggregate, expr: Expr | None, rows: list[_Row]) -> Any:
    """One aggregate over a key's rows: count(*) the rows; count(EXPR) the non-null values, count(distinct EXPR)
    the distinct ones; sum/min/max/avg over the non-null values, null when there is none (avg: a double; a sum
    of bigints a bigint, beyond 64 bits an error as in Spark's ANSI mode)."""
    if expr is None:
        return len(rows)
    values = [v for v in (expr(row.cols) for row in rows) if v is not None]
    if agg.func == "count":
        return len({_Distinct(v) for v in values}) if agg.distinct else len(values)
    if not values:
        return None
    if agg.func in ("min", "max"):
        best = values[0]
        for v in values[1:]:
            c = sql_compare(v, best)
            if (c < 0) if agg.func == "min" else (c > 0):
                best = v
        return best
    total = sum(values)
    if agg.func == "avg":
        return float(total) / len(values)
    if expr.type == "bigint" and not _LONG[0] <= total <= _LONG[1]:
        raise ExprError(f"sum({expr.text}) overflows a bigint (Spark's ANSI mode fails the query)")
    return float(total) if expr.type == "double" else total


class _Distinct:
    """A non-null SQL value as a member of a set: equal when `sql_compare` says so (one expression: one type)."""

    __slots__ = ("v", "h")

    def __init__(self, v: Any):
        self.v = v
        nan = isinstance(v, float) and v != v
        self.h = hash("NaN" if nan else 0.0 if isinstance(v, float) and v == 0 else v)

    def __eq__(self, other) -> bool:
        return sql_compare(self.v, other.v) == 0

    def __hash__(self) -> int:
        return self.h


def _item_entry(view: View) -> str | None:
    """The name a list view's query item carries its entry under (docs/reference.md, "The file, key by key"): none when a field
    is the entry expression itself (backquotes aside); else the entry's column name (`t.x`: `x`) unless a field has
    it, else `entry`, `_entry`, ... (the first no field has)."""
    bare = view.entry.strip("` ")
    if any(sql.strip("` ") == bare for _, sql in view.fields):
        return None
    taken = {name for name, _ in view.fields}
    column = re.fullmatch(r"\s*(?:`?[A-Za-z_]\w*`?\s*\.\s*)?`?([A-Za-z_]\w*)`?\s*", view.entry)
    if column and column.group(1) not in taken:
        return column.group(1)
    name = "entry"
    while name in taken:
        name = "_" + name
    return name


# --- the result ------------------------------------------------------------------------------------------------


@dataclass
class BruteResult:
    """What the service must show after processing the batches (see the module docstring).

    accepted / rejected: per topic, records accepted / rejected (`reasons`: the rejections' messages in order);
    late: per interval job, events dropped as late; held: per asof job, events still held at the end;
    late_kept: per asof job, stream events behind the table's watermark on arrival (joined as of their time like
    any other, never dropped)."""

    pipeline: Pipeline
    views: dict[str, _ViewOut]
    accepted: dict[str, int]
    rejected: dict[str, int]
    reasons: dict[str, list[str]]
    late: dict[str, int]
    held: dict[str, int]
    late_kept: dict[str, int] = field(default_factory=dict)

    def _out(self, view: str) -> _ViewOut:
        if view not in self.views:
            raise BruteError(f"unknown view {view!r} (views: {', '.join(self.views)})")
        return self.views[view]

    def export(self, view: str) -> list[dict]:
        """The view's `mview export` lines, in export order (by key; a log view by the stream event's id)."""
        out = self._out(view)
        return [out.lines[k] for k in sorted(out.lines, key=lambda k: k.encode("utf-8", "surrogatepass"))]

    def keys(self, view: str) -> list[str]:
        """The view's keys (a log view: the ids of its rows), in export order."""
        return sorted(self._out(view).lines, key=lambda k: k.encode("utf-8", "surrogatepass"))

    def query(self, view: str, key: str, *, limit: int | None = None, generation: int = 1) -> dict:
        """`mview query VIEW KEY --json` (as a dict) in `generation`."""
        out = self._out(view)
        v = out.view
        if v.kind == "log":
            raise BruteError(f"{view} is a log view: export it (it has no query)")
        if v.kind == "list":
            items = out.items.get(key, [])[:limit]
            if not items:
                return {}
            line = out.lines[key]
            ids = line[v.entries][:limit]
            name = _item_entry(v)
            if name is not None:
                items = [{name: e, **item} for e, item in zip(ids, items, strict=True)]
            window = {k: line[k] for k in ("window_start", "window_end", "final") if k in line}
            return {v.key_name: line[v.key_name], "generation": generation, v.items_name: items, **window}
        line = out.lines.get(key)
        if line is None:
            return {}
        final = out.final.get(key) if v.kind == "row" else None
        return {**line, **({"final": final} if final is not None else {}), "generation": generation}


def _accept(pipeline: Pipeline, batches: Iterable[Mapping[str, Iterable[Any]]]):
    accepted: dict[str, int] = dict.fromkeys(pipeline.topics, 0)
    rejected: dict[str, int] = dict.fromkeys(pipeline.topics, 0)
    reasons: dict[str, list[str]] = {t: [] for t in pipeline.topics}
    out = []
    for batch in batches:
        valid: dict[str, list[dict]] = {}
        for name, records in batch.items():
            topic = pipeline.topics.get(name)
            if topic is None:
                raise BruteError(f"unknown topic {name!r} (topics: {', '.join(pipeline.topics)})")
            if topic.view is not None:
                raise BruteError(f"topic {name!r} is view {topic.view!r}: its job writes it")
            if topic.source is not None:
                raise BruteError(
                    f"topic {name!r} is read from {topic.source!r}: give its records to {topic.source!r}"
                )
            for raw in records:
                if isinstance(raw, (str, bytes)) and not raw.strip():
                    continue  # a blank line is skipped, not rejected (as `mview ingest` does)
                try:
                    valid.setdefault(name, []).append(validate(topic, raw))
                    accepted[name] += 1
                except Rejected as e:
                    rejected[name] += 1
                    reasons[name].append(str(e))
        for t in pipeline.topics.values():  # a topic read `from:` another: that one's records, as a table
            if t.source is not None and t.source in valid:
                valid[t.name] = list(valid[t.source])
        out.append(valid)
    return out, accepted, rejected, reasons


def brute_force(
    pipeline: Pipeline,
    batches: Iterable[Mapping[str, Iterable[Any]]],
    *,
    lateness_ms: int | str = DEFAULT_LATENESS_MS,
) -> BruteResult:
    """Every view of `pipeline` after `batches` (see the module docstring); `lateness_ms`: ALLOWED_LATENESS, in ms
    or as the setting's text (`"10 minutes"`)."""
    lateness = parse_duration_ms(lateness_ms) if isinstance(lateness_ms, str) else int(lateness_ms)
    valid, accepted, rejected, reasons = _accept(pipeline, batches)
    views: dict[str, _ViewOut] = {}
    late: dict[str, int] = {}
    held: dict[str, int] = {}
    late_kept: dict[str, int] = {}
    for job in _in_chain_order(pipeline):
        _read_views(pipeline, job, views, valid)
        if job.kind == "interval":
            got = _interval(pipeline, job, valid, lateness)
            late[job.name] = got.late
        elif job.kind == "asof":
            got = _asof(pipeline, job, valid, lateness)
            held[job.name], late_kept[job.name] = got.held, got.late
            if any(v.window is not None for v in job.views):
                late[job.name] = sum(r.late for r in got.rows)
        elif job.kind == "select":
            got = _select(pipeline, job, valid, lateness)
            if got.late:
                late[job.name] = got.late
        else:
            got = _join(pipeline, job, valid)
        cols = _columns(pipeline, job)
        for view in job.views:
            views[view.name] = _view(view, got.rows, cols, job.kind == "interval", got.watermark)
    return BruteResult(pipeline, views, accepted, rejected, reasons, late, held, late_kept)


def _in_chain_order(pipeline: Pipeline) -> list[Job]:
    """The pipeline's jobs, each after the jobs whose views it reads."""
    order: dict[str, None] = {}
    for name in pipeline.jobs:
        order.update(dict.fromkeys((*pipeline.chain(name), name)))
    return [pipeline.jobs[n] for n in order]


def _read_views(pipeline: Pipeline, job: Job, views: dict[str, _ViewOut], valid: list[dict]) -> None:
    """Give each topic of `job` read from a view its records: a log view's rows as events of the batch that emitted
    them (each batch one version of the log); a view read as a table its entries after the last batch, as upsert
    records of that batch."""
    for name in job.topics:
        topic = pipeline.topics[name]
        if topic.view is None or not valid:
            continue
        if topic.kind == "event":
            out, rows = (
                views[topic.view],
                replace(topic, optional=frozenset(topic.names)),
            )  # a field may be null
            for ident, line in out.lines.items():
                valid[out.batches[ident]].setdefault(name, []).append(validate(rows, dict(line)))
            continue
        lines = views[topic.view].lines.values()
        records = [{**{n: line.get(n) for n in topic.names}, "op": topic.op[0], BATCH: 0} for line in lines]
        entries = replace(
            topic, optional=frozenset(topic.values)
        )  # a view's value may be null (a max of nulls)
        valid[-1][name] = [validate(entries, r) for r in records]


def batches_of(arrivals: Iterable[tuple[str, Any]], cuts: Iterable[int] = ()) -> list[dict[str, list]]:
    """(topic, record) pairs in arrival order, cut before each index of `cuts`, as batches."""
    arrivals = list(arrivals)
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(arrivals)), len(arrivals)]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        batch: dict[str, list] = {}
        for topic, rec in arrivals[a:b]:
            batch.setdefault(topic, []).append(rec)
        out.append(batch)
    return out


def batches_from_dir(pipeline: Pipeline, directory: str | Path) -> list[dict[str, list[bytes]]]:
    """The batches of the JSON-lines files a generator wrote to `directory`: `<topic>.jsonl` is batch 0,
    `<topic>-<i>.jsonl` batch i (topics of the pipeline only), each line as it is in the file."""
    found: dict[int, dict[str, list[bytes]]] = defaultdict(dict)
    for path in sorted(Path(directory).glob("*.jsonl")):
        m = re.fullmatch(r"(.+?)(?:-(\d+))?\.jsonl", path.name)
        if not m or m.group(1) not in pipeline.topics:
            continue
        i = int(m.group(2) or 0)
        lines = [x for x in path.read_bytes().split(b"\n") if x.strip()]
        found[i].setdefault(m.group(1), []).extend(lines)
    return [found[i] for i in sorted(found)]


def main(argv: list[str] | None = None) -> int:
    """`python -m timeline_demo.brute PIPELINE DIR [--view V] [--lateness D]`: a view's export lines for the files
    under DIR, or without `--view` a summary (lines per view, accepted, rejected, late, held) as JSON."""
    p = argparse.ArgumentParser(prog="python -m timeline_demo.brute", description=main.__doc__)
    p.add_argument("pipeline")
    p.add_argument("dir")
    p.add_argument("--view")
    p.add_argument("--lateness", default="10 minutes", help="ALLOWED_LATENESS (default 10 minutes)")
    args = p.parse_args(argv)
    pipeline = load_pipeline(args.pipeline)
    result = brute_force(pipeline, batches_from_dir(pipeline, args.dir), lateness_ms=args.lateness)
    if args.view:
        for line in result.export(args.view):
            sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
        return 0
    summary = {
        "views": {v: len(result.export(v)) for v in result.views},
        "accepted": result.accepted,
        "rejected": result.rejected,
        "late": result.late,
        "held": result.held,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
