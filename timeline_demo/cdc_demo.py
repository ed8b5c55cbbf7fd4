"""The change data capture demo (`make demo-cdc`, `python -m timeline_demo.cdc_demo`): profiles live in
PostgreSQL, the `cdc` job captures them into the `profiles` log, the `enrichment` job joins activity with them
as of each event's time.

Steps, against PG_DSN (default `make postgres`'s server), PG_TABLE (default `profiles`, created if missing:
`user_id text PRIMARY KEY, name text, country text`, so a version's `ts` is its commit time), REDIS_URL and
LAKE_DIR; the deployed jobs run with `ALLOWED_LATENESS=0 ms` (an event is emitted as soon as a change at or after
its `ts` has been captured) and `TRIGGER_INTERVAL=200 ms`:
1. upserts three users in DE, deploys `cdc` and `enrichment` (those not running already);
2. ingests one activity event per user, then `UPDATE <table> SET country = 'FR'` for two of them, then one more
   event per user; then a new user signs up (an INSERT), whose commit moves the profiles watermark past the
   second events so they are emitted;
3. prints each event's enrichment and checks that events before the UPDATE carry the old version (DE) and
   events after it the new one (FR) (the third user's events both DE, one version);
4. runs `mview replay enrichment` (a new generation rebuilt from the logs) and checks the same answer there;
5. stops the jobs it deployed. Exit 0 when every check held, 1 otherwise.

The events' ids carry the run's start time, so a re-run checks only its own events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main", "run_demo"]

_USERS = {"alice": "FR", "bob": "FR", "carol": None}  # user -> new country (None: unchanged)
_JOBS = ("cdc", "enrichment")


def _say(msg: str) -> None:
    print(msg, flush=True)


def _settings():
    from jobs.core.settings import Settings
    from jobs.dev.postgres import DEV_DSN

    env = dict(os.environ)
    env["PG_DSN"] = env.get("PG_DSN") or DEV_DSN
    env.update({"ALLOWED_LATENESS": "0 ms", "TRIGGER_INTERVAL": "200 ms"})
    return Settings.from_env(env)


def _table(settings) -> str:
    """The table the built-in pipeline captures into `profiles` (PG_TABLE, read by its file)."""
    return settings.pipeline().topics["profiles"].capture.postgres


def _sql(settings, *statements: str, params=None) -> None:
    import psycopg2

    conn = psycopg2.connect(settings.pg_dsn)
    try:
        with conn, conn.cursor() as cur:
            for s in statements:
                cur.execute(s.replace("{t}", _table(settings)), params)
    finally:
        conn.close()


def _has_updated_at(settings) -> bool:
    import psycopg2

    conn = psycopg2.connect(settings.pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'updated_at'",
                (_table(settings).rpartition(".")[2],),
            )
            return cur.fetchone() is not None
    finally:
        conn.close()


def _ingest(settings, events: list[dict], path: Path) -> None:
    from changelog.ingest import ingest

    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    ingest(None, settings.lake, settings.topic("activity"), [str(path)])


def _events(tag: str, when: str, ts: int) -> list[dict]:
    return [
        {"event_id": f"cdcdemo-{tag}-{when}-{u}", "user_id": u, "action": "view", "ts": ts} for u in _USERS
    ]


def _enriched(settings, tag: str) -> tuple[int | None, dict[str, dict]]:
    """(serving generation, {event_id: enriched row}) of this run's events in the serving output log."""
    from deltalake import DeltaTable, QueryBuilder

    from changelog.topics import table_version
    from views.log import log_key
    from views.redis_io import connect, current_generation

    gen = current_generation(connect(settings.redis_url), "enrichment")
    key = log_key("enriched_activity", gen) if gen else None
    if (
        key is None or table_version(settings.lake, key) < 0
    ):  # Spark makes _delta_log before it writes version 0
        return gen, {}
    t = (
        QueryBuilder()
        .register("t", DeltaTable(settings.lake.uri(key)))
        .execute(f"SELECT * FROM t WHERE event_id LIKE 'cdcdemo-{tag}-%'")
        .read_all()
    )
    cols = {n: t.column(n).to_pylist() for n in t.column_names}
    rows = [{n: cols[n][i] for n in cols} for i in range(t.num_rows)]
    return gen, {r["event_id"]: r for r in rows}


def _wait_enriched(settings, tag: str, n: int, timeout: float = 180) -> tuple[int | None, dict]:
    deadline = time.monotonic() + timeout
    while True:
        gen, rows = _enriched(settings, tag)
        if len(rows) >= n or time.monotonic() > deadline:
            return gen, rows
        time.sleep(0.5)


def _check(rows: dict, tag: str, label: str) -> bool:
    """Print the events' enrichment; True when each carries the version the contract says."""
    ok = True
    _say(f"\n{label}:")
    _say(f"  {'event':<34} {'user':<6} {'country':<8} profile_version")
    for when in ("before", "after"):
        for user, new in _USERS.items():
            eid = f"cdcdemo-{tag}-{when}-{user}"
            r = rows.get(eid)
            want = new if (when == "after" and new) else "DE"
            good = r is not None and r["country"] == want
            ok &= good
            got = f"{r['country']:<8} {r['profile_version']}" if r else "(not emitted)"
            _say(f"  {eid:<34} {user:<6} {got}   {'ok' if good else f'WRONG: want {want}'}")
    return ok


def _mview(settings, *args: str) -> int:
    """Run `mview ARGS` with the demo's settings; print its last lines of output (the summary)."""
    from jobs.ops.deploy import settings_env

    env = {**os.environ, **settings_env(settings)}
    out = subprocess.run([sys.executable, "-m", "jobs", *args], env=env, capture_output=True, text=True)
    lines = (out.stdout + (out.stderr if out.returncode else "")).strip().splitlines()
    for line in lines[-3:]:
        _say(f"  {line}")
    return out.returncode


# long: the demo's steps read best in order
def run_demo(settings) -> bool:
    from changelog.topics import ensure_topic
    from jobs.ops.deploy import deploy, pid_of, stop

    tag = str(int(time.time() * 1000))
    _sql(settings, "CREATE TABLE IF NOT EXISTS {t} (user_id text PRIMARY KEY, name text, country text)")
    stamp = ", updated_at = clock_timestamp()" if _has_updated_at(settings) else ""
    for user in _USERS:
        _sql(
            settings,
            "INSERT INTO {t} (user_id, name, country) VALUES (%(u)s, %(u)s, 'DE') ON CONFLICT (user_id)"
            f" DO UPDATE SET country = 'DE'{stamp}",
            params={"u": user},
        )
    _say(f"profiles in PostgreSQL ({_table(settings)}): {', '.join(_USERS)} in DE")
    ensure_topic(None, settings.lake, settings.topic("activity"))
    started = [j for j in _JOBS if pid_of(settings, j) is None]
    for job in started:
        if deploy(settings, job):
            raise SystemExit(f"demo-cdc: mview deploy {job} failed")
    try:
        time.sleep(0.05)
        _ingest(
            settings, _events(tag, "before", int(time.time() * 1000)), settings.lake_dir / "cdc-demo-1.jsonl"
        )
        time.sleep(0.05)
        changed = [u for u, c in _USERS.items() if c]
        _say(f"SQL: UPDATE {_table(settings)} SET country = 'FR' WHERE user_id IN ({', '.join(changed)})")
        _sql(
            settings,
            f"UPDATE {{t}} SET country = 'FR'{stamp} WHERE user_id = ANY(%(users)s)",
            params={"users": changed},
        )
        time.sleep(0.05)
        _ingest(
            settings, _events(tag, "after", int(time.time() * 1000)), settings.lake_dir / "cdc-demo-2.jsonl"
        )
        time.sleep(0.05)
        _say(f"SQL: INSERT INTO {_table(settings)} VALUES ('dave-{tag}', ...) (moves the profiles watermark)")
        _sql(
            settings,
            "INSERT INTO {t} (user_id, name, country) VALUES (%s, 'dave', 'IT')",
            params=(f"dave-{tag}",),
        )
        _say("waiting for the deployed cdc and enrichment jobs (the first start of Spark takes ~30 s)...")
        gen, rows = _wait_enriched(settings, tag, 2 * len(_USERS))
        ok = _check(rows, tag, f"deployed jobs, generation {gen}")
        _say("\nmview replay enrichment: rebuild from the logs into a new generation")
        if _mview(settings, "replay", "enrichment") != 0:
            _say("replay failed")
            return False
        gen2, replayed = _wait_enriched(settings, tag, 2 * len(_USERS), 60)
        ok &= gen2 != gen and _check(replayed, tag, f"after the replay, generation {gen2}")
        same = {k: (r["country"], r["profile_version"]) for k, r in rows.items()} == {
            k: (r["country"], r["profile_version"]) for k, r in replayed.items()
        }
        ok &= same
        _say(f"\nreplay gives the same answer: {same}")
        return ok
    finally:
        for job in reversed(started):
            stop(settings, job)


def main(argv: list[str] | None = None) -> int:
    settings = _settings()
    t = time.monotonic()
    ok = run_demo(settings)
    _say(f"\ndemo-cdc: {'every check held' if ok else 'a check FAILED'} ({time.monotonic() - t:.0f}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
