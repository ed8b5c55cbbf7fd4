"""The `cdc` part of `python -m bench`: change data capture from a real PostgreSQL (its own, `scratch_postgres`).

- Capture rate: a table of `rows` profiles is captured by `mview run cdc --once` (the slot's snapshot), then one
  bulk `UPDATE` of every row commits `rows` changes and a second `mview run cdc --once` captures them. Measured:
  the capture's changes/s (its own `seconds`: from the start of the capture to the last Delta commit) and the
  whole command's wall time (Python start included). References from the same run: the snapshot's rows/s (the
  first command) and `mview ingest` of the same `rows` records as JSON lines into another lake (its
  accepted/s, and the command's wall time).
- COMMIT -> first enriched use: `cdc` and `enrichment` deployed (`ALLOWED_LATENESS=0 ms`, `TRIGGER_INTERVAL=200
  ms`) on the captured table. Every `interval` seconds one transaction changes one user's `country` to a value no
  other version has, with `updated_at` = the client's clock t (the version's `ts`); as soon as it commits, an
  activity event of that user with `ts` = t is ingested (`mview ingest`'s function) together with `background`
  events of other users. Measured: from the return of COMMIT to the moment `activity_by_country` in Redis counts
  the event under the new country, i.e. the event was emitted enriched with the new version. What it includes:
  the capture (WAL -> slot -> Delta commit of the `profiles` log), the enrichment's next micro-batch that reads
  both logs (the event is held until the change's `ts` moves the profiles watermark to t: with lateness 0 the
  change itself does), the batch's join, the output log and the Redis write. With an `ALLOWED_LATENESS` of L
  the event would also wait for a change with `ts` >= t + L. p50, p99 and max over the samples.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import say

__all__ = ["run"]


def _mview(settings, *args: str) -> tuple[dict | None, float]:
    """Run `python -m jobs ARGS` with `settings`: (its last stdout line as JSON, or None; wall seconds)."""
    from jobs.ops.deploy import settings_env

    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "jobs", *args],
        env={**os.environ, **settings_env(settings)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    took = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError(f"mview {' '.join(args)} failed: {out.stderr.strip()[-400:]}")
    lines = out.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]), took
    except (IndexError, ValueError):
        return None, took


def _sql(dsn: str, *statements: str, params=None) -> float:
    """Run `statements` in one transaction; the seconds until its COMMIT returned."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        started = time.monotonic()
        with conn, conn.cursor() as cur:
            for s in statements:
                cur.execute(s, params)
        return time.monotonic() - started
    finally:
        conn.close()


def _capture_rate(settings, work: Path, rows: int) -> dict:
    dsn = settings.pg_dsn
    _sql(
        dsn,
        "CREATE TABLE profiles (user_id text PRIMARY KEY, name text, country text, updated_at timestamptz)",
        f"INSERT INTO profiles SELECT 'u' || i, 'n' || i, 'DE', NULL FROM generate_series(0, {rows - 1}) i",
    )
    snap, snap_wall = _mview(settings, "run", "cdc", "--once", "--json")
    update_s = _sql(dsn, "UPDATE profiles SET country = 'FR'")
    cap, cap_wall = _mview(settings, "run", "cdc", "--once", "--json")
    if snap["snapshot_rows"] != rows or cap["appended"] != rows:
        raise RuntimeError(f"captured {snap} then {cap}, expected {rows} rows then {rows} changes")
    records = work / "profiles.jsonl"
    with open(records, "w") as fh:
        for i in range(rows):
            fh.write(
                json.dumps({"op": "upsert", "user_id": f"u{i}", "name": f"n{i}", "country": "FR", "ts": i})
            )
            fh.write("\n")
    other = dataclasses.replace(settings, lake_dir=work / "lake-ingest")
    ing, ing_wall = _mview(other, "ingest", "profiles", str(records), "--json")
    return {
        "rows": rows,
        "update_commit_seconds": round(update_s, 2),
        "capture_seconds": cap["seconds"],
        "capture_commits": cap["commits"],
        "changes_per_s": round(rows / cap["seconds"]),
        "command_seconds": round(cap_wall, 2),
        "snapshot_seconds": snap["seconds"],
        "snapshot_rows_per_s": round(rows / snap["seconds"]),
        "snapshot_command_seconds": round(snap_wall, 2),
        "ingest_accepted": ing["accepted"],
        "ingest_command_seconds": round(ing_wall, 2),
        "ingest_records_per_s_command": round(ing["accepted"] / ing_wall),
    }


def _wait(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _deployed(settings) -> None:
    """Deploy `cdc` and `enrichment` and wait until the enrichment has read the logs (lag 0)."""
    from jobs.ops.deploy import deploy
    from jobs.ops.status import job_status

    for job in ("cdc", "enrichment"):
        if deploy(settings, job):
            raise RuntimeError(f"mview deploy {job} failed")

    def ready() -> bool:
        s = job_status(settings)["enrichment"]
        return bool(s["running"] and s.get("generation") and s["lag_versions"] == 0)

    _wait("the deployed enrichment to catch up", ready, 300)


def _sample(settings, client, work: Path, i: int, background: int, rng) -> dict:
    """One profile change and the event that uses it (see the module docstring): its latency and parts."""
    from changelog.ingest import ingest
    from changelog.topics import latest_version
    from views.read import query_view

    user, country, t = f"u{i % 1000}", f"Z{i}", int(time.time() * 1000)
    profiles = settings.topic("profiles")
    before = latest_version(settings.lake, profiles)
    _sql(
        settings.pg_dsn,
        "UPDATE profiles SET country = %s, updated_at = to_timestamp(%s / 1000.0) WHERE user_id = %s",
        params=(country, t, user),
    )
    committed = time.monotonic()
    events = [{"event_id": f"lat{i}", "user_id": user, "action": "view", "ts": t}]
    events += [
        {"event_id": f"bg{i}-{n}", "user_id": f"u{rng.randrange(1000, 100_000)}", "action": "view", "ts": t}
        for n in range(background)
    ]
    path = work / f"events-{i}.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    ingest(None, settings.lake, settings.topic("activity"), [str(path)])
    ingested = time.monotonic() - committed
    out = {"latency_s": None, "ingest_s": round(ingested, 3), "captured_s": None}
    while time.monotonic() - committed < 60:
        if out["captured_s"] is None and latest_version(settings.lake, profiles) > before:
            out["captured_s"] = round(time.monotonic() - committed, 3)
        if query_view(client, "activity_by_country", country).get("events", 0) >= 1:
            out["latency_s"] = round(time.monotonic() - committed, 3)
            break
        time.sleep(0.01)
    return out


def _batch_seconds(settings, job: str) -> list[float]:
    """The wall times of the deployed `job`'s micro-batches that did something, from its log's batch lines
    (`<job> g<g> batch <id>: ... in <s>s`), the catch-up batch first."""
    import re

    from jobs.ops.deploy import log_path

    try:
        text = log_path(settings, job).read_text()
    except OSError:
        return []
    return [float(m) for m in re.findall(rf"{job} g\d+ batch \d+: .* in ([0-9.]+)s$", text, re.M)]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def _latency(settings, work: Path, seconds: float, interval: float, background: int) -> dict:
    from changelog.topics import ensure_topic
    from jobs.ops.deploy import stop
    from views.redis_io import connect

    started = time.monotonic()
    ensure_topic(None, settings.lake, settings.topic("activity"))
    client, rng, samples = connect(settings.redis_url), random.Random(19), []
    try:  # (a failure while they start stops them too)
        _deployed(settings)
        say(f"cdc: cdc and enrichment deployed and caught up in {time.monotonic() - started:.0f}s")
        # the first sample warms the deployed query's code paths up: reported alone
        first = _sample(settings, client, work, 0, background, rng)["latency_s"]
        t_end = time.monotonic() + seconds
        i = 1
        while time.monotonic() < t_end:
            began = time.monotonic()
            samples.append(_sample(settings, client, work, i, background, rng))
            i += 1
            time.sleep(max(0.0, interval - (time.monotonic() - began)))
    finally:
        for job in ("enrichment", "cdc"):
            stop(settings, job)
    batches = _batch_seconds(settings, "enrichment")
    lat = sorted(s["latency_s"] for s in samples if s["latency_s"] is not None)
    return {
        "samples": len(samples),
        "seen": len(lat),
        "first_s": first,
        "interval_s": interval,
        "background_events": background,
        "p50_s": round(statistics.median(lat), 3) if lat else None,
        "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
        "max_s": lat[-1] if lat else None,
        "ingest_p50_s": statistics.median(s["ingest_s"] for s in samples) if samples else None,
        "captured_p50_s": _median([s["captured_s"] for s in samples]),
        "captured_max_s": max(
            (s["captured_s"] for s in samples if s["captured_s"] is not None), default=None
        ),
        "latencies_s": [s["latency_s"] for s in samples],
        "enrichment_batches": len(batches),
        "enrichment_batch_p50_s": _median(batches),
        "enrichment_batch_max_s": max(batches, default=None),
    }


def run(
    settings, *, rows: int = 100_000, seconds: float = 60.0, interval: float = 2.0, background: int = 100
):
    """The cdc figures (see the module docstring), against a PostgreSQL of its own; `settings` gives the lake and
    Redis."""
    from jobs.dev.postgres import scratch_postgres, stop_server

    work = Path(tempfile.mkdtemp(prefix="bench-cdc-"))
    root, port, pg_start = scratch_postgres()
    try:
        env = {
            "PG_DSN": f"host=127.0.0.1 port={port} dbname=mview user=mview",
            "PG_TABLE": "profiles",
            "PG_SLOT": "mview_profiles",
            "ALLOWED_LATENESS": "0 ms",
            "TRIGGER_INTERVAL": "200 ms",
            "METRICS_PORT": "off",
        }
        from jobs.core.settings import Settings
        from jobs.ops.deploy import settings_env

        cdc_settings = Settings.from_env({**os.environ, **settings_env(settings), **env})
        out = {"postgres_start_seconds": round(pg_start, 1)}
        out["capture"] = _capture_rate(cdc_settings, work, rows)
        say(f"cdc: capture {json.dumps(out['capture'])}")
        out["latency"] = _latency(cdc_settings, work, seconds, interval, background)
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        return out
    finally:
        stop_server(root / "pg")
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from jobs.core.settings import Settings

    p = argparse.ArgumentParser(prog="python -m bench.cdc", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args(argv)
    print(json.dumps(run(Settings.from_env(), rows=args.rows, seconds=args.seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
