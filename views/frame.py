"""A job's rows as the DataFrame its views' expressions are evaluated on, and the evaluation of those expressions.

A job gives its rows in one layout for every kind (`joins.interval`, `joins.asof`, the table join, `joins.select`):
- the first topic's fields (left, stream, the selected topic) as columns under their own names;
- the second topic's fields (right, table) in one struct column `_s1` (null when the row has no second side; none
  for a select);
- `_matches` (interval: the left event's matching right events so far), `_version` (asof: the version's id);
- any other column the job needs, its name starting with `_` (`_id`: the row's identity; `_closed`, ...).

A batch's *row changes* (what the views of a job that gives them consume, `views.agg`) are such rows with
`_id` (the row's identity, unique among the job's live rows), `_sign` (1: the row was added, -1: it was removed; a
row that changes is removed and added again under its `_id`) and `_time` (the row's event time in epoch ms: the
event's for a select of an event topic, the left or stream event's for interval and asof; null for rows of tables).

`view_rows(rows, pipeline, job)` makes of them what a view sees (`spec.model.Pipeline.row_columns`): the bare names
(the first side's fields, then the second side's fields whose names the first does not have, then `matches` or
`version`), one struct column per side topic named like the topic holding all its fields (so `customers.tier` is a
field of the struct `customers`, and `tier` the bare column), and every `_` column kept as it is.

`select_view(frame, view, pipeline)` evaluates a view's expressions there, all in one `selectExpr` (Spark SQL in
the JVM; no Python per row): `_key` (the key, as a string), `_where` (false where `where` is false or null),
the fields and values under their names, `_entry` and `_order0..` (list views). An expression Spark cannot analyse
(a typo, an unknown column, a type that does not fit) raises `ExpressionError`: one line naming the pipeline file,
the line and key path of the expression, the expression and Spark's message, never a Java traceback.
`check_job(spark, pipeline, job)` analyses every expression of a job (its match expressions and its views') on
empty frames, so a job finds them before it reads anything.

`line_sql(view)` is the SQL text of a row's export line (`{"<key name>": key, <field>: value, ...}`, null fields
kept) over `select_view`'s output.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

from pyspark.errors import AnalysisException
from pyspark.logger import PySparkLogger
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, NumericType

from changelog.current import quoted
from joins.sparkapi import jvm, parse_expression
from joins.state import empty_frame
from spec.model import MATCHES, SQL_TYPES, VERSION, Pipeline, View
from spec.sql import JAVA_FUNCTIONS
from views.errors import ViewError
from views.wire import lit

__all__ = [
    "ExpressionError",
    "view_rows",
    "empty_rows",
    "select_view",
    "evaluate",
    "check_job",
    "check_view",
    "check_sums",
    "line_sql",
    "mentions",
    "view_path",
]

_PARTS = ("key", "where", "fields", "values", "entry", "order")


class ExpressionError(ViewError):
    """An expression of a pipeline that Spark cannot use: `where` (`<file>:<line>: <key path>`), the `expression`
    as written, and `reason` (the first line of Spark's message)."""

    def __init__(self, where: str, expression: str, reason: str):
        super().__init__(f"{where}: {expression}: {reason}")
        self.where, self.expression, self.reason = where, expression, reason


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    line = next((x.strip() for x in text.splitlines() if x.strip()), text)
    # a position is in the text we gave Spark (the expression wrapped in a projection), not the user's
    return re.sub(r";?\s*\(?line \d+,? pos \d+\)?$", "", line).rstrip(";").strip()


def view_path(view: View, part: str, name: str | int | None = None) -> tuple:
    """The key path of a view's expression in the pipeline file: `part` is key, where, fields, values, entry or
    order (`name`: the field or value name, the order term's index)."""
    base = ("jobs", view.job, "views", view.name)
    if part == "key":
        return (*base, view.kind, view.key_name)
    if part == "fields" and view.kind == "log":
        return (*base, "log", "fields", name)
    return (*base, part) if name is None else (*base, part, name)


@contextmanager
def _quiet():
    """PySpark logs every analysis error it raises, with the JVM's stack trace, on stderr: not those we report.
    The loggers are PySpark's own class (`PySparkLogger.getLogger`): one made first by `logging.getLogger` stays a
    plain `Logger`, which every later analysis error raised elsewhere in the process (not quiet) calls with
    PySpark's keyword arguments, a TypeError instead of the AnalysisException (a join's `reads_only` probe)."""
    loggers = [PySparkLogger.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    was = [x.disabled for x in loggers]
    for x in loggers:
        x.disabled = True
    try:
        yield
    finally:
        for x, w in zip(loggers, was, strict=True):
            x.disabled = w


def evaluate(
    df: DataFrame, exprs: list[tuple[str, str, str, tuple]], pipeline: Pipeline, *, keep=()
) -> DataFrame:
    """`df` projected to its columns `keep` and, per `(alias, sql, written, path)` of `exprs`, the SQL text `sql`
    as `alias`. When Spark cannot analyse them, `ExpressionError` names the first expression that fails alone:
    `written` (the expression as the pipeline writes it) at key `path` of the pipeline file."""
    texts = [f"(\n{sql}\n) AS {quoted(alias)}" for alias, sql, _, _ in exprs]
    with _quiet():
        try:
            return df.selectExpr(*[quoted(k) for k in keep], *texts)
        except AnalysisException as whole:
            failed = _first_line(whole)
        for text, (_, _, written, path) in zip(texts, exprs, strict=True):
            try:
                df.selectExpr(text)
            except AnalysisException as e:
                raise ExpressionError(pipeline.where(*path), written, _first_line(e)) from None
    raise ExpressionError(pipeline.where("jobs"), "; ".join(w for *_, w, _ in exprs), failed)


def _view_exprs(view: View, parts) -> list[tuple[str, str, str, tuple]]:
    out = []
    if "key" in parts and view.key is not None:
        out.append(("_key", f"CAST((\n{view.key[1]}\n) AS string)", view.key[1], view_path(view, "key")))
    if "where" in parts:
        where = view.where or "true"
        out.append(("_where", f"coalesce((\n{where}\n), false)", where, view_path(view, "where")))
    if "fields" in parts:
        out += [(n, e, e, view_path(view, "fields", n)) for n, e in view.fields]
    if "values" in parts:
        out += [(n, e, e, view_path(view, "values", n)) for n, e in view.values]
    if "entry" in parts and view.entry is not None:
        out.append(("_entry", view.entry, view.entry, view_path(view, "entry")))
    if "order" in parts:
        out += [(f"_order{i}", e, e, view_path(view, "order", i)) for i, (e, _) in enumerate(view.order)]
    return out


def select_view(frame: DataFrame, view: View, pipeline: Pipeline, *, parts=_PARTS, keep=()) -> DataFrame:
    """The view's expressions over `frame` (`view_rows`): `_key`, `_where`, its fields and values by name, `_entry`,
    `_order0..`, those of `parts` the view has, after the columns `keep` of `frame` (see the module docstring)."""
    return evaluate(frame, _view_exprs(view, parts), pipeline, keep=keep)


def view_rows(rows: DataFrame, pipeline: Pipeline, job: str) -> DataFrame:
    """`rows` (a join's rows in the layout of the module docstring) as the columns a view of `job` sees."""
    first, *rest = pipeline.sides(job)
    kind = pipeline.jobs[job].kind
    cols = []
    for name, _ in pipeline.row_columns(job):
        if name in first.names:
            cols.append(F.col(quoted(name)))
        elif kind == "interval" and name == MATCHES:
            cols.append(F.col("_matches").alias(name))
        elif kind == "asof" and name == VERSION:
            cols.append(F.col("_version").alias(name))
        else:
            cols.append(F.col("_s1")[name].alias(name))
    bare = {n for n, _ in pipeline.row_columns(job)}
    structs = [(first.name, F.struct(*[F.col(quoted(n)) for n in first.names]))]
    if kind not in ("interval", "select") and rest[0].name != first.name:
        structs.append((rest[0].name, F.col("_s1")))
    cols += [c.alias(t) for t, c in structs if t not in bare]
    cols += [F.col(quoted(c)) for c in rows.columns if c.startswith("_")]
    return rows.select(*cols)


def empty_rows(spark, pipeline: Pipeline, job: str) -> DataFrame:
    """An empty DataFrame of `job`'s rows (the layout of the module docstring), for analysing expressions."""
    first, *rest = pipeline.sides(job)
    kind = pipeline.jobs[job].kind
    cols = [(n, SQL_TYPES[t]) for n, t in first.fields]
    if kind in ("asof", "join"):
        inner = ",".join(f"{quoted(n)}:{SQL_TYPES[t]}" for n, t in rest[0].fields)
        cols.append(("_s1", f"struct<{inner}>"))
    if kind != "select":
        cols.append(("_matches", "bigint") if kind == "interval" else ("_version", "string"))
    cols += [("_id", "string"), ("_sign", "int"), ("_time", "bigint")]
    return empty_frame(spark, ", ".join(f"{quoted(n)} {t}" for n, t in cols))


def _check_matches(spark, pipeline: Pipeline, job: str) -> None:
    j = pipeline.jobs[job]
    path = ("jobs", job, j.kind, "match")
    for i, topic in enumerate(pipeline.sides(job) if j.spec.match else ()):
        if i == 1 and j.kind == "asof":
            continue  # the table side of an asof match is its key fields (checked with the file)
        exprs = [(f"_m{n}", pair[i], pair[i], (*path, pair[0])) for n, pair in enumerate(j.spec.match)]
        evaluate(empty_frame(spark, topic.schema()), exprs, pipeline)


def _parsed_nodes(spark, text: str):
    """The nodes of the expression `text` as Spark's parser reads it (unresolved; a subquery's plan not entered),
    or none when it does not parse (the analysis says why)."""
    from pyspark.errors import ParseException

    with _quiet():
        try:
            stack = [parse_expression(spark, text)]
        except (ParseException, AnalysisException):
            return
    while stack:
        node = stack.pop()
        yield node
        kids = node.children()
        stack += [kids.apply(i) for i in range(kids.size())]


def _outside_reach(spark, text: str) -> str | None:
    """Why the expression `text` may not run (`spec.sql`: a call of a Java reflection function, a subquery), from
    Spark's own parse of it (no scan of the text to fool)."""
    subquery = jvm(spark).java.lang.Class.forName(
        "org.apache.spark.sql.catalyst.expressions.SubqueryExpression"
    )
    for node in _parsed_nodes(spark, text):
        if node.getClass().getSimpleName() == "UnresolvedFunction":
            parts = node.nameParts()
            name = str(parts.apply(parts.size() - 1)).lower()
            if name in JAVA_FUNCTIONS:
                return f"{name}() calls Java methods, which a pipeline may not (none of {', '.join(JAVA_FUNCTIONS)})"
        if subquery.isInstance(node):
            return "a subquery (SELECT) reads beyond the job's rows, which a pipeline may not"
    return None


def _refuse_outside_reach(spark, pipeline: Pipeline, job: str) -> None:
    """`ExpressionError` for the first expression of `job` (match, views) that calls Java or holds a subquery."""
    j = pipeline.jobs[job]
    exprs = [(e, ("jobs", job, j.kind, "match", a)) for a, b in j.spec.match for e in (a, b)]
    exprs += [(w, path) for v in j.views for _, _, w, path in _view_exprs(v, _PARTS)]
    for text, path in exprs:
        why = _outside_reach(spark, text)
        if why:
            raise ExpressionError(pipeline.where(*path), text, why)


def check_job(spark, pipeline: Pipeline, job: str) -> None:
    """Analyse every expression of `job` (its match expressions, each view's key, where, fields, values, entry and
    order) on empty frames; raises `ExpressionError` for the first one that calls Java or holds a subquery
    (`spec.sql`; checked on Spark's parse), that Spark cannot use, a count value that is not a number, or an agg
    view's aggregate that `views.agg.check_agg` refuses. Runs no Spark job."""
    _refuse_outside_reach(spark, pipeline, job)
    _check_matches(spark, pipeline, job)
    from views.kinds import KINDS  # the kinds' modules evaluate with this module

    frame = view_rows(empty_rows(spark, pipeline, job), pipeline, job)
    for view in pipeline.jobs[job].views:
        KINDS[view.kind].check(frame, view, pipeline)


def check_view(frame: DataFrame, view: View, pipeline: Pipeline) -> None:
    """Analyse `view`'s expressions (key, where, fields, entry, order) over `frame` (`check_job`'s): what a view kind
    checks when it has no check of its own. Raises `ExpressionError`."""
    select_view(frame, view, pipeline)


def check_sums(frame: DataFrame, view: View, pipeline: Pipeline) -> None:
    """`check_view`, and each of the view's values is a number (or a boolean, counted as 1): a count view's check."""
    out = select_view(frame, view, pipeline)
    for name, expr in view.values:
        kind = out.schema[name].dataType
        if not isinstance(kind, (NumericType, BooleanType)):
            why = f"a count's value is a number (or a boolean, counted as 1), not a {kind.simpleString()}"
            raise ExpressionError(pipeline.where(*view_path(view, "values", name)), expr, why)


def line_sql(view: View, key: str = "_key") -> str:
    """SQL text of the export line of a row of `view` over `select_view`'s output: a JSON object of the key (the
    column `key`, under the key's name, when the view has one) and the fields in declared order, null fields
    kept."""
    parts = [f"{lit(view.key_name)}, {quoted(key)}"] if view.key is not None else []
    parts += [f"{lit(n)}, {quoted(n)}" for n, _ in view.fields]
    return f"to_json(named_struct({', '.join(parts)}), map('ignoreNullFields', 'false'))"


def mentions(view: View, names, parts=("key", "where")) -> bool:
    """Whether the expressions of `parts` of `view` may refer to any of `names` (a word of the expression text
    equal to one of them, case-insensitive: a string literal holding the name counts too, which only costs work)."""
    texts = []
    if "key" in parts and view.key is not None:
        texts.append(view.key[1])
    if "where" in parts and view.where is not None:
        texts.append(view.where)
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(n) for n in names) + r")\b", re.IGNORECASE)
    return any(pattern.search(t) for t in texts)
