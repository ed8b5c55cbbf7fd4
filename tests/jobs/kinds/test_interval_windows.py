"""Windowed `count`, `agg` and `list` views of an `interval` job (tumbling and hopping windows, sessions) end to end, against
the brute force of the contract's definitions (`timeline_demo.brute`): page views joined with purchases of the same
user within two minutes, `unmatched: true`, random records with late and duplicate ones, the job run after every
piece; a left event enters its windows once its own window closed, and a window is final once every left event
before its end has closed."""

from __future__ import annotations

import random

import pytest

from jobs.kinds.interval import run
from tests.windowhelp import pipeline_file, run_in_pieces
from timeline_demo.brute import brute_force
from views.read import export_view, query_view
from views.redis_io import connect

T0 = 1_700_000_040_000
LATENESS_MS = 15_000
PIPELINE = """\
topics:
  visits: {fields: {visit_id: id, user: string, page: string, ts: timestamp}, id: visit_id, time: ts}
  buys:
    fields: {buy_id: id, user: string, amount: double, ts: timestamp}
    optional: [amount]
    id: buy_id
    time: ts
jobs:
  converted:
    interval: {left: visits, right: buys, match: {user: user}, within: [0 s, 2 min], unmatched: true}
    views:
      pages:
        agg: {page: page}
        window: {tumble: 1 min}
        values: {visits: "count(*)", bought: "sum(if(matches > 0, 1, 0))", users: "count(distinct user)"}
      sliding:
        count: {page: page}
        window: {hop: 2 min, every: 30 s}
        values: {visits: 1, matched: "matches"}
      browsing:
        agg: {user: user}
        window: {session: 40 s}
        values: {visits: "count(*)", pages: "count(distinct page)", most: "max(matches)"}
      first_visits:
        list: {page: page}
        window: {hop: 2 min, every: 1 min}
        entry: visit_id
        order: [ts asc, visit_id asc]
        cap: 2
        fields: {user: user, matches: matches}
"""


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return pipeline_file(tmp_path_factory, "converted", PIPELINE)


def _arrivals(rng: random.Random, n: int) -> list[tuple[str, dict]]:
    out = []
    for i in range(n):
        t = T0 + int(i * 600_000 / n) + rng.randrange(-10_000, 10_000)
        if rng.random() < 0.08:
            t -= rng.randrange(15_000, 90_000)  # behind the watermark, mostly
        user = rng.choice(["u1", "u2", "u3", "u4", "u5"])
        if rng.random() < 0.7:
            rec = {"visit_id": f"v{i}", "user": user, "page": rng.choice(["home", "cart", "shoe"]), "ts": t}
            out.append(("visits", rec))
        else:
            out.append(
                ("buys", {"buy_id": f"b{i}", "user": user, "amount": rng.choice([None, 5.5, 20.0]), "ts": t})
            )
        if rng.random() < 0.06:
            out.append(out[-1])
    return out


@pytest.mark.parametrize("seed, pieces", [(3, 4), (6, 3)])
@pytest.mark.slow
def test_windowed_views_of_an_interval_job_equal_the_brute_force(
    spark, tmp_path, redis_url, pipeline, seed, pieces
):
    rng = random.Random(seed)
    arrivals = _arrivals(rng, 260)
    settings, batches = run_in_pieces(
        spark,
        tmp_path,
        redis_url,
        pipeline,
        run,
        "converted",
        arrivals,
        rng,
        pieces=pieces,
        lateness_ms=LATENESS_MS,
    )
    want = brute_force(pipeline, batches, lateness_ms=LATENESS_MS)
    assert want.late["converted"] > 3
    finals = [line["final"] for line in want.export("pages")]
    assert any(finals) and not all(finals)
    client = connect(settings.redis_url)
    for name in ("pages", "sliding", "browsing", "first_visits"):
        assert list(export_view(client, name, pipeline=pipeline)) == want.export(name), name
        for key in want.keys(name)[:3]:
            got = query_view(client, name, key, pipeline=pipeline)
            assert got == want.query(name, key), (name, key)
