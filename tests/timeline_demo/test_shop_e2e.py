"""The shop pipeline (`timeline_demo/pipelines/shop.yml`) end to end, every view compared with the brute force of
the contract's definitions (`timeline_demo.brute`) for the same records cut into the same batches:

1. whole, through the installed `mview`, with `customers` also captured from a real PostgreSQL: a generated
   workload with bad lines, duplicates, late orders and Debezium change events of `customers`, one `mview ingest
   --json` per topic (the accepted and rejected counts, and a dead letter with file, line and text for exactly the
   lines the brute force rejects); then `mview run cdc --once` twice around inserts, updates (with and without
   `updated_at`), a delete, a re-insert and two changes of a row in one transaction: the records the log gains are
   exactly the committed changes (one per key and transaction, the time `updated_at` or the commit time); then
   `mview run JOB --once --json` of each job (the first through the installed command, the others through
   `jobs.ops.cli.main` in this process, on the tests' Spark session: no JVM of their own), `mview export` of
   every view, `mview query --json` of a sample of keys and `mview status --json`, all equal to the brute force
   fed the files' records and the captured ones;
2. chunked: the same kind of workload cut into batches at random points (the late records in the last batch, so
   `paid` drops them as late and `orders_enriched` keeps them, counted as `late_events_kept`), each batch ingested and every job run once, in this process on the tests' Spark
   session (the commands' own code paths: `ingest`, `job_spec(...).run(once=True)`, `export_view`); then a
   definition change with no failed read: readers query `newest_orders` in a loop (`views.read.query_view` in a
   thread, the installed `mview query` in another) while the file's `cap` and the view's `where` change and
   `customer_orders` runs again: it builds generation 2 while 1 serves (its status says `definition changed`),
   switches, and every read is either the old definition's answer in generation 1 or the new one's in 2; the views
   then equal the brute force of the new definition.
"""

from __future__ import annotations

import os
import random
import time
from datetime import datetime, timezone

import pytest

from jobs.core.registry import job_spec
from jobs.core.runtime import read_status
from jobs.ops.status import job_status
from tests.jobs.opshelp import mview_here
from tests.pghelp import log_commits
from tests.timeline_demo.e2ehelp import (
    Readers,
    assert_same,
    check_dead_letters,
    cli,
    cli_exports,
    exports_here,
    last_json,
    log_records,
    query_sample,
    random_batches,
    run_here,
    scenario_settings,
)
from timeline_demo.brute import brute_force
from timeline_demo.shop import PIPELINE, T0, generate_shop
from views.pipeline import load_pipeline
from views.redis_io import connect, current_generation

pytestmark = pytest.mark.slow

JOBS = ("paid", "orders_enriched", "customer_orders", "order_totals")
H = 3_600_000


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _capture(settings, pg, table: str) -> tuple[list, list]:
    """Changes of the captured `customers` table, `mview run cdc --once` after its first rows (the snapshot) and
    after the others (the stream). Returns what the log must have gained: (customer_id, op, tier, ts), ts None
    where it is the snapshot's or a commit's time."""
    cols = "(customer_id, name, tier, country, updated_at)"
    pg.sql(
        f"CREATE TABLE {table} (customer_id text PRIMARY KEY, name text, tier text, country text,"
        " updated_at timestamptz)",
        f"INSERT INTO {table} {cols} VALUES ('c1', 'Pg', 'gold', 'DE', %(a)s), ('c2', 'Pg', 'gold', 'FR', %(b)s),"
        " ('c3', 'Pg', 'silver', 'NL', %(c)s), ('pg1', 'Pg', 'gold', 'US', NULL)",
        params={"a": _at(T0 + H), "b": _at(T0 + 2 * H + 1_800_000), "c": _at(T0 + 3 * H)},
    )
    snap = last_json(cli(settings, "run", "cdc", "--once", "--json"))
    assert snap["snapshot_rows"] == 4, snap
    pg.sql(
        f"UPDATE {table} SET tier = 'bronze', updated_at = %s WHERE customer_id = 'c1'",
        params=(_at(T0 + 4 * H),),
    )
    pg.sql(
        f"UPDATE {table} SET tier = 'silver', updated_at = NULL WHERE customer_id = 'c2'"
    )  # the commit time
    pg.sql(f"DELETE FROM {table} WHERE customer_id = 'c3'")
    pg.sql(  # earlier than the delete's commit time: in force as of then, gone from the current table
        f"INSERT INTO {table} {cols} VALUES ('c3', 'Pg', 'platinum', 'NL', %s)", params=(_at(T0 + 5 * H),)
    )
    pg.sql(  # two changes of a row in one transaction: one record, the last
        f"INSERT INTO {table} {cols} VALUES ('pg2', 'Pg', 'bronze', 'JP', NULL)",
        f"UPDATE {table} SET tier = 'gold' WHERE customer_id = 'pg2'",
    )
    streamed = last_json(cli(settings, "run", "cdc", "--once", "--json"))
    assert streamed["appended"] == 5, streamed
    snapshot = [("c1", "upsert", "gold", T0 + H), ("c2", "upsert", "gold", T0 + 2 * H + 1_800_000)]
    snapshot += [("c3", "upsert", "silver", T0 + 3 * H), ("pg1", "upsert", "gold", None)]
    stream = [("c1", "upsert", "bronze", T0 + 4 * H), ("c2", "upsert", "silver", None)]
    stream += [
        ("c3", "delete", None, None),
        ("c3", "upsert", "platinum", T0 + 5 * H),
        ("pg2", "upsert", "gold", None),
    ]
    return snapshot, stream


def test_whole_through_the_installed_cli_with_customers_captured_from_postgres(
    spark, tmp_path, redis_url, pg
):
    table = f"shop_{pg.slot}"
    shop = tmp_path / "shop.yml"
    shop.write_text(PIPELINE.read_text().replace("public.customers", f"public.{table}"))
    pipeline = load_pipeline(shop)
    feed = generate_shop(orders=300, seed=21, duplicates=0.05, bad=0.03, late=4, debezium=0.3)
    files = feed.write(tmp_path / "in")
    (batch,) = feed.batches(1)
    settings = scenario_settings(tmp_path / "lake", redis_url, shop, PG_DSN=pg.dsn, PG_SLOT=pg.slot)
    from_files = brute_force(pipeline, [batch])
    assert sum(from_files.rejected.values()) > 0

    for topic, paths in files.items():
        summary = last_json(cli(settings, "ingest", topic, *paths, "--json"))
        assert summary == {
            "topic": topic,
            "accepted": from_files.accepted[topic],
            "rejected": from_files.rejected[topic],
        }
    assert check_dead_letters(settings, pipeline, files) == sum(from_files.rejected.values())

    ingested = len(log_commits(settings.lake_dir, settings.topic("customers")))
    start = _now_ms() - 1_000
    snapshot, stream = _capture(settings, pg, table)
    end = _now_ms() + 1_000
    captured = log_records(settings.lake_dir, settings.topic("customers"), ingested)
    got = [(r["customer_id"], r["op"], r.get("tier"), r["ts"]) for r in captured]
    got_snapshot, got_stream = sorted(got[: len(snapshot)], key=str), got[len(snapshot) :]
    assert len(got) == len(snapshot) + len(stream), got
    for (k, op, tier, ts), (*what, at) in zip(got_snapshot + got_stream, snapshot + stream, strict=True):
        assert [k, op, tier] == what, got
        assert ts == at if at is not None else start <= ts <= end, (k, ts)  # the snapshot's or commit time
    want = brute_force(pipeline, [{**batch, "customers": batch["customers"] + captured}])
    assert any(want.export(v) != from_files.export(v) for v in pipeline.views)  # the captured changes count

    for i, job in enumerate(JOBS):  # the first through the installed command, the others on the session's JVM
        args = ("run", job, "--once", "--json")
        run = cli(settings, *args) if i == 0 else mview_here(settings, *args)
        totals = last_json(run)
        assert run.returncode == 0 and totals["job"] == job and totals["batches"] == 1, (run.stderr, totals)
    assert want.late == {"paid": 0}  # one batch: nothing is late
    assert want.held == {
        "orders_enriched": 0
    }  # the clock records moved the customers' watermark past every order

    exported = cli_exports(settings, pipeline.views)
    for view in pipeline.views:
        assert exported[view], view
        assert_same(exported[view], want.export(view), f"export {view}")
    assert query_sample(settings, want, through_cli=True) >= 6 * 3

    status = last_json(cli(settings, "status", "--json"))
    for job in JOBS:
        s = status[job]
        assert (s["running"], s["generation"], s["lag_versions"]) == (False, 1, 0), (job, s)
        assert s["rejected"] == sum(want.rejected[t] for t in pipeline.jobs[job].topics), (job, s)
    assert status["paid"]["late"] == 0 and status["orders_enriched"]["held"] == 0


def _write(path, text: str) -> None:
    """Replace the file at once (a reader starting `mview query` meanwhile reads the old file or the new one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _changed(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_chunked_at_random_then_a_changed_definition_rebuilds_while_readers_read(spark, tmp_path, redis_url):
    shop = tmp_path / "shop.yml"
    text = PIPELINE.read_text()
    shop.write_text(text)
    pipeline = load_pipeline(shop)
    feed = generate_shop(orders=300, seed=22, duplicates=0.05, bad=0.03, late=4)
    batches = random_batches(feed, 3, random.Random(22))
    want = brute_force(pipeline, batches)
    # each late order and its payment; the late orders, left out of the windowed views
    assert want.late == {"paid": 2 * 4, "order_totals": 4}
    assert want.late_kept == {"orders_enriched": 4}  # the same late orders: an as-of lookup keeps them
    settings = scenario_settings(tmp_path / "lake", redis_url, shop)

    totals = run_here(spark, settings, pipeline, batches, tmp_path / "in")

    got = exports_here(spark, settings, pipeline)
    for view in pipeline.views:
        assert_same(got[view], want.export(view), f"export {view}")
    query_sample(settings, want, through_cli=False)
    assert sum(t["late"] for t in totals["paid"]) == want.late["paid"]
    status = job_status(settings)
    assert status["paid"]["late"] == want.late["paid"]
    assert status["orders_enriched"]["held"] == want.held["orders_enriched"]
    kept = status["orders_enriched"]
    assert kept["late_events_kept"] == want.late_kept["orders_enriched"] and "late_events" not in kept, kept

    # a definition change: the list's cap and its where at once
    new_text = _changed(
        _changed(text, "cap: 5\n", "cap: 3\n"),
        "entries: order_ids\n",
        'entries: order_ids\n        where: "amount >= 100"\n',
    )
    client, view, generation = connect(redis_url), "newest_orders", 2
    old = want
    new_file = tmp_path / f"shop-{generation}.yml"
    new_file.write_text(new_text)
    want = brute_force(load_pipeline(new_file), batches)
    bare = lambda r: {k: v for k, v in r.items() if k != "generation"}  # noqa: E731
    changed = [k for k in old.keys(view) if bare(old.query(view, k)) != bare(want.query(view, k))]
    assert changed, generation
    keys = [changed[0], changed[len(changed) // 2], "no such key"]
    readers = Readers(settings, view, keys).start()
    readers.wait_after(0)
    changed_at = time.monotonic()
    _write(shop, new_text)
    job_spec(settings, "customer_orders").run(spark, settings, once=True)
    switched = time.monotonic()
    readers.wait_after(switched)
    reads = readers.stop()

    assert current_generation(client, "customer_orders") == generation
    assert current_generation(client, "paid") == current_generation(client, "orders_enriched") == 1
    last = read_status(settings, "customer_orders", "status.json")["last_rebuild"]
    assert last["generation"] == generation and last["reason"].startswith("definition changed"), last
    answers = {
        k: (old.query(view, k, generation=generation - 1), want.query(view, k, generation=generation))
        for k in keys
    }
    wrong = [(who, k, got) for who, k, _, got in reads if got not in answers[k]]
    assert not wrong, wrong[:3]  # no failed read, none but the old answer or the new one
    assert all(got == answers[k][0] for _, k, at, got in reads if at < changed_at)
    assert all(got == answers[k][1] for _, k, at, got in reads if at > switched)
    got = exports_here(spark, settings, settings.pipeline())
    for v in ("newest_orders", "open_by_tier"):
        assert_same(got[v], want.export(v), f"export {v} in generation {generation}")
