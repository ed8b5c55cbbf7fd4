"""The timeline job end to end (real Delta logs, real Spark, real redis-server) against the brute-force
definition, for several seeds and chunkings, with a small TIMELINE_CAP so that refills happen."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from changelog.ingest import ingest
from changelog.storage import as_lake
from tests.builtin import run_timeline
from tests.conftest import make_settings, split_at_random, write_jsonl
from timeline_demo.reference import expected_timelines
from timeline_demo.workload import generate
from views.list import export_list, read_list
from views.pipeline import load_pipeline
from views.redis_io import connect, current_generation

BUILTIN_FILE = Path(__file__).resolve().parents[2] / "timeline_demo" / "pipelines" / "builtin.yml"
VIEW = load_pipeline(BUILTIN_FILE, {}).views["timeline"]


def export_timeline(client):
    return export_list(client, VIEW)


def query_timeline(client, user: str, limit: int | None = None) -> dict:
    return read_list(client, VIEW, user, limit)


def _run_chunked(spark, tmp_path, redis_url, wl, chunks: int, cap: int, seed: int):
    settings = make_settings(tmp_path / f"lake{chunks}", redis_url, TIMELINE_CAP=cap)
    rng = random.Random(seed)
    tw, fo = split_at_random(wl.tweets, chunks, rng), split_at_random(wl.follows, chunks, rng)
    for i in range(chunks):
        ingest(
            spark,
            settings.lake,
            settings.topic("tweets"),
            [write_jsonl(tmp_path / f"t{chunks}_{i}.jsonl", tw[i])],
        )
        ingest(
            spark,
            settings.lake,
            settings.topic("follows"),
            [write_jsonl(tmp_path / f"f{chunks}_{i}.jsonl", fo[i])],
        )
        run_timeline(spark, settings, once=True)
    client = connect(redis_url)
    return {row["user_id"]: row["tweet_ids"] for row in export_timeline(client)}


@pytest.mark.parametrize("seed, cap", [(1, 5), (2, 800)])
@pytest.mark.slow
def test_timelines_equal_the_definition_for_any_chunking(spark, tmp_path, redis_url, rclient, seed, cap):
    wl = generate(seed=seed, users=200, celebrities=3, follows=1500, tweets=1500)
    expected = expected_timelines(wl.tweets, wl.follows, cap)
    assert sum(len(v) for v in expected.values()) > 500
    results = []
    for chunks in (1, 3):
        rclient.flushall()
        got = _run_chunked(spark, tmp_path, redis_url, wl, chunks, cap, seed)
        assert got == expected, f"chunks={chunks}: {len(got)} timelines vs {len(expected)} expected"
        results.append(got)
    assert results[0] == results[1]


@pytest.mark.slow
def test_follow_unfollow_delete_refill_and_query(spark, tmp_path, redis_url, rclient):
    """A small table of events with the state before and the expected timeline after each step."""
    settings = make_settings(tmp_path / "lake", redis_url, TIMELINE_CAP=2)
    steps = [
        # (tweets, follows, expected timeline of r)
        (
            [("post", "t1", "a", 1), ("post", "t2", "a", 2), ("post", "t3", "a", 3)],
            [("follow", "r", "a", 0)],
            ["t3", "t2"],
        ),
        ([("delete", "t3", "a", 9)], [], ["t2", "t1"]),  # delete of a full timeline's entry refills with t1
        ([("post", "t3", "a", 3)], [], ["t2", "t1"]),  # a repost after the delete stays deleted (tombstone)
        ([("post", "t4", "b", 4)], [("follow", "r", "b", 5)], ["t4", "t2"]),  # follow backfills
        ([], [("unfollow", "r", "a", 6)], ["t4"]),  # unfollow retracts
        ([], [("follow", "r", "a", 5)], ["t4"]),  # older than the unfollow: ignored
        ([], [("follow", "r", "a", 7)], ["t4", "t2"]),  # re-follow
        ([("delete", "t9", "b", 1)], [], ["t4", "t2"]),  # delete before its post
        ([("post", "t9", "b", 99)], [], ["t4", "t2"]),  # ...so the post never shows
    ]
    for i, (tw, fo, want) in enumerate(steps):
        if tw:
            recs = [{"op": o, "tweet_id": t, "user_id": u, "text": f"{t}!", "ts": ts} for o, t, u, ts in tw]
            ingest(
                spark, settings.lake, settings.topic("tweets"), [write_jsonl(tmp_path / f"t{i}.jsonl", recs)]
            )
        if fo:
            recs = [{"op": o, "follower_id": a, "followee_id": b, "ts": ts} for o, a, b, ts in fo]
            ingest(
                spark, settings.lake, settings.topic("follows"), [write_jsonl(tmp_path / f"f{i}.jsonl", recs)]
            )
        run_timeline(spark, settings, once=True)
        got = query_timeline(connect(redis_url), "r")
        assert [t["tweet_id"] for t in got["tweets"]] == want, f"step {i}"
    got = query_timeline(connect(redis_url), "r", limit=1)
    assert got == {
        "user_id": "r",
        "generation": 1,
        "tweet_ids": ["t4"],
        "tweets": [{"tweet_id": "t4", "user_id": "b", "text": "t4!", "ts": 4}],
    }
    assert query_timeline(connect(redis_url), "nobody") == {
        "user_id": "nobody",
        "generation": 1,
        "tweet_ids": [],
        "tweets": [],
    }


def _rows(state) -> tuple[list, list]:
    return sorted(map(tuple, state.sides[0].collect())), sorted(map(tuple, state.sides[1].collect()))


def test_state_store_compacts_and_restores_the_state_before_any_pending_batch(spark, tmp_path):
    """The in-memory state equals the state rebuilt from the changes log, before and after compaction, and a
    store that starts fresh at batch N (a restart, or Spark replaying N) gets the state as it was before N."""
    from joins.table import TableJoin, maintain_join
    from joins.table_state import TableStore

    JOB = "timeline"
    built_in = make_settings(tmp_path / "lake", "redis://127.0.0.1:1/0", TIMELINE_CAP=2).pipeline()
    join = TableJoin(spark, *built_in.sides(JOB), built_in.jobs[JOB].spec.match)
    path = tmp_path / "changes"
    store = TableStore(spark, as_lake(path), join, snapshot_every=2)
    tweets = "op string, tweet_id string, user_id string, text string, ts bigint"
    follows = "op string, follower_id string, followee_id string, ts bigint"
    steps = [
        ([("post", "t1", "a", "x", 1), ("post", "t2", "a", "y", 2)], [("follow", "r", "a", 1)]),
        ([("delete", "t1", "a", None, 3)], []),
        ([], [("unfollow", "r", "a", 4), ("follow", "s", "a", 4)]),
        ([("post", "t3", "b", "z", 5)], [("follow", "r", "b", 5)]),
        ([("post", "t2", "a", "y2", 6)], [("follow", "r", "a", 3)]),  # a later post moves t2; an older follow
    ]
    before = []
    for i, (tw, fo) in enumerate(steps):
        state = store.restore(i)
        before.append(_rows(state))
        batch_t = spark.createDataFrame(tw, tweets) if tw else None
        batch_f = spark.createDataFrame(fo, follows) if fo else None
        changes = maintain_join(join, state, (batch_t, batch_f))
        store.stage(i, changes)
        store.advance(i, changes)
    # restore(2) and restore(4) compacted: s1 covered b0-b1, s3 covered s1 and b2-b3.
    assert sorted(p.name for p in path.iterdir()) == ["b4", "s3"]
    assert _rows(TableStore(spark, as_lake(path), join).restore(5)) == _rows(store.state)
    assert _rows(TableStore(spark, as_lake(path), join).restore(4)) == before[4]
    tweets_after, follows_after = _rows(store.state)
    assert [t[:5] for t in tweets_after] == [
        ("t1", "a", "x", 1, True),
        ("t2", "a", "y2", 6, True),
        ("t3", "b", "z", 5, True),
    ]
    # (follower, followee, ts, an upsert decides, a remove decides)
    assert follows_after == [
        ("r", "a", 4, False, True),
        ("r", "b", 5, True, False),
        ("s", "a", 4, True, False),
    ]


@pytest.mark.slow
def test_with_a_fanout_limit_the_job_publishes_the_same_views_and_keeps_its_limit(
    spark, tmp_path, redis_url, rclient, monkeypatch
):
    """FANOUT_LIMIT=2 (most authors with followers are celebrities at some point, crossing both ways across the
    batches), batches of tweets only (their posts written before the batch is counted) and of tweets and follows:
    after every run `export` gives the brute-force SQL, at the end `query` too (the CLI's read functions); a run of
    the same job with another limit rebuilds it into a new generation (its definition changed)."""
    from jobs.core.runtime import read_status
    from jobs.core.skeleton import JobRun
    from views.read import export_view, query_view

    moved = []
    told = JobRun.topics_moved
    monkeypatch.setattr(JobRun, "topics_moved", lambda *a: moved.append(told(*a)) or moved[-1])
    wl = generate(seed=4, users=60, celebrities=2, follows=400, tweets=400)
    settings = make_settings(tmp_path / "lake", redis_url, TIMELINE_CAP=4, FANOUT_LIMIT=2)
    rng = random.Random(4)
    tw, fo = split_at_random(wl.tweets, 3, rng), split_at_random(wl.follows, 3, rng)
    client = connect(redis_url)
    for i in range(3):
        for topic, records in (("tweets", tw[i]), ("follows", fo[i])):
            ingest(
                spark,
                settings.lake,
                settings.topic(topic),
                [write_jsonl(tmp_path / f"{topic}{i}.jsonl", records)],
            )
            if i or topic == "follows":  # the first run: tweets and follows
                run_timeline(spark, settings, once=True)
                expected = expected_timelines(
                    sum(tw[: i + 1], []), sum(fo[: i + (topic == "follows")], []), 4
                )
                got = {r["user_id"]: r["tweet_ids"] for r in export_view(client, "timeline", job="timeline")}
                assert got == expected, f"after the {topic} of chunk {i}"
    assert moved == [None, {"tweets"}, {"follows"}, {"tweets"}, {"follows"}]
    assert any(rclient.scan_iter(match="mv:timeline.reads:1:*"))
    assert any(rclient.scan_iter(match="mv:timeline.heavy:1:*"))
    for user in [f"u{i}" for i in range(60)]:
        got = query_view(client, "timeline", user, limit=3, job="timeline")
        assert [t["tweet_id"] for t in got.get("tweets", [])] == expected.get(user, [])[:3]
        assert bool(got) == bool(expected.get(user))  # a user with no entry: `{}`
    other = make_settings(tmp_path / "lake", redis_url, TIMELINE_CAP=4, FANOUT_LIMIT=3)
    run_timeline(spark, other, once=True)
    assert read_status(other, "timeline", "status.json")["last_rebuild"]["reason"].startswith(
        "definition changed"
    )
    got = {r["user_id"]: r["tweet_ids"] for r in export_view(client, "timeline", job="timeline")}
    assert got == expected and current_generation(client, "timeline") == 2
