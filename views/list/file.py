"""How a `list` view is declared in a pipeline file (`FILE`, `spec.viewfile`)."""

from __future__ import annotations

import builtins
import re

from spec.problems import Expr
from spec.viewfile import ViewCheck, ViewFile, WindowedKeys

__all__ = ["FILE"]

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
