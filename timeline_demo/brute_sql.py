"""A small Spark SQL expression language in plain Python, for the brute-force references (`timeline_demo.brute`).

The service evaluates a pipeline's expressions in Spark (`selectExpr`); a brute force needs no Spark, so this module
reads the part of Spark SQL the example pipelines use and evaluates it per row, with Spark's semantics (Spark 4,
ANSI mode, its default):
- names: `field`, `` `field` ``, `topic.field` (resolved case-insensitively, as Spark does by default);
- literals: integers (bigint; suffix `L`), decimals and exponents (double: Spark reads `1.5` as a DECIMAL, here
  a double), `'text'` and `"text"` with backslash escapes, `true`, `false`, `null`;
- `+ - * / % div` and unary `-`: `/` is always a double division (`7 / 2` = 3.5); `div` is an integral division
  truncated toward zero (`-7 div 2` = -3); `%` takes the sign of the dividend (`-7 % 2` = -1); bigint results that
  overflow 64 bits, a division or remainder by zero and a cast that cannot be read raise `ExprError` (ANSI mode
  fails the query); `||` concatenates strings;
- comparisons `= == != <> < <= > >= <=>`, `IS [NOT] NULL`, `[NOT] IN (...)`, `[NOT] BETWEEN a AND b`; strings
  compare by their UTF-8 bytes, numbers numerically (bigint with double), NaN equal to itself and above every
  number; comparing a string with a number is refused (Spark would cast one side);
- `AND`, `OR`, `NOT` in three-valued logic (null is unknown: `null AND false` is false, `null OR true` true);
- `CASE [x] WHEN .. THEN .. [ELSE ..] END`, and the functions `coalesce`, `if`, `floor`, `ceil`, `abs`, `mod`,
  `concat`, `lower`, `upper`;
- `cast(x AS string | bigint | long | int | double | boolean)`: a double as text the way Java writes it
  (`1.0`, `1.0E10`, `1.0E-4`), a string to a number only when it is one (ANSI), a double to bigint truncated.
Anything else (another function, `LIKE`, a subquery, ...) is refused by `compile_expr` with an `ExprError` that
names the expression: the brute force never guesses.

Values are Python values: None (null), bool (boolean), int (bigint, timestamps as epoch ms), float (double), str.
Every expression is typed when compiled, from the types of the columns it reads (`spec.model.SQL_TYPES`), so a
`coalesce`, `if` or `CASE` mixing bigint and double gives a double, as in Spark.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = [
    "ExprError",
    "Expr",
    "compile_expr",
    "cast_string",
    "sql_compare",
    "sql_equal",
    "order_key",
    "LONG_MIN",
    "LONG_MAX",
]

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
_NUMERIC = ("bigint", "double")


class ExprError(ValueError):
    """An expression the brute force cannot read or evaluate (the message names the expression)."""


# --- values ----------------------------------------------------------------------------------------------------


def _java_double(x: float) -> str:
    """`x` as Java's `Double.toString` writes it (the shortest digits that read back as `x`): `1.0`, `0.001`,
    `1.0E7`, `1.0E-4`, `NaN`, `Infinity`."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    _, digits, exp = Decimal(repr(abs(x))).normalize().as_tuple()
    text = "".join(map(str, digits))
    point = len(text) + exp  # the decimal point's position within `text`
    if 1e-3 <= abs(x) < 1e7:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{text}"
        if point >= len(text):
            return f"{sign}{text}{'0' * (point - len(text))}.0"
        return f"{sign}{text[:point]}.{text[point:]}"
    return f"{sign}{text[0]}.{text[1:] or '0'}E{point - 1}"


def cast_string(value: Any) -> str | None:
    """`cast(value AS string)` in Spark: null stays null, a boolean is `true`/`false`, a double as Java writes it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _java_double(value)
    raise ExprError(f"no SQL value: {value!r}")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    raise ExprError(f"no SQL value: {value!r}")


def sql_compare(a: Any, b: Any) -> int:
    """-1, 0 or 1: `a` against `b`, both not null and of one kind (numbers, strings or booleans). Strings by their
    UTF-8 bytes; NaN equals NaN and is above every other number; false < true."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        raise ExprError(f"cannot compare a {ka} with a {kb}: {a!r}, {b!r}")
    if ka == "string":
        a, b = a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    elif ka == "number":
        na, nb = isinstance(a, float) and math.isnan(a), isinstance(b, float) and math.isnan(b)
        if na or nb:
            return (na > nb) - (na < nb)
    return (a > b) - (a < b)


def sql_equal(a: Any, b: Any) -> bool | None:
    """`a = b` in SQL: null when either is null."""
    if a is None or b is None:
        return None
    return sql_compare(a, b) == 0


class _Ordered:
    """A sort key of one SQL value: null first, then by `sql_compare`."""

    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    def __lt__(self, other: _Ordered) -> bool:
        if self.v is None or other.v is None:
            return self.v is None and other.v is not None
        return sql_compare(self.v, other.v) < 0

    def __gt__(self, other: _Ordered) -> bool:
        return other < self

    def __eq__(self, other) -> bool:
        if self.v is None or other.v is None:
            return self.v is None and other.v is None
        return sql_compare(self.v, other.v) == 0

    def __hash__(self):  # pragma: no cover - sort keys are not hashed
        return hash(self.v)


def order_key(values) -> tuple:
    """A sort key of a tuple of SQL values: compared element by element, null smallest (Spark's ascending order)."""
    return tuple(_Ordered(v) for v in values)


# --- tokens ----------------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[lLdD]?)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<quoted>`(?:[^`]|``)+`)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=>|<=|>=|<>|!=|==|\|\||[=<>+\-*/%(),.])
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "0": "\0", "Z": "\x1a", "%": "\\%", "_": "\\_"}
_KEYWORDS = {
    "and",
    "or",
    "not",
    "in",
    "is",
    "null",
    "true",
    "false",
    "cast",
    "as",
    "between",
    "case",
    "when",
    "then",
    "else",
    "end",
    "div",
}


@dataclass(frozen=True)
class _Tok:
    kind: str  # num, str, name, kw, op, end
    text: str
    at: int


def _unescape(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _tokens(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExprError(f"cannot read {text!r} at {text[pos : pos + 10]!r}")
        kind, value = m.lastgroup, m.group()
        pos = m.end()
        if kind == "ws":
            continue
        if kind == "quoted":
            kind, value = "name", value[1:-1].replace("``", "`")
        elif kind == "name" and value.lower() in _KEYWORDS:
            kind, value = "kw", value.lower()
        out.append(_Tok(kind, value, m.start()))
    out.append(_Tok("end", "", len(text)))
    return out


# --- syntax: tuples ("lit", value, type), ("col", name), ("bin", op, a, b), ("not", a), ("neg", a),
# ("isnull", a, negated), ("in", a, items, negated), ("between", a, lo, hi, negated), ("call", name, args),
# ("cast", a, type), ("case", operand | None, [(when, then)], else | None) -------------------------------------


class _Parser:
    """Recursive descent over Spark SQL's precedence: OR < AND < NOT < comparison/IS/IN/BETWEEN <
    `+ - ||` < `* / % div` < unary minus < primary."""

    def __init__(self, text: str):
        self.text, self.toks, self.i = text, _tokens(text), 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def accept(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        if tok.kind == kind and (text is None or tok.text == text):
            self.i += 1
            return True
        return False

    def expect(self, kind: str, text: str | None = None) -> _Tok:
        tok = self.peek()
        if tok.kind != kind or (text is not None and tok.text != text):
            self.fail(f"expected {text or kind}")
        return self.take()

    def fail(self, why: str):
        tok = self.peek()
        where = f"at {self.text[tok.at : tok.at + 12]!r}" if tok.kind != "end" else "at the end"
        raise ExprError(f"{why} {where} in {self.text!r}")

    def parse(self):
        node = self.or_()
        if self.peek().kind != "end":
            self.fail("unexpected text")
        return node

    def or_(self):
        node = self.and_()
        while self.accept("kw", "or"):
            node = ("bin", "or", node, self.and_())
        return node

    def and_(self):
        node = self.not_()
        while self.accept("kw", "and"):
            node = ("bin", "and", node, self.not_())
        return node

    def not_(self):
        if self.accept("kw", "not"):
            return ("not", self.not_())
        return self.predicate()

    def predicate(self):
        node = self.additive()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.text in ("=", "==", "!=", "<>", "<", "<=", ">", ">=", "<=>"):
                self.take()
                op = {"==": "=", "<>": "!="}.get(tok.text, tok.text)
                node = ("bin", op, node, self.additive())
            elif self.accept("kw", "is"):
                negated = self.accept("kw", "not")
                self.expect("kw", "null")
                node = ("isnull", node, negated)
            elif tok.kind == "kw" and tok.text in ("in", "between", "not"):
                negated = self.accept("kw", "not")
                if self.accept("kw", "in"):
                    self.expect("op", "(")
                    items = [self.or_()]
                    while self.accept("op", ","):
                        items.append(self.or_())
                    self.expect("op", ")")
                    node = ("in", node, items, negated)
                elif self.accept("kw", "between"):
                    lo = self.additive()
                    self.expect("kw", "and")
                    node = ("between", node, lo, self.additive(), negated)
                else:
                    self.fail("expected IN or BETWEEN")
            else:
                return node

    def additive(self):
        node = self.multiplicative()
        while self.peek().kind == "op" and self.peek().text in ("+", "-", "||"):
            node = ("bin", self.take().text, node, self.multiplicative())
        return node

    def multiplicative(self):
        node = self.unary()
        while (self.peek().kind == "op" and self.peek().text in ("*", "/", "%")) or (
            self.peek().kind == "kw" and self.peek().text == "div"
        ):
            node = ("bin", self.take().text, node, self.unary())
        return node

    def unary(self):
        if self.accept("op", "-"):
            return ("neg", self.unary())
        if self.accept("op", "+"):
            return self.unary()
        return self.primary()

    # long: one branch per kind of primary expression
    def primary(self):
        tok = self.take()
        if tok.kind == "num":
            return _number(tok.text)
        if tok.kind == "str":
            return ("lit", _unescape(tok.text[1:-1]), "string")
        if tok.kind == "kw" and tok.text in ("true", "false"):
            return ("lit", tok.text == "true", "boolean")
        if tok.kind == "kw" and tok.text == "null":
            return ("lit", None, "null")
        if tok.kind == "op" and tok.text == "(":
            node = self.or_()
            self.expect("op", ")")
            return node
        if tok.kind == "kw" and tok.text == "cast":
            self.expect("op", "(")
            node = self.or_()
            self.expect("kw", "as")
            target = self.expect("name").text.lower()
            self.expect("op", ")")
            return ("cast", node, target)
        if tok.kind == "kw" and tok.text == "case":
            return self.case()
        if tok.kind == "name":
            if self.accept("op", "("):
                args = []
                if not self.accept("op", ")"):
                    args.append(self.or_())
                    while self.accept("op", ","):
                        args.append(self.or_())
                    self.expect("op", ")")
                return ("call", tok.text.lower(), args)
            name = tok.text
            if self.accept("op", "."):
                name = f"{name}.{self.expect('name').text}"
            return ("col", name)
        self.i -= 1
        self.fail("unexpected")

    def case(self):
        operand = None if self.peek().kind == "kw" and self.peek().text == "when" else self.or_()
        whens = []
        while self.accept("kw", "when"):
            cond = self.or_()
            self.expect("kw", "then")
            whens.append((cond, self.or_()))
        if not whens:
            self.fail("expected WHEN")
        other = self.or_() if self.accept("kw", "else") else None
        self.expect("kw", "end")
        return ("case", operand, whens, other)


def _number(text: str):
    suffix = text[-1].lower() if text[-1] in "lLdD" else ""
    body = text[:-1] if suffix else text
    if suffix == "l" or (not suffix and re.fullmatch(r"\d+", body)):
        if not re.fullmatch(r"\d+", body):
            raise ExprError(f"not an integer: {text!r}")
        value = int(body)
        if value > LONG_MAX:
            raise ExprError(f"integer literal out of the bigint range: {text!r}")
        return ("lit", value, "bigint")
    return ("lit", float(body), "double")


# --- typing and evaluation -------------------------------------------------------------------------------------

Fn = Callable[[Mapping[str, Any]], Any]


def _long(value: int, text: str) -> int:
    if not LONG_MIN <= value <= LONG_MAX:
        raise ExprError(f"bigint overflow ({value}) in {text!r} (Spark's ANSI mode fails the query)")
    return value


def _common(types: list[str], text: str) -> str:
    """The type several branches (coalesce, if, CASE) share: null gives way; bigint widens to double."""
    known = [t for t in types if t != "null"]
    if not known:
        return "null"
    if all(t in _NUMERIC for t in known):
        return "double" if "double" in known else "bigint"
    if len(set(known)) == 1:
        return known[0]
    raise ExprError(f"branches of types {', '.join(known)} do not mix in {text!r}")


def _as(t: str, fn: Fn) -> Fn:
    """`fn` with its value converted to `t` (only bigint -> double ever needs it)."""
    if t != "double":
        return fn

    def conv(row):
        v = fn(row)
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    return conv


def _comparable(ta: str, tb: str, text: str) -> None:
    if "null" in (ta, tb) or ta == tb or (ta in _NUMERIC and tb in _NUMERIC):
        return
    raise ExprError(f"cannot compare {ta} with {tb} in {text!r} (cast one side)")


class _Compiler:
    def __init__(self, text: str, columns: Mapping[str, str]):
        self.text = text
        self.columns = dict(columns)
        self.folded: dict[str, list[str]] = {}
        for name in self.columns:
            self.folded.setdefault(name.lower(), []).append(name)

    def fail(self, why: str):
        raise ExprError(f"{why} in {self.text!r}")

    # long: one branch per syntax node
    def compile(self, node) -> tuple[str, Fn]:
        kind = node[0]
        if kind == "lit":
            value = node[1]
            return node[2], lambda row: value
        if kind == "col":
            return self.column(node[1])
        if kind == "bin":
            return self.binary(node[1], node[2], node[3])
        if kind == "not":
            t, f = self.compile(node[1])
            self.boolean(t, "NOT")

            def not_(row):
                v = f(row)
                return None if v is None else not v

            return "boolean", not_
        if kind == "neg":
            t, f = self.compile(node[1])
            if t not in (*_NUMERIC, "null"):
                self.fail(f"unary minus of a {t}")
            text = self.text
            return (
                t,
                lambda row: (
                    None if (v := f(row)) is None else (_long(-v, text) if isinstance(v, int) else -v)
                ),
            )
        if kind == "isnull":
            _, f = self.compile(node[1])
            negated = node[2]
            return "boolean", lambda row: (f(row) is None) != negated
        if kind == "in":
            return self.in_(node[1], node[2], node[3])
        if kind == "between":
            _, a, lo, hi, negated = node
            inner = ("bin", "and", ("bin", ">=", a, lo), ("bin", "<=", a, hi))
            return self.compile(("not", inner) if negated else inner)
        if kind == "cast":
            return self.cast(node[1], node[2])
        if kind == "call":
            return self.call(node[1], node[2])
        if kind == "case":
            return self.case(node[1], node[2], node[3])
        self.fail(f"unsupported syntax {kind}")  # pragma: no cover

    def column(self, name: str) -> tuple[str, Fn]:
        real = name if name in self.columns else None
        if real is None:
            found = self.folded.get(name.lower(), [])
            if len(found) != 1:
                known = ", ".join(sorted(self.columns))
                self.fail(f"unknown column {name!r} (known: {known})")
            real = found[0]
        return self.columns[real], lambda row: row.get(real)

    def boolean(self, t: str, what: str) -> None:
        if t not in ("boolean", "null"):
            self.fail(f"{what} needs a boolean, got a {t}")

    # long: one branch per operator
    def binary(self, op: str, a, b) -> tuple[str, Fn]:
        ta, fa = self.compile(a)
        tb, fb = self.compile(b)
        text = self.text
        if op in ("and", "or"):
            self.boolean(ta, op.upper())
            self.boolean(tb, op.upper())
            stop = op == "or"  # the value that decides at once: true for OR, false for AND

            def logic(row):
                x = fa(row)
                if x is stop:
                    return stop
                y = fb(row)
                if y is stop:
                    return stop
                return None if x is None or y is None else not stop

            return "boolean", logic
        if op in ("=", "!=", "<", "<=", ">", ">=", "<=>"):
            _comparable(ta, tb, text)
            test = {
                "=": lambda c: c == 0,
                "!=": lambda c: c != 0,
                "<": lambda c: c < 0,
                "<=": lambda c: c <= 0,
                ">": lambda c: c > 0,
                ">=": lambda c: c >= 0,
            }.get(op)
            if op == "<=>":

                def null_safe(row):
                    x, y = fa(row), fb(row)
                    if x is None or y is None:
                        return x is None and y is None
                    return sql_compare(x, y) == 0

                return "boolean", null_safe

            def compare(row):
                x, y = fa(row), fb(row)
                return None if x is None or y is None else test(sql_compare(x, y))

            return "boolean", compare
        if op == "||":
            return (
                "string",
                lambda row: (
                    None
                    if (x := fa(row)) is None or (y := fb(row)) is None
                    else (cast_string(x) + cast_string(y))
                ),
            )
        for t in (ta, tb):
            if t not in (*_NUMERIC, "null"):
                self.fail(f"arithmetic `{op}` on a {t}")
        return self.arithmetic(op, ta, tb, fa, fb)

    def arithmetic(self, op: str, ta: str, tb: str, fa: Fn, fb: Fn) -> tuple[str, Fn]:
        text = self.text
        if op == "div":
            if "double" in (ta, tb):
                self.fail("`div` is an integral division: cast a double operand to bigint")

            def div(row):
                x, y = fa(row), fb(row)
                if x is None or y is None:
                    return None
                if y == 0:
                    raise ExprError(f"division by zero in {text!r} (Spark's ANSI mode fails the query)")
                q = abs(x) // abs(y)
                return _long(q if (x < 0) == (y < 0) else -q, text)

            return "bigint", div
        out = "double" if op == "/" or "double" in (ta, tb) else "bigint"

        def arith(row):
            x, y = fa(row), fb(row)
            if x is None or y is None:
                return None
            if op == "+":
                v = x + y
            elif op == "-":
                v = x - y
            elif op == "*":
                v = x * y
            elif op == "/":
                if y == 0:
                    raise ExprError(f"division by zero in {text!r} (Spark's ANSI mode fails the query)")
                return float(x) / float(y)
            else:  # %: the sign of the dividend, as Java's remainder
                if y == 0:
                    raise ExprError(f"remainder by zero in {text!r} (Spark's ANSI mode fails the query)")
                if out == "double":
                    return math.fmod(float(x), float(y))
                v = abs(x) % abs(y)
                v = -v if x < 0 else v
            return float(v) if out == "double" else _long(v, text)

        return out, arith

    def in_(self, a, items, negated: bool) -> tuple[str, Fn]:
        ta, fa = self.compile(a)
        fs = []
        for item in items:
            t, f = self.compile(item)
            _comparable(ta, t, self.text)
            fs.append(f)

        def member(row):
            x = fa(row)
            if x is None:
                return None
            unknown = False
            for f in fs:
                y = f(row)
                if y is None:
                    unknown = True
                elif sql_compare(x, y) == 0:
                    return not negated
            return None if unknown else negated

        return "boolean", member

    # long: one branch per target type
    def cast(self, a, target: str) -> tuple[str, Fn]:
        t, f = self.compile(a)
        text = self.text
        if target == "string":
            return "string", lambda row: cast_string(f(row))
        if target in ("bigint", "long", "int", "integer"):
            lo, hi = (LONG_MIN, LONG_MAX) if target in ("bigint", "long") else (-(2**31), 2**31 - 1)

            def to_long(row):
                v = f(row)
                if v is None:
                    return None
                if isinstance(v, bool):
                    return int(v)
                if isinstance(v, float):
                    if math.isnan(v) or math.isinf(v) or not lo <= math.trunc(v) <= hi:
                        raise ExprError(f"cannot cast {v!r} to {target} in {text!r}")
                    return math.trunc(v)
                if isinstance(v, str):
                    m = re.fullmatch(r"[+-]?\d+", v.strip())
                    if not m:
                        raise ExprError(f"cannot cast {v!r} to {target} in {text!r} (ANSI mode)")
                    v = int(m.group())
                if not lo <= v <= hi:
                    raise ExprError(f"cannot cast {v!r} to {target}: out of range in {text!r}")
                return v

            return "bigint", to_long
        if target == "double":

            def to_double(row):
                v = f(row)
                if v is None:
                    return None
                if isinstance(v, str):
                    s = v.strip()
                    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[dDfF]?", s):
                        return float(s.rstrip("dDfF"))
                    special = {"nan": math.nan, "infinity": math.inf, "+infinity": math.inf, "inf": math.inf}
                    special |= {"-infinity": -math.inf, "-inf": -math.inf, "+inf": math.inf}
                    if s.lower() in special:
                        return special[s.lower()]
                    raise ExprError(f"cannot cast {v!r} to double in {text!r} (ANSI mode)")
                return float(v)

            return "double", to_double
        if target == "boolean":

            def to_bool(row):
                v = f(row)
                if v is None or isinstance(v, bool):
                    return v
                if isinstance(v, str):
                    s = v.strip().lower()
                    if s in ("t", "true", "y", "yes", "1"):
                        return True
                    if s in ("f", "false", "n", "no", "0"):
                        return False
                    raise ExprError(f"cannot cast {v!r} to boolean in {text!r} (ANSI mode)")
                return v != 0

            return "boolean", to_bool
        self.fail(f"cast to {target} is not supported by the brute force (string, bigint, double, boolean)")

    # long: one branch per function
    def call(self, name: str, args) -> tuple[str, Fn]:
        compiled = [self.compile(a) for a in args]
        types, fns = [t for t, _ in compiled], [f for _, f in compiled]
        text = self.text

        def arity(n: int) -> None:
            if len(args) != n:
                self.fail(f"{name}() takes {n} argument{'s' if n != 1 else ''}")

        if name == "coalesce":
            if not args:
                self.fail("coalesce() needs an argument")
            out = _common(types, text)
            fns = [_as(out, f) for f in fns]

            def coalesce(row):
                for f in fns:
                    v = f(row)
                    if v is not None:
                        return v
                return None

            return out, coalesce
        if name == "if":
            arity(3)
            self.boolean(types[0], "if()")
            out = _common(types[1:], text)
            c, a, b = fns[0], _as(out, fns[1]), _as(out, fns[2])
            return out, lambda row: a(row) if c(row) is True else b(row)
        if name in ("floor", "ceil", "ceiling"):
            arity(1)
            if types[0] not in (*_NUMERIC, "null"):
                self.fail(f"{name}() of a {types[0]}")
            f, rnd = fns[0], math.floor if name == "floor" else math.ceil

            def rounded(row):
                v = f(row)
                if v is None or isinstance(v, int):
                    return v
                if math.isnan(v) or math.isinf(v):
                    raise ExprError(f"{name}({v!r}) has no bigint value in {text!r}")
                return _long(rnd(v), text)

            return "bigint", rounded
        if name == "abs":
            arity(1)
            if types[0] not in (*_NUMERIC, "null"):
                self.fail(f"abs() of a {types[0]}")
            f = fns[0]
            return (
                types[0],
                lambda row: (
                    None if (v := f(row)) is None else (_long(abs(v), text) if isinstance(v, int) else abs(v))
                ),
            )
        if name == "mod":
            arity(2)
            return self.compile(("bin", "%", args[0], args[1]))
        if name == "concat":

            def concat(row):
                parts = [f(row) for f in fns]
                return None if any(p is None for p in parts) else "".join(cast_string(p) for p in parts)

            return "string", concat
        if name in ("lower", "upper", "lcase", "ucase"):
            arity(1)
            f = fns[0]
            up = name in ("upper", "ucase")
            return (
                "string",
                lambda row: None if (v := cast_string(f(row))) is None else (v.upper() if up else v.lower()),
            )
        self.fail(f"function {name}() is not supported by the brute force")

    def case(self, operand, whens, other) -> tuple[str, Fn]:
        conds = []
        if operand is not None:
            to, fo = self.compile(operand)
            for w, _ in whens:
                tw, fw = self.compile(w)
                _comparable(to, tw, self.text)
                conds.append(lambda row, fo=fo, fw=fw: sql_equal(fo(row), fw(row)))
        else:
            for w, _ in whens:
                tw, fw = self.compile(w)
                self.boolean(tw, "WHEN")
                conds.append(fw)
        results = [self.compile(r) for _, r in whens]
        rest = self.compile(other) if other is not None else ("null", lambda row: None)
        out = _common([t for t, _ in results] + [rest[0]], self.text)
        values = [_as(out, f) for _, f in results]
        otherwise = _as(out, rest[1])

        def case(row):
            for cond, value in zip(conds, values, strict=True):
                if cond(row) is True:
                    return value(row)
            return otherwise(row)

        return out, case


@dataclass(frozen=True)
class Expr:
    """A compiled expression: `text` as written, its SQL `type` (bigint, double, string, boolean or null), and
    `expr(row)` its value on `row`, a mapping of column names (bare and `topic.field`) to values."""

    text: str
    type: str
    fn: Fn

    def __call__(self, row: Mapping[str, Any]) -> Any:
        return self.fn(row)


def compile_expr(text: str, columns: Mapping[str, str]) -> Expr:
    """Read `text` against `columns` (name -> SQL type: string, bigint, double, boolean) and return its `Expr`.
    Raises `ExprError` for anything outside the language of the module docstring or a type that does not fit."""
    node = _Parser(str(text)).parse()
    t, fn = _Compiler(str(text), columns).compile(node)
    return Expr(str(text), t, fn)
