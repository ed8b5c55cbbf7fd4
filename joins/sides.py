"""A join job's two topics as its roles: both read as one stream, each side's records, identities and keys.

A join job reads its two topics (`spec.model.Job.topics`: left and right, stream and table) in one streaming
query. `TwoTopics.stream` projects each topic's log onto one schema (`TwoTopics.schema`):
- `_side`: 0 for the job's first topic, 1 for its second;
- the columns each side computes over its own records (`computed`, e.g. the match keys `_k0..`, the identity
  `_id`, the time `_t`): the same names and types on both sides;
- each side's own columns it carries (`keep`), as `_<side>_<name>` (null on the other side's rows).
`TwoTopics.rows(batch, i)` gives back side i's rows: the computed columns and its own columns under their own names.
`_side` is a literal of each branch of the union, so a filter on it reads only that topic's files (and only the
columns used).

Identities and keys are SQL text over a topic's columns:
- `identity_sql(topic)`: a record's identity as text: its `id` (event topic) or `key` (table topic) field's value,
  or, for several fields, a JSON array of their values (as text);
- `key_text_sql(exprs)`: a key as the contract writes it in a version id (`<key>@<ms>`): the values' text joined
  by `|`, null when one of them is null.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.current import quoted
from changelog.storage import Lake
from changelog.topics import MAX_BEFORE, read_stream
from spec.model import Topic

__all__ = [
    "TwoTopics",
    "dedupe_records",
    "identity_sql",
    "key_text_sql",
    "topic_stream",
    "own_columns",
    "sql_type",
]


def identity_sql(topic: Topic) -> str:
    """SQL text: the identity of a record of `topic` as a string (see the module docstring)."""
    names = topic.identity
    if len(names) == 1:
        return f"CAST({quoted(names[0])} AS string)"
    return f"to_json(array({', '.join(f'CAST({quoted(n)} AS string)' for n in names)}))"


def dedupe_records(records: DataFrame, topic: Topic, *, least: tuple[str, ...] = ()) -> DataFrame:
    """One row per `_id` of `records` (`topic`'s fields and `_id`): a record delivered twice has the effect of one;
    of records sharing an id with different content, the smallest by (time, the other fields in declared order) is
    kept. Each column of `least` is carried as its least value among the id's copies, null the least of all (the
    log's stamp `changelog.topics.MAX_BEFORE`: the earliest copy's; a copy in the log's first version has none)."""
    others = [n for n in topic.names if n not in topic.identity and n != topic.time]
    order = [topic.time, *others, *topic.identity]  # the id fields last: equal in every copy of one id
    return (
        records.groupBy("_id")
        .agg(
            F.min(F.struct(*[F.col(quoted(n)) for n in order])).alias("e"),
            *[F.when(~F.expr(f"bool_or({quoted(c)} IS NULL)"), F.min(quoted(c))).alias(c) for c in least],
        )
        .select(*[F.col("e")[n].alias(n) for n in topic.names], "_id", *least)
    )


def key_text_sql(exprs) -> str:
    """SQL text: the values of `exprs` (SQL texts) as one key text, joined by `|` (null when one is null)."""
    parts = [f"CAST((\n{e}\n) AS string)" for e in exprs]
    sep = ", '|', "
    return parts[0] if len(parts) == 1 else f"concat({sep.join(parts)})"


def own_columns(topic: Topic) -> tuple[str, ...]:
    """The columns of `topic`'s log (`op` first when it has one, then its fields)."""
    return tuple(n for n, _ in topic.columns())


def sql_type(df: DataFrame, column: str) -> str:
    """The SQL type of `column` of `df` (`bigint`, `string`, `struct<a:string>`, ...)."""
    return df.schema[column].dataType.simpleString()


def topic_stream(spark, lake: Lake, topic: Topic, *, max_files_per_trigger: int | None = None) -> DataFrame:
    """`topic`'s log in `lake` as a streaming DataFrame from its start (the checkpoint decides where to resume):
    `changelog.topics.read_stream`, which creates the log if it does not exist and refuses a declaration its
    records do not follow."""
    return read_stream(spark, lake, topic, max_files_per_trigger=max_files_per_trigger)


@dataclass(frozen=True)
class TwoTopics:
    """A job's two topics read as one stream (see the module docstring).

    computed: per side, (name, SQL text over that side's own columns) of the computed columns, in `types` order.
    types: (name, SQL type) of the computed columns (each side's values are cast to it).
    keep: per side, the own columns carried (default: all of the topic's columns)."""

    topics: tuple[Topic, Topic]
    computed: tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]
    types: tuple[tuple[str, str], ...]
    keep: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    def carried(self, i: int) -> tuple[str, ...]:
        return own_columns(self.topics[i]) if self.keep is None else self.keep[i]

    def _own_types(self, i: int) -> dict[str, str]:
        return {**dict(self.topics[i].columns()), MAX_BEFORE: "bigint"}

    def schema(self) -> str:
        """The union's columns as a SQL schema string."""
        cols = [("_side", "int"), *self.types]
        for i in (0, 1):
            types = self._own_types(i)
            cols += [(f"_{i}_{c}", types[c]) for c in self.carried(i)]
        return ", ".join(f"{quoted(n)} {t}" for n, t in cols)

    def project(self, df: DataFrame, i: int) -> DataFrame:
        """Records of side i (its log's columns) in the union's schema."""
        sql = dict(self.computed[i])
        exprs = [f"CAST({i} AS int) AS _side"]
        exprs += [f"CAST((\n{sql[n]}\n) AS {t}) AS {quoted(n)}" for n, t in self.types]
        for j in (0, 1):
            types = self._own_types(j)
            for c in self.carried(j):
                value = quoted(c) if j == i and c in df.columns else f"CAST(NULL AS {types[c]})"
                exprs.append(f"{value} AS {quoted(f'_{j}_{c}')}")
        return df.selectExpr(*exprs)

    def stream(self, spark, lake: Lake, *, max_files_per_trigger: int | None = None) -> DataFrame:
        """Both topics' logs in `lake` as one streaming DataFrame in the union's schema."""
        a, b = (
            self.project(topic_stream(spark, lake, t, max_files_per_trigger=max_files_per_trigger), i)
            for i, t in enumerate(self.topics)
        )
        return a.unionByName(b)

    def rows(self, batch: DataFrame, i: int, *, extra: tuple[str, ...] = ()) -> DataFrame:
        """Side i's rows of `batch` (the union's schema): its carried columns under their own names (first: where
        ties between copies of a record are broken by its columns, they come in declared order), the computed
        columns, and `extra` columns of the batch."""
        own = [F.col(quoted(f"_{i}_{c}")).alias(c) for c in self.carried(i)]
        names = [n for n, _ in self.types]
        return batch.where(F.col("_side") == i).select(*own, *names, *extra)
