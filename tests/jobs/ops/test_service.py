"""The deployed job's guard (`jobs.ops.service`) on a real three-master Redis Cluster (REDIS_CLUSTER=true, each
master's append-only file on), driven as a user drives it: `mview ingest`, `mview deploy`, `mview replay`, `mview
status`.

One deployment serves the module (a deployed Spark driver costs tens of seconds here); each test starts from the
running, caught-up job (a test run alone deploys it first) and feeds the next slice of one workload:

1. the master that holds `mv:gen:timeline` is SIGKILLed and started again without its data while the job is idle:
   the guard, reading the pointer on the master of its slot, sees the serving copy lost; the job rebuilds it into
   the next generation without a manual step, as on one server, and new input goes into that generation;
2. `mview replay timeline` while deployed: the deployed job moves to the new generation (the replay does not end
   with "has not moved"), the replay removes the old generation from every master, and new input goes into the
   new one;
3. a master is SIGKILLed while input arrives: the job says in its status that it waits for Redis, and once the
   master is back with its data (its append-only file) the views are whole in the same generation, nothing rebuilt
   and nothing lost, and the job goes on.

Apart from the deployment: the guard that cannot read the lake (a NameNode that does not answer) says the lake,
not Redis, both when it goes blind and when it reads again.
"""

from __future__ import annotations

import shutil
import signal

import pytest
import redis
from redis.cluster import RedisCluster

from jobs.dev.redis import scratch_redis_cluster, start_cluster_node
from tests.conftest import make_settings
from tests.jobs.opshelp import mview, mview_here, status_of, wait_for, write_jsonl
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import export_timeline
from timeline_demo.workload import generate
from views.keys import gen_key
from views.redis_io import connect

JOB, CAP, PARTS = "timeline", 10, 5


class _Deployment:
    """The module's cluster, lake and deployed job; the workload's slices and how many were fed."""

    def __init__(self, root):
        self.root = root
        self.workdir = root / "cluster"
        self.workdir.mkdir()
        self.procs, self.ports = scratch_redis_cluster(self.workdir, persist=True)
        self.url = f"redis://127.0.0.1:{self.ports[0]}/0"
        self.settings = make_settings(
            root / "lake",
            self.url,
            TIMELINE_CAP=CAP,
            TRIGGER_INTERVAL="200 ms",
            REPLAY_GRACE="200 ms",
            REDIS_CLUSTER="true",
        )
        wl = generate(seed=31, users=40, celebrities=2, follows=60 * PARTS, tweets=60 * PARTS)
        size = -(-len(wl.tweets) // PARTS), -(-len(wl.follows) // PARTS)
        self.tw = [wl.tweets[i * size[0] : (i + 1) * size[0]] for i in range(PARTS)]
        self.fo = [wl.follows[i * size[1] : (i + 1) * size[1]] for i in range(PARTS)]
        self.fed = 0
        self.truth: dict = {}

    def feed_next(self) -> dict:
        """`mview ingest` (in this process: no Spark) the next slice of tweets and follows; the reference timelines
        of all slices fed."""
        i = self.fed
        for topic, part in (("tweets", self.tw[i]), ("follows", self.fo[i])):
            r = mview_here(self.settings, "ingest", topic, write_jsonl(self.root / f"{topic}{i}.jsonl", part))
            assert r.returncode == 0, r.stderr
        self.fed += 1
        return expected_timelines(sum(self.tw[: self.fed], []), sum(self.fo[: self.fed], []), CAP)

    def timelines(self) -> dict | None:
        try:
            return {r["user_id"]: r["tweet_ids"] for r in export_timeline(connect(self.url, wait=False))}
        except Exception:  # noqa: BLE001 - the cluster is still coming back
            return None

    def caught_up(self, generation: int, truth: dict) -> bool:
        s = status_of(self.settings, JOB)
        return (
            s["running"]
            and s["generation"] == generation
            and s["lag_versions"] == 0
            and s.get("state") == "running"
            and self.timelines() == truth
        )

    def up(self) -> dict:
        """The job running and caught up on everything fed (the first slice at least); its status."""
        if self.fed == 0:
            self.truth = self.feed_next()
            r = mview(self.settings, "deploy", JOB)
            assert r.returncode == 0, r.stderr
        wait_for(
            lambda: self.caught_up(status_of(self.settings, JOB)["generation"], self.truth),
            "the job to run and catch up",
            timeout_s=600,
        )
        return status_of(self.settings, JOB)

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def master_of(self, key: str) -> int:
        """The index in `ports` (and `procs`) of the master that holds `key`."""
        return self.ports.index(RedisCluster.from_url(self.url).get_node_from_key(key).port)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    d = _Deployment(tmp_path_factory.mktemp("service"))
    try:
        yield d
    finally:
        mview(d.settings, "stop", JOB)
        for p in d.procs:
            p.terminate()
        for p in d.procs:
            p.wait(10)


@pytest.mark.slow  # the module's deployed driver: a JVM of its own
def test_a_master_restarted_without_its_data_while_idle_is_rebuilt(deployment):
    d = deployment
    before = d.up()
    gen, rebuilds = before["generation"], before.get("rebuilds") or 0

    i = d.master_of(gen_key(JOB))
    d.kill(i)
    shutil.rmtree(d.workdir / f"aof-{d.ports[i]}")  # same slots, no data: the pointer is gone
    d.procs[i] = start_cluster_node(d.ports[i], d.workdir, persist=True)

    wait_for(lambda: d.caught_up(gen + 1, d.truth), "the job to rebuild the lost serving copy", timeout_s=600)
    s = status_of(d.settings, JOB)
    assert s["rebuilds"] == rebuilds + 1 and s["last_rebuild"]["generation"] == gen + 1, s
    assert f"{gen_key(JOB)} is gone" in s["last_rebuild"]["reason"]

    d.truth = d.feed_next()  # new input goes into the rebuilt generation
    wait_for(lambda: d.caught_up(gen + 1, d.truth), "the job to go on in the new generation", timeout_s=600)


@pytest.mark.slow
def test_replay_while_deployed_moves_the_job_to_the_new_generation(spark, deployment):
    d = deployment
    gen = d.up()["generation"]

    r = mview_here(d.settings, "replay", JOB)  # on the tests' Spark session: no JVM of its own
    assert r.returncode == 0, r.stderr
    assert "has not moved" not in r.stderr, r.stderr
    assert f"replayed into generation {gen + 1}" in r.stdout, r.stdout
    s = status_of(d.settings, JOB)
    assert s["running"] and s["generation"] == gen + 1, s
    for port in d.ports:  # the replay removed the old generation from every master once the job had moved
        assert list(redis.Redis(port=port).scan_iter(match=f"mv:*:{gen}:*")) == [], port

    d.truth = d.feed_next()  # the job writes the new generation
    wait_for(lambda: d.caught_up(gen + 1, d.truth), "the job to go on in the new generation", timeout_s=600)


@pytest.mark.slow
def test_a_master_killed_while_input_arrives_is_waited_for_and_nothing_is_lost(deployment):
    d = deployment
    before = d.up()
    gen, rebuilds = before["generation"], before.get("rebuilds") or 0

    i = next(n for n in range(len(d.ports)) if n != d.master_of(gen_key(JOB)))  # a third of the slots
    d.kill(i)
    d.truth = d.feed_next()
    wait_for(
        lambda: "waiting for Redis" in str(status_of(d.settings, JOB).get("redis", "")),
        "the job to say it waits for Redis",
        timeout_s=600,
    )
    d.procs[i] = start_cluster_node(d.ports[i], d.workdir, persist=True)  # back with its append-only file
    wait_for(lambda: d.caught_up(gen, d.truth), "the views to be whole again after the master came back", 600)
    s = status_of(d.settings, JOB)
    assert s["generation"] == gen and (s.get("rebuilds") or 0) == rebuilds, s  # nothing lost: no rebuild

    d.truth = d.feed_next()
    wait_for(lambda: d.caught_up(gen, d.truth), "the job to go on", timeout_s=600)


def test_the_guard_blind_to_the_lake_names_the_lake_not_redis(tmp_path, redis_url, capsys):
    from jobs.dev import free_port
    from jobs.ops.service import _Failure, _Guard

    down = make_settings(f"hdfs://127.0.0.1:{free_port()}/lake", redis_url, METRICS_PORT="off")
    guard = _Guard(None, JOB, down, _Failure(down, JOB))
    assert guard._read() == (
        None,
        None,
    )  # the lake cannot tell whether Redis lost the serving copy: ask again
    blind = capsys.readouterr().err
    assert "the query guard cannot read the lake (hdfs://127.0.0.1:" in blind and "mv:gen" not in blind, blind
    guard.settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off")
    guard._read()
    assert "the query guard reads the lake again after" in capsys.readouterr().err
