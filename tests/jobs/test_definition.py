"""A changed definition: a job started with a definition other than its serving generation's builds generation
n+1 from the logs while n keeps serving, then switches, and says why in its status (`definition changed: view V:
KEY`, naming what changed); the status's last batch is then generation n+1's."""

from __future__ import annotations

import pytest

from changelog.ingest import ingest
from jobs.core.registry import job_spec
from jobs.core.runtime import read_status
from tests.conftest import make_settings, write_jsonl
from timeline_demo.workload import T0
from views.pipeline import BUILTIN_FILE
from views.read import export_view
from views.redis_io import connect, current_generation

H = 3_600_000


def _settings(tmp_path, redis_url, text: str):
    path = tmp_path / "pipeline.yml"
    path.write_text(text)
    return make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=str(path))


def test_a_changed_where_rebuilds_into_a_new_generation_and_status_says_why(spark, tmp_path, redis_url):
    searches = [
        {"search_id": f"s{i}", "session_id": f"x{i}", "query": "q" if i % 2 else "r", "ts": T0 + i}
        for i in range(6)
    ]
    later = [{"search_id": "late", "session_id": "z", "query": "z", "ts": T0 + 3 * H}]  # closes every window
    text = BUILTIN_FILE.read_text()
    settings = _settings(tmp_path, redis_url, text)
    ingest(
        None, settings.lake, settings.topic("searches"), [write_jsonl(tmp_path / "s.jsonl", searches + later)]
    )
    spec = job_spec(settings, "clicks")
    spec.run(spark, settings, once=True)
    client = connect(redis_url)
    assert current_generation(client, "clicks") == 1
    assert {r["query"]: r["searches"] for r in export_view(client, "ctr", pipeline=settings.pipeline())} == {
        "q": 3,
        "r": 3,
    }

    # the same pipeline, run again: the same definition, the same generation
    spec.run(spark, settings, once=True)
    assert current_generation(client, "clicks") == 1

    changed = text.replace("values: {searches: 1", "where: \"query <> 'r'\"\n        values: {searches: 1")
    assert changed != text
    settings = _settings(tmp_path, redis_url, changed)
    job_spec(settings, "clicks").run(spark, settings, once=True)
    assert current_generation(client, "clicks") == 2
    assert {r["query"]: r["searches"] for r in export_view(client, "ctr", pipeline=settings.pipeline())} == {
        "q": 3
    }
    status = read_status(settings, "clicks", "status.json")
    last = status["last_rebuild"]
    assert last["generation"] == 2 and last["reason"] == "definition changed: view ctr: where", last
    assert status["last_batch_ms"] >= last["at_ms"], status  # generation 2's batches, not generation 1's
    assert not list(client.scan_iter(match="mv:ctr:1:*"))  # the old generation is gone after the switch
    # the timeline and enrichment jobs' definitions did not change
    assert settings.pipeline().fingerprint("timeline") == make_settings(
        tmp_path, redis_url
    ).pipeline().fingerprint("timeline")


@pytest.mark.slow
def test_a_select_with_agg_views_replays_and_rebuilds_on_a_changed_aggregate(spark, tmp_path, redis_url):
    """A table select (`tests.tickethelp`'s seat map, removals and moves included) with agg views: `mview replay`
    builds generation 2 equal to generation 1, and an aggregate added to a view rebuilds generation 3, each exactly
    the brute force of the definition it was built from."""

    from jobs.ops.replay import replay
    from tests.shophelp import write_chunk
    from tests.tickethelp import ticket_text, workload
    from timeline_demo.brute import brute_force
    from views.pipeline import load_pipeline

    text = ticket_text(agg=True)
    settings = _settings(tmp_path, redis_url, text)
    arrivals = [(t, r) for t, r in workload(21) if t == "seats"]
    pieces = [arrivals[: len(arrivals) // 2], arrivals[len(arrivals) // 2 :]]
    spec, client = job_spec(settings, "seat_map"), connect(redis_url)
    for piece in pieces:
        write_chunk(spark, settings.lake_dir, settings.pipeline().topic("seats"), [r for _, r in piece])
        spec.run(spark, settings, once=True)

    def same(pipeline, generation: int) -> None:
        want = brute_force(pipeline, [{"seats": [r for _, r in arrivals]}], lateness_ms=10 * 60_000)
        assert current_generation(client, "seat_map") == generation
        for v in pipeline.jobs["seat_map"].views:
            got = list(export_view(client, v.name, pipeline=pipeline))
            wanted = want.export(v.name)
            assert len(got) == len(wanted) and all(
                g.keys() == w.keys() and all(g[k] == w[k] or abs(g[k] - w[k]) <= 1e-9 * abs(w[k]) for k in w)
                for g, w in zip(got, wanted, strict=True)
            ), (generation, v.name)

    same(settings.pipeline(), 1)
    assert replay(spark, settings, "seat_map") == 0
    same(settings.pipeline(), 2)
    changed = text.replace('last_holder: "max(holder)"}', 'last_holder: "max(holder)", rows: "count(*)"}')
    assert changed != text
    (tmp_path / "pipeline.yml").write_text(changed)
    spec.run(spark, settings, once=True)
    same(load_pipeline(tmp_path / "pipeline.yml", {}), 3)
    assert (
        read_status(settings, "seat_map")["last_rebuild"]["reason"]
        == "definition changed: view venue_stats: values"
    )
