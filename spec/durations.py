"""Durations as people write them: a number (a fraction allowed) and a unit, with or without a space between:
`30 s`, `10 min`, `1 h`, `2 d`, `500 ms`, `2 hours`, `2h`, `1.5 h`, `120 minutes`, `90s`.

Units: `ms` (millisecond), `s` (sec, second), `m` or `min` (minute), `h` (hour), `d` (day), each also in the plural
(`secs`, `minutes`, `hours`, `days`; `ms` is always milliseconds), in any case. The result is whole milliseconds
(a fraction below 1 ms is dropped)."""

from __future__ import annotations

import re

__all__ = ["parse_duration_ms", "duration_text"]

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


def parse_duration_ms(text: str, *, signed: bool = False) -> int:
    """`"10 minutes"`, `"90s"`, `"1 hour"`, `"500 ms"` -> milliseconds (`signed`: a leading `-` is allowed, as in an
    interval join's lower bound). Raises ValueError naming the text."""
    sign = r"-?" if signed else ""
    m = re.fullmatch(rf"\s*({sign}\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if unit not in _UNITS_MS and unit.endswith("s"):
        unit = unit[:-1]  # plural: "minutes", "secs" (but "ms" is milliseconds, not "m" = minutes)
    if not m or unit not in _UNITS_MS:
        raise ValueError(
            f"cannot parse duration {text!r}: a number and a unit (ms, s, min, h, d or their words), e.g. '500 ms',"
            " '30 s', '10 min', '1.5 h', '2 hours'"
        )
    return int(float(m.group(1)) * _UNITS_MS[unit])


def duration_text(ms: int) -> str:
    """Milliseconds as the largest unit that divides them: `3600000` -> `"1 h"`, `90000` -> `"90 s"`, `5` -> `"5 ms"`
    (what `parse_duration_ms` reads back)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"
