"""Change data capture from a real PostgreSQL (the `pg` fixture): snapshot + stream, row changes, dead letters,
exactly once across a capture that dies before confirming."""

from __future__ import annotations

import threading
import time

import orjson
import pytest

from changelog.deadletters import read_dead_letters
from changelog.errors import CdcFailed, PostgresUnavailable
from changelog.postgres import PgSource, capture, drop_slot, wal_lag
from changelog.storage import as_lake
from spec.model import Topic
from tests.jobs.opshelp import wait_for
from tests.lakehelp import as_topic
from tests.pghelp import fold, log_commits


def _capture(pg, lake, **kw):
    return capture(PgSource(pg.dsn, pg.topics(), pg.slot), as_lake(lake), "state", once=True, **kw)


def _capture_killed_in_append(monkeypatch, pg, lake, *, after_commit: bool) -> None:
    """A capture that dies in its first append to the log: just after the Delta commit (before the slot hears
    of it), or just before."""
    from changelog import postgres

    real = postgres._Log.append

    def append(self, *args, **kw):
        if after_commit:
            real(self, *args, **kw)
        raise SystemExit("killed")

    monkeypatch.setattr(postgres._Log, "append", append)
    with pytest.raises(SystemExit):
        _capture(pg, lake)
    monkeypatch.undo()


def _records(lake):
    return [r for commit in log_commits(lake) for r in commit]


def _table(pg) -> dict:
    return {u: (n, c) for u, n, c in pg.sql("SELECT user_id, name, country FROM {t}")}


def test_snapshot_and_stream_with_writes_during_the_snapshot_lose_and_double_nothing(pg, tmp_path):
    lake = tmp_path / "lake"
    pg.sql("INSERT INTO {t} SELECT 'u' || i, 'n' || i, 'DE', NULL FROM generate_series(1, 30000) i")
    stop = threading.Event()
    writes = {"n": 0}

    def writer():  # one transaction per change, unique names: a doubled change shows as a repeated name
        c = pg.conn()
        c.autocommit = True
        with c.cursor() as cur:
            while not stop.is_set() or writes["n"] < 200:
                i = writes["n"] = writes["n"] + 1
                cur.execute(f"INSERT INTO {pg.name} VALUES (%s, %s, 'FR', NULL)", (f"w{i}", f"w{i}"))
                cur.execute(f"UPDATE {pg.name} SET name = %s WHERE user_id = %s", (f"x{i}", f"u{i}"))
                if i % 7 == 0:
                    cur.execute(f"DELETE FROM {pg.name} WHERE user_id = %s", (f"u{i + 1}",))
        c.close()

    t = threading.Thread(target=writer)
    t.start()
    while writes["n"] < 5:  # the writer runs before, during and after the snapshot
        time.sleep(0.01)
    before = writes["n"]
    first = _capture(pg, lake)
    during = writes["n"] - before
    stop.set()
    t.join()
    second = _capture(pg, lake)
    records = _records(lake)
    assert during > 0 and first["snapshot_rows"] >= 30000 and second["snapshot_rows"] == 0
    assert fold(records) == _table(pg)
    upserts = [(r["user_id"], r["name"]) for r in records if r["op"] == "upsert"]
    assert len(upserts) == len(set(upserts))  # no change twice
    inserted = {u for u, n in upserts if u.startswith("w")}  # every insert once, by snapshot or stream
    assert inserted == {f"w{i}" for i in range(1, writes["n"] + 1)}
    assert (
        wal_lag(PgSource(pg.dsn, pg.topics(), pg.slot)) < 8192
    )  # caught up (the server writes some WAL of its own)


def test_updates_deletes_reinsert_and_several_changes_in_one_transaction(pg, tmp_path):
    lake = tmp_path / "lake"
    pg.sql("INSERT INTO {t} SELECT 'u' || i, 'n' || i, 'DE', NULL FROM generate_series(1, 6) i")
    _capture(pg, lake)
    pg.sql("UPDATE {t} SET country = 'FR' WHERE user_id = 'u1'")
    pg.sql("DELETE FROM {t} WHERE user_id = 'u2'")
    pg.sql("DELETE FROM {t} WHERE user_id = 'u3'")
    pg.sql("INSERT INTO {t} VALUES ('u3', 'back', 'IT', NULL)")
    pg.sql(  # one transaction: three updates of u4, an insert and delete of u7
        "UPDATE {t} SET name = 'a' WHERE user_id = 'u4'",
        "UPDATE {t} SET name = 'b' WHERE user_id = 'u4'",
        "UPDATE {t} SET name = 'c', country = 'ES' WHERE user_id = 'u4'",
        "INSERT INTO {t} VALUES ('u7', 'gone', 'DE', NULL)",
        "DELETE FROM {t} WHERE user_id = 'u7'",
    )
    pg.sql("UPDATE {t} SET name = 'dated', updated_at = '2026-01-01T10:00:00.250Z' WHERE user_id = 'u5'")
    pg.sql("UPDATE {t} SET user_id = 'u60' WHERE user_id = 'u6'")
    _capture(pg, lake)
    stream = [r for commit in log_commits(lake)[1:] for r in commit]  # after the snapshot, in commit order
    got = [{k: v for k, v in r.items() if k != "ts"} for r in stream]
    assert got == [
        {"op": "upsert", "user_id": "u1", "name": "n1", "country": "FR"},
        {"op": "delete", "user_id": "u2"},
        {"op": "delete", "user_id": "u3"},
        {"op": "upsert", "user_id": "u3", "name": "back", "country": "IT"},
        {"op": "upsert", "user_id": "u4", "name": "c", "country": "ES"},
        {"op": "delete", "user_id": "u7"},
        {"op": "upsert", "user_id": "u5", "name": "dated", "country": "DE"},
        {"op": "delete", "user_id": "u6"},
        {"op": "upsert", "user_id": "u60", "name": "n6", "country": "DE"},
    ]
    ts = [r["ts"] for r in stream]
    assert ts[4] == ts[5]  # one transaction, one commit time
    assert ts[6] == 1767261600250  # updated_at wins over the commit time
    assert ts[7] == ts[8] and ts[:6] == sorted(ts[:6])
    (snapshot_ts,) = {r["ts"] for r in log_commits(lake)[0]}  # no updated_at: the time the snapshot was taken
    assert snapshot_ts < min(ts[:6])  # earlier than every streamed change of the same rows
    assert fold(_records(lake)) == _table(pg)


def test_bad_rows_and_schema_drift_become_dead_letters_with_the_lsn(pg, tmp_path):
    lake = tmp_path / "lake"
    pg.sql("INSERT INTO {t} VALUES ('u1', 'a', 'DE', NULL), ('', 'empty key', 'DE', NULL)")
    pg.sql("INSERT INTO {t} VALUES ('u2', NULL, 'DE', NULL)")
    first = _capture(pg, lake)
    assert (first["appended"], first["rejected"]) == (1, 2)
    pg.sql("INSERT INTO {t} VALUES ('u3', 'future', 'DE', '2200-01-01T00:00:00Z')")
    pg.sql("ALTER TABLE {t} RENAME COLUMN country TO land")
    pg.sql("INSERT INTO {t} VALUES ('u4', 'renamed', 'DE', NULL)")
    pg.sql("ALTER TABLE {t} RENAME COLUMN land TO country")
    pg.sql("INSERT INTO {t} VALUES ('u5', 'fine again', 'DE', NULL)")
    second = _capture(pg, lake)
    assert (second["appended"], second["rejected"]) == (1, 2)
    assert fold(_records(lake)) == {"u1": ("a", "DE"), "u5": ("fine again", "DE")}
    dead = list(read_dead_letters(as_lake(lake), as_topic("profiles")))
    reasons = [d["reason"] for d in dead]
    assert "field 'user_id' is empty" in reasons[0] or "field 'user_id' is empty" in reasons[1]
    assert any("missing field 'name'" in r for r in reasons[:2])
    assert "out of range" in reasons[2] and "no column 'country' (dropped or renamed?)" in reasons[3]
    assert all(set(d) >= {"file", "line", "lsn", "reason", "raw", "raw_bytes", "at"} for d in dead)
    assert dead[3]["lsn"] != dead[2]["lsn"] and "/" in dead[3]["lsn"]
    assert orjson.loads(dead[3]["raw"])["user_id"] == "u4"


def test_a_capture_that_dies_before_confirming_appends_nothing_twice(pg, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    pg.sql("INSERT INTO {t} SELECT 'u' || i, 'n' || i, 'DE', NULL FROM generate_series(1, 10) i")
    _capture(pg, lake)
    pg.sql("UPDATE {t} SET country = 'FR'")
    pg.sql("UPDATE {t} SET country = 'IT' WHERE user_id = 'u1'")

    _capture_killed_in_append(monkeypatch, pg, lake, after_commit=True)
    died_after = sum(len(c) for c in log_commits(lake))
    assert died_after in (20, 21)  # the first commit of the stream holds the first or both transactions
    again = _capture(pg, lake)
    assert again["appended"] == 21 - died_after  # what was committed is skipped, the rest comes once
    assert sum(len(c) for c in log_commits(lake)) == 21
    assert fold(_records(lake)) == _table(pg)


def test_drop_slot_removes_slot_and_publication_and_the_next_start_snapshots_again(pg, tmp_path):
    lake = tmp_path / "lake"
    pg.sql("INSERT INTO {t} VALUES ('u1', 'a', 'DE', '2026-01-01T00:00:00Z')")
    _capture(pg, lake)
    source = PgSource(pg.dsn, pg.topics(), pg.slot)
    assert drop_slot(source) == [f"replication slot {pg.slot}", f"publication {pg.slot}"]
    assert pg.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", params=(pg.slot,)) == [
        (0,)
    ]
    assert wal_lag(source) is None and drop_slot(source) == []
    assert _capture(pg, lake)["snapshot_rows"] == 1


def test_unreachable_database_and_unfit_table_are_one_line_errors(pg, tmp_path):
    bad = PgSource("host=127.0.0.1 port=1 dbname=x user=y password=s3cret", pg.topics(), pg.slot)
    with pytest.raises(PostgresUnavailable) as e:
        capture(bad, as_lake(tmp_path), as_lake(tmp_path), once=True)
    assert "port=1" in str(e.value) and "s3cret" not in str(e.value) and "\n" not in str(e.value)
    pg.sql("ALTER TABLE {t} DROP COLUMN country")
    with pytest.raises(CdcFailed, match="no column 'country'"):
        _capture(pg, tmp_path / "lake")


def test_a_role_without_replication_is_told_what_to_grant(pg, tmp_path):
    pg.sql("DROP ROLE IF EXISTS plain", "CREATE ROLE plain LOGIN", "GRANT SELECT ON {t} TO plain")
    dsn = pg.dsn.replace("user=mview", "user=plain")
    with pytest.raises(CdcFailed, match=f"run CREATE PUBLICATION {pg.slot} FOR TABLE {pg.name}") as e:
        capture(PgSource(dsn, pg.topics(), pg.slot), as_lake(tmp_path), as_lake(tmp_path), once=True)
    assert "user=plain" in str(e.value) and "\n" not in str(e.value)
    pg.sql(f"CREATE PUBLICATION {pg.slot} FOR TABLE {{t}}")  # as the owner: then the slot needs REPLICATION
    with pytest.raises(CdcFailed, match="ALTER ROLE <user> REPLICATION"):
        capture(PgSource(dsn, pg.topics(), pg.slot), as_lake(tmp_path), as_lake(tmp_path), once=True)
    pg.sql(f"DROP PUBLICATION {pg.slot}")


def test_a_transaction_sent_again_after_a_crash_before_its_commit_writes_its_dead_letters_once(
    pg, tmp_path, monkeypatch
):
    """The capture dies after a transaction's dead letters were written and before its Delta commit; the slot sends
    the transaction again, and each of its dead letters is in the log once, with its place in the transaction.
    A later transaction's dead letter, at the same place in its own transaction, is a new one."""
    from changelog import postgres

    lake = tmp_path / "lake"
    _capture(pg, lake)  # the snapshot of the empty table
    pg.sql("INSERT INTO {t} VALUES ('u1', NULL, 'DE', NULL), ('u2', 'ok', 'DE', NULL), ('', 'x', 'DE', NULL)")
    real = postgres._Log._dead_letters

    def dead_letters_then_die(self, txns, snapshot):
        real(self, txns, snapshot)
        raise SystemExit("killed")

    monkeypatch.setattr(postgres._Log, "_dead_letters", dead_letters_then_die)
    with pytest.raises(SystemExit):
        _capture(pg, lake)
    monkeypatch.undo()
    # the server ends the dead capture's walsender a moment after its connection closed: until then the slot is
    # active and a new capture is refused in one line (a deployed job retries)
    released = f"SELECT NOT active FROM pg_replication_slots WHERE slot_name = '{pg.slot}'"
    wait_for(lambda: pg.sql(released)[0][0], "the slot to be released", timeout_s=30)
    again = _capture(pg, lake)
    assert (again["appended"], again["rejected"]) == (1, 0)
    pg.sql("INSERT INTO {t} VALUES ('u3', NULL, 'DE', NULL)")
    assert _capture(pg, lake)["rejected"] == 1
    dead = list(read_dead_letters(as_lake(lake), as_topic("profiles")))
    assert [(d["line"], orjson.loads(d["raw"])["user_id"]) for d in dead] == [(1, "u1"), (3, ""), (1, "u3")]
    assert dead[0]["lsn"] == dead[1]["lsn"] != dead[2]["lsn"]
    assert fold(_records(lake)) == {"u2": ("ok", "DE")}


def test_truncate_is_a_dead_letter_not_a_silent_gap(pg, tmp_path):
    lake = tmp_path / "lake"
    pg.sql("INSERT INTO {t} VALUES ('u1', 'a', 'DE', NULL)")
    _capture(pg, lake)
    pg.sql("TRUNCATE {t}")
    assert _capture(pg, lake)["rejected"] == 1
    (dead,) = read_dead_letters(as_lake(lake), as_topic("profiles"))
    assert "TRUNCATE is not captured" in dead["reason"] and "/" in dead["lsn"]


def test_a_first_start_that_dies_before_its_snapshot_commit_starts_over(pg, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    pg.sql("INSERT INTO {t} SELECT 'u' || i, 'n' || i, 'DE', NULL FROM generate_series(1, 50) i")
    _capture_killed_in_append(monkeypatch, pg, lake, after_commit=False)
    assert pg.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", params=(pg.slot,)) == [
        (1,)
    ]
    pg.sql("UPDATE {t} SET country = 'FR' WHERE user_id = 'u1'")  # after the orphaned slot's snapshot
    again = _capture(pg, lake)
    assert (
        again["snapshot_rows"] == 50 and len(_records(lake)) == 50
    )  # a new snapshot, which holds the update
    assert fold(_records(lake)) == _table(pg)


# A pipeline's own captured tables: the shop's customers with a long, a double and a boolean column (`name` from the
# column full_name, `ts` from updated_at, an optional field without a column), and a second table of stores keyed by
# a bigint, its time a `timestamp` column (read as UTC), without `op:` (every change an upsert).
_OWN = """
topics:
  customers:
    fields: {customer_id: id, name: string, tier: string, visits: long, balance: double, vip: boolean, ts: timestamp,
             note: string}
    optional: [note]
    key: customer_id
    time: ts
    op: {upsert: upsert, remove: delete}
    capture: {postgres: "public.{t}_customers", columns: {ts: updated_at, name: full_name}}
  stores:
    fields: {store_id: long, city: string, opened: timestamp}
    key: store_id
    time: opened
    capture: {postgres: "{t}_stores"}
  orders:
    fields: {order_id: id, ts: timestamp}
    id: order_id
    time: ts
"""


def _own(pg, tables: bool = True):
    """(the source capturing the two tables of `_OWN` for `pg`, the pipeline's topics); the tables made first."""
    from changelog.postgres import captured_topics
    from views.pipeline import parse_pipeline

    if tables:
        pg.sql(
            "CREATE TABLE {t}_customers (customer_id text PRIMARY KEY, full_name text, tier varchar(10),"
            " visits integer, balance numeric, vip boolean, updated_at timestamptz)",
            "CREATE TABLE {t}_stores (store_id bigint PRIMARY KEY, city text, opened timestamp)",
        )
    topics = parse_pipeline(_OWN.replace("{t}", pg.name), "own.yml").topics
    captured = captured_topics(topics.values())
    assert [t.name for t in captured] == ["customers", "stores"]
    return PgSource(pg.dsn, captured, pg.slot), topics


def _dead(lake, topic: Topic) -> list[dict]:
    return list(read_dead_letters(as_lake(lake), topic))


_JAN1 = 1767225600000  # 2026-01-01T00:00:00Z


def test_the_captured_tables_of_a_pipelines_own_topics_fill_them_by_column_and_type(pg, tmp_path):
    """Two tables in one publication and one slot: the snapshot, then every change in commit order, each column
    read as its field's type (integer, numeric as a float, boolean, timestamptz and timestamp), a value that does
    not fit (NaN, a numeric past a float's range) and a delete of a topic without `op:` dead letters in their
    topic's log; each change once across runs."""
    lake = tmp_path / "lake"
    source, topics = _own(pg)
    pg.sql(
        "INSERT INTO {t}_customers VALUES ('c1', 'Ann', 'gold', 3, 12.50, true, '2026-01-01 10:00:00+00'),"
        " ('c2', 'Bob', 'silver', 0, -0.25, false, NULL)",
        "INSERT INTO {t}_stores VALUES (1, 'Berlin', '2026-01-01 08:00:00'), (2, 'Paris', NULL)",
    )
    first = capture(source, as_lake(lake), as_lake(lake / "state"), once=True)
    assert first["snapshot_rows"] == 4 and first["rejected"] == 0
    assert first["topics"] == {
        "customers": {"appended": 2, "rejected": 0},
        "stores": {"appended": 2, "rejected": 0},
    }
    ((c1, c2),) = log_commits(lake, topics["customers"])
    ((s1, s2),) = log_commits(lake, topics["stores"])
    taken = c2["ts"]  # no updated_at: the time the snapshot was taken
    assert c1 == {
        "op": "upsert", "customer_id": "c1", "name": "Ann", "tier": "gold", "visits": 3, "balance": 12.5,
        "vip": True, "ts": _JAN1 + 10 * 3_600_000,
    }  # fmt: skip
    assert c2 == {
        "op": "upsert", "customer_id": "c2", "name": "Bob", "tier": "silver", "visits": 0, "balance": -0.25,
        "vip": False, "ts": taken,
    }  # fmt: skip
    assert (s1, s2) == (
        {"store_id": 1, "city": "Berlin", "opened": _JAN1 + 8 * 3_600_000},
        {"store_id": 2, "city": "Paris", "opened": taken},
    )
    assert taken == s2["opened"] > _JAN1

    pg.sql("UPDATE {t}_customers SET visits = visits + 1, balance = 99.75 WHERE customer_id = 'c1'")
    pg.sql("UPDATE {t}_customers SET balance = 'NaN' WHERE customer_id = 'c2'")
    pg.sql("UPDATE {t}_customers SET balance = 1e400 WHERE customer_id = 'c2'")
    pg.sql("DELETE FROM {t}_customers WHERE customer_id = 'c2'")
    pg.sql("UPDATE {t}_customers SET customer_id = 'c9' WHERE customer_id = 'c1'")
    pg.sql("DELETE FROM {t}_stores WHERE store_id = 1")
    pg.sql("UPDATE {t}_stores SET city = 'Lyon' WHERE store_id = 2")
    pg.sql(  # one transaction, both tables
        "INSERT INTO {t}_customers VALUES ('c5', 'Eve', 'bronze', 2147483647, 0, true, NULL)",
        "INSERT INTO {t}_stores VALUES (9000000000, 'Rome', '2026-02-01 00:00:00')",
    )
    second = capture(source, as_lake(lake), as_lake(lake / "state"), once=True)
    assert second["topics"] == {
        "customers": {"appended": 5, "rejected": 2},
        "stores": {"appended": 2, "rejected": 1},
    }
    customers = [r for c in log_commits(lake, topics["customers"])[1:] for r in c]
    stores = [r for c in log_commits(lake, topics["stores"])[1:] for r in c]
    assert [(r["op"], r["customer_id"], r.get("visits"), r.get("balance")) for r in customers] == [
        ("upsert", "c1", 4, 99.75),
        ("delete", "c2", None, None),
        ("delete", "c1", None, None),
        ("upsert", "c9", 4, 99.75),
        ("upsert", "c5", 2147483647, 0.0),
    ]
    assert customers[0]["ts"] == _JAN1 + 10 * 3_600_000  # its updated_at, not the commit time
    assert customers[1]["ts"] > taken and set(customers[1]) == {"op", "customer_id", "ts"}
    assert (
        customers[4]["vip"] is True and "note" not in customers[4]
    )  # no column: null (absent when read back)
    assert stores == [
        {"store_id": 2, "city": "Lyon", "opened": stores[0]["opened"]},
        {"store_id": 9000000000, "city": "Rome", "opened": _JAN1 + 31 * 86_400_000},
    ]
    assert stores[0]["opened"] > taken  # no opened: the commit time
    dead = _dead(lake, topics["customers"])
    assert [d["reason"].split(": ", 1)[1] for d in dead] == [
        "field 'balance' must be a finite number, got nan",
        "field 'balance' must be a finite number, got inf",
    ]
    assert all(d["file"] == f"postgresql:public.{pg.name}_customers" and "/" in d["lsn"] for d in dead)
    (gone,) = _dead(lake, topics["stores"])
    assert (
        "topic stores has no remove records" in gone["reason"]
        and orjson.loads(gone["raw"])["store_id"] == "1"
    )
    published = pg.sql("SELECT tablename FROM pg_publication_tables WHERE pubname = %s", params=(pg.slot,))
    assert sorted(t for (t,) in published) == [f"{pg.name}_customers", f"{pg.name}_stores"]
    assert (
        capture(source, as_lake(lake), as_lake(lake / "state"), once=True)["appended"] == 0
    )  # nothing twice


def test_a_table_that_cannot_fill_its_topic_is_refused_in_one_line_before_anything_is_captured(pg, tmp_path):
    from changelog.errors import CdcFailed

    lake = tmp_path / "lake"
    pg.sql(
        "CREATE TABLE {t}_customers (customer_id text, full_name text, tier text, visits integer, balance real,"
        " vip boolean, updated_at timestamptz)",
        "CREATE TABLE {t}_stores (store_id bigint PRIMARY KEY, city text, opened timestamp)",
    )
    source, _topics = _own(pg, tables=False)
    with pytest.raises(CdcFailed) as e:
        capture(source, as_lake(lake), as_lake(lake / "state"), once=True)
    assert str(e.value) == (
        f"table public.{pg.name}_customers has no primary key, so PostgreSQL cannot publish its updates and"
        f" deletes: add one (customer_id) or ALTER TABLE public.{pg.name}_customers REPLICA IDENTITY FULL"
    )
    pg.sql(
        "ALTER TABLE {t}_customers ADD PRIMARY KEY (customer_id)",
        "ALTER TABLE {t}_customers ALTER visits TYPE text",
    )
    with pytest.raises(
        CdcFailed, match=r"column public\.\w+_customers\.visits has type text, which does not fill the long"
    ):
        capture(source, as_lake(lake), as_lake(lake / "state"), once=True)
    pg.sql("ALTER TABLE {t}_customers DROP COLUMN visits")
    with pytest.raises(CdcFailed, match="has no column 'visits' \\(dropped or renamed\\?\\)"):
        capture(source, as_lake(lake), as_lake(lake / "state"), once=True)
    count = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s"
    assert pg.sql(count, params=(pg.slot,)) == [(0,)]  # nothing captured: no slot made


def test_a_first_start_killed_between_the_topics_snapshot_commits_completes_them_once(
    pg, tmp_path, monkeypatch
):
    """The snapshot of several tables is staged before its commits: killed after the first topic's commit, the next
    start commits the others from it (the slot and its consistent point are kept), then streams; no row twice."""
    from changelog import postgres

    lake = tmp_path / "lake"
    source, topics = _own(pg)
    pg.sql(
        "INSERT INTO {t}_customers SELECT 'c' || i, 'n', 'gold', i, i, true, NULL FROM generate_series(1, 20) i",
        "INSERT INTO {t}_stores SELECT i, 'city', NULL FROM generate_series(1, 5) i",
    )
    real, calls = postgres._Log._commit, []

    def commit_then_die(self, *args, **kw):
        if calls:
            raise SystemExit("killed")
        calls.append(args[0])
        real(self, *args, **kw)

    monkeypatch.setattr(postgres._Log, "_commit", commit_then_die)
    with pytest.raises(SystemExit):
        capture(source, as_lake(lake), as_lake(lake / "state"), once=True)
    monkeypatch.undo()
    assert calls == ["customers"] and len(log_commits(lake, topics["customers"])) == 1
    assert (
        len(log_commits(lake, topics["stores"])) == 0
        and (lake / "state" / f"snapshot-{pg.slot}" / "lsn").exists()
    )
    pg.sql("UPDATE {t}_stores SET city = 'moved' WHERE store_id = 3")  # after the slot's consistent point
    again = capture(source, as_lake(lake), as_lake(lake / "state"), once=True)
    assert again["snapshot_rows"] == 0 and again["topics"]["stores"]["appended"] == 5 + 1
    assert [len(c) for c in log_commits(lake, topics["customers"])] == [20]
    assert [sorted(r["store_id"] for r in c) for c in log_commits(lake, topics["stores"])] == [
        [1, 2, 3, 4, 5],
        [3],
    ]
    assert log_commits(lake, topics["stores"])[1][0]["city"] == "moved"
    assert not (lake / "state" / f"snapshot-{pg.slot}").exists()
