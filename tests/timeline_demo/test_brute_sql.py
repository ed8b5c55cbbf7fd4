"""The brute force's Spark SQL expressions: SQL's corners (three-valued logic, integer vs double arithmetic, byte
order of strings, ANSI errors) and a clear refusal of anything outside the small language. No Spark."""

from __future__ import annotations

import math

import pytest

from timeline_demo.brute_sql import ExprError, cast_string, compile_expr, order_key, sql_compare

COLS = {
    "a": "bigint",
    "b": "double",
    "s": "string",
    "n": "bigint",
    "ns": "string",
    "t": "boolean",
    "f": "boolean",
    "u": "boolean",
    "orders.tier": "string",
}
ROW = {
    "a": 7,
    "b": 2.5,
    "s": "héllo",
    "n": None,
    "ns": None,
    "t": True,
    "f": False,
    "u": None,
    "orders.tier": "gold",
}


def ev(text: str, row=None):
    return compile_expr(text, COLS)(ROW if row is None else row)


@pytest.mark.parametrize(
    "text, want",
    [
        # three-valued logic: null is unknown
        ("t AND u", None),
        ("f AND u", False),
        ("u AND f", False),
        ("t OR u", True),
        ("u OR t", True),
        ("f OR u", None),
        ("NOT u", None),
        ("NOT f", True),
        ("n = 1", None),
        ("n = n", None),
        ("n <=> n", True),
        ("n <=> 1", False),
        ("n IS NULL", True),
        ("a IS NOT NULL", True),
        ("s IN ('x', 'héllo')", True),
        ("s IN ('x', null)", None),
        ("s NOT IN ('x', null)", None),
        ("s NOT IN ('x', 'y')", True),
        ("ns IN ('x')", None),
        ("a BETWEEN 7 AND 8", True),
        ("a NOT BETWEEN 1 AND 6", True),
        ("n BETWEEN 1 AND 2", None),
        ("if(u, 1, 2)", 2),  # a null condition takes the else branch
        ("CASE WHEN u THEN 'x' WHEN a > 1 THEN 'y' END", "y"),
        ("CASE WHEN f THEN 'x' END", None),
        ("CASE a WHEN 7 THEN 'seven' ELSE 'other' END", "seven"),
        ("coalesce(ns, ns, 'z')", "z"),
        ("coalesce(n)", None),
    ],
)
def test_null_logic(text, want):
    assert ev(text) == want


@pytest.mark.parametrize(
    "text, want, type_",
    [
        ("a / 2", 3.5, "double"),  # `/` is always a double division in Spark
        ("6 / 3", 2.0, "double"),
        ("a div 2", 3, "bigint"),
        ("-a div 2", -3, "bigint"),  # truncated toward zero, not floored
        ("a div -2", -3, "bigint"),
        ("-a % 3", -1, "bigint"),  # the dividend's sign
        ("a % -3", 1, "bigint"),
        ("mod(-7, 3)", -1, "bigint"),
        ("b % 2", 0.5, "double"),
        ("a + b", 9.5, "double"),
        ("a * 2", 14, "bigint"),
        ("floor(a / 2)", 3, "bigint"),
        ("floor(-a / 2)", -4, "bigint"),
        ("ceil(b)", 3, "bigint"),
        ("floor(1767225612345 / 10000) * 10000", 1767225610000, "bigint"),
        ("if(a > 3, a, b)", 7.0, "double"),  # bigint and double branches: a double
        ("coalesce(n, b)", 2.5, "double"),
        ("coalesce(n, a)", 7, "bigint"),
        ("abs(-a)", 7, "bigint"),
        ("n + 1", None, "bigint"),
        ("-b", -2.5, "double"),
        ("1L + 2", 3, "bigint"),
        ("1e3", 1000.0, "double"),
    ],
)
def test_integer_and_double_arithmetic(text, want, type_):
    e = compile_expr(text, COLS)
    got = e(ROW)
    assert got == want and type(got) is type(want) and e.type == type_


@pytest.mark.parametrize(
    "text, want",
    [
        ("'Z' < 'a'", True),  # byte order: upper case before lower case
        ("'é' > 'z'", True),  # a UTF-8 lead byte above ASCII
        ("'' < 'a'", True),
        ("'ab' < 'abc'", True),
        ("'10' < '9'", True),  # strings, not numbers
        ("'\U0001f600' > '\uffff'", True),  # a 4-byte character after every 3-byte one (not UTF-16 order)
        ("s = 'héllo'", True),
        ("s < 'hz'", False),
        ("'a' || 'b'", "ab"),
        ("s || a", "héllo7"),
        ("concat(s, '-', b)", "héllo-2.5"),
        ("concat(s, ns)", None),
        ("upper(orders.tier)", "GOLD"),
        ("'it\\'s'", "it's"),
        ('"double quoted"', "double quoted"),
    ],
)
def test_strings_compare_by_utf8_bytes(text, want):
    assert ev(text) == want


def test_the_byte_order_is_not_python_order_only_by_accident():
    assert sql_compare("\U0001f600", "\uffff") == 1
    assert sql_compare("a", "a") == 0
    assert sorted(["b", None, "a"], key=lambda v: order_key([v])) == [None, "a", "b"]


@pytest.mark.parametrize(
    "value, want",
    [
        (1.0, "1.0"),
        (0.001, "0.001"),
        (0.0001, "1.0E-4"),
        (1234567.0, "1234567.0"),
        (12345678.0, "1.2345678E7"),
        (1e10, "1.0E10"),
        (-2.5, "-2.5"),
        (0.1 + 0.2, "0.30000000000000004"),
        (-0.0, "-0.0"),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (7, "7"),
        (True, "true"),
        (None, None),
    ],
)
def test_cast_to_string_writes_doubles_as_java_does(value, want):
    assert cast_string(value) == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("cast(' 12 ' as bigint)", 12),
        ("cast(-2.9 as bigint)", -2),
        ("cast('2.5' as double)", 2.5),
        ("cast(a as string)", "7"),
        ("cast(b as string)", "2.5"),
        ("cast(t as bigint)", 1),
        ("cast('yes' as boolean)", True),
        ("cast(n as string)", None),
    ],
)
def test_casts(text, want):
    assert ev(text) == want


@pytest.mark.parametrize(
    "text, match",
    [
        ("a / 0", "division by zero"),
        ("a div 0", "division by zero"),
        ("a % 0", "remainder by zero"),
        ("9223372036854775807 + 1", "overflow"),
        ("cast('1.5' as bigint)", "cannot cast"),  # ANSI: no fractional part
        ("cast('x' as double)", "cannot cast"),
        ("cast(1e30 as bigint)", "cannot cast"),
    ],
)
def test_ansi_errors_at_run_time(text, match):
    with pytest.raises(ExprError, match=match):
        ev(text)


@pytest.mark.parametrize(
    "text, match",
    [
        ("zz", "unknown column 'zz'"),
        ("other.tier", "unknown column"),
        ("a + s", "arithmetic"),
        ("s = 1", "cannot compare string with bigint"),
        ("t < 1", "cannot compare boolean with bigint"),
        ("a LIKE 'x%'", "unexpected text"),
        ("upper(s) RLIKE 'x'", "unexpected text"),
        ("length(s)", "function length\\(\\) is not supported"),
        ("(SELECT 1)", "expected \\)"),
        ("a +", "unexpected"),
        ("if(a, 1, 2)", "needs a boolean"),
        ("a AND t", "needs a boolean"),
        ("cast(a as date)", "cast to date is not supported"),
        ("b div 2", "integral division"),
        ("if(t, 'x', 1)", "do not mix"),
        ("'open", "cannot read"),
    ],
)
def test_anything_else_is_refused_with_the_expression_named(text, match):
    with pytest.raises(ExprError, match=match) as e:
        ev(text)
    assert repr(text) in str(e.value) or text in str(e.value)


def test_names_resolve_case_insensitively_and_qualified_names_are_columns():
    assert ev("A + 1") == 8
    assert ev("`a`") == 7
    assert ev("ORDERS.TIER") == "gold"
    assert compile_expr("matches > 0", {"matches": "bigint"})({"matches": 2}) is True
