"""The search_clicks / ctr sink (fenced, replay-safe) and read side, on the real redis-server."""

from __future__ import annotations

import json

from jobs.cli import main
from views.clicks import (
    CLICKS_OPS_SCHEMA,
    ClicksSink,
    export_ctr,
    export_search_clicks,
    query_ctr,
    query_search_clicks,
)
from views.redis_io import connect, set_generation


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
