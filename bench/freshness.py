"""The freshness part of `python -m bench`: with the timeline job deployed (continuous) under a steady load of
tweets, the time from a tweet's append (its Delta commit) to its presence in every current follower's timeline
in Redis."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import ingest_records, say

__all__ = ["bench_freshness", "measure_freshness", "deploy_jobs", "ingest_tweets"]


def _followers(follows: list[dict]) -> dict[str, list[str]]:
    """Followee -> its current followers, after every follow and unfollow of `follows`."""
    from timeline_demo.reference import current_tables

    _, pairs = current_tables([], follows)
    out: dict[str, list[str]] = {}
    for a, b in pairs:
        out.setdefault(b, []).append(a)
    return out


def deploy_jobs(settings, jobs: tuple[str, ...] = ("timeline",)):
    """Deploy `jobs` (`mview deploy JOB` each); returns the function that stops them all."""
    from jobs.ops.deploy import deploy, stop

    started: list[str] = []

    def stop_all() -> None:
        for job in reversed(started):
            stop(settings, job)

    for job in jobs:
        if deploy(settings, job):
            stop_all()
            raise RuntimeError(f"mview deploy {job} failed")
        started.append(job)
    return stop_all


def ingest_tweets(spark, settings, records: list[dict], path: Path) -> None:
    """The Delta path's append of a batch of tweets: `mview ingest tweets` of a file holding them."""
    ingest_records(spark, settings, "tweets", records, path)


class _Visibility:
    """Appended tweets waiting to be in every follower's timeline, and the seconds each took once it was.
    `poll` runs in a thread until `finish` and then until nothing is pending or the drain time is over."""

    def __init__(self, client) -> None:
        self.client = client
        self.pending: dict[str, tuple[float, list[str]]] = {}
        self.latencies: list[float] = []
        self.by_tweet: dict[str, float] = {}  # tweet id -> its seconds, once visible
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.drain_until = float("inf")
        self.poll_s = 0.05

    def add(self, tweet_ids: list[tuple[str, list[str]]], t_append: float) -> None:
        with self.lock:
            for tid, fl in tweet_ids:
                self.pending[tid] = (t_append, fl)

    def poll(self) -> None:
        from timeline_demo.timeline_view import timeline_key
        from views.redis_io import current_generation

        while not self.done.is_set() or self.pending:
            gen = current_generation(self.client, "timeline")
            with self.lock:
                items = list(self.pending.items())
            for tid, (t_append, fl) in items:
                pipe = self.client.pipeline(transaction=False)
                for f in fl:
                    pipe.zscore(timeline_key(gen, f), tid)
                if all(s is not None for s in pipe.execute()):
                    with self.lock:
                        self.pending.pop(tid, None)
                        self.latencies.append(time.monotonic() - t_append)
                        self.by_tweet[tid] = self.latencies[-1]
            if self.done.is_set() and time.monotonic() > self.drain_until:
                break
            time.sleep(self.poll_s)

    def finish(self, drain_s: float | None = None) -> None:
        if drain_s is not None:
            self.drain_until = time.monotonic() + drain_s
        self.done.set()


def _wait_for_probe(append, client, tmp: Path, author: str, follower: str, probe_id: str) -> float:
    """Append a probe tweet by `author` with `append` and wait until the deployed jobs have put it in
    `follower`'s timeline; the seconds it took."""
    from timeline_demo.timeline_view import timeline_key
    from views.redis_io import current_generation

    t0 = time.monotonic()
    probe = {
        "op": "post",
        "tweet_id": probe_id,
        "user_id": author,
        "text": "probe",
        "ts": int(time.time() * 1000),
    }
    append([probe], tmp / f"{probe_id}.jsonl")
    while client.zscore(timeline_key(current_generation(client, "timeline"), follower), probe_id) is None:
        if time.monotonic() - t0 > 300:
            raise TimeoutError("the deployed job did not publish a probe tweet within 300 s (see its log)")
        time.sleep(0.2)
    return time.monotonic() - t0


def _until_phase(trigger_s: float, phase_s: float, not_before: float) -> None:
    """Sleep until the next wall-clock time k * trigger_s + phase_s at or after `not_before` (time.time())."""
    k = -(-(not_before - phase_s) // trigger_s)
    time.sleep(max(0.0, k * trigger_s + phase_s - time.time()))


def _until_visible(seen: _Visibility, tweet_ids: list[str], timeout_s: float) -> None:
    """Wait until none of `tweet_ids` is pending in `seen` (being polled), at most `timeout_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with seen.lock:
            if not any(t in seen.pending for t in tweet_ids):
                return
        time.sleep(0.01)


def _load(
    append,
    tmp: Path,
    seen: _Visibility,
    followers,
    duration_s: float,
    every_s: float,
    prefix: str,
    align: tuple[float, float] | None = None,
    appends: int | None = None,
    before_append: Callable[[int], None] | None = None,
) -> int:
    """Append 10 tweets with `append` every `every_s` for `duration_s` (1 by a celebrity, the rest by random
    authors with followers), each tracked by `seen` from the moment `append` returned; the number appended.
    `align` (trigger_s, phase_s): each append starts once the previous one is visible (or 60 s passed), at the
    wall-clock time k * trigger_s + phase_s next after `every_s` from the previous start (`seen` must be
    polled). `appends`: stop after that many appends too. `before_append(k)` is called just before append k
    (0, 1, ...), after the wait for its start; append k holds tweets `<prefix>fresh<10k .. 10k+9>`."""
    authors = sorted(followers, key=lambda a: (-len(followers[a]), a))
    rng = random.Random(5)
    n, started, last = 0, time.monotonic(), time.time() - every_s
    while time.monotonic() - started < duration_s and (appends is None or n < 10 * appends):
        if align:
            _until_visible(seen, [f"{prefix}fresh{i:06d}" for i in range(max(0, n - 10), n)], 60.0)
            _until_phase(*align, last + every_s)
            last = time.time()
        if before_append is not None:
            before_append(n // 10)
        tick = time.monotonic()
        recs = []
        for _ in range(10):
            a = authors[rng.randrange(3)] if not recs else rng.choice(authors)
            recs.append(
                {
                    "op": "post",
                    "tweet_id": f"{prefix}fresh{n:06d}",
                    "user_id": a,
                    "text": f"fresh {n}",
                    "ts": int(time.time() * 1000),
                }
            )
            n += 1
        append(recs, tmp / f"{prefix}fresh.jsonl")
        seen.add([(r["tweet_id"], followers[r["user_id"]]) for r in recs], time.monotonic())
        if not align:
            time.sleep(max(0.0, every_s - (time.monotonic() - tick)))
    return n


def bench_freshness(
    spark,
    settings,
    tmp: Path,
    follows: list[dict],
    duration_s: float,
    every_s: float,
    prefix: str = "",
    *,
    latencies: bool = False,
) -> dict:
    """Tweets appended (`mview ingest`) every `every_s` by authors with followers; per tweet, append -> in every
    follower's timeline, with the timeline job deployed (see `measure_freshness`)."""
    stop_jobs = deploy_jobs(settings, ("timeline",))
    try:
        append = lambda recs, path: ingest_tweets(spark, settings, recs, path)  # noqa: E731
        return measure_freshness(
            settings, tmp, follows, duration_s, every_s, prefix, append=append, latencies=latencies
        )
    finally:
        stop_jobs()


def measure_freshness(
    settings,
    tmp: Path,
    follows: list[dict],
    duration_s: float,
    every_s: float,
    prefix: str = "",
    *,
    append,
    command: str = "mview deploy timeline",
    how: str = "appended",
    latencies: bool = False,
    warmup_s: float = 0.0,
    align_phase_s: float | None = None,
    appends: int | None = None,
    before_append: Callable[[int], None] | None = None,
) -> dict:
    """Tweets appended by `append(records, path)` (e.g. `ingest_tweets`, or a produce to Kafka) every `every_s` by
    authors with followers; per tweet, the seconds from `append`'s return to its presence in every follower's
    timeline, with the jobs already deployed. The load starts once a probe tweet appended the same way is
    visible (the jobs have caught up). `prefix` starts every tweet id, so that a second run over the same logs
    appends new tweets. `latencies`: the result also holds every tweet's seconds (`latencies`), for pooling
    runs. `warmup_s`: the same load runs that long first, unmeasured (tweet ids `<prefix>w...`), so that jobs
    deployed just before are measured in their steady state. `align_phase_s`: each append starts
    `align_phase_s` after a multiple of the jobs' trigger interval (wall clock, where Spark's processing-time
    trigger fires) once the previous append is visible, so that the jobs are idle when it lands and its wait
    for the next trigger hardly varies (the warm-up load is not aligned). `appends`, `before_append`: as `_load`'s;
    with `latencies`, `per_append` holds each append's tweets' seconds, in the order of the appends (a tweet not
    visible is left out)."""
    from views.redis_io import connect

    followers = _followers(follows)
    top = min(followers, key=lambda a: (-len(followers[a]), a))
    seen = _Visibility(connect(settings.redis_url))
    align = None if align_phase_s is None else (settings.trigger_interval_ms / 1000, align_phase_s)
    if align:
        seen.poll_s = 0.01  # finer than the default: each append's tweets share one poll's delay
    try:
        took = _wait_for_probe(append, seen.client, tmp, top, followers[top][0], f"{prefix}probe")
        say(f"freshness: jobs deployed, probe visible after {took:.0f}s; load for {duration_s:.0f}s")
        if warmup_s > 0:
            _load(append, tmp, _Visibility(seen.client), followers, warmup_s, every_s, f"{prefix}w")
        poller = threading.Thread(target=seen.poll, daemon=True)
        poller.start()
        n = _load(append, tmp, seen, followers, duration_s, every_s, prefix, align, appends, before_append)
        seen.finish(drain_s=60)
        poller.join(70)
    finally:
        seen.finish()
    lat = sorted(seen.latencies)
    out = {
        "workload": f"{n} tweets {how} in batches of 10 every {every_s:.0f}s for {duration_s:.0f}s, on the "
        f"throughput graph (max {len(followers[top]):,} followers)",
        "command": command,
        **_latency_figures(lat, n, warmup_s),
    }
    if latencies:
        out["latencies"] = lat
        out["per_append"] = _per_append(seen.by_tweet, prefix, n)
    return out


def _latency_figures(lat: list[float], n: int, warmup_s: float) -> dict:
    """Of `n` tweets appended, how many became visible, and the p50, p99, max and mean of their sorted seconds
    `lat` (None when none did)."""

    def pct(p: float):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None

    return {
        "tweets": n,
        "visible": len(lat),
        "not_visible_after_60s": n - len(lat),
        "warmup_s": warmup_s,
        "p50_s": pct(0.50),
        "p99_s": pct(0.99),
        "max_s": round(lat[-1], 3) if lat else None,
        "mean_s": round(statistics.fmean(lat), 3) if lat else None,
    }


def _per_append(by_tweet: dict[str, float], prefix: str, n: int) -> list[list[float]]:
    """Per append of 10 tweets, in order, the seconds of those that became visible."""
    ids = [f"{prefix}fresh{i:06d}" for i in range(n)]
    return [[by_tweet[t] for t in ids[k : k + 10] if t in by_tweet] for k in range(0, n, 10)]
