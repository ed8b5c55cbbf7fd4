"""A changed definition: a job started with a definition other than its serving generation's builds generation
n+1 from the logs while n keeps serving, then switches, and says why in its status (`definition changed: view V:
KEY`, naming what changed); the status's last batch is then generation n+1's."""

from __future__ import annotations

from changelog.ingest import ingest
from jobs.core.registry import job_spec
from jobs.core.runtime import read_status
from spec.builtin import BUILTIN_FILE
from tests.conftest import make_settings, write_jsonl
from timeline_demo.workload import T0
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
    ingest(None, settings.lake_dir, "searches", [write_jsonl(tmp_path / "s.jsonl", searches + later)])
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
