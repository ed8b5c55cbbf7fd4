"""The key layout: an entity id is exactly the hash tag of its keys, whatever braces or percent signs it holds, in
the keys Python builds and in the keys the sinks build in Spark SQL, and reads give the id back unchanged."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from timeline_demo.timeline_view import export_timeline, query_timeline, timeline_key, tweet_key
from views.keys import decode_id, encode_id, key_id, view_key
from views.list import ListViewSink, entry
from views.redis_io import connect, set_generation
from views.wire import view_key_column

IDS = ["u1", "}u", "{u", "a}b", "a{b}c", "{}", "%7D", "%", "ü{€}", "x}"]


def _hash_tag(key: str) -> str | None:
    """The part of `key` Redis Cluster hashes when it has a non-empty `{...}` tag (the cluster spec's rule)."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if start >= 0 and end > start + 1 else None


@pytest.mark.parametrize("ident", IDS)
def test_every_id_is_the_whole_hash_tag_of_its_keys(ident):
    key = view_key("timeline", 3, ident)
    assert _hash_tag(key) == encode_id(ident)
    assert key_slot(key.encode()) == key_slot(encode_id(ident).encode())
    assert key_id(key) == ident and decode_id(encode_id(ident)) == ident
    # Two ids never share a tag: the encoding is one-to-one.
    assert len({encode_id(i) for i in IDS}) == len(IDS)


def test_keys_built_in_spark_sql_equal_the_python_ones(spark):
    df = spark.createDataFrame([(i,) for i in IDS], "id string")
    got = [r[0] for r in df.selectExpr(view_key_column("timeline", 7, "id")).collect()]
    assert got == [view_key("timeline", 7, i) for i in IDS]


def test_a_list_of_an_id_with_braces_is_written_and_read_back(spark, redis_url):
    client = connect(redis_url)
    set_generation(client, "timeline", 1)
    rows = [("list", u, "add", None, [f"{u}-t"], None) for u in IDS]
    ops = spark.createDataFrame(
        rows, "kind string, id string, mode string, removes array<string>, tids array<string>, body string"
    ).selectExpr(
        "kind",
        "id",
        "mode",
        "CAST(removes AS array<string>) AS removes",
        f"transform(tids, t -> {entry('5', 't')}) AS entries",
        "body",
    )
    ListViewSink(redis_url, "timeline", 1, cap=3).write(ops, 0)
    for u in IDS:
        assert client.zrange(timeline_key(1, u), 0, -1) == [f"{u}-t".encode()]
        assert [t["tweet_id"] for t in query_timeline(client, u)["tweets"]] == [f"{u}-t"]
    assert sorted(r["user_id"] for r in export_timeline(client)) == sorted(IDS)
    assert tweet_key(1, "}x") == "mv:timeline.entry:1:{%7Dx}"
