"""A list view's Redis operations and the sink that applies them (the layout: `views.list`).

Operations (`LIST_OPS_SCHEMA`), made by `views.list.join` and `views.list.rows`:
- `kind="list"`, `id=<key>`, `mode="add"`: ZREM the `removes`, ZADD the `entries`, then keep the first `cap`;
  `mode="replace"`: the entries are the key's whole new list (a refill after a removal);
- `kind="entry"`, `id=<entry>`: `body` is the entry's JSON to store, or null to delete it;
- `kind="heavy"`, `id=<match value>`: as a list, on the heavy value's entries; `mode="retire"`: let it expire;
- `kind="reads"`, `id=<key>`: `entries` are heavy values to add to the key's `.reads` set, `removes` to remove;
- `kind="window"`, `id=<key>`: the key's window (`views.list.rows`).
`removes` and `entries` are arrays of wire-protocol text made by `member(entry)` and `entry(order, entry)` in the
JVM; an added entry is made once per entry, before it is fanned out (a join evaluates `ENTRY_CARRY` per entry).
The sink builds each operation's Redis commands around them in Spark SQL, and the executors' Python only forwards the
text, about 1 MB per round trip: no Python code and no Lua script handles a single entry.

Operations may come in write phases (`Few(phases=3)`, or one DataFrame per phase), each applied after the previous
one (the phases of a fan-out limit: `views.list.join`). Every key is written whole in one script call
(`views.fence`'s gate, which also refuses the call when the writer's lease epoch is below the job's fence), so a
reader sees it before or after the batch; a read of a key's list and `.reads` set is one atomic script call (one
hash slot).

Every operation is idempotent on its key (ZADD of the same members, trim to the same cap, replace with the same
content, SET/DEL of the same body), so a micro-batch that Spark replays after a crash, fully or partly applied
before, leaves exactly the content of one application.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spec.model import View
from views.fence import GATE_LUA, UNFENCED, Fence
from views.keys import (
    ENTRY,
    HEAVY,
    READS,
    WINDOW,
)
from views.redis_io import Forwarder, is_cluster, sink_client
from views.wire import args, array_args, bulk, gated, hash_tag_column, lit, view_key_column

__all__ = [
    "LIST_OPS_SCHEMA",
    "ENTRY_CARRY",
    "RETIRE_SECONDS",
    "ListViewSink",
    "Few",
    "entry",
    "member",
    "body_sql",
    "as_ops",
]

LIST_OPS_SCHEMA = (
    "kind string, id string, mode string, removes array<string>, entries array<string>, body string"
)

# The heavy entries of a value that stopped being heavy expire this long after, rather than at once: a reader that
# read the key's `.reads` set just before can still read them.
RETIRE_SECONDS = 60
_PIPELINE_BYTES = 1 << 20  # send about this many bytes of commands per round trip


def member(entry_id: str) -> str:
    """A list member to remove, as ZREM arguments (SQL text of the string expression `entry_id`)."""
    return bulk(entry_id)


def entry(order: str, entry_id: str) -> str:
    """A list entry (score `order`, member `entry_id`), as ZADD arguments (SQL text; `order` a number)."""
    return f"concat({bulk(f'cast({order} AS string)')}, {bulk(entry_id)})"


ENTRY_CARRY = entry("_o", "_e")  # the join's `carry`: an entry's ZADD arguments, made once per entry


def body_sql(view: View) -> str:
    """SQL text: the JSON of `view`'s fields (in declared order; a null field is written as null)."""
    pairs = ", ".join(f"{lit(name)}, ({sql})" for name, sql in view.fields)
    return f"to_json(named_struct({pairs}), map('ignoreNullFields', 'false'))"


def as_ops(
    df: DataFrame, kind: str, ident: str, mode="NULL", removes="NULL", entries="NULL", body="NULL"
) -> DataFrame:
    """`df` as LIST_OPS_SCHEMA rows of `kind`, keyed by the SQL text `ident`; the rest are SQL texts."""
    return df.selectExpr(
        f"'{kind}' AS kind",
        f"CAST({ident} AS string) AS id",
        f"CAST({mode} AS string) AS mode",
        f"CAST({removes} AS array<string>) AS removes",
        f"CAST({entries} AS array<string>) AS entries",
        f"CAST({body} AS string) AS body",
    )


def _trim(cap: int, descending: bool) -> tuple[str, str]:
    """The command keeping a sorted set's first `cap` members in the list's order (`views.wire.args`)."""
    ranks = (lit("0"), lit(str(-(cap + 1)))) if descending else (lit(str(cap)), lit("-1"))
    return args(lit("ZREMRANGEBYRANK"), "k", *ranks)


def _wire(ops_df, view: str, generation: int, cap: int, descending: bool, cluster: bool, fence: Fence):
    """payload (the operation's commands, one fenced call: `views.fence`), replies (1), lists (1 for a list),
    entries (added), tag (the hash tag of the operation's keys on a Redis Cluster, else null), and last `_phase` when
    `ops_df` has it. One SQL text per column (see `views.wire`); the key and the array sizes are a projection of
    their own, computed once per row and referred to by name (written out in every command, they made a tree the
    optimizer and code generator took a few hundred ms to plan in every batch)."""
    phase = ["_phase"] if "_phase" in ops_df.columns else []  # kept last (`ListViewSink.write`, `Few`)
    keyed = ops_df.selectExpr(
        "kind",
        "mode",
        "removes",
        "entries",
        "body",
        f"CASE kind WHEN 'list' THEN {view_key_column(view, generation, 'id')} "
        f"WHEN 'heavy' THEN {view_key_column(f'{view}.{HEAVY}', generation, 'id')} "
        f"WHEN 'reads' THEN {view_key_column(f'{view}.{READS}', generation, 'id')} "
        f"WHEN 'window' THEN {view_key_column(f'{view}.{WINDOW}', generation, 'id')} "
        f"ELSE {view_key_column(f'{view}.{ENTRY}', generation, 'id')} END AS k",
        "coalesce(size(removes), 0) AS nr",
        "coalesce(size(entries), 0) AS ne",
        f"{hash_tag_column('id') if cluster else 'CAST(NULL AS string)'} AS tag",
        *phase,
    )
    zset = gated(
        fence,
        "k",
        ("mode = 'replace'", args(lit("DEL"), "k")),
        ("nr > 0", array_args("ZREM", "k", "removes")),
        ("ne > 0", array_args("ZADD", "k", "entries", 2)),
        (None, _trim(cap, descending)),
    )
    retire = gated(fence, "k", (None, args(lit("EXPIRE"), "k", lit(str(RETIRE_SECONDS)))))
    reads = gated(
        fence,
        "k",
        ("ne > 0", array_args("SADD", "k", "entries")),
        ("nr > 0", array_args("SREM", "k", "removes")),
    )
    body = gated(
        fence,
        "k",
        ("body IS NULL", args(lit("DEL"), "k")),
        ("body IS NOT NULL", args(lit("SET"), "k", "body")),
    )
    is_zset = "kind IN ('list', 'heavy') AND mode <> 'retire'"
    return keyed.selectExpr(
        f"CASE WHEN {is_zset} THEN {zset} WHEN kind = 'heavy' THEN {retire} "
        f"WHEN kind = 'reads' THEN {reads} ELSE {body} END AS payload",
        "1 AS replies",
        "CAST(kind = 'list' AS int) AS lists",
        "CASE WHEN kind = 'list' THEN ne ELSE 0 END AS entries",
        "tag",
        *phase,
    )


def _forward(rows, url: str) -> tuple[int, int]:
    """Forward wire rows' commands, about `_PIPELINE_BYTES` per round trip (per master on a cluster); (lists, entries)
    they wrote."""
    lists = entries = 0
    with Forwarder(sink_client(url), what="list sink", scripts=(GATE_LUA,), limit=_PIPELINE_BYTES) as out:
        for payload, n, is_list, added, tag in rows:
            out.add(payload.encode(), n, tag)
            lists, entries = lists + is_list, entries + added
    return lists, entries


def _apply_partition(rows, url: str, counters) -> None:
    lists, entries = _forward(rows, url)
    counters[0].add(lists)
    counters[1].add(entries)


class ListViewSink:
    """Applies a micro-batch of list operations of view `view` to generation `generation`: a write phase known to hold
    at most `DRIVER_ROWS` operations from the driver (one Spark job that collects it: no Python task), any other
    from the executors."""

    DRIVER_ROWS = 10_000

    def __init__(
        self,
        url: str,
        view: str,
        generation: int,
        cap: int,
        *,
        descending: bool = True,
        fence: Fence = UNFENCED,
    ):
        self.url, self.view, self.generation, self.cap = url, view, generation, cap
        self.descending, self.fence = descending, fence

    def _wire(self, ops_df: DataFrame):
        cluster = is_cluster(self.url)
        return _wire(ops_df, self.view, self.generation, self.cap, self.descending, cluster, self.fence)

    def write(self, ops, batch_id: int) -> dict:
        """Apply `ops` (LIST_OPS_SCHEMA): a write phase, or a list of them applied one after the other. A phase is a
        DataFrame (applied from the executors) or a (DataFrame, size) pair, as `ListView.phases` makes them: size a
        bound on its operations (at most `DRIVER_ROWS`: collected in one Spark job and applied from the driver), None
        (unknown: from the executors), or `Few` (expected few, number unknown: its first `DRIVER_ROWS` + 1
        operations are collected in one Spark job and applied from the driver when that is all of them, else it is
        applied from the executors, computed again). Returns {"lists": list operations applied, "entries": entries
        added to lists}."""
        written = [0, 0]
        for phase in [ops] if isinstance(ops, (DataFrame, tuple)) else ops:
            ops_df, size = phase if isinstance(phase, tuple) else (phase, None)
            done = self._few(ops_df, size) if isinstance(size, Few) else self._phase(ops_df, size)
            written = [written[0] + done[0], written[1] + done[1]]
        return {"lists": written[0], "entries": written[1]}

    def _phase(self, ops_df: DataFrame, at_most: int | None) -> tuple[int, int]:
        wire, url = self._wire(ops_df), self.url
        if at_most is not None and at_most <= self.DRIVER_ROWS:
            return _forward(wire.collect(), url)
        sc = ops_df.sparkSession.sparkContext
        counters = (sc.accumulator(0), sc.accumulator(0))
        wire.foreachPartition(lambda rows, c=counters: _apply_partition(rows, url, c))
        return counters[0].value, counters[1].value

    def _few(self, ops_df: DataFrame, few: Few) -> tuple[int, int]:
        rows = _few(self._wire(ops_df), self.DRIVER_ROWS + 1)
        phases = range(few.phases)
        many = len(rows) > self.DRIVER_ROWS
        if few.phases == 1:
            return self._phase(ops_df, None) if many else _forward(rows, self.url)
        written = [0, 0]
        for i in phases:
            if many:
                done = self._phase(ops_df.where(F.col("_phase") == i).drop("_phase"), None)
            else:
                done = _forward([r[:-1] for r in rows if r[-1] == i], self.url)
            written = [written[0] + done[0], written[1] + done[1]]
        return written[0], written[1]


@dataclass(frozen=True)
class Few:
    """The size of a write phase expected to hold few operations, their number unknown (`ListViewSink.write`).
    phases: when above 1, the operations carry their write phase (`_phase`, 0 to phases - 1), applied in that order,
    one after the other."""

    phases: int = 1


def _few(wire: DataFrame, n: int) -> list:
    """The first `n` rows of `wire` (one Spark job), planned without whole-stage code generation: Spark names a
    limit's counter in the generated code from a process-wide sequence, so a stage holding a limit is compiled anew
    in every batch, where each operator's own code (a few rows go through it) is compiled once and cached."""
    conf = wire.sparkSession.conf
    whole_stage = conf.get("spark.sql.codegen.wholeStage")
    conf.set("spark.sql.codegen.wholeStage", "false")
    try:
        return wire.limit(n).collect()
    finally:
        conf.set("spark.sql.codegen.wholeStage", whole_stage)


# --- the read side ---
