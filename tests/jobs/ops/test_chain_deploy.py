"""A chain deployed: the upstream job `arcade` (a windowed count view and an agg view, each read as a table) and
the downstream job `busiest` (an aggregate of the windowed one), each a driver of its own, fed pieces of one
random play. Every view equals the brute force once both caught up:
1. `mview run busiest --once` beside nothing deployed runs `arcade` first (one line each), then both are deployed
   and follow new input;
2. kill -9 of the downstream driver in the middle of a batch, then of the upstream's: each redeployed resumes
   from its checkpoint, nothing lost or doubled;
3. a replay of the upstream while a reader reads the downstream view continuously: every read succeeds and is
   whole; the upstream switches to generation 2, the deployed downstream job notices and rebuilds into its
   generation 2 from the new log, and serves the same lines;
4. the upstream view's definition changed and the upstream deployed again while the reader reads: the upstream is
   rebuilt into generation 3 and so is the downstream, every read whole, the lines those of the new definition;
`mview status` shows the downstream's upstream job and its lag (0 once caught up)."""

from __future__ import annotations

import os
import random
import signal
import threading
from pathlib import Path

import pytest

from jobs.core.runtime import checkpoint_key
from jobs.ops.deploy import deploy, stop
from jobs.ops.replay import replay
from tests.conftest import make_settings
from tests.jobs.core.test_chain import LATENESS_MS, PIPELINE, _plays
from tests.jobs.opshelp import batch_in_flight, mview_here, status_of, wait_for, write_jsonl
from tests.windowhelp import pipeline_file
from timeline_demo.brute import brute_force
from views.pipeline import load_pipeline
from views.read import export_view, query_view
from views.redis_io import connect

pytestmark = pytest.mark.slow  # two deployed drivers, each a JVM of its own

UP, DOWN = "arcade", "busiest"


@pytest.fixture
def pipeline(tmp_path_factory):
    return pipeline_file(tmp_path_factory, "chain", PIPELINE)


def test_a_deployed_chain_follows_kills_and_a_replay_of_its_upstream(spark, tmp_path, redis_url, pipeline):
    from changelog.ingest import ingest

    settings = make_settings(
        tmp_path / "lake",
        redis_url,
        ALLOWED_LATENESS=f"{LATENESS_MS} ms",
        METRICS_PORT="off",
        TRIGGER_INTERVAL="200 ms",
        MVIEW_PIPELINE=pipeline.file,
    )
    plays = [r for _, r in _plays(random.Random(9), 240)]
    pieces = [plays[i::4] for i in range(4)]  # each spans the whole time range: windows change in every piece
    fed: list[list[dict]] = []
    client = connect(redis_url)

    def feed(i: int) -> None:
        path = write_jsonl(tmp_path / f"plays-{i}.jsonl", pieces[i])
        ingest(None, settings.lake, settings.topic("plays"), [path])
        fed.append(pieces[i])

    def caught_up(job: str) -> bool:
        s = status_of(settings, job)
        return s["running"] and s["lag_versions"] == 0 and s.get("state") == "running"

    def both_caught_up() -> bool:
        return caught_up(UP) and caught_up(DOWN) and status_of(settings, DOWN)["upstream"] == {UP: 0}

    def check(declared=pipeline) -> None:
        want = brute_force(declared, [{"plays": p} for p in fed], lateness_ms=LATENESS_MS)
        for view in ("per_game", "per_player", "minutes"):
            assert list(export_view(client, view, pipeline=declared)) == want.export(view), view

    feed(0)
    once = mview_here(settings, "run", DOWN, "--once")
    assert once.returncode == 0, once.stderr
    assert [line.split(":")[0] for line in once.stdout.splitlines()] == [UP, DOWN]
    check()
    assert deploy(settings, UP) == 0 and deploy(settings, DOWN) == 0
    try:
        feed(1)
        wait_for(both_caught_up, "both jobs to follow the new input")
        check()

        for job, i in ((DOWN, 2), (UP, 3)):  # kill -9 mid-batch, downstream first
            pid = status_of(settings, job)["pid"]
            feed(i)
            gen = status_of(settings, job)["generation"]
            wait_for(
                lambda j=job, g=gen: batch_in_flight(settings.lake, checkpoint_key(j, g)),
                "a batch",
                every_s=0.02,
            )
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda j=job: not status_of(settings, j)["running"], f"the killed {job} to be gone")
            assert deploy(settings, job) == 0
            wait_for(both_caught_up, f"{job} redeployed to catch up")
            check()

        reads, problems, done = [], [], threading.Event()
        keys = [line["minute"] for line in export_view(client, "minutes", pipeline=pipeline)]

        def reader() -> None:
            c = connect(redis_url)
            while not done.is_set():
                for k in keys:
                    try:
                        r = query_view(c, "minutes", k, pipeline=pipeline)
                    except Exception as e:  # noqa: BLE001 - a failed read is what we look for
                        problems.append(f"{k}: {e!r}")
                        continue
                    if not r or r.get("most") is None:
                        problems.append(f"{k}: {r}")
                    reads.append(r.get("generation"))
                done.wait(0.02)

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert replay(spark, settings, UP) == 0
            wait_for(lambda: status_of(settings, DOWN)["generation"] == 2, "the downstream job to rebuild")
            wait_for(both_caught_up, "both jobs on their new generations")
        finally:
            done.set()
            thread.join()
        assert [status_of(settings, j)["generation"] for j in (UP, DOWN)] == [2, 2]
        check()
        assert not problems, problems[:5]
        assert reads and set(reads) == {1, 2} and reads == sorted(reads)

        # The upstream view's definition changes while the reader reads: deployed again, both are rebuilt.
        Path(pipeline.file).write_text(
            PIPELINE.replace('points: "coalesce(score, 0)"', 'points: "coalesce(score, 1)"')
        )
        changed = load_pipeline(pipeline.file, {})
        reads.clear()
        done.clear()
        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert deploy(settings, UP) == 0
            wait_for(lambda: status_of(settings, DOWN)["generation"] == 3, "the downstream job to rebuild")
            wait_for(both_caught_up, "both jobs on the changed definition")
        finally:
            done.set()
            thread.join()
        assert not problems, problems[:5]
        assert reads and set(reads) == {2, 3} and reads == sorted(reads)
        check(changed)
    finally:
        for job in (DOWN, UP):
            stop(settings, job)
