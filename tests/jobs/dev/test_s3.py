"""The development S3 server (`jobs.dev.s3`: S3Proxy, filesystem backend; fixture `s3_server`).

First the conformance the service rests on: 32 concurrent conditional puts (`If-None-Match: *`) of one key give
exactly one success and 31 refusals (412), and the object holds the winner's bytes. Then what Spark's S3A and
delta-rs use: signed path-style requests, ListObjectsV2 with continuation, multipart uploads (a conditional
completion refused when the key exists). Then the Delta round trips: delta-rs (`s3://`, `delta_rs_options`) commits
safely with concurrent writers (each commit a conditional put), and Spark (`get_spark` with hadoop-aws and the AWS
SDK on its class path, `s3a://`) reads delta-rs's table, appends to it and writes its own, which delta-rs reads;
Hadoop's S3A conditional create (`fs.option.create.conditional.overwrite`) lets exactly one of 8 racing creators
through."""

from __future__ import annotations

import collections
import multiprocessing
import threading
import uuid

import pytest

from tests.devhelp import run_python, s3a_spark_conf_dir

pytestmark = pytest.mark.e2e

RACERS = 32


def test_32_concurrent_conditional_puts_of_one_key_give_exactly_one_success(s3_server):
    client, key = s3_server.client(), f"conformance/{uuid.uuid4().hex}/00000000000000000000.json"
    barrier, statuses, winners = threading.Barrier(RACERS), collections.Counter(), []

    def put(i: int) -> None:
        barrier.wait()
        status = client.put(s3_server.bucket, key, f"writer {i}".encode(), if_none_match="*")
        statuses[status] += 1
        if status == 200:
            winners.append(i)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == {200: 1, 412: RACERS - 1}, dict(statuses)
    assert client.get(s3_server.bucket, key) == (200, f"writer {winners[0]}".encode())
    assert client.put(s3_server.bucket, key, b"late", if_none_match="*") == 412


def test_list_objects_v2_pages_and_multipart_uploads(s3_server):
    client, bucket, prefix = s3_server.client(), s3_server.bucket, f"listing/{uuid.uuid4().hex}/"
    names = [f"{prefix}{i:03d}" for i in range(7)]
    for name in names:
        assert client.put(bucket, name, b"x") == 200
    seen, token, pages = [], None, 0
    while True:
        keys, token = client.list_v2(bucket, prefix, max_keys=3, token=token)
        seen, pages = seen + keys, pages + 1
        if token is None:
            break
    assert seen == names and pages == 3
    big = f"{prefix}multipart"
    parts = [b"a" * (5 * 1024 * 1024), b"b" * 1000]
    assert client.multipart_put(bucket, big, parts, if_none_match="*") == 200
    assert client.multipart_put(bucket, big, [b"c" * (5 * 1024 * 1024), b"d"], if_none_match="*") == 412
    assert client.get(bucket, big) == (200, b"".join(parts))


def _delta_rs_append(args) -> None:
    url, options, writer, commits = args
    import arro3.core as ac
    from deltalake import write_deltalake

    for k in range(commits):
        rows = ac.Table.from_pydict({"id": ac.Array([writer * 100 + k], ac.DataType.int64())})
        write_deltalake(url, rows, mode="append", storage_options=options)


def _delta_rs_ids(url: str, options: dict) -> list[int]:
    from deltalake import DeltaTable, QueryBuilder

    t = QueryBuilder().register("t", DeltaTable(url, storage_options=options))
    return t.execute("SELECT id FROM t ORDER BY id").read_all().column("id").to_pylist()


def test_concurrent_delta_rs_writers_on_s3_lose_no_commit(s3_server):
    from deltalake import DeltaTable

    from jobs.dev.s3 import delta_rs_options

    options = delta_rs_options(s3_server.endpoint, s3_server.credentials)
    url, writers, commits = f"s3://{s3_server.bucket}/race-{uuid.uuid4().hex}", 4, 3
    _delta_rs_append((url, options, -1, 1))
    with multiprocessing.get_context("spawn").Pool(writers) as pool:
        pool.map(_delta_rs_append, [(url, options, w, commits) for w in range(writers)])
    assert DeltaTable(url, storage_options=options).version() == writers * commits
    want = [-100] + sorted(w * 100 + k for w in range(writers) for k in range(commits))
    assert _delta_rs_ids(url, options) == want


_SPARK = """
import collections, json, sys, threading
from pathlib import Path
from tests.conftest import make_settings
from jobs.core.spark import get_spark

base, work = sys.argv[1:3]
spark = get_spark(make_settings(Path(work), "redis://127.0.0.1:1/0"))
out = {"fs": spark._jvm.org.apache.hadoop.fs.FileSystem.get(
    spark._jvm.java.net.URI(base), spark._jsc.hadoopConfiguration()).getClass().getName()}
out["read_rs"] = sorted(r.id for r in spark.read.format("delta").load(base + "/from-rs").collect())
spark.range(50, 53).write.format("delta").mode("append").save(base + "/from-rs")
spark.range(0, 4).write.format("delta").save(base + "/from-spark")

# Hadoop's S3A conditional create: 8 threads race to create one file.
jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
path = jvm.org.apache.hadoop.fs.Path(base + "/conditional/00000000000000000001.json")
fs, barrier, results = path.getFileSystem(conf), threading.Barrier(8), collections.Counter()

def create(i):
    builder = fs.createFile(path).overwrite(False).must("fs.option.create.conditional.overwrite", True)
    barrier.wait()
    try:
        stream = builder.build()
        stream.write(bytearray(b"creator %d" % i))
        stream.close()
        results["created"] += 1
    except Exception as e:
        results[e.java_exception.getClass().getSimpleName()] += 1

threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
out["conditional_create"] = dict(results)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_spark_s3a_and_delta_rs_share_delta_tables(s3_server, tmp_path):
    import arro3.core as ac
    from deltalake import write_deltalake

    from jobs.dev.s3 import delta_rs_options

    options = delta_rs_options(s3_server.endpoint, s3_server.credentials)
    prefix = f"{s3_server.bucket}/spark-{uuid.uuid4().hex}"
    rows = ac.Table.from_pydict({"id": ac.Array([1, 2], ac.DataType.int64())})
    write_deltalake(f"s3://{prefix}/from-rs", rows, mode="append", storage_options=options)
    conf_dir = s3a_spark_conf_dir(tmp_path / "spark-conf", s3_server)
    out = run_python(_SPARK, f"s3a://{prefix}", str(tmp_path / "lake"), env={"SPARK_CONF_DIR": str(conf_dir)})
    assert out["fs"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert out["read_rs"] == [1, 2]
    assert _delta_rs_ids(f"s3://{prefix}/from-rs", options) == [1, 2, 50, 51, 52]
    assert _delta_rs_ids(f"s3://{prefix}/from-spark", options) == [0, 1, 2, 3]
    assert out["conditional_create"] == {"created": 1, "RemoteFileChangedException": 7}
