"""`changelog.storage`: one contract on every store (a local directory, a real HDFS, a real S3 server): an object
is replaced whole, of 32 racing creators of one key exactly one wins, listing gives a prefix's children, a tree is
removed whole, and a store that does not answer is one error that names it."""

from __future__ import annotations

import concurrent.futures as cf
import uuid

import pytest

from changelog.storage import LakeUnreachable, NotFound, open_lake


@pytest.fixture(
    params=["local", pytest.param("hdfs", marks=pytest.mark.e2e), pytest.param("s3", marks=pytest.mark.e2e)]
)
def lake(request, tmp_path):
    if request.param == "local":
        return open_lake(tmp_path / "lake")
    run = uuid.uuid4().hex[:8]  # one server per session: a directory of its own per test
    if request.param == "hdfs":
        server = request.getfixturevalue("hdfs_server")
        return open_lake(f"{server.url}/lake-{run}")
    server = request.getfixturevalue("s3_server")
    return open_lake(f"s3a://{server.bucket}/lake-{run}", {**server.env(), "S3_ENDPOINT": server.endpoint})


def test_objects_are_written_whole_read_listed_and_removed(lake):
    lake.write_json({"a": 1}, "jobs", "j", "status.json")
    lake.write_bytes(b"x" * 100, "jobs/j/job.log")
    assert lake.read_json("jobs/j/status.json") == {"a": 1}
    lake.write_json({"a": 2}, "jobs/j/status.json")  # replaced
    assert lake.read_json("jobs", "j", "status.json") == {"a": 2}
    assert [(e.name, e.is_dir) for e in lake.list("jobs")] == [("j", True)]
    children = {e.name: e.size for e in lake.list("jobs", "j")}
    assert children == {"job.log": 100, "status.json": 7}
    assert lake.exists("jobs/j/job.log") and lake.exists("jobs") and not lake.exists("jobs/k")
    assert lake.tree_bytes("jobs") == 107
    lake.delete("jobs/j/job.log")
    assert [e.name for e in lake.list("jobs/j")] == ["status.json"]
    lake.delete_tree("jobs")
    assert lake.list("jobs") == [] and lake.read_json("jobs/j/status.json", default="none") == "none"
    with pytest.raises(NotFound):
        lake.read_bytes("jobs/j/status.json")


def test_of_32_racing_creators_of_one_key_exactly_one_wins(lake):
    with cf.ThreadPoolExecutor(32) as pool:
        won = list(pool.map(lambda i: lake.create(f"{i}".encode(), "locks", "one"), range(32)))
    assert won.count(True) == 1
    assert lake.read_bytes("locks/one") == str(won.index(True)).encode()
    assert not lake.create(b"late", "locks/one")  # and later ones lose too
    assert [e.name for e in lake.list("locks")] == ["one"]  # no temporary object is left


def test_uris_for_spark_and_delta_rs(lake):
    assert lake.uri("topics", "t").endswith("/topics/t")
    if lake.kind == "s3":
        assert lake.uri("x").startswith("s3a://") and lake.delta_uri("x").startswith("s3://")
        assert lake.delta_options()["AWS_ALLOW_HTTP"] == "true"
        assert "secret" not in repr(lake)
    else:
        assert lake.delta_uri("x") == lake.uri("x") and lake.delta_options() == {}


@pytest.mark.parametrize("kind", ["hdfs", "s3"])
def test_a_store_that_does_not_answer_is_one_error_naming_it_within_a_second_or_so(kind):
    """Nothing listens at the address: one line naming the store's address and what to do, no credentials, soon
    (S3's client gives up after a short retry budget, not its default of 10 retries)."""
    import time

    from jobs.core.lake import require_lake
    from jobs.dev import free_port
    from jobs.errors import LakeUnusable
    from tests.conftest import make_settings

    port = free_port()
    secret = "s3cr3t-Key"
    env = {
        "S3_ENDPOINT": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": secret,
    }
    uri = f"hdfs://127.0.0.1:{port}/lake" if kind == "hdfs" else "s3a://bucket/lake"
    started = time.monotonic()
    with pytest.raises(LakeUnreachable) as caught:
        open_lake(uri, env).write_bytes(b"x", "jobs/j/status.json")
    took = time.monotonic() - started
    line = str(caught.value)
    assert "\n" not in line and f"127.0.0.1:{port} does not answer" in line and secret not in line, line
    assert took < 2.5, took  # a generous bound on the retry budget (about 0.1-0.7 s here; 2.9 s before)
    with pytest.raises(LakeUnusable) as unusable:  # what `mview ingest` says
        require_lake(make_settings(uri, "redis://127.0.0.1:1/0", **env), write=True)
    line = str(unusable.value)
    hint = "check S3_ENDPOINT" if kind == "s3" else "make hdfs"
    assert f"127.0.0.1:{port} does not answer" in line and hint in line and secret not in line, line


def test_a_local_owner_only_object_gets_owner_only_directories_whatever_the_umask(tmp_path):
    import os
    import stat

    lake = open_lake(tmp_path / "lake")
    old = os.umask(0o022)
    try:
        lake.write_json({"state": "running"}, "jobs", "j", "status.json")
        lake.write_bytes(b"x", "shared", "a.txt", mode=0o644)
    finally:
        os.umask(old)
    root = tmp_path / "lake"
    assert stat.S_IMODE((root / "jobs").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "jobs" / "j").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "jobs" / "j" / "status.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "shared").stat().st_mode) == 0o755
