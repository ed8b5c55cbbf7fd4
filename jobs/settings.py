"""The one settings object, read from the environment. Every key is documented here and in the README."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings", "parse_duration_ms"]

_UNITS_MS = {
    "ms": 1,
    "millisecond": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
}


def parse_duration_ms(text: str) -> int:
    """`"10 minutes"`, `"90s"`, `"1 hour"`, `"500 ms"` -> milliseconds. Raises ValueError naming the text."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+?)s?\s*", text)
    if not m or m.group(2).lower() not in _UNITS_MS:
        raise ValueError(f"cannot parse duration {text!r}: use e.g. '10 minutes', '30 seconds', '500 ms'")
    return int(float(m.group(1)) * _UNITS_MS[m.group(2).lower()])


@dataclass(frozen=True)
class Settings:
    """Configuration of every job and command.

    lake_dir: LAKE_DIR, where logs, state, dead letters and checkpoints live (default ./lake).
    redis_url: REDIS_URL, the serving Redis (default redis://127.0.0.1:6379/0).
    spark_master: SPARK_MASTER, the Spark master URL (default local[*]).
    timeline_cap: TIMELINE_CAP, newest entries kept per home timeline (default 800).
    allowed_lateness: ALLOWED_LATENESS, watermark delay of every event-time stream (default "10 minutes").
    shuffle_partitions: SHUFFLE_PARTITIONS, spark.sql.shuffle.partitions (default 2; 200 is ~15x slower here).
    trigger_interval: TRIGGER_INTERVAL, micro-batch interval of deployed jobs (default "500 ms").
    clicks_idle_timeout: CLICKS_IDLE_TIMEOUT, processing-time idle timeout after which the clicks watermark
        may advance without new events (default empty = off).
    driver_memory: SPARK_DRIVER_MEMORY (default 4g).
    """

    lake_dir: Path
    redis_url: str
    spark_master: str
    timeline_cap: int
    allowed_lateness: str
    shuffle_partitions: int
    trigger_interval: str
    clicks_idle_timeout: str
    driver_memory: str

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        s = cls(
            lake_dir=Path(e.get("LAKE_DIR", "./lake")).resolve(),
            redis_url=e.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            spark_master=e.get("SPARK_MASTER", "local[*]"),
            timeline_cap=int(e.get("TIMELINE_CAP", "800")),
            allowed_lateness=e.get("ALLOWED_LATENESS", "10 minutes"),
            shuffle_partitions=int(e.get("SHUFFLE_PARTITIONS", "2")),
            trigger_interval=e.get("TRIGGER_INTERVAL", "500 ms"),
            clicks_idle_timeout=e.get("CLICKS_IDLE_TIMEOUT", ""),
            driver_memory=e.get("SPARK_DRIVER_MEMORY", "4g"),
        )
        if s.timeline_cap < 1:
            raise ValueError(f"TIMELINE_CAP must be >= 1, got {s.timeline_cap}")
        parse_duration_ms(s.allowed_lateness)
        return s

    @property
    def allowed_lateness_ms(self) -> int:
        return parse_duration_ms(self.allowed_lateness)

    @property
    def clicks_idle_timeout_ms(self) -> int | None:
        return parse_duration_ms(self.clicks_idle_timeout) if self.clicks_idle_timeout.strip() else None
