"""The tools of checking a pipeline file: problems collected with the line of their key (`Problems`), pydantic's
errors in words (`validated`), and the checks every part of the file shares (a name, a duration, an expression that
is a plain field name: `field_expr`). No Spark."""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, ValidationError

from spec.durations import parse_duration_ms
from spec.errors import Problem
from spec.model import Topic
from spec.sql import outside_reach

__all__ = [
    "NAME",
    "IDENT",
    "Expr",
    "Strict",
    "Problems",
    "expr_text",
    "validated",
    "pydantic_problems",
    "unique",
    "duration",
    "field_expr",
]

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


IDENT = re.compile(r"^`?([A-Za-z_][A-Za-z0-9_]*)`?(?:\.`?([A-Za-z_][A-Za-z0-9_]*)`?)?$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


Expr = str | int | float | bool


class Problems:
    """Collects problems with the line of their key."""

    def __init__(self, file: str, lines: Mapping[tuple, int]):
        self.file, self.lines, self.found = file, lines, []
        self.broken_topics: set[str] = set()

    def add(self, path: tuple, message: str) -> None:
        line = 1  # a key missing at the top: the file's first line
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                line = self.lines[path[:n]]
                break
        key = ".".join(str(p) for p in path)
        self.found.append(Problem(self.file, line, key, message))


def expr_text(value) -> str:
    """An expression as SQL text (YAML gives numbers and booleans for `1`, `true`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def validated(model, data, path: tuple, out: Problems):
    """`data` (the part of the file at `path`) as `model`, or None with its problems added."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        pydantic_problems(e, out, path)
        return None


def pydantic_problems(e: ValidationError, out: Problems, prefix: tuple = ()) -> None:
    """`e`'s errors as problems, one per key, in words."""
    wrong: dict[tuple, list[dict]] = {}
    ons = {
        tuple(err["loc"][:-1])
        for err in e.errors()
        if err["type"] == "extra_forbidden" and err["loc"][-1] == "on"
    }
    for err in e.errors():
        if err["type"] == "missing" and err["loc"][-1] == "match" and prefix + tuple(err["loc"][:-1]) in ons:
            continue  # said with the `on:` below
        path = prefix + tuple(err["loc"])
        # pydantic's loc of a union member names the member type (e.g. `str`, `list[str]`): drop those
        path = tuple(
            p for p in path if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool")))
        )
        kind, last = err["type"], path[-1] if path else ""
        if kind == "extra_forbidden":
            if last == "on" and path[-2:-1] in (("interval",), ("asof",), ("join",)):
                out.add(
                    path,
                    "`on:` is read by YAML as true: write `match:` (a map of one side's expression to the other's)",
                )
            elif last in ("on", "off"):
                out.add(path, f"unknown key (YAML reads `{last}:` as a boolean)")
            else:
                out.add(path, "unknown key")
        elif kind == "missing":
            out.add(path, "missing")
        elif kind == "value_error":
            out.add(path, str(err["ctx"]["error"]))
        else:
            wrong.setdefault(path, []).append(err)
    for path, errs in wrong.items():
        out.add(path, _wrong_kind(errs))


# What a value of each kind is, in words (pydantic's error type's first word: int_parsing, string_type, ...).
_VALUE_KINDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "string": "text",
    "dict": "a mapping ({name: value, ...})",
    "model": "a mapping ({key: value, ...})",
    "list": "a list ([a, b, ...])",
    "tuple": "a list ([a, b])",
}


def _wrong_kind(errs: list[dict]) -> str:
    """The message of a value of the wrong kind: pydantic's errors for one key (one per member of a union, e.g.
    an expression is text, a number or a boolean) as what the key takes and what it got."""
    got = repr(errs[0].get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    if errs[0]["type"] in ("too_short", "too_long"):
        return f"{errs[0]['msg'].replace(' after validation', '')}: {got}"
    kinds = list(dict.fromkeys(e["type"].split("_")[0] for e in errs))
    if {"string", "int", "float", "bool"} <= set(kinds):
        what = "an expression (text, a number or true/false)"
    elif kinds == ["string", "list"]:
        what = "a name or a list of names"
    elif kinds == ["list", "string"]:
        what = "an expression or a list of them"
    else:
        what = " or ".join(_VALUE_KINDS.get(k, k) for k in kinds)
    return f"{what}, not {got}"


def unique(found: list[Problem]) -> list[Problem]:
    """Problems once each (a union's members can report one mistake several times)."""
    out, keys = [], set()
    for p in found:
        if (p.line, p.key, p.message) not in keys:
            keys.add((p.line, p.key, p.message))
            out.append(p)
    return out


def duration(value: str, path: tuple, out: Problems) -> int | None:
    try:
        return parse_duration_ms(value, signed=True)
    except ValueError as e:
        out.add(path, str(e))
        return None


def field_expr(expr: str, known: Mapping[str, Topic] | None, path: tuple, out: Problems) -> None:
    """Refuse what an expression may not do (`spec.sql.outside_reach`: call Java, read a table); when `expr` is a
    plain name (`f` or `topic.f`), check that the side(s) have it. Other expressions are Spark's to check (when
    the job starts)."""
    why = outside_reach(expr)
    if why:
        out.add(path, why)
        return
    m = IDENT.match(expr.strip())
    if not m or known is None:  # (None: the job's sides are unknown, said elsewhere)
        return
    a, b = m.groups()
    if b is None:
        names = {n for t in known.values() for n in t.names}
        if a not in names and a.lower() not in ("true", "false", "null"):
            out.add(path, f"{a!r} is not a field of {' or '.join(known)}")
    elif a not in known:
        out.add(path, f"{a!r} is not a topic whose fields are seen here ({', '.join(known)})")
    elif b not in known[a].names:
        out.add(path, f"{b!r} is not a field of {a!r}")
