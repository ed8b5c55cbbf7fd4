"""The `join` kind: the inner join of two current tables, maintained incrementally, over roles.

A `join` job joins two table topics, `left` and `right` (`spec.model.Join`): the rows of the left's current table
and of the right's that match (every `match` pair of a left expression and a right expression equal; null never
matches). The built-in `timeline` job is one: `tweets JOIN follows ON tweets.user_id = follows.followee_id`.

The current table of each side is kept as state (`TableState`, one row per key ever seen): the topic's fields and
two flags, `_upsert` (the row's values come from an upsert) and `_remove` (without `final_deletes`: the deciding
record is a remove; with it: a remove of the key was seen, so it is never live again). A row is *live* when
`_upsert AND NOT _remove`. Which record decides a key is `changelog.current`'s rule (greatest time, a remove on equal
times, then the non-key fields in declared order; `final_deletes`: a remove is final and the row is the greatest
upsert), so the state, and everything published from it, depends only on the set of records, never on their order
or on how they were cut into micro-batches. A record delivered twice changes no row, so it has the effect of one.

Per micro-batch (`begin_join`, then `JoinStep.finish`), each side's *changed rows* are computed from the batch and the
state before it (unchanged keys are left out), with `_live_before`, `_live_after`, `_moved` (live before and after
but changed) and `_old` (the row before, a struct of the fields). A changed row is *born* when it is live after and
was not, or moved; it *died* when it was live before and is not, or moved (a moved row does both). The changes
of all sides are counted in one Spark job; plan branches with nothing to do (no side born, none died) are left out.

The join's *delta* (`JoinChanges.removed`, `JoinChanges.added`), each joined pair once, for views that apply it
row by row (row and count views, and lists of any shape):
- removed = died(L) x R_before + (L_before, not died) x died(R), with the rows' values before the batch;
- added = born(L) x R_after + (L_after, not born) x born(R), with their values after it.
Each row is `_s0` (the left row's fields, a struct), `_s1` (the right's) and `_id` (the JSON array of the left
key's and the right key's values, as text: the pair's identity). A moved row is removed and added. The delta is
planned when a view first asks for it; nothing is computed for a job that does not.

List views with the shape of the built-in timeline run their own algorithm over the same step
(`joins.table_list`): a list *shape* takes part in the step through `ListPart`'s methods (the posts of a batch
of entries only, its own count conditions in the one counting job, its plans after it).

The state's durable form between micro-batches is `joins.table_state.TableStore`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.current import is_remove, quoted, rank, upsert_rank
from joins.errors import BadJoinArgument
from joins.state import empty_frame, with_row_count
from spec.model import SQL_TYPES, Topic

__all__ = [
    "TableJoin",
    "replace_rows",
    "state_columns",
    "TableState",
    "JoinStep",
    "JoinChanges",
    "ListPart",
    "begin_join",
    "maintain_join",
    "state_schema",
    "changes_schema",
    "side_changes",
    "count_changes",
    "count_parts",
    "LIVE",
    "BORN",
    "DIED",
    "GAINED",
    "LOST",
]

LIVE = "_upsert AND NOT _remove"  # over state rows: the row is in the current table
BORN = "_live_after AND (NOT _live_before OR _moved)"  # over changed rows: the row (re)enters the join
DIED = "_live_before AND (NOT _live_after OR _moved)"  # ... leaves it (a moved row does both)
GAINED = "_live_after AND NOT _live_before"  # ... became live (a moved row is neither gained nor lost)
LOST = "_live_before AND NOT _live_after"
_FLAGS = "_upsert boolean, _remove boolean"
_CHANGE_FLAGS = "_live_before boolean, _live_after boolean, _moved boolean"


def _fields_ddl(topic: Topic) -> str:
    return ", ".join(f"{quoted(n)} {SQL_TYPES[t]}" for n, t in topic.fields)


def state_schema(topic: Topic) -> str:
    """The columns of a side's state (DDL text): the topic's fields in declared order, then `_upsert`, `_remove`."""
    return f"{_fields_ddl(topic)}, {_FLAGS}"


def changes_schema(topic: Topic) -> str:
    """The columns of a side's changed rows: `state_schema`, the change flags, and `_old` (the row before)."""
    old = ", ".join(f"{quoted(n)}:{SQL_TYPES[t]}" for n, t in topic.fields)
    return f"{state_schema(topic)}, {_CHANGE_FLAGS}, _old struct<{old}>"


def state_columns(topic: Topic) -> list[str]:
    return [quoted(n) for n in topic.names] + ["_upsert", "_remove"]


_PLAIN = re.compile(r"^`?([A-Za-z][A-Za-z0-9_]*)`?(?:\s*\.\s*`?([A-Za-z][A-Za-z0-9_]*)`?)?$")


class TableJoin:
    """A `join` job's two sides and `match`, and the SQL it evaluates over each side's rows. Made once per job run:
    every expression is analysed by Spark on an empty frame here, so a bad one fails at start.

    Expressions over one side see its fields as a view of the job does: every left field by its bare name, a right
    field by its bare name when the left has no field of that name, and every field as `<topic>.<field>`. (The
    match expressions are each over their own side, every field bare.)"""

    def __init__(self, spark, left: Topic, right: Topic, match: Sequence[tuple[str, str]]):
        for role, t in (("left", left), ("right", right)):
            if t.key is None:
                raise BadJoinArgument(role, t.name, "a join joins two table topics, and this one has no key")
        if not match:
            raise BadJoinArgument("match", tuple(match), "a join needs at least one pair")
        self.spark, self.topics, self.match = spark, (left, right), tuple(match)
        types = [[self.type_of(i, pair[i], own=True) for pair in self.match] for i in (0, 1)]
        casts = [a != b for a, b in zip(*types, strict=True)]
        self._match_sql = tuple(self._match_value(i, casts) for i in (0, 1))

    def _match_value(self, i: int, casts: list[bool]) -> str:
        exprs = [
            f"CAST(({p[i]}) AS string)" if c else f"({p[i]})" for p, c in zip(self.match, casts, strict=True)
        ]
        if len(exprs) == 1:
            return exprs[0]
        every = " AND ".join(f"{e} IS NOT NULL" for e in exprs)
        return f"CASE WHEN {every} THEN struct({', '.join(f'{e} AS _c{j}' for j, e in enumerate(exprs))}) END"

    def match_sql(self, i: int) -> str:
        """SQL over side `i`'s rows: its match value (one column for one pair, a struct for several, null when a
        part is null; cast to string where the two sides' types differ), equal on both sides for matching rows."""
        return self._match_sql[i]

    def visible(self, i: int) -> tuple[str, ...]:
        """The fields of side `i` a view's expressions see by their bare names."""
        left, right = self.topics
        return left.names if i == 0 else tuple(n for n in right.names if n not in left.names)

    def _named(self, i: int, own: bool) -> DataFrame:
        topic = self.topics[i]
        bare = topic.names if own else self.visible(i)
        types = dict(topic.fields)
        struct = ", ".join(f"{quoted(n)}:{SQL_TYPES[t]}" for n, t in topic.fields)
        ddl = ", ".join(
            [*(f"{quoted(n)} {SQL_TYPES[types[n]]}" for n in bare), f"{quoted(topic.name)} struct<{struct}>"]
        )
        return empty_frame(self.spark, ddl)

    def type_of(self, i: int, sql: str, *, own: bool = False) -> str:
        """The SQL type of `sql` over side `i`'s rows; `BadJoinArgument` when Spark cannot analyse it there."""
        try:
            return self._named(i, own).selectExpr(f"({sql}) AS _x").schema["_x"].dataType.simpleString()
        except AnalysisException as e:
            first = str(e).strip().splitlines()[0]
            raise BadJoinArgument("expression", sql, f"over {self.topics[i].name!r}: {first}") from None

    def reads_only(self, i: int, sql: str) -> bool:
        """Whether `sql` (in a view's naming) reads side `i`'s fields only."""
        try:
            self.type_of(i, sql)
            return True
        except BadJoinArgument:
            return False

    def side_field(self, i: int, sql: str, *, own: bool = False) -> str | None:
        """The field of side `i` that `sql` is (a bare name visible there, or `<topic>.<field>`; `own`: every field
        of the side bare, as in the match expressions), else None."""
        m = _PLAIN.match(sql.strip())
        if not m:
            return None
        a, b = m.groups()
        topic = self.topics[i]
        if b is None:
            return a if a in (topic.names if own else self.visible(i)) else None
        return b if a == topic.name and b in topic.names else None

    def one_side(self, sql: str) -> int | None:
        """The side whose fields alone `sql` (in a view's naming) reads, the left first; None when it reads both."""
        return next((i for i in (0, 1) if self.reads_only(i, sql)), None)

    def eval(
        self, i: int, rows: DataFrame, exprs: Sequence[tuple[str, str]], keep: Sequence[str] = ()
    ) -> DataFrame:
        """`rows` of side `i` (its fields as columns) projected to `keep` (SQL texts) and `exprs` ((name, SQL)
        pairs, evaluated over the row; `<topic>.<field>` is a struct of the row's fields, made only when used)."""
        topic = self.topics[i]
        if any(re.search(rf"\b{re.escape(topic.name)}\s*\.", sql) for _, sql in exprs):
            fields = ", ".join(quoted(n) for n in topic.names)
            rows = rows.withColumn(topic.name, F.expr(f"struct({fields})"))
        return rows.selectExpr(*keep, *[f"({sql}) AS {name}" for name, sql in exprs])

    def key_columns(self, i: int) -> list[str]:
        return list(self.topics[i].key)

    def pairs(self, left_rows: DataFrame, right_rows: DataFrame) -> DataFrame:
        """The inner join of the rows of each side (their fields as columns) as `_s0`, `_s1`, `_id` rows."""
        sides = []
        for i, rows in enumerate((left_rows, right_rows)):
            fields = ", ".join(quoted(n) for n in self.topics[i].names)
            sides.append(self.eval(i, rows, [("_m", self.match_sql(i))], keep=[f"struct({fields}) AS _s{i}"]))
        ids = [f"CAST(_s{i}.{quoted(k)} AS string)" for i in (0, 1) for k in self.topics[i].key]
        return (
            sides[0].join(sides[1], "_m").selectExpr("_s0", "_s1", f"to_json(array({', '.join(ids)})) AS _id")
        )

    def view_frame(self, pairs: DataFrame) -> DataFrame:
        """Joined `pairs` (`_s0`, `_s1`, ...) as the rows a view of the job sees: the left's fields and the right's
        not named like one of the left's by their bare names, each side's fields as the struct `<topic>`."""
        left, right = self.topics
        bare = [f"_s0.{quoted(n)} AS {quoted(n)}" for n in left.names]
        bare += [f"_s1.{quoted(n)} AS {quoted(n)}" for n in self.visible(1)]
        return pairs.selectExpr(*bare, f"_s0 AS {quoted(left.name)}", f"_s1 AS {quoted(right.name)}")

    def frame_rows(self, pairs: DataFrame) -> DataFrame:
        """Joined `pairs` in the row layout `views.frame` reads: the left's fields as columns, the right's fields in
        the struct `_s1`, and `_id`."""
        return pairs.selectExpr("_s0.*", "_s1", "_id")

    def view_type(self, sql: str) -> str:
        """The SQL type of `sql` over the rows a view of the job sees; `BadJoinArgument` when Spark cannot analyse
        it there."""
        try:
            return (
                self.view_frame(self.empty_pairs())
                .selectExpr(f"({sql}) AS _x")
                .schema["_x"]
                .dataType.simpleString()
            )
        except AnalysisException as e:
            first = str(e).strip().splitlines()[0]
            raise BadJoinArgument("expression", sql, f"over the join's rows: {first}") from None

    def empty_pairs(self) -> DataFrame:
        s = [", ".join(f"{quoted(n)}:{SQL_TYPES[t]}" for n, t in self.topics[i].fields) for i in (0, 1)]
        return empty_frame(self.spark, f"_s0 struct<{s[0]}>, _s1 struct<{s[1]}>, _id string")


def _latest_changes(topic: Topic, before: DataFrame, batch: DataFrame) -> DataFrame:
    """Changed rows of a topic without `final_deletes`: per key the greatest `changelog.current.rank` wins."""
    keys, time = list(topic.key), quoted(topic.time)
    values = [n for n in topic.values if n != topic.time]
    reduced = batch.groupBy(*keys).agg(F.expr(f"max({rank(topic)}) AS _n"))
    b = before.join(reduced.select(*keys), keys, "left_semi")
    j = reduced.alias("_N").join(b.alias("_B"), keys, "left")
    old_rank = ", ".join(
        [f"_B.{time} AS _t", "_B._remove AS _r", *(f"_B.{quoted(v)} AS {quoted(v)}" for v in values)]
    )
    fields = {n: f"_w.{quoted(n)}" for n in values} | {topic.time: "_w._t"}
    return (
        j.selectExpr(
            *map(quoted, keys),
            "_N._n AS _n",
            f"CASE WHEN _B._remove IS NOT NULL THEN struct({old_rank}) END AS _o",
            "coalesce(_B._upsert AND NOT _B._remove, false) AS _lb",
            f"struct({', '.join(f'_B.{quoted(n)} AS {quoted(n)}' for n in topic.names)}) AS _old",
        )
        .selectExpr("*", "greatest(_o, _n) AS _w")
        .where("_o IS NULL OR NOT (_o <=> _w)")
        .selectExpr(
            *(f"{fields[n]} AS {quoted(n)}" if n in fields else quoted(n) for n in topic.names),
            "NOT _w._r AS _upsert",
            "_w._r AS _remove",
            "_lb AS _live_before",
            "NOT _w._r AS _live_after",
            "_lb AND NOT _w._r AS _moved",
            "_old",
        )
    )


def _final_changes(topic: Topic, before: DataFrame, batch: DataFrame) -> DataFrame:
    """Changed rows of a topic with `final_deletes`: the greatest upsert by `changelog.current.upsert_rank`, and a
    remove seen once is final. A key with no upsert yet takes its `remove_fields` from a remove."""
    keys, time, remove = list(topic.key), quoted(topic.time), is_remove(topic)
    values = [n for n in topic.values if n != topic.time]
    kept = ", ".join(map(quoted, topic.remove_fields)) or "true AS _x"
    reduced = batch.groupBy(*keys).agg(
        F.expr(f"max(CASE WHEN NOT ({remove}) THEN {upsert_rank(topic)} END) AS _p"),
        F.expr(f"max(CASE WHEN {remove} THEN struct({kept}) END) AS _d"),
    )
    b = before.join(reduced.select(*keys), keys, "left_semi")
    j = reduced.alias("_N").join(b.alias("_B"), keys, "left")
    old_rank = ", ".join([f"_B.{time} AS _t", *(f"_B.{quoted(v)} AS {quoted(v)}" for v in values)])
    fields = {n: f"_np.{quoted(n)}" for n in values} | {topic.time: "_np._t"}
    fields |= {n: f"coalesce(_np.{quoted(n)}, _old.{quoted(n)}, _d.{quoted(n)})" for n in topic.remove_fields}
    names = list(map(quoted, topic.names))
    old = ", ".join(f"_old.{n} AS {n}" for n in names)
    return (
        j.selectExpr(
            *map(quoted, keys),
            "_N._p AS _p",
            "_N._d AS _d",
            f"_B.{quoted(keys[0])} IS NULL AS _new",
            f"greatest(CASE WHEN _B._upsert THEN struct({old_rank}) END, _N._p) AS _np",
            "coalesce(_B._upsert, false) AS _wu",
            "coalesce(_B._remove, false) AS _wr",
            f"struct({', '.join(f'_B.{n} AS {n}' for n in names)}) AS _old",
        )
        .selectExpr(
            *(f"{fields[n]} AS {quoted(n)}" if n in fields else quoted(n) for n in topic.names),
            "_wu OR _p IS NOT NULL AS _upsert",
            "_wr OR _d IS NOT NULL AS _remove",
            "_wu AND NOT _wr AS _live_before",
            "_new",
            "_wu",
            "_wr",
            "_old",
        )
        .where(
            f"_new OR NOT (struct({', '.join(names)}, _upsert, _remove) <=> struct({old}, _wu AS _upsert, _wr AS _remove))"
        )
        .selectExpr(
            *names,
            "_upsert",
            "_remove",
            "_live_before",
            "_upsert AND NOT _remove AS _live_after",
            "_live_before AND _upsert AND NOT _remove AS _moved",
            "_old",
        )
    )


def side_changes(topic: Topic, before: DataFrame, batch: DataFrame) -> DataFrame:
    """The rows of `before` (a side's state) that `batch` (records of the topic: its log's columns) changes, as they
    are after it (`changes_schema`). The key's rows of the state are selected first (a semi join that streams the
    state past the small batch), so the outer join never hashes or ships the whole state."""
    changes = _final_changes if topic.final_deletes else _latest_changes
    return changes(topic, before, batch)


def replace_rows(state: DataFrame, changed: DataFrame, keys: list[str], cols: list[str]) -> DataFrame:
    """`state` with the rows of `changed` (same keys) replaced or inserted, a plan of `spark.sql.shuffle.partitions`
    partitions: a union adds its inputs' partitions, so without the coalesce a state kept by a broadcast anti join
    would gain some in every batch."""
    rows = changed.selectExpr(*cols)
    parts = int(state.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    kept = state.join(changed.select(*keys), keys, "left_anti")
    return kept.unionByName(rows).coalesce(parts)


def count_changes(rows: list[tuple[DataFrame | None, tuple[str, ...]]]) -> list[tuple[int, ...]]:
    """For each (changes, conditions) of `rows` (changes None: a side without a batch, all zero), its row count and
    the count of rows meeting each condition (SQL text), all computed by one Spark job (it materializes the lazy
    checkpoints)."""
    width = max(len(conds) for _, conds in rows)
    flags = []
    for i, (df, conds) in enumerate(rows):
        if df is not None:
            conds = (*conds, *["false"] * (width - len(conds)))
            cols = [f"CAST(coalesce({c}, false) AS int) AS c{j}" for j, c in enumerate(conds)]
            flags.append(df.selectExpr(f"{i} AS part", *cols))
    counts = {}
    if flags:
        union = functools.reduce(DataFrame.unionByName, flags)
        sums = [F.sum(f"c{j}") for j in range(width)]
        for row in union.groupBy("part").agg(F.count("*"), *sums).collect():
            counts[row[0]] = row[1:]
    return [
        tuple(int(x) for x in counts.get(i, (0,) * (len(c) + 1))[: len(c) + 1])
        for i, (_, c) in enumerate(rows)
    ]


def count_parts(dfs: list[DataFrame]) -> list[int]:
    """The row count of each of `dfs` (lazy local checkpoints among them are materialized), in one Spark job."""
    union = functools.reduce(
        DataFrame.unionByName, [df.selectExpr(f"{i} AS part") for i, df in enumerate(dfs)]
    )
    got = dict(union.groupBy("part").count().collect())
    return [int(got.get(i, 0)) for i in range(len(dfs))]


@dataclass(frozen=True)
class TableState:
    """The join's state: each side's current table (`state_schema`, one row per key ever seen) and, per list view
    with a fan-out limit, its heavy match values (derived from the list side; None or absent: not computed yet)."""

    sides: tuple[DataFrame, DataFrame]
    heavy: Mapping[str, DataFrame | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Begun:
    """A batch whose changed rows are planned, not counted (what `ListPart.posts` and `counted` see)."""

    join: TableJoin
    before: TableState
    changes: tuple[DataFrame, DataFrame]  # per side: changed rows (lazy local checkpoints, or empty frames)
    present: tuple[bool, bool]  # per side: whether the batch holds records of it


@dataclass(frozen=True)
class Counted:
    """A batch counted (what `ListPart.finish` sees): the changes with their counts and the state after it as plans
    over the state before (`JoinChanges.settle` computes it)."""

    join: TableJoin
    before: TableState
    after: TableState
    changes: tuple[DataFrame, DataFrame]
    n: tuple[dict, dict]  # per side: rows, born, died, gained, lost (0: no plan branch)


class ListPart(Protocol):
    """A list view's own algorithm taking part in a step (`joins.table_list.ListShape`)."""

    name: str

    def restore(self, join: TableJoin, state: TableState) -> TableState: ...

    def posts(self, begun: Begun) -> Any: ...

    def counted(self, begun: Begun, frames: list[DataFrame], tag: str) -> list[tuple[int, str]]: ...

    def finish(self, counted: Counted, n: dict, posts: Any) -> Any: ...


@dataclass
class JoinChanges:
    """One batch's changes. The delta (`removed`, `added`), each list's plans and the changed state rows are planned
    on first use, so a view can publish what it needs first before the rest is planned."""

    join: TableJoin
    before: TableState
    after: TableState  # the state after the batch, as plans over the state before (`settle` computes it)
    changes: tuple[DataFrame, DataFrame]
    counts: tuple[dict, dict]  # per side: rows, born, died, gained, lost
    lists: dict[str, Any] = field(default_factory=dict)  # list view name -> its changes (`joins.table_list`)
    _plans: dict = field(default_factory=dict)
    _cached: list = field(default_factory=list)
    _settled: dict = field(default_factory=dict)

    def _plan(self, name: str):
        if callable(self._plans[name]):
            self._plans[name] = self._plans[name]()
        return self._plans[name]

    @property
    def removed(self) -> DataFrame:
        """`_s0`, `_s1`, `_id`: the joined rows the batch removed, with their values before it."""
        return self._plan("delta")[0]

    @property
    def added(self) -> DataFrame:
        """`_s0`, `_s1`, `_id`: the joined rows the batch added, with their values after it."""
        return self._plan("delta")[1]

    def side_rows(self, i: int) -> DataFrame:
        """Side `i`'s changed state rows (`state_schema`)."""
        return self.changes[i].selectExpr(*state_columns(self.join.topics[i]))

    def settle(self) -> TableState:
        """The state after the batch, computed (the tables the batch changed, as local checkpoints, in one Spark job)
        the first time and kept: the state for the next batch. A sink's plans may run before or while it does; it
        must run before `release()`."""
        if "state" not in self._settled:
            changed = [i for i in (0, 1) if self.after.sides[i] is not self.before.sides[i]]
            tables = {i: self.after.sides[i].localCheckpoint(eager=False) for i in changed}
            rows = count_parts(list(tables.values())) if tables else []
            sides = list(self.after.sides)
            for (i, df), n in zip(tables.items(), rows, strict=True):
                sides[i] = with_row_count(df, n)
            self._settled["state"] = replace(self.after, sides=tuple(sides))
        return self._settled["state"]

    def release(self) -> None:
        """Free the batch-sized intermediate results (the lists' too) once the batch is published and the state
        committed."""
        for df in [*self._cached, *(df for got in self.lists.values() for df in got.cached)]:
            df.unpersist()


@dataclass(frozen=True)
class JoinStep:
    """One micro-batch whose changed rows are planned but not yet counted (`begin_join`): `posts` (list view name ->
    its posts, or None) can be published first; `finish()` counts the changes (one Spark job) and plans the rest."""

    posts: dict[str, Any]
    _finish: Callable[[], JoinChanges]

    def finish(self) -> JoinChanges:
        return self._finish()


def begin_join(
    join: TableJoin,
    state: TableState,
    batches: tuple[DataFrame | None, DataFrame | None],
    lists: Sequence[ListPart] = (),
) -> JoinStep:
    """`maintain_join` in two steps (same arguments, same changes): the batch's changed rows planned as lazy local
    checkpoints (computed by the first Spark job that uses them) and each list's posts; then `finish()`.

    Local checkpoints rather than `persist()`: a checkpoint's lineage is cut, so a result used twice in one query is
    never recomputed (Spark does not always substitute a persisted plan)."""
    for part in lists:
        state = part.restore(join, state)
    changes = tuple(
        empty_frame(join.spark, changes_schema(topic))
        if batch is None
        else side_changes(topic, before, batch).localCheckpoint(eager=False)
        for topic, before, batch in zip(join.topics, state.sides, batches, strict=True)
    )
    begun = Begun(join, state, changes, tuple(b is not None for b in batches))
    posts = {part.name: part.posts(begun) for part in lists}
    return JoinStep(posts, functools.partial(_finish, begun, tuple(lists), posts))


def maintain_join(
    join: TableJoin,
    state: TableState,
    batches: tuple[DataFrame | None, DataFrame | None],
    lists: Sequence[ListPart] = (),
) -> JoinChanges:
    """The changes one micro-batch causes and the state after it (see the module docstring).

    `state` is not modified. `batches`: per side, the batch's records of that topic (its log's columns), or None when
    the batch has none. Batch-sized intermediates are cached until `release()`; the new state is computed by
    `settle()` (or by the first plan that uses it), which must come before `release()`."""
    return begin_join(join, state, batches, lists).finish()


_SIDE_CONDITIONS = (BORN, DIED, GAINED, LOST)


def _finish(begun: Begun, lists: tuple[ListPart, ...], posts: dict) -> JoinChanges:
    join, state = begun.join, begun.before
    frames = list(begun.changes)
    extra = [part.counted(begun, frames, f"_h{j}") for j, part in enumerate(lists)]
    rows = [
        (
            frames[i] if begun.present[i] else None,
            (*_SIDE_CONDITIONS, *[c for e in extra for s, c in e if s == i]),
        )
        for i in (0, 1)
    ]
    counted = count_changes(rows)
    n = tuple(
        dict(zip(["rows", "born", "died", "gained", "lost"], counted[i][:5], strict=True)) for i in (0, 1)
    )
    changes = tuple(with_row_count(df, n[i]["rows"]) for i, df in enumerate(begun.changes))
    sides = tuple(
        replace_rows(before, changes[i], join.key_columns(i), state_columns(join.topics[i]))
        if n[i]["rows"]
        else before
        for i, before in enumerate(state.sides)
    )
    after = replace(state, sides=sides)
    c = Counted(join, state, after, changes, n)
    out = JoinChanges(join, state, after, changes, n, _cached=list(changes), _settled={})
    out._plans["delta"] = functools.partial(_delta, c)
    heavy = dict(state.heavy)
    for j, part in enumerate(lists):
        mine = iter(counted[s][5 + k] for s, k in _extra_positions(extra, j))
        got = part.finish(c, {"extra": list(mine)}, posts.get(part.name))
        out.lists[part.name] = got
        heavy[part.name] = got.heavy_after
    out.after = replace(after, heavy=heavy)
    return out


def _extra_positions(extra: list[list[tuple[int, str]]], j: int) -> list[tuple[int, int]]:
    """(side, index among that side's extra conditions) of list `j`'s conditions."""
    seen, out = [0, 0], []
    for k, conds in enumerate(extra):
        for side, _ in conds:
            if k == j:
                out.append((side, seen[side]))
            seen[side] += 1
    return out


def _delta(c: Counted) -> tuple[DataFrame, DataFrame]:
    """(removed, added): see the module docstring."""
    join, n = c.join, c.n
    live_before = [df.where(LIVE) for df in c.before.sides]
    live_after = [df.where(LIVE) for df in c.after.sides]
    old = [c.changes[i].where(DIED).select("_old.*") for i in (0, 1)]
    new = [c.changes[i].where(BORN).selectExpr(*map(quoted, join.topics[i].names)) for i in (0, 1)]
    keys = join.key_columns(0)
    removed, added = [], []
    if n[0]["died"]:
        removed.append(join.pairs(old[0], live_before[1]))
    if n[1]["died"]:
        kept = live_before[0].join(c.changes[0].where(DIED).select(*keys), keys, "left_anti")
        removed.append(join.pairs(kept, old[1]))
    if n[0]["born"]:
        added.append(join.pairs(new[0], live_after[1]))
    if n[1]["born"]:
        kept = live_after[0].join(c.changes[0].where(BORN).select(*keys), keys, "left_anti")
        added.append(join.pairs(kept, new[1]))

    def union(parts: list[DataFrame]) -> DataFrame:
        return functools.reduce(DataFrame.unionByName, parts) if parts else join.empty_pairs()

    return union(removed), union(added)
