"""The generators' shared feed (`timeline_demo.feed`): arrival order with bounded disorder, duplicates, bad lines
that every topic rejects, the late-and-clock tail in the last batch, and files a brute force reads back."""

from __future__ import annotations

import random
import textwrap

import pytest

from timeline_demo.brute import Rejected, batches_from_dir, parse_time, validate
from timeline_demo.feed import arrange, bad_line, ts_value
from views.pipeline import parse_pipeline

P = parse_pipeline(
    textwrap.dedent(
        """
        topics:
          ev:
            fields: {eid: id, n: long, x: double, ok: boolean, s: string, ts: timestamp}
            optional: [s]
            id: eid
            time: ts
          tab:
            fields: {k: id, v: string, ts: timestamp}
            key: k
            time: ts
            op: {upsert: put, remove: drop}
        """
    ),
    "t.yml",
)


def timed(n: int):
    out = []
    for i in range(n):
        out.append((1000 + i, "ev", {"eid": f"e{i}", "n": i, "x": 0.5, "ok": True, "ts": 1000 + i}))
        if i % 4 == 0:
            op = {"op": "drop"} if i % 8 == 0 else {"op": "put", "v": "x"}
            out.append((1000 + i, "tab", {**op, "k": f"k{i}", "ts": 1000 + i}))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_every_bad_line_is_rejected_by_its_topic(seed):
    rng = random.Random(seed)
    for _ in range(200):
        topic, rec = rng.choice([("ev", timed(1)[0][2]), ("tab", timed(1)[1][2])])
        with pytest.raises(Rejected):
            validate(P.topics[topic], bad_line(rng, P.topics[topic], rec))


def test_arrival_order_faults_and_tail():
    rng = random.Random(1)
    late = [("ev", {"eid": "late", "n": 0, "x": 0.0, "ok": False, "ts": 1})]
    clock = [("tab", {"op": "put", "k": "clock", "v": "-", "ts": 10**7})]
    feed = arrange(
        timed(400), topics=P.topics, rng=rng, delay_prob=0.5, delay_ms=30, duplicates=0.1, bad=0.05,
        late=late, clock=clock,
    )  # fmt: skip
    assert feed.counts == {"records": 500, "duplicates": 50, "bad": 25, "late": 1, "clock": 1}
    assert feed.arrivals[-2:] == late + clock and feed.tail == 2
    body = feed.arrivals[: -feed.tail]
    assert len(body) == 500 + 50 + 25
    assert sum(isinstance(r, str) for _, r in body) == 25
    newest = 0
    for _, r in body:
        if isinstance(r, dict):
            assert r["ts"] >= newest - 30  # out of order by at most the delay
            newest = max(newest, r["ts"])
    ids = [r["eid"] for t, r in body if t == "ev" and isinstance(r, dict)]
    assert len(ids) - len(set(ids)) > 0  # duplicates, the same JSON
    batches = feed.batches(3)
    assert batches[-1]["ev"][-1] == late[0][1] and batches[-1]["tab"][-1] == clock[0][1]
    assert sum(len(b[t]) for b in batches for t in b) == len(feed.arrivals)
    assert [r for b in batches for r in b["ev"]] == feed.records("ev")


@pytest.mark.parametrize("chunks", [1, 4])
def test_files_read_back_as_the_same_batches(tmp_path, chunks):
    feed = arrange(timed(50), topics=P.topics, rng=random.Random(2), delay_prob=0.2, delay_ms=5, bad=0.1)
    files = feed.write(tmp_path, chunks=chunks)
    assert all(len(f) == chunks for f in files.values())
    back = batches_from_dir(P, tmp_path)
    want = feed.batches(chunks)
    assert len(back) == chunks
    for got, batch in zip(back, want, strict=True):
        for topic in P.topics:
            lines = got.get(topic, [])
            assert len(lines) == len(batch[topic])
            for line, rec in zip(lines, batch[topic], strict=True):
                if isinstance(rec, dict):
                    assert validate(P.topics[topic], line) == validate(P.topics[topic], rec)
                else:
                    assert line.decode() == rec


def test_ts_values_read_back_as_the_same_instant():
    rng = random.Random(3)
    forms = {type(ts_value(1_767_225_600_123, rng, 0.5)) for _ in range(50)}
    assert forms == {int, str}
    for _ in range(100):
        ms = rng.randrange(0, 4_000_000_000_000)
        assert parse_time(ts_value(ms, rng, 1.0)) == ms
