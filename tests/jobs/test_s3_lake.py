"""Spark on a lake on S3 (`LAKE_DIR=s3a://bucket/path`, the session's S3Proxy `tests.devhelp.s3_server`).

`get_spark`'s S3A settings hold no credential (they reach the JVM's command line); then the built-in timeline end to
end: records enter through the installed CLI (`mview ingest`, delta-rs on `s3://`), the job runs `--once` in a
driver process of its own (the session's `spark` has no S3A) from a working directory of its own, and its view
equals the brute-force reference (`timeline_demo.reference`); a second `--once` after more records appends
exactly, from the job's state, checkpoint and output log on S3 alone. That scenario runs when this run's one store
(`tests.devhelp.one_store`) is HDFS: on the other days the one-store tests deploy the timeline on S3, continued by a
driver deployed from another place, its log and status free of the secret (tests/jobs/test_remote_deploy.py)."""

from __future__ import annotations

import uuid

import pytest

from jobs.core.spark import s3a_conf
from tests.conftest import make_settings
from tests.devhelp import ingest_cli, job_once, one_store
from timeline_demo.reference import expected_timelines
from timeline_demo.workload import generate
from views.read import export_view
from views.redis_io import connect

CAP = 20
SECRET = "not-a-real-secret-0123456789"


def test_s3a_conf_has_the_endpoint_and_no_credential(tmp_path):
    env = {
        "S3_ENDPOINT": "http://127.0.0.1:9100",
        "AWS_ACCESS_KEY_ID": "key-id-0123",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "eu-west-3",
    }
    conf = s3a_conf(make_settings("s3a://bucket/lake", "redis://127.0.0.1:1/0", **env))
    assert conf == {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9100",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-3",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.delta.logStore.s3a.impl": "mview.delta.ConditionalPutLogStore",
    }
    # AWS itself (no endpoint): virtual-hosted addressing over TLS, the region only
    aws = s3a_conf(make_settings("s3a://bucket/lake", "redis://127.0.0.1:1/0", AWS_REGION="eu-west-3"))
    assert aws == {
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-3",
        "spark.delta.logStore.s3a.impl": "mview.delta.ConditionalPutLogStore",
    }


def _timelines(settings) -> dict[str, list[str]]:
    return {r["user_id"]: r["tweet_ids"] for r in export_view(connect(settings.redis_url), "timeline")}


@pytest.mark.e2e
@pytest.mark.skipif(one_store() == "s3", reason="the one-store tests run the timeline on S3 in this run")
def test_the_timeline_on_an_s3_lake_is_exact_and_continues_incrementally(s3_server, tmp_path, redis_url):
    root = f"s3-{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        f"s3a://{s3_server.bucket}/{root}",
        redis_url,
        TIMELINE_CAP=CAP,
        METRICS_PORT="off",
        SPARK_DRIVER_MEMORY="1g",
        **s3_server.env(),
    )
    assert settings.lake_dir is None and settings.lake.kind == "s3"
    secret = s3_server.credentials["AWS_SECRET_ACCESS_KEY"]
    wl = generate(seed=35, users=40, celebrities=2, follows=240, tweets=240)
    half_t, half_f = len(wl.tweets) // 2, len(wl.follows) // 2

    ingest_cli(settings, tmp_path, "follows", wl.follows[:half_f])
    ingest_cli(settings, tmp_path, "tweets", wl.tweets[:half_t])
    first, said = job_once(settings, "timeline", tmp_path / "driver-1")
    assert secret not in said
    assert first["job"] == "timeline" and first["events"] == half_t + half_f
    assert _timelines(settings) == expected_timelines(wl.tweets[:half_t], wl.follows[:half_f], CAP)
    # Spark wrote the job's streaming checkpoint and state on S3 (S3A); its status is there too
    keys, _ = s3_server.client().list_v2(s3_server.bucket, prefix=f"{root}/")
    assert f"{root}/checkpoints/timeline/g1/commits/0" in keys, keys
    assert any(k.startswith(f"{root}/state/timeline/") and k.endswith(".parquet") for k in keys), keys
    assert f"{root}/jobs/timeline/status.json" in keys

    # more records, then a second driver (another working directory): it continues from the lake alone
    ingest_cli(settings, tmp_path, "follows", wl.follows[half_f:])
    ingest_cli(settings, tmp_path, "tweets", wl.tweets[half_t:])
    second, said = job_once(settings, "timeline", tmp_path / "driver-2")
    assert secret not in said
    assert second["events"] == len(wl.tweets) - half_t + len(wl.follows) - half_f  # the new records only
    want = expected_timelines(wl.tweets, wl.follows, CAP)
    assert sum(len(v) for v in want.values()) > 150
    assert _timelines(settings) == want
