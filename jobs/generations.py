"""Generations of a job's views: which exist (in Redis and in the lake), and dropping one.

A generation g of job J is: the Redis keys `mv:<kind>:<g>:*` for every view and extra key kind of J (see
`JobSpec.extra_keys`) plus `mv:meta:<J>:<g>`, and the lake dirs `checkpoints/<J>/g<g>` and `state/<J>/g<g>`.
Readers only ever see the generation `mv:gen:<J>` points at; every other generation is either being built by a
replay (its marker `LAKE_DIR/jobs/<J>/replay.json` names it while the replaying process lives) or garbage.
"""

from __future__ import annotations

import os
import re
import shutil

from jobs.registry import JobSpec
from jobs.runtime import checkpoint_dir, read_status, state_dir
from jobs.settings import Settings
from views.keys import meta_key, view_pattern

__all__ = ["key_kinds", "generations", "drop_generation", "replay_in_progress"]

_GEN_DIR = re.compile(r"^g(\d+)$")


def key_kinds(spec: JobSpec) -> tuple[str, ...]:
    return tuple(spec.views) + tuple(spec.extra_keys)


def generations(settings: Settings, client, spec: JobSpec) -> set[int]:
    """Every generation of `spec` with a key in Redis or a checkpoint/state dir in the lake."""
    found: set[int] = set()
    for kind in (*key_kinds(spec), "meta"):
        prefix = f"mv:{kind}:" if kind != "meta" else f"mv:meta:{spec.name}:"
        for key in client.scan_iter(match=prefix + "*", count=1000):
            rest = key.decode()[len(prefix) :]
            g = rest.split(":", 1)[0]
            if g.isdigit():
                found.add(int(g))
    for root in (settings.lake_dir / "checkpoints" / spec.name, settings.lake_dir / "state" / spec.name):
        if root.is_dir():
            found.update(int(m.group(1)) for p in root.iterdir() if (m := _GEN_DIR.match(p.name)))
    return found


def replay_in_progress(settings: Settings, job: str) -> int | None:
    """The generation a live replay process is building for `job`, else None."""
    marker = read_status(settings, job, "replay.json")
    pid, gen = marker.get("pid"), marker.get("building")
    if not pid or gen is None or marker.get("finished"):
        return None
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, PermissionError, ValueError):
        return None
    return int(gen)


def drop_generation(settings: Settings, client, spec: JobSpec, generation: int, *, files: bool = True) -> int:
    """Remove generation `generation` of `spec`: its Redis keys (SCAN + UNLINK, in batches of 1,000) and, with
    `files`, its checkpoint and state dirs. Returns the number of Redis keys removed. Never call it on the
    serving generation."""
    removed = 0
    patterns = [view_pattern(kind, generation) for kind in key_kinds(spec)]
    for pattern in patterns:
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                removed += client.unlink(*batch)
                batch = []
        if batch:
            removed += client.unlink(*batch)
    removed += client.unlink(meta_key(spec.name, generation))
    if files:
        for d in (
            checkpoint_dir(settings, spec.name, generation),
            state_dir(settings, spec.name, generation),
        ):
            shutil.rmtree(d, ignore_errors=True)
    return removed
