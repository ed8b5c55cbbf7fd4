"""The timeline join's durable state (`joins.table_table_state.TimelineStore`): the changes log it stages and the
state a new store restores from it."""

from __future__ import annotations

from joins.table_table import maintain_timeline
from joins.table_table_state import TimelineStore

_TWEETS = "op string, tweet_id string, user_id string, text string, ts bigint"
_FOLLOWS = "op string, follower_id string, followee_id string, ts bigint"


def test_a_restore_keeps_the_newest_row_per_key_and_staging_compiles_no_code_after_the_first_batch(
    spark, tmp_path
):
    """Four one-tweet batches staged (the last re-posts t0 with a greater ts), then a new store restores the state
    before batch 4 from the log: the same rows, t0 as the last batch left it (each row's batch told by its
    directory). Staging batches of one shape compiles no new code in Spark after the first."""
    store = TimelineStore(spark, tmp_path / "changes")
    follows = spark.createDataFrame([("follow", "r", "a", 1)], _FOLLOWS).localCheckpoint()
    first = maintain_timeline(store.restore(0), None, follows, cap=5)
    store.stage(0, first)
    store.advance(0, first)
    compiles = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    new_code = []
    for b, (tweet, ts) in enumerate((("t0", 10), ("t1", 11), ("t2", 12), ("t0", 30)), start=1):
        batch = spark.createDataFrame([("post", tweet, "a", f"{tweet}@{ts}", ts)], _TWEETS).localCheckpoint()
        changes = maintain_timeline(store.restore(b), batch, None, cap=5)
        before = compiles.getCount()
        store.stage(b, changes)
        new_code.append(compiles.getCount() - before)
        store.advance(b, changes)
    restored = TimelineStore(spark, tmp_path / "changes").restore(5)
    assert (
        sorted(map(tuple, restored.tweets.collect()))
        == sorted(map(tuple, store.state.tweets.collect()))
        == [
            ("t0", "a", "t0@30", 30, True, False),
            ("t1", "a", "t1@11", 11, True, False),
            ("t2", "a", "t2@12", 12, True, False),
        ]
    )
    assert sorted(map(tuple, restored.follows.collect())) == [("r", "a", "follow", 1)]
    assert new_code[2:] == [0, 0], new_code
