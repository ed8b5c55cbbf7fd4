"""Delta's log store for a lake on S3 (`jobs.core.logstore`), in a driver that `get_spark` starts for an `s3a://`
lake on the session's S3 server: of 8 threads writing one version through it exactly one succeeds and 7 get
`FileAlreadyExistsException` (what Delta retries on), and the winner's commit is whole; 4 threads of one driver
appending to one table at once (no lock in the JVM) lose no commit. delta-rs writers racing on S3:
tests/jobs/dev/test_s3.py."""

from __future__ import annotations

import json
import uuid

import pytest

from jobs.core.logstore import LOGSTORE_CLASS, logstore_conf
from tests.devhelp import run_python

pytestmark = pytest.mark.e2e

_SCRIPT = """
import collections, json, sys, threading
from tests.conftest import make_settings
from jobs.core.spark import get_spark

base, env = sys.argv[1], json.loads(sys.argv[2])
spark = get_spark(make_settings(base + "/lake", "redis://127.0.0.1:1/0", **env))
jvm = spark._jvm
conf = spark.sparkContext._jsc.hadoopConfiguration()
out = {"impl": spark.conf.get("spark.delta.logStore.s3a.impl")}
store = jvm.mview.delta.ConditionalPutLogStore(conf)
path = jvm.org.apache.hadoop.fs.Path(base + "/store/_delta_log/00000000000000000001.json")
barrier, results = threading.Barrier(8), collections.Counter()

def write(i):
    lines = jvm.java.util.ArrayList()
    lines.add('{"writer": %d}' % i)
    barrier.wait()
    try:
        store.write(path, lines.iterator(), False, conf)
        results["written"] += 1
    except Exception as e:
        results[e.java_exception.getClass().getName()] += 1

threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
out["race"] = dict(results)
out["commit"] = list(store.read(path, conf))

table = base + "/appends"
spark.range(0, 1).write.format("delta").save(table)

def append(i):
    for k in range(3):
        spark.range(100 * i + k + 1, 100 * i + k + 2).write.format("delta").mode("append").save(table)

threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
out["ids"] = sorted(r.id for r in spark.read.format("delta").load(table).collect())
print(json.dumps(out))
"""


def test_conditional_put_log_store_lets_one_writer_create_a_version(s3_server):
    base = f"s3a://{s3_server.bucket}/logstore-{uuid.uuid4().hex[:8]}"
    out = run_python(_SCRIPT, base, json.dumps(s3_server.env()))
    assert out["impl"] == LOGSTORE_CLASS == logstore_conf()["spark.delta.logStore.s3a.impl"]
    assert out["race"] == {"written": 1, "java.nio.file.FileAlreadyExistsException": 7}
    assert len(out["commit"]) == 1 and json.loads(out["commit"][0])["writer"] in range(8)
    assert out["ids"] == [0] + sorted(100 * i + k + 1 for i in range(4) for k in range(3))
