"""The view kinds by the name a pipeline file gives them (`View.kind`): the one place that maps a kind's name to its
module, so that nothing else branches on a kind. Each kind's module declares how it is declared in a pipeline file
(`file`: its keys, the job kinds it serves, its checks; `spec.viewfile`), and its readers:

- `row`, `count`, `agg`, `list`: in Redis. `query(client, view, key, limit)` gives the key's entry (`{}` when it has
  none; `limit` bounds a list's items, the other kinds have one entry), `export(client, view, lake, spark)` every
  key's export line; both without Spark.
- `log`: an output log in the lake (`in_redis` false): no query; `export` reads the serving generation's log with
  Spark (`spark`, a callable returning a SparkSession, is called only then).
`items`: the name of a query result's list of items (a list view's `items_name`), None for a kind whose result is one
line. `check(frame, view, pipeline)`: the kind's analysis of a view's expressions on a job's empty rows, when the
job starts (`views.frame.check_job`). `state(spark, lake, pipeline, job, state_key, **kw)`: the views of a job that
keep their own state on the lake, for a kind that keeps one (`views.changes.state_views`).

`commands`: for a kind whose batch changes are Redis commands made from a frame of the job's rows (`Commands`), how:
its views' commands go out with every such view's in one Spark job (`views.changes.DeltaViews`).

`FILES`: the kinds' file declarations, what the loader takes (`views.pipeline`).

Adding a view kind adds its entry here (its file declaration and readers live in its module); see
docs/extending.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from spec.model import View
from spec.viewfile import ViewFile
from views import agg, count, log, row
from views import list as list_
from views.frame import check_sums, check_view
from views.redis_io import current_generation

__all__ = ["ViewKind", "Commands", "KINDS", "FILES", "view_kind"]


@dataclass(frozen=True)
class Commands:
    """How the views of a kind take a batch as Redis commands (see the module docstring). `sink(url, view,
    generation, fence)`: the view's `views.sink.CommandSink`. `reading`: which of a job's two readings of its rows
    the view's changes come from, `"shown"` (a row's entry while it is shown) or `"counted"` (a row's values times
    its sign while it counts), and `changes(frame, view, pipeline)` that reading when the job gives none of its own.
    `scripts`: the Lua scripts its commands call (`views.wire.forward` loads them)."""

    sink: Callable[..., object]
    reading: str
    changes: Callable[..., object]
    scripts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ViewKind:
    """How one view kind is read (see the module docstring)."""

    file: ViewFile
    export: Callable[..., Iterator[dict]]
    query: Callable[..., dict] | None = None
    in_redis: bool = True
    items: Callable[[View], str] | None = None
    check: Callable[..., None] = check_view
    state: Callable[..., list] | None = None
    commands: Commands | None = None

    @property
    def name(self) -> str:
        return self.file.name


def _log_export(client, view: View, lake, spark) -> Iterator[dict]:
    return log.export_log(spark(), lake, view, current_generation(client, view.job))


KINDS: dict[str, ViewKind] = {
    k.name: k
    for k in (
        ViewKind(
            row.FILE,
            lambda c, v, lake, spark: row.export_rows(c, v),
            lambda c, v, key, limit: row.query_row(c, v, key),
            commands=Commands(
                lambda url, v, g, fence: row.RowSink(url, v.name, g, fence), "shown", row.row_delta
            ),
            state=row.row_tables,  # only for a view another job reads as a table
        ),
        ViewKind(
            count.FILE,
            lambda c, v, lake, spark: count.export_counts(c, v),
            lambda c, v, key, limit: count.query_count(c, v, key),
            check=check_sums,  # a windowed or table-read count view keeps its state as agg views do (`view_kind`)
            commands=Commands(count.CountSink, "counted", count.count_delta, (count.COUNT_LUA,)),
        ),
        ViewKind(
            agg.FILE,
            lambda c, v, lake, spark: agg.export_aggs(c, v),
            lambda c, v, key, limit: agg.query_agg(c, v, key),
            check=agg.check_agg,
            state=agg.agg_views,
        ),
        ViewKind(
            list_.FILE,
            lambda c, v, lake, spark: list_.export_list(c, v),
            list_.query_list,
            items=lambda v: v.items_name,
            state=list_.list_views,
        ),
        ViewKind(log.FILE, _log_export, in_redis=False),
    )
}
FILES: dict[str, ViewFile] = {name: k.file for name, k in KINDS.items()}


def view_kind(view: View) -> ViewKind:
    """The kind of `view` (every kind the pipeline model accepts is registered). A count view with a window, or read
    as a table by another job, is kept as an agg view of sums (`views.agg.kept_as_agg`) and read as one."""
    if agg.kept_as_agg(view):
        return KINDS["agg"]
    return KINDS[view.kind]
