"""The `timeline` view in Redis: its operations made from the join's changes, the sink that applies them, and the
read side.

`timeline_ops(changes)` turns one micro-batch of `joins.table_table.TimelineChanges` into operations:
removed entries and added entries of a follower become one `add` operation; a follower whose timeline is
recomputed whole gets one `replace`; a tweet that became live has its JSON stored, one that stopped being live
deleted.

Sink input (one DataFrame per micro-batch, `TIMELINE_OPS_SCHEMA`):
- `kind="timeline"`, `id=follower`, `mode="add"`: ZREM the `removes`, ZADD the `entries`, then keep the newest
  `cap`; `mode="replace"`: the entries are the follower's whole new timeline (a refill after a removal).
- `kind="tweet"`, `id=tweet_id`: `body` is the tweet's JSON to store, or null to delete it.
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

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from joins.table_table import TimelineChanges
from views.keys import key_id, timeline_key, tweet_key, view_pattern
from views.redis_io import connect, current_generation, send_packed
from views.wire import array_command, bulk, command, lit, view_key_column

__all__ = [
    "TIMELINE_OPS_SCHEMA",
    "ENTRY_CARRY",
    "timeline_ops",
    "TimelineSink",
    "entry",
    "member",
    "query_timeline",
    "export_timeline",
]

TIMELINE_OPS_SCHEMA = (
    "kind string, id string, mode string, removes array<string>, entries array<string>, body string"
)

_PIPELINE_BYTES = 1 << 20  # send about this many bytes of commands per round trip
_MULTI, _EXEC = lit("*1\r\n$5\r\nMULTI\r\n"), lit("*1\r\n$4\r\nEXEC\r\n")


def member(tweet_id: str) -> str:
    """A timeline member to remove, as ZREM arguments (SQL text of the string expression `tweet_id`)."""
    return bulk(tweet_id)


def entry(ts: str, tweet_id: str) -> str:
    """A timeline entry (score `ts`, member `tweet_id`), as ZADD arguments (SQL text; `ts` a bigint expression)."""
    return f"concat({bulk(f'cast({ts} AS string)')}, {bulk(tweet_id)})"


ENTRY_CARRY = entry("ts", "tweet_id")  # the join's `carry`: a tweet's entry, made once per tweet


def _op(df: DataFrame, kind: str, mode="NULL", removes="NULL", entries="NULL", body="NULL") -> DataFrame:
    """`df` as TIMELINE_OPS_SCHEMA rows of `kind` (keyed by follower_id or tweet_id); the rest are SQL texts."""
    return df.selectExpr(
        f"'{kind}' AS kind",
        f"{'follower_id' if kind == 'timeline' else 'tweet_id'} AS id",
        f"CAST({mode} AS string) AS mode",
        f"CAST({removes} AS array<string>) AS removes",
        f"CAST({entries} AS array<string>) AS entries",
        f"CAST({body} AS string) AS body",
    )


def timeline_ops(changes: TimelineChanges) -> DataFrame:
    """The operations (TIMELINE_OPS_SCHEMA) of one micro-batch's `changes`, made by `maintain_timeline` with
    `carry=ENTRY_CARRY` (entries are taken as the join carried them). A follower's removes and adds are one `add`
    operation; branches with no input in the batch are left out of the plan."""
    n = changes.counts
    removing, adding = n["died"] or n["lost"], n["born"] or n["gained"]
    parts = []
    adds = changes.adds.selectExpr("follower_id", "entries.p AS entries")
    if removing:
        removes = changes.removes.groupBy("follower_id").agg(
            F.expr(f"collect_list({member('tweet_id')}) AS removes")
        )
        touched = adds.join(removes, "follower_id", "full") if adding else removes
        parts.append(_op(touched, "timeline", "'add'", "removes", "entries" if adding else "NULL"))
        parts.append(_op(changes.replaces, "timeline", "'replace'", entries="entries.p"))
    elif adding:
        parts.append(_op(adds, "timeline", "'add'", entries="entries"))
    if n["born"]:
        parts.append(_op(changes.tweets_live, "tweet", body="to_json(struct(tweet_id, user_id, text, ts))"))
    if n["died"]:
        parts.append(_op(changes.tweets_dead, "tweet"))
    out = parts[0] if parts else _op(changes.tweets_dead, "tweet")
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _wire(ops_df, generation: int, cap: int):
    """payload (the operation's commands), replies (how many), timelines (1 for a timeline), entries (added).
    One SQL text per column (see `views.wire`)."""
    n_removes, n_entries = "coalesce(size(removes), 0)", "coalesce(size(entries), 0)"
    key = view_key_column("timeline", generation, "id")
    timeline = (
        f"concat({_MULTI}, "
        f"CASE WHEN mode = 'replace' THEN {command(lit('DEL'), key)} ELSE '' END, "
        f"CASE WHEN {n_removes} > 0 THEN {array_command('ZREM', key, 'removes')} ELSE '' END, "
        f"CASE WHEN {n_entries} > 0 THEN {array_command('ZADD', key, 'entries', 2)} ELSE '' END, "
        f"{command(lit('ZREMRANGEBYRANK'), key, lit('0'), lit(str(-(cap + 1))))}, "
        f"{_EXEC})"
    )
    # MULTI's OK, one QUEUED per command (the trim, and a DEL, ZREM, ZADD when present), EXEC's reply.
    queued = (
        f"1 + CAST(mode = 'replace' AS int) + CAST({n_removes} > 0 AS int) + CAST({n_entries} > 0 AS int)"
    )
    tkey = view_key_column("tweet", generation, "id")
    tweet = f"CASE WHEN body IS NULL THEN {command(lit('DEL'), tkey)} ELSE {command(lit('SET'), tkey, 'body')} END"
    is_timeline = "kind = 'timeline'"
    return ops_df.selectExpr(
        f"CASE WHEN {is_timeline} THEN {timeline} ELSE {tweet} END AS payload",
        f"CASE WHEN {is_timeline} THEN {queued} + 2 ELSE 1 END AS replies",
        f"CAST({is_timeline} AS int) AS timelines",
        f"CASE WHEN {is_timeline} THEN {n_entries} ELSE 0 END AS entries",
    )


def _apply_partition(rows, url: str, counters) -> None:
    """Forward one partition's commands, about `_PIPELINE_BYTES` per round trip."""
    client = connect(url)
    chunk, size, replies, timelines, entries = [], 0, 0, 0, 0
    for payload, n, is_timeline, added in rows:
        data = payload.encode()
        chunk.append(data)
        size, replies = size + len(data), replies + n
        timelines, entries = timelines + is_timeline, entries + added
        if size >= _PIPELINE_BYTES:
            send_packed(client, b"".join(chunk), replies, what="timeline sink")
            chunk, size, replies = [], 0, 0
    if chunk:
        send_packed(client, b"".join(chunk), replies, what="timeline sink")
    if counters is not None:
        counters[0].add(timelines)
        counters[1].add(entries)


class TimelineSink:
    """Applies a micro-batch of timeline operations to generation `generation` from the executors."""

    def __init__(self, url: str, generation: int, cap: int):
        self.url, self.generation, self.cap = url, generation, cap

    def write(self, ops_df, batch_id: int) -> dict:
        """Apply `ops_df` (TIMELINE_OPS_SCHEMA); return {"timelines": ops applied, "entries": entries added}."""
        url = self.url
        sc = ops_df.sparkSession.sparkContext
        counters = (sc.accumulator(0), sc.accumulator(0))
        wire = _wire(ops_df, self.generation, self.cap)
        wire.foreachPartition(lambda rows: _apply_partition(rows, url, counters))
        return {"timelines": counters[0].value, "entries": counters[1].value}


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


def query_timeline(client, user_id: str, *, limit: int | None = None, job: str = "timeline") -> dict:
    """`{"user_id","generation","tweets":[{"tweet_id","user_id","text","ts"}, ...]}`, newest first."""
    generation = current_generation(client, job)
    ids: list[str] = []
    if limit is None or limit > 0:
        stop = -1 if limit is None else limit - 1
        ids = [i.decode() for i in client.zrevrange(timeline_key(generation, user_id), 0, stop)]
    return {"user_id": user_id, "generation": generation, "tweets": _hydrate(client, generation, ids)}


def export_timeline(client, *, job: str = "timeline"):
    """Every non-empty timeline as `{"user_id","tweet_ids":[newest first]}`, ordered by user_id."""
    generation = current_generation(client, job)
    keys = sorted(client.scan_iter(match=view_pattern("timeline", generation), count=1000), key=key_id)
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        pipe = client.pipeline(transaction=False)
        for k in chunk:
            pipe.zrevrange(k, 0, -1)
        for k, ids in zip(chunk, pipe.execute(), strict=True):
            yield {"user_id": key_id(k), "tweet_ids": [t.decode() for t in ids]}
