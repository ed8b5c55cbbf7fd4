"""Helpers of the example pipelines' end-to-end tests (`test_shop_e2e`, `test_nexmark_e2e`): the installed `mview`
run in a subprocess with a scenario's settings, the same commands in this process (on the tests' Spark session),
the lines a topic must reject (by `timeline_demo.brute.validate`, never by the code under test), the dead letters
they must become, the records a topic's log holds (what a source job captured), readers that query a view in a loop
while a job rebuilds, and the comparison of what the service shows with the brute force's answer: exact, but for
doubles, which the service and the brute force sum in different orders (a relative tolerance of 1e-9)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from changelog.deadletters import read_dead_letters
from changelog.ingest import ingest
from jobs.core.registry import job_spec
from jobs.core.settings import Settings
from jobs.ops.deploy import settings_env
from spec.model import Pipeline, Topic
from tests.conftest import make_settings
from timeline_demo.brute import BruteResult, Rejected, batches_of, validate
from timeline_demo.feed import Feed, write_lines
from views.read import export_view, query_view
from views.redis_io import connect

__all__ = [
    "MVIEW",
    "scenario_settings",
    "cli",
    "last_json",
    "random_batches",
    "write_batch",
    "rejections",
    "check_dead_letters",
    "check_kafka_dead_letters",
    "log_records",
    "Readers",
    "same",
    "assert_same",
    "cli_exports",
    "exports_here",
    "run_here",
    "query_sample",
]

MVIEW = str(Path(sys.executable).with_name("mview"))
_FIELD = re.compile(r"field '([^']+)'")


def only(pipeline: Pipeline, jobs) -> Pipeline:
    """The pipeline with only `jobs`, their views and the topics they read (with those the topics read from): what
    the brute force computes when a test runs only some of a file's jobs."""
    keep = {j: pipeline.jobs[j] for j in jobs}
    topics = {t for job in keep.values() for t in job.topics}
    topics |= {pipeline.topics[t].source for t in topics if pipeline.topics[t].source}
    return replace(pipeline, jobs=keep, topics={n: t for n, t in pipeline.topics.items() if n in topics})


def scenario_settings(lake_dir: Path, redis_url: str, pipeline_file: Path | str, **over) -> Settings:
    """A scenario's settings: its own lake, the test's Redis, the pipeline file as `MVIEW_PIPELINE`, no metrics
    port (several jobs run at once in the suite)."""
    return make_settings(lake_dir, redis_url, METRICS_PORT="off", MVIEW_PIPELINE=str(pipeline_file), **over)


def cli(settings: Settings, *args: str, ok: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    """The installed `mview ARGS` with `settings` in its environment; with `ok`, it must exit 0. Never a
    traceback."""
    env = {**os.environ, **settings_env(settings), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [MVIEW, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert not ok or done.returncode == 0, (
        f"mview {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def last_json(done: subprocess.CompletedProcess) -> Any:
    """The JSON of a command's last line of output (`--json`)."""
    return json.loads(done.stdout.strip().splitlines()[-1])


def random_batches(feed: Feed, n: int, rng: random.Random) -> list[dict[str, list]]:
    """The feed's arrivals cut into `n` batches at random points of its body, the tail (late and clock records) in
    the last batch, so the late records are late (they arrive after the records whose watermark they are behind)."""
    body = len(feed.arrivals) - feed.tail
    return batches_of(feed.arrivals, sorted(rng.sample(range(1, body), n - 1)))


def write_batch(directory: Path, i: int, batch: dict[str, list]) -> dict[str, str]:
    """Batch `i`'s records (and bad lines) as one JSON-lines file per topic that has any: {topic: path}."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for topic, records in batch.items():
        if records:
            path = directory / f"{topic}-{i:04d}.jsonl"
            write_lines(path, records)
            out[topic] = str(path)
    return out


def rejections(topic: Topic, path: str) -> list[tuple[int, str, str]]:
    """The lines of the file that `topic` must reject, by the brute force's definition of a valid record: (line
    number from 1, the line's text, the brute force's reason)."""
    out = []
    for n, line in enumerate(Path(path).read_bytes().split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            validate(topic, line)
        except Rejected as e:
            out.append((n, line.decode("utf-8", "surrogateescape"), str(e)))
    return out


def check_dead_letters(settings: Settings, pipeline: Pipeline, files: dict[str, list[str]]) -> int:
    """Every topic's dead-letter log holds exactly one entry per line the brute force rejects in `files` ({topic:
    [path, ...]}, ingested in that order), with its file, line number and text, and a reason naming the same field
    where the brute force's names one. Returns the number of dead letters."""
    total = 0
    for name, paths in files.items():
        want = [(p, n, text, why) for p in paths for n, text, why in rejections(pipeline.topics[name], p)]
        got = list(read_dead_letters(settings.lake, settings.topic(name)))
        assert [(d["file"], d["line"], d["raw"]) for d in got] == [w[:3] for w in want], name
        for d, (_, _, _, why) in zip(got, want, strict=True):
            named = _FIELD.search(why)
            if named:
                assert _FIELD.search(d["reason"]) and _FIELD.search(d["reason"])[1] == named[1], (d, why)
        total += len(got)
    return total


def check_kafka_dead_letters(settings: Settings, pipeline: Pipeline, files: dict[str, list[str]]) -> int:
    """Every topic's dead-letter log holds exactly one entry per line of `files` ({topic: [path, ...]}, produced to
    Kafka by `mview produce`) the brute force rejects, with its text and the Kafka topic, partition and offset it
    came from (each once). Returns the number of dead letters."""
    total = 0
    for name, paths in files.items():
        want = Counter(text for p in paths for _, text, _ in rejections(pipeline.topics[name], p))
        got = list(read_dead_letters(settings.lake, settings.topic(name)))
        assert Counter(d["raw"] for d in got) == want, name
        assert len({(d["topic"], d["partition"], d["offset"]) for d in got}) == len(got), name
        assert all(d["topic"] == f"{settings.kafka_topic_prefix}{name}" for d in got), name
        total += len(got)
    return total


def log_records(lake_dir: Path, topic: Topic, first_commit: int = 0) -> list[dict]:
    """The records of `topic`'s log (read with delta-rs, no Spark) in commit order, from its `first_commit`-th
    commit on (0: all), each with its non-null fields."""
    from tests.pghelp import log_commits

    return [r for commit in log_commits(lake_dir, topic)[first_commit:] for r in commit]


class Readers:
    """Readers of `keys` of a list, row or count view in a loop, started with `start()` and ended by `stop()`: one
    thread through `views.read.query_view` (the pipeline loaded from its file at each read, as a new `mview query`
    would), one through the installed `mview query VIEW KEY --json`. `reads` holds (reader, key, the monotonic time
    the read started, the answer or the failure as text); a failure is any exception, an exit status other than 0
    or output that is not JSON."""

    def __init__(self, settings: Settings, view: str, keys: list[str]):
        self.settings, self.view, self.keys = settings, view, keys
        self.reads: list[tuple[str, str, float, Any]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._here, self._cli)]

    def _here(self) -> None:
        client = connect(self.settings.redis_url)
        while not self._stop.is_set():
            for key in self.keys:
                started = time.monotonic()
                try:
                    got = query_view(client, self.view, key, pipeline=self.settings.pipeline())
                except Exception as e:  # noqa: BLE001 - a failed read is what the test looks for
                    got = f"failed: {e!r}"
                self.reads.append(("here", key, started, got))
            time.sleep(0.02)

    def _cli(self) -> None:
        while not self._stop.is_set():
            for key in self.keys:
                started = time.monotonic()
                try:
                    got = last_json(cli(self.settings, "query", self.view, key, "--json", timeout=60))
                except (AssertionError, ValueError, IndexError, subprocess.SubprocessError) as e:
                    got = f"failed: {e!r}"
                self.reads.append(("cli", key, started, got))

    def start(self) -> Readers:
        for t in self._threads:
            t.start()
        return self

    def started_after(self, t: float) -> set[str]:
        """The readers that have finished a read started after monotonic time `t`."""
        return {who for who, _, started, _ in list(self.reads) if started > t}

    def wait_after(self, t: float, timeout_s: float = 120.0) -> None:
        """Wait until each reader has finished a read started after monotonic time `t`."""
        deadline = time.monotonic() + timeout_s
        while self.started_after(t) != {"here", "cli"}:
            assert time.monotonic() < deadline, f"no read of each reader after {t} in {timeout_s} s"
            time.sleep(0.05)

    def stop(self) -> list[tuple[str, str, float, Any]]:
        self._stop.set()
        for t in self._threads:
            t.join(120)
        return self.reads


def same(got: Any, want: Any, where: str = "") -> list[str]:
    """Where `got` differs from `want`: exactly equal JSON values of the same types, but that two doubles only need
    to agree to a relative 1e-9 (sums accumulated in different orders)."""
    if isinstance(want, float) and isinstance(got, float):
        return (
            [] if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9) else [f"{where}: {got!r} != {want!r}"]
        )
    if type(got) is not type(want):
        return [f"{where}: {got!r} ({type(got).__name__}) != {want!r} ({type(want).__name__})"]
    if isinstance(want, dict):
        if list(got) != list(want):
            return [f"{where}: keys {list(got)} != {list(want)}"]
        return [d for k in want for d in same(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items != {len(want)}: {got[:3]!r}... vs {want[:3]!r}..."]
        return [
            d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in same(g, w, f"{where}[{i}]")
        ]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def assert_same(got: Any, want: Any, what: str) -> None:
    diffs = same(got, want, what)
    assert not diffs, "\n".join(diffs[:10])


def cli_exports(settings: Settings, views) -> dict[str, list[dict]]:
    """`mview export VIEW` of each view through the installed command: {view: lines}."""
    out = {}
    for view in views:
        done = cli(settings, "export", view)
        out[view] = [json.loads(x) for x in done.stdout.splitlines() if x.strip()]
    return out


def exports_here(spark, settings: Settings, pipeline: Pipeline) -> dict[str, list[dict]]:
    """Every view's export lines read in this process (`views.read.export_view`, as `mview export` reads them)."""
    client = connect(settings.redis_url)
    return {
        v: list(export_view(client, v, lake=settings.lake, spark=lambda: spark, pipeline=pipeline))
        for v in pipeline.views
    }


def run_here(spark, settings: Settings, pipeline: Pipeline, batches, directory: Path, jobs=None) -> dict:
    """Each batch ingested (one file per topic) and then every job (or `jobs`) run once, in this process on the
    tests' Spark session (`job_spec(settings, job).run(spark, settings, once=True)`, what `mview run JOB --once`
    does). Returns {job: [each run's totals]}."""
    jobs = list(jobs or pipeline.jobs)
    totals: dict[str, list[dict]] = {j: [] for j in jobs}
    for i, batch in enumerate(batches):
        for topic, path in write_batch(directory, i, batch).items():
            ingest(None, settings.lake, pipeline.topics[topic], [path], quiet=True)
        for job in jobs:
            totals[job].append(job_spec(settings, job).run(spark, settings, once=True))
    return totals


def query_sample(settings: Settings, want: BruteResult, *, through_cli: bool, generation: int = 1) -> int:
    """`mview query VIEW KEY --json` of the first, a middle and the last key of every view with keys, and of a
    key no view has, equal to the brute force's query; through the installed command for one key per view when
    `through_cli`, the others through `views.read.query_view`. Returns the number of queries."""
    client, n = connect(settings.redis_url), 0
    for view, v in want.pipeline.views.items():
        if v.kind == "log":
            continue
        keys = want.keys(view)
        sample = list(dict.fromkeys([*keys[:1], *keys[len(keys) // 2 : len(keys) // 2 + 1], *keys[-1:]]))
        sample.append("no such key \u00e9")
        for i, key in enumerate(sample):
            expected = want.query(view, key, generation=generation)
            if through_cli and i == 0:
                got = last_json(cli(settings, "query", view, key, "--json"))
            else:
                got = query_view(client, view, key, pipeline=want.pipeline)
            assert_same(got, expected, f"query {view} {key!r}")
            n += 1
    return n
