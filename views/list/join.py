"""A `join` job's list views: which of the join's list algorithms (`joins.table_list`) maintains a list view, with
the join-level spec it runs with, told from the view's declaration (`spec.model.View`) and the join's
(`joins.table.TableJoin`), and how one micro-batch's changes become the list's operations (`views.list.sink`).

- `list_shape`: the join's own list algorithm (`ListShape`) when the view has that shape: no `where`, its list key
  one field of a side (the *list side*) and its entry the other side's key (the *entry side*), the list key and the
  list side's match fields exactly the list side's key (one list-side row per list key and match value), its order
  and its fields over the entry side only (an entry's body is the entry side's row). Either side may be the list
  side, the left tried first.
- `generic_spec`: any list view, maintained from the join's delta (`GenericList`, run by `generic_list`), with what
  the declarations tell of it: the side its key and its entry each read alone, and whether a (key, entry) comes from
  one joined row at most (`unique_pairs`) and every row of an entry gives it the same body (`unique_body`).

`ListView(join, view)` turns a step's changes into operations. With a fan-out limit they come in three write
phases, each applied after the previous one, so that a reader between phases never misses or doubles an entry of a
value that crossed the limit (a reader drops duplicates by entry id):
1. new entry bodies; heavy entries added to or replaced (a value that became heavy first of all); heavy values added
   to keys' `.reads` sets;
2. the lists (a value that became heavy leaves them here, one that stopped being heavy enters them);
3. bodies of entries that stopped being live; heavy values removed from `.reads` sets; the heavy entries of values
   that stopped being heavy expire `RETIRE_SECONDS` later (a reader that read a `.reads` set just before may still
   read them).
In a batch of entries only, phase 1's bodies and heavy adds (`ListView.posts_ops`) are applied before the batch's
changes are counted, and phase 1 keeps the rest.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from joins.table import JoinChanges, TableJoin
from joins.table_list import GenericChanges, GenericList, ListChanges, ListPosts, ListShape, generic_list
from spec.model import View
from views.errors import ViewError
from views.list.sink import ENTRY_CARRY, as_ops, body_sql, member
from views.wire import bulk

__all__ = ["ListView", "join_lists", "list_caps", "list_shape", "generic_spec"]

_NUMBERS = ("tinyint", "smallint", "int", "bigint", "float", "double")


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
            as_ops(touched, "list", "_k", "'add'", "removes", "entries" if adding else "NULL"),
            as_ops(changes.replaces, "list", "_k", "'replace'", entries="entries._p"),
        ]
    return [as_ops(adds, "list", "_k", "'add'", entries="entries")] if adding else []


def _heavy_phases(changes: ListChanges, posted: bool) -> tuple[list[DataFrame], list[DataFrame]]:
    """(before, after): the heavy side's operations applied before the lists' (heavy entries, `follows` gained; the
    adds only when not `posted`) and after them (`follows` lost, heavy entries retired)."""
    n, heavy = changes.counts, changes.shape.heavy_text("_m")
    first, last = [], []
    if n["up"] or n["died"]:
        first.append(as_ops(changes.heavy_replaces, "heavy", heavy, "'replace'", entries="entries._p"))
    if n["born"] and not posted:
        first.append(as_ops(changes.heavy_adds, "heavy", heavy, "'add'", entries="entries._p"))
    for df, out, column, count in (
        (changes.heavy_gained, first, "entries", "heavy_gained"),
        (changes.heavy_lost, last, "removes", "heavy_lost"),
    ):
        if n[count]:
            per = df.groupBy("_k").agg(F.expr(f"collect_list({bulk(heavy)}) AS ids"))
            out.append(as_ops(per, "reads", "_k", **{column: "ids"}))
    if n["down"]:
        last.append(as_ops(changes.heavy_retired, "heavy", heavy, "'retire'"))
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
        return as_ops(self.join.eval(e, rows, exprs), "entry", "_e", body="_b")

    def posts_ops(self, posts: ListPosts) -> DataFrame:
        """The operations (LIST_OPS_SCHEMA) of a batch's `posts` (`joins.table.JoinStep.posts`): the bodies of entries
        that became live and the heavy values' entries added to, at most two per entry of the batch. They are part of
        the first write phase, taken out to be applied before the batch's changes are counted; the phases after them
        are `phases(changes, posted=True)`."""
        heavy = as_ops(posts.heavy_adds, "heavy", self.shape.heavy_text("_m"), "'add'", entries="entries._p")
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
            yield _union(_list_parts(got, True, True) + [as_ops(got.bodies, "entry", "_e", body="_b")]), None
            return
        got = changes.lists[self.view.name]
        yield from self._shape_phases(got, posted)

    def _shape_phases(self, got: ListChanges, posted: bool) -> Iterator[tuple[DataFrame, int | None]]:
        n = got.counts
        born = [self._bodies(got.entries_live)] if n["born"] and not posted else []
        removing, adding = bool(n["died"] or n["lost"]), bool(n["fanned"] or n["gained"])
        if got.heavy_gained is None:
            lists = _list_parts(got, removing, adding)
            dead = [as_ops(got.entries_dead, "entry", "_e")] if n["died"] or not (lists or born) else []
            yield _union(lists + born + dead), None if lists else n["born"] + n["died"]
            return
        first, last = _heavy_phases(got, posted)
        if born + first:  # bodies and heavy entries: one per entry or value; `.reads` sets: one per key
            yield _union(born + first), 2 * n["born"] + n["up"] + n["died"] + n["heavy_gained"]
        lists = _list_parts(got, removing, adding)
        if lists:
            yield _union(lists), None
        dead = [as_ops(got.entries_dead, "entry", "_e")] if n["died"] else []
        if dead + last:
            yield _union(dead + last), n["died"] + n["heavy_lost"] + n["down"]


def join_lists(join: TableJoin, views) -> list[ListView]:
    """A `ListView` for each list view among `views` (of a `join` job over `join`), in declared order."""
    return [ListView(join, v) for v in views if v.kind == "list"]


def list_caps(views) -> list[int]:
    """The `cap` of each list view among `views`."""
    return [v.cap for v in views if v.kind == "list"]


def list_shape(join: TableJoin, view: View, *, carry: str | None = None) -> ListShape | None:
    """The `ListShape` of list view `view` when it has that shape (see the module docstring), else None (the view is
    maintained by `generic_list`). `carry`: SQL over `_o` (the order value) and `_e` (the entry id)."""
    if view.where is not None or view.kind != "list":
        return None
    for side in (0, 1):
        e = 1 - side
        key_field = join.side_field(side, view.key[1])
        entry_field = join.side_field(e, view.entry)
        match_fields = {join.side_field(side, pair[side], own=True) for pair in join.match}
        if key_field is None or entry_field is None or None in match_fields:
            continue
        if join.topics[e].key != (entry_field,) or set(join.topics[side].key) != {key_field, *match_fields}:
            continue
        order, descending = view.order[0]
        if not join.reads_only(e, order) or not all(join.reads_only(e, sql) for _, sql in view.fields):
            continue
        return ListShape(
            name=view.name,
            side=side,
            key=view.key[1],
            entry=view.entry,
            order=order,
            descending=descending,
            cap=view.cap,
            order_type=join.type_of(e, order),
            match_type=join.type_of(e, join.match_sql(e), own=True),
            carry=carry,
            fanout_limit=view.fanout_limit,
            many_match=len(join.match) > 1,
        )
    return None


def _uniqueness(join: TableJoin, view: View) -> tuple[bool, bool]:
    """(unique_pairs, unique_body) of `view`, told from the declarations: the entry is side A's key and side B's
    match fields cover B's key (one joined row per entry), or the list key and B's match fields cover B's key and
    the fields read A only. Anything else is taken as not unique (every touched key is recomputed)."""
    for a in (0, 1):
        f, b = join.side_field(a, view.entry), 1 - a
        if f is None or join.topics[a].key != (f,):
            continue
        matched = {join.side_field(b, pair[b], own=True) for pair in join.match}
        if None in matched:
            continue
        if set(join.topics[b].key) <= matched:
            return True, True
        key_field = join.side_field(b, view.key[1])
        if key_field is not None and set(join.topics[b].key) <= {key_field, *matched}:
            return True, all(join.reads_only(a, sql) for _, sql in view.fields)
    return False, False


def generic_spec(
    join: TableJoin, view: View, *, carry: str | None = None, body: str | None = None
) -> GenericList:
    """The `GenericList` of list view `view` (its SQL in the view's naming; `carry` and `body` given by the view)."""
    unique_pairs, unique_body = _uniqueness(join, view)
    order, descending = view.order[0]
    return GenericList(
        name=view.name,
        key=view.key[1],
        entry=view.entry,
        order=order,
        descending=descending,
        cap=view.cap,
        order_type=join.view_type(order),
        where=view.where,
        carry=carry,
        body=body,
        key_side=join.one_side(view.key[1]),
        entry_side=join.one_side(view.entry),
        unique_pairs=unique_pairs,
        unique_body=unique_body,
    )
