"""PostgreSQL fixtures: one real server (Debian's PostgreSQL 15, `wal_level=logical`) per test session on a free
port, run as the `postgres` system user when the tests run as root; each test gets its own table and slot."""

from __future__ import annotations

import itertools
import shutil

import psycopg2
import pytest

from changelog.storage import as_lake
from jobs.dev.postgres import scratch_postgres, stop_server
from jobs.errors import JobsError
from spec.model import Topic
from tests.devhelp import servers_allowed
from tests.lakehelp import as_topic, log_rows

__all__ = ["pg_server", "pg", "PgTable", "password_role", "log_commits", "fold"]

_SEQ = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server(request):
    servers_allowed(request, "PostgreSQL")
    try:
        root, port, _took = scratch_postgres()
    except JobsError as e:
        pytest.fail(f"cannot start the test PostgreSQL: {e}")
    yield {"dsn": f"host=127.0.0.1 port={port} dbname=mview user=mview", "port": port, "root": root}
    stop_server(root / "pg")
    shutil.rmtree(root, ignore_errors=True)


class PgTable:
    """A fresh captured table (`name`, with `updated_at` unless made without) and its own slot name, in the
    session's server. `sql` runs statements in one transaction (autocommit off), `conn()` a new connection."""

    def __init__(self, dsn: str, name: str, slot: str):
        self.dsn, self.name, self.slot = dsn, name, slot

    def conn(self):
        return psycopg2.connect(self.dsn)

    def sql(self, *statements, params=None):
        with self.conn() as c, c.cursor() as cur:
            for s in statements:
                cur.execute(s.replace("{t}", self.name), params)
            rows = cur.fetchall() if cur.description else None
        c.close()
        return rows

    def env(self) -> dict[str, str]:
        return {"PG_DSN": self.dsn, "PG_TABLE": self.name, "PG_SLOT": self.slot}

    def topics(self) -> tuple:
        """The built-in pipeline's `profiles` topic captured from this table (what the cdc job captures with
        `env()`), as `changelog.postgres.PgSource` takes it."""
        from views.pipeline import builtin_pipeline

        return (builtin_pipeline({"PG_TABLE": self.name}).topics["profiles"],)


@pytest.fixture
def pg(pg_server):
    n = next(_SEQ)
    t = PgTable(pg_server["dsn"], f"profiles_{n}", f"mview_t{n}")
    t.sql(
        "CREATE TABLE {t} (user_id text PRIMARY KEY, name text, country text, updated_at timestamptz)",
    )
    yield t
    with (
        t.conn() as c,
        c.cursor() as cur,
    ):  # a test that left its slot behind must not hold WAL for the others
        cur.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s"
            " AND NOT active",
            (t.slot,),
        )
    c.close()


def password_role(pg_server, pg: PgTable, password: str) -> str:
    """A login role of `pg`'s own (a superuser, so it may capture `pg`'s table) whose password the server checks:
    scram-sha-256 for that role alone (a line at the top of the session server's pg_hba.conf, then a reload; every
    other role stays trusted). Returns the PG_DSN that logs in as it with `password`."""
    import time

    role = f"{pg.slot}_pw"
    hba = pg_server["root"] / "pg" / "data" / "pg_hba.conf"
    line = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    text = hba.read_text()
    if line not in text:
        hba.write_text(line + text)
    pg.sql(f"DROP ROLE IF EXISTS {role}", "SELECT pg_reload_conf()")
    pg.sql(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD %s", params=(password,))
    dsn = f"host=127.0.0.1 port={pg_server['port']} dbname=mview user={role}"
    for _ in range(100):  # the reload is asynchronous: wait until a wrong password is refused
        try:
            psycopg2.connect(f"{dsn} password=not-{password}", connect_timeout=3).close()
        except psycopg2.OperationalError:
            return f"{dsn} password={password}"
        time.sleep(0.05)
    raise AssertionError(f"the server does not check the password of {role} after a reload of {hba}")


def log_commits(lake_dir, topic: Topic | str = "profiles") -> list[list[dict]]:
    """The records per Delta commit (version 1 on) of the log of `topic` (a Topic, or a topic of the built-in pipeline
    by name; default: `profiles`), each
    commit's in the order written, read with delta-rs (no Spark)."""
    from collections import Counter

    from changelog.topics import table_version, topic_path

    out, before = [], Counter()
    last = table_version(as_lake(topic_path(as_lake(lake_dir), as_topic(topic))))
    for v in range(1, last + 1):
        now = [tuple(r.items()) for r in log_rows(lake_dir, topic, version=v)]
        new, seen = [], Counter(before)
        for r in now:
            if seen[r] > 0:
                seen[r] -= 1
            else:
                new.append({k: x for k, x in r if x is not None})
        out.append(new)
        before = Counter(now)
    return out


def fold(records) -> dict[str, dict]:
    """The table a changelog describes: user_id -> (name, country) after applying `records` in order."""
    table = {}
    for r in records:
        if r["op"] == "delete":
            table.pop(r["user_id"], None)
        else:
            table[r["user_id"]] = (r["name"], r["country"])
    return table
