"""The end-to-end demo (`make demo`, `python -m timeline_demo`): generate a workload, ingest it chunk by chunk
while the timeline job runs continuously, show progress, print a few home timelines from Redis, and verify
every timeline against the contract's SQL evaluated by Spark over the same logs (`timeline_demo.verify`).

Uses `LAKE_DIR` and `REDIS_URL` like every command. Running it again appends the same seeded records again,
which has no effect (a record delivered twice counts once), so a re-run verifies again; `make clean` (and
flushing Redis) starts from nothing.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

__all__ = ["run_demo", "main"]


def _say(msg: str) -> None:
    print(msg, flush=True)


def _query(spark, name: str):
    for q in spark.streams.active:
        if q.name == name:
            return q
    return None


class _Progress:
    """Status lines every `every` seconds: events ingested/processed, batches, timelines written, lag."""

    def __init__(self, spark, settings, every: float):
        self.spark, self.settings, self.every = spark, settings, every
        self.ingested = 0
        self.query = None  # the streaming query, kept once seen: a stopped query still has its progress
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="demo-progress", daemon=True)

    def snapshot(self) -> dict:
        from jobs.ops.status import job_status
        from views.keys import view_pattern
        from views.redis_io import connect, current_generation

        st = job_status(self.settings).get("timeline", {})
        gen = st.get("generation") or 0
        client = connect(self.settings.redis_url)
        gen = gen or current_generation(client, "timeline")
        timelines = sum(1 for _ in client.scan_iter(match=view_pattern("timeline", gen), count=2000))
        events = batches = 0
        q = self.query = self.query or _query(self.spark, f"timeline_g{gen}")
        if q is not None:
            for p in q.recentProgress:
                n = p.get("numInputRows", 0) if isinstance(p, dict) else p.numInputRows
                events += n
                batches += 1 if n else 0
        return {
            "ingested": self.ingested,
            "processed": events,
            "batches": batches,
            "timelines": timelines,
            "lag_versions": st.get("lag_versions", 0),
            "last_batch_seconds": st.get("last_batch_seconds"),
        }

    def line(self) -> str:
        s = self.snapshot()
        last = f", last batch {s['last_batch_seconds']}s" if s["last_batch_seconds"] is not None else ""
        return (
            f"  events ingested {s['ingested']:,}, processed {s['processed']:,} in {s['batches']} batches, "
            f"timelines in Redis {s['timelines']:,}, lag {s['lag_versions']} log versions{last}"
        )

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                _say(self.line())
            except Exception as e:  # a status read racing a commit: try again next tick
                _say(f"  (progress unavailable: {e})")

    def start(self):
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def _run_job(spark, settings, errors: list) -> None:
    from timeline_demo.timeline_view import run_timeline

    try:
        run_timeline(spark, settings, once=False)
    except Exception as e:
        errors.append(e)


def _wait_caught_up(spark, settings, job_thread, errors: list, timeout: float) -> None:
    """Until the job has processed every log version and no batch is running."""
    from jobs.ops.status import job_status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job_thread.is_alive():
        st = job_status(settings)["timeline"]
        q = _query(spark, f"timeline_g{st.get('generation') or 1}")
        busy = q is not None and q.status.get("isTriggerActive")
        if st["lag_versions"] == 0 and not busy:
            return
        time.sleep(0.5)
    if errors:
        raise RuntimeError(f"the timeline job failed: {errors[0]}") from errors[0]
    raise TimeoutError(f"the timeline job did not catch up within {timeout:.0f}s")


def _show(client, users: list[str], n: int) -> None:
    from timeline_demo.timeline_view import read_timeline

    for u in users:
        res = read_timeline(client, u, n)
        total = len(read_timeline(client, u)["tweets"])
        _say(f"\n@{u}'s home timeline ({total} entries, newest {len(res['tweets'])}):")
        for t in res["tweets"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t["ts"] / 1000)) if t["ts"] else "?"
            _say(f"  {when}  {t['tweet_id']}  @{t['user_id']}: {t['text']}")


def run_demo(spark, settings, *, size: str, seed: int, chunks: int, show: int, every: float = 3.0) -> int:
    """The whole demo in an existing Spark session; returns the exit code (0 only if every timeline matches,
    2 if the timeline job failed)."""
    from changelog.topics import ensure_topic
    from timeline_demo.workload import SIZES, sized, write_chunks
    from views.redis_io import connect, redact_url

    client = connect(settings.redis_url)
    started = time.monotonic()
    wl = sized(size, seed=seed)
    files = write_chunks(wl, settings.lake_dir / "demo" / f"{size}-{seed}", chunks=chunks)
    p = SIZES[size]
    _say(
        f"workload {size!r} (seed {seed}): {p['users']:,} users ({p['celebrities']} celebrities), "
        f"{len(wl.tweets):,} tweet events, {len(wl.follows):,} follow events, in {chunks} chunks"
    )
    _say(
        f"lake {settings.lake_dir}, redis {redact_url(settings.redis_url)}, TIMELINE_CAP {settings.pipeline().views['timeline'].cap}"
    )
    for topic in ("tweets", "follows"):  # before the job starts, so the job and ingest never race to create
        ensure_topic(spark, settings.lake, settings.topic(topic))
    if not _ingest_beside_the_job(spark, settings, files, every):
        return 2
    _say(f"ingested and processed in {time.monotonic() - started:.0f}s")

    # A few users: the one with the most followees, and two more with non-empty timelines.
    followers: dict[str, int] = {}
    for r in wl.follows:
        followers[r["follower_id"]] = followers.get(r["follower_id"], 0) + 1
    users = sorted(followers, key=lambda u: (-followers[u], u))[:show]
    _show(client, users, 5)
    ok = _verify(spark, settings)
    _say(f"demo finished in {time.monotonic() - started:.0f}s")
    return 0 if ok else 1


def _ingest_beside_the_job(spark, settings, files: list, every: float) -> bool:
    """Ingest the chunk files (tweets, follows) while the timeline job runs continuously, with a progress line
    every `every` seconds, until the job has caught up; then stop it. False (said) if the job failed."""
    from changelog.ingest import ingest

    _say("starting the timeline job (continuous) and ingesting...")
    errors: list = []
    job = threading.Thread(target=_run_job, args=(spark, settings, errors), name="timeline-job", daemon=True)
    job.start()
    progress = _Progress(spark, settings, every).start()
    try:
        for tw, fo in files:
            for topic, path in (("tweets", tw), ("follows", fo)):
                r = ingest(spark, settings.lake, settings.topic(topic), [path])
                progress.ingested += r.accepted
            if errors:
                break
        _wait_caught_up(spark, settings, job, errors, timeout=600)
    finally:
        gen_q = [q for q in spark.streams.active if q.name and q.name.startswith("timeline_g")]
        for q in gen_q:
            q.stop()
        job.join(60)
        progress.stop()
    if errors:
        _say(f"the timeline job failed: {errors[0]}")
        return False
    _say(progress.line())
    return True


def _verify(spark, settings) -> bool:
    """Verify every timeline against the SQL definition and say the result and each mismatch."""
    from timeline_demo.verify import verify_timelines

    _say("\nverifying every timeline against the SQL definition (Spark SQL over the Delta logs)...")
    v = verify_timelines(spark, settings)
    _say(v.line())
    for m in v.mismatches:
        _say(f"  mismatch {m['user_id']}: expected {m['expected']} got {m['got']}")
    if not v.ok:
        _say("  (if Redis and LAKE_DIR come from different runs: `make clean`, flush Redis, run again)")
    return v.ok


def main(argv: list[str] | None = None) -> int:
    from jobs.core.settings import Settings
    from jobs.core.spark import get_spark
    from timeline_demo.workload import SIZES
    from views.errors import RedisUnavailable
    from views.redis_io import connect

    p = argparse.ArgumentParser(prog="python -m timeline_demo", description=__doc__.splitlines()[0])
    p.add_argument("--size", default="demo", choices=list(SIZES), help="workload size (default demo)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--chunks", type=int, default=4, help="ingest the workload in this many parts")
    p.add_argument("--show", type=int, default=3, help="print this many users' timelines")
    args = p.parse_args(argv)
    settings = Settings.from_env()
    try:
        connect(settings.redis_url)
    except RedisUnavailable as e:
        _say(f"demo: {e}")
        return 1
    _say("starting Spark...")
    spark = get_spark(settings, "mview-demo")
    return run_demo(spark, settings, size=args.size, seed=args.seed, chunks=args.chunks, show=args.show)


if __name__ == "__main__":
    sys.exit(main())
