"""List views of a `join` job: per list key, the first `cap` entries in order, maintained from the join's step.

A list keys the join's rows by an expression (the *list key*), names each row's *entry* by another, orders them by a
number (ties by the entry, in the same direction) and keeps the first `cap` per key. Two algorithms maintain it,
with the same result, each run from a spec of SQL texts and numbers (`ListShape`, `GenericList`); which one serves
a list view, and its spec, `views.list.join` tells from the view's declaration.

**The list shape (`ListShape`)**, for a list whose key is a field of one side (the *list side*; the built-in
timeline: `follows.follower_id`), whose entry is the other side's key (the *entry side*: `tweets.tweet_id`), whose
order is over the entry side (`ts`), where the list key and the list side's match fields are exactly the list
side's key (one list-side row per list key and match value) and every joined row is listed. It takes part in the
join's step (`joins.table.ListPart`) and plans, per batch, by the product rule d(E join S) = dE join S' + E' join dS:
- an entry that becomes live (or moves) is added to the list of every list-side row current before the batch and
  still current (fan-out on write), with its `carry` value (an expression over `_o`, the order value, and `_e`, the
  entry id) evaluated once per entry, before the fan-out;
- a list-side row that becomes current adds the newest `cap` live entries of its match value (cut per match value
  before the fan-out, this batch's entries included: backfill). The two terms are disjoint, so each (list key,
  entry) is produced once;
- an entry that dies, or a list-side row that stops being current, removes the entries; a list whose join held more
  than `cap` rows before the batch (so the view did not hold them all) is recomputed whole from the state after
  the batch (`replaces`), which refills it with the next ones.
With a fan-out limit (`fanout_limit`), a match value with more than that many current list-side rows is *heavy*
(the built-in: a celebrity) and its entries are not fanned out: the steps above run over the *effective* list-side
rows (current ones whose match value is not heavy), and each heavy value keeps its own newest `cap` entries
(`heavy_adds`, `heavy_replaces` for a value that became heavy or lost a live entry, `heavy_retired` for one that
stopped being heavy), with the (list key, heavy value) pairs that began or ended (`heavy_gained`, `heavy_lost`).
The first `cap` of a key's whole join is the first `cap` of its list merged with its heavy values' entries. A value
that crosses the limit in a batch turns its list-side rows that stay current into effective gains or losses, which
the steps above backfill or remove. A batch of entries only (no list-side record: no value crosses the limit) has
*posts* (`ListPosts`: its entries that became live and the heavy values' adds), planned before the batch is counted,
so a view can make a heavy value's entry visible first.

**Any other list** (`GenericList`, `generic_list`) applies the join's delta: the entries of removed rows are removed,
those of added rows added (the first `cap` per key), and a list that lost entries while its key held more than `cap`
rows before the batch is recomputed whole from the join after it, restricted to those keys (the key filter pushed
to the side the key expression reads, when it reads one side only). Where a (key, entry) can come from several
rows of the join, every key the batch touches is recomputed. An entry's `body` (an expression of the row, opaque
here) is set from added rows and recomputed for entries whose rows were removed (deleted when none is left).

Every step is a Spark SQL plan over the batch and the state (no Python per row); branches with no input in a batch
are left out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from changelog.current import quoted
from joins.state import empty_frame, with_row_count
from joins.table import (
    BORN,
    DIED,
    GAINED,
    LIVE,
    LOST,
    Begun,
    Counted,
    JoinChanges,
    TableJoin,
    TableState,
    count_parts,
)

__all__ = [
    "ListShape",
    "ListPosts",
    "ListChanges",
    "GenericList",
    "GenericChanges",
    "generic_list",
    "entries_type",
]


def entries_type(order_type: str) -> str:
    """The type of a list's entries column: `_o` the order value, `_e` the entry id, `_p` the carry value."""
    return f"array<struct<_o:{order_type},_e:string,_p:string>>"


@dataclass(frozen=True)
class ListShape:
    """A list view the join maintains by its own algorithm (see the module docstring). SQL texts: `key` over the list
    side's rows, `entry`, `order` over the entry side's; `carry` over `_o` and `_e` (None: null)."""

    name: str
    side: int  # the list side (0: the join's left, 1: its right); the entry side is the other
    key: str
    entry: str
    order: str
    descending: bool
    cap: int
    order_type: str
    match_type: str
    carry: str | None = None
    fanout_limit: int | None = None
    many_match: bool = False  # several match pairs: the match value is a struct

    @property
    def entry_side(self) -> int:
        return 1 - self.side

    @property
    def entries_type(self) -> str:
        return entries_type(self.order_type)

    def heavy_text(self, column: str = "_m") -> str:
        """SQL: a match value as the text that names a heavy value (its Redis key's id)."""
        return f"to_json({column})" if self.many_match else f"CAST({column} AS string)"

    def restore(self, join: TableJoin, state: TableState) -> TableState:
        if self.fanout_limit is None or state.heavy.get(self.name) is not None:
            return state
        heavy = _heavy(join, self, state.sides[self.side]).localCheckpoint(eager=False)
        return replace(state, heavy={**state.heavy, self.name: heavy})

    def posts(self, begun: Begun) -> ListPosts | None:
        """A batch of entries only under a fan-out limit: its posts (see `ListPosts`), else None."""
        e = self.entry_side
        if self.fanout_limit is None or not begun.present[e] or begun.present[self.side]:
            return None
        tc = begun.changes[e]
        born = _born_rows(begun.join, self, tc)
        replaced = _entries(begun.join, self, tc.where(DIED).select("_old.*")).select("_m")
        heavy = begun.before.heavy[self.name]
        return ListPosts(born, _heavy_adds(_entries(begun.join, self, born), heavy, replaced, self))

    def counted(self, begun: Begun, frames: list[DataFrame], tag: str) -> list[tuple[int, str]]:
        """The count of entries that became live by a value that was not heavy (`fanned`), in the join's one
        counting job (the entry side's frame joined with the heavy values)."""
        e = self.entry_side
        if self.fanout_limit is None:
            return [(e, BORN)]
        heavy = begun.before.heavy[self.name].selectExpr(f"_m AS {tag}m", f"true AS {tag}")
        with_m = begun.join.eval(e, frames[e], [(f"{tag}m", begun.join.match_sql(e))], keep=["*"])
        frames[e] = with_m.join(heavy, f"{tag}m", "left")
        return [(e, f"({BORN}) AND {tag} IS NULL")]

    def finish(self, c: Counted, n: dict, posts: ListPosts | None) -> ListChanges:
        return _finish(c, self, n["extra"][0], posts)


@dataclass(frozen=True)
class ListPosts:
    """A batch's new entries under a fan-out limit, planned before the batch's changes are counted: what makes a
    heavy value's entry visible. Made for a batch of entry-side records only (so no value crosses the limit in it);
    the same rows as the batch's `ListChanges.entries_live` and `heavy_adds`."""

    entries_live: DataFrame  # the entry side's rows that became live (its fields)
    heavy_adds: DataFrame  # _m, entries: add to the heavy value's entries, keep the first cap


class _Planned:
    """A batch's list changes whose plans are made on first use: `_plans` maps a name to its plan or to the function
    that makes it. `adds` (_k, entries: add, then keep the first cap), `removes` (_k, _e: entries to remove, before
    the adds) and `replaces` (_k, entries: the list's whole new content) are the plan `lists`."""

    _plans: dict

    def _plan(self, name: str):
        if callable(self._plans[name]):
            self._plans[name] = self._plans[name]()
        return self._plans[name]

    @property
    def adds(self) -> DataFrame:
        return self._plan("lists")[0]

    @property
    def removes(self) -> DataFrame:
        return self._plan("lists")[1]

    @property
    def replaces(self) -> DataFrame:
        return self._plan("lists")[2]


@dataclass
class ListChanges(_Planned):
    """One batch's changes of a `ListShape` list. The lists' side (`adds`, `removes`, `replaces`) and
    `entries_dead` are planned on first use."""

    shape: ListShape
    entries_live: DataFrame  # the entry side's rows that became live (its fields)
    counts: dict  # born, fanned, died, gained, lost; with a fan-out limit: up, down, heavy_gained, heavy_lost
    heavy_adds: DataFrame | None = None  # _m, entries: add to the heavy value's entries, keep the first cap
    heavy_replaces: DataFrame | None = None  # _m, entries: the heavy value's whole entries (first cap live)
    heavy_retired: DataFrame | None = None  # _m: values that stopped being heavy
    heavy_gained: DataFrame | None = None  # _k, _m: a heavy value the list key now reads
    heavy_lost: DataFrame | None = None  # _k, _m: ... no longer reads (or is no longer heavy)
    heavy_after: DataFrame | None = None  # _m: the heavy values after the batch (the state's)
    cached: list = field(default_factory=list)
    _plans: dict = field(default_factory=dict)

    @property
    def entries_dead(self) -> DataFrame:
        """_e: entries that stopped being live."""
        return self._plan("dead")


def _pairs(join: TableJoin, shape: ListShape, rows: DataFrame, keep=()) -> DataFrame:
    """_k, _m (and `keep`) of list-side rows whose list key and match value are not null."""
    exprs = [("_k", f"CAST(({shape.key}) AS string)"), ("_m", join.match_sql(shape.side))]
    return join.eval(shape.side, rows, exprs, keep=keep).where("_k IS NOT NULL AND _m IS NOT NULL")


def _entries(join: TableJoin, shape: ListShape, rows: DataFrame, keep=()) -> DataFrame:
    """_e, _o, _m (and `keep`) of entry-side rows whose order value and match value are not null."""
    e = shape.entry_side
    exprs = [("_e", f"CAST(({shape.entry}) AS string)"), ("_o", shape.order), ("_m", join.match_sql(e))]
    return join.eval(e, rows, exprs, keep=keep).where("_o IS NOT NULL AND _m IS NOT NULL")


def _born_rows(join: TableJoin, shape: ListShape, changes: DataFrame) -> DataFrame:
    """The entry side's fields of its changed rows that became live."""
    return changes.where(BORN).selectExpr(*map(quoted, join.topics[shape.entry_side].names))


def _newest(entries: Column, shape: ListShape) -> Column:
    """The first `cap` (order, entry) structs of `entries` in the list's order, in no particular order.

    Sorted only when there are more than `cap` (the order of the array carries no meaning). No `array_distinct`:
    callers pass distinct rows, and Spark's array_distinct of structs compares every pair (quadratic)."""
    ordered = F.sort_array(entries, asc=not shape.descending)
    return F.when(F.size(entries) <= shape.cap, entries).otherwise(F.slice(ordered, 1, shape.cap))


def _lists(pairs: DataFrame, shape: ListShape) -> DataFrame:
    """_k, entries: the first `cap` of each key's (_k, _e, _o, _p) rows (distinct)."""
    return pairs.groupBy("_k").agg(
        _newest(F.collect_list(F.struct("_o", "_e", "_p")), shape).alias("entries")
    )


def _with_carry(entries: DataFrame, carry: str | None) -> DataFrame:
    """`entries` (_o, _e, ...) with `_p`: the SQL expression `carry` evaluated per row, or null."""
    return entries.withColumn("_p", F.expr(carry) if carry else F.lit(None).cast("string"))


def _top_per_match(entries: DataFrame, shape: ListShape) -> DataFrame:
    by = [F.col("_o").desc(), F.col("_e").desc()] if shape.descending else [F.col("_o"), F.col("_e")]
    w = Window.partitionBy("_m").orderBy(*by)
    return (
        entries.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") <= shape.cap).drop("_rank")
    )


def _backfill(pairs: DataFrame, live: DataFrame, shape: ListShape) -> DataFrame:
    """_k, _e, _o, _p: for each (_k, _m) pair, the first `cap` entries of `live` with its match value. Cut per match
    value before the fan-out to the pairs (a heavy value's thousands of entries are not joined to each of its
    list-side rows and cut after), and `carry` evaluated once per entry, before the fan-out too."""
    values = pairs.select("_m").distinct()
    top = _with_carry(_top_per_match(live.join(values, "_m", "left_semi"), shape), shape.carry)
    return pairs.join(top.select("_m", "_e", "_o", "_p"), "_m").select("_k", "_e", "_o", "_p")


def _heavy(join: TableJoin, shape: ListShape, side_state: DataFrame) -> DataFrame:
    """_m: the match values with more than `fanout_limit` current list-side rows."""
    per_value = _pairs(join, shape, side_state.where(LIVE)).groupBy("_m").count()
    return per_value.where(F.col("count") > shape.fanout_limit).select("_m")


@dataclass(frozen=True)
class _Delta:
    """One batch's effect on a list: the entries and list-side pairs that change it, with `n`: how many of each
    (0 = no plan branch), and the (effective) pairs and live entries before and after."""

    born: DataFrame  # the entry side's rows that became live (its fields)
    born_entries: DataFrame  # _e, _o, _m of them
    died: DataFrame  # _e, _m (before), _live_after
    gained: DataFrame  # _k, _m: (effective) pairs that became current
    lost: DataFrame  # ... that stopped being current
    n: dict  # born, fanned (born, by a value that was not heavy), died, gained, lost
    cur_before: DataFrame  # _k, _m: the (effective) pairs before the batch
    cur_after: DataFrame  # ... after it
    list_changes: DataFrame  # the list side's changed rows
    entry_tables: tuple  # (join, shape, the entry side's table before, after): `live_before`/`live_after`
    _live: dict = field(default_factory=dict)

    def _entries_of(self, i: int) -> DataFrame:
        """The live entries (_e, _o, _m) of the entry side's table before (0) or after (1) the batch, planned on
        first use (a batch that removes nothing and adds no list-side row never plans them)."""
        if i not in self._live:
            join, shape, *tables = self.entry_tables
            self._live[i] = _entries(join, shape, tables[i].where(LIVE))
        return self._live[i]

    @property
    def live_before(self) -> DataFrame:
        return self._entries_of(0)

    @property
    def live_after(self) -> DataFrame:
        return self._entries_of(1)


def _delta(c: Counted, shape: ListShape, fanned: int, posts: ListPosts | None) -> _Delta:
    join, e, s = c.join, shape.entry_side, shape.side
    tc, fc = c.changes[e], c.changes[s]
    born = posts.entries_live if posts else _born_rows(join, shape, tc)
    return _Delta(
        born=born,
        born_entries=_entries(join, shape, born),
        died=_entries(join, shape, tc.where(DIED).selectExpr("_old.*", "_live_after"), keep=["_live_after"]),
        gained=_pairs(join, shape, fc.where(GAINED)),
        lost=_pairs(join, shape, fc.where(LOST)),
        n={
            "born": c.n[e]["born"],
            "fanned": fanned,
            "died": c.n[e]["died"],
            "gained": c.n[s]["gained"],
            "lost": c.n[s]["lost"],
        },
        cur_before=_pairs(join, shape, c.before.sides[s].where(LIVE)),
        cur_after=_pairs(join, shape, c.after.sides[s].where(LIVE)),
        list_changes=fc,
        entry_tables=(join, shape, c.before.sides[e], c.after.sides[e]),
    )


def _removals(d: _Delta, shape: ListShape) -> tuple[DataFrame, DataFrame, list[DataFrame]]:
    """(removes: _k, _e; refill: _k; persisted intermediates) for the list keys that lose entries: a list-side row
    that stopped being current, or an entry that died of a value they read before the batch. A key whose join held
    at most `cap` rows (the view holds all of them) loses exactly those entries; one that held more than `cap` (the
    view holds only the first `cap`) is in `refill`, to be recomputed whole."""
    parts = []
    if d.n["died"]:
        parts.append(d.cur_before.join(d.died.select("_m", "_e"), "_m").select("_k", "_e"))
    if d.n["lost"]:
        parts.append(d.lost.join(d.live_before.select("_m", "_e"), "_m").select("_k", "_e"))
    removes_all = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1]).distinct()
    removes_all = removes_all.persist()
    losers = removes_all.select("_k").distinct()
    per_value = d.live_before.groupBy("_m").agg(F.count("*").alias("n"))
    sizes = d.cur_before.join(losers, "_k").join(per_value, "_m")
    refill = (
        sizes.groupBy("_k").agg(F.sum("n").alias("n")).where(F.col("n") > shape.cap).select("_k")
    ).persist()
    removes = removes_all.join(refill, "_k", "left_anti")
    return removes, refill, [removes_all, refill]


def _adds(join: TableJoin, d: _Delta, refill: DataFrame | None, shape: ListShape) -> DataFrame:
    """_k, entries: the entries each list key gains (keys in `refill` left out).

    dE join S' = dE join (S' minus dS) + dE join dS, and E' join dS holds the second term, so the adds are
    dE join (pairs current before and after) + E' join (pairs that became current): disjoint, each (key, entry)
    once, and a first batch (empty state) computes the join only once."""
    candidates = []
    if d.n["fanned"]:  # (a heavy value's entries reach no list: without others, the list side is not read)
        born = _with_carry(d.born_entries, shape.carry).select("_m", "_e", "_o", "_p")
        kept = d.cur_before
        if d.n["lost"]:
            kept = kept.join(d.lost, ["_k", "_m"], "left_anti")
        candidates.append(kept.join(born, "_m").select("_k", "_e", "_o", "_p"))
    if d.n["gained"]:
        candidates.append(_backfill(d.gained, d.live_after, shape))
    if not candidates:
        return empty_frame(join.spark, f"_k string, entries {shape.entries_type}")
    pairs = candidates[0] if len(candidates) == 1 else candidates[0].unionByName(candidates[1])
    if refill is not None:
        pairs = pairs.join(refill, "_k", "left_anti")
    return _lists(pairs, shape)


def _replaces(d: _Delta, refill: DataFrame, shape: ListShape) -> DataFrame:
    """_k, entries: the whole new list of each key in `refill`, recomputed from the state after the batch (an empty
    array when nothing is left)."""
    pairs = _backfill(d.cur_after.join(refill, "_k"), d.live_after, shape)
    return refill.join(_lists(pairs, shape), "_k", "left").select(
        "_k", F.coalesce("entries", F.array().cast(shape.entries_type)).alias("entries")
    )


@dataclass(frozen=True)
class _Heavy:
    """The heavy side of one batch (see `_effective`)."""

    before: DataFrame  # _m: heavy values before the batch
    after: DataFrame  # ... after it
    flips: DataFrame  # _m, up: values that became (up) or stopped being (not up) heavy
    gained: DataFrame  # _k, _m: pairs (current, value heavy) that began
    lost: DataFrame  # ... that ended
    cached: tuple = ()  # batch-sized local checkpoints, released with the batch


# long: one plan per kind of change of the heavy side, and the counts of all in one Spark job
def _effective(join: TableJoin, d: _Delta, before: DataFrame, shape: ListShape) -> tuple[_Delta, _Heavy]:
    """`d` over the *effective* pairs (current pairs whose match value is not heavy: more than `fanout_limit`
    current list-side rows), and the heavy side. A value that crosses the limit in the batch turns all its pairs
    that stay current into effective gains (no longer heavy) or losses (became heavy), so the list machinery
    backfills or removes and refills them like any other list-side change."""
    limit, keys = shape.fanout_limit, ["_k", "_m"]
    empty_pairs = empty_frame(join.spark, f"_k string, _m {shape.match_type}")
    after, flips = before, empty_frame(join.spark, f"_m {shape.match_type}, up boolean")
    gained = lost = c_gained = c_lost = empty_pairs
    n = {"up": 0, "down": 0, "heavy_gained": 0, "heavy_lost": 0}
    if d.n["gained"] or d.n["lost"]:
        flags = [f"({GAINED}) AS _g", f"({LOST}) AS _l"]
        moved = _pairs(join, shape, d.list_changes.where(f"({GAINED}) OR ({LOST})"), keep=flags).groupBy("_m")
        delta = moved.agg(F.expr("sum(CAST(_g AS int)) - sum(CAST(_l AS int)) AS delta"))
        now = d.cur_after.join(delta.select("_m"), "_m", "left_semi").groupBy("_m").count()
        status = delta.join(now, "_m", "left").selectExpr(
            "_m", f"coalesce(count, 0) - delta > {limit} AS was", f"coalesce(count, 0) > {limit} AS now"
        )
        flips = status.where("was <> now").selectExpr("_m", "now AS up").localCheckpoint(eager=False)
        after = (
            before.join(status.select("_m"), "_m", "left_anti")
            .unionByName(status.where("now").select("_m"))
            .localCheckpoint(eager=False)
        )
        stable = d.cur_after.join(flips, "_m").join(d.gained, keys, "left_anti")
        up, down = stable.where("up").select(*keys), stable.where("NOT up").select(*keys)
        gained = d.gained.join(after, "_m", "left_anti").unionByName(down)
        lost = d.lost.join(before, "_m", "left_anti").unionByName(up)
        c_gained = d.gained.join(after, "_m", "left_semi").unionByName(up)
        c_lost = d.lost.join(before, "_m", "left_semi").unionByName(down)
        gained, lost, c_gained, c_lost = (
            df.localCheckpoint(eager=False) for df in (gained, lost, c_gained, c_lost)
        )
        counts = count_parts(
            [gained, lost, c_gained, c_lost, flips.where("up"), flips.where("NOT up"), after]
        )
        gained, lost, c_gained, c_lost, flips, after = (
            with_row_count(df, k)
            for df, k in zip(
                (gained, lost, c_gained, c_lost, flips, after),
                (*counts[:4], counts[4] + counts[5], counts[6]),
                strict=True,
            )
        )
        d = replace(d, gained=gained, lost=lost, n={**d.n, "gained": counts[0], "lost": counts[1]})
        n = dict(zip(["heavy_gained", "heavy_lost", "up", "down"], counts[2:6], strict=True))
    d = replace(
        d,
        cur_before=d.cur_before.join(before, "_m", "left_anti"),
        cur_after=d.cur_after.join(after, "_m", "left_anti"),
        n={**d.n, **n},
    )
    cached = (flips, gained, lost, c_gained, c_lost) if d.n["gained"] or d.n["lost"] else ()
    return d, _Heavy(before, after, flips, c_gained, c_lost, cached)


def _heavy_sets(
    join: TableJoin, d: _Delta, h: _Heavy, shape: ListShape, posts: ListPosts | None
) -> tuple[DataFrame, DataFrame]:
    """(adds, replaces), both _m, entries: the changes of the heavy values' entries. A value that became heavy, or a
    heavy value with an entry that stopped being live, has its whole entries recomputed (the first `cap` live, an
    empty array when none is left); a heavy value's other new entries are added (the adds of `posts` when given:
    the same rows)."""
    adds = replaces = empty_frame(join.spark, f"_m {shape.match_type}, entries {shape.entries_type}")
    whole = [h.flips.where("up").select("_m")]
    if d.n["died"]:
        whole.append(d.died.select("_m").join(h.after, "_m", "left_semi"))
    values = functools.reduce(DataFrame.unionByName, whole).distinct()
    if d.n["up"] or d.n["died"]:
        live = d.live_after.join(values, "_m", "left_semi")
        top = _with_carry(_top_per_match(live, shape), shape.carry)
        entries = F.collect_list(F.struct("_o", "_e", "_p")).alias("entries")
        replaces = values.join(top.groupBy("_m").agg(entries), "_m", "left").select(
            "_m", F.coalesce("entries", F.array().cast(shape.entries_type)).alias("entries")
        )
    if d.n["born"]:
        adds = posts.heavy_adds if posts else _heavy_adds(d.born_entries, h.after, values, shape)
    return adds, replaces


def _heavy_adds(born: DataFrame, heavy: DataFrame, whole: DataFrame, shape: ListShape) -> DataFrame:
    """_m, entries: the `born` entries (_e, _o, _m) of the `heavy` values, per value, the first `cap`; values in
    `whole` (their entries are recomputed whole) left out."""
    born = born.join(heavy, "_m", "left_semi").join(whole, "_m", "left_anti")
    entries = F.collect_list(F.struct("_o", "_e", "_p"))
    return _with_carry(born, shape.carry).groupBy("_m").agg(_newest(entries, shape).alias("entries"))


def _finish(c: Counted, shape: ListShape, fanned: int, posts: ListPosts | None) -> ListChanges:
    join = c.join
    d = _delta(c, shape, fanned, posts)
    cached: list = []
    heavy = None
    if shape.fanout_limit is not None:
        d, heavy = _effective(join, d, c.before.heavy[shape.name], shape)
        cached += heavy.cached

    def lists() -> tuple[DataFrame, DataFrame, DataFrame]:
        if d.n["died"] or d.n["lost"]:
            removes, refill, persisted = _removals(d, shape)
            cached.extend(persisted)
            return _adds(join, d, refill, shape), removes, _replaces(d, refill, shape)
        removes = empty_frame(join.spark, "_k string, _e string")
        return (
            _adds(join, d, None, shape),
            removes,
            empty_frame(join.spark, f"_k string, entries {shape.entries_type}"),
        )

    side = {}
    if heavy is not None:
        adds, whole = _heavy_sets(join, d, heavy, shape, posts)
        side = dict(
            heavy_adds=adds,
            heavy_replaces=whole,
            heavy_retired=heavy.flips.where("NOT up").select("_m"),
            heavy_gained=heavy.gained,
            heavy_lost=heavy.lost,
            heavy_after=heavy.after,
        )
    return ListChanges(
        shape=shape,
        entries_live=d.born,
        counts=dict(d.n),
        cached=cached,
        _plans={"lists": lists, "dead": lambda: d.died.where(~F.col("_live_after")).select("_e")},
        **side,
    )


@dataclass(frozen=True)
class GenericList:
    """A list view maintained from the join's delta (`generic_list`; see the module docstring). SQL texts over the
    rows a view of the job sees (`TableJoin.view_frame`): `key`, `entry`, `order`, `where` (or None), `body` (an
    entry's stored text, or None: no bodies); `carry` over `_o` and `_e`. `key_side`/`entry_side`: the side the key /
    entry expression reads only (None: both). `unique_pairs`: a (key, entry) comes from one row of the join at
    most; `unique_body`: every row of an entry gives it the same body."""

    name: str
    key: str
    entry: str
    order: str
    descending: bool
    cap: int
    order_type: str
    where: str | None = None
    carry: str | None = None
    body: str | None = None
    key_side: int | None = None
    entry_side: int | None = None
    unique_pairs: bool = False
    unique_body: bool = False

    @property
    def entries_type(self) -> str:
        return entries_type(self.order_type)


@dataclass
class GenericChanges(_Planned):
    """One batch's changes of a `GenericList` list, planned on first use: `adds`, `removes`, `replaces` as
    `ListChanges`'s, and `bodies` (_e, _b: the entry's body to store, or null to delete it; None without bodies)."""

    spec: GenericList
    _plans: dict = field(default_factory=dict)
    cached: list = field(default_factory=list)

    @property
    def bodies(self) -> DataFrame | None:
        return self._plan("bodies")


def _view_rows(join: TableJoin, g: GenericList, pairs: DataFrame, body: bool) -> DataFrame:
    """_k, _e, _o (and _b) of the view's rows of joined `pairs`: `where` holds, key, entry and order not null."""
    frame = join.view_frame(pairs)
    if g.where is not None:
        frame = frame.where(f"coalesce(({g.where}), false)")
    cols = [f"CAST(({g.key}) AS string) AS _k", f"CAST(({g.entry}) AS string) AS _e", f"({g.order}) AS _o"]
    if body:
        cols.append(f"CAST(({g.body}) AS string) AS _b")
    return frame.selectExpr(*cols).where("_k IS NOT NULL AND _e IS NOT NULL AND _o IS NOT NULL")


def _restricted(
    join: TableJoin, state: TableState, g: GenericList, column: str, values: DataFrame, body: bool = False
) -> DataFrame:
    """The view's rows of the join of `state`'s current tables whose `column` (_k or _e) is among `values`: the
    filter is pushed to the side the key (entry) expression reads when it reads one side only."""
    sql, side = (g.key, g.key_side) if column == "_k" else (g.entry, g.entry_side)
    sides = [df.where(LIVE) for df in state.sides]
    if side is not None:
        picked = join.eval(side, sides[side], [("_f", f"CAST(({sql}) AS string)")], keep=["*"])
        wanted = values.select(F.col(column).alias("_f"))
        sides[side] = picked.join(wanted, "_f", "left_semi").drop("_f")
    return _view_rows(join, g, join.pairs(*sides), body).join(values, column, "left_semi")


def _best(rows: DataFrame, g: GenericList) -> DataFrame:
    """_k, _e, _o: each (key, entry) once, at its first order value among its rows."""
    return rows.groupBy("_k", "_e").agg((F.max if g.descending else F.min)("_o").alias("_o"))


def _generic_lists(changes: JoinChanges, g: GenericList, removed: DataFrame, added: DataFrame):
    join = changes.join
    empty_lists = empty_frame(join.spark, f"_k string, entries {g.entries_type}")
    if g.unique_pairs:
        losers = removed.select("_k").distinct()
        held = _restricted(join, changes.before, g, "_k", losers).groupBy("_k").count()
        refill = held.where(F.col("count") > g.cap).select("_k").persist()
        removes = removed.select("_k", "_e").join(refill, "_k", "left_anti")
        adds = _lists(_with_carry(added.select("_k", "_e", "_o"), g.carry).join(refill, "_k", "left_anti"), g)
    else:
        refill = removed.select("_k").unionByName(added.select("_k")).distinct().persist()
        removes, adds = empty_frame(join.spark, "_k string, _e string"), empty_lists
    whole = _restricted(join, changes.after, g, "_k", refill)
    if not g.unique_pairs:
        whole = _best(whole, g)
    replaced = _lists(_with_carry(whole.select("_k", "_e", "_o"), g.carry), g)
    replaces = refill.join(replaced, "_k", "left").select(
        "_k", F.coalesce("entries", F.array().cast(g.entries_type)).alias("entries")
    )
    return (adds, removes, replaces), [refill]


def _generic_bodies(changes: JoinChanges, g: GenericList, removed: DataFrame, added: DataFrame):
    if g.body is None:
        return None
    gone = removed.select("_e").distinct()
    kept = []
    if g.unique_body:
        kept = [added.groupBy("_e").agg(F.max("_b").alias("_b"))]
        gone = gone.join(added.select("_e"), "_e", "left_anti")
    else:
        gone = gone.unionByName(added.select("_e")).distinct()
    again = _restricted(changes.join, changes.after, g, "_e", gone, body=True)
    redo = gone.join(again.groupBy("_e").agg(F.max("_b").alias("_b")), "_e", "left")
    return functools.reduce(DataFrame.unionByName, [*kept, redo])


def generic_list(changes: JoinChanges, g: GenericList) -> GenericChanges:
    """The changes of list `g` from one batch's join `changes` (see the module docstring). Where an entry's rows give
    different bodies, the greatest text is kept."""
    out = GenericChanges(g)
    changes.lists[g.name] = out  # released with the batch

    @functools.cache
    def delta() -> tuple[DataFrame, DataFrame]:
        removed = _view_rows(changes.join, g, changes.removed, False).persist()
        added = _view_rows(changes.join, g, changes.added, g.body is not None).persist()
        out.cached.extend([removed, added])
        return removed, added

    def lists():
        plans, cached = _generic_lists(changes, g, *delta())
        out.cached.extend(cached)
        return plans

    out._plans.update(lists=lists, bodies=lambda: _generic_bodies(changes, g, *delta()))
    return out
