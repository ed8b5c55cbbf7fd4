"""How a view kind is declared in a pipeline file, as the kind's own module says it (`ViewFile`): the keys it takes (a
pydantic model built on `ViewKeys`, `ShownKeys` or `WindowedKeys`, with the kind's own key named as the kind), the
job kinds whose rows it takes, and its own checks, which turn its keys into the parts of a `spec.model.View`.

Each view kind's module under `views/` declares its `ViewFile` and `views.kinds` registers them by name; the loader
(`spec.load`, given the registry) does what every kind shares: the view's name, exactly one kind key, a key that is
another kind's ("`cap` is not a key of a row view"), a job kind the view does not serve, `where`, and `window` and
`retain` of a windowed kind. A kind's `read` gets a `ViewCheck`: what its expressions may name and where its
problems go (with the file's line of the key). No Spark."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spec.model import Topic
from spec.problems import IDENT, NAME, Expr, Problems, Strict, expr_text, field_expr

__all__ = ["JOB_KINDS", "ViewKeys", "ShownKeys", "WindowedKeys", "ViewFile", "ViewCheck"]

JOB_KINDS = ("join", "select", "interval", "asof")


class ViewKeys(Strict):
    """The keys every view kind takes: `where`, only the rows for which it holds."""

    where: Expr | None = None


class ShownKeys(ViewKeys):
    """And `show`: the plain `mview query` output of one row or entry."""

    show: str | None = None


class WindowedKeys(ShownKeys):
    """And an event-time `window` with its `retain` (checked by the loader: a kind with these keys is windowed)."""

    window: dict[str, Any] | None = None
    retain: str | None = None


@dataclass(frozen=True)
class ViewFile:
    """A view kind in a pipeline file. name: its key (`count:`). keys: the pydantic model of every key it takes.
    read(keys, check): the parts of its `View` beside name, job, kind, where, show, window and retain (a dict of
    `View` fields), its problems added through `check`. serves: the job kinds whose rows it takes; serves_note: what
    is said when it is declared on another (default: the list). topic(view, seen): the fields of a view of the kind
    read as a topic (`from: {view: ...}`, `spec.viewtable`), (name, type or None where it cannot be told) in order,
    `seen` what the view's expressions see by topic; None for a kind that is not read as a topic. events: read as a
    topic, it is an event topic of its rows (else a table topic of its entries, by key)."""

    name: str
    keys: type[ViewKeys]
    read: Callable[[Any, ViewCheck], dict[str, Any]]
    serves: tuple[str, ...] = JOB_KINDS
    serves_note: str = ""
    topic: Callable[[Any, Mapping], list[tuple[str, str | None]]] | None = None
    events: bool = False

    @property
    def windowed(self) -> bool:
        return issubclass(self.keys, WindowedKeys)

    @property
    def key_names(self) -> frozenset[str]:
        return frozenset(self.keys.model_fields)


@dataclass(frozen=True)
class ViewCheck:
    """What a view kind's `read` checks with. path: the view's keys in the file. job_kind: its job's kind (None when
    the job's own declaration has problems, said there). event: its rows are events, each once (a select of an
    event topic, interval, asof), not a join's or a table's rows that change and leave. seen: what its expressions
    may name, by topic (None when unknown)."""

    path: tuple
    job_kind: str | None
    event: bool
    seen: Mapping[str, Topic] | None
    out: Problems

    def add(self, key: tuple, message: str) -> None:
        """A problem at the view's key `key` (a path below the view)."""
        self.out.add((*self.path, *key), message)

    def expr(self, value, key: tuple) -> str:
        """`value` (at `key`) as SQL text, checked: nothing outside reach, a plain name one the view sees."""
        text = expr_text(value)
        field_expr(text, self.seen, (*self.path, *key), self.out)
        return text

    def one_key(self, mapping: Mapping[str, Expr], kind: str) -> tuple[str, str] | None:
        """The one `(name, expression)` of the kind's key (`count: {user: user_id}`), checked."""
        if len(mapping) != 1:
            self.add((kind,), f"a {kind} view has one key: `{kind}: {{<name>: <expression>}}`")
            return None
        ((name, value),) = mapping.items()
        return str(name), self.expr(value, (kind, name))

    def named(self, mapping: Mapping[str, Expr], part: tuple) -> tuple[tuple[str, str], ...]:
        """`mapping` (at `part`: `fields`, `values`, ...) as (name, expression) pairs, every name and expression
        checked."""
        out = []
        for name, value in mapping.items():
            name = str(name)
            self.name(name, (*part, name))
            out.append((name, self.expr(value, (*part, name))))
        return tuple(out)

    def name(self, name: str, key: tuple) -> None:
        """A name of the view's output: a letter, then letters, digits or _."""
        if name.startswith("_") or not NAME.match(name):
            self.add(key, "a name is a letter then letters, digits or _")

    def numeric(self, expr: str, key: tuple, what: str) -> None:
        """`expr`, when it is a plain field name, is a number or a timestamp (other expressions are Spark's to type
        when the job starts, `views.frame.check_job`); `what` names the expression in the message."""
        m = IDENT.match(expr.strip())
        if not m or self.seen is None:
            return
        a, b = m.groups()
        topics = [self.seen[a]] if b is not None and a in self.seen else list(self.seen.values())
        field = a if b is None else b
        kind = next((t.type_of(field) for t in topics if field in t.names), None)
        if kind in ("id", "string", "boolean"):
            article = "an" if kind == "id" else "a"
            self.add(key, f"{what} is a number or a timestamp; {expr!r} is {article} {kind}")
