"""Generations of a job's views: which exist (in Redis and in the lake), and dropping one.

A generation g of job J is: the Redis keys `mv:<kind>:<g>:*` for every view and extra key kind of J (see
`JobSpec.extra_keys`) plus `mv:meta:<J>:<g>`, and the lake dirs `checkpoints/<J>/g<g>` and `state/<J>/g<g>`.
Readers only ever see the generation `mv:gen:<J>` points at; every other generation is either being built by a
replay (its marker `jobs/<J>/replay.json` names it while the replaying process holds the job's replay lease,
`replay_lease_key`) or garbage. Every lake file is read and removed through `settings.lake` by key.

Redis is a cache of the logs, and it may lose what it holds (a restart without persistence, FLUSHALL, a restore of
an older snapshot). The lake says what the serving copy must hold: the serving generation's checkpoint lists the
micro-batches Spark committed, and every job records each micro-batch it applies, before Spark commits it, in the
generation's meta hash (`record_batch`: `last_batch_id`). `serving_copy_lost` compares the two. `record_batch`
never re-creates a meta hash that vanished and never moves `last_batch_id` across a gap, so batches written after
a loss cannot hide it.
"""

from __future__ import annotations

import json
import re

import redis

from jobs.core.lease import holder_of
from jobs.core.registry import JobSpec
from jobs.core.runtime import (
    checkpoint_key,
    committed_batches,
    job_key,
    read_status,
    replay_lease_key,
    state_key,
)
from jobs.core.settings import Settings
from views.errors import Fenced
from views.fence import UNFENCED, Fence, is_cluster_client
from views.keys import gen_key, meta_key, view_pattern
from views.log import log_key
from views.table import table_key

__all__ = [
    "key_kinds",
    "generations",
    "drop_generation",
    "replay_in_progress",
    "record_batch",
    "last_committed_batch",
    "lake_generation",
    "serving_copy_lost",
    "definition_changed",
    "definition_diff",
    "definition_of",
    "record_definition",
    "recorded_definition",
    "DEFINITION_CHANGED",
]

_GEN_DIR = re.compile(r"^g(\d+)$")


def key_kinds(spec: JobSpec) -> tuple[str, ...]:
    return tuple(spec.views) + tuple(spec.extra_keys)


def generations(settings: Settings, client, spec: JobSpec) -> set[int]:
    """Every generation of `spec` with a key in Redis or a checkpoint/state dir in the lake."""
    found: set[int] = set()
    for kind in (*key_kinds(spec), "meta"):
        prefix = f"mv:{kind}:" if kind != "meta" else f"mv:meta:{spec.name}:"
        for key in client.scan_iter(match=prefix + "*", count=1000):
            rest = key.decode()[len(prefix) :]
            g = rest.split(":", 1)[0]
            if g.isdigit():
                found.add(int(g))
    for root in ("checkpoints", "state"):
        found.update(_lake_generations(settings, root, spec.name))
    return found


def _lake_generations(settings: Settings, root: str, job: str) -> list[int]:
    """The generations with a directory under `<root>/<job>` in the lake."""
    return [
        int(m.group(1)) for e in settings.lake.list(root, job) if e.is_dir and (m := _GEN_DIR.match(e.name))
    ]


def replay_in_progress(settings: Settings, job: str) -> int | None:
    """The generation a live replay is building for `job` (its marker names it, unfinished, and the job's replay
    lease has a holder that may be alive: `jobs.core.lease.holder_of`), else None."""
    marker = read_status(settings, job, "replay.json")
    gen = marker.get("building")
    if gen is None or marker.get("finished"):
        return None
    return int(gen) if holder_of(settings.lake, replay_lease_key(job)) is not None else None


def drop_generation(settings: Settings, client, spec: JobSpec, generation: int, *, files: bool = True) -> int:
    """Remove generation `generation` of `spec`: its Redis keys (SCAN + UNLINK, in batches of 1,000) and, with
    `files`, its checkpoint and state dirs, the output logs of its `log` views, the table logs of its views other jobs
    read (`views.table`) and the late records it set aside.
    Returns the number of Redis keys removed. Never call it on the serving generation."""
    removed = 0
    patterns = [view_pattern(kind, generation) for kind in key_kinds(spec)]
    for pattern in patterns:
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                removed += client.unlink(*batch)
                batch = []
        if batch:
            removed += client.unlink(*batch)
    removed += client.unlink(meta_key(spec.name, generation))
    if files:
        for key in (
            checkpoint_key(spec.name, generation),
            state_key(spec.name, generation),
            f"{job_key(spec.name)}/late/g{generation}",
            *(log_key(view, generation) for view in spec.views),
            *(table_key(view, generation) for view in spec.views),
        ):
            settings.lake.delete_tree(key)
        settings.lake.delete(_definition_key(spec.name, generation))
    return removed


# KEYS[1] = the job's fence (`views.fence`), KEYS[2] = the meta hash; ARGV[1] = the writer's lease epoch, ARGV[2] =
# the batch id ("" for fields only), ARGV[3..] = field, value, ...
_RECORD_BATCH = """
local e = redis.call('GET', KEYS[1])
if e and tonumber(e) > tonumber(ARGV[1]) then
  return redis.error_reply('FENCED: epoch ' .. ARGV[1] .. ' is below the fence ' .. e .. ' of ' .. KEYS[1])
end
local b = ARGV[2]
local extra = {}
for i = 3, #ARGV do extra[#extra + 1] = ARGV[i] end
if b == '' then
  if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
else
  local last = redis.call('HGET', KEYS[2], 'last_batch_id')
  local n = tonumber(b)
  if last then
    if tonumber(last) < n - 1 then return 0 end
    if tonumber(last) > n then b = last end
  elseif n ~= 0 then
    return 0
  end
  extra[#extra + 1] = 'last_batch_id'
  extra[#extra + 1] = b
end
if #extra > 0 then redis.call('HSET', KEYS[2], unpack(extra)) end
return 1
"""


def record_batch(
    client, job: str, generation: int, batch_id: int | None, *, fence: Fence = UNFENCED, **fields
) -> bool:
    """Record in `mv:meta:<job>:<generation>` that micro-batch `batch_id` was applied to Redis, with `fields`.

    Every job calls it for every micro-batch, an empty one included, before the batch is committed. The hash is
    created only by batch 0 of a generation, and `last_batch_id` moves only from `batch_id - 1` or later: a hash
    that vanished or fell behind (Redis lost data) stays so, for `serving_copy_lost` to see. With `batch_id`
    None, `fields` are written only if the hash exists. Returns whether anything was written. Fenced
    (`views.fence`): a writer whose lease epoch (`fence`) is below the job's fence writes nothing and gets
    `views.errors.Fenced`."""
    args: list = [fence.epoch, "" if batch_id is None else int(batch_id)]
    for k, v in fields.items():
        args += [k, "" if v is None else v]
    key = meta_key(job, generation)
    try:
        return bool(client.eval(_RECORD_BATCH, 2, fence.key_for(key, is_cluster_client(client)), key, *args))
    except redis.ResponseError as e:
        if str(e).startswith("FENCED"):
            raise Fenced(f"recording batch {batch_id} of {job}", str(e)) from None
        raise


def last_committed_batch(settings: Settings, job: str, generation: int) -> int | None:
    """The id of the last micro-batch Spark committed in `generation`'s checkpoint, None if none."""
    return max(committed_batches(settings.lake, checkpoint_key(job, generation)), default=None)


def lake_generation(settings: Settings, job: str) -> int:
    """The generation the lake says `job` last served: the one in its status file if that generation committed a
    micro-batch, else the newest generation that did; 0 if the job never published anything."""
    recorded = read_status(settings, job, "status.json").get("generation")
    if isinstance(recorded, int) and last_committed_batch(settings, job, recorded) is not None:
        return recorded
    found = _lake_generations(settings, "checkpoints", job)
    published = [g for g in found if last_committed_batch(settings, job, g) is not None]
    return max(published, default=0)


def serving_copy_lost(settings: Settings, client, spec: JobSpec) -> str | None:
    """Why Redis no longer holds the whole serving copy of `spec`'s views, or None if it does (or the job never
    published). Raises redis errors when Redis does not answer.

    Lost when the pointer `mv:gen:<job>` is gone while the lake shows the job published; or the serving
    generation's checkpoint has committed batches but its meta hash is gone or records an older batch. The
    checkpoint is read before Redis: a batch is recorded in Redis before Spark commits it, so a batch that
    commits between the two reads cannot look lost.
    """
    job = spec.name
    published = lake_generation(settings, spec.name)
    pointer = client.get(gen_key(job))
    if pointer is None:
        if published:
            return f"the generation pointer {gen_key(job)} is gone; the lake has generation {published}"
        return None
    serving = int(pointer)
    committed = last_committed_batch(settings, job, serving)
    if committed is None:
        return None
    recorded = client.hget(meta_key(job, serving), "last_batch_id")
    if recorded is None:
        return f"{meta_key(job, serving)} is gone; the checkpoint has batch {committed}"
    if int(recorded) < committed:
        return f"{meta_key(job, serving)} records batch {int(recorded)}; the checkpoint has batch {committed}"
    return None


DEFINITION_CHANGED = "definition changed"


def definition_changed(settings: Settings, client, spec: JobSpec) -> str | None:
    """Why the serving generation of `spec` cannot go on serving the job as the pipeline now declares it, or None:
    its meta hash records the fingerprint of another definition (`spec.model.Pipeline.fingerprint`: the job, its
    views and the topics they read). Starts with `DEFINITION_CHANGED`, then what changed (`definition_diff`: `definition changed: view
    members: cap 5 -> 10, where`) when the lake holds the generation's definition (`record_definition`), else the
    two fingerprints. A generation that has published nothing yet takes the definition of its first batch. Raises
    redis errors when Redis does not answer."""
    if spec.source:
        return None
    pointer = client.get(gen_key(spec.name))
    if pointer is None:
        return None
    serving = int(pointer)
    built = client.hget(meta_key(spec.name, serving), "fingerprint")
    wanted = settings.pipeline().fingerprint(spec.name)
    if built is None:  # nothing published yet: the first batch records the definition
        return None
    if built.decode() != wanted:
        what = definition_diff(
            recorded_definition(settings, spec.name, serving), definition_of(settings, spec.name)
        )
        if what:
            return f"{DEFINITION_CHANGED}: {what}"
        return f"{DEFINITION_CHANGED}: generation {serving} was built from {built.decode()}; the pipeline's is {wanted}"
    return None


def _definition_key(job: str, generation: int) -> str:
    return f"{job_key(job)}/definition/g{generation}.json"


def definition_of(settings: Settings, job: str) -> dict:
    """What a generation of `job` is built from, as plain data (`spec.model.Pipeline.definition`, what its
    fingerprint hashes): the job with its views (`job`) and the topics it reads (`topics`)."""
    return settings.pipeline().definition(job)


def record_definition(settings: Settings, job: str, generation: int) -> None:
    """Record in the lake (`jobs/<job>/definition/g<generation>.json`) the definition `generation` is built from
    (`definition_of`), for `definition_changed` to say what changed."""
    settings.lake.write_json(definition_of(settings, job), _definition_key(job, generation))


def recorded_definition(settings: Settings, job: str, generation: int) -> dict | None:
    """The definition `record_definition` recorded for `generation`, None when there is none."""
    return settings.lake.read_json(_definition_key(job, generation))


def definition_diff(old: dict | None, new: dict) -> str:
    """What differs from definition `old` to `new` (`definition_of`), e.g. `view members: cap 5 -> 10, where;
    view top added; topic orders: fields`; "" when `old` is None or nothing differs."""
    if not old:
        return ""
    parts = []
    views = [{v["name"]: v for v in d["job"]["views"]} for d in (old, new)]
    for name in [*views[0], *(n for n in views[1] if n not in views[0])]:
        a, b = views[0].get(name), views[1].get(name)
        if a is None or b is None:
            parts.append(f"view {name} {'added' if a is None else 'removed'}")
        elif a != b:
            parts.append(f"view {name}: {_changed_keys(a, b)}")
    rest = [{k: v for k, v in d["job"].items() if k != "views"} for d in (old, new)]
    if rest[0] != rest[1]:
        parts.append(f"job {new['job']['name']}: {_changed_keys(*rest)}")
    for topic in sorted(old["topics"].keys() | new["topics"].keys()):
        a, b = old["topics"].get(topic), new["topics"].get(topic)
        if a != b:
            parts.append(f"topic {topic}: {_changed_keys(a or {}, b or {})}")
    return "; ".join(parts)


def _changed_keys(a: dict, b: dict) -> str:
    """The keys whose values differ, each with `old -> new` when both are numbers or booleans."""
    out = []
    for k in [*a, *(k for k in b if k not in a)]:
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            out += [f"{k}.{part}" for part in _changed_keys(x, y).split(", ")]
        elif all(isinstance(v, (int, float)) or v is None for v in (x, y)):
            out.append(f"{k} {_plain_value(x)} -> {_plain_value(y)}")
        else:
            out.append(k)
    return ", ".join(out)


def _plain_value(v) -> str:
    return "none" if v is None else json.dumps(v)
