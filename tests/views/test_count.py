"""The `count` view kind: its changes (sums per key over the counted rows, signed, integer or double), the fenced
sink from the executors or the driver (a replayed step counts once, an older step adds nothing, a key whose sums
are all 0 is absent but keeps its fence), query and export formats with the types kept, the CLI; on a
redis-server and on a Redis Cluster."""

from __future__ import annotations

import json

import pytest

from jobs.ops.cli import main
from tests.shophelp import SHOP
from views.count import CountRows, CountSink, count_changes, export_counts, query_count, value_types
from views.frame import view_rows
from views.pipeline import builtin_pipeline, parse_pipeline
from views.redis_io import connect, set_generation

LEFT = (
    "order_id string, customer_id string, region string, amount double, qty bigint, coupon string, "
    "customer_version string, ts bigint, _matches bigint, _closed boolean, _removed boolean, _id string"
)


@pytest.fixture(scope="module")
def shop():
    return parse_pipeline(SHOP, "shop.yml")


@pytest.mark.parametrize(
    "counted, sign, want",
    [
        ("true", None, {"eu": (3, 2, 17.5, 6), "us": (1, 0, 0.25, 1)}),
        ("_closed", None, {"eu": (2, 1, 12.5, 4)}),  # what an interval job counts: closed left events
        ("true", "CASE WHEN _removed THEN -1 ELSE 1 END", {"eu": (1, 2, 12.5, 2), "us": (1, 0, 0.25, 1)}),
    ],
)
def test_changes_sum_the_values_of_the_counted_rows_per_key(spark, shop, counted, sign, want):
    rows = [
        ("o1", "c", "eu", 10.0, 2, None, None, 1, 1, True, False, "o1"),
        ("o2", "c", "eu", 2.5, 2, None, None, 1, 0, True, True, "o2"),
        ("o3", "c", "eu", 5.0, 2, None, None, 1, 2, False, False, "o3"),
        ("o4", "c", "us", 0.25, 1, None, None, 1, 0, False, False, "o4"),
    ]
    frame = view_rows(spark.createDataFrame(rows, LEFT), shop, "paid")
    view = shop.views["paid_by_region"]  # orders: 1, paid: if(matches > 0, 1, 0), amount (double), qty (long)
    got = count_changes(frame, view, shop, counted=counted, sign=sign)
    assert value_types(got, view) == "iifi"
    assert {r["key"]: (r["orders"], r["paid"], r["amount"], r["qty"]) for r in got.collect()} == want


def test_fenced_sink_from_executors_and_driver_zero_sums_and_types(spark, redis_url, shop):
    client = connect(redis_url)
    set_generation(client, "paid", 1)
    view = shop.views["paid_by_region"]
    sink = CountSink(redis_url, view, 1)
    schema = "key string, orders bigint, paid bigint, amount double, qty bigint"
    step = spark.createDataFrame([("eu", 2, 1, 12.5, 3), ("a|b {x}", 1, 0, 0.25, 1)], schema).repartition(2)
    sink.write(step, 1_000_000)
    sink.write(step, 1_000_000)  # replayed after a crash: counted once
    assert sink.write(CountRows([("eu", 1, 1, 1.0, 1)], "iifi"), 999_999) == {
        "keys": 0
    }  # an older step adds nothing
    want = {"region": "eu", "orders": 2, "paid": 1, "amount": 12.5, "qty": 3}
    assert query_count(client, view, "eu") == {**want, "generation": 1}
    assert isinstance(query_count(client, view, "eu")["amount"], float)
    assert list(export_counts(client, view)) == [
        {"region": "a|b {x}", "orders": 1, "paid": 0, "amount": 0.25, "qty": 1},
        want,
    ]
    # a step that brings every sum of a key to 0: the key is absent, and a replay of that step adds nothing
    back = [("a|b {x}", -1, 0, -0.25, -1)]
    assert sink.write(CountRows(back, "iifi"), 2_000_000) == {"keys": 1}
    assert sink.write(CountRows(back, "iifi"), 2_000_000) == {"keys": 0}
    assert query_count(client, view, "a|b {x}") == {}
    assert [r["region"] for r in export_counts(client, view)] == ["eu"]
    assert sink.write(CountRows([("a|b {x}", 1, 1, 1.5, 2)], "iifi"), 3_000_000) == {
        "keys": 1
    }  # and comes back
    assert query_count(client, view, "a|b {x}")["amount"] == 1.5


@pytest.mark.parametrize("redis_url", ["server"], indirect=True)
def test_the_cli_reads_a_count_view_by_its_kind_with_its_show_template(spark, redis_url, monkeypatch, capsys):
    client = connect(redis_url)
    set_generation(client, "enrichment", 1)
    view = builtin_pipeline().views["activity_by_country"]
    assert CountSink(redis_url, view, 1).write(CountRows([("NL", 3), ("unknown", 1)], "i"), 0) == {"keys": 2}
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert main(["query", "activity_by_country", "NL", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"country": "NL", "events": 3, "generation": 1}
    assert main(["query", "activity_by_country", "NL"]) == 0
    assert capsys.readouterr().out == "NL  3\n"  # the view's `show`
    assert main(["query", "activity_by_country", "DE"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["query", "activity_by_country", "DE", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {}
    assert main(["export", "activity_by_country"]) == 0
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [
        {"country": "NL", "events": 3},
        {"country": "unknown", "events": 1},
    ]
