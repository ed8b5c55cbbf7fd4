"""The views of the `enrichment` job: `enriched_activity` (an output log) and `activity_by_country` (Redis).

`enriched_activity` is a Delta table per generation, `LAKE_DIR/outputs/enriched_activity/g<g>`, one row per
emitted event (`event_id, user_id, action, ts, profile_version, name, country`, deduplicated by `event_id`), so
other jobs can read it as a stream. Each micro-batch appends with Delta's idempotent-write options
(`txnAppId` = the job and generation, `txnVersion` = the batch id): a batch that Spark replays after a crash
is not written twice. `export_enriched` reads the serving generation's table, ordered by `event_id`.

`activity_by_country` lives in Redis, one hash per country (`"unknown"` for a null country):

| key | type | content |
|---|---|---|
| `mv:activity_by_country:<g>:{<country>}` | hash | `events`: emitted events of that country; `batch`: last batch id applied |
| `mv:meta:enrichment:<g>` | hash | `last_batch_id`, `last_batch_ms`, `watermark` of the generation |

The counter deltas of a micro-batch (`country_counts` of the join's decided rows) are applied by a Lua script per
key that adds them only if the key's recorded `batch` is below the batch id, and records the batch id in the same
call: a replayed batch adds nothing (`CountrySink`). The output log's appends are `EnrichedLogSink`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelog.topics import ensure_delta_table, table_version
from joins.asof import ENRICHED_COLUMNS
from views.keys import key_id, view_key, view_pattern
from views.redis_io import Forwarder, current_generation, pack, sink_client

__all__ = [
    "COUNTRY_VIEW",
    "ENRICHED_VIEW",
    "UNKNOWN_COUNTRY",
    "enriched_path",
    "CountryCounts",
    "country_counts",
    "CountrySink",
    "EnrichedLogSink",
    "query_activity_by_country",
    "export_activity_by_country",
    "export_enriched",
]

ENRICHED_VIEW = "enriched_activity"
COUNTRY_VIEW = "activity_by_country"
UNKNOWN_COUNTRY = "unknown"

_FENCED_INCR_LUA = """
local last = tonumber(redis.call('HGET', KEYS[1], 'batch') or '-1')
local b = tonumber(ARGV[1])
if last >= b then return 0 end
redis.call('HINCRBY', KEYS[1], 'events', ARGV[2])
redis.call('HSET', KEYS[1], 'batch', b)
return 1
"""
_FENCED_INCR_SHA = hashlib.sha1(_FENCED_INCR_LUA.encode()).hexdigest()

_OUT_SCHEMA = ", ".join(f"{c} {'bigint' if c == 'ts' else 'string'}" for c in ENRICHED_COLUMNS)


def enriched_path(lake_dir: Path, generation: int) -> Path:
    """The Delta output log of `enriched_activity` for one generation."""
    return Path(lake_dir) / "outputs" / ENRICHED_VIEW / f"g{generation}"


def _apply_counts(rows, url: str, generation: int, batch_id: int) -> int:
    """Add each `(country, events)` of `rows` with fenced calls, pipelined; the number of keys added to."""
    with Forwarder(sink_client(url), what="activity_by_country sink", scripts=(_FENCED_INCR_LUA,)) as out:
        for country, events in rows:
            key = view_key(COUNTRY_VIEW, generation, country)
            out.add(pack("EVALSHA", _FENCED_INCR_SHA, 1, key, batch_id, int(events)), 1, key)
    return out.ints


@dataclass(frozen=True)
class CountryCounts:
    """One micro-batch of the join's decided rows, counted: `counts`, the `(country, events)` rows of the emitted
    events (`"unknown"` for a null country; what `CountrySink.write` takes), and the numbers of `emitted`,
    `held` and emitted-with-an-unknown-version (`unknown`) events."""

    counts: list[tuple[str, int]]
    emitted: int
    held: int
    unknown: int


def country_counts(decided: DataFrame) -> CountryCounts:
    """Count `joins.asof.AsofResult.decided` (one small aggregate, collected on the driver)."""
    country = F.coalesce("country", F.lit(UNKNOWN_COUNTRY)).alias("country")
    stats = (
        decided.groupBy("emit", country)
        .agg(F.count("*").alias("n"), F.count(F.when(F.col("unknown_version"), 1)).alias("u"))
        .collect()
    )
    counts = [(r["country"], r["n"]) for r in stats if r["emit"]]
    return CountryCounts(
        counts=counts,
        emitted=sum(n for _, n in counts),
        held=sum(r["n"] for r in stats if not r["emit"]),
        unknown=sum(r["u"] for r in stats if r["emit"]),
    )


class CountrySink:
    """Adds a micro-batch's per-country event counts to generation `generation` of `activity_by_country`,
    fenced by batch id (one fenced Lua call per country key)."""

    def __init__(self, url: str, generation: int):
        self.url, self.generation = url, generation

    def write(self, changes, batch_id: int) -> dict:
        """Add `changes`, one row per country (`country, events`), and return `{"countries": keys added to}`
        (0 for a batch already applied). `changes` is a DataFrame, applied from the executors (one pipeline per
        partition), or the same rows already collected on the driver (a list of `(country, events)`, as
        `country_counts` gives them), applied from this process in one pipeline, without a Spark job."""
        url, generation = self.url, self.generation
        if not isinstance(changes, DataFrame):
            return {"countries": _apply_counts(changes, url, generation, batch_id)}
        added = changes.sparkSession.sparkContext.accumulator(0)
        changes.foreachPartition(lambda rows: added.add(_apply_counts(rows, url, generation, batch_id)))
        return {"countries": added.value}


class EnrichedLogSink:
    """Appends a micro-batch's emitted events to the `enriched_activity` output log at `path` (created if
    missing), idempotent by batch id: Delta `txnAppId` `<app_id>-out`, `txnVersion` the batch id."""

    def __init__(self, spark, path: Path, app_id: str):
        self.spark, self.app_id = spark, app_id
        self.path = ensure_delta_table(spark, Path(path), _OUT_SCHEMA)

    def write(self, changes: DataFrame, batch_id: int) -> dict:
        """Append `changes` (ENRICHED_COLUMNS, extra columns dropped); a batch id already appended adds
        nothing. Returns `{}`: the caller knows how many rows it emitted."""
        (
            changes.select(*ENRICHED_COLUMNS)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", f"{self.app_id}-out")
            .option("txnVersion", batch_id)
            .save(self.path)
        )
        return {}

    def event_ids(self, ts_from: int, ts_to: int) -> DataFrame:
        """`event_id` of every event in the log with `ts_from <= ts <= ts_to` (the range lets Delta's file
        statistics skip the rest of the log)."""
        log = self.spark.read.format("delta").load(self.path)
        return log.where(F.col("ts").between(ts_from, ts_to)).select("event_id")


def query_activity_by_country(client, country: str, *, job: str = "enrichment") -> dict:
    """`{"country","events":N}` (N = 0 for a country with no event yet)."""
    generation = current_generation(client, job)
    value = client.hget(view_key(COUNTRY_VIEW, generation, country), "events")
    return {"country": country, "events": int(value) if value is not None else 0}


def export_activity_by_country(client, *, job: str = "enrichment"):
    """Every country with its count, `{"country","events":N}`, ordered by country."""
    generation = current_generation(client, job)
    keys = sorted(client.scan_iter(match=view_pattern(COUNTRY_VIEW, generation), count=1000), key=key_id)
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        pipe = client.pipeline(transaction=False)
        for k in chunk:
            pipe.hget(k, "events")
        for k, v in zip(chunk, pipe.execute(), strict=True):
            yield {"country": key_id(k), "events": int(v or 0)}


def export_enriched(spark, lake_dir: Path, generation: int):
    """Every row of the generation's `enriched_activity` log, ordered by `event_id`, as dicts in the export
    line's field order. Nothing if the job has not published that generation yet (no committed version: Spark
    makes `_delta_log` before it writes version 0)."""
    path = enriched_path(lake_dir, generation)
    if table_version(path) < 0:
        return
    df = spark.read.format("delta").load(str(path)).select(*ENRICHED_COLUMNS).orderBy("event_id")
    for row in df.toLocalIterator():
        yield {c: row[c] for c in ENRICHED_COLUMNS}
