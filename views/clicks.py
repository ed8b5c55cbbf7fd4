"""The `search_clicks` and `ctr` views in Redis: the sink that applies one step of the clicks job, and the read side.

Keys (generation `g` of job `clicks`; the id is the hash tag):
| key | type | content |
|---|---|---|
| `mv:search_clicks:<g>:{<search_id>}` | hash | `v`: the export line (JSON), `final`: "1" once the window closed, `f`: fence |
| `mv:ctr:<g>:{<query>}` | hash | `searches`, `clicked`: counts of closed searches, `f`: fence of the last step applied |

Sink input (`CLICKS_OPS_SCHEMA`, one DataFrame per step of the job, built in the JVM):
- `kind="search"`, `key`=search_id, `body`=export line, `final`: the search's current record. Written when the
  search got its first/new clicks (provisional `clicked: true`) and once when its window closes (final).
- `kind="ctr"`, `key`=query, `d_searches`, `d_clicked`: the searches of that query closed in this step.

Exactly-once effect. Every step has a *fence*, a number that grows with every step (batch id x 10^6, plus an
idle tick number). A record is overwritten only by a step whose fence is >= the stored one (a replay writes
the same content; an older replay cannot undo a newer outcome). A ctr key applies its deltas only if its stored
fence is < the step's fence, in the same Lua call, so a replayed step counts nothing twice. Each key is changed
by one Lua call touching only that key (Redis Cluster safe); calls are pipelined from the executors.
"""

from __future__ import annotations

import orjson

from views.keys import key_id, view_key, view_pattern
from views.redis_io import connect, current_generation

__all__ = [
    "CLICKS_OPS_SCHEMA",
    "ClicksSink",
    "search_clicks_key",
    "ctr_key",
    "query_search_clicks",
    "query_ctr",
    "export_search_clicks",
    "export_ctr",
]

CLICKS_OPS_SCHEMA = "kind string, key string, body string, final boolean, d_searches bigint, d_clicked bigint"

_SEARCH_LUA = """
local f = redis.call('HGET', KEYS[1], 'f')
if f and tonumber(f) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'final', ARGV[3], 'f', ARGV[1])
return 1
"""

_CTR_LUA = """
local f = redis.call('HGET', KEYS[1], 'f')
if f and tonumber(f) >= tonumber(ARGV[1]) then return 0 end
redis.call('HINCRBY', KEYS[1], 'searches', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'clicked', ARGV[3])
redis.call('HSET', KEYS[1], 'f', ARGV[1])
return 1
"""

_BATCH = 1000  # Lua calls per pipeline round trip


def search_clicks_key(generation: int, search_id: str) -> str:
    return view_key("search_clicks", generation, search_id)


def ctr_key(generation: int, query: str) -> str:
    return view_key("ctr", generation, query)


def _apply_partition(rows, url: str, generation: int, fence: int) -> None:
    client = connect(url)
    s_sha, c_sha = client.script_load(_SEARCH_LUA), client.script_load(_CTR_LUA)
    pipe = client.pipeline(transaction=False)
    pending = 0
    for kind, key, body, final, d_searches, d_clicked in rows:
        if kind == "search":
            pipe.evalsha(s_sha, 1, search_clicks_key(generation, key), fence, body, 1 if final else 0)
        else:
            pipe.evalsha(c_sha, 1, ctr_key(generation, key), fence, d_searches, d_clicked)
        pending += 1
        if pending >= _BATCH:
            pipe.execute()
            pending = 0
    if pending:
        pipe.execute()


class ClicksSink:
    """Applies one step's operations (`CLICKS_OPS_SCHEMA`) to generation `generation`, from the executors."""

    def __init__(self, url: str, generation: int):
        self.url, self.generation = url, generation

    def write(self, ops_df, fence: int) -> None:
        url, generation = self.url, self.generation
        ops_df.foreachPartition(lambda rows: _apply_partition(rows, url, generation, fence))


def query_search_clicks(client, search_id: str, *, job: str = "clicks") -> dict:
    """The search's export line plus `final` and `generation`; `{}` if it is not published (yet)."""
    generation = current_generation(client, job)
    v, final = client.hmget(search_clicks_key(generation, search_id), "v", "final")
    if v is None:
        return {}
    return {**orjson.loads(v), "final": final == b"1", "generation": generation}


def query_ctr(client, query: str, *, job: str = "clicks") -> dict:
    """`{"query","searches","clicked"}` over the searches of `query` whose window has closed; `{}` if none."""
    generation = current_generation(client, job)
    searches, clicked = client.hmget(ctr_key(generation, query), "searches", "clicked")
    if searches is None:
        return {}
    return {"query": query, "searches": int(searches), "clicked": int(clicked or 0)}


def _scan(client, view: str, generation: int, fields: tuple[str, ...]):
    keys = sorted(client.scan_iter(match=view_pattern(view, generation), count=1000), key=key_id)
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        pipe = client.pipeline(transaction=False)
        for k in chunk:
            pipe.hmget(k, *fields)
        yield from zip(chunk, pipe.execute(), strict=True)


def export_search_clicks(client, *, job: str = "clicks"):
    """Every published search as `{"search_id","session_id","query","ts","clicked","clicks"}`, by search_id."""
    for _k, (v,) in _scan(client, "search_clicks", current_generation(client, job), ("v",)):
        if v is not None:
            yield orjson.loads(v)


def export_ctr(client, *, job: str = "clicks"):
    """Every query with a closed search as `{"query","searches","clicked"}`, by query."""
    for k, (searches, clicked) in _scan(
        client, "ctr", current_generation(client, job), ("searches", "clicked")
    ):
        if searches is not None:
            yield {"query": key_id(k), "searches": int(searches), "clicked": int(clicked or 0)}
