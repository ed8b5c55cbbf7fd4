"""The `timeline` view in Redis: the sink that applies timeline changes, and the read side.

Sink input (one DataFrame per micro-batch, `TIMELINE_OPS_SCHEMA`):
- `kind="timeline"`, `id=follower`, `mode="add"`: ZREM the `removes`, ZADD the entries (`scores[i]`, `members[i]`),
  then keep the newest `cap`; `mode="replace"`: the entries are the follower's whole new timeline (a refill after
  a removal).
- `kind="tweet"`, `id=tweet_id`: `body` is the tweet's JSON to store, or null to delete it.
`removes` (tweet ids), `scores` (ts) and `members` (tweet ids) are lists joined by the ASCII unit separator, built
in the JVM; they reach the Lua script as they are and are split there, so Python handles one row per timeline,
not per entry.

Every operation is idempotent on its key (ZADD of the same members, trim to the same cap, replace with the same
content, SET/DEL of the same body) and each timeline key is changed in one Lua call, so a micro-batch that Spark
replays after a crash, fully or partly applied before, leaves exactly the content of one application.
"""

from __future__ import annotations

import orjson

from views.keys import key_id, timeline_key, tweet_key, view_pattern
from views.redis_io import connect, current_generation

__all__ = ["TIMELINE_OPS_SCHEMA", "SEP", "TimelineSink", "query_timeline", "export_timeline"]

SEP = "\x1f"
TIMELINE_OPS_SCHEMA = (
    "kind string, id string, mode string, removes string, scores string, members string, body string"
)

_APPLY_LUA = """
local key = KEYS[1]
local cap = tonumber(ARGV[1])
if ARGV[2] == 'replace' then redis.call('DEL', key) end
-- Apply `cmd` to the tokens of `first` (interleaved with those of `second`, when given) in chunks.
local function each(cmd, first, second)
  local other = second and string.gmatch(second, '[^\\31]+')
  local buf, n = {}, 0
  for x in string.gmatch(first, '[^\\31]+') do
    n = n + 1
    buf[n] = x
    if other then
      n = n + 1
      buf[n] = other()
    end
    if n >= 2000 then
      redis.call(cmd, key, unpack(buf, 1, n))
      n = 0
    end
  end
  if n > 0 then redis.call(cmd, key, unpack(buf, 1, n)) end
end
if ARGV[3] ~= '' then each('ZREM', ARGV[3]) end
if ARGV[4] ~= '' then each('ZADD', ARGV[4], ARGV[5]) end
redis.call('ZREMRANGEBYRANK', key, 0, -(cap + 1))
return 1
"""

_PIPELINE_BYTES = 1 << 20  # flush the pipeline after about this many bytes of arguments


def _apply_partition(rows, url: str, generation: int, cap: int, counters) -> None:
    """Apply one partition's operations, pipelined. The `removes`/`scores`/`members` strings go to Lua as they
    are and are split there (Python splitting and packing every entry cost about 3x Redis's own time, measured)."""
    client = connect(url)
    sha = client.script_load(_APPLY_LUA)
    pipe = client.pipeline(transaction=False)
    pending = ops = entries_added = 0
    for kind, ident, mode, removes, scores, members, body in rows:
        if kind == "timeline":
            removes, scores, members = removes or "", scores or "", members or ""
            pipe.evalsha(sha, 1, timeline_key(generation, ident), cap, mode, removes, scores, members)
            pending += len(removes) + len(scores) + len(members) + 64
            ops += 1
            entries_added += scores.count(SEP) + 1 if scores else 0
        elif body is None:
            pipe.delete(tweet_key(generation, ident))
            pending += 64
        else:
            pipe.set(tweet_key(generation, ident), body)
            pending += len(body) + 64
        if pending >= _PIPELINE_BYTES:
            pipe.execute()
            pending = 0
    pipe.execute()
    if counters is not None:
        counters[0].add(ops)
        counters[1].add(entries_added)


class TimelineSink:
    """Applies a micro-batch of timeline operations to generation `generation` from the executors."""

    def __init__(self, url: str, generation: int, cap: int):
        self.url, self.generation, self.cap = url, generation, cap

    def write(self, ops_df, batch_id: int) -> dict:
        """Apply `ops_df` (TIMELINE_OPS_SCHEMA); return {"timelines": ops applied, "entries": entries added}."""
        url, generation, cap = self.url, self.generation, self.cap
        sc = ops_df.sparkSession.sparkContext
        counters = (sc.accumulator(0), sc.accumulator(0))
        ops_df.foreachPartition(lambda rows: _apply_partition(rows, url, generation, cap, counters))
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
