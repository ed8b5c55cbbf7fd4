"""The `list` view kind in Redis: per list key, the first `cap` entries in the view's order; its operations made
from a `join` job's changes, the sink that applies them, and the read side. (The built-in `timeline` view is one:
per follower, the newest 800 tweets of the users they follow.)

Redis (`<v>`: the view's name, `<g>`: the job's generation):
- `mv:<v>:<g>:{<key>}`: sorted set, member the entry id, score the order value (ties by the entry, in the same
  direction: `ZREVRANGE` reads a descending list, `ZRANGE` an ascending one); the first `cap`;
- `mv:<v>.entry:<g>:{<entry>}`: JSON of the view's `fields` of the entry, in declared order, kept once per entry;
- with a fan-out limit: `mv:<v>.heavy:<g>:{<match value>}`, a heavy match value's first `cap` entries (sorted set),
  and `mv:<v>.reads:<g>:{<key>}`, the heavy values a list key reads (set); readers merge them (`read_list`).
The generation's meta hash (`mv:meta:<job>:<g>`) keeps the `<view>.cap` and `fanout_limit` it was built with.

`ListView(join, view)` chooses, from the view's declaration, which of the join's list algorithms (`joins.table_list`)
maintains the list (`views.list_join`: the list shape's own algorithm, or the join's delta for any other shape) and
turns one micro-batch's changes into operations (`LIST_OPS_SCHEMA`):
- `kind="list"`, `id=<key>`, `mode="add"`: ZREM the `removes`, ZADD the `entries`, then keep the first `cap`;
  `mode="replace"`: the entries are the key's whole new list (a refill after a removal);
- `kind="entry"`, `id=<entry>`: `body` is the entry's JSON to store, or null to delete it;
- `kind="heavy"`, `id=<match value>`: as a list, on the heavy value's entries; `mode="retire"`: let it expire;
- `kind="reads"`, `id=<key>`: `entries` are heavy values to add to the key's `.reads` set, `removes` to remove.
`removes` and `entries` are arrays of wire-protocol text made by `member(entry)` and `entry(order, entry)` in the
JVM; an added entry is made once per entry, before it is fanned out (the join evaluates `ENTRY_CARRY` per entry).
The sink builds each operation's Redis commands around them in Spark SQL, and the executors' Python only forwards the
text, about 1 MB per round trip: no Python code and no Lua script handles a single entry.

With a fan-out limit the operations come in three write phases, each applied after the previous one, so that a
reader between phases never misses or doubles an entry of a value that crossed the limit (a reader drops
duplicates by entry id):
1. new entry bodies; heavy entries added to or replaced (a value that became heavy first of all); heavy values added
   to keys' `.reads` sets;
2. the lists (a value that became heavy leaves them here, one that stopped being heavy enters them);
3. bodies of entries that stopped being live; heavy values removed from `.reads` sets; the heavy entries of values
   that stopped being heavy expire `RETIRE_SECONDS` later (a reader that read a `.reads` set just before may still
   read them).
In a batch of entries only, phase 1's bodies and heavy adds (`ListView.posts_ops`) are applied before the batch's
changes are counted, and phase 1 keeps the rest. Every key is written whole in one script call (`views.fence`'s
gate, which also refuses the call when the writer's lease epoch is below the job's fence), so a reader sees it
before or after the batch; a read of a key's list and `.reads` set is one atomic script call (one hash slot).

Every operation is idempotent on its key (ZADD of the same members, trim to the same cap, replace with the same
content, SET/DEL of the same body), so a micro-batch that Spark replays after a crash, fully or partly applied
before, leaves exactly the content of one application.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from redis.cluster import RedisCluster
from redis.commands.core import Script

from joins.table import JoinChanges, TableJoin
from joins.table_list import GenericChanges, ListChanges, ListPosts, generic_list
from spec.model import Pipeline, View
from spec.problems import Expr
from spec.viewfile import ViewCheck, ViewFile, WindowedKeys
from views.errors import ViewError
from views.fence import GATE_LUA, UNFENCED, Fence
from views.keys import (
    ENTRY,
    HEAVY,
    READS,
    WINDOW,
    entry_key,
    heavy_key,
    key_id,
    list_key,
    meta_key,
    reads_key,
    view_pattern,
    window_key,
)
from views.list_join import generic_spec, list_shape
from views.redis_io import Forwarder, current_generation, is_cluster, sink_client
from views.wire import args, array_args, bulk, gated, hash_tag_column, lit, view_key_column

__all__ = [
    "FILE",
    "LIST_OPS_SCHEMA",
    "ENTRY_CARRY",
    "RETIRE_SECONDS",
    "ListView",
    "ListViewSink",
    "Few",
    "join_lists",
    "list_caps",
    "entry",
    "member",
    "body_sql",
    "read_list",
    "query_list",
    "export_list",
    "item_entry_name",
]

_ORDER = re.compile(r"^(.*?)(?:\s+(asc|desc))?$", re.IGNORECASE | re.DOTALL)


class ListKeys(WindowedKeys):
    """A list view in the file: `list: {<key name>: <expression>}`, each entry's id (`entry`) and `fields`, the
    `order` of its entries and how many it keeps (`cap`), the export's and the query's names of its entries
    (`entries`, `items`), and a join's `fanout_limit`."""

    list: dict[str, Expr]
    entry: Expr | None = None
    order: builtins.list[str] | str | None = None
    cap: int | None = None
    entries: str | None = None
    items: str | None = None
    fanout_limit: int | None = None
    fields: dict[str, Expr] = {}


def _read(keys: ListKeys, check: ViewCheck) -> dict:
    if keys.fanout_limit is not None and check.job_kind not in ("join", None):
        check.add(
            ("fanout_limit",),
            "`fanout_limit` is for a list view of a join job (a heavy match value's entries are merged at read "
            f"time); a {check.job_kind} job's list has none: remove it",
        )
    key = check.one_key(keys.list, "list")
    fields = check.named(keys.fields, ("fields",))
    entry = None
    if keys.entry is None:
        check.add(("entry",), "a list view needs `entry`: the expression of an entry's id")
    else:
        entry = check.expr(keys.entry, ("entry",))
    order = _order(keys, entry, check)
    if keys.cap is None or keys.cap < 1:
        check.add(("cap",), "a list view needs `cap`, a number >= 1: the entries kept per key")
    if keys.fanout_limit is not None and keys.fanout_limit < 0:
        check.add(("fanout_limit",), "a number >= 0, or empty for no limit")
    return {
        "key": key,
        "fields": fields,
        "entry": entry,
        "order": order,
        "cap": keys.cap,
        "entries": keys.entries or "entries",
        "items": keys.items,
        "fanout_limit": keys.fanout_limit,
    }


def _order(keys: ListKeys, entry: str | None, check: ViewCheck) -> tuple[tuple[str, bool], ...]:
    """The list's order: one expression (a number or a timestamp) and its direction, then optionally the entry in the
    same direction (ties are ordered by the entry either way)."""
    if keys.order is None:
        check.add(("order",), "a list view needs `order`, e.g. `[ts desc, order_id desc]`")
        return ()
    parsed = []
    for i, term in enumerate([keys.order] if isinstance(keys.order, str) else keys.order):
        m = _ORDER.match(str(term).strip())
        expr, direction = m.group(1).strip(), (m.group(2) or "asc").lower()
        parsed.append((check.expr(expr, ("order", i)), direction == "desc"))
    if parsed:
        check.numeric(parsed[0][0], ("order", 0), "a list's order")
    if not 1 <= len(parsed) <= 2:
        check.add(
            ("order",), "a list's order is one expression (a number or timestamp), then optionally the entry"
        )
    elif len(parsed) == 2 and (parsed[1][0] != entry or parsed[1][1] != parsed[0][1]):
        check.add(
            ("order", 1),
            "the second term of a list's order is the entry, in the same direction as the first (ties are ordered "
            "by the entry)",
        )
    return tuple(parsed[:1])


FILE = ViewFile("list", ListKeys, _read)


LIST_OPS_SCHEMA = (
    "kind string, id string, mode string, removes array<string>, entries array<string>, body string"
)

# The heavy entries of a value that stopped being heavy expire this long after, rather than at once: a reader that
# read the key's `.reads` set just before can still read them.
RETIRE_SECONDS = 60
_PIPELINE_BYTES = 1 << 20  # send about this many bytes of commands per round trip
_NUMBERS = ("tinyint", "smallint", "int", "bigint", "float", "double")


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


def _op(
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


def _union(parts: list[DataFrame]) -> DataFrame:
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _list_parts(changes: ListChanges | GenericChanges, removing: bool, adding: bool) -> list[DataFrame]:
    """The lists' operations: a key's removes and adds are one `add`; refills are `replace`."""
    adds = changes.adds.selectExpr("_k", "entries._p AS entries")
    if removing:
        removes = changes.removes.groupBy("_k").agg(F.expr(f"collect_list({member('_e')}) AS removes"))
        touched = adds.join(removes, "_k", "full") if adding else removes
        return [
            _op(touched, "list", "_k", "'add'", "removes", "entries" if adding else "NULL"),
            _op(changes.replaces, "list", "_k", "'replace'", entries="entries._p"),
        ]
    return [_op(adds, "list", "_k", "'add'", entries="entries")] if adding else []


def _heavy_phases(changes: ListChanges, posted: bool) -> tuple[list[DataFrame], list[DataFrame]]:
    """(before, after): the heavy side's operations applied before the lists' (heavy entries, `follows` gained; the
    adds only when not `posted`) and after them (`follows` lost, heavy entries retired)."""
    n, heavy = changes.counts, changes.shape.heavy_text("_m")
    first, last = [], []
    if n["up"] or n["died"]:
        first.append(_op(changes.heavy_replaces, "heavy", heavy, "'replace'", entries="entries._p"))
    if n["born"] and not posted:
        first.append(_op(changes.heavy_adds, "heavy", heavy, "'add'", entries="entries._p"))
    for df, out, column, count in (
        (changes.heavy_gained, first, "entries", "heavy_gained"),
        (changes.heavy_lost, last, "removes", "heavy_lost"),
    ):
        if n[count]:
            per = df.groupBy("_k").agg(F.expr(f"collect_list({bulk(heavy)}) AS ids"))
            out.append(_op(per, "reads", "_k", **{column: "ids"}))
    if n["down"]:
        last.append(_op(changes.heavy_retired, "heavy", heavy, "'retire'"))
    return first, last


class ListView:
    """The operations of list view `view` of a `join` job (see the module docstring). `parts`: what takes part in the
    join's step (`joins.table.begin_join(..., lists=view.parts)`)."""

    def __init__(self, join: TableJoin, view: View):
        if view.kind != "list":
            raise ViewError(f"view {view.name!r} is a {view.kind} view, not a list")
        self.join, self.view, self.body = join, view, body_sql(view)
        self.shape = list_shape(join, view, carry=ENTRY_CARRY)
        self.generic = None if self.shape else generic_spec(join, view, carry=ENTRY_CARRY, body=self.body)
        order = self.shape.order_type if self.shape else self.generic.order_type
        if order not in _NUMBERS and not order.startswith("decimal"):
            raise ViewError(f"view {view.name!r}: its order {view.order[0][0]!r} is a {order}, not a number")

    @property
    def parts(self) -> list:
        return [self.shape] if self.shape else []

    @property
    def descending(self) -> bool:
        return self.view.order[0][1]

    def _bodies(self, rows: DataFrame) -> DataFrame:
        """The `entry` operations storing the bodies of the entry side's `rows` (their fields)."""
        e = self.shape.entry_side
        exprs = [("_e", f"CAST(({self.shape.entry}) AS string)"), ("_b", self.body)]
        return _op(self.join.eval(e, rows, exprs), "entry", "_e", body="_b")

    def posts_ops(self, posts: ListPosts) -> DataFrame:
        """The operations (LIST_OPS_SCHEMA) of a batch's `posts` (`joins.table.JoinStep.posts`): the bodies of entries
        that became live and the heavy values' entries added to, at most two per entry of the batch. They are part of
        the first write phase, taken out to be applied before the batch's changes are counted; the phases after them
        are `phases(changes, posted=True)`."""
        heavy = _op(posts.heavy_adds, "heavy", self.shape.heavy_text("_m"), "'add'", entries="entries._p")
        return self._bodies(posts.entries_live).unionByName(heavy)

    def phases(self, changes: JoinChanges, posted: bool = False) -> Iterator[tuple[DataFrame, int | None]]:
        """The operations (LIST_OPS_SCHEMA) of one micro-batch's join `changes`, in write phases, each to be applied
        after the previous one (`ListViewSink.write` does): one (DataFrame, rows_at_most) per phase, rows_at_most a
        bound on its operations known from the join's counts, or None (a fan-out, bounded by list-side counts only).
        Without a fan-out limit there is one phase; with one, up to three (see the module docstring). Branches with
        no input in the batch are left out. Each phase is planned when the one before it was taken, so a sink that
        writes it first does not wait for the others' plans. `posted`: the batch's `posts_ops` were applied already
        (left out here)."""
        if self.shape is None:
            got = generic_list(changes, self.generic)
            yield _union(_list_parts(got, True, True) + [_op(got.bodies, "entry", "_e", body="_b")]), None
            return
        got = changes.lists[self.view.name]
        yield from self._shape_phases(got, posted)

    def _shape_phases(self, got: ListChanges, posted: bool) -> Iterator[tuple[DataFrame, int | None]]:
        n = got.counts
        born = [self._bodies(got.entries_live)] if n["born"] and not posted else []
        removing, adding = bool(n["died"] or n["lost"]), bool(n["fanned"] or n["gained"])
        if got.heavy_gained is None:
            lists = _list_parts(got, removing, adding)
            dead = [_op(got.entries_dead, "entry", "_e")] if n["died"] or not (lists or born) else []
            yield _union(lists + born + dead), None if lists else n["born"] + n["died"]
            return
        first, last = _heavy_phases(got, posted)
        if born + first:  # bodies and heavy entries: one per entry or value; `.reads` sets: one per key
            yield _union(born + first), 2 * n["born"] + n["up"] + n["died"] + n["heavy_gained"]
        lists = _list_parts(got, removing, adding)
        if lists:
            yield _union(lists), None
        dead = [_op(got.entries_dead, "entry", "_e")] if n["died"] else []
        if dead + last:
            yield _union(dead + last), n["died"] + n["heavy_lost"] + n["down"]


def join_lists(join: TableJoin, views) -> list[ListView]:
    """A `ListView` for each list view among `views` (of a `join` job over `join`), in declared order."""
    return [ListView(join, v) for v in views if v.kind == "list"]


def list_caps(views) -> list[int]:
    """The `cap` of each list view among `views`."""
    return [v.cap for v in views if v.kind == "list"]


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


def _entry_field(view: View) -> str | None:
    """The name of `view`'s field whose expression is the entry's (written alike, backquotes aside), or None."""
    entry = view.entry.strip("` ")
    return next((name for name, sql in view.fields if sql.strip("` ") == entry), None)


_COLUMN = re.compile(r"\s*(?:`?[A-Za-z_]\w*`?\s*\.\s*)?`?([A-Za-z_]\w*)`?\s*")


def item_entry_name(view: View) -> str | None:
    """The name under which an item of list view `view` (`read_list`, `mview query --json`) carries its entry id,
    first, before its fields; None when one of its fields already is the entry (its expression is the entry's: the
    timeline's `tweet_id`), so the item is its fields alone. Else the entry expression's column name (`rider_id`;
    `riders.rider_id`: `rider_id`) when no field has that name, else `entry` (`_entry`, `__entry`, ... while a field
    has that name)."""
    if _entry_field(view) is not None:
        return None
    taken = {name for name, _ in view.fields}
    column = _COLUMN.fullmatch(view.entry)
    if column and column.group(1) not in taken:
        return column.group(1)
    name = "entry"
    while name in taken:
        name = f"_{name}"
    return name


def _missing(view: View, entry_id: str) -> dict:
    """The fields of an entry whose body is gone (deleted meanwhile): null, the entry's own id where a field is it."""
    field = _entry_field(view)
    return {name: entry_id if name == field else None for name, _ in view.fields}


def _hydrate(client, view: View, generation: int, ids: list[str]) -> list[dict]:
    """The items of entries `ids`: each entry's body (its fields), the entry first under `item_entry_name(view)`
    unless a field holds it. The bodies in one round trip: one MGET on a single server; on a Redis Cluster, whose
    bodies lie in many hash slots, one pipelined GET each (one round trip per node)."""
    keys = [entry_key(view.name, generation, e) for e in ids]
    if not keys:
        return []
    if isinstance(client, RedisCluster):
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.get(k)
        bodies = pipe.execute()
    else:
        bodies = client.mget(keys)
    items = [orjson.loads(body) if body else _missing(view, e) for e, body in zip(ids, bodies, strict=True)]
    name = item_entry_name(view)
    return items if name is None else [{name: e, **item} for e, item in zip(ids, items, strict=True)]


# KEYS[1] = the key's list, KEYS[2] = the heavy values it reads (one hash slot: the key's); ARGV[1] = the last rank
# to read (-1: all). One atomic read of both, so a mode switch between them is never half seen.
_SNAPSHOT = {
    descending: Script(
        None,
        f"return {{redis.call('{cmd}', KEYS[1], 0, ARGV[1], 'WITHSCORES'), redis.call('SMEMBERS', KEYS[2])}}".encode(),
    )
    for descending, cmd in ((True, "ZREVRANGE"), (False, "ZRANGE"))
}


def _pairs(flat) -> list[tuple[float, str]]:
    """(score, entry) of a ZRANGE/ZREVRANGE ... WITHSCORES reply (member, score, member, score, ...)."""
    return [(float(flat[i + 1]), flat[i].decode()) for i in range(0, len(flat), 2)]


def _snapshots(client, view: View, generation: int, keys: list[str], stop: int):
    """Per key: (list [(score, entry)] in order, [heavy values]), each key's read atomic (round trip 1; one script
    call per key, all in one pipeline when there are several)."""
    script = _SNAPSHOT[view.order[0][1]]
    if len(keys) == 1:
        names = [list_key(view.name, generation, keys[0]), reads_key(view.name, generation, keys[0])]
        replies = [script(keys=names, args=[stop], client=client)]
    else:
        pipe = client.pipeline(transaction=False)
        for k in keys:  # EVAL: a cluster pipeline blocks EVALSHA and eval()
            names = (list_key(view.name, generation, k), reads_key(view.name, generation, k))
            pipe.execute_command("EVAL", script.script, 2, *names, stop)
        replies = pipe.execute()
    return [(_pairs(own), sorted(h.decode() for h in heavy)) for own, heavy in replies]


def _heavy(client, view: View, generation: int, job: str, values, stop: int) -> tuple[dict, int | None]:
    """({value: [(score, entry)] in order}, the view's cap) in one pipelined round trip (one per node on a cluster):
    the heavy values' entries and the cap recorded in the generation's meta hash."""
    values = sorted(values)
    pipe = client.pipeline(transaction=False)
    read = pipe.zrevrange if view.order[0][1] else pipe.zrange
    for v in values:
        read(heavy_key(view.name, generation, v), 0, stop, withscores=True)
    pipe.hget(meta_key(job, generation), f"{view.name}.cap")
    *sets, cap = pipe.execute()
    got = {v: [(float(s), e.decode()) for e, s in entries] for v, entries in zip(values, sets, strict=True)}
    return got, (int(cap) if cap is not None else None)


def _merge(own: list, others: list[list], n: int | None, descending: bool) -> list[str]:
    """The first `n` distinct entries of the union in the list's order (ties by the entry, in the same direction)."""
    best: dict[str, float] = {}
    for entries in (own, *others):
        for score, e in entries:
            if e not in best or (score > best[e] if descending else score < best[e]):
                best[e] = score
    ordered = sorted(((s, e) for e, s in best.items()), reverse=descending)
    return [e for _, e in (ordered if n is None else ordered[:n])]


def _cut(limit: int | None, cap: int | None) -> int | None:
    return limit if cap is None else cap if limit is None else min(limit, cap)


def _list_view(view: str | View, job: str | None, pipeline: Pipeline | None) -> View:
    """`views.read.resolve_view(view, pipeline, job=job, kind="list")`: the list view, or its error."""
    from views.read import resolve_view  # (views.read imports this module)

    return resolve_view(view, pipeline, job=job, kind="list")


def _ids(client, view: View, generation: int, key: str, limit: int | None) -> list[str]:
    """The entries of `key` in order, at most `limit`: the stored list and its heavy values' entries, merged."""
    if limit is not None and limit <= 0:
        return []
    stop = -1 if limit is None else limit - 1
    [(own, heavy)] = _snapshots(client, view, generation, [key], stop)
    if not heavy:
        return [e for _, e in own]
    entries, cap = _heavy(client, view, generation, view.job, heavy, stop)
    return _merge(own, [entries[h] for h in heavy], _cut(limit, cap), view.order[0][1])


def read_list(
    client,
    view: str | View,
    key: str,
    limit: int | None = None,
    *,
    job: str | None = None,
    pipeline: Pipeline | None = None,
) -> dict:
    """The list of `key` in list view `view` (its name in `pipeline`, default `views.pipeline.default_pipeline()`, or
    the `View`) as the view defines it, in the serving generation of the view's job:
    `{"<key name>": key, "generation": g, "<entries>": [entry, ...], "<items>": [{<entry>, <fields>}, ...]}`, in the
    view's order, at most `limit` (None: the whole list, `cap` entries at most). Each item is the entry's fields,
    the entry first under `item_entry_name(view)` unless a field holds it; with `items` unset (the items take the
    entries' name) only the items are given. A key with no entry gives both empty. The one read path of the view
    (`mview query`, `export`, the web page use it); it needs only a Redis client, never Spark.

    `job`, when given, must be the view's job. Raises `UnknownView` for a name the pipeline lacks, `WrongJob`,
    `WrongViewKind` for a view that is not a list, `ViewError` for a `limit` that is not a whole number (as the
    older form `read_list(client, view, job, key)` gives): never an empty answer for a wrong question.

    The stored list holds the entries fanned out on write; the entries of the heavy values the key reads (a fan-out
    limit) are merged in here, in order, duplicates once. Round trips: the generation pointer; the key's list and
    `.reads` set, read atomically (one hash slot); when it reads heavy values, their entries, pipelined (one round
    trip per node); the entries' bodies. An entry whose body is gone by then (deleted meanwhile) is returned with
    null fields (but the entry's own id)."""
    view = _list_view(view, job, pipeline)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise ViewError(
            f"read_list(client, view, key, limit): limit must be a whole number or None, not {limit!r} (the job "
            "is not an argument: it is the view's)"
        )
    generation = current_generation(client, view.job)
    ids = _ids(client, view, generation, key, limit)
    out = {view.key_name: key, "generation": generation, view.entries: ids}
    out[view.items_name] = _hydrate(client, view, generation, ids)
    if view.window is not None:
        raw = client.get(window_key(view.name, generation, key))
        out.update(orjson.loads(raw) if raw is not None else {})
    return out


def query_list(client, view: View, key: str, limit: int | None = None) -> dict:
    """`{"<key name>": key, "generation": g, "<items>": [{<entry>, <fields>}, ...]}` (`read_list`'s items, each
    naming its entry, without the separate entries array), `{}` when it holds no item (the key has no entry, or
    `limit` is 0), as every view kind's query (the form `views.read.query_view` calls)."""
    got = read_list(client, view, key, limit)
    if not got[view.items_name]:
        return {}
    window = {k: got[k] for k in _WINDOW_FIELDS if k in got}
    return {view.key_name: got[view.key_name], "generation": got["generation"], view.items_name: got[view.items_name],
            **window}  # fmt: skip


def export_list(
    client, view: str | View, job: str | None = None, *, pipeline: Pipeline | None = None
) -> Iterator[dict]:
    """Every non-empty list as `{"<key name>": key, "<entries>": [entry ids in order]}`, ordered by key: the keys
    with a stored list or a `.reads` set, each read and merged as `read_list` does (500 keys per round trip, each
    heavy value's entries read once). `view`, `job`, `pipeline` and their errors (raised here, before the first
    line): as `read_list`'s."""
    return _export_lines(client, _list_view(view, job, pipeline))


def _export_lines(client, view: View) -> Iterator[dict]:
    job = view.job
    generation = current_generation(client, job)
    keys = sorted(
        {
            key_id(k)
            for name in (view.name, f"{view.name}.{READS}")
            for k in client.scan_iter(match=view_pattern(name, generation), count=1000)
        }
    )
    heavy_entries: dict[str, list] = {}
    cap = None
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        snaps = _snapshots(client, view, generation, chunk, -1)
        needed = {h for _, heavy in snaps for h in heavy} - heavy_entries.keys()
        if needed:
            more, cap = _heavy(client, view, generation, job, needed, -1)
            heavy_entries.update(more)
        windows = _windows(client, view, generation, chunk)
        for k, (own, heavy), window in zip(chunk, snaps, windows, strict=True):
            own_ids = [e for _, e in own]
            ids = _merge(own, [heavy_entries[h] for h in heavy], cap, view.order[0][1]) if heavy else own_ids
            if ids:
                key = window.pop(view.key_name, k)
                yield {view.key_name: key, view.entries: ids, **window}


_WINDOW_FIELDS = ("window_start", "window_end", "final")


def _windows(client, view: View, generation: int, keys: list[str]) -> list[dict]:
    """The window of each list key of a windowed list view (`{}` each for a view without a window), one round
    trip."""
    if view.window is None:
        return [{} for _ in keys]
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.get(window_key(view.name, generation, k))
    return [orjson.loads(raw) if raw is not None else {} for raw in pipe.execute()]
