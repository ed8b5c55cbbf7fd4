"""Aggregates of an agg view as the pipeline file writes them (`spec.sql.parse_aggregate`)."""

import re

import pytest

from spec.sql import Aggregate, parse_aggregate


@pytest.mark.parametrize(
    "text, func, expr, distinct",
    [
        ("count(*)", "count", None, False),
        ("COUNT( distinct rider_id )", "count", "rider_id", True),
        ("count(rating)", "count", "rating", False),
        ("sum(if(fare < 10, 1, 0))", "sum", "if(fare < 10, 1, 0)", False),
        ("min(fare)", "min", "fare", False),
        ("max(ts)", "max", "ts", False),
        ("avg(fare * 2)", "avg", "fare * 2", False),
        ("sum(')')", "sum", "')'", False),
    ],
)
def test_an_aggregate_is_read_as_its_function_expression_and_distinct(text, func, expr, distinct):
    assert parse_aggregate(text) == Aggregate(func, expr, distinct)


@pytest.mark.parametrize(
    "text, says",
    [
        ("sum(a) + sum(b)", "an aggregate is count(*)"),
        ("median(x)", "an aggregate is count(*)"),
        ("count()", "an aggregate is count(*)"),
        ("fare", "an aggregate is count(*)"),
        ("max(*)", "only count(*) counts rows"),
        ("sum(distinct x)", "only count takes distinct"),
    ],
)
def test_what_is_not_an_aggregate_is_said(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_aggregate(text)
