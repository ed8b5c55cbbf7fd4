"""The peers part's pure pieces: Flink's changelog (+I, -U, +U, -D) made into final rows (`bench.flink_side`), its
queries named as our results are (`timeline_demo.nexmark_sql`), the clicks comparison, and the part's rows in the
bench table (`bench.report`). No Flink runs here: it is an optional extra (`make peers-setup`); the part itself
runs in `make bench`."""

from __future__ import annotations

import ast
import datetime
import decimal
import sys
from pathlib import Path

import pytest

from bench import flink_side
from bench.flink_side import QUERIES, SKIPPED, materialize, plain
from bench.peers import _compare_clicks
from bench.report import COLUMNS, markdown_table, table_rows
from timeline_demo.nexmark_sql import NOT_EXPRESSED
from timeline_demo.nexmark_sql import QUERIES as OURS

NAMES = ("id", "final")


def test_a_changelog_leaves_its_final_rows():
    changes = [
        ("+I", (10, 5)),
        ("+I", (11, 7)),
        ("-U", (10, 5)),
        ("+U", (10, 9)),
        ("+I", (12, 1)),
        ("-D", (12, 1)),
        ("+I", (13, 2)),
        ("+I", (13, 2)),  # a multiset: two equal rows stay two
    ]
    got = materialize(changes, NAMES)
    assert sorted((r["id"], r["final"]) for r in got) == [(10, 9), (11, 7), (13, 2), (13, 2)]
    assert all(set(r) == set(NAMES) for r in got)


def test_the_order_of_the_changes_does_not_matter_across_files():
    # One file per sink task, read one after the other: a retraction may come before its row.
    assert materialize([("-U", (1, 1)), ("+U", (1, 2)), ("+I", (1, 1))], NAMES) == [{"id": 1, "final": 2}]


@pytest.mark.parametrize(
    "changes", [[("-D", (1, 1))], [("+I", (1, 1)), ("-U", (1, 1)), ("-D", (1, 1))], [("?", (1, 1))]]
)
def test_a_retraction_of_a_row_not_there_or_an_unknown_kind_is_an_error(changes):
    with pytest.raises(ValueError):
        materialize(changes, NAMES)


def test_timestamps_are_epoch_ms_and_decimals_floats():
    utc = datetime.datetime(2026, 1, 1, 0, 0, 0, 5000, tzinfo=datetime.timezone.utc)
    assert plain(utc) == plain(utc.replace(tzinfo=None)) == 1_767_225_600_005
    assert plain(decimal.Decimal("7405.648")) == 7405.648
    assert plain("x") == "x" and plain(None) is None
    assert flink_side._timestamp("2026-01-01 00:00:00.005") == 1_767_225_600_005
    assert flink_side._timestamp("2026-01-01 00:00:00") == 1_767_225_600_000


def test_flinks_queries_are_ours_named_as_our_results_are():
    assert set(QUERIES) | set(SKIPPED) == {f"q{n}" for n in range(23)}
    assert set(SKIPPED) == set(NOT_EXPRESSED)
    for q in QUERIES:
        assert flink_side._names(q) == OURS[q].columns, q
    # The INSERT of q7 is positional: B.price lands in the sink's `bidder`; named by what the columns hold.
    assert flink_side._names("q7")[1:3] == ("price", "bidder")
    assert (
        flink_side._columns("a BIGINT, price DECIMAL(23, 3), b VARCHAR")[1].strip() == "price DECIMAL(23, 3)"
    )


def test_the_flink_side_imports_only_pyflink_and_the_standard_library():
    tree = ast.parse(Path(flink_side.__file__).read_text())
    names = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert names - {"__future__", "pyflink"} <= set(sys.stdlib_module_names), names


def test_clicks_agree_on_the_clicked_and_on_the_closed_not_clicked_searches():
    lines = [
        {"search_id": "a", "ts": 0, "clicked": True},
        {"search_id": "b", "ts": 0, "clicked": False},
        {"search_id": "c", "ts": 9_000_000, "clicked": False},  # closed under our watermark only
    ]
    got = _compare_clicks(lines, {"a"}, {"b": 0}, closed_before=5_000_000)
    assert got["agree"] and got["not_clicked"]["compared_ours"] == 1 and got["not_clicked"]["ours"] == 2
    assert not _compare_clicks(lines, {"a", "x"}, {"b": 0}, 5_000_000)["agree"]
    assert not _compare_clicks(lines, {"a"}, {}, 5_000_000)["agree"]


def _query(agree, ours=3_000, flink=30_000) -> dict:
    return {
        "ours": {
            "jobs": [{"job": "q4_final"}, {"job": "q4"}],
            "batch_seconds": 33.3,
            "events_per_s_per_core": ours,
        },
        "flink": {"net_seconds": 3.3, "wall_seconds": 5.0, "events_per_s_per_core": flink},
        "ratio": round(ours / flink, 3),
        "agree": agree,
        **({"differences": 4} if agree is False else {}),
    }


def _res(flink_note=None) -> dict:
    queries = {"q4": _query(True), "q5": _query(False)}
    if flink_note:
        queries = {"q4": {"ours": queries["q4"]["ours"], "flink": {}, "agree": None, "ratio": None}}
    clicks = {
        "ours": {"events": 1_000, "batches": 4, "batch_seconds": 2.0, "events_per_s_per_core": 250},
        "spark": {"events_per_s_per_core": 500, "batch_seconds": 1.0, "trigger_seconds": 2.5},
        "ratio": 0.5,
        "agree": True,
        "clicked": {"ours": 10, "spark": 10},
        "not_clicked": {"compared_ours": 5, "compared_spark": 5},
    }
    flink = {"flink": "1.20.5"} | ({"available": False, "note": flink_note} if flink_note else {})
    nexmark = {"events": 200_000, "seed": 42, "flink": flink, "queries": queries}
    return {"meta": {}, "peers": {"available": True, "cores": 2, "nexmark": nexmark, "clicks": clicks}}


def test_one_row_per_query_and_one_for_clicks_with_the_ratio_and_the_agreement():
    rows = table_rows(_res())
    assert [r["figure"].split(" events")[0] for r in rows] == ["Nexmark q4", "Nexmark q5", "clicks join"]
    q4, q5, clicks = rows
    assert all(set(r) == set(COLUMNS) for r in rows)
    assert q4["measured"].startswith("3,000/s/core") and "q4_final, q4" in q4["measured"]
    assert q4["reference"].startswith("Flink 1.20.5 30,000/s/core (3.3s job")
    assert (q4["ratio"], q4["met"], q5["met"]) == ("0.1", "agree", "**differ**")
    assert "4 differences" in q5["reference"] and "200,000 Nexmark events" in q4["workload"]
    assert clicks["measured"].startswith("250/s/core") and clicks["reference"].startswith("Spark 500/s/core")
    assert (clicks["ratio"], clicks["met"]) == ("0.5", "agree")


def test_without_flink_the_row_says_how_to_get_it_and_nothing_is_judged():
    (q4, _) = table_rows(_res(flink_note="Flink skipped: `make peers-setup` installs it"))
    assert "make peers-setup" in q4["reference"] and (q4["ratio"], q4["met"]) == ("n/a", "n/a")


def test_a_failed_part_is_one_row():
    failed = table_rows({"meta": {}, "peers": {"error": "RuntimeError: boom"}})
    assert len(failed) == 1 and failed[0]["figure"] == "peers" and "boom" in failed[0]["measured"]
    meta = {"when": "now", "machine": "here", "seconds": 1.0}
    assert "Nexmark q4 events/s per core" in markdown_table({**_res(), "meta": meta})


def test_the_readme_nexmark_table_has_every_query_its_ratio_against_the_goal_and_the_agreement(tmp_path):
    from bench.report import NEXMARK_END, NEXMARK_START, nexmark_table, update_block

    res = {
        "meta": {"when": "2026-11-29 04:00 UTC"},
        "peers": {
            "nexmark": {
                "events": 1_000,
                "flink": {"flink": "1.20.5", "parallelism": 2},
                "queries": {
                    "q0": {"ours": {"events_per_s_per_core": 600}, "flink": {"events_per_s_per_core": 1000},
                           "ratio": 0.6, "agree": True},
                    "q5": {"ours": {"events_per_s_per_core": 100}, "flink": {"events_per_s_per_core": 1000},
                           "ratio": 0.1, "agree": False},
                },
            }
        },
    }  # fmt: skip
    rows = nexmark_table(res).splitlines()
    assert [r.split(" | ")[0] for r in rows[2:25]] == [f"| q{n}" for n in range(23)]
    assert rows[2] == "| q0 | yes | 600 | 1,000 | 0.6 met | agree |"
    assert rows[7] == "| q5 | yes | 100 | 1,000 | 0.1 **not met** | **differ** |"
    assert rows[8].startswith("| q6 | no: ") and rows[3] == "| q1 | yes (not measured) | | | | |"
    assert nexmark_table({"meta": {}}) is None
    page = tmp_path / "README.md"
    page.write_text(f"a\n{NEXMARK_START}\nold\n{NEXMARK_END}\nb\n")
    assert update_block(page, nexmark_table(res), NEXMARK_START, NEXMARK_END)
    assert "old" not in page.read_text() and "| q22 |" in page.read_text()
