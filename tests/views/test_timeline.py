"""The timeline sink (Lua per timeline, entries split in Redis) and its read side, on the real redis-server."""

from __future__ import annotations

from views.keys import timeline_key, tweet_key
from views.redis_io import connect, set_generation
from views.timeline import SEP, TIMELINE_OPS_SCHEMA, TimelineSink, export_timeline, query_timeline


def _entries(*pairs):
    """(scores, members) columns of a timeline operation."""
    return SEP.join(str(ts) for ts, _ in pairs), SEP.join(tid for _, tid in pairs)


def _zset(client, user):
    return [(m.decode(), int(s)) for m, s in client.zrevrange(timeline_key(1, user), 0, -1, withscores=True)]


def test_add_remove_replace_trim_and_replay_apply_once(spark, redis_url):
    client = connect(redis_url)
    set_generation(client, "timeline", 1)
    sink = TimelineSink(redis_url, 1, cap=3)
    many = [(1000 + i, f"t{i:04d}") for i in range(2500)]  # more than one Lua chunk of ZADD arguments
    first = spark.createDataFrame(
        [
            ("timeline", "a", "add", None, *_entries((5, "t5"), (7, "t7"), (6, "t6"), (1, "t1")), None),
            ("timeline", "b", "add", None, *_entries(*many), None),
            ("timeline", "c", "add", None, *_entries((2, "x")), None),
            ("tweet", "t5", None, None, None, None, '{"tweet_id":"t5","user_id":"u","text":"hi","ts":5}'),
        ],
        TIMELINE_OPS_SCHEMA,
    )
    out = sink.write(first, 0)
    assert out == {"timelines": 3, "entries": 4 + 2500 + 1}
    assert _zset(client, "a") == [("t7", 7), ("t6", 6), ("t5", 5)]  # trimmed to the newest cap
    assert _zset(client, "b") == [("t2499", 3499), ("t2498", 3498), ("t2497", 3497)]
    second = spark.createDataFrame(
        [
            ("timeline", "a", "add", SEP.join(["t7", "t6"]), *_entries((9, "t9")), None),
            ("timeline", "c", "replace", None, *_entries((4, "y"), (3, "z")), None),
            ("timeline", "b", "replace", None, "", "", None),  # a refill with nothing left: the key is gone
            ("tweet", "t7", None, None, None, None, None),
        ],
        TIMELINE_OPS_SCHEMA,
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
    ]
