"""The Nexmark pipeline file and its seeded generator (`timeline_demo.nexmark`): the file loads with its topics and
queries, the generator is deterministic, keeps Nexmark's 1:3:46 proportions and its hot sellers, bidders and auctions, and
its faults (bad lines, duplicates, late events) are what the brute force sees. q3 and q8 are also computed here
straight from Nexmark's SQL, to check that the views say what the queries say (`test_nexmark_sql` checks every query
against its SQL in DuckDB)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from tests.timeline_demo.e2ehelp import only
from timeline_demo.brute import batches_from_dir, brute_force, parse_time
from timeline_demo.nexmark import PIPELINE, PROPORTIONS, T0, generate_nexmark, kind_of, main
from views.pipeline import load_pipeline

JOBS = ("q3", "q8", "q13", "q20")  # the four join kinds; `test_nexmark_sql` compares every query with its SQL


@pytest.fixture(scope="module")
def feed():
    return generate_nexmark(events=10_000, seed=7, rate=500, side_rows=1_300, moves=0.2)


def plain(feed, topic):
    """The topic's valid records before the tail (the late and clock records)."""
    return [
        r for t, r in feed.arrivals[: len(feed.arrivals) - feed.tail] if t == topic and isinstance(r, dict)
    ]


def firsts(feed, topic):
    """The topic's records as events: the first of each id (a later one is a redelivery; a person's move)."""
    out = {}
    for r in plain(feed, topic):
        out.setdefault(r["id"], r)
    return list(out.values())


def test_the_file_loads_with_its_topics_and_the_four_join_kinds():
    p = load_pipeline(PIPELINE)
    assert {j: p.jobs[j].kind for j in ("q0", "q3", "q4", "q8", "q13", "q20")} == {
        "q0": "select",
        "q3": "join",
        "q4": "select",
        "q8": "interval",
        "q13": "asof",
        "q20": "join",
    }
    assert {
        v: p.views[v].kind for v in ("q0_bids", "q5_bids_per_window", "q9_winning_bids", "q19_top_bids")
    } == {
        "q0_bids": "log",
        "q5_bids_per_window": "agg",
        "q9_winning_bids": "row",
        "q19_top_bids": "list",
    }
    assert {t.name: t.kind for t in p.topics.values()} == {
        "persons": "event",
        "auctions": "event",
        "bids": "event",
        "person_table": "table",
        "auction_table": "table",
        "bid_table": "table",
        "side_input": "table",
        "q4_finals": "table",
        "q5_counts": "table",
        "q5_max": "table",
        "q7_max": "table",
    }
    assert {n: t.source for n, t in p.topics.items() if t.source and not n.startswith("q")} == {
        "person_table": "persons",
        "auction_table": "auctions",
        "bid_table": "bids",
    }
    assert list(p.written) == ["persons", "auctions", "bids", "side_input"]


def test_deterministic_per_seed():
    a = generate_nexmark(events=2_000, seed=3, duplicates=0.02, bad=0.01, late=4, side_rows=10)
    b = generate_nexmark(events=2_000, seed=3, duplicates=0.02, bad=0.01, late=4, side_rows=10)
    c = generate_nexmark(events=2_000, seed=4, duplicates=0.02, bad=0.01, late=4, side_rows=10)
    assert a.arrivals == b.arrivals and a.arrivals != c.arrivals


def test_proportions_one_three_forty_six(feed):
    counts = {
        t: len(firsts(feed, t) if t != "bids" else plain(feed, t)) for t in ("persons", "auctions", "bids")
    }
    n = 10_000 // sum(PROPORTIONS)
    assert counts == {"persons": n, "auctions": 3 * n, "bids": 46 * n}
    assert Counter(kind_of(i) for i in range(50)) == {"person": 1, "auction": 3, "bid": 46}


def test_ids_are_strings_counted_from_1000(feed):
    persons, auctions, bids = firsts(feed, "persons"), firsts(feed, "auctions"), plain(feed, "bids")
    assert sorted(int(p["id"]) for p in persons) == list(range(1000, 1000 + len(persons)))
    assert sorted(int(a["id"]) for a in auctions) == list(range(1000, 1000 + len(auctions)))
    assert all(isinstance(b["auction"], str) and isinstance(b["bidder"], str) for b in bids)
    assert {a["category"] for a in auctions} == {10, 11, 12, 13, 14}
    assert {p["state"] for p in persons} == {"AZ", "CA", "ID", "OR", "WA", "WY"}


def test_hot_sellers_bidders_and_auctions(feed):
    auctions, bids = plain(feed, "auctions"), plain(feed, "bids")
    hot_sellers = sum((int(a["seller"]) - 1000) % 100 == 0 for a in auctions) / len(auctions)
    hot_auctions = sum((int(b["auction"]) - 1000) % 100 == 0 for b in bids) / len(bids)
    hot_bidders = sum((int(b["bidder"]) - 1000) % 100 == 1 for b in bids) / len(bids)
    assert 0.70 < hot_sellers < 0.80  # 3/4 (hotSellersRatio 4)
    assert 0.45 < hot_auctions < 0.56  # 1/2 (hotAuctionRatio 2)
    assert 0.70 < hot_bidders < 0.80  # 3/4 (hotBiddersRatio 4)
    top_seller, n = Counter(a["seller"] for a in auctions).most_common(1)[0]
    assert n > 0.05 * len(auctions)


def test_times_increase_with_bounded_jitter_and_persons_move_later(feed):
    newest = 0
    for topic in ("persons", "auctions", "bids"):
        for r in firsts(feed, topic) if topic != "bids" else plain(feed, topic):
            t = parse_time(r["dateTime"])
            assert t >= T0 and t >= newest - 3000
            newest = max(newest, t) if topic == "bids" else newest
    persons, first = plain(feed, "persons"), {r["id"]: r for r in reversed(plain(feed, "persons"))}
    moved = [r for r in persons if r is not first[r["id"]]]
    assert 0.1 * len(first) < len(moved) < 0.3 * len(first)
    for r in moved:  # a later record of the same person, in another place, after the first's arrival
        assert 3000 < parse_time(r["dateTime"]) - parse_time(first[r["id"]]["dateTime"]) <= 33_000
        assert persons.index(r) > persons.index(first[r["id"]])
    assert len(firsts(feed, "auctions")) == len(plain(feed, "auctions"))  # auctions do not change
    assert [r for t, r in feed.arrivals[-feed.tail :]] == [r for t, r in feed.arrivals[-2:]]  # the clock
    assert {t for t, _ in feed.arrivals[-2:]} == {"auctions", "side_input"}
    assert not {t for t, _ in feed.arrivals} & {"person_table", "auction_table"}  # read from, never written


def test_the_views_say_what_nexmarks_sql_says(feed):
    """q3 and q8 computed from the records with Nexmark's SQL in plain Python equal the brute force's views."""
    p = only(load_pipeline(PIPELINE), JOBS)
    got = brute_force(p, feed.batches(3))
    persons = {}
    for r in plain(
        feed, "persons"
    ):  # person_table, the current table: the greatest dateTime wins (no ties here)
        if r["id"] not in persons or parse_time(r["dateTime"]) > parse_time(persons[r["id"]]["dateTime"]):
            persons[r["id"]] = r
    q3 = {
        a["id"]: (persons[a["seller"]]["name"], persons[a["seller"]]["city"], persons[a["seller"]]["state"])
        for a in plain(feed, "auctions")
        if a["category"] == 10
        and a["seller"] in persons
        and persons[a["seller"]]["state"] in ("OR", "ID", "CA")
    }
    assert q3 and {r["id"]: (r["name"], r["city"], r["state"]) for r in got.export("q3_auctions")} == q3
    assert sum(c["auctions"] for c in got.export("q3_by_state")) == len(q3)
    windows = defaultdict(set)
    for a in plain(feed, "auctions"):
        windows[(a["seller"], parse_time(a["dateTime"]) // 10_000)].add(a["id"])
    q8 = {}
    for r in firsts(feed, "persons"):  # each person as first written (a move is a redelivery)
        start = parse_time(r["dateTime"]) // 10_000
        if windows.get((r["id"], start)):
            q8[r["id"]] = (r["name"], start * 10_000, len(windows[(r["id"], start)]))
    assert (
        q8
        and {r["id"]: (r["name"], r["starttime"], r["auctions"]) for r in got.export("q8_new_sellers")} == q8
    )
    assert sum(c["new_sellers"] for c in got.export("q8_by_window")) == len(q8)  # every window closed
    assert got.held == {"q13": 0}
    q20 = got.export("q20_bids")
    categories = {a["id"]: a["category"] for a in plain(feed, "auctions")}
    assert q20 and len(q20) == sum(categories.get(b["auction"]) == 10 for b in plain(feed, "bids"))
    assert sum(c["bids"] for c in got.export("q20_by_auction")) == len(q20)
    q13 = got.export("q13_bids")  # the bids whose key the side table (keys 0-1299; auctions from 1000) holds
    assert 0 < len(q13) == sum(int(b["auction"]) % 10_000 < 1_300 for b in plain(feed, "bids")) < len(q20) * 5
    assert all(r["value"] == str(int(r["auction"]) % 10_000) for r in q13)


@pytest.mark.parametrize("chunks, late", [(1, 0), (3, 6)])
def test_faults_reach_the_brute_force(tmp_path, chunks, late):
    """Bad lines are rejected; duplicates change nothing; late persons and auctions are dropped by q8 when they come
    in a later batch than the events that moved the watermark (one batch: none is late)."""
    clean = generate_nexmark(events=3_000, seed=5, rate=500, side_rows=1_500)
    noisy = generate_nexmark(
        events=3_000, seed=5, rate=500, side_rows=1_500, duplicates=0.05, bad=0.02, late=6
    )
    assert noisy.counts["bad"] > 0 and noisy.counts["duplicates"] > 0
    code = main(
        [
            *(
                "--events",
                "3000",
                "--seed",
                "5",
                "--rate",
                "500",
                "--side-rows",
                "1500",
                "--duplicates",
                "0.05",
            ),
            *("--bad", "0.02", "--late", "6", "--chunks", str(chunks), "--out", str(tmp_path)),
        ]
    )
    assert code == 0
    p = only(load_pipeline(PIPELINE), JOBS)
    got = brute_force(p, batches_from_dir(p, tmp_path))
    want = brute_force(p, clean.batches(chunks))
    assert sum(got.rejected.values()) == noisy.counts["bad"]
    assert got.late == {"q8": late * 2 // 3 if chunks > 1 else 0}
    for view in ("q8_new_sellers", "q8_by_window", "q20_by_auction"):
        assert got.export(view) == want.export(view)
    assert len(want.export("q13_bids")) > 0
    assert len(got.export("q13_bids")) == len(want.export("q13_bids")) + 2  # the 2 late bids are enriched


def test_cli_summary(tmp_path, capsys):
    assert (
        main(["--events", "500", "--seed", "1", "--out", str(tmp_path), "--side-rows", "5", "--no-close"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["files"]) == sorted(load_pipeline(PIPELINE).written)
    assert out["counts"]["events"] == 500 and out["counts"]["clock"] == 0
    assert (tmp_path / "bids.jsonl").stat().st_size > 0


def test_the_streaming_writer_writes_the_same_files(tmp_path):
    from timeline_demo.nexmark import write_nexmark

    kw = {"events": 4_000, "seed": 2, "rate": 2_000, "moves": 0.3, "side_rows": 20}
    generate_nexmark(**kw).write(tmp_path / "memory")
    summary = write_nexmark(tmp_path / "stream", **kw)
    for topic, (path,) in summary["files"].items():
        assert (tmp_path / "memory" / f"{topic}.jsonl").read_bytes() == open(path, "rb").read(), topic
    assert summary["counts"] == generate_nexmark(**kw).counts
