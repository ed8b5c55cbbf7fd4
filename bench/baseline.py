"""The `baseline` part: the `redis`, `throughput` and `freshness` parts of another commit (`--baseline`, default
`BASELINE`: the last commit before the storage layer of "Beyond one machine") run in the same bench run, beside
this code's figures, so the cost of what changed since (on a local lake) is measured against its reference on the
same machine at the same time.

The commit is checked out into a git worktree under the bench's temporary directory and its own bench is run there
(`python -m bench --only redis throughput freshness`) in a new process of this venv, with its README, plot and
results written to throw-away files; the worktree is removed afterwards. Without git, or without the commit in
this clone's history (a shallow clone), the part fails with one line and the others go on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, say

__all__ = ["bench_baseline", "BASELINE"]

BASELINE = "a57cf99"


def bench_baseline(tmp: Path, ref: str, freshness_seconds: float) -> dict:
    """The baseline commit's throughput (cold, steady, ratio to its own ZADD reference) and freshness p50/p99."""
    git = shutil.which("git")
    if git is None:
        raise RuntimeError("git is not installed: the baseline part checks out the commit it compares with")
    work, out = tmp / "baseline", tmp / "baseline.json"
    add = subprocess.run(
        [git, "-C", str(ROOT), "worktree", "add", "--detach", str(work), ref], capture_output=True, text=True
    )
    if add.returncode != 0:
        raise RuntimeError(f"cannot check out {ref} (a shallow clone?): {add.stderr.strip()[:200]}")
    try:
        shutil.copy(work / "README.md", tmp / "baseline-README.md")
        cmd = [sys.executable, "-m", "bench", "--only", "redis", "throughput", "freshness", "--out", str(out)]
        cmd += ["--plot", str(tmp / "baseline.png"), "--readme", str(tmp / "baseline-README.md")]
        cmd += ["--freshness-seconds", str(freshness_seconds)]
        say(f"baseline: {ref}'s bench in {work}")
        env = {**os.environ, "PYTHONPATH": str(work)}
        done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"{ref}'s bench failed: {(done.stderr or done.stdout).strip()[-300:]}")
        res = json.loads(out.read_text())
    finally:
        subprocess.run(
            [git, "-C", str(ROOT), "worktree", "remove", "--force", str(work)], capture_output=True
        )
    tp, fr = res.get("throughput") or {}, res.get("freshness") or {}
    if "error" in tp or "error" in fr:
        raise RuntimeError(f"{ref}'s bench: {tp.get('error') or fr.get('error')}")
    return {
        "ref": ref,
        "throughput": {
            k: tp.get(k) for k in ("entries_per_s", "steady_entries_per_s", "ratio", "steady_ratio")
        },
        "freshness": {k: fr.get(k) for k in ("p50_s", "p99_s")},
        "zadd_per_s": (res.get("redis") or {}).get("zadd_per_s"),
    }
