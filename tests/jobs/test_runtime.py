"""jobs.runtime helpers that need no Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from jobs.runtime import process_cpu, read_status, status_file, write_status
from jobs.settings import Settings

_BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"


def test_process_cpu_counts_a_live_child_as_descendant_cpu():
    child = subprocess.Popen([sys.executable, "-c", _BUSY])
    try:
        deadline = time.monotonic() + 20
        while process_cpu(child.pid)[0] < 0.25 and time.monotonic() < deadline:
            time.sleep(0.1)
        spent = process_cpu(child.pid)[0]  # the busy loop is over: the child sleeps, its CPU stays put
        assert spent >= 0.25
        own, descendants = process_cpu(os.getpid())
        assert descendants >= spent  # the child's CPU is in its parent's descendants, not in the parent's own
        assert own > 0
    finally:
        child.kill()
        child.wait()


def test_a_write_to_the_service_status_file_is_not_routed_to_a_rebuilds_file(tmp_path):
    """While a rebuild routes the process's status to `replay.json`, what the deployed process reports about itself
    (`file="status.json"`, e.g. Redis answering again) still lands in `status.json`."""
    settings = Settings.from_env({"LAKE_DIR": str(tmp_path)})
    write_status(settings, "timeline", redis="waiting for Redis")
    with status_file("replay.json"):
        write_status(settings, "timeline", file="status.json", redis="ok")
        write_status(settings, "timeline", state="rebuilding")
    assert read_status(settings, "timeline") == {"redis": "ok"}
    assert read_status(settings, "timeline", "replay.json") == {"state": "rebuilding"}


def test_threads_writing_one_status_file_keep_every_field_and_never_fail(tmp_path):
    """A deployed process writes its status from several threads (the batch loop, the Redis watcher, a replay's
    progress): each write merges its fields into what is there, none is lost and none fails."""
    settings = Settings.from_env({"LAKE_DIR": str(tmp_path)})
    errors = []

    def writer(name: str) -> None:
        try:
            for i in range(300):
                write_status(settings, "timeline", **{name: i})
        except Exception as e:  # noqa: BLE001 - any failure of a write is what the test looks for
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert read_status(settings, "timeline") == {f"w{k}": 299 for k in range(4)}


def test_topics_moved_names_exactly_the_topics_with_input_in_each_batch(spark, tmp_path):
    """The offset log tells which topic logs a micro-batch read (`JobRun.topics_moved`), with no Spark job: here
    each batch's topics with records, batch after batch of one checkpoint; unknown (None) for its first batch."""
    from changelog.ingest import ingest
    from jobs.runtime import run_stream
    from jobs.skeleton import JobRun
    from jobs.timeline import TOPICS, _source
    from tests.conftest import make_settings, write_jsonl

    settings = make_settings(tmp_path / "lake", "redis://127.0.0.1:1/0")
    run = JobRun(spark, settings, "timeline", 1, None)
    seen = []

    def process(batch_df, batch_id):
        present = {r[0] for r in batch_df.select("topic").distinct().collect()}
        seen.append((run.topics_moved(batch_id, TOPICS), present))

    tweet = {"op": "post", "tweet_id": "t", "user_id": "a", "text": "x", "ts": 1}
    follow = {"op": "follow", "follower_id": "b", "followee_id": "a", "ts": 1}
    for i, topics in enumerate([TOPICS, ("tweets",), ("follows",), ("follows",), TOPICS, ("tweets",)]):
        for t in topics:
            record = {**(tweet if t == "tweets" else follow), "ts": i + 1}
            ingest(spark, settings.lake_dir, t, [write_jsonl(tmp_path / f"{t}{i}.jsonl", [record])])
        run_stream(
            _source(spark, settings),
            process,
            checkpoint=run.checkpoint,
            once=True,
            settings=settings,
            name="m",
        )
    assert [p for _, p in seen] == [
        set(TOPICS),
        {"tweets"},
        {"follows"},
        {"follows"},
        set(TOPICS),
        {"tweets"},
    ]
    assert seen[0][0] is None
    assert [m for m, _ in seen[1:]] == [{"tweets"}, {"follows"}, {"follows"}, set(TOPICS), {"tweets"}]


def test_a_stop_cancels_a_job_submitted_after_its_first_cancel(spark):
    """A stopping job whose batch waits for Redis cancels Spark jobs until none has been active for a while: a job
    the batch's callback submits after the first cancel (here 0.1 s after it) is cancelled too, not left to run."""
    from jobs.runtime import _cancel_until_quiet

    sc, outcome = spark.sparkContext, {}

    def sleep_job(name: str) -> None:
        try:
            sc.parallelize([0], 1).map(lambda x: time.sleep(10) or x).collect()
            outcome[name] = "finished"
        except Exception:  # noqa: BLE001 - a cancelled job raises here
            outcome[name] = "cancelled"

    def late_callback() -> None:
        while "first" not in outcome:
            time.sleep(0.02)
        time.sleep(0.1)
        sleep_job("second")

    threads = [threading.Thread(target=sleep_job, args=("first",)), threading.Thread(target=late_callback)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    _cancel_until_quiet(quiet_s=1.5, patience_s=20)
    elapsed = time.monotonic() - t0
    for t in threads:
        t.join(timeout=30)
    assert outcome == {"first": "cancelled", "second": "cancelled"}
    assert elapsed < 10 and not sc.statusTracker().getActiveJobsIds()
