"""The enrichment job end to end (real Delta logs, real Spark, real redis-server) against the brute-force
reference, for several seeds and chunkings of the same arrival sequence; byte-identical exports whatever the
chunking, and a replay from the start of the logs into a new generation gives the same again."""

from __future__ import annotations

import json
import random

import pytest

from changelog.ingest import ingest
from changelog.records import validate
from changelog.storage import as_lake
from jobs.core.registry import job_spec
from jobs.core.runtime import read_status
from tests.conftest import make_settings, split_at_random, write_jsonl
from timeline_demo.enrichment_workload import expected_by_country, expected_enriched, generate_enrichment
from views.log import export_log
from views.pipeline import builtin_pipeline
from views.read import export_view
from views.redis_io import connect, set_generation


def run_enrichment(spark, settings, **kwargs) -> dict:
    """The built-in pipeline's `enrichment` job, as `mview run enrichment` runs it."""
    return job_spec(settings, "enrichment").run(spark, settings, **kwargs)


LATENESS = "5 minutes"  # the workload's disorder is 4 minutes


def export_enriched(spark, lake_dir, generation: int):
    return export_log(spark, as_lake(lake_dir), builtin_pipeline().views["enriched_activity"], generation)


def export_activity_by_country(client):
    return export_view(client, "activity_by_country")


def _run_chunked(spark, tmp_path, redis_url, wl, chunks: int, seed: int, *, check_held: bool = False):
    settings = make_settings(tmp_path / f"lake{chunks}", redis_url, ALLOWED_LATENESS=LATENESS)
    for i, chunk in enumerate(split_at_random(wl.records, chunks, random.Random(seed))):
        for topic in ("profiles", "activity"):
            recs = [r for t, r in chunk if t == topic]
            if recs:
                ingest(
                    spark,
                    settings.lake,
                    settings.topic(topic),
                    [write_jsonl(tmp_path / f"{topic}{chunks}_{i}.jsonl", recs)],
                )
        run_enrichment(spark, settings, once=True)
        if check_held and i == 0:
            # the clock change comes last: events within the lateness of the newest change wait, and are counted
            assert read_status(settings, "enrichment")["held"] > 0
    return settings


def _export_lines(spark, settings, generation: int = 1) -> bytes:
    return b"".join(
        json.dumps(r).encode() + b"\n" for r in export_enriched(spark, settings.lake_dir, generation)
    )


@pytest.mark.parametrize("seed, chunks", [(1, 2), (2, 3)])
@pytest.mark.slow
def test_every_enriched_event_equals_the_truth(spark, tmp_path, redis_url, rclient, seed, chunks):
    wl = generate_enrichment(seed=seed)
    truth = expected_enriched(wl.profiles, wl.activity)
    pinned = [r for r in truth.values() if r["profile_version"] and "@" in r["profile_version"]]
    assert len(truth) > 300 and any(r["name"] is None for r in truth.values()) and pinned
    settings = _run_chunked(spark, tmp_path, redis_url, wl, chunks, seed, check_held=True)
    got = {r["event_id"]: r for r in export_enriched(spark, settings.lake_dir, 1)}
    assert got == truth
    client = connect(redis_url)
    assert {r["country"]: r["events"] for r in export_activity_by_country(client)} == expected_by_country(
        truth
    )
    status = read_status(settings, "enrichment")
    assert status["held"] == 0
    versions = {
        f"{p['user_id']}@{p['ts']}"
        for p in map(lambda r: validate(builtin_pipeline().topics["profiles"], r), wl.profiles)
    }
    pinned_unknown = [
        e for e in truth.values() if e["profile_version"] and e["profile_version"] not in versions
    ]
    assert pinned_unknown and status["unknown_versions"] == len(pinned_unknown)


@pytest.mark.slow
def test_same_export_for_any_chunking_and_after_replay(spark, tmp_path, redis_url, rclient):
    wl = generate_enrichment(seed=7)
    truth = expected_enriched(wl.profiles, wl.activity)
    exports = []
    for chunks in (1, 3):
        rclient.flushall()
        settings = _run_chunked(spark, tmp_path, redis_url, wl, chunks, 7)
        exports.append(_export_lines(spark, settings, 1))
    assert exports[0] == exports[1]
    assert [json.loads(x)["event_id"] for x in exports[0].splitlines()] == sorted(truth)
    # replay from the start of the logs into generation 2, then switch: the same bytes again
    run_enrichment(spark, settings, once=True, generation=2)
    assert _export_lines(spark, settings, 2) == exports[0]
    set_generation(connect(redis_url), "enrichment", 2)
    assert {r["country"]: r["events"] for r in export_activity_by_country(connect(redis_url))} == (
        expected_by_country(truth)
    )
