"""The `count` view kind: per key, the sums of the view's `values` over its rows.

Redis (generation `g` of the view's job): hash `mv:<view>:<g>:{<key>}` with one field per value name (its sum),
`_f` (the fence of the last step applied to the key) and `_t` (the values' types, one letter each in declared
order: `i` an integer sum, `f` a floating-point one, so a reader without Spark prints each as it was computed).

Changes (`count_changes`, from a job's rows, `views.frame`): `key string`, then each value's delta (`bigint`,
or `double` for a value that is not an integer or a boolean; a boolean counts 1 when true); signed under a join
(a removed row subtracts). Applied by one Lua call per key (`COUNT_LUA`) that adds them only if the key's `_f`
is below the step's fence and records the fence in the same call (and refuses the call, like every view write,
when the writer's lease epoch is below the job's fence, `views.fence`), so a step replayed after a crash adds nothing
twice. A key whose sums are all 0 is absent for readers: its value fields are deleted, but its `_f` stays (a
replay of the step that zeroed it must still see the fence; deleting the whole key would let it add again).
`CountSink.write` sends the calls from the executors (one Spark job) or, for a step's few keys already collected on
the driver (`CountRows`), from the driver (no Spark job).

Which rows a job counts: an interval job a left event once, when its window closes (with `unmatched: false` only
if it matched); an asof job each emitted event once; a join job adds the values of added rows and subtracts those
of removed ones.

Read: `query_count` gives `{"<key name>": key, <value>: n, ..., "generation": g}`, `{}` when the key is absent;
`export_counts` every present key's line (without `generation`), by key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegralType

from changelog.current import quoted
from spec.model import Pipeline, View
from spec.problems import Expr
from spec.viewfile import ViewCheck, ViewFile, WindowedKeys
from spec.viewtable import entry_fields, expr_type
from views.fence import UNFENCED, Fence
from views.frame import select_view
from views.keys import key_id, view_key, view_pattern
from views.redis_io import Forwarder, current_generation, is_cluster, pack, sink_client
from views.wire import command, forward, hash_tag_column, lit, payload_rows, view_key_column

__all__ = [
    "FILE",
    "COUNT_LUA",
    "count_changes",
    "count_delta",
    "value_types",
    "CountRows",
    "CountSink",
    "query_count",
    "export_counts",
]


class CountKeys(WindowedKeys):
    """A count view in the file: `count: {<key name>: <expression>}` and the sums it keeps, `values`."""

    count: dict[str, Expr]
    values: dict[str, Expr] = {}


def _read(keys: CountKeys, check: ViewCheck) -> dict:
    if not keys.values:
        check.add(("values",), "a count view needs `values`: the sums it keeps, e.g. `{orders: 1}`")
    return {"key": check.one_key(keys.count, "count"), "values": check.named(keys.values, ("values",))}


def _topic(view: View, seen) -> list:
    """A sum of longs (or of booleans, each 1 or 0) is a long, of doubles a double."""
    types = [(n, expr_type(e, seen)) for n, e in view.values]
    return entry_fields(
        view, [(n, "long" if t == "boolean" else t if t in ("long", "double") else None) for n, t in types]
    )


FILE = ViewFile("count", CountKeys, _read, topic=_topic)


# KEYS[1] = the job's fence (`views.fence`), KEYS[2] = the key; ARGV[1] = the writer's lease epoch, ARGV[2] = the
# step's fence, ARGV[3] = the values' types (`i`/`f` each), ARGV[4..] = name, delta
COUNT_LUA = """
local e = redis.call('GET', KEYS[1])
if e and tonumber(e) > tonumber(ARGV[1]) then
  return redis.error_reply('FENCED: epoch ' .. ARGV[1] .. ' is below the fence ' .. e .. ' of ' .. KEYS[1])
end
local f = redis.call('HGET', KEYS[2], '_f')
if f and tonumber(f) >= tonumber(ARGV[2]) then return 0 end
local zero = true
for i = 4, #ARGV, 2 do
  local kind = string.sub(ARGV[3], (i - 2) / 2, (i - 2) / 2)
  local v
  if kind == 'f' then
    v = redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], ARGV[i + 1])
  else
    v = redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
  end
  if tonumber(v) ~= 0 then zero = false end
end
if zero then
  for i = 4, #ARGV, 2 do redis.call('HDEL', KEYS[2], ARGV[i]) end
end
redis.call('HSET', KEYS[2], '_f', ARGV[2], '_t', ARGV[3])
return 1
"""
_SHA = hashlib.sha1(COUNT_LUA.encode()).hexdigest()
_SCAN = 500  # keys per pipelined round trip of an export


def count_changes(
    frame: DataFrame, view: View, pipeline: Pipeline, *, counted: str = "true", sign: str | None = None
) -> DataFrame:
    """The changes of count view `view` from `frame` (`views.frame.view_rows`): per key, the sums of the values
    over the rows that are `counted` (SQL over the frame) and satisfy the view's `where`, each row's values times
    `sign` (SQL, e.g. -1 for a removed row; None: +1). Rows with a null key count nowhere."""
    under = [c for c in frame.columns if c.startswith("_")]
    sel = select_view(frame, view, pipeline, parts=("key", "where", "values"), keep=under)
    rows = sel.where(f"_where AND _key IS NOT NULL AND coalesce((\n{counted}\n), false)")
    aggs = []
    for name, _ in view.values:
        kind = sel.schema[name].dataType
        t = "bigint" if isinstance(kind, (IntegralType, BooleanType)) else "double"
        value = f"CAST({quoted(name)} AS {t})" + (f" * CAST(({sign}) AS {t})" if sign else "")
        aggs.append(F.coalesce(F.sum(F.expr(value)), F.lit(0).cast(t)).alias(name))
    return rows.groupBy(F.col("_key").alias("key")).agg(*aggs)


def count_delta(rows: DataFrame, view: View, pipeline: Pipeline) -> DataFrame:
    """The changes of count view `view` from a batch's row changes (`views.frame`: each row's values times its
    `_sign`), without the keys whose sums did not move."""
    sums = count_changes(rows, view, pipeline, sign="_sign")
    return sums.where(" OR ".join(f"{quoted(n)} <> 0" for n, _ in view.values))


def value_types(changes: DataFrame, view: View) -> str:
    """The values' type letters of `changes` (`count_changes`), in declared order: `i` integer, `f` double."""
    return "".join(
        "i" if isinstance(changes.schema[n].dataType, IntegralType) else "f" for n, _ in view.values
    )


@dataclass(frozen=True)
class CountRows:
    """A step's count changes already collected on the driver: `(key, value, ...)` tuples, values in declared order,
    `types` their letters (`value_types`)."""

    rows: list
    types: str

    def __bool__(self) -> bool:
        return bool(self.rows)


class CountSink:
    """Applies a count view's changes (`count_changes`) to generation `generation` of view `view` in the Redis at
    `url`, fenced per step by the batch id (see the module docstring) and by the writer's lease epoch `fence`
    (`views.fence`: a call carrying an epoch below the job's fence is refused whole). A `views.sink.CommandSink`."""

    def __init__(self, url: str, view: View, generation: int, fence: Fence = UNFENCED):
        self.url, self.view, self.generation, self.fence = url, view, generation, fence

    def commands(self, changes: DataFrame, batch_id: int) -> DataFrame:
        """One fenced Lua call per key (`cmd`, `tag`: `views.wire.payload_rows`' input), the key's step fence
        `batch_id`. The fences and the types are string literals (not compiled into generated code: the next step
        reuses the code)."""
        args = [lit(str(self.fence.epoch)), lit(str(int(batch_id))), lit(value_types(changes, self.view))]
        for name, _ in self.view.values:
            args += [lit(name), f"CAST({quoted(name)} AS string)"]
        key = view_key_column(self.view.name, self.generation, "key")
        cmd = command(lit("EVALSHA"), lit(_SHA), lit("2"), lit(self.fence.key), key, *args)
        return changes.select(F.expr(cmd).alias("cmd"), F.expr(hash_tag_column("key")).alias("tag"))

    def write(self, changes: DataFrame | CountRows, batch_id: int) -> dict:
        """Apply `changes`: a DataFrame from the executors (one Spark job; returns {}), or `CountRows` already
        collected on the driver from this process, pipelined (returns {"keys": the keys changed, 0 for a step
        already applied})."""
        if isinstance(changes, DataFrame):
            rows = payload_rows(self.commands(changes, batch_id), cluster=is_cluster(self.url))
            forward(rows, self.url, what=f"{self.view.name} sink", scripts=(COUNT_LUA,))
            return {}
        names = [n for n, _ in self.view.values]
        what = f"{self.view.name} sink"
        with Forwarder(sink_client(self.url), what=what, scripts=(COUNT_LUA,)) as out:
            for key, *values in changes.rows:
                k = view_key(self.view.name, self.generation, key)
                pairs = [x for n, v in zip(names, values, strict=True) for x in (n, repr(v))]
                call = pack(
                    "EVALSHA",
                    _SHA,
                    2,
                    self.fence.key,
                    k,
                    self.fence.epoch,
                    int(batch_id),
                    changes.types,
                    *pairs,
                )
                out.add(call, 1, k)
        return {"keys": out.ints}


def _line(view: View, key: str, values: list, types: str) -> dict | None:
    """A key's export line from its value fields (bytes or None) and type letters; None when absent."""
    if all(v is None for v in values):
        return None
    out = {view.key_name: key}
    for (name, _), v, t in zip(view.values, values, types.ljust(len(values), "i"), strict=True):
        out[name] = (float(v) if t == "f" else int(v)) if v is not None else 0
    return out


def query_count(client, view: View, key: str) -> dict:
    """`{"<key name>": key, <value>: n, ..., "generation": g}`; `{}` when the key is absent (all sums 0)."""
    generation = current_generation(client, view.job)
    got = client.hmget(view_key(view.name, generation, key), *[n for n, _ in view.values], "_t")
    line = _line(view, key, got[:-1], (got[-1] or b"").decode())
    return {} if line is None else {**line, "generation": generation}


def export_counts(client, view: View) -> Iterator[dict]:
    """Every present key's line, ordered by key."""
    generation = current_generation(client, view.job)
    names = [n for n, _ in view.values]
    keys = sorted(client.scan_iter(match=view_pattern(view.name, generation), count=1000), key=key_id)
    for i in range(0, len(keys), _SCAN):
        chunk = keys[i : i + _SCAN]
        pipe = client.pipeline(transaction=False)
        for k in chunk:
            pipe.hmget(k, *names, "_t")
        for k, got in zip(chunk, pipe.execute(), strict=True):
            line = _line(view, key_id(k), got[:-1], (got[-1] or b"").decode())
            if line is not None:
                yield line
