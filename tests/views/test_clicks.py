"""The search_clicks / ctr sink (fenced, replay-safe) and read side, on the real redis-server."""

from __future__ import annotations

import json

from jobs.cli import main
from views.clicks import (
    CLICKS_OPS_SCHEMA,
    ClicksSink,
    clicks_ops,
    export_ctr,
    export_search_clicks,
    query_ctr,
    query_search_clicks,
)
from views.redis_io import connect, set_generation
from views.sink import ListSink


def _body(sid, clicks):
    return json.dumps(
        {
            "search_id": sid,
            "session_id": "a",
            "query": "q {x}",
            "ts": 5,
            "clicked": clicks > 0,
            "clicks": clicks,
        },
        separators=(",", ":"),
    )


def test_replayed_step_counts_once_and_older_step_cannot_undo_a_newer_outcome(
    spark, redis_url, monkeypatch, capsys
):
    client = connect(redis_url)
    set_generation(client, "clicks", 1)
    sink = ClicksSink(redis_url, 1)
    provisional = spark.createDataFrame(
        [("search", "s1", _body("s1", 1), False, None, None)], CLICKS_OPS_SCHEMA
    )
    final = spark.createDataFrame(
        [
            ("search", "s1", _body("s1", 2), True, None, None),
            ("search", "s2", _body("s2", 0), True, None, None),
            ("ctr", "q {x}", None, None, 2, 1),
        ],
        CLICKS_OPS_SCHEMA,
    )
    sink.write(provisional, 1_000_000)
    assert query_search_clicks(client, "s1")["final"] is False
    sink.write(final, 2_000_000)
    sink.write(final, 2_000_000)  # the same step replayed after a crash
    sink.write(provisional, 1_000_000)  # an older step replayed: must not undo the final outcome
    assert query_search_clicks(client, "s1") == {**json.loads(_body("s1", 2)), "final": True, "generation": 1}
    assert query_ctr(client, "q {x}") == {"query": "q {x}", "searches": 2, "clicked": 1}
    assert [r["search_id"] for r in export_search_clicks(client)] == ["s1", "s2"]
    assert list(export_ctr(client)) == [{"query": "q {x}", "searches": 2, "clicked": 1}]
    assert query_ctr(client, "nothing") == {} and query_search_clicks(client, "nope") == {}

    monkeypatch.setenv("REDIS_URL", redis_url)
    assert main(["query", "ctr", "q {x}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"query": "q {x}", "searches": 2, "clicked": 1}
    assert main(["query", "search_clicks", "nope"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["export", "ctr"]) == 0
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [
        {"query": "q {x}", "searches": 2, "clicked": 1}
    ]


def test_clicks_ops_publish_changed_and_closed_searches_and_count_closed_ones_in_ctr(spark):
    left = spark.createDataFrame(
        [
            ("s1", "a", "q", 5, 2, True, False),  # new clicks, window open: provisional record
            ("s2", "b", "q", 6, 0, False, True),  # closed, never clicked: final record, counted
            ("s3", "c", "q", 7, 1, True, True),  # clicked and closed in the same step
            ("s4", "d", "r", 8, 0, False, False),  # nothing changed: no operation
        ],
        "search_id string, session_id string, query string, ts bigint, _matches bigint, _changed boolean, "
        "_closed boolean",
    )
    sink = ListSink()
    sink.write(clicks_ops(left), 7_000_000)
    ops = sorted(sink.batches[7_000_000], key=lambda r: (r["kind"], r["key"]))
    assert [(r["kind"], r["key"], r["final"], r["d_searches"], r["d_clicked"]) for r in ops] == [
        ("ctr", "q", None, 2, 1),
        ("search", "s1", False, None, None),
        ("search", "s2", True, None, None),
        ("search", "s3", True, None, None),
    ]
    assert [json.loads(r["body"]) for r in ops[1:]] == [
        {"search_id": "s1", "session_id": "a", "query": "q", "ts": 5, "clicked": True, "clicks": 2},
        {"search_id": "s2", "session_id": "b", "query": "q", "ts": 6, "clicked": False, "clicks": 0},
        {"search_id": "s3", "session_id": "c", "query": "q", "ts": 7, "clicked": True, "clicks": 1},
    ]
