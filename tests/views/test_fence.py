"""Fencing by lease epoch (`views.fence`): once a newer holder raised the job's fence, a write carrying a lower
epoch changes nothing, in every view kind (row, count from the executors and from the driver, list operations of
every kind), the batch record and the generation pointer; the holder's own epoch and a higher one write. On a
redis-server and on a Redis Cluster (every slot's fence key)."""

from __future__ import annotations

import json

import pytest
from redis.cluster import RedisCluster

from jobs.core.generations import record_batch
from tests.shophelp import SHOP
from tests.views.list.test_join import _ops
from views.count import CountRows, CountSink
from views.errors import Fenced
from views.fence import Fence, fenced_call, raise_fence
from views.keys import gen_key, meta_key, view_key
from views.list import ListViewSink
from views.pipeline import parse_pipeline
from views.redis_io import connect, set_generation
from views.row import ROW_CHANGES, RowSink

JOB = "paid"


def _dump(client) -> dict:
    """Every key but the fences, with its content (what a refused write must leave as it was)."""
    cluster = isinstance(client, RedisCluster)
    keys = client.scan_iter(match="mv:*", count=1000, **({"target_nodes": "all"} if cluster else {}))
    out = {}
    for k in sorted(set(keys)):
        if k.startswith(b"mv:fence:"):
            continue
        kind = client.type(k).decode()
        read = {"hash": client.hgetall, "zset": lambda x: client.zrange(x, 0, -1, withscores=True),
                "set": client.smembers, "string": client.get}[kind]  # fmt: skip
        out[k] = (kind, read(k))
    return out


def _writes(spark, url: str, fence: Fence, step: int):
    """One write of each kind carrying `fence`, the `step`-th: each changes what it writes when applied."""
    view = parse_pipeline(SHOP, "shop.yml").views["paid_by_region"]
    rows = spark.createDataFrame([("o1", f"id{step}", json.dumps([None, {"n": step}]))], ROW_CHANGES)
    counts = spark.createDataFrame(
        [("eu", 1, 1, 1.0, 1)], "key string, orders bigint, paid bigint, amount double, qty bigint"
    )
    entry = json.dumps({"tweet_id": f"t{step}"})
    ops = _ops(
        spark,
        [
            ("list", "a", "add", None, [(step, f"t{step}")], None),
            ("list", "b", "replace", None, [(step, f"t{step}")], None),
            ("entry", f"t{step}", None, None, None, entry),
            ("heavy", "h", "add", None, [(step, f"t{step}")], None),
            ("reads", "a", None, [f"h{step}"], None, None),
        ],
    )
    client = connect(url)
    return {
        "row": lambda: RowSink(url, "by_payments", 1, fence).write(rows, step),
        "count (executors)": lambda: CountSink(url, view, 1, fence).write(counts, step * 10),
        "count (driver)": lambda: CountSink(url, view, 1, fence).write(
            CountRows([("nl", 1, 1, 1.0, 1)], "iifi"), step * 10
        ),
        "list": lambda: ListViewSink(url, "timeline", 1, cap=3, fence=fence).write(ops, step),
        "batch record": lambda: record_batch(client, JOB, 1, step, fence=fence, n=step),
        "generation pointer": lambda: fenced_call(
            client, fence, gen_key(JOB), "SET", gen_key(JOB), step, what="t"
        ),
    }


def test_a_write_below_the_fence_changes_nothing_in_any_view_kind(spark, redis_url):
    client = connect(redis_url)
    set_generation(client, JOB, 1)
    record_batch(client, JOB, 1, 0)
    client.sadd(view_key("timeline.reads", 1, "a"), "h1", "h2")
    raise_fence(client, Fence(JOB, 1))
    for write in _writes(spark, redis_url, Fence(JOB, 1), 1).values():
        write()
    raise_fence(client, Fence(JOB, 2))  # another holder took the lease over
    before = _dump(client)
    for kind, write in _writes(spark, redis_url, Fence(JOB, 1), 2).items():
        with pytest.raises(Exception) as refused:
            write()
        assert "FENCED" in str(refused.value), kind
        assert _dump(client) == before, kind
    with pytest.raises(Fenced):
        raise_fence(client, Fence(JOB, 1))  # a stale holder cannot lower it either
    for write in _writes(spark, redis_url, Fence(JOB, 2), 2).values():
        write()  # the holder's own epoch writes
    after = _dump(client)
    assert after[view_key("timeline", 1, "a").encode()][1][-1] == (b"t2", 2.0)
    assert after[meta_key(JOB, 1).encode()][1][b"n"] == b"2"
    assert after[gen_key(JOB).encode()][1] == b"2"
    assert view_key("timeline.reads", 1, "a").encode() not in after
