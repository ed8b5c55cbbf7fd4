"""Live mode of the web page (`make demo-web`): the timeline job runs continuously in this process while a
trickle of new tweets (by the demo workload's celebrities, so many timelines move) and follows is ingested
every few seconds. If the tweets log is empty, the demo workload is ingested first. Through Kafka
(`make demo-web KAFKA=1`, `kafka=True`): the trickle is produced to KAFKA_BOOTSTRAP instead, and the `kafka` job
runs beside `timeline` in this process, copying it into the logs."""

from __future__ import annotations

import random
import threading
import time

__all__ = ["run_live"]


def run_live(
    settings, *, every: float = 3.0, size: str = "demo", seed: int = 7, on_ready=None, kafka: bool = False
) -> None:
    """Run until KeyboardInterrupt. `on_ready(user)` is called with a user worth watching (follows u0)."""
    from changelog.ingest import ingest
    from changelog.kafka import produce
    from jobs.core import runtime
    from jobs.core.spark import get_spark
    from timeline_demo.reference import current_tables
    from timeline_demo.workload import sized, write_jsonl

    spark = get_spark(settings, "mview-demo-web")
    wl = sized(size, seed=seed)
    _ingest_workload_if_empty(spark, settings, wl, f"{size}-{seed}", size)
    _, pairs = current_tables([], wl.follows)
    fans = sorted({a for a, b in pairs if b == "u0"})
    if on_ready and fans:
        on_ready(fans[0])
    errors = _start_jobs(spark, settings, kafka)
    path = settings.lake_dir / "demo" / "live.jsonl"

    def feed(topic: str, records: list) -> None:
        if kafka:
            produce(
                settings.kafka_bootstrap,
                settings.kafka_topic_prefix,
                settings.topic(topic),
                [write_jsonl(records, path)],
            )
        else:
            ingest(spark, settings.lake, settings.topic(topic), [write_jsonl(records, path)])

    try:
        _trickle(feed, size, every, errors, "produced" if kafka else "ingested")
    finally:
        runtime.STOP.set()  # the kafka job's restart loop ends with its query
        for q in spark.streams.active:
            q.stop()
    if errors:
        raise errors[0]


def _ingest_workload_if_empty(spark, settings, wl, name: str, size: str) -> None:
    """Create the tweets and follows logs if missing and, when the tweets log is empty, ingest the workload
    `wl` (written under demo/`name` of the lake) first."""
    from changelog.ingest import ingest
    from changelog.topics import ensure_topic, latest_version, read_batch
    from timeline_demo.workload import write_chunks

    tweets, follows = settings.topic("tweets"), settings.topic("follows")
    for topic in (tweets, follows):
        ensure_topic(spark, settings.lake, topic)
    if latest_version(settings.lake, tweets) <= 0 or read_batch(spark, settings.lake, tweets).isEmpty():
        print(f"empty lake: ingesting the {size!r} workload first", flush=True)
        for tw, fo in write_chunks(wl, settings.lake_dir / "demo" / name):
            ingest(spark, settings.lake, tweets, [tw])
            ingest(spark, settings.lake, follows, [fo])


def _start_jobs(spark, settings, kafka: bool) -> list:
    """Start the timeline job (and with `kafka`, the kafka job) continuously in daemon threads; the list their
    errors go to."""
    from jobs.kinds.kafka import run_kafka
    from timeline_demo.timeline_view import run_timeline

    errors: list = []

    def job(run):
        try:
            run(spark, settings, once=False)
        except Exception as e:
            errors.append(e)

    threading.Thread(target=job, args=(run_timeline,), name="timeline-job", daemon=True).start()
    if kafka:
        threading.Thread(target=job, args=(run_kafka,), name="kafka-job", daemon=True).start()
    return errors


def _trickle(feed, size: str, every: float, errors: list, verb: str) -> None:
    """Until a job fails: every `every` seconds, 3 new tweets by the workload's celebrities, and with
    probability 0.3 a follow of one of them, each `feed(topic, records)`, and a line saying so."""
    from timeline_demo.workload import SIZES

    rng = random.Random()
    celebs = [f"u{i}" for i in range(SIZES[size]["celebrities"])]
    users = [f"u{i}" for i in range(SIZES[size]["users"])]
    n = 0
    while not errors:
        now = int(time.time() * 1000)
        tweets = []
        for _ in range(3):
            author = rng.choice(celebs)
            tid = f"live{now}-{n}"
            tweets.append(
                {
                    "op": "post",
                    "tweet_id": tid,
                    "user_id": author,
                    "text": f"live tweet {n} by {author}",
                    "ts": now,
                }
            )
            n += 1
        feed("tweets", tweets)
        if rng.random() < 0.3:
            f = {
                "op": "follow",
                "follower_id": rng.choice(users),
                "followee_id": rng.choice(celebs),
                "ts": now,
            }
            feed("follows", [f])
        print(f"{verb} {len(tweets)} tweets by {', '.join(t['user_id'] for t in tweets)}", flush=True)
        time.sleep(every)
