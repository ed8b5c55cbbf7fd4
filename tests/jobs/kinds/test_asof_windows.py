"""Windowed `count`, `agg` and `list` views of an `asof` job (tumbling and hopping windows, sessions) end to end,
against the brute force of the contract's definitions (`timeline_demo.brute`): trades enriched with the trading band
of their symbol in force at their time, random records with late trades, late band changes and duplicates, the job
run after every piece. A trade late by its log version is left out of the windowed views (counted as `late`), and
a window is final once no trade before its end can still be emitted (the stream's and the table's watermarks both
passed it)."""

from __future__ import annotations

import random

import pytest

from jobs.core.runtime import read_status
from jobs.kinds.asof import run
from tests.windowhelp import pipeline_file, run_in_pieces
from timeline_demo.brute import brute_force
from views.read import export_view, query_view
from views.redis_io import connect

T0 = 1_700_000_040_000
LATENESS_MS = 15_000
PIPELINE = """\
topics:
  trades: {fields: {trade_id: id, sym: string, qty: long, ts: timestamp}, id: trade_id, time: ts}
  bands: {fields: {sym: string, band: string, ts: timestamp}, key: sym, time: ts}
jobs:
  banded:
    asof: {stream: trades, table: bands, match: {sym: sym}}
    views:
      per_band:
        agg: {band: "coalesce(band, 'none')"}
        window: {tumble: 1 min}
        values: {trades: "count(*)", volume: "sum(qty)", syms: "count(distinct sym)", biggest: "max(qty)"}
      per_sym:
        count: {sym: sym}
        window: {session: 20 s}
        values: {trades: 1, volume: qty}
      biggest:
        list: {band: "coalesce(band, 'none')"}
        window: {hop: 2 min, every: 1 min}
        retain: 1 min
        entry: trade_id
        order: [qty desc, trade_id desc]
        cap: 2
        fields: {sym: sym, qty: qty, version: version}
"""


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return pipeline_file(tmp_path_factory, "banded", PIPELINE)


def _arrivals(rng: random.Random, n: int) -> list[tuple[str, dict]]:
    out = []
    for i in range(n):
        t = T0 + int(i * 600_000 / n) + rng.randrange(-10_000, 10_000)
        if rng.random() < 0.12:
            t -= rng.randrange(20_000, 90_000)  # behind the watermark, mostly
        sym = rng.choice(["a", "b", "c", "d"])
        if rng.random() < 0.75:
            out.append(
                ("trades", {"trade_id": f"t{i}", "sym": sym, "qty": rng.choice([1, 5, 5, 20, 100]), "ts": t})
            )
        else:
            out.append(("bands", {"sym": sym, "band": rng.choice(["low", "mid", "high"]), "ts": t}))
        if rng.random() < 0.06:
            out.append(out[-1])
    return out


@pytest.mark.parametrize("seed, pieces", [(6, 4), (10, 3)])
@pytest.mark.slow
def test_windowed_views_of_an_asof_job_equal_the_brute_force(
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
        "banded",
        arrivals,
        rng,
        pieces=pieces,
        lateness_ms=LATENESS_MS,
    )
    want = brute_force(pipeline, batches, lateness_ms=LATENESS_MS)
    assert want.late["banded"] > 3
    finals = [line["final"] for line in want.export("per_band")]
    assert any(finals) and not all(finals)
    client = connect(settings.redis_url)
    for name in ("per_band", "per_sym", "biggest"):
        assert list(export_view(client, name, pipeline=pipeline)) == want.export(name), name
        for key in want.keys(name)[:3]:
            assert query_view(client, name, key, pipeline=pipeline) == want.query(name, key), (name, key)
    assert read_status(settings, "banded")["late"] == want.late["banded"]
