"""A table topic read `from:` an event topic (the contract's "Chained jobs"): the event topic's log read as a table,
nothing written twice. A select of the table and a select of the events, in one pipeline, against the brute force
(`timeline_demo.brute`: the table's records are the event topic's) for random workloads with events delivered
twice, out of time order and ties, cut into 1 and 3 batches; records for the table topic itself are refused."""

from __future__ import annotations

import random

import pytest

from changelog.deadletters import count_dead_letters
from changelog.errors import ReadFrom
from changelog.ingest import ingest
from jobs.kinds.select import run
from tests.conftest import make_settings, write_jsonl
from tests.shophelp import pieces, write_chunk
from timeline_demo.brute import BruteError, brute_force
from views.pipeline import load_pipeline
from views.read import export_view
from views.redis_io import connect

PIPELINE = """\
topics:
  rides:
    fields: {ride_id: id, rider_id: id, city: string, fare: double, ts: timestamp}
    id: ride_id
    time: ts
  last_ride: {from: rides, key: rider_id}     # per rider, the ride with the greatest time
jobs:
  where_riders_are:
    select: {from: last_ride}
    views:
      riders_in:     {count: {city: city}, values: {riders: 1, fares: fare}}
      dearest_last:  {agg: {city: city}, values: {top: max(fare), low: min(fare), n: count(distinct rider_id)}}
      last_of:       {row: {rider: rider_id}, fields: {city: city, fare: fare}}
      newest_riders: {list: {city: city}, entry: rider_id, order: [ts desc], cap: 3, fields: {fare: fare}}
  rides_per_rider:
    select: {from: rides}
    views:
      rides_of: {count: {rider: rider_id}, values: {rides: 1}}
"""
JOBS = ("where_riders_are", "rides_per_rider")
T0 = 1_767_000_000_000


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    path = tmp_path_factory.mktemp("from") / "rides.yml"
    path.write_text(PIPELINE)
    return load_pipeline(path, {})


def _rides(seed: int) -> list[tuple[str, dict]]:
    """Rides of 12 riders in 4 cities, times out of order with ties, about one in eight delivered twice."""
    rng, out = random.Random(seed), []
    for i in range(160):
        ride = {
            "ride_id": f"r{i}",
            "rider_id": f"u{rng.randrange(12)}",
            "city": rng.choice(["Oslo", "Lima", "Pune", "Kyiv"]),
            "fare": rng.randrange(6, 80) / 2,  # halves: sums exact in any order
            "ts": T0 + rng.randrange(50) * 60_000,
        }
        out.append(("rides", ride))
        if rng.random() < 0.125:
            out.insert(rng.randrange(len(out) + 1), ("rides", dict(ride)))
    return out


@pytest.mark.parametrize("chunks, seed", [(1, 3), pytest.param(3, 4, marks=pytest.mark.slow)])
def test_an_event_topic_read_as_a_table_equals_the_brute_force(
    spark, tmp_path, redis_url, pipeline, chunks, seed
):
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=pipeline.file)
    batches = pieces(_rides(seed), {"rides"}, chunks, random.Random(seed))
    for piece in batches:
        write_chunk(spark, settings.lake_dir, pipeline.topic("rides"), piece["rides"])
        for job in JOBS:
            run(spark, settings, pipeline, job, once=True)
    want = brute_force(pipeline, batches)
    riders = {r["rider_id"] for b in batches for r in b["rides"]}
    assert len(want.export("last_of")) == len(riders)  # one row per rider: the table, not the events
    client = connect(settings.redis_url)
    for job in JOBS:
        for v in pipeline.jobs[job].views:
            assert list(export_view(client, v.name, pipeline=pipeline)) == want.export(v.name), v.name
    assert not (settings.lake_dir / "topics" / "last_ride").exists()  # nothing written twice


def test_records_for_a_topic_read_from_another_are_refused(tmp_path, pipeline):
    lake_dir = tmp_path / "lake"
    src = write_jsonl(tmp_path / "r.jsonl", [{"ride_id": "r1", "rider_id": "u1", "city": "Oslo", "ts": T0}])
    with pytest.raises(ReadFrom, match="'last_ride' is read from 'rides'.*write its records to 'rides'"):
        ingest(
            None, make_settings(lake_dir, "redis://127.0.0.1:1/0").lake, pipeline.topic("last_ride"), [src]
        )
    assert not lake_dir.exists() or not any(lake_dir.rglob("*.parquet"))
    with pytest.raises(BruteError, match="read from 'rides'"):
        brute_force(pipeline, [{"last_ride": [{"ride_id": "r1"}]}])


def test_a_topic_read_from_another_has_that_ones_dead_letters(tmp_path, pipeline):
    """A job reading `last_ride` reports the lines `rides` rejected (its log's) as its own `rejected`."""
    lake = make_settings(tmp_path / "lake", "redis://127.0.0.1:1/0").lake
    good = {"ride_id": "r1", "rider_id": "u1", "city": "Oslo", "fare": 3.5, "ts": T0}
    src = write_jsonl(tmp_path / "r.jsonl", [good, {"ride_id": "r2", "city": "Lima", "ts": "never"}])
    assert ingest(None, lake, pipeline.topic("rides"), [src], quiet=True).rejected == 1
    assert count_dead_letters(lake, pipeline.topic("last_ride")) == 1
    assert count_dead_letters(lake, pipeline.topic("rides")) == 1
