"""`jobs.kinds.asof` on a pipeline that is not the built-in one (`tests.shophelp.SHOP`, job `orders_enriched`:
orders x customers keyed by (region, customer_id), a `|` inside a key value, a pin to stale, removed, unseen and
malformed versions; a log view with the table's fields written `customers.<field>`, a count view with integer and
double sums, a row view with a `where` whose key several rows share): random workloads in several chunkings
against the brute-force computation of the contract's definitions, compared exactly."""

from __future__ import annotations

import random

import pytest

from jobs.core.runtime import read_status
from jobs.kinds.asof import run
from tests.conftest import make_settings
from tests.shophelp import SHOP, expected, pieces, shop_file, workload, write_chunk
from views.log import export_log
from views.read import export_view, format_result, query_view
from views.redis_io import connect

# The same pipeline whose log view has a `where`: it no longer holds every emitted event, so the job finds the events
# it emitted before in its own state (`emitted`) to drop a copy delivered again.
WHERE_LOG = SHOP.replace(
    "customer_ts: customers.ts}\n", 'customer_ts: customers.ts}\n        where: "qty > 0"\n'
)


@pytest.fixture(params=["log without where", "log with where"])
def shop(tmp_path, request):
    return shop_file(tmp_path, SHOP if request.param == "log without where" else WHERE_LOG)


def _run_chunked(spark, tmp_path, redis_url, shop, wl, chunks: int, seed: int):
    """Each piece of the arrival order appended (one commit per topic), then `run --once`."""
    settings = make_settings(
        tmp_path / f"lake{seed}_{chunks}", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=shop.file
    )
    for piece in pieces(wl.arrivals, {"orders", "customers"}, chunks, random.Random(seed)):
        for topic, records in piece.items():
            if records:
                write_chunk(spark, settings.lake_dir, shop.topic(topic), records)
        run(spark, settings, shop, "orders_enriched", once=True)
    return settings


@pytest.mark.parametrize(
    "seed, chunks", [pytest.param(1, 1, marks=pytest.mark.slow), (2, 2)]
)  # each with both shops: everything in one batch, and copies and pins across batches
def test_views_equal_the_definition_for_any_chunking(spark, tmp_path, redis_url, shop, seed, chunks):
    wl = workload(seed)
    want = expected(wl)
    log = want["orders_log"]
    # the workload exercises every case: live, removed and never-seen keys, every kind of pin, held orders
    assert sum(r["tier"] is None for r in log) > 10 and sum(r["tier"] is not None for r in log) > 50
    assert any(r["version"] == "junk" for r in log) and any("a|b" in (r["version"] or "") for r in log)
    assert want["held"] > 0
    settings = _run_chunked(spark, tmp_path, redis_url, shop, wl, chunks, seed)
    assert list(export_log(spark, settings.lake, shop.views["orders_log"], 1)) == log, f"chunks={chunks}"
    client = connect(redis_url)
    assert list(export_view(client, "by_tier", pipeline=shop)) == [
        want["by_tier"][k] for k in sorted(want["by_tier"])
    ]
    assert list(export_view(client, "last_order", pipeline=shop)) == [
        want["last_order"][k] for k in sorted(want["last_order"])
    ]
    gold = query_view(client, "by_tier", "gold", pipeline=shop)
    assert gold == {**want["by_tier"]["gold"], "generation": 1}
    assert format_result("by_tier", gold, pipeline=shop) == f"gold  {gold['orders']}"
    assert query_view(client, "by_tier", "nope", pipeline=shop) == {}
    assert format_result("by_tier", {}, pipeline=shop) == ""
    assert read_status(settings, "orders_enriched")["held"] == want["held"]
