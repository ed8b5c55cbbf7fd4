"""The lake's Delta tables: the topic logs as their declarations say (a topic that gains optional fields, any other
change refused) and the other tables (`changelog.topics.ensure_delta_table`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from changelog.storage import as_lake
from changelog.topics import MAX_BEFORE, ensure_delta_table, table_version
from tests.lakehelp import as_topic, log_rows


def test_a_table_whose_creator_died_before_its_first_commit_is_created_then_kept(spark, tmp_path):
    """A `_delta_log` directory without a commit (its creator killed in between) is no table: the next start
    creates it; a table that exists is left as it is."""
    path = tmp_path / "state" / "held"
    (path / "_delta_log").mkdir(parents=True)
    ensure_delta_table(spark, as_lake(path), "k string, v bigint")
    assert table_version(as_lake(path)) == 0
    assert spark.read.format("delta").load(str(path)).schema.simpleString() == "struct<k:string,v:bigint>"
    spark.createDataFrame([("a", 1)], "k string, v bigint").write.format("delta").mode("append").save(
        str(path)
    )
    ensure_delta_table(spark, as_lake(path), "k string, v bigint")
    assert table_version(as_lake(path)) == 1 and spark.read.format("delta").load(str(path)).count() == 1


_V1 = """
topics:
  orders:
    fields: {order_id: id, amount: double, ts: timestamp}
    id: order_id
    time: ts
"""


def _orders(text: str = _V1, **over):
    """The `orders` topic of a pipeline `text`, its fields changed by `over` (field -> type, None: removed;
    `optional` a list)."""
    from views.pipeline import parse_pipeline

    optional = over.pop("optional", [])
    fields = {"order_id": "id", "amount": "double", "ts": "timestamp"}
    for name, kind in over.items():
        if kind is None:
            fields.pop(name)
        else:
            fields[name] = kind
    body = ", ".join(f"{n}: {t}" for n, t in fields.items())
    text = text.replace("{order_id: id, amount: double, ts: timestamp}", "{" + body + "}")
    text = text.replace("    id: order_id\n", f"    id: order_id\n    optional: [{', '.join(optional)}]\n")
    return parse_pipeline(text, "orders.yml").topics["orders"]


def _log(lake, topic) -> list[dict]:
    return sorted(log_rows(lake, topic), key=lambda r: r["order_id"])


def _jsonl(path, records) -> str:
    import orjson

    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def test_a_topic_that_gains_optional_fields_grows_its_log_and_old_records_hold_null(spark, tmp_path):
    """A topic that holds records gains an optional field (declared between two others): the next ingest grows the
    log's schema (an `ADD COLUMN` commit with its checksum), then appends; delta-rs and Spark readers see the new
    column, null in the old records. Declared again without it, the topic is read and written as before (the
    column is optional: issue #41)."""
    from changelog.ingest import ingest
    from changelog.topics import check_topic, read_batch, table_version, topic_path

    lake, v1 = tmp_path / "lake", _orders()
    ingest(
        None,
        as_lake(lake),
        as_topic(v1),
        [_jsonl(tmp_path / "a.jsonl", [{"order_id": "o1", "amount": 2, "ts": 5}])],
    )
    v2 = _orders(
        _V1.replace("amount: double, ts", "amount: double, coupon: string, ts"),
        coupon="string",
        optional=["coupon"],
    )
    assert [n for n, _ in v2.columns()] == ["order_id", "amount", "coupon", "ts"]
    assert check_topic(as_lake(lake), as_topic(v2)) == ("grow", [("coupon", "string")])
    new = [
        {"order_id": "o2", "amount": 1.5, "coupon": "C", "ts": 6},
        {"order_id": "o3", "amount": 3, "ts": 7},
    ]
    result = ingest(None, as_lake(lake), as_topic(v2), [_jsonl(tmp_path / "b.jsonl", new)])
    assert (result.accepted, result.rejected) == (2, 0)
    assert _log(lake, v2) == [
        {"order_id": "o1", "amount": 2.0, "ts": 5, "coupon": None},
        {"order_id": "o2", "amount": 1.5, "ts": 6, "coupon": "C"},
        {"order_id": "o3", "amount": 3.0, "ts": 7, "coupon": None},
    ]
    path = Path(topic_path(as_lake(lake), as_topic(v2)))
    history = [
        (path / "_delta_log" / f"{v:020d}.json").read_text() for v in range(table_version(as_lake(path)) + 1)
    ]
    assert ['"operation":"ADD COLUMN"' in h for h in history] == [False, False, True, False]
    assert all((path / "_delta_log" / f"{v:020d}.crc").exists() for v in range(len(history)))
    assert check_topic(as_lake(lake), as_topic(v2)) is None
    rows = read_batch(spark, as_lake(lake), as_topic(v2)).orderBy("order_id").collect()
    assert [(r["order_id"], r["amount"], r["coupon"], r["ts"]) for r in rows] == [
        ("o1", 2.0, None, 5),
        ("o2", 1.5, "C", 6),
        ("o3", 3.0, None, 7),
    ]
    # declared again without it (another pipeline sharing the topic), the log is read and written as before:
    # its records hold null in `coupon`; a job selects the declared columns
    ingest(
        None,
        as_lake(lake),
        as_topic(v1),
        [_jsonl(tmp_path / "c.jsonl", [{"order_id": "o4", "amount": 4, "ts": 8}])],
    )
    assert check_topic(as_lake(lake), as_topic(v1)) is None and _log(lake, v1)[-1]["coupon"] is None
    from joins.sides import own_columns

    rows = (
        read_batch(spark, as_lake(lake), as_topic(v1)).select(*own_columns(v1)).orderBy("order_id").collect()
    )
    assert [tuple(r) for r in rows][-1] == ("o4", 4.0, 8)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"amount": "long"}, "field 'amount' is declared long, the log holds double"),
        ({"order_id": "long"}, "field 'order_id' is declared long, the log holds string"),
        ({"note": "string"}, "field 'note' is new and not optional"),
        ({"amount": None}, "field 'amount' is not declared any more"),
        (
            {"amount": None, "total": "double"},
            "field 'amount' is not declared any more; field 'total' is new and not",
        ),
    ],
)
def test_any_other_change_of_a_topic_that_holds_records_is_refused_in_one_line(tmp_path, change, says):
    """Every path refuses it before it writes anything (ingest, the kafka job's copy, `check_topic`), in one line
    that names the change and says what to do; the log is untouched. Without records, the log takes the change."""
    from changelog.deadletters import read_dead_letters
    from changelog.errors import TopicChanged
    from changelog.ingest import ingest
    from changelog.kafka import copy_batch
    from changelog.topics import check_topic, ensure_topic, table_version, topic_path

    lake = tmp_path / "lake"
    ingest(
        None,
        as_lake(lake),
        as_topic(_orders()),
        [_jsonl(tmp_path / "a.jsonl", [{"order_id": "o1", "amount": 2, "ts": 5}])],
    )
    changed = _orders(**dict(change))
    before = table_version(as_lake(topic_path(as_lake(lake), as_topic(changed))))
    refusals = [
        lambda: ingest(
            None, as_lake(lake), as_topic(changed), [_jsonl(tmp_path / "b.jsonl", [{"order_id": "o2"}])]
        ),
        lambda: copy_batch(
            as_lake(lake),
            {"k.orders": changed},
            [("k.orders", 0, 0, b'{"order_id":"o2"}')],
            app_id="a",
            version=0,
        ),
        lambda: check_topic(as_lake(lake), as_topic(changed)),
        lambda: ensure_topic(None, as_lake(lake), as_topic(changed)),
    ]
    for refuse in refusals:
        with pytest.raises(TopicChanged) as e:
            refuse()
        text = str(e.value)
        assert says in text and "\n" not in text, text
        assert "declare the new fields as a new topic" in text and "`mview replay`" in text
        assert e.value.topic == "orders" and e.value.path == str(topic_path(as_lake(lake), as_topic(changed)))
    assert table_version(as_lake(topic_path(as_lake(lake), as_topic(changed)))) == before and not list(
        read_dead_letters(as_lake(lake), changed)
    )

    empty = tmp_path / "empty"
    ensure_topic(None, as_lake(empty), as_topic(_orders()))
    assert check_topic(as_lake(empty), as_topic(changed))[0] == "replace"
    ensure_topic(None, as_lake(empty), as_topic(changed))
    assert check_topic(as_lake(empty), as_topic(changed)) is None and _log(empty, changed) == []


def test_a_declaration_without_optional_columns_the_log_gained_reads_and_writes_them_as_absent(tmp_path):
    """Issue #41: pipelines A and B declare one topic on one lake; B adds an optional field and ingests (the log
    grows a column). A, unchanged, still ingests (its records hold null there) through ingest and the kafka job's
    copy, and `check_topic` has nothing to say. A column that some declaration made optional when it created the
    log is the same. A column the log holds as required stays refused when a declaration drops it."""
    from changelog.errors import TopicChanged
    from changelog.ingest import ingest
    from changelog.kafka import copy_batch
    from changelog.topics import check_topic

    lake, a = tmp_path / "lake", _orders()
    b = _orders(note="string", optional=["note"])
    ingest(
        None,
        as_lake(lake),
        as_topic(a),
        [_jsonl(tmp_path / "1.jsonl", [{"order_id": "o1", "amount": 2, "ts": 5}])],
    )
    ingest(
        None,
        as_lake(lake),
        as_topic(b),
        [_jsonl(tmp_path / "2.jsonl", [{"order_id": "o2", "amount": 1, "note": "n", "ts": 6}])],
    )
    assert check_topic(as_lake(lake), as_topic(a)) is None
    result = ingest(
        None,
        as_lake(lake),
        as_topic(a),
        [_jsonl(tmp_path / "3.jsonl", [{"order_id": "o3", "amount": 3, "ts": 7}])],
    )
    assert (result.accepted, result.rejected) == (1, 0)
    copy_batch(
        as_lake(lake),
        {"k.orders": a},
        [("k.orders", 0, 0, b'{"order_id":"o4","amount":4,"ts":8}')],
        app_id="a",
        version=0,
    )
    assert [(r["order_id"], r["note"]) for r in _log(lake, a)] == [
        ("o1", None),
        ("o2", "n"),
        ("o3", None),
        ("o4", None),
    ]

    born = tmp_path / "born"  # created by the declaration with the optional column
    ingest(
        None,
        as_lake(born),
        as_topic(b),
        [_jsonl(tmp_path / "4.jsonl", [{"order_id": "o1", "amount": 2, "ts": 5}])],
    )
    ingest(
        None,
        as_lake(born),
        as_topic(a),
        [_jsonl(tmp_path / "5.jsonl", [{"order_id": "o2", "amount": 2, "ts": 5}])],
    )
    assert check_topic(as_lake(born), as_topic(a)) is None and [r["note"] for r in _log(born, a)] == [
        None,
        None,
    ]

    required = _orders(note="string")  # a log created with `note` required
    ingest(
        None,
        as_lake(tmp_path / "req"),
        as_topic(required),
        [_jsonl(tmp_path / "6.jsonl", [{"order_id": "o1", "amount": 2, "note": "x", "ts": 5}])],
    )
    with pytest.raises(TopicChanged, match="field 'note' is not declared any more"):
        check_topic(as_lake(tmp_path / "req"), as_topic(a))


def _versions(lake, topic) -> list[list[tuple[str, int, int | None]]]:
    """Per version of the topic's log, the (id, time, stamp) of the records it added."""
    from deltalake import DeltaTable, QueryBuilder

    from changelog.topics import topic_path

    uri, seen, out = str(topic_path(as_lake(lake), topic)), set(), []
    for v in range(table_version(as_lake(uri)) + 1):
        t = (
            QueryBuilder()
            .register("t", DeltaTable(uri, version=v))
            .execute(f"SELECT order_id, ts, {MAX_BEFORE} FROM t")
            .read_all()
        )
        rows = list(zip(*[t.column(i).to_pylist() for i in range(3)], strict=True))
        out.append(sorted(r for r in rows if r[0] not in seen))
        seen |= {r[0] for r in rows}
    return out


def test_each_record_carries_the_topics_greatest_time_of_the_versions_before_its_own(tmp_path):
    """`MAX_BEFORE` of a record is the greatest time of the topic's records in the versions committed before the
    record's: null in the first append, whatever the order of times (late records, equal times, appends of no
    record); writers appending side by side (each one's commit racing the others') stamp exactly the same rule,
    an append that found its version taken stamping again on the next."""
    import random
    import threading

    from changelog.topics import RecordTable, append_table, ensure_topic, topic_key

    lake, orders = as_lake(tmp_path / "lake"), _orders()
    ensure_topic(None, lake, orders)

    def append(tag: str, times: list[int]) -> None:
        t = RecordTable(orders)
        for i, ts in enumerate(times):
            t.add({"order_id": f"{tag}-{i}", "amount": 1.0, "ts": ts})
        append_table(lake, t.table(), key=topic_key(orders), note="test", time="ts")

    append("a", [50, 20])
    append("b", [10])  # late: its stamp still 50
    append("c", [])  # a commit without records
    append("d", [50, 70])
    assert _versions(tmp_path / "lake", orders) == [
        [],
        [("a-0", 50, None), ("a-1", 20, None)],
        [("b-0", 10, 50)],
        [],
        [("d-0", 50, 50), ("d-1", 70, 50)],
    ]

    def writer(k: int) -> None:
        rng = random.Random(k)
        for j in range(6):
            append(f"w{k}-{j}", [rng.randrange(200) for _ in range(rng.randrange(1, 4))])

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    greatest = None
    for added in _versions(tmp_path / "lake", orders)[1:]:
        assert all(stamp == greatest for _, _, stamp in added), (added, greatest)
        times = [ts for _, ts, _ in added] + ([greatest] if greatest is not None else [])
        greatest = max(times, default=None)
