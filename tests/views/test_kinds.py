"""The registry of view kinds (`views.kinds`) and the reads that go through it (`views.read`)."""

from __future__ import annotations

import functools
import importlib

import pytest

from spec.errors import PipelineError
from spec.model import View
from views.errors import ViewError
from views.kinds import FILES, KINDS, view_kind
from views.pipeline import parse_pipeline
from views.read import export_view, format_result, query_view
from views.redis_io import connect


def _of_module(module: str, f) -> bool:
    """Whether `f` is of `module`, or of a part of it when the kind is a package (`views.list`)."""
    return f.__module__ == module or f.__module__.startswith(f"{module}.")


def test_every_kind_is_one_module_that_declares_its_file_keys_and_its_readers():
    assert list(KINDS) == ["row", "count", "agg", "list", "log"]
    for name, kind in KINDS.items():
        module = importlib.import_module(f"views.{name}")
        own = functools.partial(_of_module, module.__name__)
        assert kind.name == name and kind.file is module.FILE

        assert own(kind.file.read) and own(kind.file.keys)
        assert name in kind.file.key_names  # the kind's own key is named as the kind
        assert (kind.query is None) == (not kind.in_redis)  # a kind in Redis answers a query; a log does not
        readers = [kind.export] + ([kind.query] if kind.query else [])
        assert all(own(f) or f.__module__ == "views.kinds" for f in readers)
        # its check and its state are its module's, or the shared ones of `views.frame` (no state: none)
        assert own(kind.check) or kind.check.__module__ == "views.frame"
        assert kind.state is None or own(kind.state)


def test_the_loader_knows_every_registered_kind_and_no_other():
    assert FILES == {name: kind.file for name, kind in KINDS.items()}
    with pytest.raises(PipelineError, match="a view has exactly one of `row`, `count`, `agg`, `list`, `log`"):
        parse_pipeline(
            "topics: {t: {fields: {id: string, ts: timestamp}, time: ts, id: id}}\n"
            "jobs: {j: {select: {from: t}, views: {v: {gauge: {id: id}}}}}\n",
            "p.yml",
            {},
        )


@pytest.mark.parametrize(
    "kind, result, want",
    [
        ("row", {"user_id": "u1", "n": 2}, '{"user_id": "u1", "n": 2}'),
        ("list", {"user_id": "u1", "items": [{"id": "a"}, {"id": "b"}]}, '{"id": "a"}\n{"id": "b"}'),
        ("list", {}, ""),
    ],
)
def test_a_result_is_shown_as_its_kind_says(kind, result, want):
    view = View(name="v", job="j", kind=kind, key=("user_id", "user_id"), items="items")
    assert view_kind(view).name == kind
    assert format_result(view, result) == want


def test_a_log_view_has_no_query_and_its_export_needs_the_lake(redis_url):
    view = View(name="trail", job="j", kind="log", fields=(("id", "id"),))
    client = connect(redis_url)
    with pytest.raises(ViewError, match="output log"):
        query_view(client, view, "k")
    with pytest.raises(ViewError, match="pass the lake"):
        export_view(client, view)
