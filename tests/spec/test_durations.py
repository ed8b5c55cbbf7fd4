"""`spec.durations`: a duration as written reads back as the same milliseconds, and milliseconds are written in the
largest unit that divides them (as `mview check` shows a view's window)."""

from __future__ import annotations

import pytest

from spec.durations import duration_text, parse_duration_ms
from spec.model import Window


@pytest.mark.parametrize(
    "ms, text",
    [
        (3_600_000, "1 h"),
        (86_400_000, "1 d"),
        (90_000, "90 s"),
        (600_000, "10 min"),
        (1_500, "1500 ms"),
        (0, "0 ms"),
    ],
)
def test_milliseconds_are_written_in_the_largest_unit_that_divides_them(ms, text):
    assert duration_text(ms) == text
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "window, text",
    [
        (Window("tumble", 3_600_000), "tumble 1 h"),
        (Window("hop", 3_600_000, 600_000), "hop 1 h every 10 min"),
        (Window("session", 300_000), "session 5 min"),
    ],
)
def test_a_window_is_shown_as_a_file_writes_it(window, text):
    assert window.text == text
