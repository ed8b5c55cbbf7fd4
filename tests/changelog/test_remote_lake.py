"""The changelog layer on a lake on HDFS and on S3 (real servers, `tests.devhelp`): `mview ingest` of a file with a
bad line commits its records to the topic's Delta log there (read back with delta-rs, as a reader on another
machine would) and writes its dead letter as one object there (read back with `read_dead_letters`); ingesting the
file again commits and writes nothing, and a kafka batch copied twice is there once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from changelog.deadletters import count_dead_letters, read_dead_letters
from changelog.ingest import ingest
from changelog.kafka import copy_batch
from changelog.storage import as_lake, open_lake
from changelog.topics import latest_version, table_id, topic_key
from tests.lakehelp import as_topic

pytestmark = pytest.mark.e2e

MVIEW = str(Path(sys.executable).with_name("mview"))


def _post(tweet_id: str) -> bytes:
    return orjson.dumps(
        {"op": "post", "tweet_id": tweet_id, "user_id": "u1", "text": "hi", "ts": 1767225600000}
    )


def _ids(lake) -> list[str]:
    """Every tweet_id of the tweets log, read with delta-rs through the lake's URI and options."""
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(
        lake.delta_uri(topic_key(as_topic("tweets"))), storage_options=lake.delta_options() or None
    )
    got = QueryBuilder().register("t", table).execute("SELECT tweet_id FROM t").read_all()
    return sorted(got.column("tweet_id").to_pylist()) if got.num_rows else []


@pytest.fixture(params=["hdfs", "s3"])
def remote_lake(request):
    """A fresh lake on the session's HDFS or S3 server: (its `Lake`, the environment a process needs for it)."""
    name = f"lake-{uuid.uuid4().hex[:8]}"
    if request.param == "hdfs":
        server = request.getfixturevalue("hdfs_server")
        env = {"LAKE_DIR": f"{server.url}/{name}"}
    else:
        server = request.getfixturevalue("s3_server")
        env = {"LAKE_DIR": f"s3a://{server.bucket}/{name}", **server.env(), "S3_ENDPOINT": server.endpoint}
    return open_lake(env["LAKE_DIR"], env), env


def test_ingest_commits_on_the_store_and_writes_each_dead_letter_once(remote_lake, tmp_path):
    lake, _env = remote_lake
    src = tmp_path / "t.jsonl"
    src.write_bytes(_post("t1") + b"\nnot json\n" + _post("t2") + b"\n")

    result = ingest(None, as_lake(lake), as_topic("tweets"), [str(src)])
    assert result.summary() == {"topic": "tweets", "accepted": 2, "rejected": 1}
    assert _ids(lake) == ["t1", "t2"]
    assert latest_version(as_lake(lake), as_topic("tweets")) == 1 and table_id(
        as_lake(lake), as_topic("tweets")
    )
    assert lake.exists(
        topic_key(as_topic("tweets")), "_delta_log", f"{1:020d}.crc"
    )  # its checksum, on the store
    (dead,) = read_dead_letters(as_lake(lake), as_topic("tweets"))
    assert (dead["file"], dead["line"], dead["raw"]) == (str(src), 2, "not json")
    assert "not valid JSON" in dead["reason"]
    (obj,) = lake.list("deadletter", "tweets")
    assert obj.name.startswith("ingest-") and obj.name.endswith(".jsonl")

    again = ingest(
        None, as_lake(lake), as_topic("tweets"), [str(src)]
    )  # its position and dead letters, found on the store
    assert again.summary() == {"topic": "tweets", "accepted": 0, "rejected": 0, "already_committed": 3}
    assert _ids(lake) == ["t1", "t2"] and count_dead_letters(as_lake(lake), as_topic("tweets")) == 1

    rows = [("k.tweets", 0, 0, _post("k1")), ("k.tweets", 0, 1, b"{}")]
    for _ in range(2):  # a batch replayed after a crash: nothing twice
        copied = copy_batch(
            as_lake(lake), {"k.tweets": as_topic("tweets")}, rows, app_id="mview.kafka.x", version=0
        )
        assert copied == {"tweets": {"accepted": 1, "rejected": 1}}
    assert _ids(lake) == ["k1", "t1", "t2"]
    offsets = [d.get("offset") for d in read_dead_letters(as_lake(lake), as_topic("tweets"))]
    assert offsets == [None, 1]  # in key order: `ingest-...`, then `kafka-...`


def test_mview_ingest_with_lake_dir_on_the_store(remote_lake, tmp_path):
    """The command line with LAKE_DIR a URI: the summary, then the records and the dead letter in the lake."""
    lake, env = remote_lake
    src = tmp_path / "t.jsonl"
    src.write_bytes(_post("c1") + b"\n{}\n")
    done = subprocess.run(
        [MVIEW, "ingest", "tweets", str(src), "--json"],
        env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"topic": "tweets", "accepted": 1, "rejected": 1}
    assert f"rejected lines and reasons are in {lake.uri('deadletter', 'tweets')}" in done.stdout
    assert env.get("AWS_SECRET_ACCESS_KEY", "\0") not in done.stdout + done.stderr
    assert _ids(lake) == ["c1"]
    assert [(d["file"], d["line"]) for d in read_dead_letters(as_lake(lake), as_topic("tweets"))] == [
        (str(src), 2)
    ]


def test_concurrent_ingest_processes_on_the_store_store_every_record_and_dead_letter_once(
    remote_lake, tmp_path
):
    """Four `mview ingest` processes creating the topic and appending to it at once, with no lock on the store:
    every record and every dead letter once, one commit per file after the creation."""
    lake, env = remote_lake
    files = []
    for n in range(4):
        files.append(tmp_path / f"p{n}.jsonl")
        files[-1].write_bytes(b"".join(_post(f"p{n}-{i}") + b"\n" for i in range(50)) + b"bad\n")
    procs = [
        subprocess.Popen(
            [MVIEW, "ingest", "tweets", str(f), "--json"],
            env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in files
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1]) == {"topic": "tweets", "accepted": 50, "rejected": 1}
    assert _ids(lake) == sorted(f"p{n}-{i}" for n in range(4) for i in range(50))
    assert latest_version(as_lake(lake), as_topic("tweets")) == 4
    assert sorted((d["file"], d["line"]) for d in read_dead_letters(as_lake(lake), as_topic("tweets"))) == [
        (str(f), 51) for f in files
    ]
