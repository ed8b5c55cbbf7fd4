"""`views.frame`: a job's rows as what a view sees (bare names, a struct per side topic, `_` columns kept), the
evaluation of a view's expressions, export lines that keep null fields, and an expression Spark cannot analyse as
one line naming the pipeline file, the line and key path, and the expression."""

from __future__ import annotations

import json

import pytest

from tests.shophelp import SHOP
from views.frame import ExpressionError, check_job, empty_rows, line_sql, mentions, select_view, view_rows
from views.pipeline import parse_pipeline

# the join layout of an asof job's rows: the stream's fields, the table's in `_s1`, `_version`, `_id`
ASOF_ROWS = (
    "order_id string, customer_id string, region string, amount double, qty bigint, coupon string, "
    "customer_version string, ts bigint, "
    "_s1 struct<region:string,customer_id:string,tier:string,country:string,ts:bigint>, _version string, _id string"
)


@pytest.fixture(scope="module")
def shop():
    return parse_pipeline(SHOP, "shop.yml")


def _asof_frame(spark, shop):
    rows = [
        ("o1", "c1", "eu", 12.5, 2, None, None, 100, ("eu", "c1", "gold", None, 90), "eu|c1@90", "o1"),
        ("o2", "c2", "us", 3.0, 1, "VIP", None, 200, None, None, "o2"),
    ]
    return view_rows(spark.createDataFrame(rows, ASOF_ROWS), shop, "orders_enriched")


def test_a_view_sees_bare_names_a_struct_per_topic_and_the_jobs_own_columns(spark, shop):
    frame = _asof_frame(spark, shop)
    bare = [n for n, _ in shop.row_columns("orders_enriched")]
    assert frame.columns[: len(bare)] == bare  # the stream's fields, the table's not in the stream, version
    assert {"orders", "customers", "_s1", "_version", "_id"} <= set(frame.columns)
    got = frame.selectExpr("ts", "customers.ts", "tier", "customers.tier", "orders.amount", "version", "_id")
    assert [tuple(r) for r in got.orderBy("_id").collect()] == [
        (100, 90, "gold", "gold", 12.5, "eu|c1@90", "o1"),
        (200, None, None, None, 3.0, None, "o2"),
    ]
    interval = view_rows(empty_rows(spark, shop, "paid"), shop, "paid")
    assert (
        "matches" in interval.columns and "orders" in interval.columns and "payments" not in interval.columns
    )


def test_select_view_casts_the_key_to_text_and_a_null_where_excludes(spark, shop):
    frame = _asof_frame(spark, shop)
    view = shop.views["last_order"]  # key concat(region, '/', customer_id), where amount >= 10
    got = select_view(frame, view, shop, keep=("_id",)).orderBy("_id").collect()
    assert [(r["_id"], r["_key"], r["_where"], r["tier"]) for r in got] == [
        ("o1", "eu/c1", True, "gold"),
        ("o2", "us/c2", False, None),
    ]
    counts = select_view(frame, shop.views["by_tier"], shop, parts=("key", "values"), keep=("_id",))
    assert [(r["_key"], r["orders"], r["amount"]) for r in counts.orderBy("_id").collect()] == [
        ("gold", 1, 12.5),
        ("none", 1, 3.0),
    ]


def test_an_export_line_keeps_null_fields_in_declared_order(spark, shop):
    frame = _asof_frame(spark, shop)
    view = shop.views["last_order"]
    lines = select_view(frame, view, shop, keep=("_id",)).selectExpr(f"{line_sql(view)} AS line", "_id")
    got = [r["line"] for r in lines.orderBy("_id").collect()]
    assert got[1] == '{"customer":"us/c2","order_id":"o2","tier":null,"ts":200}'
    assert list(json.loads(got[0])) == ["customer", "order_id", "tier", "ts"]


def _line_of(text: str, needle: str) -> int:
    return 1 + next(i for i, x in enumerate(text.splitlines()) if needle in x)


@pytest.mark.parametrize(
    "old, new, job, path",
    [
        ("payments: matches}", "payments: matchs + 1}", "paid", "jobs.paid.views.order_status.fields.payments"),
        ('where: "matches < 2"', 'where: "matches < nope"', "paid", "jobs.paid.views.few_payments.where"),
        ("row: {n: matches}", "row: {n: \"lenght(matches)\"}", "paid", "jobs.paid.views.by_payments.row.n"),
        ("qty: qty}", "qty: \"qty +\"}", "paid", "jobs.paid.views.paid_by_region.values.qty"),
        ("customer_ts: customers.ts}", "customer_ts: customers.tss + 1}", "orders_enriched",
         "jobs.orders_enriched.views.orders_log.log.fields.customer_ts"),
        ("match: {order_id: order_id}", "match: {\"upper(order_idd)\": order_id}", "paid",
         "jobs.paid.interval.match.upper(order_idd)"),
        ("values: {orders: 1, amount: amount}", "values: {orders: 1, amount: tier}", "orders_enriched",
         "jobs.orders_enriched.views.by_tier.values.amount"),
    ],
)  # fmt: skip
def test_an_expression_spark_cannot_use_is_one_line_naming_file_line_key_and_expression(
    spark, old, new, job, path
):
    assert old in SHOP
    text = SHOP.replace(old, new)
    with pytest.raises(ExpressionError) as e:
        check_job(spark, parse_pipeline(text, "shop.yml"), job)
    message = str(e.value)
    assert "\n" not in message and "at org.apache" not in message and "JVM" not in message
    assert message.startswith(f"shop.yml:{_line_of(text, new)}: {path}: ")
    assert e.value.where == f"shop.yml:{_line_of(text, new)}: {path}"


def test_every_expression_of_the_shop_and_the_builtin_pipeline_is_analysed_without_error(spark, shop):
    from views.pipeline import builtin_pipeline

    for job in shop.jobs:
        check_job(spark, shop, job)
    for job in ("clicks", "enrichment"):
        check_job(spark, builtin_pipeline(), job)


@pytest.mark.parametrize(
    "view, names, want",
    [
        ("few_payments", ["matches"], True),
        ("order_status", ["matches"], False),
        ("by_payments", ["MATCHES"], True),
    ],
)
def test_mentions_tells_whether_a_key_or_where_may_depend_on_a_column(shop, view, names, want):
    assert mentions(shop.views[view], names) is want


@pytest.mark.parametrize(
    "expr, says",
    [
        ("reflect('java.lang.System', 'getenv', 'HOME')", "Java"),
        ("upper(`java_method`('java.lang.System', 'getenv', 'HOME'))", "Java"),
        ("(SELECT max(value) FROM text.`/etc/hostname`)", "subquery"),
        ("order_id IN (SELECT v FROM VALUES ('o1') AS t(v))", "subquery"),
    ],
)
def test_a_job_refuses_java_calls_and_subqueries_check_did_not_see(spark, shop, expr, says):
    """`mview check` refuses these too (`spec.sql`); a pipeline that reaches a job another way is refused when the
    job starts, by Spark's own parse of each expression, before a record is read."""
    import dataclasses

    job = shop.jobs["paid"]
    view = dataclasses.replace(job.views[0], fields=((*job.views[0].fields, ("leak", expr))))
    jobs = {**shop.jobs, "paid": dataclasses.replace(job, views=(view, *job.views[1:]))}
    with pytest.raises(ExpressionError) as e:
        check_job(spark, dataclasses.replace(shop, jobs=jobs), "paid")
    assert says in e.value.reason and e.value.expression == expr
    assert e.value.where == shop.where("jobs", "paid", "views", view.name, "fields", "leak")
