"""`jobs.core.chain`: a job over another job's views (topics `from: {view: ...}`) reads the view's table log in the
generation its job serves. An aggregate of a windowed aggregate and of an unwindowed one, against the brute force
(`timeline_demo.brute`: a view read as a table is its entries) after a random play cut into three pieces, late and
duplicate records included, on a local lake and on HDFS; a replay of the upstream job switches it to another generation and the downstream job,
run again, is rebuilt from the new log into a new generation with the same lines; the old log is gone."""

from __future__ import annotations

import random
import uuid

import pytest

from changelog.errors import ViewNotPublished
from changelog.ingest import ingest
from changelog.topics import topic_key
from jobs.core.chain import check_chain, reads
from jobs.core.registry import job_spec
from jobs.core.replay import rebuild
from jobs.errors import ChainNotRun
from tests.conftest import make_settings
from tests.jobs.opshelp import write_jsonl
from tests.windowhelp import pipeline_file
from timeline_demo.brute import brute_force
from views.pipeline import parse_pipeline
from views.read import export_view
from views.redis_io import connect

T0 = 1_700_000_000_000
LATENESS_MS = 20_000
PIPELINE = """\
topics:
  plays:
    fields: {play_id: id, player: string, game: string, score: long, ts: timestamp}
    optional: [score]
    id: play_id
    time: ts
  game_minutes: {from: {view: per_game}}
  player_totals: {from: {view: per_player}}
jobs:
  arcade:
    select: {from: plays}
    views:
      per_game:
        count: {game: game}
        window: {tumble: 1 min}
        values: {plays: 1, points: "coalesce(score, 0)"}
      per_player: {agg: {player: player}, values: {best: max(score), plays: "count(*)"}}
  busiest:
    select: {from: game_minutes}
    views:
      minutes:
        agg: {minute: "CAST(window_start AS string)"}
        values: {most: max(plays), games: "count(*)", points: sum(points), closed: "sum(CAST(final AS int))"}
  ranks:
    select: {from: player_totals}
    views:
      by_plays: {count: {plays: "CAST(plays AS string)"}, values: {players: 1, best: "coalesce(best, 0)"}}
"""
DOWNSTREAM = ("busiest", "ranks")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return pipeline_file(tmp_path_factory, "chain", PIPELINE)


def _plays(rng: random.Random, n: int) -> list[tuple[str, dict]]:
    """Plays over about 5 minutes in rough time order, some far behind (late), some delivered twice."""
    out = []
    for i in range(n):
        t = T0 + int(i * 300_000 / n) + rng.randrange(-8_000, 8_000)
        if rng.random() < 0.1:
            t -= rng.randrange(20_000, 120_000)
        rec = {
            "play_id": f"p{i}",
            "player": f"u{rng.randrange(20)}",
            "game": rng.choice(["x", "y", "z"]),
            "score": rng.choice([None, 1, 5, 9, 40]),
            "ts": t,
        }
        out.append(("plays", rec))
        if rng.random() < 0.08:
            out.append(("plays", dict(rec)))
    return out


def _run_chain(spark, settings) -> None:
    """Every job once, each after the jobs whose views it reads (what `mview run JOB --once` of each downstream job
    runs, the upstream once)."""
    pipeline = settings.pipeline()
    for name in dict.fromkeys(n for job in DOWNSTREAM for n in (*pipeline.chain(job), job)):
        job_spec(settings, name).run(spark, settings, once=True)


def _check(settings, pipeline, want) -> None:
    client = connect(settings.redis_url)
    for name in pipeline.views:
        assert list(export_view(client, name, pipeline=pipeline)) == want.export(name), name


@pytest.mark.parametrize(
    "store",
    [
        pytest.param("local", marks=pytest.mark.slow),
        pytest.param("hdfs", marks=[pytest.mark.e2e, pytest.mark.slow]),
    ],
)
def test_an_aggregate_of_aggregates_equals_the_brute_force_and_follows_a_replay(
    spark, tmp_path, redis_url, pipeline, store, request
):
    lake = tmp_path / "lake"
    if store == "hdfs":
        lake = f"{request.getfixturevalue('hdfs_server').url}/chain-{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        lake,
        redis_url,
        ALLOWED_LATENESS=f"{LATENESS_MS} ms",
        METRICS_PORT="off",
        MVIEW_PIPELINE=pipeline.file,
    )
    rng = random.Random(6)
    plays = [r for _, r in _plays(rng, 200)]
    cuts = sorted(rng.sample(range(1, len(plays)), 2))
    batches = []
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(plays)], strict=True)):
        path = write_jsonl(tmp_path / f"plays-{i}.jsonl", plays[a:b])
        ingest(None, settings.lake, settings.topic("plays"), [path])
        batches.append({"plays": plays[a:b]})
        _run_chain(spark, settings)
    want = brute_force(pipeline, batches, lateness_ms=LATENESS_MS)
    finals = [line["closed"] for line in want.export("minutes")]
    assert any(finals) and len(want.export("minutes")) >= 5 and len(want.export("by_plays")) >= 3
    _check(settings, pipeline, want)
    assert reads(settings, "busiest") == {"game_minutes": "tables/per_game/g1"}

    assert rebuild(spark, settings, "arcade", "replay") == 2
    assert reads(settings, "busiest") == {"game_minutes": "tables/per_game/g2"}
    assert not settings.lake.exists("tables/per_game/g1")  # the old generation's log went with it
    _run_chain(spark, settings)  # the upstream has nothing new; each downstream job is rebuilt
    client = connect(settings.redis_url)
    assert [int(client.get(f"mv:gen:{j}")) for j in ("arcade", *DOWNSTREAM)] == [2, 2, 2]
    _check(settings, pipeline, want)


def test_a_topic_of_a_view_not_published_yet_names_it(tmp_path, redis_url, pipeline):
    settings = make_settings(tmp_path / "lake", redis_url, MVIEW_PIPELINE=pipeline.file)
    topic = settings.topic("game_minutes")
    assert topic.log is None
    with pytest.raises(ViewNotPublished, match="'game_minutes' is view 'per_game'.*run that job first"):
        topic_key(topic)


def test_a_job_over_a_view_without_a_table_log_does_not_run():
    text = PIPELINE.replace(
        "player_totals: {from: {view: per_player}}", "player_rows: {from: {view: last_play}}"
    )
    text = text.replace(
        "      per_player: {agg",
        "      last_play: {row: {player: player}, fields: {ts: ts}}\n      per_player: {agg",
    ).replace("select: {from: player_totals}", "select: {from: player_rows}")
    text = text.replace('{players: 1, best: "coalesce(best, 0)"}', "{players: 1}").replace(
        "CAST(plays", "CAST(ts"
    )
    p = parse_pipeline(text, "chain.yml")
    check_chain(p, "busiest")
    with pytest.raises(ChainNotRun, match="ranks reads 'player_rows', row view 'last_play' of job 'arcade'"):
        check_chain(p, "ranks")
