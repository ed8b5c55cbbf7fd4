"""Seeded shop generator for `timeline_demo/pipelines/shop.yml`: orders, payments, changes of the customers table and
of the open orders, written as the pipeline's topics.

`python -m timeline_demo.shop --orders N --seed S --out DIR [--customers C] [--chunks K] [--duplicates F] [--bad F]
[--late N] [--debezium F] [--lateness D] [--no-close]` writes one JSON-lines file per topic (see
`timeline_demo.feed` for the files, the arrival order and the faults) and prints a summary as JSON.

What it makes, over `span_ms` (6 hours by default) from 2026-01-01T00:00Z:
- customers `c0..`: 90% exist one day before the first order (the others never do: their orders get no tier);
  then each changes 0-3 times (a new tier, a delete, a re-create after a delete, sometimes a delete and an upsert
  at the same time: the delete wins);
- orders `o00000..`: a few very active customers; an amount (about 5% free, with coupon `FREE`), EUR or USD, an
  optional coupon, and for 10% a pinned `customer_version`: one the customer had (often stale), one never seen
  (`<id>@<ms>` at no change) or text that is no version at all;
- payments, per order: one within the 30 minutes (some exactly on a bound), two partial ones, one too late, one in
  the other currency, one before the order, or none: so `paid` sees paid, unpaid and wrongly paid orders;
- open orders: opened when placed; closed when paid, or cancelled later (sometimes at the very time of the open:
  the close wins the tie); the others stay open;
- with `debezium`, that fraction of the customers changes is written as Debezium change events (the `cdc`
  format, `{"op":"c"|"u"|"d","before","after","source":{"ts_ms"}}`, `updated_at` as ISO text).
Arrival: with probability 0.3 a record is delayed by up to 5 minutes (within ALLOWED_LATENESS's default).
Faults for the end-to-end tests: `duplicates`, `bad` (fractions of the records), `late` (that many fresh orders,
each with a payment, `lateness` and more before the first order, in the tail), and the clock records (`close`, on
by default): a payment `~clock` and a customer `~clock` at the greatest time + `lateness` + 31 min, so every
order's 30 minutes are over and every order is enriched.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import datetime, timezone
from pathlib import Path

from spec.durations import parse_duration_ms
from timeline_demo.feed import Feed, arrange, ts_value
from views.pipeline import load_pipeline

__all__ = ["PIPELINE", "T0", "WINDOW_MS", "TIERS", "generate_shop", "main"]

PIPELINE = Path(__file__).with_name("pipelines") / "shop.yml"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WINDOW_MS = 30 * 60_000  # the paid job's `within: [0 s, 30 min]`
TIERS = ("bronze", "silver", "gold", "platinum")
_COUNTRIES = ("DE", "FR", "NL", "US", "JP")
_NAMES = ("Ada", "Grace", "Linus", "Ken", "Barbara", "Edsger", "Donald", "Frances")
_METHODS = ("card", "paypal", "transfer")
_CLOCK = "~clock"
_DELAY_PROB, _DELAY_MS = 0.3, 5 * 60_000
_DAY = 86_400_000


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def _debezium(rec: dict, existed: bool, t: int) -> dict:
    """The Debezium change event of a customers change at `t` (as the cdc job's source would publish it)."""
    source = {"ts_ms": t, "table": "customers"}
    if rec["op"] == "delete":
        return {"op": "d", "before": {"customer_id": rec["customer_id"]}, "after": None, "source": source}
    after = {k: rec[k] for k in ("customer_id", "name", "tier", "country")}
    after["updated_at"] = _iso(t)
    return {"op": "u" if existed else "c", "before": None, "after": after, "source": source}


def _customers(rng: random.Random, n: int, span_ms: int, iso: float, debezium: float, seed: int):
    """(timed changes, {customer: [version times]}, ids). A change's time is unique per customer except the
    deliberate delete-and-upsert ties. Which changes are Debezium events is drawn from its own generator, so the
    changes are the same whatever `debezium` is."""
    form = random.Random(f"debezium-{seed}")
    timed, versions, ids = [], {}, [f"c{i}" for i in range(n)]
    for c in ids:
        if rng.random() < 0.1:
            continue  # never in the table
        stamps = [T0 - _DAY] + sorted(T0 + rng.randrange(span_ms) for _ in range(rng.randrange(4)))
        live = False
        versions[c] = []
        for i, t in enumerate(stamps):
            upsert = {
                "op": "upsert",
                "customer_id": c,
                "name": rng.choice(_NAMES),
                "tier": rng.choice(TIERS),
                "country": rng.choice(_COUNTRIES),
            }
            if i == 0 or not live or rng.random() < 0.75:
                changes = [upsert]
            else:
                changes = [{"op": "delete", "customer_id": c}]
                if rng.random() < 0.3:
                    changes.append(upsert)  # at the same time: the delete wins
            for rec in changes:
                existed = live
                rec["ts"] = ts_value(t, rng, iso)
                live = rec["op"] == "upsert" if len(changes) == 1 else False
                if form.random() < debezium:
                    rec = _debezium(rec, existed, t)
                timed.append((t, "customers", rec))
            versions[c].append(t)
    return timed, versions, ids


def _pin(rng: random.Random, customer: str, t: int, versions: dict) -> str:
    seen = [v for v in versions.get(customer, []) if v <= t]
    r = rng.random()
    if seen and r < 0.6:
        return f"{customer}@{rng.choice(seen)}"
    if r < 0.8:
        return f"{customer}@{t - 1}"  # a version never seen
    return "latest"  # not a version id


# long: one branch per payment outcome, as the module docstring lists them
def _payments(rng: random.Random, order: dict, t: int, seq: list[int], iso: float) -> list[tuple[int, dict]]:
    """The order's payments as [(time, record)]."""
    r = rng.random()
    cur = order["currency"]
    other = "USD" if cur == "EUR" else "EUR"
    if r < 0.55:
        at = [t + rng.choice((0, WINDOW_MS)) if rng.random() < 0.1 else t + rng.randrange(WINDOW_MS + 1)]
        parts, currency = 1, cur
    elif r < 0.63:
        at = sorted(t + rng.randrange(WINDOW_MS + 1) for _ in range(2))
        parts, currency = 2, cur
    elif r < 0.71:
        at, parts, currency = [t + WINDOW_MS + 1 + rng.randrange(90 * 60_000)], 1, cur
    elif r < 0.76:
        at, parts, currency = [t + rng.randrange(WINDOW_MS + 1)], 1, other
    elif r < 0.80:
        at, parts, currency = [t - 1 - rng.randrange(10 * 60_000)], 1, cur
    else:
        return []
    out = []
    for when in at:
        seq[0] += 1
        rec = {
            "payment_id": f"p{seq[0]:06d}",
            "order_id": order["order_id"],
            "amount": round(order["amount"] / parts, 2),
            "currency": currency,
            "method": rng.choice(_METHODS),
            "ts": ts_value(when, rng, iso),
        }
        out.append((when, rec))
    return out


def _order(rng: random.Random, oid: str, customer: str, t: int, versions: dict, iso: float) -> dict:
    free = rng.random() < 0.05
    rec = {
        "order_id": oid,
        "customer_id": customer,
        "amount": 0.0 if free else round(rng.uniform(5, 500), 2),
        "currency": "EUR" if rng.random() < 0.85 else "USD",
        "ts": ts_value(t, rng, iso),
    }
    r = rng.random()
    if free:
        rec["coupon"] = "FREE"
    elif r < 0.2:
        rec["coupon"] = "SAVE10"
    elif r < 0.25:
        rec["coupon"] = None
    if rng.random() < 0.1:
        rec["customer_version"] = _pin(rng, customer, t, versions)
    return rec


# long: the topics one after the other, then the tail, as the module docstring lists them
def generate_shop(
    *,
    orders: int,
    seed: int,
    customers: int = 60,
    span_ms: int = 6 * 3_600_000,
    iso_ratio: float = 0.3,
    duplicates: float = 0.0,
    bad: float = 0.0,
    late: int = 0,
    debezium: float = 0.0,
    lateness_ms: int = 600_000,
    close: bool = True,
) -> Feed:
    """`orders` orders and the records that go with them, as a `Feed` (see the module docstring). The same
    arguments give the same feed."""
    rng = random.Random(seed)
    topics = load_pipeline(PIPELINE).topics
    timed, versions, ids = _customers(rng, customers, span_ms, iso_ratio, debezium, seed)
    weights = [8.0 if i < max(1, customers // 10) else 1.0 for i in range(customers)]
    seq = [0]
    for n in range(orders):
        t = T0 + rng.randrange(span_ms)
        customer = rng.choices(ids, weights)[0]
        order = _order(rng, f"o{n:05d}", customer, t, versions, iso_ratio)
        timed.append((t, "orders", order))
        pays = _payments(rng, order, t, seq, iso_ratio)
        timed += [(when, "payments", rec) for when, rec in pays]
        opened = {k: order[k] for k in ("order_id", "customer_id", "amount")}
        timed.append((t, "open_orders", {"op": "open", **opened, "ts": ts_value(t, rng, iso_ratio)}))
        paid = [w for w, rec in pays if rec["currency"] == order["currency"] and t <= w <= t + WINDOW_MS]
        r = rng.random()
        close_at = min(paid) if paid else t if r < 0.03 else t + 3_600_000 + rng.randrange(7_200_000)
        if paid or r < 0.5:
            rec = {"op": "close", "order_id": order["order_id"], "ts": ts_value(close_at, rng, iso_ratio)}
            timed.append((close_at, "open_orders", rec))
    tail_late: list[tuple[str, dict]] = []
    for i in range(late):
        at = T0 - lateness_ms - 1 - rng.randrange(60_000)
        order = _order(rng, f"L{i}", rng.choice(ids), at, {}, 0.0)
        pay = {"payment_id": f"L{i}", "order_id": f"L{i}", "amount": order["amount"]}
        pay |= {"currency": order["currency"], "method": "card", "ts": at + 1}
        tail_late += [("orders", order), ("payments", pay)]
    clock: list[tuple[str, dict]] = []
    if close:
        end = max(t for t, _, _ in timed) + lateness_ms + WINDOW_MS + 60_000
        pay = {"payment_id": _CLOCK, "order_id": _CLOCK, "amount": 0.0, "currency": "EUR", "method": "clock"}
        who = {"op": "upsert", "customer_id": _CLOCK, "name": "clock", "tier": "clock", "country": "ZZ"}
        clock = [("payments", {**pay, "ts": end}), ("customers", {**who, "ts": end})]
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
    )
    feed.counts.update(orders=orders, customers=len(versions))
    return feed


def main(argv: list[str] | None = None) -> int:
    """`python -m timeline_demo.shop --orders N --seed S --out DIR ...`: write the topics' files (see the module
    docstring) and print {"files": {topic: [file, ...]}, "counts": {...}} as JSON."""
    p = argparse.ArgumentParser(prog="python -m timeline_demo.shop", description=__doc__.split("\n\n")[0])
    p.add_argument("--orders", type=int, required=True)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", required=True, help="directory of the JSON-lines files")
    p.add_argument("--customers", type=int, default=60)
    p.add_argument("--chunks", type=int, default=1, help="batches: <topic>-<i>.jsonl files (default 1)")
    p.add_argument("--duplicates", type=float, default=0.0, help="fraction of records delivered twice")
    p.add_argument("--bad", type=float, default=0.0, help="fraction of bad lines added")
    p.add_argument("--late", type=int, default=0, help="late orders (each with a payment) in the last chunk")
    p.add_argument(
        "--debezium", type=float, default=0.0, help="fraction of customers changes as Debezium events"
    )
    p.add_argument("--lateness", default="10 minutes", help="ALLOWED_LATENESS the files are made for")
    p.add_argument("--no-close", action="store_true", help="no clock records at the end")
    a = p.parse_args(argv)
    if a.chunks < 1 or a.orders < 0 or a.customers < 1:
        p.error("--chunks and --customers must be >= 1, --orders >= 0")
    feed = generate_shop(
        orders=a.orders,
        seed=a.seed,
        customers=a.customers,
        duplicates=a.duplicates,
        bad=a.bad,
        late=a.late,
        debezium=a.debezium,
        lateness_ms=parse_duration_ms(a.lateness),
        close=not a.no_close,
    )
    files = feed.write(a.out, chunks=a.chunks)
    print(json.dumps({"files": files, "counts": feed.counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
