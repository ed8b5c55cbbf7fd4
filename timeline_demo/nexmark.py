"""Seeded Nexmark generator for `timeline_demo/pipelines/nexmark.yml`: persons, auctions and bids in Nexmark's
event model, written as the pipeline's topics.

`python -m timeline_demo.nexmark --events N --seed S --out DIR [--chunks K] [--rate R] [--duplicates F] [--bad F]
[--late N] [--moves F] [--lateness D] [--side-rows N] [--no-close]` writes one JSON-lines file per topic (see
`timeline_demo.feed` for the files, the arrival order and the faults) and prints a summary as JSON. Without
faults and chunks it writes the same files in constant memory (`write_nexmark`), for millions of events.

The events follow Nexmark's generator (Beam's and Flink's `NexmarkGenerator`, default configuration):
- event n (from 0) is a person when n % 50 == 0, an auction when n % 50 in 1..3, else a bid: the proportions
  1:3:46; its time is the base time + n / rate (`rate` events per second, Nexmark's default 10,000);
- person ids and auction ids count from 1000 in creation order; a person is named from Nexmark's first and last
  names, lives in one of its cities and states (AZ, CA, ID, OR, WA, WY), with an email and a credit card;
- an auction's seller is a *hot seller* with probability 3/4 (the first person of the newest block of 100
  persons), else one of the 1,000 newest persons (or up to 10 ids ahead: a seller not registered yet); its
  category is 10..14, its initial bid and reserve Nexmark's prices (10^(6u) x 100 cents), it expires within about
  twice the time until 100 more auctions exist;
- a bid is on a *hot auction* with probability 1/2 (the first auction of the newest block of 100 auctions), else
  on one of the 100 newest auctions (or up to 10 ahead: an auction not created yet); its bidder is a *hot bidder*
  with probability 3/4 (the second person of the newest block of 100), else one of the 1,000 newest persons; its
  price is a Nexmark price; its channel is one of the four hot channels (Google, Facebook, Baidu, Apple) with
  probability 1/2, else one of 10,000 channels `channel-<n>`, and its url the channel's (three directories, and for
  9 in 10 of the `channel-<n>` a `channel_id` parameter: q21 and q22 read them); `extra` is present on about half of the events (an optional field).
Additions for the pipeline (see the file's comments): a bid carries `bid_id` (its event number); `side_input` holds
q13's side table (key k -> value "k" for k < `side_rows`, one day before the first event) and a heartbeat (key -1)
every second of event time; with `moves`, that fraction of persons later moves: a second `persons` record of the
same id, in another city and state, 3 to 33 s of event time later (a change of `person_table`, which reads the
persons as a table; as an event a redelivery, after the first record's arrival whatever its delay). Times arrive out of order: with probability 0.1 an event is
delayed by up to 3 s (Nexmark's occasional delay), far within ALLOWED_LATENESS.

Faults for the end-to-end tests: `duplicates` and `bad` (fractions of the events), `late` (that many fresh
persons, auctions and bids, in turn, with times `lateness` and more behind the first event, in the tail), and the
clock records (`close`, on by default): an auction `~clock` (seller `~clock`, category 0) and a side input change of key -1, at the greatest time + `lateness` + 11 s: every q8 window
closes and every bid is emitted by q13 and q20.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import random
import sys
from pathlib import Path

import orjson

from spec.durations import parse_duration_ms
from timeline_demo.feed import Feed, arrange, delay, ts_value
from views.pipeline import load_pipeline

__all__ = [
    "PIPELINE",
    "T0",
    "PROPORTIONS",
    "FIRST_PERSON_ID",
    "FIRST_AUCTION_ID",
    "FIRST_CATEGORY_ID",
    "kind_of",
    "generate_nexmark",
    "write_nexmark",
    "main",
]

PIPELINE = Path(__file__).with_name("pipelines") / "nexmark.yml"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, the time of event 0
PROPORTIONS = (1, 3, 46)  # person : auction : bid
_DENOMINATOR = sum(PROPORTIONS)
FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID = 1000, 1000, 10
_NUM_CATEGORIES = 5
_HOT_BLOCK = 100  # HOT_SELLER_RATIO, HOT_AUCTION_RATIO, HOT_BIDDER_RATIO: a hot one per block of 100
_HOT_AUCTION_RATIO, _HOT_SELLERS_RATIO, _HOT_BIDDERS_RATIO = 2, 4, 4  # 1 in n is *not* hot
_ACTIVE_PEOPLE, _IN_FLIGHT_AUCTIONS, _LEAD = 1000, 100, 10
_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
_CITIES = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
)
_CITIES += ("Cheyenne",)
_FIRST = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
_LAST = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")  # the hot channels; the others are "channel-<n>"
_HOT_CHANNELS_RATIO, _NUM_CHANNELS = 2, 10_000
_CLOCK = "~clock"
_HEARTBEAT_MS = 1000
_DELAY_PROB, _DELAY_MS = 0.1, 3000  # Nexmark's probDelayedEvent and occasionalDelaySec


def kind_of(n: int) -> str:
    """What event n is: `person`, `auction` or `bid` (1:3:46 in every 50 events)."""
    offset = n % _DENOMINATOR
    return "person" if offset < PROPORTIONS[0] else "auction" if offset < sum(PROPORTIONS[:2]) else "bid"


def _last_person(n: int) -> int:
    """The newest person id (base 0) at event n (n's own if n is a person)."""
    epoch, offset = divmod(n, _DENOMINATOR)
    return epoch * PROPORTIONS[0] + min(offset, PROPORTIONS[0] - 1)


def _last_auction(n: int) -> int:
    """The newest auction id (base 0) at event n (n's own if n is an auction)."""
    epoch, offset = divmod(n, _DENOMINATOR)
    if offset < PROPORTIONS[0]:
        epoch, offset = epoch - 1, PROPORTIONS[1] - 1
    elif offset >= PROPORTIONS[0] + PROPORTIONS[1]:
        offset = PROPORTIONS[1] - 1
    else:
        offset -= PROPORTIONS[0]
    return epoch * PROPORTIONS[1] + offset


def _next_person(n: int, rng: random.Random) -> int:
    people = _last_person(n) + 1
    active = min(people, _ACTIVE_PEOPLE)
    return people - active + rng.randrange(active + _LEAD)


def _next_auction(n: int, rng: random.Random) -> int:
    newest = _last_auction(n)
    low = max(newest - _IN_FLIGHT_AUCTIONS, 0)
    return low + rng.randrange(newest - low + 1 + _LEAD)


def _price(rng: random.Random) -> int:
    return round(10.0 ** (rng.random() * 6.0) * 100.0)


def _text(rng: random.Random, length: int) -> str:
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=length)).strip() or "x"


def _with_extra(rec: dict, rng: random.Random) -> dict:
    r = rng.random()
    if r < 0.5:
        rec["extra"] = _text(rng, rng.randrange(5, 30))
    elif r < 0.6:
        rec["extra"] = None
    return rec


def _person(n: int, t, rng: random.Random, pid: str) -> dict:
    rec = {
        "id": pid,
        "name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
        "emailAddress": f"{_text(rng, 7)}@{_text(rng, 5)}.com".replace(" ", ""),
        "creditCard": " ".join(f"{rng.randrange(10000):04d}" for _ in range(4)),
        "city": rng.choice(_CITIES),
        "state": rng.choice(_STATES),
        "dateTime": t,
    }
    return _with_extra(rec, rng)


def _auction(n: int, ms: int, t, rng: random.Random, aid: str, rate: int, iso: float) -> dict:
    if rng.randrange(_HOT_SELLERS_RATIO) > 0:
        seller = (_last_person(n) // _HOT_BLOCK) * _HOT_BLOCK
    else:
        seller = _next_person(n, rng)
    initial = _price(rng)
    horizon = _IN_FLIGHT_AUCTIONS * _DENOMINATOR // PROPORTIONS[1] * 1000 // rate
    rec = {
        "id": aid,
        "itemName": _text(rng, 20),
        "description": _text(rng, 60),
        "initialBid": initial,
        "reserve": initial + _price(rng),
        "dateTime": t,
        "expires": ts_value(ms + 1 + rng.randrange(max(2 * horizon, 1)), rng, iso),
        "seller": str(seller + FIRST_PERSON_ID),
        "category": FIRST_CATEGORY_ID + rng.randrange(_NUM_CATEGORIES),
    }
    return _with_extra(rec, rng)


@functools.cache
def _channel_url(channel: str) -> tuple[str, str]:
    """A channel's url, fixed per channel as in Nexmark's generator: three random directories, and for 9 in 10 of
    the "channel-<n>" channels a `&channel_id=` parameter (n's bits reversed, as a positive 32-bit number)."""
    rng = random.Random(f"url-{channel}")
    dirs = "/".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz_", k=5)) for _ in range(3))
    url = f"https://www.nexmark.com/{dirs}/item.htm?query=1"
    if channel.startswith("channel-") and rng.randrange(10) > 0:
        bits = int(f"{int(channel.removeprefix('channel-')):032b}"[::-1], 2)
        url += f"&channel_id={abs(bits - (1 << 32) if bits >= 1 << 31 else bits)}"
    return channel, url


def _bid(n: int, t, rng: random.Random, bid_id: str) -> dict:
    if rng.randrange(_HOT_AUCTION_RATIO) > 0:
        auction = (_last_auction(n) // _HOT_BLOCK) * _HOT_BLOCK
    else:
        auction = _next_auction(n, rng)
    if rng.randrange(_HOT_BIDDERS_RATIO) > 0:
        bidder = (_last_person(n) // _HOT_BLOCK) * _HOT_BLOCK + 1
    else:
        bidder = _next_person(n, rng)
    if rng.randrange(_HOT_CHANNELS_RATIO) > 0:
        channel, url = _channel_url(_CHANNELS[rng.randrange(len(_CHANNELS))])
    else:
        channel, url = _channel_url(f"channel-{rng.randrange(_NUM_CHANNELS)}")
    rec = {
        "bid_id": bid_id,
        "auction": str(auction + FIRST_AUCTION_ID),
        "bidder": str(bidder + FIRST_PERSON_ID),
        "price": _price(rng),
        "channel": channel,
        "url": url,
        "dateTime": t,
    }
    return _with_extra(rec, rng)


def _timed(rng: random.Random, events: int, rate: int, iso: float, moves: float, side_rows: int):
    """The records in the order they are made: (event time, topic, record, bound), where `bound` is a time no
    later record has a smaller one than (the side rows' time, then the newest event's)."""
    day = T0 - 86_400_000
    for k in range(side_rows):
        yield day, "side_input", {"key": k, "value": str(k), "ts": ts_value(day, rng, iso)}, day
    beat = T0
    for n in range(events):
        ms = T0 + n * 1000 // rate
        while beat <= ms:
            yield beat, "side_input", {"key": -1, "value": "heartbeat", "ts": beat}, beat
            beat += _HEARTBEAT_MS
        t = ts_value(ms, rng, iso)
        kind = kind_of(n)
        if kind == "person":
            rec = _person(n, t, rng, str(_last_person(n) + FIRST_PERSON_ID))
            yield ms, "persons", rec, ms
            if rng.random() < moves:  # after the first record's arrival, whatever its delay
                at = ms + _DELAY_MS + 1 + rng.randrange(30_000)
                moved = {**rec, "city": rng.choice(_CITIES), "state": rng.choice(_STATES)}
                yield at, "persons", {**moved, "dateTime": ts_value(at, rng, iso)}, ms
        elif kind == "auction":
            rec = _auction(n, ms, t, rng, str(_last_auction(n) + FIRST_AUCTION_ID), rate, iso)
            yield ms, "auctions", rec, ms
        else:
            yield ms, "bids", _bid(n, t, rng, str(n)), ms


def _clock(newest: int, lateness_ms: int) -> list[tuple[str, dict]]:
    end = newest + lateness_ms + 11_000
    rec = {
        "id": _CLOCK,
        "itemName": "clock",
        "description": "moves every watermark past every event",
        "initialBid": 0,
        "reserve": 0,
        "dateTime": end,
        "expires": end,
        "seller": _CLOCK,
        "category": 0,
    }
    return [
        ("auctions", rec),
        ("side_input", {"key": -1, "value": "clock", "ts": end}),
    ]


def generate_nexmark(
    *,
    events: int,
    seed: int,
    rate: int = 10_000,
    iso_ratio: float = 0.3,
    duplicates: float = 0.0,
    bad: float = 0.0,
    late: int = 0,
    moves: float = 0.0,
    lateness_ms: int = 600_000,
    side_rows: int = 10_000,
    close: bool = True,
) -> Feed:
    """`events` Nexmark events (persons, auctions, bids) and the pipeline's other records, as a `Feed` (see the
    module docstring). The same arguments give the same feed."""
    rng = random.Random(seed)
    topics = load_pipeline(PIPELINE).written
    timed = [(t, topic, rec) for t, topic, rec, _ in _timed(rng, events, rate, iso_ratio, moves, side_rows)]
    tail_late: list[tuple[str, dict]] = []
    for i in range(late):
        at = T0 - lateness_ms - 1 - rng.randrange(60_000)
        n = rng.randrange(max(events, 1))
        if i % 3 == 0:
            rec = _person(n, at, rng, f"L{i}")
            tail_late.append(("persons", rec))
        elif i % 3 == 1:
            rec = _auction(n, at, at, rng, f"L{i}", rate, 0.0)
            tail_late.append(("auctions", rec))
        else:
            tail_late.append(("bids", _bid(n, at, rng, f"L{i}")))
    clock = _clock(max(t for t, _, _ in timed), lateness_ms) if close and timed else []
    feed = arrange(
        timed,
        topics=topics,
        rng=rng,
        delay_prob=_DELAY_PROB,
        delay_ms=_DELAY_MS,
        duplicates=duplicates,
        bad=bad,
        late=tail_late,
        clock=clock,
        delays=random.Random(f"arrival-{seed}"),
    )
    feed.counts.update(events=events, span_ms=(events - 1) * 1000 // rate if events else 0)
    return feed


def write_nexmark(
    directory: str | Path,
    *,
    events: int,
    seed: int,
    rate: int = 10_000,
    iso_ratio: float = 0.3,
    moves: float = 0.0,
    lateness_ms: int = 600_000,
    side_rows: int = 10_000,
    close: bool = True,
) -> dict:
    """Write what `generate_nexmark(...).write(directory)` writes for the same arguments (no faults, one file per
    topic), byte for byte, in constant memory: the records are made in event order and leave a heap once no later
    record can arrive before them. For millions of events (the benchmarks). Returns the files and counts."""
    rng, delays = random.Random(seed), random.Random(f"arrival-{seed}")
    names = tuple(load_pipeline(PIPELINE).written)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files = {t: d / f"{t}.jsonl" for t in names}
    out = {t: open(files[t], "wb") for t in names}  # closed below
    heap: list = []
    made, newest = 0, None
    try:
        for seq, (t, topic, rec, bound) in enumerate(_timed(rng, events, rate, iso_ratio, moves, side_rows)):
            heapq.heappush(heap, (t + delay(delays, _DELAY_PROB, _DELAY_MS), seq, topic, rec))
            newest = t if newest is None else max(newest, t)
            made += 1
            while heap and heap[0][0] < bound:
                _, _, top, r = heapq.heappop(heap)
                out[top].write(orjson.dumps(r) + b"\n")
        while heap:
            _, _, top, r = heapq.heappop(heap)
            out[top].write(orjson.dumps(r) + b"\n")
        clock = _clock(newest, lateness_ms) if close and newest is not None else []
        for top, r in clock:
            out[top].write(orjson.dumps(r) + b"\n")
    finally:
        for fh in out.values():
            fh.close()
    counts = {"records": made, "duplicates": 0, "bad": 0, "late": 0, "clock": len(clock), "events": events}
    counts["span_ms"] = (events - 1) * 1000 // rate if events else 0
    return {"files": {t: [str(p)] for t, p in files.items()}, "counts": counts}


def main(argv: list[str] | None = None) -> int:
    """`python -m timeline_demo.nexmark --events N --seed S --out DIR ...`: write the topics' files (see the module
    docstring) and print {"files": {topic: [file, ...]}, "counts": {...}} as JSON."""
    p = argparse.ArgumentParser(prog="python -m timeline_demo.nexmark", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, required=True, help="Nexmark events (persons, auctions, bids)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", required=True, help="directory of the JSON-lines files")
    p.add_argument("--chunks", type=int, default=1, help="batches: <topic>-<i>.jsonl files (default 1)")
    p.add_argument("--rate", type=int, default=10_000, help="events per second of event time")
    p.add_argument("--duplicates", type=float, default=0.0, help="fraction of records delivered twice")
    p.add_argument("--bad", type=float, default=0.0, help="fraction of bad lines added")
    p.add_argument("--late", type=int, default=0, help="late events added in the last chunk")
    p.add_argument(
        "--moves", type=float, default=0.0, help="fraction of persons who move (a later persons record)"
    )
    p.add_argument("--lateness", default="10 minutes", help="ALLOWED_LATENESS the files are made for")
    p.add_argument("--side-rows", type=int, default=10_000, help="rows of q13's side input")
    p.add_argument("--no-close", action="store_true", help="no clock records at the end")
    p.add_argument("--iso", type=float, default=0.3, help="fraction of times written as ISO-8601 text")
    a = p.parse_args(argv)
    if a.chunks < 1 or a.events < 0:
        p.error("--chunks must be >= 1 and --events >= 0")
    if a.chunks == 1 and not (a.duplicates or a.bad or a.late):  # the same files, in constant memory
        kw = {
            "rate": a.rate,
            "iso_ratio": a.iso,
            "moves": a.moves,
            "side_rows": a.side_rows,
            "close": not a.no_close,
        }
        kw["lateness_ms"] = parse_duration_ms(a.lateness)
        print(json.dumps(write_nexmark(a.out, events=a.events, seed=a.seed, **kw)))
        return 0
    feed = generate_nexmark(
        events=a.events,
        seed=a.seed,
        rate=a.rate,
        iso_ratio=a.iso,
        duplicates=a.duplicates,
        bad=a.bad,
        late=a.late,
        moves=a.moves,
        lateness_ms=parse_duration_ms(a.lateness),
        side_rows=a.side_rows,
        close=not a.no_close,
    )
    files = feed.write(a.out, chunks=a.chunks)
    print(json.dumps({"files": files, "counts": feed.counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
