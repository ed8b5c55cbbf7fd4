"""The registry of view kinds (`views.kinds`) and the reads that go through it (`views.read`)."""

from __future__ import annotations

import typing

import pytest

from spec.model import View
from views.errors import ViewError
from views.kinds import KINDS, view_kind
from views.read import export_view, format_result, query_view
from views.redis_io import connect


def test_every_kind_a_pipeline_file_accepts_has_its_readers():
    assert set(KINDS) == set(typing.get_args(typing.get_type_hints(View)["kind"]))
    for name, kind in KINDS.items():
        assert kind.name == name
        assert (kind.query is None) == (not kind.in_redis)  # a kind in Redis answers a query; a log does not


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
