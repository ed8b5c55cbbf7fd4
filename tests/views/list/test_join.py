"""The list view kind (`views.list`): its operations made from a join's changes, the sink (wire-protocol commands
built in Spark SQL, one MULTI/EXEC per list) and its read side, on the real redis-server and a Redis Cluster; the
built-in timeline's shape first, then other shapes through both of the join's list paths against a brute force of
the contract's definitions."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from redis.cluster import RedisCluster

from joins.sparkapi import codegen_compilations
from joins.state import empty_frame
from joins.table import TableJoin, TableState, begin_join, maintain_join, state_schema
from tests.conftest import split_at_random
from views.keys import entry_key, heavy_key, list_key, meta_key, reads_key
from views.list import Few, ListView, ListViewSink, entry, export_list, member, query_list, read_list
from views.pipeline import load_pipeline
from views.redis_io import connect, set_generation
from views.sink import ListSink

BUILTIN = Path(__file__).resolve().parents[3] / "timeline_demo" / "pipelines" / "builtin.yml"
VIEW = load_pipeline(BUILTIN, {}).views["timeline"]


def _builtin(spark, cap: int, limit: int | None = None) -> ListView:
    """The built-in timeline view with `cap` and fan-out `limit`, over its join."""
    p = load_pipeline(
        BUILTIN, {"TIMELINE_CAP": str(cap), "FANOUT_LIMIT": "" if limit is None else str(limit)}
    )
    job = p.jobs["timeline"]
    return ListView(TableJoin(spark, *p.sides("timeline"), job.spec.match), job.views[0])


def _empty(join) -> TableState:
    return TableState(tuple(empty_frame(join.spark, state_schema(t)) for t in join.topics))


def timeline_key(generation: int, user: str) -> str:
    return list_key("timeline", generation, user)


def tweet_key(generation: int, tweet: str) -> str:
    return entry_key("timeline", generation, tweet)


def authored_key(generation: int, value: str) -> str:
    return heavy_key("timeline", generation, value)


def celebs_key(generation: int, user: str) -> str:
    return reads_key("timeline", generation, user)


def read_timeline(client, user: str, limit: int | None = None) -> dict:
    return read_list(client, VIEW, user, limit)


def export_timeline(client):
    return export_list(client, VIEW)


_PLAIN = (
    "kind string, id string, mode string, removes array<string>, "
    "entries array<struct<ts:bigint,tweet_id:string>>, body string"
)


def _ops(spark, rows):
    """LIST_OPS_SCHEMA rows from plain ones (tweet ids to remove, (ts, tweet_id) entries), encoded by the
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
    sink = ListViewSink(redis_url, "timeline", 1, cap=3)
    many = [(1000 + i, f"t{i:04d}") for i in range(40_000)]  # one ZADD over several round trips' worth
    first = _ops(
        spark,
        [
            ("list", "a", "add", None, [(5, "t5"), (7, "t7"), (6, "t6"), (1, "t1")], None),
            ("list", "b", "add", None, many, None),
            ("list", "c", "add", None, [(2, "x")], None),
            ("list", "ü€", "add", None, [(3, "ẞ-1")], None),  # lengths are bytes
            ("entry", "t5", None, None, None, '{"tweet_id":"t5","user_id":"u","text":"hi","ts":5}'),
        ],
    )
    out = sink.write(first, 0)
    assert out == {"lists": 4, "entries": 4 + 40_000 + 1 + 1}
    assert _zset(client, "a") == [("t7", 7), ("t6", 6), ("t5", 5)]  # trimmed to the newest cap
    assert _zset(client, "b") == [("t39999", 40999), ("t39998", 40998), ("t39997", 40997)]
    assert _zset(client, "ü€") == [("ẞ-1", 3)]
    second = _ops(
        spark,
        [
            ("list", "a", "add", ["t7", "t6"], [(9, "t9")], None),
            ("list", "c", "replace", None, [(4, "y"), (3, "z")], None),
            ("list", "b", "replace", None, [], None),  # a refill with nothing left: the key is gone
            ("entry", "t7", None, None, None, None),
        ],
    )
    for _ in range(2):  # the same micro-batch replayed after a crash changes nothing
        sink.write(second, 1)
        assert _zset(client, "a") == [("t9", 9), ("t5", 5)]
        assert _zset(client, "c") == [("y", 4), ("z", 3)]
        assert not client.exists(timeline_key(1, "b"))
        assert not client.exists(tweet_key(1, "t7"))
    got = read_timeline(client, "a")
    assert [t["tweet_id"] for t in got["tweets"]] == ["t9", "t5"] and got["tweets"][1]["text"] == "hi"
    assert list(export_timeline(client)) == [
        {"user_id": "a", "tweet_ids": ["t9", "t5"]},
        {"user_id": "c", "tweet_ids": ["y", "z"]},
        {"user_id": "ü€", "tweet_ids": ["ẞ-1"]},
    ]


def test_a_command_redis_rejects_fails_the_write_with_its_error(spark, redis_url):
    client = connect(redis_url)
    client.set(timeline_key(1, "s"), "not a sorted set")
    ops = _ops(spark, [("list", "s", "add", None, [(1, "t1")], None)])
    with pytest.raises(Exception, match="WRONGTYPE"):
        ListViewSink(redis_url, "timeline", 1, cap=3).write(ops, 0)


def _bulk(text: str) -> str:
    return f"${len(text.encode())}\r\n{text}\r\n"


def test_list_ops_turn_a_batch_of_join_changes_into_one_operation_per_list_and_entry(spark):
    """r (who follows a, 1 entry) loses t1 and gains t5: one `add`; s (who follows b, 3 entries > cap) loses t4:
    one `replace` with the next newest; t5 is stored, t1 and t4 deleted."""
    view = _builtin(spark, cap=2)
    join = view.join
    tweets, follows = (
        "op string, tweet_id string, user_id string, text string, ts bigint",
        "op string, follower_id string, followee_id string, ts bigint",
    )
    posts = [
        ("post", t, u, f"{t}!", ts)
        for t, u, ts in [("t1", "a", 1), ("t2", "b", 2), ("t3", "b", 3), ("t4", "b", 4)]
    ]
    first_batch = (
        spark.createDataFrame(posts, tweets),
        spark.createDataFrame([("follow", "r", "a", 0), ("follow", "s", "b", 0)], follows),
    )
    first = maintain_join(join, _empty(join), first_batch, view.parts)
    batch = [("delete", "t1", "a", None, 9), ("post", "t5", "a", "t5!", 5), ("delete", "t4", "b", None, 9)]
    changes = maintain_join(join, first.settle(), (spark.createDataFrame(batch, tweets), None), view.parts)
    sink = ListSink()
    [ops] = [ops for ops, _ in view.phases(changes)]  # without a fan-out limit: one write phase
    assert sink.write(ops, 1) == {"rows": 5}
    rows = sorted(
        ({**r, "entries": sorted(r["entries"]) if r["entries"] is not None else None} for r in sink.rows),
        key=lambda r: (r["kind"], r["id"]),
    )
    none = {"mode": None, "removes": None, "entries": None, "body": None}
    assert rows == [
        {**none, "kind": "entry", "id": "t1"},
        {**none, "kind": "entry", "id": "t4"},
        {**none, "kind": "entry", "id": "t5", "body": '{"tweet_id":"t5","user_id":"a","text":"t5!","ts":5}'},
        {
            **none,
            "kind": "list",
            "id": "r",
            "mode": "add",
            "removes": [_bulk("t1")],
            "entries": [_bulk("5") + _bulk("t5")],
        },
        {
            **none,
            "kind": "list",
            "id": "s",
            "mode": "replace",
            "entries": sorted([_bulk("3") + _bulk("t3"), _bulk("2") + _bulk("t2")]),
        },
    ]


def test_read_timeline_merges_the_celebrities_authored_sets_newest_first_once_each(redis_url):
    """The stored timeline holds the fanned-out followees' tweets; the celebrities' authored sets are merged in at
    read time, ties by tweet_id descending, a tweet in two places once, cut to `limit` and to the view's cap."""
    client = connect(redis_url)
    set_generation(client, "timeline", 1)
    client.hset(meta_key("timeline", 1), "timeline.cap", 4)
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
    assert read_timeline(client, "only", limit=1)["tweets"][0]["tweet_id"] == "c1"
    assert list(export_timeline(client)) == [
        {"user_id": "only", "tweet_ids": ["c1", "c3", "c2"]},
        {"user_id": "u", "tweet_ids": ["d1", "a1", "c1", "c3"]},
    ]


# --- Celebrity fan-out on read (FANOUT_LIMIT): the join, the sink's write phases and read_timeline together. ---

_TWEETS = "op string, tweet_id string, user_id string, text string, ts bigint"
_FOLLOWS = "op string, follower_id string, followee_id string, ts bigint"


_FEW = Few()  # the posts' phase: its size unknown and expected few, as the job writes it


@pytest.fixture
def redis_urls(request) -> list[str]:
    """The Redis targets a test writes the same batches to, each emptied: the session's redis-server (`server`),
    or it and the session's Redis Cluster (`server and cluster`)."""
    urls = [request.getfixturevalue("redis_server_url")]
    if request.param == "server and cluster":
        cluster = request.getfixturevalue("redis_cluster")
        RedisCluster.from_url(cluster["url"]).flushall()
        urls.append(cluster["url"])
    return urls


class _Hybrid:
    """The timeline job's steps without its streaming query: `begin_join` with a fan-out limit, a tweets-only
    batch's posts and the ops' write phases through the real sink into generation 1 of each Redis target (one URL
    or several: the same phases written to each), and the reads through `read_timeline`."""

    def __init__(self, spark, redis_url: str | list[str], cap: int, limit: int | None):
        self.spark, self.cap, self.limit = spark, cap, limit
        self.view = _builtin(spark, cap, limit)
        urls = [redis_url] if isinstance(redis_url, str) else redis_url
        self.clients = [connect(url) for url in urls]
        for client in self.clients:
            client.flushall()
            set_generation(client, "timeline", 1)
            client.hset(meta_key("timeline", 1), "timeline.cap", cap)
        self.sinks = [ListViewSink(url, "timeline", 1, cap) for url in urls]
        self.client, self.sink = self.clients[0], self.sinks[0]
        self.state = _empty(self.view.join)
        self.tweets, self.follows, self.batch = [], [], 0

    def phases(self, tweets: list[dict], follows: list[dict]):
        """The write phases of one batch of records (validated, as the logs hold them); the state moves on."""
        from changelog.records import validate
        from views.pipeline import builtin_pipeline

        topics = builtin_pipeline().topics
        tw = [validate(topics["tweets"], r) for r in tweets]
        fo = [validate(topics["follows"], r) for r in follows]
        self.tweets += tweets
        self.follows += follows
        # as the job hands them over: read once into the JVM (a local checkpoint), not a Python RDD per plan
        batches = (
            self.spark.createDataFrame(
                [(r["op"], r["tweet_id"], r["user_id"], r.get("text"), r["ts"]) for r in tw], _TWEETS
            ).localCheckpoint()
            if tw
            else None,
            self.spark.createDataFrame(
                [(r["op"], r["follower_id"], r["followee_id"], r["ts"]) for r in fo], _FOLLOWS
            ).localCheckpoint()
            if fo
            else None,
        )
        step = begin_join(self.view.join, self.state, batches, self.view.parts)
        posts = step.posts.get("timeline")
        # as the job applies them: a tweets-only batch's posts first (`Few`: no bound), then the phases after them
        phases = [(self.view.posts_ops(posts), _FEW)] if posts is not None else []
        changes = step.finish()
        self.state = changes.settle()
        phases += list(self.view.phases(changes, posted=posts is not None))
        for ops, at_most in phases:  # the bounds the sink trusts to collect a phase on the driver
            assert at_most in (None, _FEW) or ops.count() <= at_most
        return phases

    def write(self, phase, batch: int) -> None:
        for sink in self.sinks:
            sink.write(phase, batch)

    def step(self, tweets: list[dict], follows: list[dict]) -> None:
        for phase in self.phases(tweets, follows):
            self.write(phase, self.batch)
        self.batch += 1

    def expected(self) -> dict:
        from timeline_demo.reference import expected_timelines

        return expected_timelines(self.tweets, self.follows, self.cap)

    def read(self, user: str, client=None) -> list[str]:
        return [t["tweet_id"] for t in read_timeline(client or self.client, user)["tweets"]]

    def exported(self, client=None) -> dict:
        return {r["user_id"]: r["tweet_ids"] for r in export_timeline(client or self.client)}


@pytest.mark.parametrize("redis_urls", ["server and cluster"], indirect=True)
@pytest.mark.slow
def test_the_posts_of_a_tweets_only_batch_compile_no_code_after_the_first_batch(spark, redis_urls):
    """A celebrity's one-tweet batches: after the first, writing their posts (a phase of `Few`, a limited collect)
    compiles no new code in Spark (a stage holding a limit is compiled anew for every query), and leaves the
    session's whole-stage code generation as it was."""
    h = _Hybrid(spark, redis_urls, cap=5, limit=1)
    h.step([], [{"op": "follow", "follower_id": u, "followee_id": "c", "ts": 1} for u in ("r", "s")])
    compiles = codegen_compilations(spark)
    new_code = []
    for n in range(3):
        tweet = {"op": "post", "tweet_id": f"t{n}", "user_id": "c", "text": f"t{n}!", "ts": 10 + n}
        (posts, few), *rest = h.phases([tweet], [])
        assert few == _FEW
        before = compiles()
        for sink in h.sinks:  # to a redis-server and to a Redis Cluster
            sink.write((posts, few), h.batch)
        new_code.append(compiles() - before)
        for phase in rest:
            h.write(phase, h.batch)
        h.batch += 1
    assert new_code[1:] == [0, 0], new_code
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "true"
    for client in h.clients:
        assert h.read("r", client) == h.read("s", client) == ["t2", "t1", "t0"]


@pytest.mark.parametrize(
    "redis_urls, limit",
    [
        pytest.param("server", 0, marks=pytest.mark.slow, id="server-limit 0"),
        pytest.param("server", None, id="server-no limit"),
        pytest.param("server and cluster", 2, marks=pytest.mark.slow, id="server and cluster-limit 2"),
    ],  # limit 2 has both modes, on a server and on a cluster; make test-fast keeps the case without a limit
    indirect=["redis_urls"],
)
def test_every_read_equals_the_definition_for_any_fanout_limit_and_chunking(spark, redis_urls, limit):
    """Random workloads (deletes, unfollows, re-follows, duplicates, out-of-order), a small cap so that refills
    happen, cut into batches (some of tweets only): after every batch, export and every user's read_timeline equal
    the brute-force SQL on each Redis target. With limit 2 authors cross the limit both ways across batches."""
    from timeline_demo.workload import generate

    # seed 2 cut in 4: its authors cross limit 2 both ways; 3 chunks hold a batch of each kind (both topics,
    # tweets only, follows only)
    for seed, chunks in ((1, 1), (2, 4 if limit == 2 else 3)):
        wl = generate(seed=seed, users=30, celebrities=2, follows=160, tweets=160)
        rng = random.Random(seed)
        tw, fo = split_at_random(wl.tweets, chunks, rng), split_at_random(wl.follows, chunks, rng)
        h = _Hybrid(spark, redis_urls, cap=3, limit=limit)
        if chunks > 1:  # phases (the posts' too) over one operation go through the executors
            for sink in h.sinks:
                sink.DRIVER_ROWS = 1
        for i in range(chunks):
            # every other chunk as a batch of its tweets, then one of its follows (a tweets-only batch has posts)
            for batch_tw, batch_fo in [(tw[i], []), ([], fo[i])] if i % 2 else [(tw[i], fo[i])]:
                h.step(batch_tw, batch_fo)
                want = h.expected()
                users = {f"u{j}" for j in range(30)}
                for target, client in zip(redis_urls, h.clients, strict=True):
                    assert h.exported(client) == want, f"{target}: seed {seed}, batch {h.batch}"
                    assert {u: h.read(u, client) for u in users} == {u: want.get(u, []) for u in users}, (
                        f"{target}: seed {seed}, batch {h.batch}"
                    )
        if limit == 0:  # no one is fanned out: no stored timeline at all
            assert not list(h.client.scan_iter(match="mv:timeline:*"))
        if limit is None:
            assert not list(h.client.scan_iter(match="mv:timeline.reads:*"))
            assert not list(h.client.scan_iter(match="mv:timeline.heavy:*"))


def _post(t, u, ts):
    return {"op": "post", "tweet_id": t, "user_id": u, "text": f"{t}!", "ts": ts}


def _follow(op, a, b, ts):
    return {"op": op, "follower_id": a, "followee_id": b, "ts": ts}


@pytest.mark.parametrize("redis_urls", ["server and cluster"], indirect=True)
@pytest.mark.slow
def test_a_reader_between_the_write_phases_of_a_mode_switch_reads_the_state_before_or_after(
    spark, redis_urls
):
    """FANOUT_LIMIT 1, cap 2: author a becomes a celebrity (a second follower), posts and deletes as one, stops
    being one (an unfollow), becomes one again and stops again (everyone unfollows). The sink applies each batch's
    write phases one at a time, on a redis-server and on a Redis Cluster; after each phase every user reads from
    each exactly their timeline before or after the batch (a mode switch never hides or doubles a tweet), and after
    the last phase the one after."""
    h = _Hybrid(spark, redis_urls, cap=2, limit=1)
    targets = list(zip(redis_urls, h.clients, strict=True))
    users = ["r", "s", "t"]
    batches = [
        (
            [_post("a1", "a", 1), _post("a2", "a", 2), _post("a3", "a", 3), _post("b1", "b", 4)],
            [_follow("follow", "r", "a", 1), _follow("follow", "r", "b", 1)],
        ),
        ([], [_follow("follow", "s", "a", 2)]),  # a: 2 followers > 1, a celebrity
        ([_post("a4", "a", 5), {"op": "delete", "tweet_id": "a3", "user_id": "a", "ts": 9}], []),
        ([], [_follow("unfollow", "s", "a", 10)]),  # back to 1: fanned out again
        ([], [_follow("follow", "t", "a", 11), _follow("follow", "s", "a", 11)]),
        ([], [_follow("unfollow", u, "a", 12) for u in users]),
    ]
    n_phases = []
    for i, (tw, fo) in enumerate(batches):
        before = {target: {u: h.read(u, client) for u in users} for target, client in targets}
        phases = h.phases(tw, fo)
        want = h.expected()
        after = {u: want.get(u, []) for u in users}
        n_phases.append(len(phases))
        for p, phase in enumerate(phases):
            h.write(phase, i)  # to each target
            for target, client in targets:
                for u in users:
                    assert h.read(u, client) in (before[target][u], after[u]), (
                        f"{target}: batch {i}, after phase {p}: {u}"
                    )
        for target, client in targets:
            assert {u: h.read(u, client) for u in users} == after, f"{target}: batch {i}"
            assert h.exported(client) == {u: v for u, v in after.items() if v}, target
    assert n_phases[1] >= 2 and n_phases[3] >= 2  # the switches have phases to interleave
    assert after == {"r": ["b1"], "s": [], "t": []}
    for target, client in targets:  # retired: kept a little for readers in flight
        assert 0 < client.ttl(authored_key(1, "a")) <= 60, target


# --- Any pipeline's list views: both of the join's list paths through the real sink, read back, against the brute
# force of the contract's definitions. ---

_SHOP = """
topics:
  items:
    fields: {item: id, grp: id, score: long, label: string, ts: timestamp}
    optional: [label]
    key: item
    time: ts
    op: {upsert: put, remove: del}
    final_deletes: true
  members:
    fields: {user: id, grp: id, role: string, ts: timestamp}
    optional: [role]
    key: [user, grp]
    time: ts
    op: {upsert: join, remove: leave}
jobs:
  j:
    join: {left: items, right: members, match: {grp: grp}}
    views:
      feed: {list: {user: user}, entry: item, order: [ts desc, item desc], cap: 3,
             fields: {item: item, score: score, label: label}, entries: items, items: shown}
      feed_heavy: {list: {user: user}, entry: item, order: [ts desc, item desc], cap: 3, fanout_limit: 1,
                   fields: {item: item, score: score, label: label}}
      oldest: {list: {user: members.user}, entry: item, order: [score asc, item asc], cap: 2,
               fields: {label: label}}
      feed_where: {list: {user: user}, entry: item, order: [ts desc, item desc], cap: 2, where: "score > 1",
                   fields: {item: item, score: score}}
      by_group: {list: {grp: grp}, entry: item, order: [score desc, item desc], cap: 2, fields: {item: item}}
      by_role: {list: {role: role}, entry: item, order: [ts asc, item asc], cap: 3, fields: {item: item, ts: ts}}
"""


def _arrivals(rng: random.Random, events: int = 90) -> list[tuple[str, dict]]:
    """(topic, record) arrivals over few keys and times (ties), with removes and duplicates."""
    out = []
    for _ in range(events):
        ts = rng.randrange(1, 25)
        if rng.random() < 0.5:
            item = f"i{rng.randrange(14)}"
            if rng.random() < 0.15:
                out.append(("items", {"op": "del", "item": item, "ts": ts}))
            else:
                rec = {
                    "op": "put",
                    "item": item,
                    "grp": f"g{rng.randrange(4)}",
                    "score": rng.randrange(4),
                    "ts": ts,
                }
                out.append(("items", {**rec, "label": rng.choice([None, "x", "y"])}))
        else:
            op = "leave" if rng.random() < 0.25 else "join"
            rec = {"op": op, "user": f"u{rng.randrange(5)}", "grp": f"g{rng.randrange(4)}", "ts": ts}
            out.append(("members", {**rec, "role": rng.choice([None, "a", "b"])}))
    out += rng.sample(out, 8)  # delivered twice
    rng.shuffle(out)
    return out


class _Job:
    """A `join` job's steps without its streaming query, for every list view of the job: `begin_join` with the list
    shapes, each view's posts (a phase of `Few`) and write phases through the real sink into generation 1 of each Redis
    target (the same phases written to each)."""

    def __init__(self, spark, redis_urls: list[str], pipeline, job: str):
        self.spark, self.pipeline, self.job = spark, pipeline, job
        self.join = TableJoin(spark, *pipeline.sides(job), pipeline.jobs[job].spec.match)
        self.views = [ListView(self.join, v) for v in pipeline.jobs[job].views if v.kind == "list"]
        self.targets = [
            {
                v.view.name: ListViewSink(url, v.view.name, 1, v.view.cap, descending=v.descending)
                for v in self.views
            }
            for url in redis_urls
        ]
        self.clients = [connect(url) for url in redis_urls]
        for client in self.clients:
            set_generation(client, job, 1)
            client.hset(meta_key(job, 1), mapping={f"{v.view.name}.cap": v.view.cap for v in self.views})
        self.state = _empty(self.join)

    def step(self, batch: list[tuple[str, dict]], batch_id: int) -> None:
        frames = []
        for t in self.join.topics:
            cols = [n for n, _ in t.columns()]
            rows = [tuple(r.get(c) for c in cols) for n, r in batch if n == t.name]
            frames.append(self.spark.createDataFrame(rows, t.schema()).localCheckpoint() if rows else None)
        step = begin_join(self.join, self.state, tuple(frames), [p for v in self.views for p in v.parts])
        for v in self.views:
            posts = step.posts.get(v.view.name)
            if posts is not None:
                for sinks in self.targets:
                    sinks[v.view.name].write((v.posts_ops(posts), Few()), batch_id)
        changes = step.finish()
        for v in self.views:
            phases = list(v.phases(changes, step.posts.get(v.view.name) is not None))
            for sinks in self.targets:
                sinks[v.view.name].write(phases, batch_id)
        self.state = changes.settle()
        changes.release()


@pytest.mark.parametrize(
    "redis_urls, seed, chunks",
    [
        pytest.param("server", 1, 1, id="server-one batch"),
        pytest.param(
            "server and cluster", 2, 3, marks=pytest.mark.slow, id="server and cluster-three batches"
        ),
    ],
    indirect=["redis_urls"],
)
def test_every_list_view_of_any_shape_reads_as_the_definition(spark, redis_urls, seed, chunks):
    """Random arrivals of two table topics cut into batches (some of one topic only): after every batch, every list
    view (the list shape, with and without a fan-out limit, ascending and descending; the delta path with a `where`,
    with a key over the entry's side, with a key over the other side) exports and reads every key, on each Redis
    target, exactly as the brute force of the contract's definitions; a fan-out limit changes where entries are
    kept, not what is read."""
    from timeline_demo.brute import batches_of, brute_force
    from views.pipeline import parse_pipeline

    pipeline = parse_pipeline(_SHOP, "shop.yml")
    job = _Job(spark, redis_urls, pipeline, "j")
    rng = random.Random(seed)
    arrivals = _arrivals(rng)
    cuts = sorted(rng.sample(range(1, len(arrivals)), chunks - 1))
    for b, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, len(arrivals)], strict=True)):
        part = arrivals[lo:hi]
        if b % 2:  # a batch of one topic, then one of the other (a batch of entries only has posts)
            job.step([a for a in part if a[0] == "items"], 2 * b)
            job.step([a for a in part if a[0] == "members"], 2 * b + 1)
        else:
            job.step(part, 2 * b)
        want = brute_force(pipeline, batches_of(arrivals[:hi]))
        for target, client in zip(redis_urls, job.clients, strict=True):
            for v in job.views:
                name = v.view.name
                assert list(export_list(client, v.view)) == want.export(name), (
                    f"{target}: {name}, seed {seed}, records {hi}"
                )
                for key in [*want.keys(name), "nobody"]:
                    got = query_list(client, v.view, key)
                    assert got == want.query(name, key), f"{target}: {name} {key}, seed {seed}, records {hi}"
            assert not list(client.scan_iter(match="mv:feed.heavy:1:*")), target
    for target, client in zip(redis_urls, job.clients, strict=True):
        heavy = list(client.scan_iter(match="mv:feed_heavy.heavy:1:*"))
        assert heavy, f"{target}: the fan-out limit kept some entries once per heavy value"


# --- The read API as a user of a pipeline of their own meets it (issue #41, items 2-4) ---

BIKES = """
topics:
  riders:
    fields: {rider_id: id, station_id: id, plan: string, ts: timestamp}
    key: rider_id
    time: ts
  stations:
    fields: {station_id: id, fee: double, ts: timestamp}
    key: station_id
    time: ts
jobs:
  membership:
    join: {left: riders, right: stations, match: {station_id: station_id}}
    views:
      station_members: {list: {station_id: stations.station_id}, entry: rider_id, order: [ts desc, rider_id desc],
                        cap: 10, fields: {plan: plan, fee: fee}, entries: riders, items: members}
      rider_station: {row: {rider_id: rider_id}, fields: {station_id: station_id}}
      riders_by_plan: {count: {plan: plan}, values: {riders: 1}}
"""


@pytest.fixture
def bikes(redis_url):
    """The bike-sharing pipeline of issue #41 and its job's generation 1 in Redis as its sinks write it: station
    s01 holds riders r1 (older) and r2, whose fields do not name the entry; s41 holds none."""
    from views.pipeline import parse_pipeline

    client = connect(redis_url)
    set_generation(client, "membership", 1)
    client.zadd(list_key("station_members", 1, "s01"), {"r1": 5, "r2": 7})
    client.set(entry_key("station_members", 1, "r1"), '{"plan":"student","fee":9.5}')
    client.set(entry_key("station_members", 1, "r2"), '{"plan":"day","fee":9.5}')
    return client, parse_pipeline(BIKES, "bikes.yml")


def test_a_list_query_says_each_items_entry(bikes):
    """Each item carries its entry (here under the entry expression's name, `rider_id`, first); the query gives the
    items alone (the contract's timeline line), the read API the entries array beside them; an item whose fields
    hold the entry already (the timeline's `tweet_id`) is left as the fields are."""
    from views.read import query_view

    client, pipeline = bikes
    want = {
        "station_id": "s01",
        "generation": 1,
        "members": [
            {"rider_id": "r2", "plan": "day", "fee": 9.5},
            {"rider_id": "r1", "plan": "student", "fee": 9.5},
        ],
    }
    assert query_view(client, "station_members", "s01", pipeline=pipeline) == want
    assert read_list(client, "station_members", "s01", pipeline=pipeline) == {**want, "riders": ["r2", "r1"]}
    one = query_view(client, "station_members", "s01", limit=1, pipeline=pipeline)
    assert one["members"] == want["members"][:1] and "riders" not in one

    set_generation(client, "timeline", 1)
    client.zadd(timeline_key(1, "u"), {"t1": 1})
    client.set(tweet_key(1, "t1"), '{"tweet_id":"t1","user_id":"a","text":"hi","ts":1}')
    got = read_list(client, VIEW, "u")
    assert got["tweets"] == [{"tweet_id": "t1", "user_id": "a", "text": "hi", "ts": 1}]
    assert got == {"user_id": "u", "generation": 1, "tweet_ids": ["t1"], "tweets": got["tweets"]}


def test_a_key_with_no_entry_queries_as_empty_in_every_view_kind(bikes):
    """`query_view` (`mview query --json`) of a key with no entry is `{}` for a list as for a row and a count; the
    read API keeps the list's shape, its arrays empty."""
    from views.read import query_view

    client, pipeline = bikes
    for view in ("station_members", "rider_station", "riders_by_plan"):
        assert query_view(client, view, "s41", pipeline=pipeline) == {}, view
    assert query_view(client, "station_members", "s01", limit=0, pipeline=pipeline) == {}
    got = read_list(client, "station_members", "s41", pipeline=pipeline)
    assert got == {"station_id": "s41", "generation": 1, "riders": [], "members": []}


def test_read_list_takes_a_view_name_and_refuses_an_unknown_view_or_job(bikes):
    """The read API takes the view (its name in the pipeline, or the `View`); its job is the pipeline's. An unknown
    view, a view of another kind, a job that does not publish the view and the call of the old signature (`job`
    before the key) each raise an error naming the problem, never an empty answer."""
    from views.errors import UnknownView, ViewError, WrongJob

    client, pipeline = bikes
    view = pipeline.views["station_members"]
    assert read_list(client, view, "s01")["riders"] == ["r2", "r1"]
    with pytest.raises(UnknownView, match="unknown view 's01'") as e:
        read_list(client, "s01", "station_members", pipeline=pipeline)
    assert e.value.view == "s01"
    with pytest.raises(WrongJob, match="'station_members' belongs to job 'membership'") as e:
        read_list(client, view, "s01", job="station_members")
    assert (e.value.view, e.value.job, e.value.owner) == ("station_members", "station_members", "membership")
    with pytest.raises(ViewError, match="rider_station is a row view, not a list"):
        read_list(client, "rider_station", "r1", pipeline=pipeline)
    with pytest.raises(ViewError, match="limit"):
        read_list(client, view, "station_members", "s01")  # the old form: (client, view, job, key)
    with pytest.raises(WrongJob):
        export_list(client, view, "station_members")  # raised at once, not when read
    assert list(export_list(client, "station_members", pipeline=pipeline)) == [
        {"station_id": "s01", "riders": ["r2", "r1"]}
    ]
