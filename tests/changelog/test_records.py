import math

import orjson
import pytest

from changelog.errors import InvalidRecord, RecordTooLarge
from changelog.records import MAX_RECORD_BYTES, check_record_size, parse_line, parse_ts, validate
from views.pipeline import builtin_pipeline, parse_pipeline

T = builtin_pipeline().topics  # the built-in topics, by name

POST = '{"op":"post","tweet_id":"t1","user_id":"u1","text":"hi","ts":%s}'


@pytest.mark.parametrize(
    "ts, ms",
    [
        ('"2026-01-01T10:00:00Z"', 1767261600000),
        ('"2026-01-01T12:00:00+02:00"', 1767261600000),
        ('"2026-01-01T10:00:00.123Z"', 1767261600123),
        ('"2026-01-01T10:00:00.123456+00:00"', 1767261600123),
        ("1767261600000", 1767261600000),
    ],
)
def test_both_ts_forms_normalize_to_epoch_ms(ts, ms):
    assert parse_line(T["tweets"], POST % ts)["ts"] == ms


@pytest.mark.parametrize(
    "topic, line, reason",
    [
        ("tweets", "not json", "not valid JSON"),
        ("tweets", "[1, 2]", "not a JSON object"),
        ("tweets", '"a string"', "not a JSON object"),
        ("tweets", '{"op":"post","user_id":"u","text":"x","ts":1}', "missing field 'tweet_id'"),
        ("tweets", '{"op":"post","tweet_id":5,"user_id":"u","text":"x","ts":1}', "must be a string"),
        ("tweets", '{"op":"edit","tweet_id":"t","user_id":"u","ts":1}', "unknown op"),
        ("tweets", '{"tweet_id":"t","user_id":"u","ts":1}', "missing field 'op'"),
        ("tweets", POST % '"yesterday"', "not an ISO-8601"),
        ("tweets", POST % '"2026-01-01T10:00:00"', "no zone"),
        ("tweets", POST % "1.5", "must be an ISO-8601 string"),
        ("tweets", POST % "true", "boolean"),
        ("follows", '{"op":"follow","follower_id":"a","followee_id":"","ts":1}', "is empty"),
        ("follows", '{"op":"follow","follower_id":"a","ts":1}', "missing field 'followee_id'"),
        ("clicks", '{"click_id":"c","session_id":"s","url":"u","ts":1,"search_id":3}', "must be a string"),
    ],
)
def test_invalid_lines_are_rejected_with_reason(topic, line, reason):
    with pytest.raises(InvalidRecord) as e:
        parse_line(T[topic], line)
    assert reason in e.value.reason


def test_extra_fields_are_ignored_and_optional_fields_default_to_null():
    rec = parse_line(T["clicks"], '{"click_id":"c","session_id":"s","url":"u","ts":5,"extra":1}')
    assert rec == {"click_id": "c", "session_id": "s", "url": "u", "ts": 5, "search_id": None}


def test_integer_ts_passes_through():
    assert parse_ts(0) == 0


# Every field of every topic is checked by the same rules; the tables below use tweets and follows.
FOLLOW = '{"op":"follow","follower_id":%s,"followee_id":"b","ts":1}'
RANGE = "it must lie from 1970-01-01T00:00:00Z (0) up to, not including, 2100-01-01T00:00:00Z (4102444800000 epoch ms)"


@pytest.mark.parametrize(
    "ts, ms",
    [
        ("0", 0),
        ('"1970-01-01T00:00:00Z"', 0),
        ('"1970-01-01T01:00:00+01:00"', 0),
        ("4102444799999", 4102444799999),
        ('"2099-12-31T23:59:59.999Z"', 4102444799999),
        ('"2100-01-01T00:59:59.999+01:00"', 4102444799999),
    ],
)
def test_ts_at_the_ends_of_the_valid_range_is_accepted_in_both_forms(ts, ms):
    assert parse_line(T["tweets"], POST % ts)["ts"] == ms


@pytest.mark.parametrize(
    "ts, shown",
    [
        ("-1", "-1"),
        ('"1969-12-31T23:59:59.999Z"', "'1969-12-31T23:59:59.999Z'"),
        ("4102444800000", "4102444800000"),
        ('"2100-01-01T00:00:00Z"', "'2100-01-01T00:00:00Z'"),
        ('"2099-12-31T23:00:00-01:00"', "'2099-12-31T23:00:00-01:00'"),
        ('"9999-12-31T00:00:00Z"', "'9999-12-31T00:00:00Z'"),
        ("253402214400000", "253402214400000"),
        ('"0001-01-01T00:00:00Z"', "'0001-01-01T00:00:00Z'"),
    ],
)
def test_ts_outside_the_valid_range_is_rejected_in_both_forms_naming_value_and_range(ts, shown):
    with pytest.raises(InvalidRecord) as e:
        parse_line(T["tweets"], POST % ts)
    assert e.value.reason == f"field 'ts' out of range: {shown}; {RANGE}"


@pytest.mark.parametrize(
    "value, reason",
    [
        ('""', "field 'follower_id' is empty"),
        ('" "', "field 'follower_id' is blank (only whitespace): ' '"),
        ('"\\t\\n "', "field 'follower_id' is blank (only whitespace): '\\t\\n '"),
        ('"\\u00a0\\u3000"', "field 'follower_id' is blank (only whitespace): '\\xa0\\u3000'"),
        ('"a\\u0000b"', "field 'follower_id' contains the control character U+0000 at position 1"),
        ('"\\u0000"', "field 'follower_id' contains the control character U+0000 at position 0"),
        ('"ab\\u001f"', "field 'follower_id' contains the control character U+001F at position 2"),
        ('"a\\u007f"', "field 'follower_id' contains the control character U+007F at position 1"),
        ('"a\\tb"', "field 'follower_id' contains the control character U+0009 at position 1"),
        ('"a\\nb"', "field 'follower_id' contains the control character U+000A at position 1"),
    ],
)
def test_ids_that_are_blank_or_hold_a_control_character_are_rejected_naming_the_field(value, reason):
    with pytest.raises(InvalidRecord) as e:
        parse_line(T["follows"], FOLLOW % value)
    assert e.value.reason.startswith(reason)


@pytest.mark.parametrize(
    "value, kept", [('" a "', " a "), ('"\\u00e9t\\u00e9"', "été"), ('"a\\u0080b"', "a\x80b")]
)
def test_other_ids_are_kept_as_given(value, kept):
    assert parse_line(T["follows"], FOLLOW % value)["follower_id"] == kept


def test_a_control_character_in_a_text_field_is_kept():
    line = '{"op":"post","tweet_id":"t","user_id":"u","text":"a\\u0000\\u001b[31m\\n","ts":1}'
    assert parse_line(T["tweets"], line)["text"] == "a\x00\x1b[31m\n"


_EMPTY_POST = (POST % "1").replace('"hi"', '""').encode()


def _post_of_size(n: int) -> bytes:
    """A valid tweet line of `n` bytes: its text is `n - len(_EMPTY_POST)` x's."""
    line = _EMPTY_POST.replace(b'""', b'"' + b"x" * (n - len(_EMPTY_POST)) + b'"')
    assert len(line) == n
    return line


@pytest.mark.parametrize("terminator", [b"", b"\n", b"\r\n"])
def test_a_line_of_exactly_the_maximum_record_size_is_accepted_whole(terminator):
    rec = parse_line(T["tweets"], _post_of_size(MAX_RECORD_BYTES) + terminator)
    assert rec["text"] == "x" * (MAX_RECORD_BYTES - len(_EMPTY_POST))


@pytest.mark.parametrize(
    "size, reason",
    [
        (
            MAX_RECORD_BYTES + 1,
            "record of 1,048,577 bytes exceeds the maximum record size of 1,048,576 bytes",
        ),
        (25_000_123, "record of 25,000,123 bytes exceeds the maximum record size of 1,048,576 bytes"),
    ],
)
def test_a_line_over_the_maximum_record_size_is_rejected_with_its_size(size, reason):
    for line in (_post_of_size(size), _post_of_size(size) + b"\r\n", _post_of_size(size).decode()):
        with pytest.raises(InvalidRecord) as e:
            parse_line(T["tweets"], line)
        assert e.value.reason == reason
    with pytest.raises(InvalidRecord) as e:
        check_record_size(size)
    assert e.value.reason == reason


@pytest.mark.parametrize("size", [MAX_RECORD_BYTES, MAX_RECORD_BYTES + 1, 5 * 1024 * 1024])
def test_a_record_without_a_line_is_measured_as_its_json_line_by_the_same_rule(size):
    """`validate` applies the limit itself: a record that comes as a value (a captured row) is as large as its
    compact JSON line, and gets the verdict and reason that line gets from `parse_line`."""
    line = _post_of_size(size)
    record = orjson.loads(line)
    results = []
    for check in (lambda: parse_line(T["tweets"], line), lambda: validate(T["tweets"], record)):
        try:
            results.append(check())
        except InvalidRecord as e:
            results.append((type(e).__name__, e.reason))
    assert results[0] == results[1]
    assert (size <= MAX_RECORD_BYTES) == isinstance(results[0], dict)


def test_the_maximum_record_size_is_one_mebibyte():
    assert MAX_RECORD_BYTES == 1_048_576
    check_record_size(MAX_RECORD_BYTES)


def test_a_byte_order_mark_makes_a_line_invalid_json():
    """Ingest drops a BOM at the start of a file; anywhere else it is not JSON (orjson names it)."""
    with pytest.raises(InvalidRecord) as e:
        parse_line(T["tweets"], b"\xef\xbb\xbf" + (POST % "1").encode())
    assert "not valid JSON" in e.value.reason and "byte order mark" in e.value.reason


# Debezium change events of the documented PostgreSQL connector shape (JSON converter, `source` abridged).
_SRC = {
    "version": "2.7.0.Final",
    "connector": "postgresql",
    "name": "db",
    "ts_ms": 1767261600000,
    "db": "mview",
    "schema": "public",
    "table": "profiles",
    "txId": 771,
    "lsn": 24023128,
}
_AFTER = {"user_id": "u1", "name": "Ann", "country": "DE", "updated_at": "2026-01-01T10:00:00.250000Z"}
_SCHEMA_US = {
    "type": "struct",
    "name": "db.public.profiles.Envelope",
    "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": []},
        {
            "field": "after",
            "type": "struct",
            "optional": True,
            "fields": [
                {"field": "user_id", "type": "string", "optional": False},
                {
                    "field": "updated_at",
                    "type": "int64",
                    "optional": True,
                    "name": "io.debezium.time.MicroTimestamp",
                },
            ],
        },
    ],
}
_UPSERT_AT = {"op": "upsert", "user_id": "u1", "name": "Ann", "country": "DE", "ts": 1767261600250}


@pytest.mark.parametrize(
    "event, expected",
    [
        ({"before": None, "after": _AFTER, "source": _SRC, "op": "c", "ts_ms": 1767261601000}, _UPSERT_AT),
        ({"before": None, "after": _AFTER, "source": _SRC, "op": "r", "ts_ms": 1767261601000}, _UPSERT_AT),
        (
            {
                "before": {"user_id": "u1", "name": None, "country": None, "updated_at": None},
                "after": _AFTER,
                "source": _SRC,
                "op": "u",
                "ts_ms": 1767261601000,
            },
            _UPSERT_AT,
        ),
        # updated_at null: the commit time (source.ts_ms), not the connector's ts_ms
        (
            {
                "before": None,
                "after": {**_AFTER, "updated_at": None},
                "source": _SRC,
                "op": "u",
                "ts_ms": 1767261609999,
            },
            {**_UPSERT_AT, "ts": 1767261600000},
        ),
        # no source: the event's ts_ms
        (
            {"before": None, "after": {**_AFTER, "updated_at": None}, "op": "c", "ts_ms": 1767261609999},
            {**_UPSERT_AT, "ts": 1767261609999},
        ),
        (
            {
                "before": {"user_id": "u1", "name": None, "country": None, "updated_at": None},
                "after": None,
                "source": _SRC,
                "op": "d",
                "ts_ms": 1767261601000,
            },
            {"op": "delete", "user_id": "u1", "ts": 1767261600000},
        ),
        # the schema/payload wrapper, updated_at as MicroTimestamp (epoch microseconds)
        (
            {
                "schema": _SCHEMA_US,
                "payload": {
                    "before": None,
                    "after": {**_AFTER, "updated_at": 1767261600250999},
                    "source": _SRC,
                    "op": "c",
                    "ts_ms": 1767261601000,
                },
            },
            _UPSERT_AT,
        ),
        # an offset zone, as ZonedTimestamp may give
        (
            {"after": {**_AFTER, "updated_at": "2026-01-01T12:00:00.25+02:00"}, "source": _SRC, "op": "c"},
            _UPSERT_AT,
        ),
    ],
)
def test_debezium_events_normalize_to_the_cdc_record(event, expected):
    assert validate(T["profiles"], event) == expected
    assert parse_line(T["profiles"], orjson.dumps(event)) == expected


@pytest.mark.parametrize(
    "event, reason",
    [
        ({"before": None, "after": None, "source": _SRC, "op": "c"}, "no 'after' row"),
        (
            {"before": None, "after": {**_AFTER, "user_id": None}, "source": _SRC, "op": "c"},
            "missing field 'user_id'",
        ),
        (
            {"before": None, "after": {**_AFTER, "name": None}, "source": _SRC, "op": "u"},
            "missing field 'name'",
        ),
        ({"before": None, "after": None, "source": _SRC, "op": "t"}, "not a row change"),
        ({"before": None, "after": {**_AFTER, "updated_at": None}, "op": "c"}, "commit time"),
        ({"after": {**_AFTER, "updated_at": "2026-01-01T10:00:00"}, "source": _SRC, "op": "c"}, "no zone"),
    ],
)
def test_bad_debezium_events_are_rejected_with_the_reason(event, reason):
    with pytest.raises(InvalidRecord, match=reason):
        validate(T["profiles"], event)


# A pipeline's own topics (not the built-in ones): every type, `optional`, `op` with its own names, a remove with
# `remove_fields`, a composite key. One table: (topic, record as given, the record stored or the reason).
_OWN = parse_pipeline(
    """
topics:
  readings:
    fields: {reading_id: id, sensor: string, value: double, count: long, ok: boolean, at: timestamp, note: string}
    optional: [note]
    id: reading_id
    time: at
  meters:
    fields: {site: id, meter: long, kwh: double, active: boolean, seen: timestamp, label: string}
    key: [site, meter]
    time: seen
    op: {upsert: set, remove: unset}
    remove_fields: [label]
""",
    "own.yml",
).topics
_READING = {"reading_id": "r1", "sensor": "s", "value": 1.5, "count": 3, "ok": True, "at": 1767261600000}
_METER = {
    "op": "set",
    "site": "a",
    "meter": 7,
    "kwh": 2.25,
    "active": False,
    "seen": 1767261600000,
    "label": "L",
}


def _line(given) -> bytes | None:
    """`given` as a JSON line, None when no JSON line holds it (NaN, infinity, an integer past 64 bits)."""
    values = given.values() if isinstance(given, dict) else ()
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
        return None
    try:
        return orjson.dumps(given)
    except orjson.JSONEncodeError:
        return None


@pytest.mark.parametrize(
    "topic, given, expected",
    [
        # every field typed, an optional one absent (null), an extra one dropped
        ("readings", {**_READING, "extra": [1]}, {**_READING, "note": None}),
        ("readings", {**_READING, "note": "n"}, {**_READING, "note": "n"}),
        ("readings", {**_READING, "note": None}, {**_READING, "note": None}),
        # double: an integer is a double, stored as a float; long: the ends of the 64-bit range
        ("readings", {**_READING, "value": 3}, {**_READING, "value": 3.0, "note": None}),
        ("readings", {**_READING, "value": -1e308}, {**_READING, "value": -1e308, "note": None}),
        ("readings", {**_READING, "count": -(2**63)}, {**_READING, "count": -(2**63), "note": None}),
        ("readings", {**_READING, "count": 2**63 - 1}, {**_READING, "count": 2**63 - 1, "note": None}),
        ("readings", {**_READING, "ok": False}, {**_READING, "ok": False, "note": None}),
        # timestamp: ISO-8601 with zone or epoch ms, stored as epoch ms
        ("readings", {**_READING, "at": "2026-01-01T12:00:00+02:00"}, {**_READING, "note": None}),
        # a string field holds any text, an id is checked
        ("readings", {**_READING, "sensor": ""}, {**_READING, "sensor": "", "note": None}),
        # a table topic with its own op names; a remove keeps only the key, the time and remove_fields
        ("meters", _METER, _METER),
        (
            "meters",
            {"op": "unset", "site": "a", "meter": 7, "seen": 5, "label": "L", "kwh": "not kept"},
            {"op": "unset", "site": "a", "meter": 7, "seen": 5, "label": "L"},
        ),
        # rejected, with the reason
        ("readings", {**_READING, "reading_id": ""}, "field 'reading_id' is empty"),
        (
            "readings",
            {**_READING, "reading_id": "a\tb"},
            "field 'reading_id' contains the control character U+0009",
        ),
        ("readings", {**_READING, "reading_id": 5}, "field 'reading_id' must be a string, got int"),
        ("readings", {**_READING, "sensor": 5}, "field 'sensor' must be a string, got int"),
        ("readings", {**_READING, "count": 1.5}, "field 'count' must be an integer, got float"),
        ("readings", {**_READING, "count": True}, "field 'count' must be an integer, got bool"),
        ("readings", {**_READING, "count": "3"}, "field 'count' must be an integer, got str"),
        (
            "readings",
            {**_READING, "count": 2**63},
            "field 'count' is out of the 64-bit integer range: 9223372036854775808",
        ),
        ("readings", {**_READING, "value": "1.5"}, "field 'value' must be a number, got str"),
        ("readings", {**_READING, "value": False}, "field 'value' must be a number, got bool"),
        ("readings", {**_READING, "value": float("nan")}, "field 'value' must be a finite number, got nan"),
        ("readings", {**_READING, "value": float("inf")}, "field 'value' must be a finite number, got inf"),
        ("readings", {**_READING, "ok": 1}, "field 'ok' must be true or false, got int"),
        ("readings", {**_READING, "ok": "true"}, "field 'ok' must be true or false, got str"),
        ("readings", {**_READING, "at": "2026-01-01T10:00:00"}, "field 'at' has no zone (add Z or +hh:mm)"),
        ("readings", {**_READING, "at": "soon"}, "field 'at' is not an ISO-8601 timestamp: 'soon'"),
        ("readings", {**_READING, "at": -1}, "field 'at' out of range: -1; it must lie from 1970"),
        (
            "readings",
            {**_READING, "at": True},
            "field 'at' must be an ISO-8601 string with zone or integer epoch",
        ),
        ("readings", {k: v for k, v in _READING.items() if k != "sensor"}, "missing field 'sensor'"),
        ("readings", {**_READING, "count": None}, "missing field 'count'"),
        ("readings", [1], "not a JSON object but list"),
        ("meters", {k: v for k, v in _METER.items() if k != "op"}, "missing field 'op' (one of set, unset)"),
        ("meters", {**_METER, "op": "delete"}, "unknown op 'delete' (one of set, unset)"),
        ("meters", {**_METER, "op": ["set"]}, "unknown op ['set'] (one of set, unset)"),
        ("meters", {"op": "unset", "site": "a", "meter": 7, "seen": 5}, "missing field 'label'"),
        ("meters", {"op": "unset", "site": "a", "label": "L", "seen": 5}, "missing field 'meter'"),
        ("meters", {**_METER, "meter": "7"}, "field 'meter' must be an integer, got str"),
        ("meters", {**_METER, "active": None}, "missing field 'active'"),
    ],
)
def test_a_pipelines_own_topic_is_validated_by_its_declaration(topic, given, expected):
    """The rules of `changelog.records` for any topic: each type, `optional`, extra fields, `op` with the topic's
    own names, a remove with only its key, time and `remove_fields`; the same verdict from a value and from its
    JSON line (with or without a terminator)."""
    line = _line(given)
    forms = [lambda: validate(_OWN[topic], given)]
    if line is not None:
        forms += [lambda: parse_line(_OWN[topic], line), lambda: parse_line(_OWN[topic], line + b"\n")]
    for judge in forms:
        if isinstance(expected, dict):
            got = judge()
            assert got == expected and list(got) == list(expected)  # op first, then the declared order
        else:
            with pytest.raises(InvalidRecord) as e:
                judge()
            assert e.value.reason.startswith(expected), e.value.reason


def test_the_record_limit_holds_for_a_pipelines_own_topic_on_every_path():
    """1 MiB as its JSON line: from a line (with or without terminator) and from a value alike."""
    room = MAX_RECORD_BYTES - len(orjson.dumps({**_READING, "sensor": ""}))
    fits, over = {**_READING, "sensor": "x" * room}, {**_READING, "sensor": "x" * (room + 1)}
    assert len(orjson.dumps(fits)) == MAX_RECORD_BYTES
    assert parse_line(_OWN["readings"], orjson.dumps(fits) + b"\r\n")["sensor"] == "x" * room
    assert validate(_OWN["readings"], fits)["sensor"] == "x" * room
    reason = f"record of {MAX_RECORD_BYTES + 1:,} bytes exceeds the maximum record size of {MAX_RECORD_BYTES:,} bytes"
    for check in (
        lambda: parse_line(_OWN["readings"], orjson.dumps(over)),
        lambda: validate(_OWN["readings"], over),
    ):
        with pytest.raises(RecordTooLarge) as e:
            check()
        assert e.value.reason == reason and e.value.size == MAX_RECORD_BYTES + 1


def test_a_record_is_judged_by_a_topic_declaration_not_a_name():
    with pytest.raises(TypeError, match="spec.model.Topic"):
        validate("readings", _READING)
