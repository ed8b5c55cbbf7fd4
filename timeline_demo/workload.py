"""Seeded workload generator for the timeline: users with a power-law follower graph and a few celebrities,
posts, deletes, follows, unfollows, re-follows, duplicates, out-of-order arrival, both `ts` forms.

`generate(...)` returns the records of both topics as JSON-ready dicts, in *arrival* order (already shuffled
within `disorder_ms` of event time). Sizes go from a handful to millions of events.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import accumulate

__all__ = ["Workload", "generate", "to_iso", "SIZES", "sized", "write_jsonl", "write_chunks"]

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def to_iso(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Workload:
    tweets: list[dict]
    follows: list[dict]

    @property
    def events(self) -> int:
        return len(self.tweets) + len(self.follows)


def generate(
    *,
    seed: int,
    users: int = 300,
    celebrities: int = 3,
    follows: int = 3000,
    tweets: int = 3000,
    delete_ratio: float = 0.08,
    unfollow_ratio: float = 0.15,
    duplicate_ratio: float = 0.03,
    disorder_ms: int = 120_000,
    span_ms: int = 6 * 3_600_000,
    iso_ratio: float = 0.5,
    popular_author_ratio: float = 0.5,
) -> Workload:
    """A random workload. Event times spread over `span_ms`; arrival order is event order with up to
    `disorder_ms` of jitter, so records arrive out of order within and across topics. A tweet's author is drawn
    by popularity (celebrities first) with probability `popular_author_ratio`, else uniformly; the share of
    celebrity tweets drives the fan-out (timeline entries per tweet)."""
    rng = random.Random(seed)
    uids = [f"u{i}" for i in range(users)]
    celebs = uids[:celebrities]
    # Power-law popularity: followee chosen with weight 1/(rank+1)^1.1, celebrities far ahead.
    weights = [(50.0 if u in celebs else 1.0) / (i + 1) ** 1.1 for i, u in enumerate(uids)]
    cum = list(accumulate(weights))  # same draws as `choices(uids, weights)`, without O(users) per call

    def ts_value(ms: int):
        return to_iso(ms) if rng.random() < iso_ratio else ms

    def at() -> int:
        return T0 + rng.randrange(span_ms)

    def popular() -> str:
        return rng.choices(uids, cum_weights=cum)[0]

    tw = _tweet_events(rng, uids, popular, at, ts_value, tweets, popular_author_ratio, delete_ratio)
    fo = _follow_events(rng, uids, popular, at, ts_value, follows, unfollow_ratio, span_ms)
    for recs in (tw, fo):
        for _ in range(int(len(recs) * duplicate_ratio)):
            recs.append(rng.choice(recs))

    def arrival(recs):
        keyed = [(t + rng.randrange(disorder_ms + 1), i, r) for i, (t, r) in enumerate(recs)]
        keyed.sort(key=lambda x: (x[0], x[1]))
        return [r for _, _, r in keyed]

    return Workload(tweets=arrival(tw), follows=arrival(fo))


def _tweet_events(
    rng, uids, popular, at, ts_value, tweets: int, popular_author_ratio: float, delete_ratio: float
) -> list[tuple[int, dict]]:
    """`tweets` posts as (event time, record), each by a `popular()` author with probability
    `popular_author_ratio`, else any user; a post is deleted with probability `delete_ratio`, its delete's time
    within an hour after it or up to a minute before it (order must not matter)."""
    tw: list[tuple[int, dict]] = []
    for i in range(tweets):
        author = popular() if rng.random() < popular_author_ratio else rng.choice(uids)
        t = at()
        tid = f"t{i:07d}"
        tw.append(
            (
                t,
                {
                    "op": "post",
                    "tweet_id": tid,
                    "user_id": author,
                    "text": f"tweet {i} by {author}",
                    "ts": ts_value(t),
                },
            )
        )
        if rng.random() < delete_ratio:
            td = t + rng.randrange(-60_000, 3_600_000)
            tw.append((td, {"op": "delete", "tweet_id": tid, "user_id": author, "ts": ts_value(td)}))
    return tw


def _follow_events(
    rng, uids, popular, at, ts_value, follows: int, unfollow_ratio: float, span_ms: int
) -> list[tuple[int, dict]]:
    """Up to `follows` follows as (event time, record), of any user to a `popular()` one (none of oneself); a
    follow is undone with probability `unfollow_ratio` within a quarter of the span, and 40% of those are
    followed again within another quarter."""
    fo: list[tuple[int, dict]] = []
    for _ in range(follows):
        a = rng.choice(uids)
        b = popular()
        if a == b:
            continue
        t = at()
        fo.append((t, {"op": "follow", "follower_id": a, "followee_id": b, "ts": ts_value(t)}))
        if rng.random() < unfollow_ratio:
            tu = t + rng.randrange(1, span_ms // 4)
            fo.append((tu, {"op": "unfollow", "follower_id": a, "followee_id": b, "ts": ts_value(tu)}))
            if rng.random() < 0.4:
                tr = tu + rng.randrange(1, span_ms // 4)
                fo.append((tr, {"op": "follow", "follower_id": a, "followee_id": b, "ts": ts_value(tr)}))
    return fo


# Named sizes, from a handful of events to millions (events ~= tweets * 1.1 + follows * 1.2).
SIZES: dict[str, dict] = {
    "tiny": {"users": 50, "celebrities": 2, "follows": 300, "tweets": 300},
    "small": {"users": 300, "celebrities": 3, "follows": 3_000, "tweets": 3_000},
    "demo": {"users": 1_000, "celebrities": 4, "follows": 5_000, "tweets": 5_000},
    "medium": {"users": 20_000, "celebrities": 10, "follows": 150_000, "tweets": 100_000},
    "large": {"users": 200_000, "celebrities": 20, "follows": 1_500_000, "tweets": 1_000_000},
    "xlarge": {"users": 1_000_000, "celebrities": 50, "follows": 5_000_000, "tweets": 5_000_000},
}


def sized(size: str, *, seed: int, **over) -> Workload:
    """`generate` with the parameters of a named size (see `SIZES`), overridden by `over`."""
    if size not in SIZES:
        raise ValueError(f"unknown workload size {size!r}: choose one of {', '.join(SIZES)}")
    return generate(seed=seed, **{**SIZES[size], **over})


def write_jsonl(records: list[dict], path) -> str:
    """Write `records` as JSON lines to `path`; return the path as a string."""
    import orjson

    with open(path, "wb") as fh:
        for i in range(0, len(records), 50_000):
            fh.write(b"".join(orjson.dumps(r) + b"\n" for r in records[i : i + 50_000]))
    return str(path)


def write_chunks(wl: Workload, directory, *, chunks: int = 1) -> list[tuple[str, str]]:
    """Cut both topics, in arrival order, into `chunks` consecutive parts and write each part as a JSON-lines
    file `<topic>-<i>.jsonl` under `directory`. Returns [(tweets_file, follows_file)] per chunk, in order, so
    ingesting chunk after chunk replays the arrival order. Files are written in slices of 50k lines, so
    millions of events need no second copy in memory."""
    from pathlib import Path

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(chunks):
        files = []
        for topic, recs in (("tweets", wl.tweets), ("follows", wl.follows)):
            a, b = len(recs) * i // chunks, len(recs) * (i + 1) // chunks
            files.append(write_jsonl(recs[a:b], d / f"{topic}-{i:04d}.jsonl"))
        out.append((files[0], files[1]))
    return out
