"""The `timeline` view in Redis: its operations made from the join's changes, the sink that applies them, and the
read side.

`timeline_ops(changes)` turns one micro-batch of `joins.table_table.TimelineChanges` into operations:
removed entries and added entries of a follower become one `add` operation; a follower whose timeline is
recomputed whole gets one `replace`; a tweet that became live has its JSON stored, one that stopped being live
deleted.

With a fan-out limit (FANOUT_LIMIT), a celebrity's tweets are not in their followers' timelines: they are kept in
the author's *authored set* (`mv:authored:<g>:{author}`, the newest `cap` live tweets), and each user's *celebrity
set* (`mv:celebs:<g>:{user}`) names the celebrities they follow. `read_timeline` merges them. The operations then come
in three write phases, each applied after the previous one, so that a reader between phases never misses or doubles a
tweet of an author who crossed the limit (a reader drops duplicates by tweet id):
1. new tweet bodies; authored sets added to or replaced (an author who became a celebrity first of all); celebrities
   added to users' celebrity sets;
2. the followers' timelines (an author who became a celebrity leaves them here, one who stopped being one enters them);
3. bodies of tweets that stopped being live; celebrities removed from users' celebrity sets; the authored sets of
   authors who stopped being celebrities expire `RETIRE_SECONDS` later (a reader that read a celebrity set just before
   may still read them).
In a batch of tweets only, phase 1's bodies and authored adds (`timeline_posts`) are applied before the batch's
changes are counted, and phase 1 keeps the rest (authored sets replaced, which are other keys).
Every key is written whole in its MULTI/EXEC, so a reader sees it before or after the batch; a read of a user's
timeline and celebrity set is one atomic script call (one hash slot: the user's).

Sink input (one DataFrame per write phase, `TIMELINE_OPS_SCHEMA`):
- `kind="timeline"`, `id=follower`, `mode="add"`: ZREM the `removes`, ZADD the `entries`, then keep the newest
  `cap`; `mode="replace"`: the entries are the follower's whole new timeline (a refill after a removal).
- `kind="tweet"`, `id=tweet_id`: `body` is the tweet's JSON to store, or null to delete it.
- `kind="authored"`, `id=author`: as a timeline, on the author's authored set; `mode="retire"`: let it expire.
- `kind="celebs"`, `id=user`: `entries` are celebrity ids to add to the user's celebrity set, `removes` to remove.
`removes` and `entries` are arrays of wire-protocol text made by `member(tweet_id)` and `entry(ts, tweet_id)`, in
the JVM; an added entry is made once per tweet before it is fanned out to its followers (the join evaluates
`ENTRY_CARRY` per tweet: `maintain_timeline(..., carry=ENTRY_CARRY)`). The sink builds each operation's Redis
commands around them in Spark SQL, and the executors' Python only forwards the text, about 1 MB per round trip:
no Python code and no Lua script handles a single entry.

Every operation is idempotent on its key (ZADD of the same members, trim to the same cap, replace with the same
content, SET/DEL of the same body) and the commands of one timeline run in one MULTI/EXEC, so readers never see
a timeline half-changed, and a micro-batch that Spark replays after a crash, fully or partly applied before,
leaves exactly the content of one application.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from redis.commands.core import Script

from joins.table_table import TimelineChanges, TimelinePosts
from views.keys import authored_key, celebs_key, key_id, meta_key, timeline_key, tweet_key, view_pattern
from views.redis_io import Forwarder, current_generation, is_cluster, sink_client
from views.wire import array_command, bulk, command, hash_tag_column, lit, view_key_column

__all__ = [
    "TIMELINE_OPS_SCHEMA",
    "ENTRY_CARRY",
    "RETIRE_SECONDS",
    "timeline_ops",
    "timeline_phases",
    "timeline_posts",
    "TimelineSink",
    "entry",
    "member",
    "read_timeline",
    "query_timeline",
    "export_timeline",
]

TIMELINE_OPS_SCHEMA = (
    "kind string, id string, mode string, removes array<string>, entries array<string>, body string"
)

# A former celebrity's authored set expires this long after they stop being one, rather than at once: a reader that
# read the user's celebrity set just before can still read it.
RETIRE_SECONDS = 60
_PIPELINE_BYTES = 1 << 20  # send about this many bytes of commands per round trip
_MULTI, _EXEC = lit("*1\r\n$5\r\nMULTI\r\n"), lit("*1\r\n$4\r\nEXEC\r\n")


def member(tweet_id: str) -> str:
    """A timeline member to remove, as ZREM arguments (SQL text of the string expression `tweet_id`)."""
    return bulk(tweet_id)


def entry(ts: str, tweet_id: str) -> str:
    """A timeline entry (score `ts`, member `tweet_id`), as ZADD arguments (SQL text; `ts` a bigint expression)."""
    return f"concat({bulk(f'cast({ts} AS string)')}, {bulk(tweet_id)})"


ENTRY_CARRY = entry("ts", "tweet_id")  # the join's `carry`: a tweet's entry, made once per tweet


_IDS = {"timeline": "follower_id", "celebs": "follower_id", "authored": "user_id", "tweet": "tweet_id"}


def _op(df: DataFrame, kind: str, mode="NULL", removes="NULL", entries="NULL", body="NULL") -> DataFrame:
    """`df` as TIMELINE_OPS_SCHEMA rows of `kind` (keyed by `_IDS[kind]`); the rest are SQL texts."""
    return df.selectExpr(
        f"'{kind}' AS kind",
        f"{_IDS[kind]} AS id",
        f"CAST({mode} AS string) AS mode",
        f"CAST({removes} AS array<string>) AS removes",
        f"CAST({entries} AS array<string>) AS entries",
        f"CAST({body} AS string) AS body",
    )


def _union(parts: list[DataFrame]) -> DataFrame:
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _timeline_parts(changes: TimelineChanges) -> list[DataFrame]:
    """The followers' timeline operations: a follower's removes and adds are one `add`; refills are `replace`."""
    n = changes.counts
    removing, adding = n["died"] or n["lost"], n["fanned"] or n["gained"]
    adds = changes.adds.selectExpr("follower_id", "entries.p AS entries")
    if removing:
        removes = changes.removes.groupBy("follower_id").agg(
            F.expr(f"collect_list({member('tweet_id')}) AS removes")
        )
        touched = adds.join(removes, "follower_id", "full") if adding else removes
        return [
            _op(touched, "timeline", "'add'", "removes", "entries" if adding else "NULL"),
            _op(changes.replaces, "timeline", "'replace'", entries="entries.p"),
        ]
    return [_op(adds, "timeline", "'add'", entries="entries")] if adding else []


def _celebrity_phases(changes: TimelineChanges, posted: bool) -> tuple[list[DataFrame], list[DataFrame]]:
    """(before, after): the celebrity side's operations applied before the timelines' (authored sets, celebrities
    gained; the adds only when not `posted`) and after them (celebrities lost, authored sets retired)."""
    n = changes.counts
    first, last = [], []
    if n["up"] or n["died"]:
        first.append(_op(changes.authored_replaces, "authored", "'replace'", entries="entries.p"))
    if n["born"] and not posted:
        first.append(_op(changes.authored_adds, "authored", "'add'", entries="entries.p"))
    for df, out, column in (
        (changes.celebs_gained, first, "entries"),
        (changes.celebs_lost, last, "removes"),
    ):
        if n[f"celebs_{'gained' if out is first else 'lost'}"]:
            per = df.groupBy("follower_id").agg(F.expr(f"collect_list({bulk('followee_id')}) AS ids"))
            out.append(_op(per, "celebs", **{column: "ids"}))
    if n["down"]:
        last.append(_op(changes.authored_retired, "authored", "'retire'"))
    return first, last


_BODY = "to_json(struct(tweet_id, user_id, text, ts))"  # a tweet's stored JSON


def timeline_posts(posts: TimelinePosts) -> DataFrame:
    """The operations (TIMELINE_OPS_SCHEMA) of a batch's `posts` (`joins.table_table.TimelineStep.posts`): the bodies
    of tweets that became live and the celebrities' authored sets added to, at most two per tweet of the batch. They
    are part of the first write phase, taken out to be applied before the batch's changes are counted; the phases
    after them are `timeline_phases(changes, posted=True)`."""
    return _op(posts.tweets_live, "tweet", body=_BODY).unionByName(
        _op(posts.authored_adds, "authored", "'add'", entries="entries.p")
    )


def timeline_phases(changes: TimelineChanges, posted: bool = False) -> Iterator[tuple[DataFrame, int | None]]:
    """The operations (TIMELINE_OPS_SCHEMA) of one micro-batch's `changes`, made by `maintain_timeline` with
    `carry=ENTRY_CARRY` (entries are taken as the join carried them), in write phases, each to be applied after the
    previous one (`TimelineSink.write` does): one (DataFrame, rows_at_most) per phase, rows_at_most a bound on its
    operations known from the join's counts, or None (a fan-out, bounded by follower counts only). Without a fan-out
    limit there is one phase; with one, up to three (see the module docstring). Branches with no input in the batch
    are left out. Each phase is planned when the one before it was taken, so a sink that writes it first does not
    wait for the others' plans. `posted`: the batch's `timeline_posts` were applied already (left out here)."""
    n = changes.counts
    born = [_op(changes.tweets_live, "tweet", body=_BODY)] if n["born"] and not posted else []
    if changes.celebs_gained is None:
        timelines = _timeline_parts(changes)
        dead = [_op(changes.tweets_dead, "tweet")] if n["died"] or not (timelines or born) else []
        yield _union(timelines + born + dead), None if timelines else n["born"] + n["died"]
        return
    first, last = _celebrity_phases(changes, posted)
    if born + first:  # bodies and authored sets: one per tweet or author; celebrity sets: one per user
        yield _union(born + first), 2 * n["born"] + n["up"] + n["died"] + n["celebs_gained"]
    timelines = _timeline_parts(changes)
    if timelines:
        yield _union(timelines), None
    dead = [_op(changes.tweets_dead, "tweet")] if n["died"] else []
    if dead + last:
        yield _union(dead + last), n["died"] + n["celebs_lost"] + n["down"]


def timeline_ops(changes: TimelineChanges) -> list[DataFrame]:
    """The write phases of `timeline_phases(changes)`, without their bounds, all planned."""
    return [ops for ops, _ in timeline_phases(changes)]


def _wire(ops_df, generation: int, cap: int, cluster: bool):
    """payload (the operation's commands), replies (how many), timelines (1 for a timeline), entries (added),
    tag (the hash tag of the operation's keys on a Redis Cluster, else null). One SQL text per column (see
    `views.wire`); the key and the array sizes are a projection of their own, computed once per row and referred
    to by name (written out in every command, they made a tree the optimizer and code generator took a few
    hundred ms to plan in every batch)."""
    keyed = ops_df.selectExpr(
        "kind",
        "mode",
        "removes",
        "entries",
        "body",
        f"CASE kind WHEN 'timeline' THEN {view_key_column('timeline', generation, 'id')} "
        f"WHEN 'authored' THEN {view_key_column('authored', generation, 'id')} "
        f"WHEN 'celebs' THEN {view_key_column('celebs', generation, 'id')} "
        f"ELSE {view_key_column('tweet', generation, 'id')} END AS k",
        "coalesce(size(removes), 0) AS nr",
        "coalesce(size(entries), 0) AS ne",
        f"{hash_tag_column('id') if cluster else 'CAST(NULL AS string)'} AS tag",
    )
    zset = (
        f"concat({_MULTI}, "
        f"CASE WHEN mode = 'replace' THEN {command(lit('DEL'), 'k')} ELSE '' END, "
        f"CASE WHEN nr > 0 THEN {array_command('ZREM', 'k', 'removes')} ELSE '' END, "
        f"CASE WHEN ne > 0 THEN {array_command('ZADD', 'k', 'entries', 2)} ELSE '' END, "
        f"{command(lit('ZREMRANGEBYRANK'), 'k', lit('0'), lit(str(-(cap + 1))))}, "
        f"{_EXEC})"
    )
    # MULTI's OK, one QUEUED per command (the trim, and a DEL, ZREM, ZADD when present), EXEC's reply.
    queued = "1 + CAST(mode = 'replace' AS int) + CAST(nr > 0 AS int) + CAST(ne > 0 AS int)"
    retire = command(lit("EXPIRE"), "k", lit(str(RETIRE_SECONDS)))
    celebs = (
        f"concat(CASE WHEN ne > 0 THEN {array_command('SADD', 'k', 'entries')} ELSE '' END, "
        f"CASE WHEN nr > 0 THEN {array_command('SREM', 'k', 'removes')} ELSE '' END)"
    )
    tweet = (
        f"CASE WHEN body IS NULL THEN {command(lit('DEL'), 'k')} ELSE {command(lit('SET'), 'k', 'body')} END"
    )
    is_zset = "kind IN ('timeline', 'authored') AND mode <> 'retire'"
    return keyed.selectExpr(
        f"CASE WHEN {is_zset} THEN {zset} WHEN kind = 'authored' THEN {retire} "
        f"WHEN kind = 'celebs' THEN {celebs} ELSE {tweet} END AS payload",
        f"CASE WHEN {is_zset} THEN {queued} + 2 "
        "WHEN kind = 'celebs' THEN CAST(ne > 0 AS int) + CAST(nr > 0 AS int) ELSE 1 END AS replies",
        "CAST(kind = 'timeline' AS int) AS timelines",
        "CASE WHEN kind = 'timeline' THEN ne ELSE 0 END AS entries",
        "tag",
    )


def _forward(rows, url: str) -> tuple[int, int]:
    """Forward wire rows' commands, about `_PIPELINE_BYTES` per round trip (per master on a cluster); (timelines,
    entries) they wrote."""
    timelines = entries = 0
    with Forwarder(sink_client(url), what="timeline sink", limit=_PIPELINE_BYTES) as out:
        for payload, n, is_timeline, added, tag in rows:
            out.add(payload.encode(), n, tag)
            timelines, entries = timelines + is_timeline, entries + added
    return timelines, entries


def _apply_partition(rows, url: str, counters) -> None:
    timelines, entries = _forward(rows, url)
    counters[0].add(timelines)
    counters[1].add(entries)


class TimelineSink:
    """Applies a micro-batch of timeline operations to generation `generation`: a write phase known to hold at most
    `DRIVER_ROWS` operations from the driver (one Spark job that collects it: no Python task), any other from the
    executors."""

    DRIVER_ROWS = 10_000

    def __init__(self, url: str, generation: int, cap: int):
        self.url, self.generation, self.cap = url, generation, cap

    def write(self, ops, batch_id: int) -> dict:
        """Apply `ops` (TIMELINE_OPS_SCHEMA: a write phase, or a list of them applied one after the other; a phase is
        a DataFrame or a (DataFrame, rows_at_most) pair as `timeline_phases` makes them); return
        {"timelines": ops applied, "entries": entries added}."""
        url, written = self.url, [0, 0]
        for phase in [ops] if isinstance(ops, (DataFrame, tuple)) else ops:
            ops_df, at_most = phase if isinstance(phase, tuple) else (phase, None)
            wire = _wire(ops_df, self.generation, self.cap, is_cluster(url))
            if at_most is not None and at_most <= self.DRIVER_ROWS:
                done = _forward(wire.collect(), url)
            else:
                sc = ops_df.sparkSession.sparkContext
                counters = (sc.accumulator(0), sc.accumulator(0))
                wire.foreachPartition(lambda rows, c=counters: _apply_partition(rows, url, c))
                done = (counters[0].value, counters[1].value)
            written = [written[0] + done[0], written[1] + done[1]]
        return {"timelines": written[0], "entries": written[1]}

    def write_few(self, ops_df: DataFrame, batch_id: int) -> dict:
        """`write` of one phase expected to be small whose size is not known: its first `DRIVER_ROWS` + 1 operations
        are collected (one Spark job); when that is all of them they are applied from the driver, else the phase is
        applied from the executors (computed again)."""
        wire = _wire(ops_df, self.generation, self.cap, is_cluster(self.url))
        # Planned without whole-stage code generation: Spark names a limit's counter in the generated code from a
        # process-wide sequence, so a stage holding a limit is compiled anew in every batch, where each operator's
        # own code (a few rows go through it) is compiled once and cached.
        conf = wire.sparkSession.conf
        whole_stage = conf.get("spark.sql.codegen.wholeStage")
        conf.set("spark.sql.codegen.wholeStage", "false")
        try:
            rows = wire.limit(self.DRIVER_ROWS + 1).collect()
        finally:
            conf.set("spark.sql.codegen.wholeStage", whole_stage)
        if len(rows) > self.DRIVER_ROWS:
            return self.write((ops_df, None), batch_id)
        done = _forward(rows, self.url)
        return {"timelines": done[0], "entries": done[1]}


def _hydrate(client, generation: int, tweet_ids: list[str]) -> list[dict]:
    pipe = client.pipeline(transaction=False)
    for tid in tweet_ids:
        pipe.get(tweet_key(generation, tid))
    out = []
    for tid, body in zip(tweet_ids, pipe.execute(), strict=True):
        out.append(
            orjson.loads(body) if body else {"tweet_id": tid, "user_id": None, "text": None, "ts": None}
        )
    return out


# KEYS[1] = the user's timeline, KEYS[2] = the user's celebrities (one hash slot: the user's); ARGV[1] = the last
# rank to read (-1: all). One atomic read of both, so a mode switch between them is never half seen.
_SNAPSHOT = Script(
    None,
    b"return {redis.call('ZREVRANGE', KEYS[1], 0, ARGV[1], 'WITHSCORES'), redis.call('SMEMBERS', KEYS[2])}",
)


def _pairs(flat) -> list[tuple[int, str]]:
    """(ts, tweet_id) of a ZREVRANGE ... WITHSCORES reply (member, score, member, score, ...)."""
    return [(int(float(flat[i + 1])), flat[i].decode()) for i in range(0, len(flat), 2)]


def _snapshots(client, generation: int, users: list[str], stop: int):
    """Per user: (timeline [(ts, tweet_id)] newest first, [celebrity ids]), each user's read atomic (round trip 1;
    one script call per user, all in one pipeline when there are several)."""
    if len(users) == 1:
        keys = [timeline_key(generation, users[0]), celebs_key(generation, users[0])]
        replies = [_SNAPSHOT(keys=keys, args=[stop], client=client)]
    else:
        pipe = client.pipeline(transaction=False)
        for u in users:  # EVAL: a cluster pipeline blocks EVALSHA and eval()
            keys = (timeline_key(generation, u), celebs_key(generation, u))
            pipe.execute_command("EVAL", _SNAPSHOT.script, 2, *keys, stop)
        replies = pipe.execute()
    return [(_pairs(own), sorted(c.decode() for c in celebs)) for own, celebs in replies]


def _authored(client, generation: int, job: str, authors, stop: int) -> tuple[dict, int | None]:
    """({author: [(ts, tweet_id)] newest first}, the view's cap) in one pipelined round trip (one per node on a
    cluster): the celebrities' authored sets and the cap recorded in the generation's meta hash."""
    authors = sorted(authors)
    pipe = client.pipeline(transaction=False)
    for a in authors:
        pipe.zrevrange(authored_key(generation, a), 0, stop, withscores=True)
    pipe.hget(meta_key(job, generation), "cap")
    *sets, cap = pipe.execute()
    return {
        a: [(int(ts), tid.decode()) for tid, ts in entries] for a, entries in zip(authors, sets, strict=True)
    }, (int(cap) if cap is not None else None)


def _merge(own: list[tuple[int, str]], others: list[list[tuple[int, str]]], n: int | None) -> list[str]:
    """The newest `n` distinct tweet ids of the union (ts descending, ties by tweet_id descending)."""
    best: dict[str, int] = {}
    for entries in (own, *others):
        for ts, tid in entries:
            if best.get(tid, ts) <= ts:
                best[tid] = ts
    ordered = sorted(((ts, tid) for tid, ts in best.items()), reverse=True)
    return [tid for _, tid in (ordered if n is None else ordered[:n])]


def _cut(limit: int | None, cap: int | None) -> int | None:
    return limit if cap is None else cap if limit is None else min(limit, cap)


def read_timeline(client, user_id: str, limit: int | None = None, *, job: str = "timeline") -> dict:
    """The home timeline of `user_id` as the view defines it: `{"user_id","generation","tweets":[{"tweet_id",
    "user_id","text","ts"}, ...]}`, newest first (ties by tweet_id descending), at most `limit` (None: the whole
    timeline, `TIMELINE_CAP` entries at most). The one read path of the view (`mview query`, `export`, the web
    page use it); it needs only a Redis client, never Spark.

    The stored timeline holds the tweets of the followees that are fanned out on write; the tweets of the
    celebrities the user follows (`FANOUT_LIMIT`) are merged in here, newest first, duplicates once. Round trips:
    the generation pointer; the user's timeline and celebrity set, read atomically (one hash slot); when the user
    follows celebrities, their authored sets, pipelined (one round trip per node); the tweets' bodies. A tweet whose
    body is gone by then (deleted meanwhile) is returned with null `user_id`, `text` and `ts`.
    """
    generation = current_generation(client, job)
    ids: list[str] = []
    if limit is None or limit > 0:
        stop = -1 if limit is None else limit - 1
        [(own, celebs)] = _snapshots(client, generation, [user_id], stop)
        if celebs:
            authored, cap = _authored(client, generation, job, celebs, stop)
            ids = _merge(own, [authored[a] for a in celebs], _cut(limit, cap))
        else:
            ids = [tid for _, tid in own]
    return {"user_id": user_id, "generation": generation, "tweets": _hydrate(client, generation, ids)}


def query_timeline(client, user_id: str, *, limit: int | None = None, job: str = "timeline") -> dict:
    """`read_timeline(client, user_id, limit, job=job)` (the form `views.read.query_view` calls)."""
    return read_timeline(client, user_id, limit, job=job)


def export_timeline(client, *, job: str = "timeline"):
    """Every non-empty timeline as `{"user_id","tweet_ids":[newest first]}`, ordered by user_id: the users with a
    stored timeline or a celebrity set, each read and merged as `read_timeline` does (500 users per round trip,
    each celebrity's authored set read once)."""
    generation = current_generation(client, job)
    users = sorted(
        {
            key_id(k)
            for view in ("timeline", "celebs")
            for k in client.scan_iter(match=view_pattern(view, generation), count=1000)
        }
    )
    authored: dict[str, list] = {}
    cap = None
    for i in range(0, len(users), 500):
        chunk = users[i : i + 500]
        snaps = _snapshots(client, generation, chunk, -1)
        needed = {a for _, celebs in snaps for a in celebs} - authored.keys()
        if needed:
            more, cap = _authored(client, generation, job, needed, -1)
            authored.update(more)
        for user, (own, celebs) in zip(chunk, snaps, strict=True):
            ids = _merge(own, [authored[a] for a in celebs], cap) if celebs else [t for _, t in own]
            if ids:
                yield {"user_id": user, "tweet_ids": ids}
