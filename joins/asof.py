"""Stream-table join against a versioned table: each stream event joined with exactly one version of its key.

A pipeline's `asof` job (`spec.model.Asof`, laid out by `AsofSides`): `stream` an event topic, `table` a table
topic (the changelog of a keyed table), `match` the stream's expressions giving the table's key, `pin` optionally
a stream field naming a version. The table is kept as a local, versioned copy (SCD type 2): every change of every
key is a version with the id `<key>@<time in epoch ms>` (`<key>`: the key fields' text joined by `|`,
`joins.sides.key_text_sql`), valid from its time to the next version's. A remove is a version too: the table's
fields are null from its time on. Two different changes of one key with the same time resolve by the
current-table rule (`changelog.current`): a remove wins, then the change whose non-key fields, in declared order,
are greatest (null smallest); a change delivered twice is one version. So the copy is a function of the *set* of
changes only. `version_rows` makes the copy's rows of change records (`AsofSides.version_schema`; duplicates
kept, resolved when read).

`asof_join(events, versions, sides, watermark_ms=...)` decides, for each candidate event (one row per identity
`_id`, `dedupe_events`):
- emitted only once the table's watermark (its greatest change time minus the allowed lateness, computed by the
  caller) is >= the event's time; until then it is held (returned in `held`, for the caller to keep durably);
- with its pin set: exactly that version (the table's fields null if it is a remove), `version` the pin. A pin to
  a version never seen is emitted with null table fields and the pin kept, once the watermark has also passed the
  pinned time (a later arrival could still bring it before that), and flagged `_unknown`; a pin that is not of the
  form `<key>@<ms>` can never be seen and is emitted the same way at once;
- without a pin: the version in force at the event's time (the latest version with time <= the event's); none,
  or a remove, gives `version` and the table's fields null.
The decision depends only on the set of changes with time <= the watermark, which are all known once the
watermark has passed (changes later than the allowed lateness are the producer's error), so the output never
depends on how the two logs interleave or on batch boundaries.

Output (`AsofResult.decided`, the layout of `views.frame`): the stream's fields, `_id`, `_s1` (a struct of the
table's fields of the version used, null when none), `_version`, `_unknown` and `_emit`.

How (all in the JVM, one shuffle): the events the watermark has reached and the versions are cut into one stream
keyed by the key text `_k` (a pinned event by its pin's key and time, any other by its match key and its own
time), sorted by time with versions before events at equal times (and, among versions of one time, by the
tie-break above, the winner last), and a running `last(version, ignorenulls)` window carries the version in force
to every event. A pinned event found its version iff the carried version's time equals the pinned time.
Limit: a composite key's text is ambiguous when a key value holds `|` (as the contract's version ids are).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from changelog.current import is_remove, quoted
from joins.sides import dedupe_records, identity_sql, key_text_sql
from spec.model import Asof, Pipeline, Topic

__all__ = ["AsofSides", "AsofResult", "version_rows", "with_identity", "dedupe_events", "asof_join"]


@dataclass(frozen=True)
class AsofSides:
    """An asof job's roles: the `stream` and `table` topics, `event_key` (SQL over the stream's columns: an event's
    table key text), `pin` (the stream's pin field, or None) and `carry` ((name, SQL type) of columns of the
    stream's log beyond its fields that travel with each event, through the held set, to the emitted rows: the
    log's stamp `changelog.topics.MAX_BEFORE` for a job with windowed views; the least among an event's copies)."""

    stream: Topic
    table: Topic
    event_key: str
    pin: str | None = None
    carry: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, pipeline: Pipeline, job: str, carry: tuple[tuple[str, str], ...] = ()) -> AsofSides:
        spec: Asof = pipeline.jobs[job].spec
        stream, table = pipeline.sides(job)
        by_field = {b: a for a, b in spec.match}
        return cls(stream, table, key_text_sql([by_field[k] for k in table.key]), spec.pin, carry)

    @property
    def stream_fields(self) -> tuple[str, ...]:
        """An event's columns: the stream's fields, then the carried ones."""
        return self.stream.names + tuple(n for n, _ in self.carry)

    def stream_types(self) -> dict[str, str]:
        """The SQL type of each of `stream_fields` (and the stream's `op`, if it has one)."""
        return {**dict(self.stream.columns()), **dict(self.carry)}

    def stream_schema(self) -> str:
        """The held events' columns as a SQL schema string: the stream log's, then the carried ones."""
        return ", ".join([self.stream.schema(), *[f"{quoted(n)} {t}" for n, t in self.carry]])

    @property
    def table_fields(self) -> tuple[str, ...]:
        return self.table.names

    def version_schema(self) -> str:
        """The copy's columns: `_k` (key text), `_r` (a remove), then the table's fields."""
        own = ", ".join(f"{quoted(n)} {t}" for n, t in self.table.columns() if n != "op" or not self.table.op)
        return f"_k string, _r boolean, {own}"


@dataclass(frozen=True)
class AsofResult:
    """`decided`: every candidate once (see the module docstring for its columns). Persist it once and take
    `emitted` and `held` from it."""

    decided: DataFrame
    stream_fields: tuple[str, ...]

    @property
    def emitted(self) -> DataFrame:
        return self.decided.where(F.col("_emit"))

    @property
    def held(self) -> DataFrame:
        """The stream's fields of the events the watermark has not reached yet (or whose pin may still come)."""
        return self.decided.where(~F.col("_emit")).select(*[F.col(quoted(n)) for n in self.stream_fields])


def version_rows(changes: DataFrame, sides: AsofSides) -> DataFrame:
    """Change records of the table (its log's columns) -> the copy's rows (`AsofSides.version_schema`): the key
    text, whether it is a remove, and the table's fields, those other than the key and the time null for a remove.
    No deduplication (the join resolves it)."""
    t = sides.table
    remove = is_remove(t)
    fixed = {*t.key, t.time}
    cols = [f"{key_text_sql([quoted(k) for k in t.key])} AS _k", f"{remove} AS _r"]
    cols += [
        quoted(n) if n in fixed else f"CASE WHEN {remove} THEN NULL ELSE {quoted(n)} END AS {quoted(n)}"
        for n in t.names
    ]
    return changes.selectExpr(*cols)


def with_identity(events: DataFrame, sides: AsofSides) -> DataFrame:
    """Stream records (its log's columns) with `_id`, their identity (`joins.sides.identity_sql`)."""
    return events.selectExpr(
        *[quoted(n) for n in sides.stream_fields], f"{identity_sql(sides.stream)} AS _id"
    )


def dedupe_events(events: DataFrame, sides: AsofSides) -> DataFrame:
    """One row per `_id` of the stream's records (`joins.sides.dedupe_records`; a carried column the least of the
    copies')."""
    return dedupe_records(events, sides.stream, least=tuple(n for n, _ in sides.carry))


def _pin_ms(pin):
    digits = F.regexp_extract(pin, r"@(-?\d{1,18})$", 1)
    return F.when(digits != "", digits.cast("bigint"))


def _pin_key(pin):
    return F.regexp_extract(pin, r"^(.*)@-?\d{1,18}$", 1)


def _version_structs(sides: AsofSides):
    """(`_q`, `_v`) of a version row: the tie-break (remove, then the non-key fields but the time) and the version
    (remove, then every field of the table)."""
    t = sides.table
    values = [n for n in t.values if n != t.time]
    q = F.struct(F.col("_r").alias("_r"), *[F.col(quoted(n)) for n in values])
    v = F.struct(F.col("_r").alias("_r"), *[F.col(quoted(n)) for n in t.names])
    return q, v


def _event_keys(events: DataFrame, sides: AsofSides, q_type, v_type) -> DataFrame:
    """Events as rows of the sorted stream (kind 1): keyed by (pin key, pin time) if pinned to a well-formed pin,
    else by (match key, time)."""
    key, at = F.expr(sides.event_key), F.col(quoted(sides.stream.time))
    if sides.pin is not None:
        pin = F.col(quoted(sides.pin))
        lookup = pin.isNotNull() & _pin_ms(pin).isNotNull()
        key, at = F.when(lookup, _pin_key(pin)).otherwise(key), F.when(lookup, _pin_ms(pin)).otherwise(at)
    return events.select(
        key.alias("_k"),
        at.alias("_s"),
        F.lit(1).alias("_kind"),
        F.lit(None).cast(q_type).alias("_q"),
        F.lit(None).cast(v_type).alias("_v"),
        *[F.col(quoted(n)) for n in sides.stream_fields],
        "_id",
    )


def _version_keys(versions: DataFrame, erows: DataFrame, sides: AsofSides, *, few_keys: bool) -> DataFrame:
    """Versions as rows of the sorted stream (kind 0) keyed by (key, time), with the tie-break `_q` that orders
    the winner of equal (key, time) last. few_keys: only the keys of `erows` (a broadcast semi-join)."""
    if few_keys:
        keys = erows.select("_k").distinct()
        versions = versions.join(F.broadcast(keys), "_k", "left_semi")
    q, v = _version_structs(sides)
    types = sides.stream_types()
    return versions.select(
        "_k",
        F.col(quoted(sides.table.time)).alias("_s"),
        F.lit(0).alias("_kind"),
        q.alias("_q"),
        v.alias("_v"),
        *[F.lit(None).cast(types[n]).alias(n) for n in sides.stream_fields],
        F.lit(None).cast("string").alias("_id"),
    )


def _carry(rows: DataFrame, sides: AsofSides, wm) -> DataFrame:
    """Each event of the sorted stream `rows` with the version carried to it (`_cur`, the last version at or
    before it), decided (see the module docstring for the columns)."""
    w = (
        Window.partitionBy("_k")
        .orderBy("_s", "_kind", "_q")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    t, cur = sides.table, F.col("_cur")
    pin = F.col(quoted(sides.pin)) if sides.pin is not None else F.lit(None).cast("string")
    pinned = pin.isNotNull()
    lookup = pinned & _pin_ms(pin).isNotNull()
    found = lookup & F.coalesce(cur[t.time] == F.col("_s"), F.lit(False))
    live = cur.isNotNull() & ~F.coalesce(cur["_r"], F.lit(True))
    use = F.when(pinned, found & ~cur["_r"]).otherwise(live)
    table = F.struct(*[cur[n].alias(n) for n in t.names])
    return (
        rows.withColumn("_cur", F.last("_v", ignorenulls=True).over(w))
        .where(F.col("_kind") == 1)
        .select(
            *[F.col(quoted(n)) for n in sides.stream_fields],
            "_id",
            F.when(use, table).alias("_s1"),
            F.when(pinned, pin)
            .when(live, F.concat(F.col("_k"), F.lit("@"), cur[t.time].cast("string")))
            .alias("_version"),
            (pinned & ~found).alias("_unknown"),
            # a pin not found waits until the watermark passes its time (it may still arrive)
            (~lookup | found | (wm >= F.col("_s"))).alias("_emit"),
        )
    )


def _waiting(events: DataFrame, sides: AsofSides, s1_type) -> DataFrame:
    """`events` as undecided rows: no version, `_emit` false."""
    return events.select(
        *[F.col(quoted(n)) for n in sides.stream_fields],
        "_id",
        F.lit(None).cast(s1_type).alias("_s1"),
        F.lit(None).cast("string").alias("_version"),
        F.lit(False).alias("_unknown"),
        F.lit(False).alias("_emit"),
    )


def asof_join(
    events: DataFrame,
    versions: DataFrame,
    sides: AsofSides,
    *,
    watermark_ms: int | None,
    few_keys: bool = False,
) -> AsofResult:
    """Decide candidate `events` (the stream's fields and `_id`, one row per `_id`: `dedupe_events`) against
    `versions` (`version_rows`, duplicates allowed) under the table's watermark `watermark_ms` (None: no change
    seen yet, everything is held). See the module docstring for the semantics.

    few_keys: the candidates are few (a small micro-batch): only the versions of their keys are sorted, selected
    by a broadcast semi-join. The results are lazy; the caller persists what it reuses."""
    wm = F.lit(watermark_ms).cast("bigint")
    ev = events.select(*[F.col(quoted(n)) for n in sides.stream_fields], "_id")
    q, v = _version_structs(sides)
    types = versions.select(
        q.alias("q"), v.alias("v"), F.struct(*[quoted(n) for n in sides.table_fields]).alias("s")
    )
    q_type, v_type, s1_type = (types.schema[c].dataType for c in ("q", "v", "s"))
    ready = F.coalesce(wm >= F.col(quoted(sides.stream.time)), F.lit(False))
    waiting = _waiting(ev.where(~ready), sides, s1_type)
    if watermark_ms is None:
        return AsofResult(waiting, sides.stream_fields)
    erows = _event_keys(ev.where(ready), sides, q_type, v_type)
    vrows = _version_keys(versions, erows, sides, few_keys=few_keys)
    decided = _carry(erows.unionByName(vrows), sides, wm)
    return AsofResult(decided.unionByName(waiting), sides.stream_fields)
