"""The `join` kind's durable state (`joins.table_state.TableStore`): the changes log it stages and the state a new
store restores from it, for the built-in join and for sides with composite keys and types of every kind; on a
real HDFS, its compaction into snapshots."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from changelog.storage import as_lake, open_lake
from joins.sparkapi import codegen_compilations
from joins.table import TableJoin, maintain_join
from joins.table_state import TableStore
from views.pipeline import load_pipeline, parse_pipeline

BUILTIN = Path(__file__).resolve().parents[2] / "timeline_demo" / "pipelines" / "builtin.yml"
_TWEETS = "op string, tweet_id string, user_id string, text string, ts bigint"
_FOLLOWS = "op string, follower_id string, followee_id string, ts bigint"
_POSTS = (("t0", 10), ("t1", 11), ("t2", 12))


def _builtin_join(spark) -> TableJoin:
    p = load_pipeline(BUILTIN, {})
    return TableJoin(spark, *p.sides("timeline"), p.jobs["timeline"].spec.match)


def test_a_restore_keeps_the_newest_row_per_key_and_staging_compiles_no_code_after_the_first_batch(
    spark, tmp_path
):
    """Four one-tweet batches staged (the last re-posts t0 with a greater ts), then a new store restores the state
    before batch 4 from the log: the same rows, t0 as the last batch left it (each row's batch told by its
    directory). Staging batches of one shape compiles no new code in Spark after the first."""
    join = _builtin_join(spark)
    store = TableStore(spark, as_lake(tmp_path / "changes"), join)
    follows = spark.createDataFrame([("follow", "r", "a", 1)], _FOLLOWS).localCheckpoint()
    first = maintain_join(join, store.restore(0), (None, follows))
    store.stage(0, first)
    store.advance(0, first)
    compiles = codegen_compilations(spark)
    new_code = []
    for b, (tweet, ts) in enumerate((("t0", 10), ("t1", 11), ("t2", 12), ("t0", 30)), start=1):
        batch = spark.createDataFrame([("post", tweet, "a", f"{tweet}@{ts}", ts)], _TWEETS).localCheckpoint()
        changes = maintain_join(join, store.restore(b), (batch, None))
        before = compiles()
        store.stage(b, changes)
        new_code.append(compiles() - before)
        store.advance(b, changes)
    restored = TableStore(spark, as_lake(tmp_path / "changes"), join).restore(5)
    assert (
        sorted(map(tuple, restored.sides[0].collect()))
        == sorted(map(tuple, store.state.sides[0].collect()))
        == [
            ("t0", "a", "t0@30", 30, True, False),
            ("t1", "a", "t1@11", 11, True, False),
            ("t2", "a", "t2@12", 12, True, False),
        ]
    )
    assert sorted(map(tuple, restored.sides[1].collect())) == [("r", "a", 1, True, False)]
    assert new_code[2:] == [0, 0], new_code


_PIPELINE = """
topics:
  stock:
    fields: {shop: id, sku: long, qty: long, price: double, open: boolean, ts: timestamp, note: string}
    optional: [note]
    key: [shop, sku]
    time: ts
    op: {upsert: set, remove: drop}
  shops:
    fields: {shop: id, city: string, ts: timestamp}
    key: shop
    time: ts
jobs:
  stocked:
    join: {left: stock, right: shops, match: {shop: shop}}
    views:
      by_city: {count: {city: city}, values: {items: qty}}
"""


def test_sides_with_a_composite_key_and_fields_of_every_type_restore_as_they_were_staged(spark, tmp_path):
    """A side keyed by (shop, sku: a long) with a double, a boolean and an optional string, beside a side without
    `op`: every row staged comes back from the log with its types and flags, the newest per key."""
    p = parse_pipeline(_PIPELINE, "stock.yml")
    join = TableJoin(spark, *p.sides("stocked"), p.jobs["stocked"].spec.match)
    store = TableStore(spark, as_lake(tmp_path / "s"), join)
    stock = (
        "op string, shop string, sku bigint, qty bigint, price double, open boolean, ts bigint, note string"
    )
    batches = [
        (
            [("set", "s1", 1, 5, 2.5, True, 10, None), ("set", "s1", 2, 1, 1.0, False, 10, "x")],
            [("s1", "Oslo", 1)],
        ),
        (
            [("drop", "s1", 2, None, None, None, 11, None), ("set", "s1", 1, 6, 2.5, True, 12, "y")],
            [("s2", "Rome", 2)],
        ),
    ]
    for b, (st, sh) in enumerate(batches):
        changes = maintain_join(
            join,
            store.restore(b),
            (
                spark.createDataFrame(st, stock),
                spark.createDataFrame(sh, "shop string, city string, ts bigint"),
            ),
        )
        store.stage(b, changes)
        store.advance(b, changes)
    restored = TableStore(spark, as_lake(tmp_path / "s"), join).restore(2)
    for i in (0, 1):
        assert restored.sides[i].schema == store.state.sides[i].schema
        assert sorted(map(tuple, restored.sides[i].collect())) == sorted(
            map(tuple, store.state.sides[i].collect())
        )
    assert sorted(map(tuple, restored.sides[0].collect())) == [
        ("s1", 1, 6, 2.5, True, 12, "y", True, False),
        ("s1", 2, None, None, None, 11, None, False, True),
    ]
    assert sorted(map(tuple, restored.sides[1].collect())) == [
        ("s1", "Oslo", 1, True, False),
        ("s2", "Rome", 2, True, False),
    ]


@pytest.mark.e2e
def test_on_hdfs_the_state_restores_compacts_and_drops_what_a_snapshot_covers(spark, hdfs_server):
    """The store with its root on a real HDFS (Spark writes and reads the rows by URI; directories are listed,
    checked for `_SUCCESS` and removed through the lake): every second batch the log is compacted into one
    snapshot, the directories it covers are removed, and a new store (a driver started elsewhere) restores the
    same state from the snapshot and the batches after it."""
    lake = open_lake(f"{hdfs_server.url}/lake-{uuid.uuid4().hex[:8]}")
    key = "state/timeline/g1/table"
    join = _builtin_join(spark)
    store = TableStore(spark, as_lake(lake), join, key=key, snapshot_every=2)
    follows = spark.createDataFrame([("follow", "r", "a", 1)], _FOLLOWS)
    tweets = [spark.createDataFrame([("post", t, "a", f"{t}@{ts}", ts)], _TWEETS) for t, ts in _POSTS]
    for b, inputs in enumerate([(None, follows), *((t, None) for t in tweets)]):
        changes = maintain_join(join, store.restore(b), inputs)
        store.stage(b, changes)
        store.advance(b, changes)
    assert [e.name for e in lake.list(key)] == ["b2", "b3", "s1"]  # s1 covers b0 and b1
    restored = TableStore(spark, as_lake(lake), join, key=key, snapshot_every=2).restore(4)
    assert [e.name for e in lake.list(key)] == ["s3"]
    again = TableStore(spark, as_lake(lake), join, key=key).restore(4)
    for i in (0, 1):
        want = sorted(map(tuple, store.state.sides[i].collect()))
        assert sorted(map(tuple, restored.sides[i].collect())) == want
        assert sorted(map(tuple, again.sides[i].collect())) == want
    assert sorted(r[0] for r in again.sides[0].collect()) == ["t0", "t1", "t2"]
