"""Stream-table join against a versioned dimension: each activity event gets exactly one profile version.

The dimension is kept as a local, versioned copy (SCD type 2): every change of every user is a version with the
identifier `"<user_id>@<ts of the change, epoch ms>"`, valid from its `ts` to the next version's `ts`. A delete is
a version too: profile fields null from its `ts` on. `profile_versions` reduces raw change records to that copy
(one row per version id; a change delivered twice is one version; two different changes with the same user and
`ts` resolve as in `changelog.cdc`: a delete wins, then the greater `(name, country)`), so the copy is a
function of the *set* of changes only.

`asof_join(events, versions, watermark_ms=...)` decides, for each candidate event (deduplicated by `event_id`):
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
    "dedupe_events",
    "asof_join",
]

EVENT_COLUMNS = ["event_id", "user_id", "action", "ts", "profile_version"]
ENRICHED_COLUMNS = ["event_id", "user_id", "action", "ts", "profile_version", "name", "country"]
# One row per version of the versioned copy (what the job keeps as state).
VERSION_SCHEMA = "user_id string, ts bigint, deleted boolean, name string, country string"


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


def profile_versions(changes: DataFrame) -> DataFrame:
    """Profile change records (`op, user_id, name, country, ts`) or version rows (`deleted` instead of `op`)
    -> one row per version: `user_id, ts, deleted, name, country, version_id`."""
    deleted = F.col("op") == "delete" if "op" in changes.columns else F.col("deleted")
    rows = changes.select(
        "user_id",
        "ts",
        deleted.alias("deleted"),
        F.when(deleted, None).otherwise(F.col("name")).alias("name"),
        F.when(deleted, None).otherwise(F.col("country")).alias("country"),
    )
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


def asof_join(events: DataFrame, versions: DataFrame, *, watermark_ms: int | None) -> AsofResult:
    """Enrich candidate `events` (EVENT_COLUMNS, one row per event_id) with `versions` (`profile_versions`
    output) under the profiles watermark `watermark_ms` (None: no change seen yet, everything is held).
    See the module docstring for semantics. The results are lazy; the caller persists what it reuses."""
    wm = F.lit(watermark_ms if watermark_ms is not None else None).cast("bigint")
    ev = events.select(*EVENT_COLUMNS)
    pinned = ev.where(F.col("profile_version").isNotNull())
    loose = ev.where(F.col("profile_version").isNull())

    # Pinned: look the exact version up.
    v = versions.select(
        F.col("user_id").alias("_vu"),
        F.col("ts").alias("_vts"),
        F.col("deleted").alias("_vdel"),
        F.col("name").alias("_vname"),
        F.col("country").alias("_vcountry"),
    )
    p = pinned.withColumn("_rts", _ref_ts("profile_version")).withColumn("_ru", _ref_user("profile_version"))
    p = p.join(v, (p["_ru"] == v["_vu"]) & (p["_rts"] == v["_vts"]), "left")
    found = F.col("_vu").isNotNull()
    p_ready = (wm >= F.col("ts")) & (found | F.col("_rts").isNull() | (wm >= F.col("_rts")))
    p = p.select(
        *EVENT_COLUMNS,
        F.coalesce(p_ready, F.lit(False)).alias("emit"),
        F.when(found & ~F.col("_vdel"), F.col("_vname")).alias("name"),
        F.when(found & ~F.col("_vdel"), F.col("_vcountry")).alias("country"),
        (~found).alias("unknown_version"),
    )

    # Unpinned: the latest version with ts <= event ts, by one ordered pass per user (versions before events
    # at equal ts), carrying the last version forward.
    l_ready = F.coalesce(wm >= F.col("ts"), F.lit(False))
    l_now = loose.where(l_ready)
    l_wait = loose.where(~l_ready)
    users = l_now.select("user_id").distinct()
    vstruct = "struct<version_id:string,deleted:boolean,name:string,country:string>"
    vrows = versions.join(users, "user_id", "left_semi").select(
        "user_id",
        "ts",
        F.lit(0).alias("_kind"),
        F.lit(None).cast("string").alias("event_id"),
        F.lit(None).cast("string").alias("action"),
        F.struct("version_id", "deleted", "name", "country").alias("_v"),
    )
    erows = l_now.select(
        "user_id",
        "ts",
        F.lit(1).alias("_kind"),
        "event_id",
        "action",
        F.lit(None).cast(vstruct).alias("_v"),
    )
    w = (
        Window.partitionBy("user_id")
        .orderBy("ts", "_kind")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    cur = F.last("_v", ignorenulls=True).over(w)
    live = ~F.coalesce(F.col("_cur.deleted"), F.lit(True))
    l_done = (
        vrows.unionByName(erows)
        .withColumn("_cur", cur)
        .where(F.col("_kind") == 1)
        .select(
            "event_id",
            "user_id",
            "action",
            "ts",
            F.when(live, F.col("_cur.version_id")).alias("profile_version"),
            F.when(live, F.col("_cur.name")).alias("name"),
            F.when(live, F.col("_cur.country")).alias("country"),
            F.lit(False).alias("unknown_version"),
            F.lit(True).alias("emit"),
        )
    )
    none = F.lit(None).cast("string")
    waiting = l_wait.select(
        *EVENT_COLUMNS,
        none.alias("name"),
        none.alias("country"),
        F.lit(False).alias("unknown_version"),
        F.lit(False).alias("emit"),
    )
    return AsofResult(decided=p.unionByName(l_done).unionByName(waiting))
