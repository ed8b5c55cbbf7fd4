"""`mview status`: per job, read from the lake (pid file, status file, checkpoints, Delta logs), no Spark."""

from __future__ import annotations

import json
import os
from pathlib import Path

from changelog.topics import latest_version
from jobs.registry import JOBS
from jobs.runtime import checkpoint_dir, read_status
from jobs.settings import Settings

__all__ = ["job_status", "pid_of", "processed_versions"]


def pid_of(settings: Settings, job: str) -> int | None:
    """The pid of the deployed job's driver if it is alive, else None."""
    path = settings.lake_dir / "jobs" / job / "pid"
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None
    return pid


def processed_versions(checkpoint: Path) -> list[int]:
    """Per source of the query, the next Delta version not yet fully processed (from the last committed batch)."""
    commits, offsets = checkpoint / "commits", checkpoint / "offsets"
    if not commits.is_dir():
        return []
    done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()]
    if not done:
        return []
    lines = (offsets / str(max(done))).read_text().splitlines()
    out = []
    for line in lines[2:]:
        try:
            o = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(o, dict) and "reservoirVersion" in o:
            # index -1 points at the start of reservoirVersion: everything before it is processed.
            v = o["reservoirVersion"] if o.get("index", -1) == -1 else o["reservoirVersion"] + 1
            out.append(v if not o.get("isStartingVersion") or o.get("index", -1) != -1 else v)
        else:
            out.append(None)
    return out


def job_status(settings: Settings) -> dict:
    out = {}
    for name, spec in JOBS.items():
        s = read_status(settings, name)
        gen = int(s.get("generation", 0))
        done = processed_versions(checkpoint_dir(settings, name, gen)) if gen else []
        lag = 0
        for i, topic in enumerate(spec.topics):
            latest = latest_version(settings.lake_dir, topic)
            nxt = done[i] if i < len(done) and done[i] is not None else 0
            lag += max(0, latest + 1 - nxt)
        pid = pid_of(settings, name)
        out[name] = {
            "running": pid is not None,
            "pid": pid,
            "generation": gen,
            "lag_versions": lag,
            **{k: v for k, v in s.items() if k != "generation"},
        }
    return out
