"""A ticketing pipeline of `select` jobs (no join), for the end-to-end tests of `jobs.kinds.select`: gate scans at a
venue (an event topic: duplicates within and across batches, copies that differ, records hours behind the others,
optional fields), the seat map (a table topic keyed by (venue, seat): holds, releases, a seat that changes section
or holder, equal-time ties) and season passes (a table topic with `final_deletes`).

`TICKETS` is the file's text (`AGG_VIEWS`: the agg views, added by `ticket_text(agg=True)`; `LIST_VIEWS`: the list
views, added by `ticket_text(lists=True)`); `workload(seed)` a
random workload as (topic, record) pairs in a shuffled arrival order, records valid and normalized (times in epoch
ms, doubles as floats) so that they can be appended as they are (`tests.shophelp.write_chunk`) and given to the
brute force (`timeline_demo.brute`) alike.
"""

from __future__ import annotations

import random

__all__ = ["TICKETS", "AGG_VIEWS", "LIST_VIEWS", "JOBS", "TOPICS", "T0", "MIN", "ticket_text", "workload"]

T0 = 1_772_388_000_000  # 2026-03-01T18:00:00Z
MIN = 60_000
JOBS = {"gate_flow": "scans", "seat_map": "seats", "pass_book": "passes"}
TOPICS = tuple(JOBS.values())

TICKETS = """\
topics:
  scans:
    fields: {scan_id: id, ticket_id: id, gate: string, zone: string, fee: double, bags: long, note: string,
             ts: timestamp}
    optional: [zone, bags, note]
    id: scan_id
    time: ts
  seats:
    fields: {venue: id, seat: id, section: string, holder: string, price: double, row_no: long, ts: timestamp}
    optional: [holder]
    key: [venue, seat]
    time: ts
    op: {upsert: hold, remove: release}
  passes:
    fields: {pass_id: id, owner: string, level: long, ts: timestamp}
    key: pass_id
    time: ts
    op: {upsert: grant, remove: revoke}
    final_deletes: true

jobs:
  gate_flow:
    select: {from: scans}
    views:
      scan_row:
        row: {scan_id: scan_id}
        fields: {ticket_id: ticket_id, gate: gate, zone: zone, fee: fee, note: note, ts: ts}
      last_scan:
        row: {ticket: ticket_id}
        fields: {ts: ts, gate: gate}
        where: "gate != 'staff'"
      gate_counts:
        count: {gate: gate}
        values: {scans: 1, fees: fee, bags: "coalesce(bags, 0)", noted: "if(note IS NULL, 0, 1)"}
      zone_counts:
        count: {zone: zone}
        values: {scans: 1}
      scan_log:
        log: {fields: {scan_id: scan_id, ticket_id: ticket_id, zone: zone, fee: fee, ts: ts}}
        where: "fee > 0"
  seat_map:
    select: {from: seats}
    views:
      seat_row:
        row: {seat: "concat(venue, '/', seat)"}
        fields: {section: section, holder: holder, price: price, row_no: row_no}
      by_holder:
        row: {holder: holder}
        fields: {price: price, seat: seat, venue: venue}
      section_counts:
        count: {section: section}
        values: {seats: 1, revenue: price, front: "if(row_no <= 3, 1, 0)"}
        where: "price > 0"
  pass_book:
    select: {from: passes}
    views:
      pass_row:
        row: {pass_id: pass_id}
        fields: {owner: owner, level: level}
      level_counts:
        count: {level: level}
        values: {passes: 1}
"""

# The agg views, every aggregate form over the event select (with a `where` and an optional field) and the table
# select (whose rows change key and leave).
AGG_VIEWS = {
    "gate_flow": """\
      gate_stats:
        agg: {gate: gate}
        values: {scans: "count(*)", tickets: "count(distinct ticket_id)", with_bags: "count(bags)",
                 fees: "sum(fee)", cheapest: "min(fee)", latest: "max(ts)", avg_bags: "avg(bags)",
                 free: "sum(if(fee = 0, 1, 0))", zones: "count(distinct zone)", first_zone: "min(zone)"}
        where: "gate != 'staff'"
""",
    "seat_map": """\
      section_stats:
        agg: {section: section}
        values: {seats: "count(*)", holders: "count(distinct holder)", held: "count(holder)",
                 revenue: "sum(price)", low: "min(price)", high: "max(price)", avg_price: "avg(price)",
                 front: "sum(if(row_no <= 3, 1, 0))", top_row: "max(row_no)", avg_row: "avg(row_no)"}
      venue_stats:
        agg: {venue: venue}
        values: {seats: "count(*)", best: "max(price * 2 + row_no)", last_holder: "max(holder)"}
        where: "price >= 5"
""",
}


# The list views: over the event select, one entry per row (a scan) and one per ticket (a ticket scanned several
# times is listed once, at its first scan); over the table select, one entry per seat (a seat that changes section
# or leaves is refilled) and one per holder (who holds several seats). An entry's fields are the same in every row
# that gives it.
LIST_VIEWS = {
    "gate_flow": """\
      top_fees:
        list: {gate: gate}
        entry: scan_id
        order: [fee desc, scan_id desc]
        cap: 4
        fields: {ticket_id: ticket_id, fee: fee, ts: ts}
        entries: scans
        where: "gate != 'staff'"
      first_in:
        list: {zone: zone}
        entry: ticket_id
        order: ts asc
        cap: 5
        fields: {ticket: "upper(ticket_id)"}
""",
    "seat_map": """\
      top_seats:
        list: {section: section}
        entry: "concat(venue, '/', seat)"
        order: price desc
        cap: 3
        fields: {holder: holder, price: price, row_no: row_no}
        items: seats
      front_holders:
        list: {venue: venue}
        entry: holder
        order: row_no asc
        cap: 3
        fields: {holder: holder, loud: "upper(holder)"}
""",
}


def ticket_text(*, agg: bool = False, lists: bool = False) -> str:
    """The pipeline file's text, with the agg views when `agg` and the list views when `lists`."""
    text = TICKETS
    for wanted, extra in ((agg, AGG_VIEWS), (lists, LIST_VIEWS)):
        for job, views in extra.items() if wanted else ():
            head = f"  {job}:\n    select: {{from: {JOBS[job]}}}\n    views:\n"
            text = text.replace(head, head + views)
    return text


_GATES = ("north", "south", "east", "staff")
_NOTES = ("vip", "lost", "re-entry")


def _scan(rng: random.Random, i: int) -> dict:
    late = rng.random() < 0.1  # hours behind the others: nothing is late in a select
    rec = {
        "scan_id": f"s{i:04d}",
        "ticket_id": f"t{rng.randrange(60):02d}",
        "gate": rng.choice(_GATES),
        "fee": rng.choice((0.0, 0.0, *(rng.randrange(1, 80) / 4 for _ in range(4)))),
        "ts": T0 - rng.randrange(1, 300) * MIN if late else T0 + rng.randrange(180 * MIN),
    }
    if rng.random() < 0.8:
        rec["zone"] = rng.choice("ABC")
    if rng.random() < 0.7:
        rec["bags"] = rng.randrange(4)
    if rng.random() < 0.15:
        rec["note"] = rng.choice(_NOTES)
    return rec


def _scans(rng: random.Random, n: int) -> list[dict]:
    out = [_scan(rng, i) for i in range(n)]
    for rec in rng.sample(out, n // 10):  # delivered twice
        out.append(dict(rec))
    for rec in rng.sample(out[:n], n // 20):  # the same id and time, other fields: the dedupe rule decides
        out.append({**rec, "gate": rng.choice(_GATES), "fee": rng.randrange(80) / 4})
    return out


def _seats(rng: random.Random, keys: int) -> list[dict]:
    out = []
    for k in range(keys):
        venue, seat = rng.choice(("arena", "club")), f"{rng.choice('ABCD')}{k}"
        t = T0 + rng.randrange(60) * MIN
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.2:
                rec = {"op": "release", "venue": venue, "seat": seat, "ts": t}
            else:
                rec = {"op": "hold", "venue": venue, "seat": seat, "section": rng.choice(("floor", "balcony", "box")),
                       "price": rng.randrange(0, 200) / 4, "row_no": rng.randint(1, 12), "ts": t}  # fmt: skip
                if rng.random() < 0.8:
                    rec["holder"] = f"h{rng.randrange(15)}"
            out.append(rec)
            r = rng.random()
            if r < 0.12:  # an equal-time tie with another hold: the greatest non-key fields win
                out.append({**rec, "op": "hold", "section": rng.choice(("floor", "box")), "price": 30.0,
                            "row_no": 2, "holder": f"h{rng.randrange(15)}"})  # fmt: skip
            elif r < 0.2:  # an equal-time tie with a release: the release wins
                out.append({"op": "release", "venue": venue, "seat": seat, "ts": t})
            t += rng.randrange(-10, 40) * MIN  # sometimes an older change, arriving after a newer one
    return out


def _passes(rng: random.Random, keys: int) -> list[dict]:
    out = []
    for k in range(keys):
        t = T0 + rng.randrange(60) * MIN
        for _ in range(rng.randint(1, 3)):
            out.append({"op": "grant", "pass_id": f"p{k:02d}", "owner": f"o{rng.randrange(8)}",
                        "level": rng.randint(1, 3), "ts": t})  # fmt: skip
            t += rng.randrange(1, 30) * MIN
        if rng.random() < 0.3:  # final, even when older than the grants
            out.append({"op": "revoke", "pass_id": f"p{k:02d}", "ts": t - rng.randrange(90) * MIN})
    return out


def workload(seed: int, *, scans: int = 200, seats: int = 40, passes: int = 20) -> list[tuple[str, dict]]:
    """(topic, record) pairs of the three topics, shuffled: the arrival order."""
    rng = random.Random(seed)
    arrivals = [("scans", r) for r in _scans(rng, scans)]
    arrivals += [("seats", r) for r in _seats(rng, seats)]
    arrivals += [("passes", r) for r in _passes(rng, passes)]
    rng.shuffle(arrivals)
    return arrivals
