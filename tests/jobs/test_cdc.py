"""The `cdc` job through the command line against a real PostgreSQL: run --once, a deployed job killed with
SIGKILL mid-stream and deployed again (each change once), status lag in WAL bytes, stop --drop-slot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from jobs.deploy import settings_env
from tests.conftest import make_settings
from tests.jobs.opshelp import status_of, wait_for
from tests.pghelp import fold, log_commits


def _mview(settings, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, **settings_env(settings)}
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args], env=env, capture_output=True, text=True, timeout=300
    )


def _count(lake) -> int:
    try:
        return sum(len(c) for c in log_commits(lake))
    except Exception:  # noqa: BLE001 - the log may not exist yet
        return 0


def test_cdc_once_deployed_killed_and_redeployed_captures_each_change_once(pg, redis_url, tmp_path):
    lake = tmp_path / "lake"
    settings = make_settings(lake, redis_url, METRICS_PORT="off", **pg.env())
    pg.sql("INSERT INTO {t} SELECT 'u' || i, 'n' || i, 'DE', NULL FROM generate_series(1, 500) i")
    once = _mview(settings, "run", "cdc", "--once", "--json")
    assert once.returncode == 0, once.stderr
    assert json.loads(once.stdout.splitlines()[-1])["snapshot_rows"] == 500
    assert "SparkSession" not in once.stderr and not (lake / "checkpoints").exists()

    changes = 600
    done = threading.Event()

    def writer():  # one change per transaction, each a new name
        c = pg.conn()
        c.autocommit = True
        with c.cursor() as cur:
            for i in range(1, changes + 1):
                cur.execute(
                    f"UPDATE {pg.name} SET name = %s WHERE user_id = %s", (f"c{i}", f"u{i % 500 + 1}")
                )
        c.close()
        done.set()

    deployed = _mview(settings, "deploy", "cdc")
    assert deployed.returncode == 0, deployed.stderr
    t = threading.Thread(target=writer)
    t.start()
    wait_for(lambda: _count(lake) > 500 + 50, "the deployed cdc job captures changes", 120)
    pid = status_of(settings, "cdc")["pid"]
    os.killpg(pid, signal.SIGKILL)
    t.join()
    assert _mview(settings, "deploy", "cdc").returncode == 0
    wait_for(lambda: _count(lake) >= 500 + changes, "the redeployed cdc job catches up", 120)
    status = wait_for(lambda: (s := status_of(settings, "cdc"))["lag_versions"] < 8192 and s, "lag 0", 60)
    assert status["running"] and status["rejected"] == 0
    records = [r for c in log_commits(lake) for r in c]
    assert len(records) == 500 + changes  # each change exactly once across the kill
    names = [r["name"] for r in records[500:]]
    assert sorted(names) == sorted(f"c{i}" for i in range(1, changes + 1))
    assert fold(records) == {u: (n, c) for u, n, c in pg.sql("SELECT user_id, name, country FROM {t}")}

    stopped = _mview(settings, "stop", "cdc", "--drop-slot")
    assert stopped.returncode == 0, stopped.stderr
    assert f"removed replication slot {pg.slot} and publication {pg.slot}" in stopped.stdout
    assert pg.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", params=(pg.slot,)) == [
        (0,)
    ]
    assert status_of(settings, "cdc")["lag_versions"] is None


def test_cdc_without_a_database_says_so_in_one_line(pg, redis_url, tmp_path):
    env = {**pg.env(), "PG_DSN": "host=127.0.0.1 port=1 dbname=mview user=mview password=hunter2"}
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", **env)
    out = _mview(settings, "run", "cdc", "--once")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "PG_DSN (" in lines[0] and "port=1" in lines[0] and "hunter2" not in lines[0]
