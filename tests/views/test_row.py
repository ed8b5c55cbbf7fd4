"""The `row` view kind: its changes from a job's rows (a semantics table over an interval job's steps), the sink
(absolute content: a replayed batch has the effect of one; removals), greatest-row-wins at read time, query and
export formats, the CLI; on a redis-server and on a Redis Cluster."""

from __future__ import annotations

import json

import pytest

from jobs.ops.cli import main
from tests.shophelp import SHOP
from views.frame import view_rows
from views.pipeline import builtin_pipeline, parse_pipeline
from views.redis_io import connect, set_generation
from views.row import ROW_CHANGES, RowSink, export_rows, pick_row, query_row, row_changes
from views.sink import ListSink

# an interval job's left rows after a step: the left topic's fields and the join's own columns
LEFT = (
    "order_id string, customer_id string, region string, amount double, qty bigint, coupon string, "
    "customer_version string, ts bigint, _matches bigint, _matches_before bigint, _new boolean, "
    "_closed boolean, _id string"
)
SHOWN = "_matches > 0 OR (_closed AND true)"  # what the interval job shows with `unmatched: true`
BEFORE = "NOT _new AND _matches_before > 0"


@pytest.fixture(scope="module")
def shop():
    return parse_pipeline(SHOP, "shop.yml")


def _changes(spark, shop, view: str, before: int, after: int, new: bool, closed: bool) -> list:
    row = ("o1", "c1", "eu", 12.5, 2, None, None, 100, after, before, new, closed, "o1")
    frame = view_rows(spark.createDataFrame([row], LEFT), shop, "paid")
    rebind = {"matches": "_matches_before"}
    got = row_changes(frame, shop.views[view], shop, shown=SHOWN, final="_closed", before=rebind,
                      shown_before=BEFORE)  # fmt: skip
    return [(r["key"], None if r["body"] is None else json.loads(r["body"])) for r in got.collect()]


def _line(key, n, final, view="few_payments"):
    if view == "few_payments":
        return [final, {"order_id": key, "payments": n}]
    return [final, {"n": str(n), "order_id": "o1", "amount": 12.5}]


@pytest.mark.parametrize(
    "view, before, after, new, closed, want",
    [
        # a new order with no payment and its window open: nothing yet
        ("few_payments", 0, 0, True, False, []),
        # its first payment: shown at once, not final
        ("few_payments", 0, 1, True, False, [("o1", _line("o1", 1, False))]),
        # its window closes without a new payment: the final entry
        ("few_payments", 1, 1, False, True, [("o1", _line("o1", 1, True))]),
        # never paid, window closed (`unmatched: true`): shown once, final
        ("few_payments", 0, 0, False, True, [("o1", _line("o1", 0, True))]),
        # a second payment: the `where` (matches < 2) no longer holds, the entry goes
        ("few_payments", 1, 2, False, False, [("o1", None)]),
        # a key over `matches`: the row moves from key "1" to key "2"
        ("by_payments", 1, 2, False, False, [("1", None), ("2", _line("o1", 2, False, "by"))]),
        # first seen with two payments: only the new key
        ("by_payments", 0, 2, True, False, [("2", _line("o1", 2, False, "by"))]),
    ],
)
def test_changes_of_an_interval_jobs_row_view(spark, shop, view, before, after, new, closed, want):
    assert _changes(spark, shop, view, before, after, new, closed) == want


def test_sink_applies_absolute_content_and_reads_the_greatest_row_per_key(spark, redis_url, shop):
    client = connect(redis_url)
    set_generation(client, "paid", 1)
    view, sink = shop.views["by_payments"], RowSink(redis_url, "by_payments", 1)

    def body(oid, amount, final):
        return json.dumps([final, {"n": "1", "order_id": oid, "amount": amount}], separators=(",", ":"))

    batch = spark.createDataFrame(
        [
            ("1", "o1", body("o1", 5.0, False)),
            ("1", "o2", body("o2", 1.0, True)),
            ("2", "o3", body("o3", 2.0, None)),
        ],
        ROW_CHANGES,
    )
    sink.write(batch, 7)
    sink.write(batch, 7)  # replayed after a crash: the same content
    assert query_row(client, view, "1") == {
        "n": "1",
        "order_id": "o2",
        "amount": 1.0,
        "final": True,
        "generation": 1,
    }
    assert query_row(client, view, "2") == {"n": "1", "order_id": "o3", "amount": 2.0, "generation": 1}
    sink.write(
        spark.createDataFrame([("1", "o2", None)], ROW_CHANGES), 8
    )  # o2's entry goes: o1 is the greatest
    assert query_row(client, view, "1")["order_id"] == "o1"
    assert [r["order_id"] for r in export_rows(client, view)] == ["o1", "o3"]
    assert query_row(client, view, "nope") == {}
    ListSink().write(batch, 1)  # the change schema is a plain DataFrame: any sink takes it


@pytest.mark.parametrize(
    "lines, want",
    [
        ([("a", [None, {"k": "x", "f": None}]), ("b", [None, {"k": "x", "f": 1}])], "b"),  # null is smallest
        (
            [("a", [None, {"k": "x", "f": 2.5}]), ("b", [None, {"k": "x", "f": float("nan")}])],
            "b",
        ),  # NaN greatest
        ([("a", [None, {"k": "x", "f": "b"}]), ("b", [None, {"k": "x", "f": "a"}])], "a"),
        ([("a", [None, {"k": "x", "f": 1}]), ("b", [None, {"k": "x", "f": 1}])], "b"),  # a tie: the identity
        (
            [("a", [None, {"k": "x", "f": [1, 2]}]), ("b", [None, {"k": "x", "f": [1, 10]}])],
            "a",
        ),  # by JSON text
    ],
)
def test_greatest_row_wins_by_fields_in_declared_order(lines, want):
    view = parse_pipeline(SHOP, "shop.yml").views["few_payments"]
    view = type(view)(**{**view.__dict__, "fields": (("f", "x"),)})
    entries = {k.encode(): json.dumps(v) for k, v in lines}
    final, line = pick_row(entries, view)
    assert json.dumps(line) == json.dumps(dict(lines)[want][1])  # (as text: NaN is not equal to itself)


@pytest.mark.parametrize("redis_url", ["server"], indirect=True)
def test_the_cli_reads_a_row_view_by_its_kind(spark, redis_url, monkeypatch, capsys):
    client = connect(redis_url)
    set_generation(client, "clicks", 1)
    line = {"search_id": "s1", "session_id": "a", "query": "q {x}", "ts": 5, "clicked": True, "clicks": 2}
    body = json.dumps([True, line], separators=(",", ":"))
    RowSink(redis_url, "search_clicks", 1).write(spark.createDataFrame([("s1", "s1", body)], ROW_CHANGES), 1)
    assert query_row(client, builtin_pipeline().views["search_clicks"], "s1") == {
        **line,
        "final": True,
        "generation": 1,
    }
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert main(["query", "search_clicks", "s1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {**line, "final": True, "generation": 1}
    assert main(["query", "search_clicks", "nope"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["export", "search_clicks"]) == 0
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [line]
