"""The timeline job run as a service (deploy/stop/status/replay, its metrics, Redis failures under it), with real
processes, one real password-protected redis-server (fsync-always AOF) that the tests stop, kill, wipe and
restart, and SIGKILL in the middle of a micro-batch.

One deployment serves the module, because each deployed Spark driver costs tens of seconds here: the tests run
in file order, each starts from the running, caught-up job the previous one left (a test run alone deploys it
first) and feeds its own slice of one workload, so every view is compared with the reference of all records
ingested so far. Every test checks its own guarantee:

1. deploy is idempotent (a second deploy says so and keeps the same pid); status reports lag, then 0; kill -9 of
   the driver while a micro-batch is in flight; status: not running, lag > 0 (the interrupted batch); deploy
   again: it resumes from the checkpoint;
2. Redis stopped under the running job: the log and status say "waiting for Redis", input keeps arriving;
   Redis started again: the job catches up;
3. replay while a reader queries continuously: every read is whole and correct, the generation goes n -> n+1,
   generation n's keys are gone; n+1 is an uninterrupted run of the same logs from the start, and it equals, key
   by key, generation n as the killed, redeployed, Redis-starved job left it; the deployed job continues on n+1
   with new input; replayed with umask 022, the job's directory stays its owner's only (0700, every file 0600);
4. metrics: the counters move by exactly the records ingested, rejected ones included, Spark's UI is served,
   and the operations page (headless Chromium) shows the job and an input-rate chart that changes after the
   ingest;
5. `mview stop` while a micro-batch waits for Redis ends the job at once, losing nothing (status and log show no
   password; no metrics or Spark UI URL once stopped; stop is idempotent); deployed again it is exact. Stopped and
   deployed from a shell with umask 022, where an older version left the job's directory 0755 and its `pid` 0644,
   the job's directory is its owner's only: 0700, every file in it 0600 (`pid` and `deploy.lock` were 0644,
   written by the deploying command);
6. Redis SIGKILLed and restarted empty on the same port with input ingested while it was down: no manual step,
   every timeline equals the reference again, the log and status say a rebuild happened. A reader polls all
   along; the longest time a reader got an empty timeline that the logs say is not empty is measured and printed
   (readers follow the pointer, which is gone until the rebuilt generation is switched in);
7. `mview status` (plain and --json) of a query that fails (a stray key of the wrong type where the sink
   writes): `last_error` is one line (Spark's error class, the Python exception's last line, no traceback) and
   each job one line of plain output; once the key is gone and the restarted query ran, `last_error` is null and
   the error is `previous_error`; Redis stopped: `state: waiting`, then `running` again;
8. a deploy whose pipeline declares the view otherwise (its `cap`) says what changed and restarts the running job,
   which rebuilds into the next generation and serves the new definition; its status names the change and shows
   the new generation's last batch; a second deploy finds it running;
9. the password changes under the running job: it stops retrying, says why in its status and log (which show no
   password), and exits; a deploy with the old password is refused in one line.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from changelog.ingest import ingest
from jobs.core.runtime import checkpoint_dir, checkpoint_key
from jobs.dev.redis import free_port
from jobs.ops.deploy import deploy, dump_stacks, log_path, pid_of, stop
from jobs.ops.replay import replay
from jobs.ops.ui import serve_in_thread
from tests.browser import browser
from tests.conftest import make_settings
from tests.jobs.opshelp import (
    OwnRedis,
    batch_in_flight,
    log_tail,
    metric_samples,
    mview,
    mview_here,
    not_owner_only,
    one_line_error,
    redis_content,
    status_of,
    wait_for,
    write_jsonl,
)
from timeline_demo.reference import expected_timelines
from timeline_demo.timeline_view import export_timeline, query_timeline, timeline_key
from timeline_demo.workload import T0, generate
from views.redis_io import connect

JOB, CAP, SECRET = "timeline", 20, "pw-S3cret"
_PARTS = 6

# Deployed drivers, each a JVM of its own that runs tens of seconds: `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow


def _parts(records, n):
    size = -(-len(records) // n)
    return [records[i * size : (i + 1) * size] for i in range(n)]


class _Service:
    """The module's deployment: its lake, its redis-server, the workload slices, every valid record fed so far."""

    def __init__(self, spark, root: Path):
        self.spark, self.root = spark, root
        self.own = OwnRedis(root / "redis")
        self.own.password = SECRET
        self.own.start()
        self.settings = make_settings(
            root / "lake",
            self.own.url(0),
            TIMELINE_CAP=CAP,
            TRIGGER_INTERVAL="200 ms",
            STOP_TIMEOUT="2 minutes",
            METRICS_PORT=free_port(),
            SPARK_UI="true",
        )
        wl = generate(seed=11, users=60, celebrities=2, follows=120 * _PARTS, tweets=120 * _PARTS)
        self.tw, self.fo = _parts(wl.tweets, _PARTS), _parts(wl.follows, _PARTS)
        self.tweets: list[dict] = []
        self.follows: list[dict] = []
        self.files = 0

    def feed(self, topic: str, records: list, *, extra_lines: str = "") -> None:
        """Ingest `records` (and `extra_lines`, rejected ones) into `topic`; remember the records."""
        self.files += 1
        path = self.root / f"{topic}{self.files}.jsonl"
        write_jsonl(path, records)
        if extra_lines:
            with open(path, "a") as fh:
                fh.write(extra_lines)
        ingest(self.spark, self.settings.lake, self.settings.topic(topic), [str(path)])
        (self.tweets if topic == "tweets" else self.follows).extend(records)

    def feed_part(self, i: int, topics=("tweets", "follows")) -> None:
        for topic in topics:
            self.feed(topic, (self.tw if topic == "tweets" else self.fo)[i])

    def expected(self, tweets=(), follows=()) -> dict:
        """The reference timelines of everything fed so far, plus `tweets` and `follows`."""
        return expected_timelines(self.tweets + list(tweets), self.follows + list(follows), CAP)

    def status(self) -> dict:
        return status_of(self.settings, JOB)

    def caught_up(self, gen: int | None = None, *, redis_ok: bool = False) -> bool:
        s = self.status()
        return (
            s["running"]
            and (gen is None or s["generation"] == gen)
            and s["lag_versions"] == 0
            and s.get("state") == "running"
            and (not redis_ok or s.get("redis") == "ok")
        )

    def client(self) -> redis.Redis:
        return connect(self.own.url(0))

    def timelines(self) -> dict:
        return {r["user_id"]: r["tweet_ids"] for r in export_timeline(self.client())}

    def up(self) -> dict:
        """Make sure the job runs on a healthy Redis and has processed everything (part 0 at least); its status."""
        if not self.tweets:  # a test run alone
            self.feed_part(0)
        if self.own.password != SECRET:  # a test changed it
            self.own.stop()
            self.own.password = SECRET
        if self.own.proc is None:
            self.own.start()
        if not self.status()["running"]:
            assert deploy(self.settings, JOB) == 0
        wait_for(self.caught_up, "the job to run and catch up")
        return self.status()


@pytest.fixture(scope="module")
def service(spark, tmp_path_factory, request):
    failed = request.session.testsfailed
    svc = _Service(spark, tmp_path_factory.mktemp("service"))
    yield svc
    stop(svc.settings, JOB)  # a driver that does not stop writes its threads' stacks to the log
    svc.own.stop()
    if request.session.testsfailed > failed:
        print(f"the job's log, its end:\n{log_tail(log_path(svc.settings, JOB))}")


def test_deploy_is_idempotent_and_a_kill9_mid_batch_resumes(service, capsys):
    settings = service.settings
    # A running job plans a batch per commit it sees, so a phase that only needs "input arrives" feeds one topic
    # (one commit, one micro-batch): tweets part 1 is killed mid-batch, follows part 1 waits for Redis (test 2).
    service.feed_part(0)
    assert status_of(settings, JOB)["lag_versions"] > 0
    assert deploy(settings, JOB) == 0
    pid = status_of(settings, JOB)["pid"]
    assert pid is not None
    assert deploy(settings, JOB) == 0
    assert "already running" in capsys.readouterr().out
    assert status_of(settings, JOB)["pid"] == pid
    wait_for(service.caught_up, "the first input to be processed")
    once = mview(settings, "run", JOB, "--once")  # beside it: refused before anything is written
    assert once.returncode == 1 and f"{JOB} runs in another driver ({JOB} driver (pid {pid})" in once.stderr
    assert service.timelines() == service.expected()

    gen = service.status()["generation"]
    service.feed_part(1, ["tweets"])
    wait_for(
        lambda: batch_in_flight(settings.lake, checkpoint_key(JOB, gen)),
        "a micro-batch in flight",
        every_s=0.02,
    )
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not status_of(settings, JOB)["running"], "the killed driver to be gone")
    assert status_of(settings, JOB)["lag_versions"] > 0  # the interrupted batch is not committed
    assert deploy(settings, JOB) == 0
    pid2 = status_of(settings, JOB)["pid"]
    assert pid2 not in (None, pid)
    wait_for(lambda: service.caught_up(gen), "the redeployed job to catch up")


def test_redis_stopped_under_the_job_is_waited_for(service):
    settings = service.settings
    gen = service.up()["generation"]
    service.own.stop()
    service.feed_part(1, ["follows"])
    wait_for(lambda: "waiting for Redis" in str(status_of(settings, JOB).get("redis")), "status to say so")
    wait_for(lambda: "waiting for Redis at" in log_path(settings, JOB).read_text(), "the log to say so")
    service.own.start()
    wait_for(lambda: service.caught_up(gen, redis_ok=True), "catch-up after Redis")
    assert service.timelines() == service.expected()


def test_replay_under_reads_equals_the_interrupted_run_and_the_job_continues(service):
    settings = service.settings
    before = service.up()
    gen, pid = before["generation"], before["pid"]
    # What the killed, redeployed, Redis-starved job left (when run after tests 1 and 2).
    interrupted = redis_content(service.client(), JOB, gen)
    want = service.expected()
    users = sorted(want)[:40]
    reads, problems, done = [], [], threading.Event()

    def reader():
        client = service.client()
        while not done.is_set():
            for u in users:
                try:
                    r = query_timeline(client, u)
                except Exception as e:  # noqa: BLE001 - a failed read is what we look for
                    problems.append(f"{u}: {e!r}")
                    continue
                got = [t["tweet_id"] for t in r["tweets"]]
                if got != want.get(u, []) or any(t["user_id"] is None for t in r["tweets"]):
                    problems.append(f"{u} g{r['generation']}: {got} != {want.get(u, [])}")
                reads.append(r["generation"])
            # a breath between rounds: the replay's batches run in this process (the GIL) and on these cores
            done.wait(0.02)

    thread = threading.Thread(target=reader)
    thread.start()
    umask = os.umask(0o022)  # a shell's: the job's directory stays its owner's only
    try:
        assert replay(service.spark, settings, JOB) == 0
    finally:
        os.umask(umask)
        done.set()
        thread.join()
    job_files = settings.lake_dir / "jobs" / JOB
    assert not_owner_only(job_files) == [], not_owner_only(job_files)
    assert not problems, problems[:5]
    assert reads and set(reads) == {gen, gen + 1} and reads[-1] == gen + 1
    assert reads == sorted(reads)  # never back to the old generation
    client = service.client()
    assert int(client.get("mv:gen:timeline")) == gen + 1
    assert [k for k in client.scan_iter(match=f"mv:*:{gen}:*")] == []
    assert not client.exists(f"mv:meta:timeline:{gen}")
    assert not Path(checkpoint_dir(settings, JOB, gen)).exists()
    # The replay ran the same records uninterrupted: exactly the interrupted run's Redis content.
    assert len(interrupted) > 100
    assert redis_content(client, JOB, gen + 1) == interrupted

    # The deployed job continues on the new generation with new input.
    service.feed_part(2)
    wait_for(lambda: service.caught_up(gen + 1), "the deployed job to continue on the new generation")
    assert status_of(settings, JOB)["pid"] == pid
    assert service.timelines() == service.expected()


def test_metrics_count_exactly_the_records_ingested_and_the_page_charts_them(service, tmp_path):
    settings = service.settings
    service.up()
    ts = T0 + 24 * 3_600_000  # after every workload record
    service.feed("follows", [{"op": "follow", "follower_id": "m1", "followee_id": "ma", "ts": ts}])
    wait_for(service.caught_up, "the follow to be processed")
    url = status_of(settings, JOB)["metrics_url"]
    assert url.startswith("http://127.0.0.1:")
    spark_ui = status_of(settings, JOB)["spark_ui_url"]  # SPARK_UI=true: Spark's own UI, served
    assert urllib.request.urlopen(spark_ui, timeout=10).status == 200

    def scrape() -> dict:
        return metric_samples(urllib.request.urlopen(url, timeout=10).read().decode())

    page = serve_in_thread(settings)
    web = browser(tmp_path)
    try:
        web.get(f"http://127.0.0.1:{page.server_port}/")
        wait_for(
            lambda: "1 job(s) running" in web.find_element("id", "note").text, "the page to show the job"
        )
        wait_for(lambda: _points(web) >= 3, "the charts to have a few samples")
        assert _rate_max(web) == 0  # nothing arrived while the page was open
        start = scrape()
        tweets = [
            {"op": "post", "tweet_id": f"mt{i}", "user_id": "ma", "text": "x", "ts": ts + 1 + i}
            for i in range(5)
        ]
        service.feed("tweets", tweets, extra_lines='{"op": "post"}\nnot json\n')
        key_in = ("mview_input_records_total", (("topic", "tweets"),))
        key_rej = ("mview_rejected_records_total", (("topic", "tweets"),))
        wait_for(
            lambda: scrape()[key_in] - start[key_in] == 5, "the 5 valid tweets to be counted", timeout_s=300
        )
        end = scrape()
        assert end[key_rej] - start[key_rej] == 2
        key_follows = ("mview_input_records_total", (("topic", "follows"),))
        assert end[key_follows] == start[key_follows]
        assert end[("mview_view_writes_total", (("kind", "entries"),))] >= 5
        # the batch is counted before Spark commits it to the checkpoint, which the lag is read from
        wait_for(lambda: scrape()[("mview_lag_versions", ())] == 0, "the lag to reach 0", timeout_s=60)
        wait_for(lambda: _rate_max(web) > 0, "the input-rate chart to show the ingest", timeout_s=60)
        assert web.find_element("id", "job-timeline").get_attribute("class") == "job running"
    finally:
        web.quit()
        page.shutdown()
    wait_for(service.caught_up, "the tweets to be processed")
    assert service.timelines() == service.expected()


def test_stop_while_waiting_for_redis_is_immediate_and_loses_nothing(service, capsys):
    settings = service.settings
    gen = service.up()["generation"]
    wait_for(lambda: service.caught_up(redis_ok=True), "the job to see Redis")
    job_files = settings.lake_dir / "jobs" / JOB
    for name in ("job.log", "status.json"):
        assert stat.S_IMODE((job_files / name).stat().st_mode) == 0o600, name

    # Redis stops; a micro-batch waits for it; `mview stop` ends the job at once, not after STOP_TIMEOUT.
    service.own.stop()
    service.feed_part(5, ["tweets"])
    wait_for(
        lambda: batch_in_flight(settings.lake, checkpoint_key(JOB, gen)), "a micro-batch waiting for Redis"
    )
    wait_for(lambda: "waiting for Redis" in str(status_of(settings, JOB).get("redis")), "status to say so")
    r = mview(settings, "status", "--json")
    assert "waiting for Redis at redis://:***@" in r.stdout and SECRET not in r.stdout + r.stderr
    started = time.monotonic()
    r = mview(settings, "stop", JOB, umask=0o022)  # from a shell
    took = time.monotonic() - started
    assert r.returncode == 0 and "SIGKILL" not in r.stderr, r
    assert took < 30, f"stop took {took:.0f}s: it waited for Redis (STOP_TIMEOUT is 2 minutes)"
    s = status_of(settings, JOB)
    assert not s["running"] and s["pid"] is None and s["state"] == "stopped"
    assert s["lag_versions"] > 0  # the interrupted batch is replayed at the next start
    assert s["metrics_url"] is None and s["spark_ui_url"] is None
    assert "waiting for Redis at redis://:***@" in log_path(settings, JOB).read_text()
    capsys.readouterr()
    assert stop(settings, JOB) == 0
    assert "not running" in capsys.readouterr().out

    # The job's directory as an older version left it: 0755, a stale `pid` 0644 (and no `deploy.lock`).
    job_files.chmod(0o755)
    (job_files / "pid").write_text("999999\n")
    (job_files / "pid").chmod(0o644)
    (job_files / "deploy.lock").unlink(missing_ok=True)

    # Redis back, deployed again from a shell: the replayed batch and everything else is exact, and the job's
    # directory is its owner's only (`pid` and `deploy.lock` were 0644, written by the deploying command).
    service.own.start()
    r = mview(settings, "deploy", JOB, umask=0o022)
    assert r.returncode == 0 and "deployed" in r.stdout, r
    wait_for(lambda: service.caught_up(redis_ok=True), "the redeployed job to catch up")
    assert service.timelines() == service.expected()
    names = {p.name for p in job_files.iterdir()}
    assert {"pid", "deploy.lock", "job.log", "status.json"} <= names, names
    assert any(n.startswith("lease.") for n in names), names  # the driver's lease (`jobs.core.lease`)
    assert not_owner_only(job_files) == [], not_owner_only(job_files)


def test_redis_restarted_empty_is_rebuilt_without_a_manual_step(service, capsys):
    settings = service.settings
    before = service.up()
    gen, rebuilds = before["generation"], before.get("rebuilds", 0)
    truths = [service.expected(), service.expected(service.tw[3], service.fo[3])]
    truths.append(service.expected(service.tw[3] + service.tw[4], service.fo[3] + service.fo[4]))
    # Users whose true timeline is non-empty whatever part of the input the logs hold at the time of a read.
    users = sorted(set.intersection(*(set(t) for t in truths)))
    assert len(users) > 20
    assert service.timelines() == truths[0]

    empty_since: dict[str, float] = {}
    stretches: list[float] = []
    errors, states, done = [], set(), threading.Event()

    def reader():
        client = redis.Redis.from_url(service.own.url(0), socket_connect_timeout=1, socket_timeout=2)
        while not done.is_set():
            for u in users:
                try:
                    r = query_timeline(client, u)
                except (redis.ConnectionError, redis.TimeoutError):
                    errors.append(time.monotonic())
                    time.sleep(0.05)
                    continue
                now = time.monotonic()
                if not r["tweets"]:
                    empty_since.setdefault(u, now)
                elif u in empty_since:
                    stretches.append(now - empty_since.pop(u))
            done.wait(0.02)  # a breath between rounds: the rebuild runs on these cores

    def status_watch():
        while not done.wait(0.3):
            states.add(status_of(settings, JOB).get("state"))

    threads = [threading.Thread(target=reader), threading.Thread(target=status_watch)]
    try:
        for t in threads:
            t.start()
        service.own.kill()
        service.own.wipe()
        service.feed_part(3)  # ingested while Redis is down
        service.own.start()  # same port, no data
        restarted = time.monotonic()

        wait_for(
            lambda: service.caught_up(gen + 1) and service.timelines() == truths[1],
            "the views to be whole again without a manual step",
        )
        whole_after = time.monotonic() - restarted
        s = status_of(settings, JOB)
        assert s["rebuilds"] == rebuilds + 1 and s["last_rebuild"]["generation"] == gen + 1
        assert "mv:gen:timeline is gone" in s["last_rebuild"]["reason"]
        assert "rebuilding" in states
        text = log_path(settings, JOB).read_text()
        assert (
            "Redis lost the serving copy of timeline (the generation pointer mv:gen:timeline is gone" in text
        )
        assert f"rebuilding generation {gen + 1} from the logs" in text

        service.feed_part(4)  # the job goes on, on the new generation
        wait_for(
            lambda: service.caught_up(gen + 1) and service.timelines() == truths[2],
            "the job to continue on the new generation",
        )
        done.set()
        for t in threads:
            t.join()
        stretches.extend(time.monotonic() - since for since in empty_since.values())
        assert not empty_since, f"still empty at the end: {sorted(empty_since)[:5]}"
        longest = max(stretches, default=0.0)
        with capsys.disabled():
            print(
                f"\nredis loss: longest empty answer for a non-empty timeline {longest:.1f}s "
                f"({len(stretches)} empty stretches; views whole again {whole_after:.0f}s after the restart "
                f"at the latest; {len(errors)} reads failed while Redis was down)"
            )
        assert s["rebuilds"] == status_of(settings, JOB)["rebuilds"]  # no second rebuild
    finally:
        done.set()
        for t in threads:
            if t.is_alive():
                t.join()


def test_status_errors_are_one_line_and_not_stale_and_state_says_waiting(service):
    settings = service.settings
    gen = service.up()["generation"]
    ts = T0 + 7 * 3_600_000
    service.feed("follows", [{"op": "follow", "follower_id": "s1", "followee_id": "sa", "ts": ts}])
    service.feed("tweets", [{"op": "post", "tweet_id": "st1", "user_id": "sa", "text": "a", "ts": ts + 1}])
    wait_for(lambda: service.caught_up(gen) and "st1" in service.timelines().get("s1", []), "the tweet")

    # A stray key of the wrong type where the next batch writes: the sink fails, the query fails and restarts.
    client, key = service.client(), timeline_key(gen, "s1")
    kept = client.zrange(key, 0, -1, withscores=True)
    client.set(key, "not a sorted set")
    service.feed("tweets", [{"op": "post", "tweet_id": "st2", "user_id": "sa", "text": "b", "ts": ts + 2}])
    wait_for(lambda: status_of(settings, JOB).get("last_error"), "the failed query in the status")

    def both() -> tuple[list[str], dict]:
        plain, js = mview_here(settings, "status"), mview_here(settings, "status", "--json")
        assert plain.returncode == 0 and js.returncode == 0, plain.stderr + js.stderr
        assert SECRET not in plain.stdout + js.stdout
        rows = json.loads(js.stdout.splitlines()[-1])
        lines = plain.stdout.splitlines()
        assert len(lines) == len(rows), plain.stdout  # one line per job
        return [line for line in lines if line.startswith(f"{JOB}: ")], rows[JOB]

    [line], row = both()
    error = row["last_error"]
    assert error.startswith(f"[STREAM_FAILED] Query {JOB}_g{gen} terminated with exception: "), error
    assert "WRONGTYPE" in error and "Traceback" not in error and "\n" not in error, error
    assert f"last_error={error}," in line and row["restarts"] >= 1

    client.delete(key)  # the operator removes the stray key (and puts the timeline back)
    client.zadd(key, dict(kept))
    wait_for(lambda: service.caught_up(gen) and service.timelines() == service.expected(), "recovery")
    [line], row = both()
    assert row["last_error"] is None and "last_error=None" in line, line
    assert row["previous_error"]["error"] == error and row["state"] == "running"

    # Redis away: the job waits for it, and its state says so.
    service.own.stop()
    wait_for(lambda: status_of(settings, JOB)["state"] == "waiting", "state: waiting")
    [line], row = both()
    assert row["state"] == "waiting" and "state=waiting" in line
    assert row["redis"].startswith("waiting for Redis at redis://:***@"), row
    service.own.start()
    wait_for(lambda: service.caught_up(gen, redis_ok=True), "the job to run again")
    [line], row = both()
    assert row["state"] == "running" and row["redis"] == "ok" and row["last_error"] is None


def test_a_driver_asked_for_its_stacks_writes_them_to_its_log_and_runs_on(service):
    pid = service.up()["pid"]
    log = log_path(service.settings, JOB)
    before = log.stat().st_size
    dump_stacks(pid)
    text = log.read_bytes()[before:].decode(errors="replace")
    # Python's: every thread, the main one's outermost frames cut when it is deep in a batch (100 frames at most),
    # the guard's and the Redis watcher's in the service module whole
    assert "most recent call first" in text and 'jobs/ops/service.py", line' in text, text[-2000:]
    assert "Full thread dump" in text and "stream execution thread" in text, text[-2000:]  # the JVM's
    assert pid_of(service.settings, JOB) == pid and service.status()["running"]
    assert "[a JVM thread dump]" in log_tail(log, lines=100_000)


def test_a_deploy_with_another_definition_rebuilds_the_running_job(service, capsys):
    gen = service.up()["generation"]
    pid = service.status()["pid"]
    s = service.settings
    wider = make_settings(
        service.root / "lake",
        service.own.url(0),
        TIMELINE_CAP=CAP + 10,
        TRIGGER_INTERVAL="200 ms",
        STOP_TIMEOUT="2 minutes",
        METRICS_PORT=s.metrics_port,
        SPARK_UI="true",
    )
    why = f"definition changed: view timeline: cap {CAP} -> {CAP + 10}"
    capsys.readouterr()
    assert deploy(wider, JOB) == 0
    out = capsys.readouterr().out
    assert f"{JOB}: {why}: restarting it" in out, out
    wait_for(lambda: service.caught_up(gen + 1), "the job to rebuild into the next generation")
    status = service.status()
    assert status["pid"] not in (None, pid) and status["last_rebuild"]["reason"] == why, status
    assert status["last_batch_ms"] >= status["last_rebuild"]["at_ms"], status  # the new generation's batches
    want = expected_timelines(service.tweets, service.follows, CAP + 10)
    assert service.timelines() == want  # the cap is read from Redis
    assert deploy(wider, JOB) == 0 and "already running" in capsys.readouterr().out


def test_credentials_that_stop_working_fail_the_job(service):
    settings = service.settings
    service.up()
    # The password changes under the running job: it stops retrying, says why, and exits.
    service.own.stop()
    service.own.password = "n3w-pw"
    service.own.start()
    wait_for(lambda: not status_of(settings, JOB)["running"], "the job to give up", timeout_s=120)
    s = status_of(settings, JOB)
    assert s["state"] == "failed" and "refused the credentials" in s["error"], s
    r = mview(settings, "deploy", JOB)  # still the old password
    one_line_error(r, "refused the credentials")
    log = log_path(settings, JOB).read_text()
    assert "not retrying" in log
    assert SECRET not in log and SECRET not in r.stdout + r.stderr
    assert stat.S_IMODE(log_path(settings, JOB).stat().st_mode) == 0o600


def _points(web) -> int:
    return web.execute_script(
        "const l = document.querySelector('#job-timeline polyline'); return l ? Number(l.dataset.n) : 0"
    )


def _rate_max(web) -> float:
    """The largest input rate the timeline job's chart shows (from its title: `...: last (max M)`)."""
    title = web.execute_script(
        "return Array.from(document.querySelectorAll('#job-timeline .chart .title'))"
        ".map(e => e.textContent).find(t => t.startsWith('input rate')) || ''"
    )
    return float(title.split("(max ")[1].rstrip(")")) if "(max " in title else 0.0
