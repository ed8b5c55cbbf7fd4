import pytest

from changelog.errors import InvalidRecord
from changelog.records import parse_line, parse_ts

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
    assert parse_line("tweets", POST % ts)["ts"] == ms


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
        parse_line(topic, line)
    assert reason in e.value.reason


def test_extra_fields_are_ignored_and_optional_fields_default_to_null():
    rec = parse_line("clicks", '{"click_id":"c","session_id":"s","url":"u","ts":5,"extra":1}')
    assert rec == {"click_id": "c", "session_id": "s", "url": "u", "ts": 5, "search_id": None}


def test_integer_ts_passes_through():
    assert parse_ts(0) == 0
