"""Which of a `join` job's list algorithms (`joins.table_list`) maintains a list view, and the join-level spec it runs
with, told from the view's declaration (`spec.model.View`, kind `list`) and the join's (`joins.table.TableJoin`).

- `list_shape`: the join's own list algorithm (`ListShape`) when the view has that shape: no `where`, its list key
  one field of a side (the *list side*) and its entry the other side's key (the *entry side*), the list key and the
  list side's match fields exactly the list side's key (one list-side row per list key and match value), its order
  and its fields over the entry side only (an entry's body is the entry side's row). Either side may be the list
  side, the left tried first.
- `generic_spec`: any list view, maintained from the join's delta (`GenericList`, run by `generic_list`), with what
  the declarations tell of it: the side its key and its entry each read alone, and whether a (key, entry) comes from
  one joined row at most (`unique_pairs`) and every row of an entry gives it the same body (`unique_body`).
"""

from __future__ import annotations

from joins.table import TableJoin
from joins.table_list import GenericList, ListShape
from spec.model import View

__all__ = ["list_shape", "generic_spec"]


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
