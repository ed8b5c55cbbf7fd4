"""The `search_clicks` and `ctr` views in Redis: the sink that applies one step of the clicks job, and the read side.

Keys (generation `g` of job `clicks`; the id is the hash tag):
| key | type | content |
|---|---|---|
| `mv:search_clicks:<g>:{<search_id>}` | hash | `v`: the export line (JSON), `final`: "1" once the window closed, `f`: fence |
| `mv:ctr:<g>:{<query>}` | hash | `searches`, `clicked`: counts of closed searches, `f`: fence of the last step applied |

Sink input (`CLICKS_OPS_SCHEMA`, one DataFrame per step of the job, made from the join's output by
`clicks_ops`):
- `kind="search"`, `key`=search_id, `body`=export line, `final`: the search's current record. Written when the
  search got its first/new clicks (provisional `clicked: true`) and once when its window closes (final).
- `kind="ctr"`, `key`=query, `d_searches`, `d_clicked`: the searches of that query closed in this step.

Exactly-once effect. Every step has a *fence*, a number that grows with every step (batch id x 10^6, plus an
idle tick number). A record is overwritten only by a step whose fence is >= the stored one (a replay writes
the same content; an older replay cannot undo a newer outcome). A ctr key applies its deltas only if its stored
fence is < the step's fence, in the same Lua call, so a replayed step counts nothing twice. Each key is changed
by one Lua call touching only that key (Redis Cluster safe). The calls are built in Spark SQL as wire-protocol
text, 1,000 per row (one per row on a Redis Cluster, with the key's hash tag, to route it to its master), and
sent from the executors, about 1 MB per round trip (`views.redis_io.Forwarder`).
"""

from __future__ import annotations

import hashlib

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from joins.interval import MATCHES
from views.keys import key_id, view_key, view_pattern
from views.redis_io import Forwarder, current_generation, is_cluster, sink_client
from views.wire import command, hash_tag_column, lit, view_key_column

__all__ = [
    "CLICKS_OPS_SCHEMA",
    "clicks_ops",
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

_CHUNK = 1000  # Lua calls per round trip
_SHA = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in (("s", _SEARCH_LUA), ("c", _CTR_LUA))}


def search_clicks_key(generation: int, search_id: str) -> str:
    return view_key("search_clicks", generation, search_id)


def ctr_key(generation: int, query: str) -> str:
    return view_key("ctr", generation, query)


def clicks_ops(left: DataFrame) -> DataFrame:
    """The sink's operations (`CLICKS_OPS_SCHEMA`) of one step, from the join's left side after it
    (`joins.interval.IntervalJoinResult.left`: searches with `_matches`, `_changed`, `_closed`): a `search`
    record for every search that got new clicks or closed (`final` once closed), and a `ctr` delta per query of
    the searches closed in the step."""
    body = F.to_json(
        F.struct(
            "search_id",
            "session_id",
            "query",
            "ts",
            (F.col(MATCHES) > 0).alias("clicked"),
            F.col(MATCHES).alias("clicks"),
        )
    )
    null_l = F.lit(None).cast("bigint")
    records = left.where(F.col("_changed") | F.col("_closed")).select(
        F.lit("search").alias("kind"),
        F.col("search_id").alias("key"),
        body.alias("body"),
        F.col("_closed").alias("final"),
        null_l.alias("d_searches"),
        null_l.alias("d_clicked"),
    )
    ctr = (
        left.where(F.col("_closed"))
        .groupBy("query")
        .agg(F.count("*").alias("d_searches"), F.sum((F.col(MATCHES) > 0).cast("bigint")).alias("d_clicked"))
        .select(
            F.lit("ctr").alias("kind"),
            F.col("query").alias("key"),
            F.lit(None).cast("string").alias("body"),
            F.lit(None).cast("boolean").alias("final"),
            "d_searches",
            "d_clicked",
        )
    )
    return records.unionByName(ctr).select(*[c.split()[0] for c in CLICKS_OPS_SCHEMA.split(", ")])


def _chunks(ops_df, generation: int, fence: int, cluster: bool):
    """The step's Lua calls as wire-protocol text (`payload`, `n` calls, `tag`): `_CHUNK` consecutive calls of a
    partition concatenated into one row, or on a Redis Cluster one call per row with its key's hash tag. Python
    only forwards these strings, it never builds a single operation. The fence is a string literal (not written
    into generated code, so the next step reuses the compiled code)."""
    f = lit(str(int(fence)))

    def evalsha(script: str, view: str, *args: str) -> str:
        return command(
            lit("EVALSHA"), lit(_SHA[script]), lit("1"), view_key_column(view, generation, "key"), f, *args
        )

    search = evalsha("s", "search_clicks", "body", "CASE WHEN final THEN '1' ELSE '0' END")
    ctr = evalsha("c", "ctr", "CAST(d_searches AS string)", "CAST(d_clicked AS string)")
    cmd = F.expr(f"CASE WHEN kind = 'search' THEN {search} ELSE {ctr} END")
    if cluster:
        return ops_df.select(
            cmd.alias("payload"), F.lit(1).alias("n"), F.expr(hash_tag_column("key")).alias("tag")
        )
    return (
        ops_df.select(cmd.alias("c"), F.floor(F.monotonically_increasing_id() / _CHUNK).alias("chunk"))
        .groupBy("chunk")
        .agg(F.concat_ws("", F.collect_list("c")).alias("payload"), F.count("*").alias("n"))
        .select("payload", "n", F.lit(None).cast("string").alias("tag"))
    )


def _apply_partition(rows, url: str) -> None:
    with Forwarder(sink_client(url), what="clicks sink", scripts=(_SEARCH_LUA, _CTR_LUA)) as out:
        for payload, n, tag in rows:
            out.add(payload.encode(), n, tag)


class ClicksSink:
    """Applies one step's operations (`CLICKS_OPS_SCHEMA`) to generation `generation`, from the executors.
    A `views.sink.Sink` whose batch id is the step's fence (see the module docstring)."""

    def __init__(self, url: str, generation: int):
        self.url, self.generation = url, generation

    def write(self, ops_df: DataFrame, fence: int) -> dict:
        """Apply the step `fence` (idempotent per fence; an older fence never undoes a newer outcome). Returns {}:
        the job counts the step's outcomes from the join, not from the sink."""
        url = self.url
        calls = _chunks(ops_df, self.generation, fence, is_cluster(url))
        calls.foreachPartition(lambda rows: _apply_partition(rows, url))
        return {}


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
