"""The `log` view kind: the rows a log keeps (its fields and `_id`, where `where` holds), appends idempotent per
batch id, the export ordered by `_id`, a lookup of ids by a time range, and a generation with nothing committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from changelog.storage import as_lake
from tests.shophelp import SHOP
from views.frame import view_rows
from views.log import LogSink, export_log, log_key, log_path, log_rows, log_schema, time_field
from views.pipeline import parse_pipeline

ROWS = (
    "order_id string, customer_id string, region string, amount double, qty bigint, coupon string, "
    "customer_version string, ts bigint, "
    "_s1 struct<region:string,customer_id:string,tier:string,country:string,ts:bigint>, _version string, _id string"
)


@pytest.fixture(scope="module")
def shop():
    return parse_pipeline(SHOP, "shop.yml")


def test_appends_once_per_batch_and_exports_by_id(spark, tmp_path, shop):
    view = shop.views["orders_log"]
    rows = [
        ("o2", "c1", "eu", 1.0, 1, None, None, 200, ("eu", "c1", "gold", "DE", 90), "eu|c1@90", "o2"),
        ("o1", "c9", "us", 1.0, 1, None, "junk", 100, None, "junk", "o1"),
    ]
    out = log_rows(view_rows(spark.createDataFrame(rows, ROWS), shop, "orders_enriched"), view, shop)
    assert out.columns == [n for n, _ in view.fields] + ["_id"]
    sink = LogSink(
        spark, as_lake(tmp_path), log_schema(out), "orders_enriched-g1-orders_log", key=log_key(view.name, 1)
    )
    sink.write(out, 0)
    sink.write(out, 0)  # replayed after a crash: appended once
    assert list(export_log(spark, as_lake(tmp_path), view, 1)) == [
        {"order_id": "o1", "tier": None, "version": "junk", "ts": 100, "country": None, "customer_ts": None},
        {
            "order_id": "o2",
            "tier": "gold",
            "version": "eu|c1@90",
            "ts": 200,
            "country": "DE",
            "customer_ts": 90,
        },
    ]
    assert time_field(view, "ts") == "ts" and time_field(shop.views["last_order"], "amount") is None
    assert [r["_id"] for r in sink.ids("ts", 150, 250).collect()] == ["o2"]
    assert sorted(r["_id"] for r in sink.ids().collect()) == ["o1", "o2"]


def test_export_of_a_generation_whose_log_has_no_commit_yet_is_empty(spark, tmp_path, shop):
    """Between Spark making the output log's `_delta_log` and its version 0, the generation has published nothing:
    its export is empty, not an error."""
    view = shop.views["orders_log"]
    (Path(log_path(as_lake(tmp_path), view.name, 1)) / "_delta_log").mkdir(parents=True)
    assert list(export_log(spark, as_lake(tmp_path), view, 1)) == []
