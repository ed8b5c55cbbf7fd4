"""The view kinds by the name a pipeline file gives them (`View.kind`), and how each is read: the one place that maps a
kind's name to its module's readers, so that `views.read` (and the CLI through it) never branches on a kind.

- `row`, `count`, `agg`, `list`: in Redis. `query(client, view, key, limit)` gives the key's entry (`{}` when it has
  none; `limit` bounds a list's items, the other kinds have one entry), `export(client, view, lake, spark)` every
  key's export line; both without Spark.
- `log`: an output log in the lake (`in_redis` false): no query; `export` reads the serving generation's log with
  Spark (`spark`, a callable returning a SparkSession, is called only then).
`items`: the name of a query result's list of items (a list view's `items_name`), None for a kind whose result is one
line.

Adding a view kind adds its entry here (its readers live in its module); see docs/extending.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from spec.model import View
from views.agg import export_aggs, query_agg
from views.count import export_counts, query_count
from views.list import export_list, query_list
from views.log import export_log
from views.redis_io import current_generation
from views.row import export_rows, query_row

__all__ = ["ViewKind", "KINDS", "view_kind"]


@dataclass(frozen=True)
class ViewKind:
    """How one view kind is read (see the module docstring)."""

    name: str
    export: Callable[..., Iterator[dict]]
    query: Callable[..., dict] | None = None
    in_redis: bool = True
    items: Callable[[View], str] | None = None


def _log_export(client, view: View, lake, spark) -> Iterator[dict]:
    return export_log(spark(), lake, view, current_generation(client, view.job))


KINDS: dict[str, ViewKind] = {
    k.name: k
    for k in (
        ViewKind(
            "row", lambda c, v, lake, spark: export_rows(c, v), lambda c, v, key, limit: query_row(c, v, key)
        ),
        ViewKind(
            "count",
            lambda c, v, lake, spark: export_counts(c, v),
            lambda c, v, key, limit: query_count(c, v, key),
        ),
        ViewKind(
            "agg", lambda c, v, lake, spark: export_aggs(c, v), lambda c, v, key, limit: query_agg(c, v, key)
        ),
        ViewKind(
            "list", lambda c, v, lake, spark: export_list(c, v), query_list, items=lambda v: v.items_name
        ),
        ViewKind("log", _log_export, in_redis=False),
    )
}


def view_kind(view: View) -> ViewKind:
    """The kind of `view` (every kind the pipeline model accepts is registered). A windowed count view is kept as an
    agg view of sums (`views.agg`) and read as one."""
    if view.kind == "count" and view.window is not None:
        return KINDS["agg"]
    return KINDS[view.kind]
