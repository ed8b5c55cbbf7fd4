"""Stream-table join against a versioned dimension: each activity event gets exactly one profile version.

The dimension is kept as a local, versioned copy (SCD type 2): every change of every user is a version with the
identifier `"<user_id>@<ts of the change, epoch ms>"`, valid from its `ts` to the next version's `ts`. A delete is
a version too: profile fields null from its `ts` on. Two different changes with the same user and `ts` resolve
so: a delete wins, then the greater `(name, country)`; a change delivered twice is one version. So
the copy is a function of the *set* of changes only. `profile_versions` reduces raw change records to that copy
(one row per version id); `asof_join` also accepts the raw, undeduplicated version rows (`VERSION_SCHEMA`, as the
job stores them) and applies the same resolution itself.

`asof_join(events, versions, watermark_ms=...)` decides, for each candidate event (one row per `event_id`):
- emitted only once the profiles watermark (max change `ts` minus the allowed lateness, computed by the caller)
  is >= the event's `ts`; until then it is held (returned in `held`, for the caller to keep durably);
- with `profile_version` set: exactly that version (`name`, `country` null if it is a delete). A reference to a
  version never seen is emitted with null profile fields and the reference kept, once the watermark has also
  passed the referenced `ts` (a later arrival could still bring it before that), and flagged `unknown_version`;
  a reference that is not of the form `user@epoch_ms` cannot ever be seen and is emitted the same way at once;
- without `profile_version`: the version in force at the event's `ts` (the latest version with `ts <=` the
  event's `ts`); none, or a delete, gives `profile_version`, `name`, `country` = null.
The decision depends only on the set of changes with `ts <=` the watermark, which are all known once the
watermark has passed (changes later than the allowed lateness are the producer's error), so the output never
depends on how the two logs interleave or on batch boundaries.

How (all in the JVM, one shuffle): the events the watermark has reached and the versions are cut into one
stream keyed by user (a pinned event by the user and `ts` of its reference, any other by its own), sorted by
`ts` with versions before events at equal `ts` (and, among versions of equal `ts`, by the tie-break above), and
a running `last(version, ignorenulls)` window carries the version in force to every event. A pinned event found
its version iff the carried version's `ts` equals the referenced `ts`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "EVENT_COLUMNS",
    "ENRICHED_COLUMNS",
    "VERSION_SCHEMA",
    "AsofResult",
    "profile_versions",
    "version_rows",
    "dedupe_events",
    "asof_join",
]

EVENT_COLUMNS = ["event_id", "user_id", "action", "ts", "profile_version"]
ENRICHED_COLUMNS = ["event_id", "user_id", "action", "ts", "profile_version", "name", "country"]
# One row per change received (duplicates allowed: resolved by asof_join / profile_versions on read).
VERSION_SCHEMA = "user_id string, ts bigint, deleted boolean, name string, country string"
_VERSION_COLUMNS = ["user_id", "ts", "deleted", "name", "country"]


@dataclass(frozen=True)
class AsofResult:
    """`decided`: every candidate once, ENRICHED_COLUMNS + `unknown_version` + `emit` (False: held, profile
    fields null). Persist it once and take `emitted` and `held` from it."""

    decided: DataFrame

    @property
    def emitted(self) -> DataFrame:  # ENRICHED_COLUMNS + unknown_version (bool)
        return self.decided.where(F.col("emit")).drop("emit")

    @property
    def held(self) -> DataFrame:  # EVENT_COLUMNS: events the watermark has not reached yet
        return self.decided.where(~F.col("emit")).select(*EVENT_COLUMNS)


def version_rows(changes: DataFrame) -> DataFrame:
    """Profile change records (`op, user_id, name, country, ts`) -> raw version rows (`VERSION_SCHEMA`): a
    delete has null profile fields. No deduplication (see `profile_versions`)."""
    deleted = F.col("op") == "delete"
    return changes.select(
        "user_id",
        "ts",
        deleted.alias("deleted"),
        F.when(deleted, None).otherwise(F.col("name")).alias("name"),
        F.when(deleted, None).otherwise(F.col("country")).alias("country"),
    )


def profile_versions(changes: DataFrame) -> DataFrame:
    """Profile change records (`op, user_id, name, country, ts`) or version rows (`deleted` instead of `op`)
    -> one row per version: `user_id, ts, deleted, name, country, version_id`."""
    rows = version_rows(changes) if "op" in changes.columns else changes.select(*_VERSION_COLUMNS)
    seq = F.struct("deleted", F.coalesce("name", F.lit("")), F.coalesce("country", F.lit("")))
    return (
        rows.groupBy("user_id", "ts")
        .agg(F.max_by(F.struct("deleted", "name", "country"), seq).alias("v"))
        .select(
            "user_id",
            "ts",
            "v.deleted",
            "v.name",
            "v.country",
            F.concat_ws("@", "user_id", F.col("ts").cast("string")).alias("version_id"),
        )
    )


def dedupe_events(events: DataFrame) -> DataFrame:
    """One row per `event_id` (a record delivered twice has the effect of one; if two records share an id
    with different content, the smallest `(ts, user_id, action, profile_version)` is kept)."""
    return (
        events.groupBy("event_id")
        .agg(F.min(F.struct("ts", "user_id", "action", "profile_version")).alias("e"))
        .select("event_id", "e.user_id", "e.action", "e.ts", "e.profile_version")
    )


def _ref_ts(col):
    digits = F.regexp_extract(col, r"@(-?\d{1,18})$", 1)
    return F.when(digits != "", digits.cast("bigint"))


def _ref_user(col):
    return F.regexp_extract(col, r"^(.*)@-?\d{1,18}$", 1)


def _held(events: DataFrame) -> DataFrame:
    """`events` as undecided rows: profile fields null, `emit` False."""
    return events.select(
        *EVENT_COLUMNS,
        F.lit(None).cast("string").alias("name"),
        F.lit(None).cast("string").alias("country"),
        F.lit(False).alias("unknown_version"),
        F.lit(False).alias("emit"),
    )


def _event_keys(events: DataFrame) -> DataFrame:
    """Events as rows of the sorted stream (kind 1): keyed by (reference user, reference ts) if pinned to a
    well-formed reference, else by (user, ts)."""
    pv = F.col("profile_version")
    rts = _ref_ts(pv)
    lookup = pv.isNotNull() & rts.isNotNull()
    return events.select(
        F.when(lookup, _ref_user(pv)).otherwise(F.col("user_id")).alias("_k"),
        F.when(lookup, rts).otherwise(F.col("ts")).alias("_s"),
        F.lit(1).alias("_kind"),
        F.lit(None).cast("struct<d:boolean,n:string,c:string>").alias("_q"),
        F.lit(None).cast("struct<ts:bigint,deleted:boolean,name:string,country:string>").alias("_v"),
        *EVENT_COLUMNS,
    )


def _version_keys(versions: DataFrame, erows: DataFrame, *, few_users: bool) -> DataFrame:
    """Versions as rows of the sorted stream (kind 0) keyed by (user, ts), with the tie-break `_q` that orders
    the winner of equal (user, ts) last. few_users: only the users of `erows` (a broadcast semi-join)."""
    vers = versions.select(*_VERSION_COLUMNS)
    if few_users:
        keys = erows.select(F.col("_k").alias("user_id")).distinct()
        vers = vers.join(F.broadcast(keys), "user_id", "left_semi")
    none = F.lit(None).cast("string")
    return vers.select(
        F.col("user_id").alias("_k"),
        F.col("ts").alias("_s"),
        F.lit(0).alias("_kind"),
        F.struct(
            F.col("deleted").alias("d"),
            F.coalesce("name", F.lit("")).alias("n"),
            F.coalesce("country", F.lit("")).alias("c"),
        ).alias("_q"),
        F.struct("ts", "deleted", "name", "country").alias("_v"),
        none.alias("event_id"),
        none.alias("user_id"),
        none.alias("action"),
        F.lit(None).cast("bigint").alias("ts"),
        none.alias("profile_version"),
    )


def _carry(erows: DataFrame, vrows: DataFrame, wm) -> DataFrame:
    """Each event of the sorted stream with the version carried to it (`_cur`, the last version at or before
    it), decided: ENRICHED_COLUMNS + `unknown_version` + `emit`."""
    w = (
        Window.partitionBy("_k")
        .orderBy("_s", "_kind", "_q")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    pv, cur = F.col("profile_version"), F.col("_cur")
    pinned = pv.isNotNull()
    lookup = pinned & _ref_ts(pv).isNotNull()
    found = lookup & F.coalesce(cur["ts"] == F.col("_s"), F.lit(False))
    live = cur.isNotNull() & ~F.coalesce(cur["deleted"], F.lit(True))
    use = F.when(pinned, found & ~cur["deleted"]).otherwise(live)
    return (
        erows.unionByName(vrows)
        .withColumn("_cur", F.last("_v", ignorenulls=True).over(w))
        .where(F.col("_kind") == 1)
        .select(
            "event_id",
            "user_id",
            "action",
            "ts",
            F.when(pinned, pv)
            .when(live, F.concat_ws("@", "user_id", cur["ts"].cast("string")))
            .alias("profile_version"),
            F.when(use, cur["name"]).alias("name"),
            F.when(use, cur["country"]).alias("country"),
            (pinned & ~found).alias("unknown_version"),
            # a pinned reference not found waits until the watermark passes its ts (it may still arrive)
            (~lookup | found | (wm >= F.col("_s"))).alias("emit"),
        )
    )


def asof_join(
    events: DataFrame, versions: DataFrame, *, watermark_ms: int | None, few_users: bool = False
) -> AsofResult:
    """Enrich candidate `events` (EVENT_COLUMNS, one row per event_id) with `versions` (`profile_versions`
    output or raw `VERSION_SCHEMA` rows) under the profiles watermark `watermark_ms` (None: no change seen yet,
    everything is held). See the module docstring for semantics.

    few_users: the candidates are few (a small micro-batch): only the versions of their users are sorted,
    selected by a broadcast semi-join. The results are lazy; the caller persists what it reuses."""
    wm = F.lit(watermark_ms).cast("bigint")
    ev = events.select(*EVENT_COLUMNS)
    ready = F.coalesce(wm >= F.col("ts"), F.lit(False))
    waiting = _held(ev.where(~ready))
    if watermark_ms is None:
        return AsofResult(decided=waiting)
    erows = _event_keys(ev.where(ready))
    decided = _carry(erows, _version_keys(versions, erows, few_users=few_users), wm)
    return AsofResult(decided=decided.unionByName(waiting))
