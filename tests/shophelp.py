"""A pipeline that is not the built-in one, for the generic join and view kinds: a shop (the contract's example,
grown): orders, payments, and customers keyed by (region, customer_id), with an interval job `paid` (orders x
payments, `unmatched: true`) and an asof job `orders_enriched` (orders x customers, with a pin).

`SHOP` is the file's text; `workload(seed)` a random workload (records of the three topics with an arrival order
within `DISORDER_MS` of their times, duplicates, pins to stale, removed, unseen and malformed versions); `expected`
the views computed by brute force from the contract's definitions, never from the code under test; `write_chunk`
appends records to a topic's log as the `mview ingest` of valid records would (one Delta commit, one file).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from changelog.storage import as_lake

__all__ = [
    "SHOP",
    "LATENESS_MS",
    "DISORDER_MS",
    "T0",
    "Workload",
    "workload",
    "expected",
    "write_chunk",
    "shop_file",
]

T0 = 1_767_261_600_000  # 2026-01-01T10:00:00Z
MIN = 60_000
LATENESS_MS = 10 * MIN
DISORDER_MS = 8 * MIN  # below the lateness: no record is late, whatever the chunking
WITHIN_MS = 30 * MIN

SHOP = """\
topics:
  orders:
    fields: {order_id: id, customer_id: id, region: string, amount: double, qty: long, coupon: string,
             customer_version: string, ts: timestamp}
    optional: [coupon, customer_version]
    id: order_id
    time: ts
  payments:
    fields: {payment_id: id, order_id: id, paid: double, ts: timestamp}
    id: payment_id
    time: ts
  customers:
    fields: {region: string, customer_id: id, tier: string, country: string, ts: timestamp}
    optional: [country]
    key: [region, customer_id]
    time: ts
    op: {upsert: upsert, remove: delete}

jobs:
  paid:
    interval: {left: orders, right: payments, match: {order_id: order_id}, within: [0 s, 30 min], unmatched: true}
    views:
      order_status:
        row: {order_id: order_id}
        fields: {amount: amount, coupon: coupon, paid: "matches > 0", payments: matches}
      paid_by_region:
        count: {region: "coalesce(region, 'none')"}
        values: {orders: 1, paid: "if(matches > 0, 1, 0)", amount: amount, qty: qty}
      few_payments:
        row: {order_id: order_id}
        fields: {payments: matches}
        where: "matches < 2"
      by_payments:
        row: {n: matches}
        fields: {order_id: order_id, amount: amount}
  orders_enriched:
    asof: {stream: orders, table: customers, match: {region: region, customer_id: customer_id}, pin: customer_version}
    views:
      orders_log:
        log:
          fields: {order_id: order_id, tier: tier, version: version, ts: ts, country: customers.country,
                   customer_ts: customers.ts}
      by_tier:
        count: {tier: "coalesce(tier, 'none')"}
        values: {orders: 1, amount: amount}
        show: "{tier}  {orders}"
      last_order:
        row: {customer: "concat(region, '/', customer_id)"}
        fields: {order_id: order_id, tier: tier, ts: ts}
        where: "amount >= 10"
"""

_REGIONS = ("eu", "us", "a|b")
_TIERS = ("gold", "silver", "bronze")


@dataclass
class Workload:
    """Records per topic, and `arrivals`: (topic, record) in arrival order (duplicates included)."""

    orders: list[dict]
    payments: list[dict]
    customers: list[dict]
    arrivals: list[tuple[str, dict]]


def _customers(rng: random.Random, keys, span: int) -> list[dict]:
    out = []
    for region, cid in keys:
        t = T0 - 5 * MIN + rng.randrange(span // 2)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.2:
                out.append({"op": "delete", "region": region, "customer_id": cid, "ts": t})
            else:
                rec = {
                    "op": "upsert",
                    "region": region,
                    "customer_id": cid,
                    "tier": rng.choice(_TIERS),
                    "ts": t,
                }
                if rng.random() < 0.8:
                    rec["country"] = rng.choice(("DE", "FR", "US"))
                out.append(rec)
                if rng.random() < 0.15:  # another change of the same key and time: the rule decides
                    out.append({**rec, "tier": rng.choice(_TIERS)})
            t += rng.randrange(1, span // 3)
    return out


def _order(rng: random.Random, i: int, keys, versions: list[str], span: int) -> dict:
    region, cid = rng.choice(keys) if rng.random() < 0.9 else ("eu", f"ghost{i}")
    rec = {
        "order_id": f"o{i:04d}",
        "customer_id": cid,
        "region": region,
        "amount": rng.randrange(1, 400) / 4,  # quarters: sums are exact in any order
        "qty": rng.randint(1, 5),
        "ts": T0 + rng.randrange(span),
    }
    if rng.random() < 0.3:
        rec["coupon"] = rng.choice(("SAVE", "VIP"))
    r = rng.random()
    if r < 0.08 and versions:
        rec["customer_version"] = rng.choice(versions)  # a version that exists (maybe stale, maybe a delete)
    elif r < 0.11:
        rec["customer_version"] = f"{region}|{cid}@{T0 + rng.randrange(span)}"  # never seen (probably)
    elif r < 0.12:
        rec["customer_version"] = "junk"  # not a version id
    return rec


def workload(seed: int, *, orders: int = 160, keys: int = 25) -> Workload:
    """A random shop workload (see the module docstring)."""
    rng = random.Random(seed)
    span = 4 * 60 * MIN
    ks = [(rng.choice(_REGIONS), f"c{k}") for k in range(keys)]
    customers = _customers(rng, ks, span)
    versions = [f"{c['region']}|{c['customer_id']}@{c['ts']}" for c in customers]
    os_ = [_order(rng, i, ks, versions, span) for i in range(orders)]
    pays = []
    for o in os_:
        for _ in range(rng.choice((0, 0, 1, 1, 1, 2, 3))):
            dt = rng.choice((0, WITHIN_MS, -1, WITHIN_MS + 1, rng.randrange(WITHIN_MS)))
            pays.append({"payment_id": f"p{len(pays):04d}", "order_id": o["order_id"], "paid": o["amount"],
                         "ts": o["ts"] + dt})  # fmt: skip
    timed = [(r["ts"], "orders", r) for r in os_] + [(r["ts"], "payments", r) for r in pays]
    timed += [(r["ts"], "customers", r) for r in customers]
    timed += [rng.choice(timed) for _ in range(len(timed) // 20)]  # delivered twice
    keyed = sorted((t + rng.randrange(DISORDER_MS), i, topic, r) for i, (t, topic, r) in enumerate(timed))
    arrivals = [(topic, r) for *_, topic, r in keyed]
    # a change, last, that moves the customers' watermark past the orders but those of the last quarter hour (held)
    last = max(o["ts"] for o in os_) - 5 * MIN
    arrivals.append(
        ("customers", {"op": "upsert", "region": "zz", "customer_id": "clock", "tier": "x", "ts": last})
    )
    customers.append(arrivals[-1][1])
    return Workload(os_, pays, customers, arrivals)


def _interval(wl: Workload) -> dict:
    """The `paid` job's views per the contract: a payment matches an order of its order_id when its time is in
    [order ts, order ts + 30 min]; an order is final once the watermark (max time of both topics - lateness)
    passed its window's end; unmatched orders are shown once final."""
    orders = {o["order_id"]: o for o in wl.orders}
    pays = {p["payment_id"]: p for p in wl.payments}
    w = max([o["ts"] for o in orders.values()] + [p["ts"] for p in pays.values()]) - LATENESS_MS
    matches = defaultdict(int)
    for p in pays.values():
        o = orders.get(p["order_id"])
        if o is not None and 0 <= p["ts"] - o["ts"] <= WITHIN_MS:
            matches[o["order_id"]] += 1
    status, few, by_n, counts = {}, {}, {}, {}
    for oid, o in sorted(orders.items()):
        n, final = matches[oid], o["ts"] + WITHIN_MS < w
        if not (n > 0 or final):
            continue  # open and unmatched: not shown yet
        status[oid] = ({"order_id": oid, "amount": o["amount"], "coupon": o.get("coupon"), "paid": n > 0,
                        "payments": n}, final)  # fmt: skip
        if n < 2:
            few[oid] = {"order_id": oid, "payments": n}
        line = {"n": str(n), "order_id": oid, "amount": o["amount"]}
        if str(n) not in by_n or (oid, o["amount"]) > (by_n[str(n)]["order_id"], by_n[str(n)]["amount"]):
            by_n[str(n)] = line
        if final:
            c = counts.setdefault(o["region"], {"region": o["region"], "orders": 0, "paid": 0, "amount": 0.0,
                                                "qty": 0})  # fmt: skip
            c["orders"], c["paid"] = c["orders"] + 1, c["paid"] + (n > 0)
            c["amount"], c["qty"] = c["amount"] + o["amount"], c["qty"] + o["qty"]
    return {"order_status": status, "few_payments": few, "by_payments": by_n, "paid_by_region": counts}


_PIN = re.compile(r"^(.*)@(-?\d{1,18})$")


def _versions(customers: list[dict]) -> dict[str, list[tuple]]:
    """{key text: [(ts, removed, tier, country)] by ts}: per key and time the remove wins, then the greatest
    (tier, country), null smallest (the current-table rule)."""
    best: dict[tuple, tuple] = {}
    for c in customers:
        removed = c["op"] == "delete"
        value = (removed, None if removed else c["tier"], None if removed else c.get("country"))
        rank = tuple((v is not None, v) for v in value)
        k = (f"{c['region']}|{c['customer_id']}", c["ts"])
        if k not in best or rank > best[k][0]:
            best[k] = (rank, value)
    out = defaultdict(list)
    for (key, t), (_, value) in best.items():
        out[key].append((t, *value))
    return {k: sorted(v) for k, v in out.items()}


def _enrich(o: dict, versions: dict, by_id: dict, w: int) -> dict | None:
    """The emitted row of order `o` under the customers' watermark `w` (None: held)."""
    if w < o["ts"]:
        return None
    pin, use, version = o.get("customer_version"), None, None
    if pin is not None:
        m, version = _PIN.match(pin), pin
        if m:
            hit = by_id.get((m.group(1), int(m.group(2))))
            if hit is None and w < int(m.group(2)):
                return None  # the pinned version may still come
            use = hit if hit is not None and not hit[1] else None
    else:
        key = f"{o['region']}|{o['customer_id']}"
        cur = [v for v in versions.get(key, []) if v[0] <= o["ts"]]
        if cur and not cur[-1][1]:
            use, version = cur[-1], f"{key}@{cur[-1][0]}"
    tier, country, cts = (use[2], use[3], use[0]) if use else (None, None, None)
    return {"order_id": o["order_id"], "tier": tier, "version": version, "ts": o["ts"], "country": country,
            "customer_ts": cts, "_amount": o["amount"], "_key": f"{o['region']}/{o['customer_id']}"}  # fmt: skip


def _asof(wl: Workload) -> dict:
    """The `orders_enriched` job's views per the contract."""
    versions = _versions(wl.customers)
    by_id = {(k, v[0]): v for k, vs in versions.items() for v in vs}
    w = max(c["ts"] for c in wl.customers) - LATENESS_MS
    orders = {o["order_id"]: o for o in wl.orders}
    rows = [r for r in (_enrich(o, versions, by_id, w) for _, o in sorted(orders.items())) if r]
    log = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    tiers, last = {}, {}
    for r in rows:
        t = tiers.setdefault(r["tier"] or "none", {"tier": r["tier"] or "none", "orders": 0, "amount": 0.0})
        t["orders"], t["amount"] = t["orders"] + 1, t["amount"] + r["_amount"]
        if r["_amount"] >= 10:
            line = {"customer": r["_key"], "order_id": r["order_id"], "tier": r["tier"], "ts": r["ts"]}
            if r["_key"] not in last or r["order_id"] > last[r["_key"]]["order_id"]:
                last[r["_key"]] = line
    return {"orders_log": log, "by_tier": tiers, "last_order": last, "held": len(orders) - len(rows)}


def expected(wl: Workload) -> dict:
    """Every view of the shop computed by brute force from the contract's definitions."""
    return {**_interval(wl), **_asof(wl)}


def write_chunk(spark, lake_dir: Path, topic, records: list[dict]) -> None:
    """Append `records` (valid records of `topic`, a `spec.model.Topic`) to its log at `LAKE_DIR/topics/<name>` in
    one Delta commit of one file: absent optional fields null, columns `topic.columns()`."""
    from changelog.topics import ensure_delta_table

    path = ensure_delta_table(spark, as_lake(Path(lake_dir) / "topics" / topic.name), topic.schema())
    rows = [tuple(r.get(n) for n, _ in topic.columns()) for r in records]
    spark.createDataFrame(rows, topic.schema()).coalesce(1).write.format("delta").mode("append").save(path)


def pieces(arrivals: list[tuple[str, dict]], topics: set[str], n: int, rng: random.Random) -> list[dict]:
    """The arrivals of `topics`, cut into `n` consecutive pieces at random points: [{topic: records}]."""
    mine = [(t, r) for t, r in arrivals if t in topics]
    cuts = sorted(rng.sample(range(1, len(mine)), n - 1)) if n > 1 else []
    bounds = [0, *cuts, len(mine)]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece: dict[str, list[dict]] = {t: [] for t in topics}
        for t, r in mine[a:b]:
            piece[t].append(r)
        out.append(piece)
    return out


def shop_file(directory: Path, text: str = SHOP):
    """The pipeline `text` written to `directory/shop.yml` and loaded from there: a job's settings name it with
    `MVIEW_PIPELINE=<pipeline>.file`, as a user's would."""
    from views.pipeline import load_pipeline

    path = Path(directory) / "shop.yml"
    path.write_text(text)
    return load_pipeline(path, {})
