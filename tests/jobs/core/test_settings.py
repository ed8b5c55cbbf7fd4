"""Durations in settings: units, plurals, and "ms" as milliseconds (not minutes); a bad duration says what to write.
LAKE_DIR is read in one place, `lake_location`, which the settings, `mview check` and the development servers share."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jobs.core.settings import Settings, lake_location, parse_duration_ms
from jobs.dev import dev_dir


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


@pytest.mark.parametrize(
    "value, local, uri",
    [
        (None, "lake", None),
        ("  ", "lake", None),
        ("other", "other", None),
        ("file://{tmp}/x", "x", None),
        (" hdfs://127.0.0.1:9000/lake ", None, "hdfs://127.0.0.1:9000/lake"),
        ("s3a://bucket/path", None, "s3a://bucket/path"),
    ],
)
def test_lake_dir_is_read_in_one_place(value, local, uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {} if value is None else {"LAKE_DIR": value.format(tmp=tmp_path)}
    want = None if local is None else (tmp_path / local).resolve()
    assert lake_location(env) == (want, uri or str(want))
    s = Settings.from_env(env)
    assert (s.lake_dir, s.lake_uri) == lake_location(env)
    assert dev_dir("kafka", env) == (want or Path("lake").resolve()) / "kafka"
