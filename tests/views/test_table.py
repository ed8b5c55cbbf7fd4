"""`views.table`: an agg view (and a windowed count view) that another job reads as a table topic keeps the log of
its entries, written in the step that writes Redis: after every batch, the log's current table (per key the latest
batch's record, removes dropped) equals the view's export from Redis, however the batches are cut; a batch written
again after a partial write adds nothing to the log."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F

from changelog.storage import as_lake
from spec.viewtable import BATCH
from tests.views import test_window as w
from tests.views.test_agg import MODES, PIPELINE, _agg, _changes, _frame, _ops, _run, _same, server
from views.agg import AggView, export_aggs
from views.pipeline import parse_pipeline
from views.redis_io import connect, set_generation

READERS = (
    "  ride_totals: {from: {view: rides_by_city}}\n  trip_totals: {from: {view: trips_by_city}}\njobs:\n"
)


@pytest.fixture(scope="module")
def pipeline():
    return parse_pipeline(PIPELINE.replace("jobs:\n", READERS, 1), "rides.yml")


def _log(spark, agg):
    return spark.read.format("delta").load(agg.table.path)


def _current(spark, agg) -> dict:
    """The log's current table: per key the record of the latest batch, a remove dropping the key."""
    log = _log(spark, agg)
    key = agg.view.key_name
    rows = log.orderBy(BATCH).collect()
    out = {}
    for r in rows:
        d = r.asDict()
        if d.pop("op") == "remove":
            out.pop(d[key], None)
        else:
            d.pop(BATCH)
            out[d[key]] = d
    return out


def _assert_log(spark, client, agg):
    want = {line[agg.view.key_name]: line for line in export_aggs(client, agg.view)}
    got = _current(spark, agg)
    assert sorted(got) == sorted(want)
    bad = [k for k in want if not _same(got[k], want[k])]
    assert not bad, [(got[k], want[k]) for k in bad]


@server
@pytest.mark.parametrize("append_only", [False, True], ids=["removals", "append_only"])
def test_the_log_s_current_table_is_the_view_after_every_batch(
    spark, tmp_path, pipeline, redis_url, append_only
):
    client = connect(redis_url)
    set_generation(client, MODES[append_only][0], 1)
    agg = _agg(spark, tmp_path, pipeline, redis_url, append_only)
    assert agg.table is not None and _log(spark, agg).count() == 0  # there before the first batch
    ops = _ops(random.Random(3 + append_only), 30, append_only)
    _run(spark, pipeline, agg, ops, 10, check=lambda live: _assert_log(spark, client, agg))
    batches = {r[0] for r in _log(spark, agg).select(BATCH).distinct().collect()}
    assert batches and batches <= {1, 2, 3}  # a batch that changes no key of the view adds no record
    per_batch = _log(spark, agg).groupBy(BATCH, agg.view.key_name).count().where("count > 1").count()
    assert per_batch == 0  # one record per key and batch


@server
def test_a_batch_written_again_adds_nothing_to_the_log(spark, tmp_path, pipeline, redis_url):
    job, _ = MODES[False]
    client = connect(redis_url)
    set_generation(client, job, 1)
    agg = _agg(spark, tmp_path, pipeline, redis_url, False)
    ops = _ops(random.Random(9), 20, False)
    live = _run(spark, pipeline, agg, ops[:10], 10)
    before = _log(spark, agg).count()
    after = dict(live)
    for ident, row in ops[10:]:
        after[ident] = row
        if row is None:
            after.pop(ident)
    changes = _frame(spark, pipeline, job, _changes(live, after, [x for x, _ in ops[10:]]))
    step = agg.step(changes, 2)
    agg.stage(step)
    agg.table.write(step.lines, 2)  # the log written, then the driver dies before Redis
    written = _log(spark, agg).count()
    again = _agg(spark, tmp_path, pipeline, redis_url, False)  # a new process replays batch 2
    again.write(changes, 2)
    assert _log(spark, again).count() == written > before
    _assert_log(spark, client, again)
    assert _log(spark, again).where(F.col(BATCH) == 2).count() == written - before


@server
def test_a_view_no_job_reads_keeps_no_log(spark, tmp_path, redis_url):
    plain = parse_pipeline(PIPELINE, "rides.yml")
    agg = _agg(spark, tmp_path, plain, redis_url, True)
    assert agg.table is None and not (tmp_path / "lake" / "tables").exists()


@server
def test_windowed_views_log_their_windows_and_a_merged_or_retired_window_as_a_remove(
    spark, tmp_path, redis_url
):
    """The sessions and tumbling counts of `tests.views.test_window`: after every batch, each log's current table is
    the view's windows; a session merged into another, or no longer retained, is removed from the table."""
    text = w.PIPELINE.replace(
        "jobs:\n", "  streak_table: {from: {view: streaks}}\n  point_table: {from: {view: points}}\njobs:\n"
    )
    pipeline = parse_pipeline(text, "arcade.yml")
    client = connect(redis_url)
    set_generation(client, "arcade", 1)
    lake = as_lake(tmp_path / "lake")
    kw = {"append_only": True, "redis_url": redis_url, "generation": 1}
    views = [
        AggView(spark, lake, pipeline.views[n], pipeline, f"state/{n}", **kw) for n in ("streaks", "points")
    ]
    removes = 0
    for batch, plays, mark in w.BATCHES:
        for v in views:
            v.write(w._frame(spark, pipeline, plays), batch, watermark=mark * w.S)
            log = spark.read.format("delta").load(v.table.path)
            current: dict = {}
            for r in log.orderBy(BATCH).collect():
                d = r.asDict()
                at = (d["player"], d["window_start"])
                if d.pop("op") == "remove":
                    assert current.pop(at, None) is not None, (v.view.name, at)  # it was there
                else:
                    d.pop(BATCH)
                    current[at] = d
            want = {(x["player"], x["window_start"]): x for x in export_aggs(client, v.view)}
            assert current == want, (v.view.name, batch)
            removes = log.where("op = 'remove'").count() if v.view.name == "streaks" else removes
    assert removes >= 2  # bob's retired session and ann's merged one left the table
