"""The brute-force reference (`timeline_demo.brute`): small hand-written cases per join kind and view kind, with the
lines the contract's wording gives, and the built-in pipeline checked against the existing references on the
existing workload generators. Pure Python: no Spark, no Redis."""

from __future__ import annotations

import random
import textwrap

import orjson
import pytest

from timeline_demo.brute import (
    BruteError,
    ExprError,
    Rejected,
    batches_from_dir,
    batches_of,
    brute_force,
    current_table,
    validate,
    versions,
)
from timeline_demo.clicks_workload import expected_clicks, generate_clicks
from timeline_demo.enrichment_workload import expected_by_country, expected_enriched, generate_enrichment
from timeline_demo.reference import expected_timelines
from timeline_demo.workload import generate
from views.pipeline import load_pipeline, parse_pipeline


def pipeline(text: str):
    return parse_pipeline(textwrap.dedent(text), "t.yml")


# --- records ---------------------------------------------------------------------------------------------------

RECORDS = pipeline(
    """
    topics:
      ev:
        fields: {eid: id, n: long, x: double, ok: boolean, s: string, ts: timestamp}
        optional: [s]
        id: eid
        time: ts
      tab:
        fields: {k1: id, k2: long, v: string, w: string, ts: timestamp}
        key: [k1, k2]
        time: ts
        op: {upsert: put, remove: drop}
        remove_fields: [w]
        capture: {postgres: public.tab, columns: {ts: updated_at}}
    """
)
GOOD = {"eid": "e1", "n": 3, "x": 1, "ok": True, "ts": 1000}


@pytest.mark.parametrize(
    "change, ok",
    [
        ({}, True),
        ({"extra": [1, 2]}, True),  # extra fields are ignored
        ({"s": None}, True),  # optional: null or absent
        ({"s": "text"}, True),
        ({"ts": "2026-01-01T10:00:00Z"}, True),
        ({"ts": "2026-01-01T12:00:00.5+02:00"}, True),
        ({"ts": "2026-01-01T10:00:00"}, False),  # no zone
        ({"ts": "yesterday"}, False),
        ({"ts": -1}, False),
        ({"ts": 4_102_444_800_000}, False),  # 2100: out of range
        ({"ts": 1.5}, False),
        ({"ts": True}, False),
        ({"eid": ""}, False),
        ({"eid": "  "}, False),
        ({"eid": "a\x07b"}, False),
        ({"eid": 12}, False),
        ({"n": "3"}, False),
        ({"n": True}, False),
        ({"n": 2**63}, False),
        ({"n": 1.0}, False),
        ({"x": "1"}, False),
        ({"x": False}, False),
        ({"ok": 1}, False),
        ({"s": 5}, False),
        ({"n": None}, False),  # required
    ],
)
def test_a_record_is_valid_by_its_declared_types(change, ok):
    rec = {**GOOD, **change}
    if ok:
        got = validate(RECORDS.topics["ev"], rec)
        assert set(got) == {"eid", "n", "x", "ok", "s", "ts"}
        assert isinstance(got["x"], float) and isinstance(got["ts"], int)
    else:
        with pytest.raises(Rejected):
            validate(RECORDS.topics["ev"], rec)


@pytest.mark.parametrize(
    "raw, ok",
    [
        ('{"eid":"e1","n":3,"x":1.5,"ok":false,"ts":1000}', True),
        (b'{"eid":"e1","n":3,"x":1.5,"ok":false,"ts":1000}\r\n', True),
        ('{"eid":"e1",', False),
        ("[1, 2]", False),
        ('"text"', False),
        ('{"eid":"e1","n":3,"x":NaN,"ok":false,"ts":1000}', False),
        ('{"eid":"e1","n":3,"x":1,"ok":false,"ts":1000,"pad":"' + "x" * 1_048_576 + '"}', False),
    ],
)
def test_a_line_is_json_of_an_object_of_at_most_a_mebibyte(raw, ok):
    if ok:
        assert validate(RECORDS.topics["ev"], raw)["eid"] == "e1"
    else:
        with pytest.raises(Rejected):
            validate(RECORDS.topics["ev"], raw)


@pytest.mark.parametrize(
    "rec, want",
    [
        ({"op": "put", "k1": "a", "k2": 1, "v": "x", "w": "y", "ts": 5}, {"v": "x", "w": "y"}),
        ({"op": "drop", "k1": "a", "k2": 1, "w": "y", "ts": 5}, {"v": None, "w": "y"}),
        ({"op": "drop", "k1": "a", "k2": 1, "v": 7, "w": "y", "ts": 5}, {"v": None, "w": "y"}),
        ({"op": "drop", "k1": "a", "k2": 1, "ts": 5}, None),  # remove_fields are required
        ({"op": "put", "k1": "a", "k2": 1, "w": "y", "ts": 5}, None),
        ({"op": "merge", "k1": "a", "k2": 1, "ts": 5}, None),
        ({"k1": "a", "k2": 1, "v": "x", "w": "y", "ts": 5}, None),  # no op
        # Debezium change events on a captured table topic
        (
            # an integer time without a schema is in microseconds (Debezium's MicroTimestamp)
            {
                "op": "c",
                "after": {"k1": "a", "k2": 1, "v": "x", "w": "y", "updated_at": 7000},
                "source": {"ts_ms": 9},
            },
            {"op": "put", "ts": 7},
        ),
        (
            {"op": "u", "after": {"k1": "a", "k2": 1, "v": "x", "w": "y", "updated_at": None}, "ts_ms": 9},
            {"op": "put", "ts": 9},
        ),
        (
            {
                "schema": {},
                "payload": {
                    "op": "r",
                    "after": {"k1": "a", "k2": 1, "v": "x", "w": "y"},
                    "source": {"ts_ms": 9},
                },
            },
            {"op": "put", "ts": 9},
        ),
        (
            {
                "op": "u",
                "after": {"k1": "a", "k2": 1, "v": "x", "w": "y", "updated_at": "2026-01-01T00:00:00Z"},
                "source": {"ts_ms": 9},
            },
            {"ts": 1_767_225_600_000},
        ),
        (
            {"op": "d", "before": {"k1": "a", "k2": 1, "w": "y"}, "source": {"ts_ms": 9}},
            {"op": "drop", "ts": 9},
        ),
        ({"op": "t", "before": {}, "source": {"ts_ms": 9}}, None),
        ({"op": "c", "after": {"k1": "a", "k2": 1, "v": "x", "w": "y"}}, None),  # no commit time
    ],
)
def test_table_records_ops_removes_and_debezium(rec, want):
    topic = RECORDS.topics["tab"]
    if want is None:
        with pytest.raises(Rejected):
            validate(topic, rec)
    else:
        got = validate(topic, rec)
        assert {k: got[k] for k in want} == want


# --- the current-table rule and versions -----------------------------------------------------------------------

TABLES = pipeline(
    """
    topics:
      t:
        fields: {k: id, a: string, b: long, ts: timestamp}
        optional: [a]
        key: k
        time: ts
        op: {upsert: up, remove: rm}
      f:
        fields: {k: id, a: string, ts: timestamp}
        key: k
        time: ts
        op: {upsert: up, remove: rm}
        final_deletes: true
    """
)


def up(k, ts, a="x", b=0, topic="t"):
    rec = {"op": "up", "k": k, "a": a, "ts": ts}
    return rec | ({"b": b} if topic == "t" else {})


def rm(k, ts):
    return {"op": "rm", "k": k, "ts": ts}


@pytest.mark.parametrize(
    "changes, want",
    [
        ([up("k", 1, "a"), up("k", 2, "b")], {"k": "b"}),
        ([up("k", 2, "b"), up("k", 1, "a")], {"k": "b"}),  # arrival order never matters
        ([up("k", 1), rm("k", 2)], {}),
        ([rm("k", 2), up("k", 1)], {}),
        ([up("k", 1), rm("k", 2), up("k", 3, "c")], {"k": "c"}),  # re-created
        ([up("k", 2, "a"), rm("k", 2)], {}),  # equal times: the remove wins
        ([up("k", 2, "a"), up("k", 2, "b")], {"k": "b"}),  # then the greater non-key fields
        ([up("k", 2, "b", 1), up("k", 2, "b", 2)], {"k": "b"}),
        ([up("k", 2, None), up("k", 2, "a")], {"k": "a"}),  # null is smallest
        ([up("k", 2, "Z"), up("k", 2, "a")], {"k": "a"}),  # byte order
    ],
)
def test_current_table_greatest_time_then_remove_then_fields(changes, want):
    topic = TABLES.topics["t"]
    got = current_table(topic, [validate(topic, c) for c in changes])
    assert {k[0]: r["a"] for k, r in got.items()} == want


def test_equal_fields_decide_in_declared_order():
    topic = TABLES.topics["t"]
    got = current_table(topic, [validate(topic, c) for c in (up("k", 2, "a", 9), up("k", 2, "b", 1))])
    assert got[("k",)]["b"] == 1  # `a` is declared first


def test_final_deletes_whatever_the_times():
    topic = TABLES.topics["f"]
    changes = [up("k", 5, topic="f"), rm("k", 1), up("j", 1, topic="f")]
    assert list(current_table(topic, [validate(topic, c) for c in changes])) == [("j",)]


def test_versions_one_per_key_and_time():
    topic = TABLES.topics["t"]
    changes = [up("k", 1, "a"), up("k", 1, "b"), rm("k", 2), up("k", 3, "c")]
    got = versions(topic, [validate(topic, c) for c in changes])
    assert {v: r["op"] for v, r in got.items()} == {"k@1": "up", "k@2": "rm", "k@3": "up"}
    assert got["k@1"]["a"] == "b"


# --- interval --------------------------------------------------------------------------------------------------

INTERVAL = """
topics:
  l: {fields: {id: id, k: string, ts: timestamp}, optional: [k], id: id, time: ts}
  r: {fields: {rid: id, k: string, ts: timestamp}, id: rid, time: ts}
jobs:
  j:
    interval: {left: l, right: r, match: {k: k}, within: [0 ms, 10 ms], unmatched: UNMATCHED}
    views:
      rows: {row: {id: id}, fields: {k: k, m: matches}}
      n: {count: {k: "coalesce(k, '-')"}, values: {events: 1, matched: "if(matches > 0, 1, 0)"}}
"""


def L(i, ts, k="a"):
    return ("l", {"id": i, "k": k, "ts": ts})


def R(i, ts, k="a"):
    return ("r", {"rid": i, "k": k, "ts": ts})


def FAR(ts):
    """A right event of another key: it only moves the watermark."""
    return R(f"far{ts}", ts, "zz")


# (name, unmatched, arrivals, cuts, rows, counts, late); lateness 5 ms
# fmt: off
INTERVAL_CASES = [
    ("a match within the window, still open", True, [L("a", 100), R("x", 105)], [], {"a": 1}, {}, 0),
    ("both bounds are inclusive", True, [L("a", 100), R("x", 100), R("y", 110)], [], {"a": 2}, {}, 0),
    ("outside the window: no match", True, [L("a", 100), R("x", 99), R("y", 111)], [], {}, {}, 0),
    ("the right event first", True, [R("x", 105), L("a", 100)], [], {"a": 1}, {}, 0),
    ("unmatched: published once closed", True, [L("a", 100), FAR(116)], [], {"a": 0}, {"a": (1, 0)}, 0),
    ("closed means strictly past upper", True, [L("a", 100), FAR(115)], [], {}, {}, 0),
    ("a closed match is counted", True, [L("a", 100), R("x", 104), FAR(200)], [], {"a": 1}, {"a": (1, 1)}, 0),
    ("unmatched: false never shows 0", False, [L("a", 100), FAR(200)], [], {}, {}, 0),
    ("unmatched: false counts matches", False, [L("a", 100), R("x", 101), FAR(200)], [], {"a": 1}, {"a": (1, 1)}, 0),
    ("another key does not match", True, [L("a", 100), R("x", 105, "b"), FAR(200)], [], {"a": 0}, {"a": (1, 0)}, 0),
    ("a null key matches nothing", True, [L("a", 100, None), FAR(200)], [], {"a": 0}, {"-": (1, 0)}, 0),
    ("duplicates count once", True, [L("a", 100), L("a", 100), R("x", 101), R("x", 101)], [], {"a": 1}, {}, 0),
    ("late in a later batch: dropped", True, [FAR(200), L("a", 100)], [1], {}, {}, 1),
    ("late right event: no match", True, [L("a", 100), FAR(116), R("x", 105)], [2], {"a": 0}, {"a": (1, 0)}, 1),
    ("in the same batch: not late", True, [FAR(200), L("a", 100)], [], {"a": 0}, {"a": (1, 0)}, 0),
    ("at the watermark: not late", True, [FAR(105), L("a", 100), R("x", 101)], [1], {"a": 1}, {}, 0),
    ("the watermark spans both topics", True, [L("b", 300), L("a", 100)], [1], {}, {}, 1),
]
# fmt: on


@pytest.mark.parametrize("case", INTERVAL_CASES, ids=[c[0] for c in INTERVAL_CASES])
def test_interval(case):
    _, unmatched, arrivals, cuts, rows, counts, late = case
    p = pipeline(INTERVAL.replace("UNMATCHED", str(unmatched).lower()))
    got = brute_force(p, batches_of(arrivals, cuts), lateness_ms=5)
    assert {r["id"]: r["m"] for r in got.export("rows")} == rows
    assert {c["k"]: (c["events"], c["matched"]) for c in got.export("n")} == counts
    assert got.late == {"j": late}


def test_interval_query_says_final():
    p = pipeline(INTERVAL.replace("UNMATCHED", "true"))
    got = brute_force(p, batches_of([L("a", 100), R("x", 101), L("b", 150), FAR(200)]), lateness_ms=5)
    assert got.query("rows", "a", generation=3) == {
        "id": "a",
        "k": "a",
        "m": 1,
        "final": True,
        "generation": 3,
    }
    assert got.query("rows", "b") == {"id": "b", "k": "a", "m": 0, "final": True, "generation": 1}
    open_ = brute_force(p, batches_of([L("a", 100), R("x", 101)]), lateness_ms=5)
    assert open_.query("rows", "a")["final"] is False
    assert got.query("rows", "nobody") == {} and got.query("n", "nobody") == {}
    assert got.query("n", "a") == {"k": "a", "events": 2, "matched": 1, "generation": 1}


# --- asof ------------------------------------------------------------------------------------------------------

ASOF = """
topics:
  e: {fields: {eid: id, u: id, ts: timestamp, pv: id}, optional: [pv], id: eid, time: ts}
  t:
    fields: {u: id, name: string, ts: timestamp}
    key: u
    time: ts
    op: {upsert: up, remove: del}
jobs:
  j:
    asof: {stream: e, table: t, match: {u: u}, pin: pv}
    views:
      out: {log: {fields: {eid: eid, name: name, version: version, tts: t.ts}}}
      by: {count: {name: "coalesce(name, '-')"}, values: {n: 1}}
"""


def E(i, ts, u="u1", pv=None):
    return ("e", {"eid": i, "u": u, "ts": ts} | ({"pv": pv} if pv else {}))


def T(u, ts, name="a"):
    return ("t", {"op": "up", "u": u, "name": name, "ts": ts})


def D(u, ts):
    return ("t", {"op": "del", "u": u, "ts": ts})


CLOCK = T("clock", 10_000)

# (name, arrivals, cuts, {eid: (name, version)}, held); lateness 10 ms
# fmt: off
ASOF_CASES = [
    ("the version in force", [T("u1", 100), T("u1", 200, "b"), E("e1", 150), CLOCK], [], {"e1": ("a", "u1@100")}, 0),
    ("a change at the event's time", [T("u1", 100), T("u1", 150, "b"), E("e1", 150), CLOCK], [], {"e1": ("b", "u1@150")}, 0),
    ("before any version", [T("u1", 100), E("e1", 50), CLOCK], [], {"e1": (None, None)}, 0),
    ("never seen key", [E("e1", 50, "ghost"), CLOCK], [], {"e1": (None, None)}, 0),
    ("deleted", [T("u1", 100), D("u1", 120), E("e1", 150), CLOCK], [], {"e1": (None, None)}, 0),
    ("re-created", [T("u1", 100), D("u1", 120), T("u1", 140, "c"), E("e1", 150), CLOCK], [], {"e1": ("c", "u1@140")}, 0),
    ("a tie: the delete wins", [T("u1", 100), D("u1", 100), E("e1", 150), CLOCK], [], {"e1": (None, None)}, 0),
    ("a tie: the greater fields win", [T("u1", 100, "b"), T("u1", 100, "a"), E("e1", 150), CLOCK], [], {"e1": ("b", "u1@100")}, 0),
    ("pinned to an old version", [T("u1", 100), T("u1", 200, "b"), E("e1", 250, pv="u1@100"), CLOCK], [], {"e1": ("a", "u1@100")}, 0),
    ("pinned to another key", [T("u2", 100, "z"), E("e1", 250, pv="u2@100"), CLOCK], [], {"e1": ("z", "u2@100")}, 0),
    ("pinned to a delete", [T("u1", 100), D("u1", 200), E("e1", 250, pv="u1@200"), CLOCK], [], {"e1": (None, "u1@200")}, 0),
    ("pinned, never seen", [T("u1", 100), E("e1", 250, pv="u1@99"), CLOCK], [], {"e1": (None, "u1@99")}, 0),
    ("pinned to no version id", [T("u1", 100), E("e1", 250, pv="latest"), CLOCK], [], {"e1": (None, "latest")}, 0),
    ("held until the table's watermark", [T("u1", 100), E("e1", 195), T("u1", 200)], [], {}, 1),
    ("emitted at the watermark exactly", [T("u1", 100), E("e1", 195), T("u1", 205)], [], {"e1": ("a", "u1@100")}, 0),
    ("a stream event moves no watermark", [T("u1", 100), E("e1", 150), E("e2", 900)], [], {}, 2),
    ("a pin waits for its time", [T("u1", 100), E("e1", 100, pv="u1@300"), T("x", 305)], [], {}, 1),
    ("a pin found in a later batch", [T("u1", 100), E("e1", 100, pv="u1@300"), T("x", 305), T("u1", 300, "p")], [3], {"e1": ("p", "u1@300")}, 0),
    ("a held event in a later batch", [T("u1", 100), E("e1", 150), CLOCK], [2], {"e1": ("a", "u1@100")}, 0),
    ("emitted events do not see later changes", [T("u1", 100), T("z", 500), E("e1", 150), T("u1", 120, "b")], [3], {"e1": ("a", "u1@100")}, 0),
    ("...which the same batch would have used", [T("u1", 100), T("z", 500), E("e1", 150), T("u1", 120, "b")], [], {"e1": ("b", "u1@120")}, 0),
    ("a duplicate event once", [T("u1", 100), E("e1", 150), E("e1", 150), CLOCK, E("e1", 150)], [4], {"e1": ("a", "u1@100")}, 0),
]
# fmt: on


@pytest.mark.parametrize("case", ASOF_CASES, ids=[c[0] for c in ASOF_CASES])
def test_asof(case):
    _, arrivals, cuts, want, held = case
    got = brute_force(pipeline(ASOF), batches_of(arrivals, cuts), lateness_ms=10)
    lines = got.export("out")
    assert {r["eid"]: (r["name"], r["version"]) for r in lines} == want
    assert got.held == {"j": held}
    assert sum(c["n"] for c in got.export("by")) == len(want)


def test_asof_log_lines_are_ordered_by_the_stream_id_and_see_the_table_fields():
    arrivals = [T("u1", 100), E("b", 150), E("a", 160), E("c", 170, "ghost"), CLOCK]
    got = brute_force(pipeline(ASOF), batches_of(arrivals), lateness_ms=10)
    assert got.export("out") == [
        {"eid": "a", "name": "a", "version": "u1@100", "tts": 100},
        {"eid": "b", "name": "a", "version": "u1@100", "tts": 100},
        {"eid": "c", "name": None, "version": None, "tts": None},
    ]
    assert got.export("by") == [{"name": "-", "n": 1}, {"name": "a", "n": 2}]
    with pytest.raises(BruteError, match="log view"):
        got.query("out", "a")


def test_asof_composite_key_versions_join_the_values_with_a_bar():
    p = pipeline(
        """
        topics:
          e: {fields: {eid: id, shop: id, n: long, ts: timestamp, pv: id}, optional: [pv], id: eid, time: ts}
          t: {fields: {n: long, shop: id, label: string, ts: timestamp}, key: [shop, n], time: ts}
        jobs:
          j:
            asof: {stream: e, table: t, match: {"n + 1": n, shop: shop}, pin: pv}
            views:
              out: {log: {fields: {eid: eid, label: label, version: version}}}
        """
    )
    arrivals = [
        ("t", {"n": 8, "shop": "s", "label": "eight", "ts": 10}),
        ("e", {"eid": "e1", "shop": "s", "n": 7, "ts": 20}),
        ("e", {"eid": "e2", "shop": "s", "n": 0, "ts": 20, "pv": "s|8@10"}),
        ("t", {"n": 0, "shop": "clock", "label": "-", "ts": 9_000_000}),
    ]
    got = brute_force(p, batches_of(arrivals))
    assert got.export("out") == [
        {"eid": "e1", "label": "eight", "version": "s|8@10"},
        {"eid": "e2", "label": "eight", "version": "s|8@10"},
    ]


# --- join ------------------------------------------------------------------------------------------------------

JOIN = """
topics:
  o:
    fields: {oid: id, cid: id, amt: double, ts: timestamp}
    key: oid
    time: ts
    op: {upsert: open, remove: close}
  cust:
    fields: {cid: id, tier: string, ts: timestamp}
    key: cid
    time: ts
    op: {upsert: up, remove: del}
jobs:
  j:
    join: {left: o, right: cust, match: {cid: cid}}
    views:
      rows: {row: {oid: oid}, fields: {tier: tier, amt: amt, cts: cust.ts}}
      by_tier: {count: {tier: tier}, values: {n: 1, amt: amt}, where: "amt >= 0"}
      top: {list: {cid: cust.cid}, entry: oid, order: [ts desc, oid desc], cap: 2, fields: {oid: oid, ts: ts},
            entries: oids, items: orders}
      by_customer: {row: {cid: cid}, fields: {amt: amt, oid: oid}}
"""


def OPEN(oid, ts, cid="c1", amt=1.0):
    return ("o", {"op": "open", "oid": oid, "cid": cid, "amt": amt, "ts": ts})


def CLOSE(oid, ts):
    return ("o", {"op": "close", "oid": oid, "ts": ts})


def C(cid, ts, tier="gold"):
    return ("cust", {"op": "up", "cid": cid, "tier": tier, "ts": ts})


def CD(cid, ts):
    return ("cust", {"op": "del", "cid": cid, "ts": ts})


# (name, arrivals, rows {oid: tier}, counts {tier: n}, lists {cid: [oids]})
# fmt: off
JOIN_CASES = [
    ("inner join", [OPEN("o1", 1), C("c1", 1), OPEN("o2", 2, "c2")], {"o1": "gold"}, {"gold": 1}, {"c1": ["o1"]}),
    ("a closed order leaves", [OPEN("o1", 1), C("c1", 1), CLOSE("o1", 5)], {}, {}, {}),
    ("a close before its open in time", [CLOSE("o1", 0), OPEN("o1", 1), C("c1", 1)], {"o1": "gold"}, {"gold": 1}, {"c1": ["o1"]}),
    ("a close at the open's time wins", [OPEN("o1", 1), CLOSE("o1", 1), C("c1", 1)], {}, {}, {}),
    ("a deleted customer leaves", [OPEN("o1", 1), C("c1", 1), CD("c1", 3)], {}, {}, {}),
    ("a tier change moves the count", [OPEN("o1", 1), C("c1", 1), C("c1", 4, "silver")], {"o1": "silver"}, {"silver": 1}, {"c1": ["o1"]}),
    ("an older change changes nothing", [OPEN("o1", 1), C("c1", 4, "silver"), C("c1", 1)], {"o1": "silver"}, {"silver": 1}, {"c1": ["o1"]}),
    ("the list keeps the newest cap, refilled", [C("c1", 0), OPEN("o1", 1), OPEN("o2", 2), OPEN("o3", 3), CLOSE("o3", 9)],
     {"o1": "gold", "o2": "gold"}, {"gold": 2}, {"c1": ["o2", "o1"]}),
    ("list ties by entry in the same direction", [C("c1", 0), OPEN("a", 5), OPEN("c", 5), OPEN("b", 5)],
     {"a": "gold", "b": "gold", "c": "gold"}, {"gold": 3}, {"c1": ["c", "b"]}),
    ("where filters the count", [C("c1", 0), OPEN("o1", 1, amt=-5.0), OPEN("o2", 1)],
     {"o1": "gold", "o2": "gold"}, {"gold": 1}, {"c1": ["o2", "o1"]}),
]
# fmt: on


@pytest.mark.parametrize("case", JOIN_CASES, ids=[c[0] for c in JOIN_CASES])
def test_join(case):
    _, arrivals, rows, counts, lists = case
    p = pipeline(JOIN)
    for cuts in ([], list(range(1, len(arrivals)))):  # batches never matter to a join
        got = brute_force(p, batches_of(arrivals, cuts))
        assert {r["oid"]: r["tier"] for r in got.export("rows")} == rows
        assert {c["tier"]: c["n"] for c in got.export("by_tier")} == counts
        assert {x["cid"]: x["oids"] for x in got.export("top")} == lists


def test_join_count_values_sum_and_a_key_of_zeros_is_absent():
    p = pipeline(JOIN)
    got = brute_force(
        p, batches_of([C("c1", 0), OPEN("o1", 1, amt=2.5), OPEN("o2", 1, amt=0.0), CLOSE("o1", 3)])
    )
    assert got.export("by_tier") == [{"tier": "gold", "n": 1, "amt": 0.0}]
    got = brute_force(p, batches_of([C("c1", 0), OPEN("o1", 1, amt=0.0), CLOSE("o1", 2)]))
    assert got.export("by_tier") == []


def test_row_view_the_greatest_fields_win_a_shared_key():
    got = brute_force(
        pipeline(JOIN), batches_of([C("c1", 0), OPEN("o1", 1, amt=3.0), OPEN("o2", 1, amt=9.0)])
    )
    assert got.export("by_customer") == [{"cid": "c1", "amt": 9.0, "oid": "o2"}]
    assert got.export("rows")[0] == {"oid": "o1", "tier": "gold", "amt": 3.0, "cts": 0}


def test_list_query_gives_the_fields_and_an_empty_key_nothing():
    got = brute_force(pipeline(JOIN), batches_of([C("c1", 0), OPEN("o1", 1), OPEN("o2", 2)]))
    assert got.query("top", "c1") == {
        "cid": "c1",
        "generation": 1,
        "orders": [{"oid": "o2", "ts": 2}, {"oid": "o1", "ts": 1}],
    }
    assert got.query("top", "c1", limit=1)["orders"] == [{"oid": "o2", "ts": 2}]
    assert got.query("top", "nobody") == {}  # as a row's and a count's key with no entry
    assert got.query("rows", "o1") == {"oid": "o1", "tier": "gold", "amt": 1.0, "cts": 0, "generation": 1}


# --- select and agg ---------------------------------------------------------------------------------------------

SELECT = """
topics:
  ride:
    fields: {rid: id, city: string, rider: id, fare: double, stops: long, rating: long, ts: timestamp}
    optional: [rating]
    id: rid
    time: ts
  dock:
    fields: {did: id, zone: string, bikes: long, ts: timestamp}
    key: did
    time: ts
    op: {upsert: set, remove: gone}
  badge:
    fields: {bid: id, holder: string, ts: timestamp}
    key: bid
    time: ts
    op: {upsert: issue, remove: revoke}
    final_deletes: true
jobs:
  rides:
    select: {from: ride}
    views:
      ride_row: {row: {rid: rid}, fields: {city: city, fare: fare}}
      ride_log: {log: {fields: {rid: rid, fare: fare, rating: rating}}, where: "fare > 0"}
      by_city:
        agg: {city: city}
        values: {rides: "count(*)", riders: "count(distinct rider)", rated: "count(rating)", fare: "sum(fare)",
                 low: "min(fare)", high: "max(stops)", mean: "avg(rating)", cheap: "sum(if(fare < 10, 1, 0))",
                 late_riders: "count(distinct if(ts > 100, rider, null))"}
        where: "city != 'nowhere'"
  docks:
    select: {from: dock}
    views:
      by_zone: {agg: {zone: zone}, values: {docks: "count(*)", bikes: "sum(bikes)", most: "max(bikes)",
                                           least: "min(bikes)"}}
      zone_count: {count: {zone: zone}, values: {docks: 1, bikes: bikes}}
  badges:
    select: {from: badge}
    views:
      holders: {row: {holder: holder}, fields: {bid: bid, ts: ts}}
"""


def RIDE(rid, ts, city="oslo", rider="u1", fare=5.0, stops=1, rating=None):
    rec = {"rid": rid, "city": city, "rider": rider, "fare": fare, "stops": stops, "ts": ts}
    return ("ride", rec if rating is None else {**rec, "rating": rating})


def DOCK(did, ts, zone="z1", bikes=3):
    return ("dock", {"op": "set", "did": did, "zone": zone, "bikes": bikes, "ts": ts})


def GONE(did, ts):
    return ("dock", {"op": "gone", "did": did, "ts": ts})


def select_pipeline():
    return pipeline(SELECT)


def test_a_select_of_events_gives_each_id_once_the_earliest_batchs_copy_then_the_smallest():
    p = select_pipeline()
    arrivals = [RIDE("r1", 10, fare=7.0), RIDE("r1", 10, fare=3.0), RIDE("r2", 5), RIDE("r1", 1, fare=1.0)]
    one = brute_force(p, batches_of(arrivals))  # one batch: the smallest by (time, other fields) of all three
    assert one.export("ride_row") == [
        {"rid": "r1", "city": "oslo", "fare": 1.0},
        {"rid": "r2", "city": "oslo", "fare": 5.0},
    ]
    two = brute_force(p, batches_of(arrivals, [3]))  # the first batch's smallest copy, the later one ignored
    assert two.export("ride_row")[0] == {"rid": "r1", "city": "oslo", "fare": 3.0}
    # late records are kept (nothing closes in a select), the log holds the selected events by id
    late = brute_force(p, batches_of([RIDE("r9", 10**9, rating=4), RIDE("r0", 0, fare=2.0)], [1]))
    assert late.export("ride_log") == [
        {"rid": "r0", "fare": 2.0, "rating": None},
        {"rid": "r9", "fare": 5.0, "rating": 4},
    ]


def test_agg_of_an_event_select_every_form_nulls_kept_and_where():
    p = select_pipeline()
    arrivals = [
        RIDE("a", 50, rider="u1", fare=12.5, stops=2, rating=5),
        RIDE("b", 150, rider="u1", fare=4.0, stops=7),
        RIDE("c", 200, rider="u2", fare=8.25, stops=1, rating=2),
        RIDE("c", 200, rider="u2", fare=8.25, stops=1, rating=2),  # delivered twice: one effect
        RIDE("d", 10, city="rome", rider="u3", fare=3.0, stops=4),
        RIDE("e", 10, city="nowhere"),
    ]
    got = brute_force(p, batches_of(arrivals, [2, 4]))
    assert got.export("by_city") == [
        {"city": "oslo", "rides": 3, "riders": 2, "rated": 2, "fare": 24.75, "low": 4.0, "high": 7,
         "mean": 3.5, "cheap": 2, "late_riders": 2},
        {"city": "rome", "rides": 1, "riders": 1, "rated": 0, "fare": 3.0, "low": 3.0, "high": 4,
         "mean": None, "cheap": 1, "late_riders": 0},
    ]  # fmt: skip
    assert got.query("by_city", "rome", generation=3) == {**got.export("by_city")[1], "generation": 3}
    assert got.query("by_city", "nowhere") == {}  # `where` left its only row out: absent
    assert isinstance(got.export("by_city")[0]["mean"], float)


def test_agg_of_a_table_select_follows_updates_moves_and_removes():
    p = select_pipeline()
    arrivals = [
        DOCK("d1", 1, bikes=9),
        DOCK("d2", 1, bikes=4),
        DOCK("d3", 1, zone="z2", bikes=0),
        DOCK("d1", 5, zone="z2", bikes=9),  # moves d1 to z2: z1's max is the next greatest
        GONE("d2", 0),  # an older remove changes nothing
        DOCK("d3", 7, zone="z2", bikes=2),
        GONE("d3", 7),  # a remove at an upsert's time wins
        DOCK("d4", 2, zone="z3", bikes=1),
        GONE("d4", 8),  # the zone's only row leaves: absent
    ]
    for cuts in ([], [3, 6]):  # a table's rows never depend on the batches
        got = brute_force(p, batches_of(arrivals, cuts))
        assert got.export("by_zone") == [
            {"zone": "z1", "docks": 1, "bikes": 4, "most": 4, "least": 4},
            {"zone": "z2", "docks": 1, "bikes": 9, "most": 9, "least": 9},
        ]
        assert got.export("zone_count") == [
            {"zone": "z1", "docks": 1, "bikes": 4},
            {"zone": "z2", "docks": 1, "bikes": 9},
        ]


def test_a_select_of_a_final_deletes_table_keeps_no_removed_key():
    p = select_pipeline()
    up = [("badge", {"op": "issue", "bid": b, "holder": h, "ts": t}) for b, h, t in
          [("b1", "ann", 5), ("b2", "ann", 9), ("b3", "bob", 1)]]  # fmt: skip
    got = brute_force(p, batches_of([*up, ("badge", {"op": "revoke", "bid": "b2", "ts": 1})]))
    assert got.export("holders") == [  # b2's remove is older, yet final: ann's greatest row is b1
        {"holder": "ann", "bid": "b1", "ts": 5},
        {"holder": "bob", "bid": "b3", "ts": 1},
    ]


def test_agg_values_refused_or_typed_by_the_brute_force():
    p = pipeline(SELECT.replace('least: "min(bikes)"', 'least: "sum(zone)"'))
    with pytest.raises(ExprError, match="sums a string"):
        brute_force(p, batches_of([DOCK("d1", 1)]))
    p = pipeline(SELECT.replace('least: "min(bikes)"', 'least: "min(zone)"'))
    docks = [DOCK("d1", 1, zone="b"), DOCK("d2", 1, zone="b"), DOCK("d3", 2, zone="a", bikes=-1)]
    got = brute_force(p, batches_of(docks))
    assert got.export("by_zone") == [
        {"zone": "a", "docks": 1, "bikes": -1, "most": -1, "least": "a"},
        {"zone": "b", "docks": 2, "bikes": 6, "most": 3, "least": "b"},
    ]
    with pytest.raises(ExprError, match="overflows a bigint"):
        brute_force(p, batches_of([DOCK("d1", 1, bikes=2**62), DOCK("d2", 1, bikes=2**62)]))


# --- views: keys, where, errors ----------------------------------------------------------------------------------


def test_keys_are_strings_sorted_by_bytes_and_null_keys_are_left_out():
    p = pipeline(
        """
        topics:
          l: {fields: {id: id, g: long, x: double, ts: timestamp}, optional: [g], id: id, time: ts}
          r: {fields: {id: id, ts: timestamp}, id: id, time: ts}
        jobs:
          j:
            interval: {left: l, right: r, match: {id: id}, within: [0 s, 1 s], unmatched: true}
            views:
              by_g: {count: {g: g}, values: {n: 1, x: x}}
              by_x: {row: {x: x}, fields: {id: id}}
        """
    )
    recs = [
        ("l", {"id": f"e{i}", "g": g, "x": x, "ts": 0})
        for i, (g, x) in enumerate([(10, 0.5), (9, 2.0), (None, 1e7)])
    ]
    got = brute_force(p, batches_of([*recs, ("r", {"id": "far", "ts": 10**9})]))
    assert got.export("by_g") == [{"g": "10", "n": 1, "x": 0.5}, {"g": "9", "n": 1, "x": 2.0}]
    assert [r["x"] for r in got.export("by_x")] == ["0.5", "1.0E7", "2.0"]


def test_an_expression_outside_the_language_is_refused_by_name():
    p = pipeline(JOIN.replace('where: "amt >= 0"', "where: \"tier RLIKE 'g.*'\""))
    with pytest.raises(ExprError, match="RLIKE"):
        brute_force(p, batches_of([C("c1", 0)]))


def test_unknown_topics_and_views_are_errors_and_bad_records_are_counted():
    p = pipeline(JOIN)
    with pytest.raises(BruteError, match="unknown topic"):
        brute_force(p, [{"nope": []}])
    got = brute_force(p, [{"o": ["{", "", "  ", b'{"op":"open"}', OPEN("o1", 1)[1]]}])
    assert got.accepted["o"] == 1 and got.rejected["o"] == 2 and len(got.reasons["o"]) == 2
    with pytest.raises(BruteError, match="unknown view"):
        got.export("nope")


def test_batches_from_dir_reads_a_generators_layout(tmp_path):
    p = pipeline(JOIN)
    (tmp_path / "o-0000.jsonl").write_bytes(orjson.dumps(OPEN("o1", 1)[1]) + b"\n")
    (tmp_path / "cust-0000.jsonl").write_text("")
    (tmp_path / "cust-0001.jsonl").write_bytes(orjson.dumps(C("c1", 1)[1]) + b"\n\n")
    (tmp_path / "other-0000.jsonl").write_text("x\n")
    got = batches_from_dir(p, tmp_path)
    assert [sorted(b) for b in got] == [["cust", "o"], ["cust"]]
    assert brute_force(p, got).export("top") == [{"cid": "c1", "oids": ["o1"]}]


# --- the built-in pipeline against the existing references ------------------------------------------------------


@pytest.fixture(scope="module")
def builtin():
    p = load_pipeline("timeline_demo/pipelines/builtin.yml", env={"TIMELINE_CAP": "25", "FANOUT_LIMIT": ""})
    tw = generate(seed=3, users=80, celebrities=2, follows=900, tweets=900)
    cw = generate_clicks(seed=4, sessions=80)
    ew = generate_enrichment(seed=5)
    arrivals = (
        [("tweets", r) for r in tw.tweets] + [("follows", r) for r in tw.follows] + cw.arrivals + ew.records
    )
    return p, tw, cw, ew, arrivals


@pytest.mark.parametrize("pieces", [1, 3, 11])
def test_builtin_pipeline_equals_the_existing_references(builtin, pieces):
    p, tw, cw, ew, arrivals = builtin
    cuts = random.Random(pieces).sample(range(1, len(arrivals)), pieces - 1)
    got = brute_force(p, batches_of(arrivals, cuts), lateness_ms=600_000)
    timelines = expected_timelines(tw.tweets, tw.follows, 25)
    assert got.export("timeline") == [
        {"user_id": u, "tweet_ids": ids} for u, ids in sorted(timelines.items())
    ]
    search_clicks, ctr = expected_clicks(cw.searches, cw.clicks, 600_000)
    assert got.export("search_clicks") == [search_clicks[k] for k in sorted(search_clicks)]
    assert got.export("ctr") == [ctr[k] for k in sorted(ctr)]
    enriched = expected_enriched(ew.profiles, ew.activity)
    assert got.export("enriched_activity") == [enriched[k] for k in sorted(enriched)]
    by_country = expected_by_country(enriched)
    assert got.export("activity_by_country") == [{"country": c, "events": n} for c, n in by_country.items()]
    assert got.late == {"clicks": 0} and got.held == {"enrichment": 0}
    assert sum(got.rejected.values()) == 0


def test_builtin_query_results_have_the_contract_shapes(builtin):
    p, tw, cw, ew, arrivals = builtin
    got = brute_force(p, batches_of(arrivals))
    user = got.keys("timeline")[0]
    q = got.query("timeline", user, limit=2)
    assert list(q) == ["user_id", "generation", "tweets"] and len(q["tweets"]) == 2
    assert set(q["tweets"][0]) == {"tweet_id", "user_id", "text", "ts"}
    search = got.keys("search_clicks")[0]
    assert list(got.query("search_clicks", search)) == [
        "search_id",
        "session_id",
        "query",
        "ts",
        "clicked",
        "clicks",
        "final",
        "generation",
    ]
    assert got.query("ctr", "no such query") == {}
