"""`mview maintain`: compaction, OPTIMIZE and VACUUM of logs and state, removal of generations that are not
current, and views unchanged: a rebuild from the compacted logs publishes exactly the same Redis content."""

from __future__ import annotations

from pathlib import Path

import pytest

from changelog.ingest import ingest
from changelog.topics import topic_path
from jobs.core.runtime import checkpoint_dir, state_dir
from jobs.ops.maintain import maintain
from tests.builtin import run_timeline
from tests.conftest import make_settings
from tests.jobs.opshelp import redis_content, write_jsonl
from timeline_demo.workload import generate
from views.redis_io import connect, set_generation


def _parquet_files(path):
    return sorted(p.name for p in Path(path).glob("*.parquet"))


@pytest.mark.slow
def test_maintenance_compacts_optimizes_vacuums_and_drops_old_generations(
    spark, tmp_path, redis_url, rclient
):
    settings = make_settings(tmp_path / "lake", redis_url, TIMELINE_CAP=10, LOG_RETENTION="0 hours")
    wl = generate(
        seed=3, users=30, celebrities=2, follows=240, tweets=160, duplicate_ratio=0.1, unfollow_ratio=0.3
    )
    th, half = len(wl.tweets) // 2, len(wl.follows) // 2
    for i, (t, f) in enumerate([(wl.tweets[:th], wl.follows[:half]), (wl.tweets[th:], wl.follows[half:])]):
        ingest(spark, settings.lake, settings.topic("tweets"), [write_jsonl(tmp_path / f"t{i}.jsonl", t)])
        ingest(spark, settings.lake, settings.topic("follows"), [write_jsonl(tmp_path / f"f{i}.jsonl", f)])
    # Generation 2 serves; generation 1 is a leftover (keys, checkpoint and state dirs) of an earlier replay.
    set_generation(rclient, "timeline", 2)
    run_timeline(spark, settings, once=True)
    rclient.set("mv:timeline:1:{u1}", "stale")
    rclient.set("mv:timeline.entry:1:{t1}", "stale")
    rclient.hset("mv:meta:timeline:1", "last_batch_id", 9)
    for d in (checkpoint_dir(settings, "timeline", 1), state_dir(settings, "timeline", 1)):
        Path(d).mkdir(parents=True)
    before = redis_content(rclient, "timeline", 2)
    follows_files = _parquet_files(topic_path(settings.lake, settings.topic("follows")))
    assert len(follows_files) >= 2

    report = maintain(spark, settings)

    assert not report["errors"], report["errors"]
    rows_before, rows_after = map(int, report["compacted"]["follows"].split("->"))
    assert rows_after < rows_before  # superseded follow/unfollow events and duplicates are gone
    assert "topics/tweets" in report["optimized"] and "topics/follows" in report["vacuumed"]
    # The timeline's state is its own Parquet change log (compacted by the job), not a Delta table: left alone.
    assert not any(t.startswith("state/timeline/") for t in report["optimized"] + report["vacuumed"])
    assert (Path(state_dir(settings, "timeline", 2)) / "table" / "b0" / "_SUCCESS").exists()
    ops = [
        r[0]
        for r in spark.sql(f"DESCRIBE HISTORY delta.`{topic_path(settings.lake, settings.topic('follows'))}`")
        .select("operation")
        .collect()
    ]
    assert "VACUUM END" in ops
    assert not set(_parquet_files(topic_path(settings.lake, settings.topic("follows")))) & set(
        follows_files
    )  # vacuumed
    assert report["dropped_generations"] == {"timeline": [1]}
    assert list(rclient.scan_iter(match="mv:*:1:*")) == [] and not rclient.exists("mv:meta:timeline:1")
    assert (
        not Path(checkpoint_dir(settings, "timeline", 1)).exists()
        and not Path(state_dir(settings, "timeline", 1)).exists()
    )
    assert redis_content(rclient, "timeline", 2) == before  # serving generation untouched

    # A rebuild from the compacted logs (what `mview replay` does) publishes exactly the same content.
    run_timeline(spark, settings, once=True, generation=3)
    assert redis_content(connect(redis_url), "timeline", 3) == before

    # Ingest (delta-rs) appends after Spark's compaction, OPTIMIZE and VACUUM of the log: one record more.
    follows = spark.read.format("delta").load(str(topic_path(settings.lake, settings.topic("follows"))))
    n = follows.count()
    extra = {"op": "follow", "follower_id": "new1", "followee_id": "new2", "ts": 1767225600000}
    ingest(None, settings.lake, settings.topic("follows"), [write_jsonl(tmp_path / "f-after.jsonl", [extra])])
    assert (
        spark.read.format("delta").load(str(topic_path(settings.lake, settings.topic("follows")))).count()
        == n + 1
    )


def test_a_topic_read_from_an_event_topic_is_never_compacted_nor_copied_from_kafka(tmp_path):
    from jobs.core.registry import job_spec
    from jobs.kinds.kafka import _names
    from jobs.ops.maintain import compacted

    path = tmp_path / "p.yml"
    path.write_text(
        "topics:\n"
        "  rides: {fields: {ride_id: id, rider_id: id, ts: timestamp}, id: ride_id, time: ts}\n"
        "  last_ride: {from: rides, key: rider_id}\n"
        "  riders: {fields: {rider_id: id, ts: timestamp}, key: rider_id, time: ts}\n"
        "jobs:\n"
        "  j: {select: {from: last_ride}, views: {v: {count: {k: rider_id}, values: {n: 1}}}}\n"
    )
    settings = make_settings(
        tmp_path / "lake", "redis://127.0.0.1:1/0", MVIEW_PIPELINE=str(path), COMPACT_TOPICS="auto"
    )
    assert [t.name for t in compacted(settings)] == ["riders"]
    assert job_spec(settings, "kafka").topics == ("rides", "riders")
    assert sorted(t.name for t in _names(settings).values()) == ["riders", "rides"]
