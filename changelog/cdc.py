"""The `profiles` table: change data capture with event-time sequencing, its change feed, compaction, retention.

Two logs describe the profiles, and each has one job:
- the `profiles` *topic* (`LAKE_DIR/topics/profiles`, append-only, written by `changelog.ingest`): every change
  ever received, in arrival order, duplicates included. It is the history: every version of every user.
- the `profiles` *table* (`LAKE_DIR/tables/profiles`, Delta, `delta.enableChangeDataFeed = true`): the
  application's table as it is now, one row per user, maintained from each ingested file of the topic by
  `apply_profile_changes` (run by `changelog.ingest` after each append: `AFTER_APPEND["profiles"]`).

Sequencing (like AUTO CDC's `SEQUENCE BY ts`): a change is applied to a user's row only if its sequence
`(ts, deleted, name, country)` is greater than the row's; a change older than the row's current one never
overwrites it, whatever order changes arrive in, and applying a change twice has the effect of once. On equal
`ts` a delete wins over an upsert (like a tombstone); between two different upserts the greater
`(name, country)` wins, so the outcome is a function of the set of changes only. A delete keeps the row as a
tombstone (`deleted = true`, profile fields null), so an older upsert that arrives later cannot resurrect it.

Change feed: `read_change_feed` returns the table's CDF (`insert`/`update_postimage` rows) as change records
`op, user_id, name, country, ts, _commit_version`, as a stream or a batch.

Compaction: `compact_profiles` writes the latest value per user (tombstones included) as of table version V
to `LAKE_DIR/compacted/profiles` and records V; `bootstrap_profiles` hands a new consumer that snapshot and V,
and the consumer reads the feed from V + 1 (`read_change_feed(..., starting_version=V + 1)`). Because changes
are sequenced, a consumer that applies a change it already has (a snapshot newer than its recorded V after a
crash) is unaffected.

Retention: `apply_retention` bounds the raw change feed of the table: it sets the table's
`delta.logRetentionDuration` / `delta.deletedFileRetentionDuration` and vacuums, and refuses to run before a
compaction exists that covers what would be dropped (a consumer must be able to start from the snapshot).
The topic log is not vacuumed: it is append-only (vacuum has nothing to remove) and it is the history the
enrichment job's versioned copy is built from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from changelog.errors import NoCompaction

__all__ = [
    "PROFILES_TABLE_SCHEMA",
    "profiles_table_path",
    "compacted_path",
    "ensure_profiles_table",
    "apply_profile_changes",
    "read_change_feed",
    "compact_profiles",
    "bootstrap_profiles",
    "Compaction",
    "apply_retention",
    "table_version",
]

PROFILES_TABLE_SCHEMA = "user_id string, name string, country string, ts bigint, deleted boolean"
_CDF_PROP = "delta.enableChangeDataFeed"


def profiles_table_path(lake_dir: Path) -> Path:
    return Path(lake_dir) / "tables" / "profiles"


def compacted_path(lake_dir: Path) -> Path:
    return Path(lake_dir) / "compacted" / "profiles"


def _compaction_meta(lake_dir: Path) -> Path:
    return Path(lake_dir) / "compacted" / "profiles.json"


def ensure_profiles_table(spark, lake_dir: Path) -> str:
    """Create the empty profiles table with its change data feed on, if it does not exist; return its path."""
    path = profiles_table_path(lake_dir)
    if not (path / "_delta_log").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({PROFILES_TABLE_SCHEMA}) USING delta "
            f"TBLPROPERTIES ({_CDF_PROP} = true)"
        )
    return str(path)


def _sequence(prefix: str = ""):
    """The sequence of a change as a SQL struct: later ts wins; on equal ts a delete, then greater name/country."""
    p = prefix
    return f"struct({p}ts, {p}deleted, coalesce({p}name, ''), coalesce({p}country, ''))"


def apply_profile_changes(spark, lake_dir: Path, changes) -> None:
    """Apply profile change records (`op, user_id, name, country, ts`) to the table, sequenced by `ts`.

    One MERGE per call (per ingested file). A change older than the user's current row does nothing; the
    newest change of the batch per user is the candidate. Idempotent: applying the same changes again
    changes nothing and writes no change-feed rows.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = ensure_profiles_table(spark, lake_dir)
    deleted = F.col("op") == "delete"
    rows = changes.select(
        "user_id",
        F.when(deleted, None).otherwise(F.col("name")).alias("name"),
        F.when(deleted, None).otherwise(F.col("country")).alias("country"),
        "ts",
        deleted.alias("deleted"),
    )
    newest = (
        rows.groupBy("user_id")
        .agg(F.max_by(F.struct("name", "country", "ts", "deleted"), F.expr(_sequence())).alias("c"))
        .select("user_id", "c.name", "c.country", "c.ts", "c.deleted")
    )
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(newest.alias("s"), "t.user_id = s.user_id")
        .whenMatchedUpdate(
            condition=f"{_sequence('s.')} > {_sequence('t.')}",
            set={c: f"s.{c}" for c in ("name", "country", "ts", "deleted")},
        )
        .whenNotMatchedInsertAll()
        .execute()
    )


def table_version(spark, lake_dir: Path) -> int:
    """The latest committed version of the profiles table."""
    from delta.tables import DeltaTable

    path = ensure_profiles_table(spark, lake_dir)
    return DeltaTable.forPath(spark, path).history(1).select("version").first()[0]


def _as_changes(cdf):
    from pyspark.sql import functions as F

    return cdf.where(F.col("_change_type").isin("insert", "update_postimage")).select(
        F.when(F.col("deleted"), F.lit("delete")).otherwise(F.lit("upsert")).alias("op"),
        "user_id",
        "name",
        "country",
        "ts",
        "_commit_version",
    )


def read_change_feed(spark, lake_dir: Path, *, starting_version: int = 0, stream: bool = True):
    """The table's change data feed from `starting_version` as change records
    `op ("upsert"/"delete"), user_id, name, country, ts, _commit_version`: a streaming DataFrame (resumed by its
    checkpoint) or, with `stream=False`, a batch of every change up to the latest version."""
    path = ensure_profiles_table(spark, lake_dir)
    reader = (spark.readStream if stream else spark.read).format("delta").option("readChangeFeed", "true")
    reader = reader.option("startingVersion", starting_version)
    return _as_changes(reader.load(path))


@dataclass(frozen=True)
class Compaction:
    """A compacted snapshot: the latest value per user as of table version `version`."""

    path: str
    version: int
    rows: int


def compact_profiles(spark, lake_dir: Path) -> Compaction:
    """Write the latest value per user (tombstones included) as of the table's latest version V to
    `LAKE_DIR/compacted/profiles`, then record V beside it (`profiles.json`). Returns the compaction."""
    path = ensure_profiles_table(spark, lake_dir)
    version = table_version(spark, lake_dir)
    snap = spark.read.format("delta").option("versionAsOf", version).load(path)
    out = compacted_path(lake_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    (
        snap.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .option("userMetadata", f"compaction of profiles table v{version}")
        .save(str(out))
    )
    rows = spark.read.format("delta").load(str(out)).count()
    meta = _compaction_meta(lake_dir)
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": version, "rows": rows}))
    tmp.replace(meta)
    return Compaction(str(out), version, rows)


def bootstrap_profiles(spark, lake_dir: Path):
    """(snapshot DataFrame `user_id, name, country, ts, deleted`, V) for a new consumer, who then reads the
    change feed from V + 1. Without a compaction: an empty snapshot and V = -1 (read the feed from 0)."""
    meta = _compaction_meta(lake_dir)
    if not meta.exists():
        return spark.createDataFrame([], PROFILES_TABLE_SCHEMA), -1
    version = json.loads(meta.read_text())["version"]
    return spark.read.format("delta").load(str(compacted_path(lake_dir))), version


def apply_retention(spark, lake_dir: Path, *, retain_hours: float = 168.0) -> dict:
    """Bound the table's raw change feed: set `delta.logRetentionDuration` and
    `delta.deletedFileRetentionDuration` and VACUUM, keeping at least `retain_hours` (default 7 days) and never
    anything newer than the latest compaction (the effective retention is stretched to the compaction's age, so
    a consumer can always start from the snapshot and read the feed after its version). The effective
    retention is rounded *up* to whole hours (VACUUM itself only honours whole hours).

    Raises `NoCompaction` if no compaction exists: run `compact_profiles` first. Returns
    `{"retain_hours": effective hours, "compacted_version": V}`."""
    import math
    import time

    from delta.tables import DeltaTable

    meta = _compaction_meta(lake_dir)
    if not meta.exists():
        raise NoCompaction("profiles", "apply_retention", "changelog.cdc.compact_profiles")
    version = json.loads(meta.read_text())["version"]
    path = ensure_profiles_table(spark, lake_dir)
    table = DeltaTable.forPath(spark, path)
    # Vacuum decides by file modification time: keep every file written since the compacted version's commit
    # (the feed after V), measured on the same clock as the files, with a minute of margin.
    commit = Path(path) / "_delta_log" / f"{version:020d}.json"
    age_hours = (time.time() - commit.stat().st_mtime) / 3600 if commit.exists() else float("inf")
    hours = max(retain_hours, age_hours + 1 / 60)
    if hours == float("inf"):  # the compacted version's commit is gone already: nothing newer is at risk
        hours = retain_hours
    # VACUUM rounds its retention to the *nearest* whole hour (Delta's VacuumCommand: math.round(hours)), so a
    # stretched retention of, say, 0.02 h became 0 and removed change-data files written after the compaction.
    # Round up to whole hours instead, for the vacuum and the table properties alike.
    hours = float(max(math.ceil(hours), 0))
    interval = f"interval {int(hours * 3600)} seconds"
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ("
        f"'delta.logRetentionDuration' = '{interval}', 'delta.deletedFileRetentionDuration' = '{interval}')"
    )
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    prev = spark.conf.get(check, "true")
    spark.conf.set(check, "false")  # the compaction, not Delta's 7-day default, decides what is safe here
    try:
        table.vacuum(hours)
    finally:
        spark.conf.set(check, prev)
    return {"retain_hours": round(hours, 4), "compacted_version": version}
