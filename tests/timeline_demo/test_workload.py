"""The workload generator: seeded, sized, and written in chunks that together hold the arrival order."""

from __future__ import annotations

import orjson
import pytest

from timeline_demo.workload import generate, sized, write_chunks


def test_same_seed_same_workload_and_chunks_keep_arrival_order(tmp_path):
    a, b = sized("tiny", seed=5), sized("tiny", seed=5)
    assert a == b and a != sized("tiny", seed=6)
    files = write_chunks(a, tmp_path, chunks=3)
    assert len(files) == 3
    for i, topic in enumerate(("tweets", "follows")):
        lines = [orjson.loads(x) for f in files for x in open(f[i], "rb")]
        assert lines == getattr(a, topic)


def test_celebrities_get_most_followers_and_ops_are_mixed():
    wl = generate(seed=1, users=500, celebrities=3, follows=4000, tweets=1000)
    followers: dict[str, int] = {}
    for r in wl.follows:
        followers[r["followee_id"]] = followers.get(r["followee_id"], 0) + (r["op"] == "follow")
    top = sorted(followers, key=followers.get, reverse=True)[:3]
    assert set(top) == {"u0", "u1", "u2"}
    assert {r["op"] for r in wl.tweets} == {"post", "delete"}
    assert {r["op"] for r in wl.follows} == {"follow", "unfollow"}


def test_unknown_size_says_which_exist():
    with pytest.raises(ValueError, match="tiny"):
        sized("huge", seed=1)
