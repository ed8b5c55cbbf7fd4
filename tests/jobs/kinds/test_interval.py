"""`jobs.kinds.interval` on a pipeline that is not the built-in one (`tests.shophelp.SHOP`, job `paid`: orders x
payments within 30 minutes, `unmatched: true`; row views keyed by the order, by an expression of `matches`, with a
`where` over `matches`; a count view with integer and double sums): random workloads in several chunkings against
the brute-force computation of the contract's definitions, compared exactly; an expression Spark cannot analyse
is one line naming the file, line, key and expression, before anything runs."""

from __future__ import annotations

import random

import pytest

from jobs.core.runtime import read_status
from jobs.kinds.interval import run
from tests.conftest import make_settings
from tests.shophelp import SHOP, expected, pieces, shop_file, workload, write_chunk
from views.frame import ExpressionError
from views.pipeline import parse_pipeline
from views.read import export_view, query_view
from views.redis_io import connect

VIEWS = ("order_status", "few_payments", "by_payments", "paid_by_region")


@pytest.fixture
def shop(tmp_path):
    return shop_file(tmp_path, SHOP)


def _run_chunked(spark, tmp_path, redis_url, shop, wl, chunks: int, seed: int):
    """Every piece of the arrival order appended as one commit per topic, then one `run --once` whose micro-batches
    each read one commit of each topic."""
    settings = make_settings(
        tmp_path / f"lake{seed}_{chunks}", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=shop.file
    )
    for piece in pieces(wl.arrivals, {"orders", "payments"}, chunks, random.Random(seed)):
        for topic, records in piece.items():
            if records:
                write_chunk(spark, settings.lake_dir, shop.topic(topic), records)
    totals = run(spark, settings, shop, "paid", once=True, max_files_per_trigger=1)
    assert totals["late"] == 0 and totals["batches"] >= chunks
    client = connect(redis_url)
    got = {v: list(export_view(client, v, pipeline=shop)) for v in VIEWS}
    return settings, client, got


@pytest.mark.parametrize("seed, chunkings", [(1, (1, 3)), (2, (2,))])
@pytest.mark.slow
def test_views_equal_the_definition_for_any_chunking(
    spark, tmp_path, redis_url, rclient, shop, seed, chunkings
):
    wl = workload(seed)
    want = expected(wl)
    status = want["order_status"]
    # the workload exercises every case: paid and not, final and open, several payments, duplicates
    assert sum(final for _, final in status.values()) > 20 and sum(not f for _, f in status.values()) > 1
    assert sum(line["payments"] == 0 for line, _ in status.values()) > 5
    assert sum(line["payments"] >= 2 for line, _ in status.values()) > 5
    for chunks in chunkings:
        rclient.flushall()
        settings, client, got = _run_chunked(spark, tmp_path, redis_url, shop, wl, chunks, seed)
        assert got["order_status"] == [line for line, _ in status.values()], f"chunks={chunks}"
        assert got["few_payments"] == list(want["few_payments"].values())
        assert got["by_payments"] == [want["by_payments"][k] for k in sorted(want["by_payments"])]
        assert got["paid_by_region"] == [want["paid_by_region"][k] for k in sorted(want["paid_by_region"])]
        for oid, (line, final) in list(status.items())[:20]:
            assert query_view(client, "order_status", oid, pipeline=shop) == {
                **line,
                "final": final,
                "generation": 1,
            }
        assert query_view(client, "order_status", "nope", pipeline=shop) == {}
        s = read_status(settings, "paid")
        assert s["closed"] == sum(final for _, final in status.values()) and s["duplicates"] > 0


def test_an_expression_spark_cannot_analyse_is_one_line_naming_file_line_and_key(
    spark, tmp_path, redis_url, shop
):
    broken = SHOP.replace("payments: matches}", "payments: matchs + 1}")
    line = 1 + broken.splitlines().index(next(x for x in broken.splitlines() if "matchs + 1" in x))
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=shop.file)
    with pytest.raises(ExpressionError) as e:
        run(spark, settings, parse_pipeline(broken, "shop.yml"), "paid", once=True)
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text and "at org.apache" not in text
    assert text.startswith(f"shop.yml:{line}: jobs.paid.views.order_status.fields.payments: matchs + 1: ")
    assert "UNRESOLVED_COLUMN" in text and "`matchs`" in text
    assert not (settings.lake_dir / "checkpoints").exists()  # nothing ran


@pytest.mark.parametrize("seed", [1, 2])
def test_the_shops_brute_force_agrees_with_the_demos_generic_one(seed):
    """`tests.shophelp.expected` (written for these tests) and `timeline_demo.brute` (any pipeline) are two readings
    of the contract, written apart: on the shop's workloads they say the same for every view."""
    from tests.shophelp import LATENESS_MS
    from timeline_demo.brute import brute_force

    wl, pipeline = workload(seed), parse_pipeline(SHOP, "shop.yml")
    want, batch = expected(wl), {}
    for topic, record in wl.arrivals:
        batch.setdefault(topic, []).append(record)
    got = brute_force(pipeline, [batch], lateness_ms=LATENESS_MS)
    assert got.export("order_status") == [line for line, _ in want["order_status"].values()]
    assert got.export("orders_log") == want["orders_log"]
    for view in ("few_payments", "by_payments", "paid_by_region", "by_tier", "last_order"):
        assert got.export(view) == [want[view][k] for k in sorted(want[view])], view
    assert got.held == {"orders_enriched": want["held"]}
