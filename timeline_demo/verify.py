"""Verify the timeline view in Redis against the contract's SQL, evaluated by Spark SQL over the Delta logs.

The definition is the plain query over the *current* tables, which are derived from the logs by the documented
rules: a delete is a tombstone (a deleted tweet id is never live, whatever the order of post and delete); of
several posts of one tweet id the greatest `(ts, user_id, text)` wins; per (follower, followee) pair the event
with the greatest `ts` wins and an unfollow wins a tie. Then

    SELECT follows.follower_id, tweets ... FROM tweets JOIN follows ON follows.followee_id = tweets.user_id
    GROUP BY follower_id, newest TIMELINE_CAP per follower by (ts, tweet_id) descending.

Every follower with a non-empty timeline in either place is compared; a timeline matches when its tweet ids, in
order, are equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from changelog.storage import Lake
from changelog.topics import read_batch
from spec.model import Pipeline
from timeline_demo.timeline_view import export_timeline
from views.redis_io import connect

__all__ = ["TIMELINE_SQL", "Verification", "sql_timelines", "verify_timelines"]

TIMELINE_SQL = """
WITH posts AS (
  SELECT tweet_id, max(struct(ts, user_id, text)) AS best
  FROM tweets_log WHERE op = 'post' GROUP BY tweet_id
),
tweets AS (
  SELECT p.tweet_id, p.best.user_id AS user_id, p.best.ts AS ts
  FROM posts p LEFT ANTI JOIN (SELECT tweet_id FROM tweets_log WHERE op = 'delete') d ON p.tweet_id = d.tweet_id
),
follows AS (
  SELECT follower_id, followee_id FROM (
    SELECT follower_id, followee_id,
           max(struct(ts, CASE WHEN op = 'unfollow' THEN 1 ELSE 0 END AS unfollow)) AS last
    FROM follows_log GROUP BY follower_id, followee_id
  ) WHERE last.unfollow = 0
)
SELECT follows.follower_id AS user_id,
       transform(slice(sort_array(collect_list(struct(tweets.ts, tweets.tweet_id)), false), 1, {cap}),
                 e -> e.tweet_id) AS tweet_ids
FROM tweets JOIN follows ON follows.followee_id = tweets.user_id
GROUP BY follows.follower_id
"""


@dataclass
class Verification:
    total: int
    matching: int
    mismatches: list[dict] = field(default_factory=list)  # first few: {"user_id", "expected", "got"}

    @property
    def ok(self) -> bool:
        return self.total == self.matching

    def line(self) -> str:
        return f"verified: {self.matching}/{self.total} timelines match the SQL definition"


def sql_timelines(spark, lake: Lake, pipeline: Pipeline, cap: int) -> dict[str, list[str]]:
    """{follower: [tweet_id newest first]} by the contract's SQL over the current content of the logs of
    `pipeline`'s topics `tweets` and `follows` in `lake`."""
    read_batch(spark, lake, pipeline.topics["tweets"]).createOrReplaceTempView("tweets_log")
    read_batch(spark, lake, pipeline.topics["follows"]).createOrReplaceTempView("follows_log")
    rows = spark.sql(TIMELINE_SQL.format(cap=int(cap))).collect()
    return {r["user_id"]: list(r["tweet_ids"]) for r in rows}


def verify_timelines(spark, settings, *, keep: int = 5) -> Verification:
    """Compare every timeline in Redis (serving generation) with `sql_timelines`."""
    pipeline = settings.pipeline()
    expected = sql_timelines(spark, settings.lake, pipeline, pipeline.views["timeline"].cap)
    got = {row["user_id"]: row["tweet_ids"] for row in export_timeline(connect(settings.redis_url))}
    users = sorted(set(expected) | set(got))
    result = Verification(total=len(users), matching=0)
    for u in users:
        e, g = expected.get(u, []), got.get(u, [])
        if e == g:
            result.matching += 1
        elif len(result.mismatches) < keep:
            result.mismatches.append({"user_id": u, "expected": e[:10], "got": g[:10]})
    return result
