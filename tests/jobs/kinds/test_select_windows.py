"""Windowed `count`, `agg` and `list` views of a `select` job (tumbling, hopping with `retain`, sessions) end to end, against
the brute force of the contract's definitions (`timeline_demo.brute`): random plays with late and duplicate records
ingested as files (one log version each), the job run after every file, then replayed in one batch (the same log
cut into other batches gives the same lines, late drops included); export and query compared exactly, `late`
counted; on a local lake (windowed views on HDFS: tests/jobs/core/test_chain.py, whose store-specific code, the
`changelog.storage.Lake` primitives and Delta's commit, tests/changelog/test_storage.py holds on both stores)."""

from __future__ import annotations

import json
import random

import pytest

from changelog.ingest import ingest
from jobs.core.replay import rebuild
from jobs.core.runtime import read_status
from jobs.kinds.select import run
from tests.conftest import make_settings
from tests.windowhelp import pipeline_file
from timeline_demo.brute import brute_force
from views.read import export_view, query_view
from views.redis_io import connect

T0 = 1_700_000_000_000  # a multiple of a minute
LATENESS_MS = 20_000
PIPELINE = """\
topics:
  plays:
    fields: {play_id: id, player: string, game: string, score: long, ts: timestamp}
    optional: [score]
    id: play_id
    time: ts
jobs:
  arcade:
    select: {from: plays}
    views:
      by_minute:
        agg: {game: game}
        window: {tumble: 1 min}
        values: {plays: "count(*)", players: "count(distinct player)", best: "max(score)", worst: "min(score)",
                 points: "sum(score)", mean: "avg(score)", scored: "count(score)"}
      sliding:
        count: {game: game}
        window: {hop: 1 min, every: 20 s}
        retain: 1 min
        values: {plays: 1, points: "coalesce(score, 0)"}
      sessions:
        agg: {player: player}
        where: "game <> 'z'"
        window: {session: 15 s}
        values: {plays: "count(*)", best: "max(score)", games: "count(distinct game)"}
      best_plays:
        list: {game: game}
        window: {tumble: 2 min}
        entry: play_id
        order: [score desc, play_id desc]
        cap: 3
        fields: {player: player, score: score}
      streaks:
        list: {player: player}
        window: {session: 15 s}
        retain: 30 s
        entry: play_id
        order: [ts desc, play_id desc]
        cap: 2
        fields: {game: game}
      totals:
        agg: {game: game}
        values: {plays: "count(*)"}
"""


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return pipeline_file(tmp_path_factory, "arcade", PIPELINE)


def _plays(rng: random.Random, n: int) -> list[dict]:
    """Plays over about 6 minutes in rough time order, some far behind (late), some delivered twice."""
    out = []
    for i in range(n):
        t = T0 + int(i * 360_000 / n) + rng.randrange(-8_000, 8_000)
        if rng.random() < 0.1:
            t -= rng.randrange(20_000, 120_000)  # behind the watermark, mostly
        rec = {
            "play_id": f"p{i}",
            "player": rng.choice(["ann", "bob", "cy", "dee"]),
            "game": rng.choice(["x", "y", "z"]),
            "score": rng.choice([None, 1, 5, 5, 9, 40]),
            "ts": t,
        }
        out.append(rec)
        if rng.random() < 0.08:
            out.append(dict(rec))
    return out


def _files(tmp_path, records: list[dict], n: int, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(records)), n - 1))
    paths = []
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(records)], strict=True)):
        path = tmp_path / f"plays-{i:03d}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records[a:b]))
        paths.append(str(path))
    return paths


def _check(settings, pipeline, want) -> None:
    client = connect(settings.redis_url)
    for name in pipeline.views:
        got = list(export_view(client, name, pipeline=pipeline))
        lines = want.export(name)
        assert got == [{k: pytest.approx(v, rel=1e-9) if k == "mean" and v is not None else v
                        for k, v in line.items()} for line in lines], name  # fmt: skip
        for key in [*want.keys(name)[:3], "x|0"]:
            q = query_view(client, name, key, pipeline=pipeline)
            assert {k: v for k, v in q.items() if k not in ("generation", "mean")} == {
                k: v for k, v in want.query(name, key).items() if k not in ("generation", "mean")
            }


@pytest.mark.slow  # batches and a replay: `make test`, not test-fast
def test_windowed_views_equal_the_brute_force_however_the_log_is_cut_into_batches(
    spark, tmp_path, redis_url, pipeline
):
    """The job run after every file (one batch each), then a replay (the whole log in one batch, into generation 2):
    the same lines, late drops included."""
    rng = random.Random(7)
    records = _plays(rng, 240)
    paths = _files(tmp_path, records, 4, rng)
    settings = make_settings(
        tmp_path / "lake",
        redis_url,
        ALLOWED_LATENESS=f"{LATENESS_MS} ms",
        METRICS_PORT="off",
        MVIEW_PIPELINE=pipeline.file,
    )
    topic = pipeline.topic("plays")
    for path in paths:
        ingest(None, settings.lake, topic, [path])
        run(spark, settings, pipeline, "arcade", once=True)
    batches = [{"plays": [json.loads(x) for x in open(p)]} for p in paths]
    want = brute_force(pipeline, batches, lateness_ms=LATENESS_MS)
    assert want.late["arcade"] > 5  # late plays were left out of the windowed views (and kept in `totals`)
    finals = [line["final"] for line in want.export("by_minute")]
    assert any(finals) and not all(finals)
    assert len(want.export("sessions")) > 8
    assert len(want.export("sliding")) < 3 * 7 * 3  # retain removed old final windows
    _check(settings, pipeline, want)
    assert read_status(settings, "arcade")["late"] == want.late["arcade"]
    assert rebuild(spark, settings, "arcade", "replay") == 2
    _check(settings, pipeline, want)
