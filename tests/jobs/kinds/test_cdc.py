"""The `cdc` job through the command line against a real PostgreSQL: run --once, a deployed job killed with
SIGKILL mid-stream and deployed again (each change once), status lag in WAL bytes, its Prometheus metrics,
stop --drop-slot; a captured row over the record limit (a dead letter exactly as `mview ingest` makes one); a
PG_DSN that cannot work (unparseable, a refused password: refused at deploy, a deployed job fails, the password
shown nowhere) beside a server that does not answer (waited for)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from changelog.deadletters import read_dead_letters
from jobs.dev.redis import free_port
from jobs.ops.deploy import settings_env
from tests.conftest import make_settings
from tests.jobs.opshelp import MVIEW, mview, one_line_error, status_of, wait_for
from tests.pghelp import fold, log_commits, password_role


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


def _scrape(url: str) -> dict:
    """{(sample name, labels without `job`): value} of a scrape of the metrics at `url`."""
    out = {}
    for family in text_string_to_metric_families(urllib.request.urlopen(url, timeout=10).read().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "job")))] = s.value
    return out


def _scraped(url: str) -> dict | None:
    """`_scrape(url)`, or None while nothing answers there yet (a job just deployed starts serving soon after)."""
    try:
        return _scrape(url)
    except OSError:
        return None


def test_cdc_once_deployed_killed_and_redeployed_captures_each_change_once(pg, redis_url, tmp_path, request):
    lake = tmp_path / "lake"
    settings = make_settings(lake, redis_url, METRICS_PORT=free_port(), **pg.env())
    request.addfinalizer(lambda: _mview(settings, "stop", "cdc"))  # no deployed job outlives a failed check
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

    # Its metrics: the input counter moves by exactly the changes committed (7 in 3 transactions, one a delete).
    url = status["metrics_url"]
    start = wait_for(lambda: _scraped(url), "the redeployed job's metrics to answer", 60)
    pg.sql("UPDATE {t} SET country = 'FR' WHERE user_id IN ('u1', 'u2', 'u3')")
    pg.sql(
        "UPDATE {t} SET name = 'again' WHERE user_id IN ('u4', 'u5')", "DELETE FROM {t} WHERE user_id = 'u6'"
    )
    pg.sql("INSERT INTO {t} VALUES ('new', 'n', 'IT', NULL)")
    key = ("mview_input_records_total", (("topic", "profiles"),))
    wait_for(lambda: _scrape(url)[key] - start[key] >= 7, "the 7 changes to be counted", 60)
    wait_for(lambda: _count(lake) == 500 + changes + 7, "the 7 changes in the log", 60)
    end = _scrape(url)
    assert end[key] - start[key] == 7
    assert end[("mview_rejected_records_total", (("topic", "profiles"),))] == 0
    batches = ("mview_batches_total", ())
    assert end[batches] - start[batches] in (1, 2, 3)  # a commit holds one or more transactions
    assert end[("mview_batch_duration_seconds_count", ())] == end[batches]
    assert (
        end[("mview_last_batch_timestamp_seconds", ())] >= start[("mview_last_batch_timestamp_seconds", ())]
    )
    assert ("mview_lag_bytes", ()) in end and ("mview_lag_versions", ()) not in end

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
    assert _mview(settings, "deploy", "cdc").returncode == 0  # deployed, it waits for the database
    status = wait_for(
        lambda: (s := status_of(settings, "cdc")).get("state") == "waiting" and s, "waiting", 60
    )
    assert status["running"] and "port=1" in status["error"] and status["retry_in_s"] >= 2
    assert (
        "hunter2" not in json.dumps(status)
        and "hunter2" not in (settings.lake_dir / "jobs/cdc/job.log").read_text()
    )
    assert "stopped" in _mview(settings, "stop", "cdc").stdout


def _history(pg) -> dict[str, list[tuple[int, tuple | None]]]:
    """Per user, the versions the database went through: (commit time in epoch ms, (name, country) or None for
    deleted), from the history trigger's rows and the server's commit timestamps; a transaction's last change of
    a row is its version."""
    rows = pg.sql(
        "SELECT user_id, name, country, deleted,"
        " floor(extract(epoch FROM pg_xact_commit_timestamp((xid % 4294967296)::text::xid)) * 1000)::bigint"
        " FROM {t}_hist ORDER BY seq"
    )
    out: dict[str, list] = {}
    for user, name, country, deleted, ms in rows:
        versions = out.setdefault(user, [])
        if versions and versions[-1][0] == ms:
            versions.pop()
        versions.append((ms, None if deleted else (name, country)))
    return out


def _as_of(history, event) -> dict:
    older = [v for v in history.get(event["user_id"], []) if v[0] <= event["ts"]]
    state = older[-1] if older else None
    found = state is not None and state[1] is not None
    return {
        **event,
        "profile_version": f"{event['user_id']}@{state[0]}" if found else None,
        "name": state[1][0] if found else None,
        "country": state[1][1] if found else None,
    }


def test_enrichment_of_the_captured_table_equals_the_as_of_truth_of_the_database(
    spark, pg, redis_url, tmp_path
):
    import random
    import time

    from changelog.ingest import ingest
    from jobs.kinds.cdc import run_cdc
    from tests.conftest import write_jsonl
    from tests.jobs.test_enrichment import export_enriched, run_enrichment

    settings = make_settings(tmp_path / "lake", redis_url, ALLOWED_LATENESS="0 ms", **pg.env())
    pg.sql(
        "CREATE TABLE {t}_hist (seq bigserial, xid bigint, user_id text, name text, country text, deleted bool)",
        "CREATE FUNCTION {t}_log() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO {t}_hist"
        " (xid, user_id, name, country, deleted) VALUES (txid_current(), COALESCE(NEW.user_id, OLD.user_id),"
        " NEW.name, NEW.country, TG_OP = 'DELETE'); RETURN NULL; END $$",
        "CREATE TRIGGER {t}_log AFTER INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_log()",
    )
    run_cdc(None, settings, once=True)  # the snapshot of the empty table: every version below is streamed
    rng = random.Random(7)
    c = pg.conn()
    for i in range(80):  # one transaction each, 3 ms apart: no two versions of a user share a commit time
        user, country = f"u{rng.randrange(6)}", rng.choice(["DE", "FR", "IT"])
        with c, c.cursor() as cur:
            if rng.random() < 0.2:
                cur.execute(f"DELETE FROM {pg.name} WHERE user_id = %s", (user,))
            else:
                for step in range(rng.choice([1, 1, 3])):  # sometimes several changes of the row at once
                    cur.execute(
                        f"INSERT INTO {pg.name} VALUES (%s, %s, %s, NULL) ON CONFLICT (user_id) DO UPDATE"
                        " SET name = EXCLUDED.name, country = EXCLUDED.country",
                        (user, f"{user}-{i}-{step}", country),
                    )
        time.sleep(0.003)
    c.close()
    run_cdc(None, settings, once=True)
    history = _history(pg)
    times = sorted({ms for versions in history.values() for ms, _ in versions})
    probes = sorted({t + d for t in times for d in (-1, 0, 1) if t + d <= times[-1]})  # the watermark's reach
    events = [
        {"event_id": f"e{n}", "user_id": f"u{n % 7}", "action": "view", "ts": ts}
        for n, ts in enumerate(probes)
    ]
    ingest(
        None, settings.lake, settings.topic("activity"), [write_jsonl(tmp_path / "activity.jsonl", events)]
    )
    run_enrichment(spark, settings, once=True)
    got = {r["event_id"]: r for r in export_enriched(spark, settings.lake_dir, 1)}
    assert got == {e["event_id"]: _as_of(history, e) for e in events}
    assert any(r["name"] is None for r in got.values()) and any(r["name"] for r in got.values())


def test_run_once_counts_the_snapshot_and_the_stream_in_its_metrics(pg, redis_url, tmp_path):
    from jobs.core.metrics import metrics_for
    from jobs.kinds.cdc import run_cdc

    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT=free_port(), **pg.env())
    metrics = metrics_for(settings, "cdc")  # one per job and process: other tests' runs may have counted

    def counted() -> tuple[float, float]:
        get = metrics.registry.get_sample_value
        return (
            get("mview_input_records_total", {"job": "cdc", "topic": "profiles"}),
            get("mview_batches_total", {"job": "cdc"}),
        )

    pg.sql("INSERT INTO {t} SELECT 'u' || i, 'n', 'DE', NULL FROM generate_series(1, 30) i")
    before = counted()
    assert run_cdc(None, settings, once=True)["snapshot_rows"] == 30
    snap = counted()
    assert (snap[0] - before[0], snap[1] - before[1]) == (30, 1)
    pg.sql(
        "UPDATE {t} SET country = 'FR' WHERE user_id IN ('u1', 'u2')", "DELETE FROM {t} WHERE user_id = 'u3'"
    )
    assert run_cdc(None, settings, once=True)["appended"] == 3
    assert (counted()[0] - snap[0], counted()[1] - snap[1]) == (3, 1)


def _ui_status(settings) -> str:
    """The body of `/api/status` of `mview ui` (the installed command, on a free port) for `settings`."""
    import time

    port = free_port()
    env = {**os.environ, **settings_env(settings)}
    ui = subprocess.Popen(
        [MVIEW, "ui", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(300):
            try:
                return (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5).read().decode()
                )
            except OSError:
                time.sleep(0.1)
        raise AssertionError("mview ui does not answer")
    finally:
        ui.terminate()
        ui.wait(20)


def _shown_nowhere(settings, secrets: tuple[str, ...], *outputs: str) -> dict:
    """Assert that none of `secrets` is in `outputs` (a command's stdout and stderr), the job's `status.json` and
    `job.log`, `mview status` (plain and `--json`) or `/api/status` of `mview ui`; return the cdc job's status."""
    job = settings.lake_dir / "jobs" / "cdc"
    plain, as_json = mview(settings, "status"), mview(settings, "status", "--json")
    assert plain.returncode == 0 and as_json.returncode == 0, plain.stderr + as_json.stderr
    seen = {
        "outputs": "\n".join(outputs),
        "status.json": (job / "status.json").read_text() if (job / "status.json").exists() else "",
        "job.log": (job / "job.log").read_text() if (job / "job.log").exists() else "",
        "mview status": plain.stdout + plain.stderr,
        "mview status --json": as_json.stdout + as_json.stderr,
        "/api/status": _ui_status(settings),
    }
    for where, text in seen.items():
        for secret in secrets:
            assert secret not in text, f"{secret!r} shown in {where}: {text[-2000:]}"
    return json.loads(as_json.stdout.splitlines()[-1])["cdc"]


def _deployed_meets(settings, what: str) -> dict:
    """Start the process `mview deploy cdc` starts (`mview run cdc`, no --once) as if it had been deployed before
    PG_DSN went bad: it must stop by itself (exit 1, `state: failed`), not retry; return its status."""
    env = {**os.environ, **settings_env(settings)}
    proc = subprocess.Popen(
        [MVIEW, "run", "cdc"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"a deployed cdc job retries {what} (a permanent error): {err[-1500:]}"
        ) from None
    assert proc.returncode == 1, err
    status = status_of(settings, "cdc")
    assert status["state"] == "failed" and not status["running"] and status.get("retry_in_s") is None, status
    return {**status, "stdout": out, "stderr": err}


@pytest.fixture
def stop_cdc():
    """`stop_cdc(settings)`: the cdc job deployed with `settings` is stopped when the test ends, however it ends."""
    deployed = []
    yield deployed.append
    for settings in deployed:
        mview(settings, "stop", "cdc")


def test_an_unparseable_pg_dsn_is_permanent_and_its_password_is_never_shown(
    pg, pg_server, redis_url, tmp_path, stop_cdc
):
    secret = f"Secret-{os.getpid()}x"
    dsn = f"postgresql://u:{secret}@[::1:{pg_server['port']}/mview"  # an IPv6 address with no "]"
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", **{**pg.env(), "PG_DSN": dsn})
    stop_cdc(settings)

    deploy = mview(settings, "deploy", "cdc")
    line = one_line_error(deploy, "PG_DSN is not a valid connection string", "postgresql://u:***@[::1:")
    assert "see the server's log" not in line and "make postgres" not in line
    assert not (settings.lake_dir / "jobs" / "cdc" / "pid").exists()  # nothing started
    once = mview(settings, "run", "cdc", "--once")
    assert one_line_error(once, "PG_DSN is not a valid connection string") == line
    _shown_nowhere(settings, (secret,), deploy.stdout, deploy.stderr, once.stdout, once.stderr)

    failed = _deployed_meets(settings, "an unparseable PG_DSN")
    assert failed["error"] == line.removeprefix("mview: "), failed
    shown = _shown_nowhere(settings, (secret,), failed["stdout"], failed["stderr"])
    assert shown["state"] == "failed" and shown["error"] == failed["error"]


def test_a_refused_password_is_permanent_an_unreachable_server_is_waited_for(
    pg, pg_server, redis_url, tmp_path, stop_cdc
):
    good, wrong = f"G00d-{os.getpid()}x", f"Wr0ng-{os.getpid()}x"
    dsn = password_role(pg_server, pg, good)
    env = {**pg.env(), "PG_DSN": dsn}
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", **env)
    refused = make_settings(
        settings.lake_dir, redis_url, METRICS_PORT="off", **{**env, "PG_DSN": dsn.replace(good, wrong)}
    )
    secrets = (good, wrong)
    stop_cdc(settings)

    deploy = mview(refused, "deploy", "cdc")
    line = one_line_error(
        deploy, "refused the credentials", "password in PG_DSN", "password authentication failed"
    )
    assert "make postgres" not in line and "start it" not in line
    assert not (settings.lake_dir / "jobs" / "cdc" / "pid").exists()  # nothing started
    once = mview(refused, "run", "cdc", "--once")
    assert one_line_error(once, "refused the credentials") == line
    _shown_nowhere(refused, secrets, deploy.stdout, deploy.stderr, once.stdout, once.stderr)

    # deployed with the right password, which then stops working: the job fails, it does not retry
    deployed = mview(settings, "deploy", "cdc")
    assert deployed.returncode == 0, deployed.stderr
    pg.sql("INSERT INTO {t} VALUES ('u1', 'n1', 'DE', NULL)")
    wait_for(lambda: _count(settings.lake_dir) == 1, "the deployed cdc job captures the row", 120)
    role = dsn.split("user=")[1].split()[0]
    pg.sql(f"ALTER ROLE {role} PASSWORD 'changed-{os.getpid()}'")
    pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", params=(role,))
    status = wait_for(
        lambda: (s := status_of(settings, "cdc"))["state"] == "failed" and not s["running"] and s,
        "the deployed cdc job fails on the refused password",
        120,
    )
    assert "refused the credentials" in status["error"] and "password in PG_DSN" in status["error"], status
    assert status.get("retry_in_s") is None
    _shown_nowhere(settings, secrets)

    # nothing answers: deployed all the same, and it waits (retried, not failed)
    away = make_settings(
        settings.lake_dir,
        redis_url,
        METRICS_PORT="off",
        **{**env, "PG_DSN": f"host=127.0.0.1 port={free_port()} password={good}"},
    )
    deployed = mview(away, "deploy", "cdc")
    assert deployed.returncode == 0 and "does not answer yet: the job waits for it" in deployed.stdout, (
        deployed
    )
    waiting = wait_for(lambda: (s := status_of(away, "cdc")).get("state") == "waiting" and s, "waiting", 60)
    assert waiting["running"] and waiting["retry_in_s"] >= 2 and "make postgres" in waiting["error"]
    _shown_nowhere(away, secrets, deployed.stdout, deployed.stderr)
    assert mview(away, "stop", "cdc").returncode == 0


def test_a_captured_row_over_the_record_limit_is_a_dead_letter_exactly_as_ingest_makes_it(
    pg, redis_url, tmp_path
):
    import orjson

    from changelog.records import MAX_RECORD_BYTES

    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", **pg.env())

    def line(user: str, name: str) -> bytes:
        """The record's JSON line of a row without updated_at (its ts: a commit time, 13 digits)."""
        return orjson.dumps(
            {"op": "upsert", "user_id": user, "name": name, "country": "DE", "ts": 1_700_000_000_000}
        )

    room = MAX_RECORD_BYTES - len(line("h2", ""))
    fits, over = "F" * room, "O" * (room + 1)  # records of exactly the maximum and of one byte more
    assert len(line("h2", fits)) == MAX_RECORD_BYTES and len(line("h3", over)) == MAX_RECORD_BYTES + 1
    pg.sql("INSERT INTO {t} VALUES ('h1', repeat('N', 5*1024*1024), 'DE', clock_timestamp())")
    pg.sql("INSERT INTO {t} VALUES ('h2', %s, 'DE', NULL)", params=(fits,))
    first = mview(settings, "run", "cdc", "--once", "--json")  # the snapshot
    assert first.returncode == 0, first.stderr
    pg.sql("INSERT INTO {t} VALUES ('h3', %s, 'DE', NULL)", params=(over,))
    pg.sql(
        "INSERT INTO {t} VALUES ('h4', repeat('N', 5*1024*1024), 'DE', clock_timestamp()), ('h5', 'n5', 'FR', NULL)"
    )
    second = mview(settings, "run", "cdc", "--once", "--json")  # the stream
    assert second.returncode == 0, second.stderr
    assert [json.loads(r.stdout.splitlines()[-1])["rejected"] for r in (first, second)] == [1, 2]

    kept = {r["user_id"]: r for c in log_commits(settings.lake_dir) for r in c}
    assert sorted(kept) == ["h2", "h5"] and kept["h2"]["name"] == fits  # at the limit: kept whole
    dead = list(read_dead_letters(settings.lake, settings.topic("profiles")))
    assert [d["raw"][:30] for d in dead] == [
        '{"op":"upsert","user_id":"h1",',
        '{"op":"upsert","user_id":"h3",',
        '{"op":"upsert","user_id":"h4",',
    ]
    for d in dead:
        size = d["raw_bytes"]
        table = d["file"].removeprefix("postgresql:")  # the snapshot names PG_TABLE, the stream schema.table
        assert size > MAX_RECORD_BYTES and len(d["raw"]) == 1_000 and table.endswith(pg.name)
        assert d["reason"] == (
            f"{table}: record of {size:,} bytes exceeds the maximum record size of {MAX_RECORD_BYTES:,} bytes"
        )
        assert isinstance(d["lsn"], str) and "/" in d["lsn"]
    assert dead[0]["raw_bytes"] > 5 * 1024 * 1024 and dead[2]["raw_bytes"] > 5 * 1024 * 1024
    assert dead[1]["raw_bytes"] == MAX_RECORD_BYTES + 1

    # the same records through `mview ingest`: the same verdicts, reasons, sizes and raw text
    (tmp_path / "same.jsonl").write_bytes(line("h3", over) + b"\n" + line("h2", fits) + b"\n")
    ingested = mview(settings, "ingest", "profiles", str(tmp_path / "same.jsonl"), "--json")
    assert json.loads(ingested.stdout.splitlines()[-1]) == {"topic": "profiles", "accepted": 1, "rejected": 1}
    by_ingest = list(read_dead_letters(settings.lake, settings.topic("profiles")))[
        -1
    ]  # `ingest-...` sorts after `cdc-...`
    assert by_ingest["reason"] == dead[1]["reason"].split(": ", 1)[1]
    assert (by_ingest["raw"], by_ingest["raw_bytes"]) == (dead[1]["raw"], dead[1]["raw_bytes"])
