"""jobs.core.runtime helpers that need no Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from jobs.core.runtime import (
    clear_error,
    error_line,
    process_cpu,
    read_status,
    record_error,
    status_file,
    write_status,
)
from jobs.core.settings import Settings

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


def test_a_status_update_the_store_does_not_take_is_lost_and_said_once(tmp_path, capsys):
    """A lake that does not answer (a NameNode down) loses status updates, each without raising (a job waits for
    its store; its report must not fail it), said once in the log; the first update that lands says so."""
    from changelog.storage import LakeUnreachable

    settings = Settings.from_env({"LAKE_DIR": str(tmp_path)})
    write_status(settings, "timeline", a=1)
    lake = settings.lake

    def down(*_args, **_kw):
        raise LakeUnreachable(lake.uri(), "jobs/timeline/status.json", "the store does not answer")

    lake.write_bytes = down
    write_status(settings, "timeline", b=2)
    clear_error(settings, "timeline")
    write_status(settings, "timeline", c=3)
    del lake.write_bytes
    write_status(settings, "timeline", d=4)
    assert read_status(settings, "timeline") == {"a": 1, "d": 4}
    err = capsys.readouterr().err
    assert err.count("cannot update jobs/timeline/status.json") == 1 and "status.json updated again" in err


# What a query whose micro-batch raised in an executor says (Spark 4, abridged: frames, nested traceback, plan).
_STREAM_FAILED = """[STREAM_FAILED] Query [id = 9e74, runId = 8131] terminated with exception: \
[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch sink. \
Reason: An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/venv/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/venv/pyspark/errors/exceptions/captured.py", line 257, in deco
    raise converted from None
pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/venv/pyspark/worker.py", line 3622, in main
    process()
views.errors.RedisCommandFailed: timeline sink: a command failed in Redis at redis://:pw-1@h:6379/0: WRONGTYPE x
 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: timeline_g3 [id = 9e74, runId = 8131]
Current State: ACTIVE
"""


def test_an_error_in_the_status_is_one_line_without_trace_or_password(tmp_path):
    """A Spark query failure keeps its error class and the exception its batch raised, on one line, the query named,
    no frame, no plan, no password; Java frames and chained tracebacks are dropped the same way."""
    line = error_line(_STREAM_FAILED)
    assert line == (
        "[STREAM_FAILED] Query timeline_g3 terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error "
        "occurred in the user provided function in foreach batch sink. Reason: views.errors.RedisCommandFailed: "
        "timeline sink: a command failed in Redis at redis://:***@h:6379/0: WRONGTYPE x"
    )
    java = "org.apache.kafka.common.errors.TimeoutException: Timeout of 15000ms expired\n\tat org.a.B.c(B.java:1)"
    assert error_line(java) == "org.apache.kafka.common.errors.TimeoutException: Timeout of 15000ms expired"
    chained = (
        "Traceback (most recent call last):\n  f()\nKeyError: 1\n\nDuring handling of the above exception, "
    )
    chained += "another exception occurred:\n\nTraceback (most recent call last):\n  g()\nValueError: 2\n"
    assert error_line(chained) == "ValueError: 2"
    assert (
        error_line("host=h password='a b' port=5", "postgresql://u:Secret@[::1:5433/x")
        == "host=h password=*** port=5"
    )
    assert error_line("auth Secret refused", "postgresql://u:Secret@[::1:5433/x") == "auth *** refused"
    assert len(error_line("x" * 5000)) <= 600

    # In the status: written as one line; a recovery makes it history.
    settings = Settings.from_env({"LAKE_DIR": str(tmp_path), "REDIS_URL": "redis://:pw-1@h:6379/0"})
    record_error(settings, "timeline", _STREAM_FAILED, state="restarting")
    assert read_status(settings, "timeline")["last_error"] == line
    clear_error(settings, "timeline")
    s = read_status(settings, "timeline")
    assert s["last_error"] is None and s["previous_error"]["error"] == line
    write_status(settings, "timeline", error="first pw-1\nsecond")
    assert read_status(settings, "timeline")["error"] == "first ***"


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
    from jobs.core.runtime import run_stream
    from jobs.core.skeleton import JobRun
    from jobs.kinds.join import _source
    from joins.table import TableJoin
    from tests.conftest import make_settings, write_jsonl

    settings = make_settings(tmp_path / "lake", "redis://127.0.0.1:1/0")
    join = TableJoin(
        spark, *settings.pipeline().sides("timeline"), settings.pipeline().jobs["timeline"].spec.match
    )
    TOPICS = ("tweets", "follows")
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
            ingest(
                spark, settings.lake, settings.topic(t), [write_jsonl(tmp_path / f"{t}{i}.jsonl", [record])]
            )
        run_stream(
            _source(spark, settings, join),
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
    from jobs.core.runtime import _cancel_until_quiet

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
