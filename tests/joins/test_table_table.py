"""The timeline join's cost structure: how many Spark jobs one micro-batch's join step runs. (Its semantics are
tested end to end against the SQL definition in tests/jobs/test_timeline.py.)"""

from __future__ import annotations

from joins.table_table import FOLLOW_STATE_SCHEMA, TWEET_STATE_SCHEMA, TimelineState, maintain_timeline


def test_a_batch_of_both_topics_counts_its_changes_in_one_job_and_materializes_the_state_in_one(spark):
    """Every Spark job is a round of driver planning and scheduling (0.1-0.2 s warm, up to 1 s cold, measured).
    The tweet and follow changes were counted by a job each, and each state table was materialized by a job of
    its own: 4 jobs, now 2."""
    state = TimelineState(
        tweets=spark.createDataFrame(
            [("t1", "a", "x", 1, True, False), ("t2", "b", "y", 2, True, False)], TWEET_STATE_SCHEMA
        ).localCheckpoint(),
        follows=spark.createDataFrame([("u1", "a", "follow", 1)], FOLLOW_STATE_SCHEMA).localCheckpoint(),
    )
    tweets = spark.createDataFrame(
        [("post", "t3", "a", "z", 3), ("delete", "t2", "b", None, 4)],
        "op string, tweet_id string, user_id string, text string, ts bigint",
    )
    follows = spark.createDataFrame(
        [("follow", "u1", "b", 5), ("unfollow", "u2", "a", 5)],
        "op string, follower_id string, followee_id string, ts bigint",
    )
    sc = spark.sparkContext
    sc.setJobGroup("timeline-join-step", "maintain_timeline of one batch")
    try:
        changes = maintain_timeline(state, tweets, follows, cap=10)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup("timeline-join-step")]
    stages = [tracker.getStageInfo(s) for j in jobs for s in j.stageIds]
    assert len(jobs) == 2, [s.name for s in stages if s is not None]  # 4 before (measured)
    assert changes.counts == {"born": 1, "died": 1, "gained": 1, "lost": 0}
    assert sorted(r.tweet_id for r in changes.after.tweets.collect()) == ["t1", "t2", "t3"]
    assert sorted((r.follower_id, r.followee_id) for r in changes.after.follows.collect()) == [
        ("u1", "a"),
        ("u1", "b"),
        ("u2", "a"),
    ]
