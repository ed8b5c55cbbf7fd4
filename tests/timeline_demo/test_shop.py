"""The shop pipeline file and its seeded generator (`timeline_demo.shop`): the file loads with its four jobs, the
generator is deterministic and makes every case the views must handle (deletes, ties, pins, wrong and late
payments, closes, Debezium events), and its views, through the brute force, agree with what they mean."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from timeline_demo.brute import batches_from_dir, brute_force, parse_time
from timeline_demo.shop import PIPELINE, WINDOW_MS, generate_shop, main
from views.pipeline import load_pipeline


@pytest.fixture(scope="module")
def feed():
    return generate_shop(orders=1_500, seed=11)


@pytest.fixture(scope="module")
def result(feed):
    return brute_force(load_pipeline(PIPELINE), feed.batches(4))


def plain(feed, topic):
    """The topic's valid records before the tail (the late and clock records)."""
    return [
        r for t, r in feed.arrivals[: len(feed.arrivals) - feed.tail] if t == topic and isinstance(r, dict)
    ]


def test_the_file_loads_with_its_four_jobs():
    p = load_pipeline(PIPELINE)
    assert {j.name: j.kind for j in p.jobs.values()} == {
        "paid": "interval",
        "orders_enriched": "asof",
        "customer_orders": "join",
        "order_totals": "select",
    }
    assert {v.name: v.kind for v in p.views.values()} == {
        "order_status": "row",
        "unpaid_orders": "row",
        "payment_outcomes": "count",
        "order_sizes": "agg",
        "settled_orders": "list",
        "order_tiers": "log",
        "orders_by_tier": "count",
        "tier_stats": "agg",
        "big_by_tier": "list",
        "newest_orders": "list",
        "open_by_tier": "count",
        "open_by_country": "agg",
        "by_currency": "agg",
        "leaderboard": "list",
        "hourly": "agg",
        "visits": "count",
        "best_recent": "list",
    }
    assert p.views["visits"].window.kind == "session" and p.views["hourly"].retain_ms == 30 * 86_400_000
    customers = p.topics["customers"]
    assert customers.capture.postgres == "public.customers" and customers.capture.column("ts") == "updated_at"
    assert p.jobs["paid"].spec.match == (("order_id", "order_id"), ("currency", "currency"))
    assert p.jobs["paid"].spec.lower_ms == 0 and p.jobs["paid"].spec.upper_ms == WINDOW_MS
    assert p.topics["orders"].optional == {"coupon", "customer_version"}


def test_deterministic_per_seed():
    kw = {"orders": 300, "duplicates": 0.03, "bad": 0.02, "late": 3, "debezium": 0.3}
    a, b, c = generate_shop(seed=1, **kw), generate_shop(seed=1, **kw), generate_shop(seed=2, **kw)
    assert a.arrivals == b.arrivals and a.arrivals != c.arrivals


def test_every_case_is_made(feed):
    customers = plain(feed, "customers")
    ops = Counter(r["op"] for r in customers)
    assert ops["delete"] > 0 and ops["upsert"] > 0
    at = Counter((r["customer_id"], parse_time(r["ts"])) for r in customers)
    assert any(n > 1 for n in at.values())  # a delete and an upsert at the same time
    orders = plain(feed, "orders")
    pins = [r["customer_version"] for r in orders if r.get("customer_version")]
    assert any(p == "latest" for p in pins) and sum("@" in p for p in pins) > 5
    assert any(r["amount"] == 0.0 for r in orders) and any(r.get("coupon") for r in orders)
    assert {r["currency"] for r in orders} == {"EUR", "USD"}
    by_order = {r["order_id"]: r for r in orders}
    pays = plain(feed, "payments")
    per_order = Counter(r["order_id"] for r in pays)
    assert max(per_order.values()) == 2 and len(per_order) < len(orders)
    offsets = [parse_time(p["ts"]) - parse_time(by_order[p["order_id"]]["ts"]) for p in pays]
    assert min(offsets) < 0 and max(offsets) > WINDOW_MS  # before the order, after its 30 minutes
    assert 0 in offsets or WINDOW_MS in offsets  # on a bound
    assert any(p["currency"] != by_order[p["order_id"]]["currency"] for p in pays)
    opens = Counter(r["op"] for r in plain(feed, "open_orders"))
    assert opens["open"] == len(orders) and 0 < opens["close"] < len(orders)


def test_the_views_mean_what_they_say(feed, result):
    orders = {r["order_id"]: r for r in plain(feed, "orders")}
    status = {r["order_id"]: r for r in result.export("order_status")}
    assert set(status) == set(orders)  # the clock closed every order's 30 minutes
    unpaid = {r["order_id"] for r in result.export("unpaid_orders")}
    assert unpaid == {k for k, r in status.items() if not r["paid"]} and 0 < len(unpaid) < len(orders)
    assert all(r["paid"] == (r["payments"] > 0) for r in status.values())
    outcomes = result.export("payment_outcomes")
    assert sum(c["orders"] for c in outcomes) == len(orders)
    assert sum(c["unpaid"] for c in outcomes) == len(unpaid)
    tiers = result.export("order_tiers")
    assert len(tiers) == len(orders) and result.held == {"orders_enriched": 0}
    assert {r["tier"] for r in tiers} >= {"bronze", "silver", "gold", "platinum", None}
    by_tier = {c["tier"]: c["orders"] for c in result.export("orders_by_tier")}
    assert sum(by_tier.values()) == sum(1 for r in orders.values() if r["amount"] > 0)  # where: amount > 0
    assert by_tier["none"] == sum(
        1 for r in tiers if r["tier"] is None and orders[r["order_id"]]["amount"] > 0
    )
    board = {r["currency"]: r["order_ids_by_amount"] for r in result.export("leaderboard")}
    by_currency: dict = {}
    for r in orders.values():
        by_currency.setdefault(r["currency"], []).append((r["amount"], r["order_id"]))
    assert board == {c: [i for _, i in sorted(x, reverse=True)[:4]] for c, x in by_currency.items()}
    settled = {r["customer_id"]: r["entries"] for r in result.export("settled_orders")}
    assert sum(len(x) for x in settled.values()) == sum(
        min(3, n) for n in _per(orders, "customer_id").values()
    )
    for r in tiers:
        pin = orders[r["order_id"]].get("customer_version")
        if pin:
            assert r["customer_version"] == pin
        elif r["tier"] is not None:
            assert r["customer_version"] == f"{r['customer_id']}@{r['customer_ts']}"
        else:
            assert r["customer_version"] is None


def _per(rows: dict, field: str) -> dict:
    """{value of `field`: how many of `rows` have it}."""
    out: dict = {}
    for r in rows.values():
        out[r[field]] = out.get(r[field], 0) + 1
    return out


def latest(records, key, remove):
    """The current table, written again here: the greatest time wins, a remove on a tie (this feed has no other
    ties)."""
    best = {}
    for r in records:
        rank = (parse_time(r["ts"]), r["op"] == remove)
        if r[key] not in best or rank > best[r[key]][0]:
            best[r[key]] = (rank, r)
    return {k: r for k, (_, r) in best.items() if r["op"] != remove}


def test_open_orders_join_customers(feed, result):
    clock = [r for t, r in feed.arrivals[-feed.tail :] if t == "customers"]
    customers = latest(plain(feed, "customers") + clock, "customer_id", "delete")
    opened = latest(plain(feed, "open_orders"), "order_id", "close")
    rows = [(o, customers[o["customer_id"]]) for o in opened.values() if o["customer_id"] in customers]
    assert rows and len(rows) < len(opened)
    by_tier = Counter(c["tier"] for _, c in rows)
    assert {c["tier"]: c["open_orders"] for c in result.export("open_by_tier")} == dict(by_tier)
    newest = {}
    for o, c in rows:
        newest.setdefault(c["customer_id"], []).append((parse_time(o["ts"]), o["order_id"]))
    want = [
        {"customer_id": k, "order_ids": [i for _, i in sorted(v, reverse=True)[:5]]}
        for k, v in sorted(newest.items())
    ]
    assert result.export("newest_orders") == want
    q = result.query("newest_orders", want[0]["customer_id"])
    assert list(q) == ["customer_id", "generation", "orders"]
    assert [o["order_id"] for o in q["orders"]] == want[0]["order_ids"]
    assert set(q["orders"][0]) == {"order_id", "amount", "ts"}


def test_debezium_events_say_the_same_as_plain_records():
    p = load_pipeline(PIPELINE)
    plain_ = brute_force(p, generate_shop(orders=200, seed=5).batches(2))
    dbz_feed = generate_shop(orders=200, seed=5, debezium=1.0)
    assert all("after" in r or "before" in r for r in plain(dbz_feed, "customers"))
    dbz = brute_force(p, dbz_feed.batches(2))
    assert sum(dbz.rejected.values()) == 0
    for view in p.views:
        assert dbz.export(view) == plain_.export(view), view


@pytest.mark.parametrize("chunks, late", [(1, 0), (3, 8)])
def test_faults_reach_the_brute_force(tmp_path, chunks, late):
    """Bad lines are rejected; duplicates change nothing; late orders and payments are dropped by `paid` when they
    come in a later batch (one batch: none is late), while the asof job still enriches the late orders."""
    clean = generate_shop(orders=400, seed=9)
    noisy = generate_shop(orders=400, seed=9, duplicates=0.05, bad=0.03, late=4)
    args = ["--orders", "400", "--seed", "9", "--duplicates", "0.05", "--bad", "0.03", "--late", "4"]
    assert main([*args, "--chunks", str(chunks), "--out", str(tmp_path)]) == 0
    p = load_pipeline(PIPELINE)
    got = brute_force(p, batches_from_dir(p, tmp_path))
    want = brute_force(p, clean.batches(chunks))
    assert sum(got.rejected.values()) == noisy.counts["bad"] > 0
    # the late orders: dropped by `paid` with their payments, left out of `order_totals`' windowed views
    assert got.late == ({"paid": late, "order_totals": late // 2} if late else {"paid": 0})
    for view in ("newest_orders", "open_by_tier"):
        assert got.export(view) == want.export(view)
    if chunks > 1:
        assert got.export("order_status") == want.export("order_status")
    assert len(got.export("order_tiers")) == len(want.export("order_tiers")) + 4


def test_cli_summary(tmp_path, capsys):
    assert main(["--orders", "50", "--seed", "1", "--out", str(tmp_path), "--no-close"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["files"]) == sorted(load_pipeline(PIPELINE).topics)
    assert out["counts"]["orders"] == 50 and out["counts"]["clock"] == 0
