"""`spec.viewtable`: the type of a view's expression over its job's rows (what a topic read from the view holds), and
the fields of each view kind read as a topic (each kind's `topic`, `views.kinds`). The table of expressions doubles
as the reference of what is told."""

from __future__ import annotations

import pytest

from spec.model import Topic, View, Window
from spec.viewtable import BATCH, expr_type, table_key
from views.kinds import FILES

ORDERS = Topic(
    "orders",
    (("order_id", "id"), ("amount", "double"), ("n", "long"), ("ts", "timestamp"), ("tier", "string")),
    "ts",
    id=("order_id",),
)
CUSTOMERS = Topic(
    "customers", (("customer_id", "id"), ("tier", "string"), ("vip", "boolean"), ("ts", "timestamp")), "ts",
    key=("customer_id",),
)  # fmt: skip
SEEN = {"orders": ORDERS, "customers": CUSTOMERS}

# (expression, its type; None: not told)
TYPES = [
    ("order_id", "string"),  # an id is a string
    ("amount", "double"),
    ("`n`", "long"),
    ("ts", "timestamp"),
    ("tier", "string"),  # a bare name is the first side's
    ("customers.vip", "boolean"),
    ("orders.n", "long"),
    ("nope", None),
    ("customers.nope", None),
    ("1", "long"),
    ("-3", "long"),
    ("1.5", "double"),
    ("'x'", "string"),
    ("true", "boolean"),
    ("amount > 10", "boolean"),
    ("n = 1 AND vip", "boolean"),
    ("NOT vip", "boolean"),
    ("tier IS NULL", "boolean"),
    ("n BETWEEN 1 AND 3", "boolean"),
    ("tier LIKE 'g%'", "boolean"),
    ("n + 1", "long"),
    ("n * amount", "double"),
    ("n / 2", "double"),
    ("(n + 1) * 2", "long"),
    ("(n) + (amount)", "double"),
    ("ts + 1000", "timestamp"),
    ("n + nope", None),
    ("CAST(n AS double)", "double"),
    ("cast(amount as bigint)", "long"),
    ("CAST(n AS string)", "string"),
    ("coalesce(tier, 'none')", "string"),
    ("coalesce(amount, 0)", "double"),
    ("if(n > 0, 1, 0)", "long"),
    ("if(vip, 'gold', tier)", "string"),
    ("CASE WHEN n > 1 THEN 'many' ELSE 'one' END", "string"),
    ("lower(tier)", "string"),
    ("concat(tier, '-', order_id)", "string"),
    ("length(tier)", "long"),
    ("sqrt(amount)", "double"),
    ("round(amount, 2)", "double"),
    ("greatest(n, 3)", "long"),
    ("some_udf(n)", None),
    ("'a > b'", "string"),  # an operator inside a literal is not one
]


@pytest.mark.parametrize(("expr", "want"), TYPES, ids=[e for e, _ in TYPES])
def test_the_type_of_an_expression_is_told_where_it_can_be(expr, want):
    assert expr_type(expr, SEEN) == want


def view_fields(view: View, seen) -> list:
    return FILES[view.kind].topic(view, seen)


def _view(kind: str, **kw) -> View:
    return View("v", "j", kind, key=("customer_id", "customer_id"), **kw)


def test_a_row_view_reads_as_its_key_and_fields():
    v = _view("row", fields=(("tier", "tier"), ("big", "amount > 100"), ("odd", "mystery(n)")))
    assert view_fields(v, SEEN) == [
        ("customer_id", "string"), ("tier", "string"), ("big", "boolean"), ("odd", None)
    ]  # fmt: skip
    assert table_key(v) == ("customer_id",)


def test_a_count_view_sums_longs_or_doubles_and_counts_a_condition_as_a_long():
    v = _view("count", values=(("orders", "1"), ("spent", "amount"), ("vips", "vip"), ("names", "tier")))
    assert view_fields(v, SEEN) == [
        ("customer_id", "string"), ("orders", "long"), ("spent", "double"), ("vips", "long"), ("names", None)
    ]  # fmt: skip


def test_an_agg_view_counts_as_longs_averages_as_doubles_and_keeps_the_type_of_sum_min_max():
    v = _view(
        "agg",
        values=(
            ("n", "count(*)"),
            ("kinds", "count(distinct tier)"),
            ("mean", "avg(n)"),
            ("total", "sum(n)"),
            ("top", "max(amount)"),
            ("first", "min(ts)"),
            ("name", "max(tier)"),
        ),
    )
    assert view_fields(v, SEEN)[1:] == [
        ("n", "long"), ("kinds", "long"), ("mean", "double"), ("total", "long"), ("top", "double"),
        ("first", "timestamp"), ("name", "string"),
    ]  # fmt: skip


def test_a_windowed_view_adds_its_window_and_is_keyed_by_key_and_start():
    v = _view("agg", values=(("n", "count(*)"),), window=Window("tumble", 60_000))
    assert [n for n, _ in view_fields(v, SEEN)] == [
        "customer_id", "n", "window_start", "window_end", "final"
    ]  # fmt: skip
    assert table_key(v) == ("customer_id", "window_start")
    assert BATCH not in dict(view_fields(v, SEEN))


def test_a_log_view_reads_as_its_fields_only_and_as_events():
    v = View("v", "j", "log", fields=(("id", "order_id"), ("at", "ts")))
    assert view_fields(v, SEEN) == [("id", "string"), ("at", "timestamp")]
    assert FILES["log"].events and not any(FILES[k].events for k in ("row", "count", "agg"))


def test_a_list_view_is_not_read_as_a_topic():
    assert FILES["list"].topic is None
