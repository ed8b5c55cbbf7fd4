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

__all__ = ["JAVA_FUNCTIONS", "outside_reach"]

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
