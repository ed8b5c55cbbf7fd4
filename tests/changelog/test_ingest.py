import json

from changelog.ingest import deadletter_path, ingest
from changelog.topics import latest_version, read_batch


def test_ingest_appends_valid_records_one_commit_per_file_and_dead_letters_the_rest(spark, tmp_path):
    lake = tmp_path / "lake"
    a = tmp_path / "a.jsonl"
    a.write_text(
        '{"op":"follow","follower_id":"u1","followee_id":"u2","ts":"2026-01-01T00:00:00Z"}\n'
        "garbage\n"
        "\n"
        '{"op":"unfollow","follower_id":"u1","followee_id":"u2","ts":1767225600001}\n'
    )
    b = tmp_path / "b.jsonl"
    b.write_text('{"op":"block","follower_id":"u1","followee_id":"u2","ts":1}\n')
    result = ingest(spark, lake, "follows", [str(a), str(b)])
    assert result.summary() == {"topic": "follows", "accepted": 2, "rejected": 2}
    # version 0 creates the table; file a is one commit; file b has no valid line and makes none
    assert latest_version(lake, "follows") == 1
    rows = sorted(tuple(r) for r in read_batch(spark, lake, "follows").collect())
    assert rows == [("follow", "u1", "u2", 1767225600000), ("unfollow", "u1", "u2", 1767225600001)]
    dead = [json.loads(x) for x in deadletter_path(lake, "follows").read_text().splitlines()]
    assert [(d["file"], d["line"]) for d in dead] == [(str(a), 2), (str(b), 1)]
    assert "not valid JSON" in dead[0]["reason"] and "unknown op" in dead[1]["reason"]
    assert dead[0]["raw"] == "garbage"
