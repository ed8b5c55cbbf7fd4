"""The profiles table: sequenced CDC apply (through the ingest hook), its change feed as a stream, compaction
with bootstrap of a new consumer, and the retention policy."""

from __future__ import annotations

import orjson
import pytest

from changelog.cdc import (
    apply_profile_changes,
    apply_retention,
    bootstrap_profiles,
    compact_profiles,
    profiles_table_path,
    read_change_feed,
)
from changelog.errors import NoCompaction
from changelog.ingest import ingest

SCHEMA = "op string, user_id string, name string, country string, ts bigint"


def _consume(spark, lake, tmp_path, name, *, starting_version, start=None) -> dict:
    """A consumer: a local copy {user: (ts, deleted, name, country)} from `start` plus the feed, read as a
    stream from `starting_version`, applied with the same sequencing as the table."""
    copy = dict(start or {})

    def apply(batch_df, _batch_id):
        for r in batch_df.orderBy("_commit_version").collect():
            cand = (r["ts"], r["op"] == "delete", r["name"], r["country"])
            key = lambda v: (v[0], v[1], v[2] or "", v[3] or "")  # noqa: E731
            if r["user_id"] not in copy or key(cand) > key(copy[r["user_id"]]):
                copy[r["user_id"]] = cand

    feed = read_change_feed(spark, lake, starting_version=starting_version)
    q = (
        feed.writeStream.foreachBatch(apply)
        .option("checkpointLocation", str(tmp_path / f"ck_{name}"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    return copy


def test_sequenced_apply_feed_compaction_and_retention(spark, tmp_path):
    lake = tmp_path / "lake"
    f = tmp_path / "p1.jsonl"
    f.write_bytes(
        b"".join(
            orjson.dumps(r) + b"\n"
            for r in [
                {"op": "upsert", "user_id": "u1", "name": "A", "country": "DE", "ts": 10},
                {
                    "op": "upsert",
                    "user_id": "u1",
                    "name": "old",
                    "country": "DE",
                    "ts": 5,
                },  # older, same file
                {"op": "upsert", "user_id": "u2", "name": "B", "country": "FR", "ts": 10},
            ]
        )
    )
    ingest(spark, lake, "profiles", [str(f)])  # the AFTER_APPEND hook applies the file to the table
    apply_profile_changes(
        spark,
        lake,
        spark.createDataFrame(
            [
                ("upsert", "u1", "stale", "US", 7),
                ("delete", "u2", None, None, 20),
                ("upsert", "u3", "C", "JP", 1),
            ],
            SCHEMA,
        ),
    )
    with pytest.raises(NoCompaction, match="compact_profiles"):
        apply_retention(spark, lake)
    compaction = compact_profiles(spark, lake)
    apply_profile_changes(
        spark,
        lake,
        spark.createDataFrame(
            [
                ("upsert", "u2", "ghost", "FR", 15),  # older than the delete: no resurrection
                ("upsert", "u3", "C2", "JP", 2),
                ("upsert", "u1", "A", "DE", 10),  # the same change again: no effect
                ("upsert", "u4", "D", "BR", 3),
            ],
            SCHEMA,
        ),
    )
    table = {
        r["user_id"]: (r["ts"], r["deleted"], r["name"], r["country"])
        for r in spark.read.format("delta").load(str(profiles_table_path(lake))).collect()
    }
    assert table == {
        "u1": (10, False, "A", "DE"),
        "u2": (20, True, None, None),
        "u3": (2, False, "C2", "JP"),
        "u4": (3, False, "D", "BR"),
    }
    feed = read_change_feed(spark, lake, stream=False)
    assert {(r["user_id"], r["ts"]) for r in feed.collect()} == {
        ("u1", 10),
        ("u2", 10),
        ("u2", 20),
        ("u3", 1),
        ("u3", 2),
        ("u4", 3),
    }  # stale changes never reach the feed

    whole = _consume(spark, lake, tmp_path, "whole", starting_version=0)
    snap, version = bootstrap_profiles(spark, lake)
    assert version == compaction.version and compaction.rows == 3
    start = {r["user_id"]: (r["ts"], r["deleted"], r["name"], r["country"]) for r in snap.collect()}
    boot = _consume(spark, lake, tmp_path, "boot", starting_version=version + 1, start=start)
    assert boot == whole == table

    kept = apply_retention(spark, lake)  # the default policy: 7 days
    assert kept["compacted_version"] == version and kept["retain_hours"] >= 168
    props = spark.sql(f"DESCRIBE DETAIL delta.`{profiles_table_path(lake)}`").first()["properties"]
    assert props["delta.enableChangeDataFeed"] == "true" and "delta.logRetentionDuration" in props
    # a near-zero requested retention still keeps the feed after the compaction: VACUUM rounds its retention to
    # the nearest whole hour, so the stretched 0.02 h once became 0 and removed these change-data files
    cdf_dir = profiles_table_path(lake) / "_change_data"
    change_files = sorted(p.name for p in cdf_dir.rglob("*.parquet"))
    assert change_files
    kept = apply_retention(spark, lake, retain_hours=0)
    assert kept["retain_hours"] >= 1 and sorted(p.name for p in cdf_dir.rglob("*.parquet")) == change_files
    # a consumer starting after retention still reaches the same copy from the snapshot and the later feed
    assert _consume(spark, lake, tmp_path, "after", starting_version=version + 1, start=start) == table
