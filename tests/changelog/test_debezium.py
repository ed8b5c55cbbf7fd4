"""The real Debezium PostgreSQL connector (Kafka Connect standalone, jars from Maven Central) against the test
PostgreSQL: its change events, copied by the `kafka` job (JSON with the schema/payload wrapper) and stored by
`mview ingest` (JSON without it), give the same records, and by the contract's rule the same versions (user,
`ts`, fields), as the `cdc` job capturing the same table. Debezium sends one event per change where `cdc` writes
one record per key and transaction; a delete's tombstone (a null message) is skipped."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from changelog.ingest import ingest
from changelog.kafka import ensure_kafka_topics, kafka_topic, watermarks
from changelog.storage import as_lake
from jobs.dev.connect import (
    CONNECT_VERSION,
    DEBEZIUM_VERSION,
    connect_lib,
    debezium_postgres,
    scratch_connect,
    wait_connect,
)
from jobs.errors import KafkaConnectFailed
from tests.conftest import make_settings
from tests.jobs.opshelp import mview_here
from tests.lakehelp import as_topic
from tests.pghelp import fold, log_commits

_CHANGES = [  # (statements of one transaction, the changes it makes)
    (["INSERT INTO {t} VALUES ('u3', 'c', 'IT', NULL)"], 1),
    (["UPDATE {t} SET country = 'ES', updated_at = '2026-02-01 10:00:00.5+00' WHERE user_id = 'u1'"], 1),
    (
        [
            "UPDATE {t} SET name = 'c2' WHERE user_id = 'u3'",
            "UPDATE {t} SET country = 'PT' WHERE user_id = 'u3'",
        ],
        2,
    ),
    (["UPDATE {t} SET name = 'b2', updated_at = NULL WHERE user_id = 'u2'"], 1),
    (["DELETE FROM {t} WHERE user_id = 'u2'"], 1),
    (["INSERT INTO {t} VALUES ('u2', 'b3', 'NL', '2026-03-01 00:00:00+00')"], 1),
]


@pytest.fixture(scope="module")
def connect_jars():
    lib = Path(sys.prefix) / "mview-connect" / f"{CONNECT_VERSION}-{DEBEZIUM_VERSION}" / "lib"
    if not (lib / ".complete").exists():
        what = f"Kafka Connect {CONNECT_VERSION} + Debezium {DEBEZIUM_VERSION}"
        print(f"resolving the jars of {what} from Maven Central (once)", file=sys.__stderr__)
    try:
        return connect_lib()
    except KafkaConnectFailed as e:
        pytest.skip(f"no Debezium jars: {e}")


def _count(bootstrap: str, name: str) -> int:
    return sum(high for _low, high in watermarks(bootstrap, [name]).get(name, {}).values())


def _consume(bootstrap: str, name: str, n: int) -> list[bytes]:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t-dbz", "auto.offset.reset": "earliest"})
    c.subscribe([name])
    out, deadline = [], time.monotonic() + 60
    while len(out) < n and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            out.append(m.value())
    c.close()
    return out


def _by_user(records) -> dict[str, list[dict]]:
    out = {}
    for r in records:
        out.setdefault(r["user_id"], []).append(r)
    return out


def _versions(records) -> dict[tuple, tuple]:
    """(user_id, ts) -> the version the contract's rule keeps: a delete wins, then the greater (name, country)."""
    out = {}
    for r in records:
        key, v = (r["user_id"], r["ts"]), (None, None) if r["op"] == "delete" else (r["name"], r["country"])
        old = out.setdefault(key, v)
        out[key] = (None, None) if (None, None) in (old, v) else max(old, v)
    return out


def _drop_slot(pg, slot: str) -> None:
    for _ in range(50):  # the slot turns inactive shortly after the worker exits
        if pg.sql(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active", params=(slot,)
        ) == [(0,)]:
            break
        time.sleep(0.2)
    pg.sql(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
        params=(slot,),
    )
    pg.sql(f"DROP PUBLICATION IF EXISTS {slot}")


def test_debezium_events_through_kafka_and_ingest_equal_the_cdc_job(
    connect_jars, pg, kafka, redis_url, tmp_path, spark
):
    from jobs.kinds.cdc import run_cdc

    bootstrap, prefix = kafka["KAFKA_BOOTSTRAP"], kafka["KAFKA_TOPIC_PREFIX"]
    wrapped = kafka_topic(prefix, as_topic("profiles"))
    plain = f"{prefix}plain-profiles"  # a Kafka topic of no lake topic: the plain events, for `mview ingest`
    ensure_kafka_topics(bootstrap, [wrapped, plain])
    pg.sql(
        "INSERT INTO {t} VALUES ('u1', 'a', 'DE', '2026-01-01 00:00:00.123456+00'),"
        " ('u2', 'b', 'FR', '2026-01-02 00:00:00+00')"
    )
    by_cdc = make_settings(tmp_path / "cdc", redis_url, **pg.env())
    assert run_cdc(None, by_cdc, once=True)["snapshot_rows"] == 2

    dsn = dict(kv.split("=", 1) for kv in pg.dsn.split())
    slots = [f"{pg.slot}_dbz1", f"{pg.slot}_dbz2"]
    connectors = [
        debezium_postgres(slots[0], dsn, pg.name, slots[0], wrapped),
        debezium_postgres(
            slots[1],
            dsn,
            pg.name,
            slots[1],
            plain,
            **{
                "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                "value.converter.schemas.enable": "false",
            },
        ),
    ]
    workdir = tmp_path / "connect"
    proc = scratch_connect(workdir, bootstrap, connectors)
    try:
        ready = lambda n: lambda: all(_count(bootstrap, t) >= n for t in (wrapped, plain))  # noqa: E731
        wait_connect(proc, workdir / "connect.log", ready(2))  # both snapshots are in Kafka
        for statements, _n in _CHANGES:
            pg.sql(*statements)
        total = 2 + sum(n for _s, n in _CHANGES)
        wait_connect(
            proc, workdir / "connect.log", ready(total + 1), timeout_s=60
        )  # + the delete's tombstone
    finally:
        proc.terminate()
        proc.wait(30)
        for slot in slots:
            _drop_slot(pg, slot)
    assert _count(bootstrap, wrapped) == _count(bootstrap, plain) == total + 1
    left = "SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE %(s)s),"
    left += " (SELECT count(*) FROM pg_publication WHERE pubname LIKE %(s)s)"
    assert pg.sql(left, params={"s": f"{pg.slot}_dbz%"}) == [(0, 0)]  # no WAL held for the connectors

    run_cdc(None, by_cdc, once=True)
    expected = [r for c in log_commits(by_cdc.lake_dir) for r in c]
    assert len(expected) == total - 1  # cdc: u3's two changes in one transaction are one record
    assert fold(expected) == {u: (n, c) for u, n, c in pg.sql("SELECT user_id, name, country FROM {t}")}
    assert [r["op"] for r in _by_user(expected)["u2"]] == ["upsert", "upsert", "delete", "upsert"]

    via_kafka = make_settings(tmp_path / "kafka", redis_url, **kafka)
    done = mview_here(via_kafka, "run", "kafka", "--once", "--json")  # on the tests' Spark session
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["profiles"] == {"accepted": total, "rejected": 0}
    copied = [r for c in log_commits(via_kafka.lake_dir) for r in c]

    lines = [x or b"" for x in _consume(bootstrap, plain, total + 1)]  # the tombstone: a blank line
    first = json.loads(_consume(bootstrap, wrapped, 1)[0])
    assert set(first) == {"schema", "payload"} and all("payload" not in json.loads(x) for x in lines if x)
    (tmp_path / "plain.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ingest(None, as_lake(tmp_path / "ingest"), as_topic("profiles"), [str(tmp_path / "plain.jsonl")])
    ingested = [r for c in log_commits(tmp_path / "ingest") for r in c]

    # Debezium: one event per change, so u3's transaction gives two versions of one `ts`; the contract's tie-break
    # (the greater (name, country)) picks the state at its commit here, as cdc's one record does.
    assert _by_user(copied) == _by_user(ingested)
    u3 = [(r["name"], r["country"], r["ts"]) for r in _by_user(copied)["u3"]]
    assert u3[1:] == [("c2", "IT", u3[1][2]), ("c2", "PT", u3[1][2])]
    assert _versions(copied) == _versions(expected)


# Debezium change events of a pipeline's own captured table: the shop's `customers` (`ts` <- column updated_at),
# judged without a connector. Each: the event (plain, or in the schema/payload wrapper) and the record stored.
_SHOP = None


def _shop():
    global _SHOP
    if _SHOP is None:
        from views.pipeline import BUILTIN_FILE, load_pipeline

        _SHOP = load_pipeline(BUILTIN_FILE.with_name("shop.yml"))
    return _SHOP


_CUST_SRC = {
    "connector": "postgresql",
    "db": "shop",
    "schema": "public",
    "table": "customers",
    "ts_ms": 1767261600000,
}
_CUST = {
    "customer_id": "c1",
    "name": "Ann",
    "tier": "gold",
    "country": "DE",
    "updated_at": "2026-01-01T10:00:00.250Z",
}
_CUST_UP = {
    "op": "upsert",
    "customer_id": "c1",
    "name": "Ann",
    "tier": "gold",
    "country": "DE",
    "ts": 1767261600250,
}


def _wrapped(payload: dict, unit: str | None) -> dict:
    """`payload` in Debezium's JSON converter wrapper, its `updated_at` of the integer time type `unit`."""
    col = {"field": "updated_at", "type": "int64", "optional": True}
    if unit:
        col["name"] = unit
    after = {"field": "after", "type": "struct", "optional": True, "fields": [col]}
    schema = {"type": "struct", "fields": [{"field": "before", "type": "struct", "fields": []}, after]}
    return {"schema": schema, "payload": payload}


@pytest.mark.parametrize(
    "event, expected",
    [
        ({"before": None, "after": _CUST, "source": _CUST_SRC, "op": "c"}, _CUST_UP),
        ({"before": None, "after": _CUST, "source": _CUST_SRC, "op": "r"}, _CUST_UP),
        (
            {"before": _CUST, "after": {**_CUST, "tier": "silver"}, "source": _CUST_SRC, "op": "u"},
            {**_CUST_UP, "tier": "silver"},
        ),
        # no updated_at (null, or no such column): the commit time, source.ts_ms, else the event's ts_ms
        (
            {"after": {**_CUST, "updated_at": None}, "source": _CUST_SRC, "op": "u", "ts_ms": 9},
            {**_CUST_UP, "ts": 1767261600000},
        ),
        (
            {
                "after": {k: v for k, v in _CUST.items() if k != "updated_at"},
                "op": "c",
                "ts_ms": 1767261609999,
            },
            {**_CUST_UP, "ts": 1767261609999},
        ),
        # an extra column is dropped; a delete names only the key, at the commit time
        ({"after": {**_CUST, "vip": True}, "source": _CUST_SRC, "op": "c"}, _CUST_UP),
        (
            {"before": {"customer_id": "c1", "name": None}, "after": None, "source": _CUST_SRC, "op": "d"},
            {"op": "delete", "customer_id": "c1", "ts": 1767261600000},
        ),
        # integers in the unit the wrapper's schema names; without a schema, microseconds
        (
            _wrapped(
                {"after": {**_CUST, "updated_at": 1767261600250999}, "source": _CUST_SRC, "op": "c"},
                "io.debezium.time.MicroTimestamp",
            ),
            _CUST_UP,
        ),
        (
            _wrapped(
                {"after": {**_CUST, "updated_at": 1767261600250}, "source": _CUST_SRC, "op": "c"},
                "io.debezium.time.Timestamp",
            ),
            _CUST_UP,
        ),
        (
            _wrapped(
                {"after": {**_CUST, "updated_at": 1767261600250000001}, "source": _CUST_SRC, "op": "c"},
                "io.debezium.time.NanoTimestamp",
            ),
            _CUST_UP,
        ),
        (
            _wrapped({"after": {**_CUST, "updated_at": 1767261600250}, "source": _CUST_SRC, "op": "c"}, None),
            _CUST_UP,
        ),
        ({"after": {**_CUST, "updated_at": 1767261600250999}, "source": _CUST_SRC, "op": "c"}, _CUST_UP),
        (
            {
                "after": {**_CUST, "updated_at": "2026-01-01T12:00:00.25+02:00"},
                "source": _CUST_SRC,
                "op": "c",
            },
            _CUST_UP,
        ),
    ],
)
def test_debezium_events_of_a_pipelines_captured_table_are_its_records(event, expected):
    import orjson

    from changelog.records import parse_line, validate

    customers = _shop().topics["customers"]
    assert validate(customers, event) == expected
    assert parse_line(customers, orjson.dumps(event)) == expected


@pytest.mark.parametrize(
    "event, reason",
    [
        ({"after": {**_CUST, "tier": None}, "source": _CUST_SRC, "op": "c"}, "missing field 'tier'"),
        (
            {"after": {**_CUST, "customer_id": " "}, "source": _CUST_SRC, "op": "c"},
            "field 'customer_id' is blank",
        ),
        ({"after": None, "source": _CUST_SRC, "op": "u"}, "Debezium event with op 'u' has no 'after' row"),
        ({"before": None, "source": _CUST_SRC, "op": "d"}, "Debezium event with op 'd' has no 'before' row"),
        (
            {"before": None, "after": None, "source": _CUST_SRC, "op": "t"},
            "Debezium event with op 't' is not a row change",
        ),
        (
            {"after": {**_CUST, "updated_at": None}, "op": "c"},
            "Debezium event has neither source.ts_ms nor ts_ms",
        ),
        (
            {"after": {**_CUST, "updated_at": "2026-01-01T10:00:00"}, "source": _CUST_SRC, "op": "c"},
            "field 'ts' has no zone",
        ),
        (
            {"after": {**_CUST, "updated_at": 1.5}, "source": _CUST_SRC, "op": "c"},
            "field 'ts' must be an ISO-8601 string",
        ),
    ],
)
def test_bad_debezium_events_of_a_pipelines_captured_table_are_rejected_with_the_reason(event, reason):
    from changelog.errors import InvalidRecord
    from changelog.records import validate

    with pytest.raises(InvalidRecord) as e:
        validate(_shop().topics["customers"], event)
    assert e.value.reason.startswith(reason), e.value.reason


def test_only_a_table_topic_with_capture_takes_debezium_events():
    """`open_orders` (a table topic of the shop without `capture`) judges a Debezium event as any record: its op
    is no op of the topic. A captured topic without `op:` takes upserts, and refuses a delete in words."""
    from changelog.errors import InvalidRecord
    from changelog.records import validate
    from views.pipeline import parse_pipeline

    event = {"after": {"order_id": "o1", "customer_id": "c1", "amount": 2.0}, "source": _CUST_SRC, "op": "c"}
    with pytest.raises(InvalidRecord, match=r"unknown op 'c' \(one of open, close\)"):
        validate(_shop().topics["open_orders"], event)
    plain = parse_pipeline(
        "topics:\n  stock:\n    fields: {sku: id, qty: long, at: timestamp}\n    key: sku\n    time: at\n"
        "    capture: {postgres: stock}\n",
        "stock.yml",
    ).topics["stock"]
    row = {"sku": "k1", "qty": 4, "at": None}
    assert validate(plain, {"after": row, "source": _CUST_SRC, "op": "u"}) == {
        "sku": "k1",
        "qty": 4,
        "at": 1767261600000,
    }
    with pytest.raises(InvalidRecord, match="topic 'stock' has no remove records"):
        validate(plain, {"before": row, "source": _CUST_SRC, "op": "d"})
