"""The timeline view: its operations made from the join's changes, the sink (wire-protocol commands built in Spark
SQL, one MULTI/EXEC per timeline) and its read side, on the real redis-server."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from views.keys import timeline_key, tweet_key
from views.redis_io import connect, set_generation
from views.sink import ListSink
from views.timeline import (
    ENTRY_CARRY,
    TimelineSink,
    entry,
    export_timeline,
    member,
    query_timeline,
    timeline_ops,
)

_PLAIN = (
    "kind string, id string, mode string, removes array<string>, "
    "entries array<struct<ts:bigint,tweet_id:string>>, body string"
)


def _ops(spark, rows):
    """TIMELINE_OPS_SCHEMA rows from plain ones (tweet ids to remove, (ts, tweet_id) entries), encoded by the
    same `member`/`entry` the job uses."""
    return spark.createDataFrame(rows, _PLAIN).select(
        "kind",
        "id",
        "mode",
        F.expr(f"transform(removes, r -> {member('r')})").alias("removes"),
        F.expr(f"transform(entries, e -> {entry('e.ts', 'e.tweet_id')})").alias("entries"),
        "body",
    )


def _zset(client, user):
    return [(m.decode(), int(s)) for m, s in client.zrevrange(timeline_key(1, user), 0, -1, withscores=True)]


def test_add_remove_replace_trim_and_replay_apply_once(spark, redis_url):
    client = connect(redis_url)
    set_generation(client, "timeline", 1)
    sink = TimelineSink(redis_url, 1, cap=3)
    many = [(1000 + i, f"t{i:04d}") for i in range(40_000)]  # one ZADD over several round trips' worth
    first = _ops(
        spark,
        [
            ("timeline", "a", "add", None, [(5, "t5"), (7, "t7"), (6, "t6"), (1, "t1")], None),
            ("timeline", "b", "add", None, many, None),
            ("timeline", "c", "add", None, [(2, "x")], None),
            ("timeline", "ü€", "add", None, [(3, "ẞ-1")], None),  # lengths are bytes
            ("tweet", "t5", None, None, None, '{"tweet_id":"t5","user_id":"u","text":"hi","ts":5}'),
        ],
    )
    out = sink.write(first, 0)
    assert out == {"timelines": 4, "entries": 4 + 40_000 + 1 + 1}
    assert _zset(client, "a") == [("t7", 7), ("t6", 6), ("t5", 5)]  # trimmed to the newest cap
    assert _zset(client, "b") == [("t39999", 40999), ("t39998", 40998), ("t39997", 40997)]
    assert _zset(client, "ü€") == [("ẞ-1", 3)]
    second = _ops(
        spark,
        [
            ("timeline", "a", "add", ["t7", "t6"], [(9, "t9")], None),
            ("timeline", "c", "replace", None, [(4, "y"), (3, "z")], None),
            ("timeline", "b", "replace", None, [], None),  # a refill with nothing left: the key is gone
            ("tweet", "t7", None, None, None, None),
        ],
    )
    for _ in range(2):  # the same micro-batch replayed after a crash changes nothing
        sink.write(second, 1)
        assert _zset(client, "a") == [("t9", 9), ("t5", 5)]
        assert _zset(client, "c") == [("y", 4), ("z", 3)]
        assert not client.exists(timeline_key(1, "b"))
        assert not client.exists(tweet_key(1, "t7"))
    got = query_timeline(client, "a")
    assert [t["tweet_id"] for t in got["tweets"]] == ["t9", "t5"] and got["tweets"][1]["text"] == "hi"
    assert list(export_timeline(client)) == [
        {"user_id": "a", "tweet_ids": ["t9", "t5"]},
        {"user_id": "c", "tweet_ids": ["y", "z"]},
        {"user_id": "ü€", "tweet_ids": ["ẞ-1"]},
    ]


def test_a_command_redis_rejects_fails_the_write_with_its_error(spark, redis_url):
    client = connect(redis_url)
    client.set(timeline_key(1, "s"), "not a sorted set")
    ops = _ops(spark, [("timeline", "s", "add", None, [(1, "t1")], None)])
    with pytest.raises(Exception, match="WRONGTYPE"):
        TimelineSink(redis_url, 1, cap=3).write(ops, 0)


def _bulk(text: str) -> str:
    return f"${len(text.encode())}\r\n{text}\r\n"


def test_timeline_ops_turn_a_batch_of_join_changes_into_one_operation_per_timeline_and_tweet(spark):
    """r (who follows a, 1 entry) loses t1 and gains t5: one `add`; s (who follows b, 3 entries > cap) loses t4:
    one `replace` with the next newest; t5 is stored, t1 and t4 deleted."""
    from joins.table_table import FOLLOW_STATE_SCHEMA, TWEET_STATE_SCHEMA, TimelineState, maintain_timeline

    tweets, follows = (
        "op string, tweet_id string, user_id string, text string, ts bigint",
        "op string, follower_id string, followee_id string, ts bigint",
    )
    empty = TimelineState(
        spark.createDataFrame([], TWEET_STATE_SCHEMA), spark.createDataFrame([], FOLLOW_STATE_SCHEMA)
    )
    posts = [
        ("post", t, u, f"{t}!", ts)
        for t, u, ts in [("t1", "a", 1), ("t2", "b", 2), ("t3", "b", 3), ("t4", "b", 4)]
    ]
    first = maintain_timeline(
        empty,
        spark.createDataFrame(posts, tweets),
        spark.createDataFrame([("follow", "r", "a", 0), ("follow", "s", "b", 0)], follows),
        cap=2,
        carry=ENTRY_CARRY,
    )
    batch = [("delete", "t1", "a", None, 9), ("post", "t5", "a", "t5!", 5), ("delete", "t4", "b", None, 9)]
    changes = maintain_timeline(
        first.after, spark.createDataFrame(batch, tweets), None, cap=2, carry=ENTRY_CARRY
    )
    sink = ListSink()
    assert sink.write(timeline_ops(changes), 1) == {"rows": 5}
    rows = sorted(
        ({**r, "entries": sorted(r["entries"]) if r["entries"] is not None else None} for r in sink.rows),
        key=lambda r: (r["kind"], r["id"]),
    )
    none = {"mode": None, "removes": None, "entries": None, "body": None}
    assert rows == [
        {
            **none,
            "kind": "timeline",
            "id": "r",
            "mode": "add",
            "removes": [_bulk("t1")],
            "entries": [_bulk("5") + _bulk("t5")],
        },
        {
            **none,
            "kind": "timeline",
            "id": "s",
            "mode": "replace",
            "entries": sorted([_bulk("3") + _bulk("t3"), _bulk("2") + _bulk("t2")]),
        },
        {**none, "kind": "tweet", "id": "t1"},
        {**none, "kind": "tweet", "id": "t4"},
        {**none, "kind": "tweet", "id": "t5", "body": '{"tweet_id":"t5","user_id":"a","text":"t5!","ts":5}'},
    ]


def test_read_timeline_merges_the_celebrities_authored_sets_newest_first_once_each(redis_url):
    """The stored timeline holds the fanned-out followees' tweets; the celebrities' authored sets are merged in at
    read time, ties by tweet_id descending, a tweet in two places once, cut to `limit` and to the view's cap."""
    from views.keys import authored_key, celebs_key, meta_key
    from views.timeline import read_timeline

    client = connect(redis_url)
    set_generation(client, "timeline", 1)
    client.hset(meta_key("timeline", 1), "cap", 4)
    client.zadd(timeline_key(1, "u"), {"a1": 10, "a2": 5, "c3": 7})  # c3: still there during a mode switch
    client.sadd(celebs_key(1, "u"), "c", "d", "e")  # e: a celebrity with no live tweet
    client.zadd(authored_key(1, "c"), {"c1": 9, "c2": 5, "c3": 7})
    client.zadd(authored_key(1, "d"), {"d1": 12, "d2": 1})
    for t in ("a1", "c1", "d1"):
        client.set(tweet_key(1, t), f'{{"tweet_id":"{t}","user_id":"x","text":"hi","ts":1}}')

    def ids(limit=None):
        return [t["tweet_id"] for t in read_timeline(client, "u", limit)["tweets"]]

    assert ids() == ["d1", "a1", "c1", "c3"]  # the cap: 4
    assert ids(2) == ["d1", "a1"] and ids(0) == []
    assert ids(7) == ids()
    got = read_timeline(client, "u", 3)
    assert got["generation"] == 1 and got["tweets"][2] == {
        "tweet_id": "c1",
        "user_id": "x",
        "text": "hi",
        "ts": 1,
    }
    client.sadd(celebs_key(1, "only"), "c")  # follows only a celebrity: no stored timeline
    assert [t["tweet_id"] for t in read_timeline(client, "only")["tweets"]] == ["c1", "c3", "c2"]
    assert query_timeline(client, "only", limit=1)["tweets"][0]["tweet_id"] == "c1"
    assert list(export_timeline(client)) == [
        {"user_id": "only", "tweet_ids": ["c1", "c3", "c2"]},
        {"user_id": "u", "tweet_ids": ["d1", "a1", "c1", "c3"]},
    ]
