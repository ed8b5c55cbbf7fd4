"""What a pipeline's expressions may not do, found in their text without Spark (`mview check`).

An expression is Spark SQL evaluated by the job's driver and executors, with their environment and their access to
files and tables. Two things would reach beyond the rows of the job, so a pipeline may not use them:
- the functions that call any Java method (`reflect`, `java_method`, `try_reflect`: e.g.
  `reflect('java.lang.System', 'getenv', 'AWS_SECRET_ACCESS_KEY')` would publish a secret to whoever reads Redis);
- a subquery (`(SELECT ... FROM ...)`), which can read any table or file the job can.

`outside_reach(text)` scans the text as Spark's parser reads it: string literals (with backslash escapes; a raw
string `r'...'` has none) and comments (`-- ...`, nested `/* ... */`) are not code, a back-quoted name is its
name (`` `reflect`(...) `` is a call). The job checks the parsed expressions again when it starts
(`views.frame.check_job`), so what this scan misses is still refused before a record is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["JAVA_FUNCTIONS", "outside_reach", "AGGREGATES", "Aggregate", "parse_aggregate"]

JAVA_FUNCTIONS = ("reflect", "java_method", "try_reflect")
_CALL = re.compile(r"\b(" + "|".join(JAVA_FUNCTIONS) + r")\s*\(", re.IGNORECASE)
_SELECT = re.compile(r"\bselect\b", re.IGNORECASE)


def _string_end(text: str, i: int, raw: bool) -> int:
    """The index after the string literal whose opening quote is at `i`."""
    quote, j = text[i], i + 1
    while j < len(text) and text[j] != quote:
        j += 2 if text[j] == "\\" and not raw else 1
    return j + 1


def _comment_end(text: str, i: int) -> int:
    """The index after the comment starting at `i` (`--` to the line's end, or a nested `/* */`)."""
    if text.startswith("--", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    depth, j = 0, i
    while j < len(text):
        if text.startswith("/*", j):
            depth, j = depth + 1, j + 2
        elif text.startswith("*/", j):
            depth, j = depth - 1, j + 2
            if depth == 0:
                break
        else:
            j += 1
    return j


def _code(text: str, *, names: bool) -> str:
    """`text` without its string literals and comments (each a space); a back-quoted name as the name itself
    (`names`) or as a placeholder word."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c in "'\"":
            raw = bool(out) and out[-1] in "rR" and not re.search(r"[A-Za-z0-9_]$", "".join(out[-2:-1]))
            if raw:
                out.pop()
            i = _string_end(text, i, raw)
            out.append(" ")
        elif c == "`":
            m = re.compile(r"`((?:[^`]|``)*)`").match(text, i)
            if not m:
                break
            out.append(m.group(1).replace("``", "`") if names else " _name_ ")
            i = m.end()
        elif text.startswith("--", i) or text.startswith("/*", i):
            i = _comment_end(text, i)
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


AGGREGATES = ("count", "sum", "min", "max", "avg")
_AGGREGATE = re.compile(r"^\s*(" + "|".join(AGGREGATES) + r")\s*\((.*)\)\s*$", re.IGNORECASE | re.DOTALL)
_DISTINCT = re.compile(r"^distinct\s+(.+)$", re.IGNORECASE | re.DOTALL)
_AGGREGATE_FORMS = "an aggregate is count(*), count(EXPR), count(distinct EXPR), sum(EXPR), min(EXPR), max(EXPR) or avg(EXPR)"


@dataclass(frozen=True)
class Aggregate:
    """One value of an `agg` view: `func` (count, sum, min, max, avg) over `expr` (Spark SQL over a row; None for
    `count(*)`), of its distinct non-null values when `distinct` (count only)."""

    func: str
    expr: str | None
    distinct: bool = False

    @property
    def text(self) -> str:
        inner = "*" if self.expr is None else ("distinct " if self.distinct else "") + self.expr
        return f"{self.func}({inner})"


def _balanced(text: str) -> bool:
    depth = 0
    for c in _code(text, names=False):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def parse_aggregate(text: str) -> Aggregate:
    """The aggregate `text` (`count(distinct rider_id)`) as an `Aggregate`; ValueError saying the accepted forms
    when it is not one of them (an aggregate of an expression that is not whole, `sum(a) + sum(b)`, included)."""
    m = _AGGREGATE.match(str(text))
    inner = m.group(2).strip() if m else ""
    if not m or not inner or not _balanced(inner):
        raise ValueError(f"{_AGGREGATE_FORMS}, not {text!r}")
    func = m.group(1).lower()
    if inner == "*":
        if func != "count":
            raise ValueError(f"{func}(*) is not an aggregate: only count(*) counts rows")
        return Aggregate(func, None)
    d = _DISTINCT.match(inner)
    if d and func != "count":
        raise ValueError(f"{func}(distinct ...) is not an aggregate: only count takes distinct")
    return Aggregate(func, d.group(1).strip() if d else inner, bool(d))


def outside_reach(text: str) -> str | None:
    """Why the expression `text` is refused (see the module docstring), or None."""
    call = _CALL.search(_code(text, names=True))
    if call:
        return (
            f"{call.group(1)}() calls Java methods, which a pipeline may not "
            f"(none of {', '.join(JAVA_FUNCTIONS)})"
        )
    if _SELECT.search(_code(text, names=False)):
        return "a subquery (SELECT) reads beyond the job's rows, which a pipeline may not"
    return None
