"""The read side of every view: `query_view` (one key) and `export_view` (all keys), by the view's kind.

A view is looked up in the pipeline (`views.pipeline.default_pipeline`: `MVIEW_PIPELINE` or the built-in one, unless
the caller passes one) and read by its kind (`views.kinds`), never by its name:
- `row` (`views.row`), `count` (`views.count`), `agg` (`views.agg`), `list` (`views.list`): from Redis, without
  Spark;
- `log` (`views.log`): an output log in the lake, exported with Spark; it has no query.
Readers resolve the job's serving generation first, so a replay that switches generations is seen atomically.

`format_result` is the plain (not `--json`) output of a query: each row or list entry through the view's `show`
template (`str.format` with the line's names) when it has one, else the result's JSON; nothing for an empty result.
Control characters in the data are shown escaped (`printable`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from changelog.storage import Lake
from spec.model import Pipeline, View
from views.errors import UnknownView, ViewError, WrongJob, WrongViewKind
from views.kinds import view_kind
from views.pipeline import default_pipeline

__all__ = ["query_view", "export_view", "format_result", "printable", "resolve_view"]


def resolve_view(
    view: str | View, pipeline: Pipeline | None = None, *, job: str | None = None, kind: str | None = None
) -> View:
    """`view` itself, or the view of that name in `pipeline` (default: `views.pipeline.default_pipeline()`): raises
    `UnknownView` for a name the pipeline lacks, `WrongJob` when `job` is given and is not the view's job, and
    `WrongViewKind` when `kind` is given and is not the view's kind. A reader needs no job: the view's is used."""
    if not isinstance(view, View):
        views = (pipeline or default_pipeline()).views
        if view not in views:
            raise UnknownView(view, tuple(views))
        view = views[view]
    if job is not None and job != view.job:
        raise WrongJob(view.name, job, view.job)
    if kind is not None and kind != view.kind:
        raise WrongViewKind(view.name, view.kind, kind)
    return view


def query_view(
    client, view: str | View, key: str, *, limit: int | None = None, job: str | None = None, pipeline=None
) -> dict:
    """The view's entry for `key` by kind, `{}` when the key has none (every kind alike; a list: no item to show).
    `job`: the view's job (default: the one the pipeline says; given, it must be that one)."""
    v = resolve_view(view, pipeline, job=job)
    kind = view_kind(v)
    if kind.query is None:
        raise ViewError(f"{v.name} is an output log, not a Redis view: use `mview export {v.name}`")
    return kind.query(client, v, key, limit)


def export_view(
    client,
    view: str | View,
    *,
    job: str | None = None,
    lake: Lake | None = None,
    spark=None,
    pipeline=None,
) -> Iterator[dict]:
    """Every key of the view as export lines, by kind. A log view is an output log in the lake: it needs `lake`
    (a `changelog.storage.Lake`, e.g. `Settings.lake`) and `spark`, a callable returning a SparkSession, called only for such a view."""
    v = resolve_view(view, pipeline, job=job)
    kind = view_kind(v)
    if not kind.in_redis and lake is None:
        raise ViewError(f"{v.name} is an output log in the lake: pass the lake to export it")
    return kind.export(client, v, lake, spark)


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}
_CONTROL.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})


def printable(text) -> str:
    """`text` with every control character (C0, DEL, C1: terminal escape sequences among them) shown as `\\xNN`,
    so printing data from a view can never drive the reader's terminal."""
    return str(text).translate(_CONTROL)


def format_result(view: str | View, result: dict, *, pipeline=None) -> str:
    """Human-readable form of a query result (see the module docstring); empty string for an empty result."""
    if not result:
        return ""
    v = resolve_view(view, pipeline)
    items_name = view_kind(v).items
    if items_name is not None:
        items = result.get(items_name(v), [])
        if v.show is None:
            return "\n".join(printable(json.dumps(item)) for item in items)
        return "\n".join(printable(v.show.format(**item)) for item in items)
    if v.show is None:
        return printable(json.dumps(result))
    return printable(v.show.format(**result))
