"""The development HDFS (`jobs.dev.hdfs`, fixture `hdfs_server`): Hadoop's own NameNode and DataNode answer on
loopback; Spark (the session's `get_spark`, local[2]) and delta-rs (`deltalake`, through its native HDFS client
`hdfs-native`, no JVM) write and read the same Delta table at `hdfs://127.0.0.1:<port>/...`; concurrent delta-rs
writers lose no commit (the NameNode's rename-without-overwrite decides each version); the server keeps its files
across a stop and start."""

from __future__ import annotations

import multiprocessing
import urllib.request

import pytest

pytestmark = pytest.mark.e2e


def _table(rows: list[int]):
    import arro3.core as ac

    return ac.Table.from_pydict({"id": ac.Array(rows, ac.DataType.int64())})


def _ids(url: str) -> list[int]:
    from deltalake import DeltaTable, QueryBuilder

    t = QueryBuilder().register("t", DeltaTable(url)).execute("SELECT id FROM t ORDER BY id").read_all()
    return t.column("id").to_pylist()


def _append(args) -> None:
    url, writer, commits = args
    from deltalake import write_deltalake

    for k in range(commits):
        write_deltalake(url, _table([writer * 100 + k]), mode="append")


def test_webhdfs_answers_on_loopback(hdfs_server):
    assert hdfs_server.url.startswith("hdfs://127.0.0.1:")
    with urllib.request.urlopen(f"{hdfs_server.web_url}/webhdfs/v1/?op=GETFILESTATUS", timeout=10) as r:
        assert b'"type":"DIRECTORY"' in r.read()


def test_spark_and_delta_rs_share_a_delta_table_on_hdfs(spark, hdfs_server):
    from deltalake import DeltaTable, write_deltalake

    url = f"{hdfs_server.url}/shared"
    spark.range(0, 5).write.format("delta").save(url)  # Spark creates the table
    assert _ids(url) == [0, 1, 2, 3, 4]  # delta-rs reads Spark's commit
    write_deltalake(url, _table([10, 11]), mode="append")  # delta-rs appends
    assert sorted(r.id for r in spark.read.format("delta").load(url).collect()) == [0, 1, 2, 3, 4, 10, 11]
    spark.range(20, 22).write.format("delta").mode("append").save(url)
    assert DeltaTable(url).version() == 2 and _ids(url) == [0, 1, 2, 3, 4, 10, 11, 20, 21]
    fs = spark._jvm.org.apache.hadoop.fs.FileSystem.get(
        spark._jvm.java.net.URI(url), spark._jsc.hadoopConfiguration()
    )
    assert fs.getClass().getName() == "org.apache.hadoop.hdfs.DistributedFileSystem"


def test_concurrent_delta_rs_writers_on_hdfs_lose_no_commit(hdfs_server):
    from deltalake import DeltaTable, write_deltalake

    url, writers, commits = f"{hdfs_server.url}/race", 4, 3
    write_deltalake(url, _table([-1]), mode="append")
    with multiprocessing.get_context("spawn").Pool(writers) as pool:
        pool.map(_append, [(url, w, commits) for w in range(writers)])
    assert DeltaTable(url).version() == writers * commits
    assert _ids(url) == [-1] + sorted(w * 100 + k for w in range(writers) for k in range(commits))


def test_a_restarted_hdfs_keeps_its_files(hdfs_server):
    from deltalake import write_deltalake

    url = f"{hdfs_server.url}/kept"
    write_deltalake(url, _table([7]), mode="append")
    hdfs_server.stop()
    hdfs_server.start()
    assert _ids(url) == [7]
