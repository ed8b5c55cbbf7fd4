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

The counter deltas of a micro-batch are applied by a Lua script per key that adds them only if the key's
recorded `batch` is below the batch id, and records the batch id in the same call: a replayed batch adds nothing.
"""

from __future__ import annotations

from pathlib import Path

from views.keys import key_id, view_key, view_pattern
from views.redis_io import connect, current_generation

__all__ = [
    "COUNTRY_VIEW",
    "ENRICHED_VIEW",
    "UNKNOWN_COUNTRY",
    "enriched_path",
    "CountrySink",
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

_PIPELINE_OPS = 1000


def enriched_path(lake_dir: Path, generation: int) -> Path:
    """The Delta output log of `enriched_activity` for one generation."""
    return Path(lake_dir) / "outputs" / ENRICHED_VIEW / f"g{generation}"


def _apply_counts(rows, url: str, generation: int, batch_id: int) -> None:
    client = connect(url)
    sha = client.script_load(_FENCED_INCR_LUA)
    pipe = client.pipeline(transaction=False)
    n = 0
    for country, events in rows:
        pipe.evalsha(sha, 1, view_key(COUNTRY_VIEW, generation, country), batch_id, int(events))
        n += 1
        if n % _PIPELINE_OPS == 0:
            pipe.execute()
    pipe.execute()


class CountrySink:
    """Adds a micro-batch's per-country event counts (`country, events`) to generation `generation`, fenced by
    batch id: one pipeline of fenced Lua calls (one per country key) per Spark partition or per call."""

    def __init__(self, url: str, generation: int):
        self.url, self.generation = url, generation

    def write(self, counts_df, batch_id: int) -> None:
        """From the executors: each partition of `counts_df` (`country, events`) in one pipeline."""
        url, generation = self.url, self.generation
        counts_df.foreachPartition(lambda rows: _apply_counts(rows, url, generation, batch_id))

    def apply(self, counts, batch_id: int) -> None:
        """From the caller's process: `counts` is an already aggregated, small list of `(country, events)`
        (one row per country), so one pipeline from here costs one round trip and no Spark job."""
        _apply_counts(counts, self.url, self.generation, batch_id)


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
    line's field order. Nothing if the job has not published that generation yet."""
    path = enriched_path(lake_dir, generation)
    if not (path / "_delta_log").exists():
        return
    cols = ["event_id", "user_id", "action", "ts", "profile_version", "name", "country"]
    df = spark.read.format("delta").load(str(path)).select(*cols).orderBy("event_id")
    for row in df.toLocalIterator():
        yield {c: row[c] for c in cols}
