"""Durations in settings: units, plurals, and "ms" as milliseconds (not minutes); a bad duration says what to write."""

from __future__ import annotations

import dataclasses

import pytest

from jobs.core.settings import Settings, parse_duration_ms


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


@pytest.mark.parametrize(
    "variable, attribute",
    [
        ("ALLOWED_LATENESS", "allowed_lateness_ms"),
        ("TRIGGER_INTERVAL", "trigger_interval_ms"),
        ("MAINTENANCE_INTERVAL", "maintenance_interval_ms"),
        ("LOG_RETENTION", "log_retention_ms"),
        ("REPLAY_GRACE", "replay_grace_ms"),
        ("STOP_TIMEOUT", "stop_timeout_ms"),
        ("IDLE_TIMEOUT", "idle_timeout_ms"),
    ],
)
def test_settings_parse_each_duration_once_and_name_a_bad_one(variable, attribute):
    assert getattr(Settings.from_env({variable: "90s"}), attribute) == 90_000
    with pytest.raises(ValueError, match=f"^{variable}: cannot parse duration 'soon'"):
        Settings.from_env({variable: "soon"})


def test_a_copy_with_another_duration_parses_it_again():
    s = dataclasses.replace(Settings.from_env({}), trigger_interval="2 s")
    assert s.trigger_interval_ms == 2_000
    assert Settings.from_env({}).idle_timeout_ms is None  # empty: off


def test_redis_cluster_is_a_flag():
    assert Settings.from_env({"REDIS_CLUSTER": "true"}).redis_cluster is True
    assert Settings.from_env({"REDIS_CLUSTER": "false"}).redis_cluster is False
