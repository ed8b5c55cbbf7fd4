"""Durations in settings: units, plurals, and "ms" as milliseconds (not minutes); a bad duration says what to write."""

from __future__ import annotations

import pytest

from jobs.settings import parse_duration_ms


@pytest.mark.parametrize(
    "text, ms",
    [
        ("500 ms", 500),
        ("200ms", 200),
        ("2 s", 2_000),
        ("90s", 90_000),
        ("30 seconds", 30_000),
        ("3 secs", 3_000),
        ("1 min", 60_000),
        ("10 minutes", 600_000),
        ("1.5 h", 5_400_000),
        ("0 hours", 0),
        ("7 days", 604_800_000),
    ],
)
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "ten minutes", "5 fortnights", "ms"])
def test_bad_durations_say_what_to_write(text):
    with pytest.raises(ValueError, match="500 ms"):
        parse_duration_ms(text)
