"""`jobs.core.chain`: a job over another job's views (topics `from: {view: ...}`) reads the view's table log in the
generation its job serves. An aggregate of a windowed aggregate, and a join of an unwindowed agg view with a count
view, against the brute force (`timeline_demo.brute`: a view read as a table is its entries) after a random play cut
into three pieces, late and duplicate records included, on HDFS (the same pipeline on a local lake:
tests/jobs/ops/test_chain_deploy.py, deployed, killed and replayed); `mview replay` of the upstream job switches it
to another generation and then runs each downstream job once, which rebuilds it from the new log into a new
generation with the same lines; the old log is gone. A three-table chain (a join of a join's row view with a third
table) with updates and removals on every table. An asof job's log view read as events by a select, an asof and an
interval job, exact after every batch."""

from __future__ import annotations

import random
import uuid

import pytest

from changelog.errors import ViewNotPublished
from changelog.ingest import ingest
from changelog.topics import topic_key
from jobs.core.chain import check_chain, reads
from jobs.core.registry import job_spec
from jobs.errors import ChainNotRun
from tests.conftest import make_settings
from tests.jobs.opshelp import mview_here, write_jsonl
from tests.windowhelp import pipeline_file
from timeline_demo.brute import brute_force
from views.pipeline import parse_pipeline
from views.read import export_view
from views.redis_io import connect

T0 = 1_700_000_000_000
LATENESS_MS = 20_000
PLAYS = """\
topics:
  plays:
    fields: {play_id: id, player: string, game: string, score: long, ts: timestamp}
    optional: [score]
    id: play_id
    time: ts
"""  # the topic `_plays` makes records of
PIPELINE = (
    PLAYS
    + """\
  game_minutes: {from: {view: per_game}}
  player_totals: {from: {view: per_player}}
  player_points: {from: {view: points_per_player}}
  player_last: {from: {view: last_play}}
jobs:
  arcade:
    select: {from: plays}
    views:
      per_game:
        count: {game: game}
        window: {tumble: 1 min}
        values: {plays: 1, points: "coalesce(score, 0)"}
      per_player: {agg: {player: player}, values: {best: max(score), plays: "count(*)"}}
      points_per_player:        # a count view read as a table: a player whose scores are all null or 0 has none
        count: {player: player}
        values: {points: "coalesce(score, 0)", scored: "if(coalesce(score, 0) > 0, 1, 0)"}
      last_play: {row: {player: player}, fields: {ts: ts, game: game, play_id: play_id}}   # read as a table too
  busiest:
    select: {from: game_minutes}
    views:
      minutes:
        agg: {minute: "CAST(window_start AS string)"}
        values: {most: max(plays), games: "count(*)", points: sum(points), closed: "sum(CAST(final AS int))"}
  ranks:                        # a join of two views' tables
    join: {left: player_totals, right: player_points, match: {player: player}}
    views:
      by_plays:
        count: {plays: "CAST(plays AS string)"}
        values: {players: 1, best: "coalesce(best, 0)", points: points, scored: scored}
  recent:                       # a select of a row view's table: each player's latest play, per game
    select: {from: player_last}
    views:
      last_games: {agg: {game: game}, values: {players: "count(*)", latest: max(ts), first: min(play_id)}}
"""
)
DOWNSTREAM = ("busiest", "ranks", "recent")


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


def _check(settings, pipeline, want, spark=None) -> None:
    client = connect(settings.redis_url)
    for name in pipeline.views:
        got = export_view(client, name, pipeline=pipeline, lake=settings.lake, spark=lambda: spark)
        assert list(got) == want.export(name), name


@pytest.mark.slow
def test_an_aggregate_of_aggregates_equals_the_brute_force_and_follows_a_replay(
    spark, tmp_path, redis_url, pipeline, hdfs_server
):
    lake = f"{hdfs_server.url}/chain-{uuid.uuid4().hex[:8]}"
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

    replayed = mview_here(settings, "replay", "arcade")  # then each job below it, run once, is rebuilt
    assert replayed.returncode == 0, replayed.stderr
    assert [line.split(":")[0] for line in replayed.stdout.splitlines()] == ["arcade", *DOWNSTREAM]
    assert reads(settings, "busiest") == {"game_minutes": "tables/per_game/g2"}
    assert not settings.lake.exists("tables/per_game/g1")  # the old generation's log went with it
    client = connect(settings.redis_url)
    assert [int(client.get(f"mv:gen:{j}")) for j in ("arcade", *DOWNSTREAM)] == [2, 2, 2, 2]
    _check(settings, pipeline, want)


def test_a_topic_of_a_view_not_published_yet_names_it(tmp_path, redis_url, pipeline):
    settings = make_settings(tmp_path / "lake", redis_url, MVIEW_PIPELINE=pipeline.file)
    topic = settings.topic("game_minutes")
    assert topic.log is None
    with pytest.raises(ViewNotPublished, match="'game_minutes' is view 'per_game'.*run that job first"):
        topic_key(topic)


def test_a_job_over_a_view_whose_table_log_is_not_kept_does_not_run():
    text = PIPELINE.replace(
        "  player_last: {from: {view: last_play}}", "  matched: {from: {view: match_rows}}"
    )
    text = text.replace(
        "jobs:\n",
        "  games: {fields: {game_id: id, game: string, ts: timestamp}, id: game_id, time: ts}\n"
        "jobs:\n"
        "  pairing:\n"
        "    interval: {left: plays, right: games, match: {game: game}, within: [0 s, 1 min]}\n"
        "    views:\n"
        "      match_rows: {row: {play_id: play_id}, fields: {player: player, ts: ts, game: game}}\n",
    ).replace("select: {from: player_last}", "select: {from: matched}")
    p = parse_pipeline(text, "chain.yml")
    check_chain(p, "busiest")
    check_chain(p, "ranks")
    with pytest.raises(
        ChainNotRun, match="recent reads 'matched', row view 'match_rows' of interval job 'pairing'"
    ):
        check_chain(p, "recent")


THREE = """\
topics:
  orders:
    fields: {order_id: id, customer_id: id, product_id: id, qty: long, ts: timestamp}
    key: order_id
    time: ts
    op: {upsert: upsert, remove: delete}
  customers:
    fields: {customer_id: id, tier: string, ts: timestamp}
    key: customer_id
    time: ts
    op: {upsert: upsert, remove: delete}
  products:
    fields: {product_id: id, price: double, category: string, ts: timestamp}
    key: product_id
    time: ts
    op: {upsert: upsert, remove: delete}
  tiered_orders: {from: {view: order_tiers}}
jobs:
  tiering:                      # orders x customers: per order its product, quantity and customer's tier
    join: {left: orders, right: customers, match: {customer_id: customer_id}}
    views:
      order_tiers: {row: {order_id: order_id}, fields: {product_id: product_id, qty: qty, tier: tier}}
  pricing:                      # (orders x customers) x products
    join: {left: tiered_orders, right: products, match: {product_id: product_id}}
    views:
      revenue: {agg: {tier: tier}, values: {orders: "count(*)", revenue: "sum(qty * price)", top: "max(price)"}}
      by_category: {count: {category: category}, values: {orders: 1, units: qty}}
"""


def _three_tables(rng: random.Random, n: int) -> list[tuple[str, dict]]:
    """Changes of three tables: orders of 6 customers for 5 products, each table with updates and removals (ties
    of time among them), in rough time order."""
    out = []
    for i in range(n):
        ts = T0 + i * 1_000 + rng.choice([0, 0, 500])
        kind = rng.random()
        if kind < 0.5:
            o = {"order_id": f"o{rng.randrange(30)}", "ts": ts}
            if rng.random() < 0.2:
                out.append(("orders", {"op": "delete", **o}))
            else:
                c, p = f"c{rng.randrange(6)}", f"p{rng.randrange(5)}"
                out.append(("orders", {"op": "upsert", **o, "customer_id": c, "product_id": p, "qty": rng.randrange(1, 4)}))  # fmt: skip
        elif kind < 0.75:
            c = {"customer_id": f"c{rng.randrange(6)}", "ts": ts}
            if rng.random() < 0.2:
                out.append(("customers", {"op": "delete", **c}))
            else:
                out.append(
                    ("customers", {"op": "upsert", **c, "tier": rng.choice(["gold", "silver", "basic"])})
                )
        else:
            p = {"product_id": f"p{rng.randrange(5)}", "ts": ts}
            if rng.random() < 0.2:
                out.append(("products", {"op": "delete", **p}))
            else:
                price = rng.randrange(2, 40) / 2
                out.append(("products", {"op": "upsert", **p, "price": price, "category": rng.choice("ab")}))
    return out


@pytest.mark.slow
def test_a_three_table_chain_with_changes_and_removals_on_every_table_equals_the_brute_force(
    spark, tmp_path, redis_url, tmp_path_factory
):
    pipeline = pipeline_file(tmp_path_factory, "three", THREE)
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=pipeline.file)
    rng = random.Random(12)
    changes = _three_tables(rng, 240)
    removed = {t for t, r in changes if r["op"] == "delete"}
    assert removed == {"orders", "customers", "products"}
    cuts = sorted(rng.sample(range(1, len(changes)), 2))
    batches = []
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(changes)], strict=True)):
        batch: dict[str, list[dict]] = {}
        for topic, rec in changes[a:b]:
            batch.setdefault(topic, []).append(rec)
        for topic, records in batch.items():
            path = write_jsonl(tmp_path / f"{topic}-{i}.jsonl", records)
            ingest(None, settings.lake, settings.topic(topic), [path])
        batches.append(batch)
        for job in ("tiering", "pricing"):
            job_spec(settings, job).run(spark, settings, once=True)
        want = brute_force(pipeline, batches)
        _check(settings, pipeline, want)  # after every batch
    assert len(want.export("revenue")) >= 2 and len(want.export("by_category")) == 2
    log = spark.read.format("delta").load(settings.lake.uri("tables/order_tiers/g1"))
    assert log.where("op = 'remove'").count() > 0  # keys left the middle view, and the last join followed


EVENTS = (
    PLAYS
    + """\
  players:
    fields: {player: id, tier: string, ts: timestamp}
    key: player
    time: ts
  enriched_plays: {from: {view: enriched}, id: play_id, time: ts}   # a log view's rows as events
jobs:
  enrich:                       # each play with its player's tier as of its time, held until the table reaches it
    asof: {stream: plays, table: players, match: {player: player}}
    views:
      enriched:
        log: {fields: {play_id: play_id, player: player, game: game, score: score, tier: tier, ts: ts}}
        where: "score IS NOT NULL"
  tally:                        # a select of the log's events: windows judge lateness by the log's versions
    select: {from: enriched_plays}
    views:
      per_tier_minute:
        agg: {tier: "coalesce(tier, 'none')"}
        window: {tumble: 1 min}
        values: {plays: "count(*)", points: sum(score), games: "count(distinct game)"}
      per_game: {count: {game: game}, values: {plays: 1, points: score}}
  recheck:                      # an asof job over the log's events: each enriched play with the tier in force now
    asof: {stream: enriched_plays, table: players, match: {player: player}}
    views:
      moved: {count: {was: "coalesce(enriched_plays.tier, 'none')"}, values: {plays: 1, changed: "if(enriched_plays.tier = players.tier, 0, 1)"}}
      per_player_minute:
        count: {player: player}
        window: {tumble: 1 min}
        values: {plays: 1}
  followups:                    # an interval job over the log's events: each enriched play and its player's next plays
    interval: {left: enriched_plays, right: plays, match: {player: player}, within: [1 s, 30 s], unmatched: true}
    views:
      followed: {count: {tier: "coalesce(tier, 'none')"}, values: {plays: 1, followed: "if(matches > 0, 1, 0)"}}
      followed_minute:
        agg: {game: game}
        window: {tumble: 1 min}
        values: {plays: "count(*)", matches: sum(matches)}
"""
)


@pytest.mark.slow
def test_a_log_view_read_as_events_by_select_asof_and_interval_jobs_equals_the_brute_force(
    spark, tmp_path, redis_url, tmp_path_factory
):
    pipeline = pipeline_file(tmp_path_factory, "events", EVENTS)
    settings = make_settings(
        tmp_path / "lake", redis_url, ALLOWED_LATENESS=f"{LATENESS_MS} ms", METRICS_PORT="off",
        MVIEW_PIPELINE=pipeline.file,
    )  # fmt: skip
    rng = random.Random(9)
    arrivals = _plays(rng, 240)
    for i in range(60):  # tiers change over the five minutes; the last change moves the table past every play
        t = T0 + i * 5_000 + rng.randrange(0, 3_000)
        arrivals.insert(rng.randrange(len(arrivals) + 1), ("players", {"player": f"u{rng.randrange(20)}", "tier": rng.choice("ab"), "ts": t}))  # fmt: skip
    arrivals.append(("players", {"player": "u0", "tier": "a", "ts": T0 + 400_000}))
    cuts = sorted(rng.sample(range(1, len(arrivals)), 2))
    batches = []
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(arrivals)], strict=True)):
        batch: dict[str, list[dict]] = {}
        for topic, rec in arrivals[a:b]:
            batch.setdefault(topic, []).append(rec)
        for topic, records in batch.items():
            ingest(
                None,
                settings.lake,
                settings.topic(topic),
                [write_jsonl(tmp_path / f"{topic}-{i}.jsonl", records)],
            )
        batches.append(batch)
        for job in ("enrich", "tally", "recheck", "followups"):
            job_spec(settings, job).run(spark, settings, once=True)
        want = brute_force(pipeline, batches, lateness_ms=LATENESS_MS)
        _check(settings, pipeline, want, spark)  # after every batch
    assert reads(settings, "tally") == {"enriched_plays": "outputs/enriched/g1"}
    assert want.late.get("tally", 0) > 0 and len(want.export("per_tier_minute")) >= 5
    assert len(want.export("moved")) >= 2 and len(want.export("per_player_minute")) >= 10
    assert {line["tier"] for line in want.export("followed")} >= {"a", "b"}
    assert len(want.export("followed_minute")) >= 5
    assert reads(settings, "followups") == {"enriched_plays": "outputs/enriched/g1"}
    log = spark.read.format("delta").load(settings.lake.uri("outputs/enriched/g1"))
    assert log.where("_max_before IS NOT NULL").count() > 0  # stamped by the upstream's batches
