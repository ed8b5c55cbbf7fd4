"""A list view's read side, without Spark: a key's list with its entries' bodies (`read_list`, `query_list`) and
every key's export line (`export_list`), each key's list and `.reads` set read in one atomic script call."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson
from redis.cluster import RedisCluster
from redis.commands.core import Script

from spec.model import Pipeline, View
from views.errors import ViewError
from views.keys import (
    READS,
    entry_key,
    heavy_key,
    key_id,
    list_key,
    meta_key,
    reads_key,
    view_pattern,
    window_key,
)
from views.redis_io import current_generation

__all__ = ["read_list", "query_list", "export_list", "item_entry_name"]


def _entry_field(view: View) -> str | None:
    """The name of `view`'s field whose expression is the entry's (written alike, backquotes aside), or None."""
    entry = view.entry.strip("` ")
    return next((name for name, sql in view.fields if sql.strip("` ") == entry), None)


_COLUMN = re.compile(r"\s*(?:`?[A-Za-z_]\w*`?\s*\.\s*)?`?([A-Za-z_]\w*)`?\s*")


def item_entry_name(view: View) -> str | None:
    """The name under which an item of list view `view` (`read_list`, `mview query --json`) carries its entry id,
    first, before its fields; None when one of its fields already is the entry (its expression is the entry's: the
    timeline's `tweet_id`), so the item is its fields alone. Else the entry expression's column name (`rider_id`;
    `riders.rider_id`: `rider_id`) when no field has that name, else `entry` (`_entry`, `__entry`, ... while a field
    has that name)."""
    if _entry_field(view) is not None:
        return None
    taken = {name for name, _ in view.fields}
    column = _COLUMN.fullmatch(view.entry)
    if column and column.group(1) not in taken:
        return column.group(1)
    name = "entry"
    while name in taken:
        name = f"_{name}"
    return name


def _missing(view: View, entry_id: str) -> dict:
    """The fields of an entry whose body is gone (deleted meanwhile): null, the entry's own id where a field is it."""
    field = _entry_field(view)
    return {name: entry_id if name == field else None for name, _ in view.fields}


def _hydrate(client, view: View, generation: int, ids: list[str]) -> list[dict]:
    """The items of entries `ids`: each entry's body (its fields), the entry first under `item_entry_name(view)`
    unless a field holds it. The bodies in one round trip: one MGET on a single server; on a Redis Cluster, whose
    bodies lie in many hash slots, one pipelined GET each (one round trip per node)."""
    keys = [entry_key(view.name, generation, e) for e in ids]
    if not keys:
        return []
    if isinstance(client, RedisCluster):
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.get(k)
        bodies = pipe.execute()
    else:
        bodies = client.mget(keys)
    items = [orjson.loads(body) if body else _missing(view, e) for e, body in zip(ids, bodies, strict=True)]
    name = item_entry_name(view)
    return items if name is None else [{name: e, **item} for e, item in zip(ids, items, strict=True)]


# KEYS[1] = the key's list, KEYS[2] = the heavy values it reads (one hash slot: the key's); ARGV[1] = the last rank
# to read (-1: all). One atomic read of both, so a mode switch between them is never half seen.
_SNAPSHOT = {
    descending: Script(
        None,
        f"return {{redis.call('{cmd}', KEYS[1], 0, ARGV[1], 'WITHSCORES'), redis.call('SMEMBERS', KEYS[2])}}".encode(),
    )
    for descending, cmd in ((True, "ZREVRANGE"), (False, "ZRANGE"))
}


def _pairs(flat) -> list[tuple[float, str]]:
    """(score, entry) of a ZRANGE/ZREVRANGE ... WITHSCORES reply (member, score, member, score, ...)."""
    return [(float(flat[i + 1]), flat[i].decode()) for i in range(0, len(flat), 2)]


def _snapshots(client, view: View, generation: int, keys: list[str], stop: int):
    """Per key: (list [(score, entry)] in order, [heavy values]), each key's read atomic (round trip 1; one script
    call per key, all in one pipeline when there are several)."""
    script = _SNAPSHOT[view.order[0][1]]
    if len(keys) == 1:
        names = [list_key(view.name, generation, keys[0]), reads_key(view.name, generation, keys[0])]
        replies = [script(keys=names, args=[stop], client=client)]
    else:
        pipe = client.pipeline(transaction=False)
        for k in keys:  # EVAL: a cluster pipeline blocks EVALSHA and eval()
            names = (list_key(view.name, generation, k), reads_key(view.name, generation, k))
            pipe.execute_command("EVAL", script.script, 2, *names, stop)
        replies = pipe.execute()
    return [(_pairs(own), sorted(h.decode() for h in heavy)) for own, heavy in replies]


def _heavy(client, view: View, generation: int, job: str, values, stop: int) -> tuple[dict, int | None]:
    """({value: [(score, entry)] in order}, the view's cap) in one pipelined round trip (one per node on a cluster):
    the heavy values' entries and the cap recorded in the generation's meta hash."""
    values = sorted(values)
    pipe = client.pipeline(transaction=False)
    read = pipe.zrevrange if view.order[0][1] else pipe.zrange
    for v in values:
        read(heavy_key(view.name, generation, v), 0, stop, withscores=True)
    pipe.hget(meta_key(job, generation), f"{view.name}.cap")
    *sets, cap = pipe.execute()
    got = {v: [(float(s), e.decode()) for e, s in entries] for v, entries in zip(values, sets, strict=True)}
    return got, (int(cap) if cap is not None else None)


def _merge(own: list, others: list[list], n: int | None, descending: bool) -> list[str]:
    """The first `n` distinct entries of the union in the list's order (ties by the entry, in the same direction)."""
    best: dict[str, float] = {}
    for entries in (own, *others):
        for score, e in entries:
            if e not in best or (score > best[e] if descending else score < best[e]):
                best[e] = score
    ordered = sorted(((s, e) for e, s in best.items()), reverse=descending)
    return [e for _, e in (ordered if n is None else ordered[:n])]


def _cut(limit: int | None, cap: int | None) -> int | None:
    return limit if cap is None else cap if limit is None else min(limit, cap)


def _list_view(view: str | View, job: str | None, pipeline: Pipeline | None) -> View:
    """`views.read.resolve_view(view, pipeline, job=job, kind="list")`: the list view, or its error."""
    from views.read import resolve_view  # (views.read imports this module)

    return resolve_view(view, pipeline, job=job, kind="list")


def _ids(client, view: View, generation: int, key: str, limit: int | None) -> list[str]:
    """The entries of `key` in order, at most `limit`: the stored list and its heavy values' entries, merged."""
    if limit is not None and limit <= 0:
        return []
    stop = -1 if limit is None else limit - 1
    [(own, heavy)] = _snapshots(client, view, generation, [key], stop)
    if not heavy:
        return [e for _, e in own]
    entries, cap = _heavy(client, view, generation, view.job, heavy, stop)
    return _merge(own, [entries[h] for h in heavy], _cut(limit, cap), view.order[0][1])


def read_list(
    client,
    view: str | View,
    key: str,
    limit: int | None = None,
    *,
    job: str | None = None,
    pipeline: Pipeline | None = None,
) -> dict:
    """The list of `key` in list view `view` (its name in `pipeline`, default `views.pipeline.default_pipeline()`, or
    the `View`) as the view defines it, in the serving generation of the view's job:
    `{"<key name>": key, "generation": g, "<entries>": [entry, ...], "<items>": [{<entry>, <fields>}, ...]}`, in the
    view's order, at most `limit` (None: the whole list, `cap` entries at most). Each item is the entry's fields,
    the entry first under `item_entry_name(view)` unless a field holds it; with `items` unset (the items take the
    entries' name) only the items are given. A key with no entry gives both empty. The one read path of the view
    (`mview query`, `export`, the web page use it); it needs only a Redis client, never Spark.

    `job`, when given, must be the view's job. Raises `UnknownView` for a name the pipeline lacks, `WrongJob`,
    `WrongViewKind` for a view that is not a list, `ViewError` for a `limit` that is not a whole number (as the
    older form `read_list(client, view, job, key)` gives): never an empty answer for a wrong question.

    The stored list holds the entries fanned out on write; the entries of the heavy values the key reads (a fan-out
    limit) are merged in here, in order, duplicates once. Round trips: the generation pointer; the key's list and
    `.reads` set, read atomically (one hash slot); when it reads heavy values, their entries, pipelined (one round
    trip per node); the entries' bodies. An entry whose body is gone by then (deleted meanwhile) is returned with
    null fields (but the entry's own id)."""
    view = _list_view(view, job, pipeline)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise ViewError(
            f"read_list(client, view, key, limit): limit must be a whole number or None, not {limit!r} (the job "
            "is not an argument: it is the view's)"
        )
    generation = current_generation(client, view.job)
    ids = _ids(client, view, generation, key, limit)
    out = {view.key_name: key, "generation": generation, view.entries: ids}
    out[view.items_name] = _hydrate(client, view, generation, ids)
    if view.window is not None:
        raw = client.get(window_key(view.name, generation, key))
        out.update(orjson.loads(raw) if raw is not None else {})
    return out


def query_list(client, view: View, key: str, limit: int | None = None) -> dict:
    """`{"<key name>": key, "generation": g, "<items>": [{<entry>, <fields>}, ...]}` (`read_list`'s items, each
    naming its entry, without the separate entries array), `{}` when it holds no item (the key has no entry, or
    `limit` is 0), as every view kind's query (the form `views.read.query_view` calls)."""
    got = read_list(client, view, key, limit)
    if not got[view.items_name]:
        return {}
    window = {k: got[k] for k in _WINDOW_FIELDS if k in got}
    return {view.key_name: got[view.key_name], "generation": got["generation"], view.items_name: got[view.items_name],
            **window}  # fmt: skip


def export_list(
    client, view: str | View, job: str | None = None, *, pipeline: Pipeline | None = None
) -> Iterator[dict]:
    """Every non-empty list as `{"<key name>": key, "<entries>": [entry ids in order]}`, ordered by key: the keys
    with a stored list or a `.reads` set, each read and merged as `read_list` does (500 keys per round trip, each
    heavy value's entries read once). `view`, `job`, `pipeline` and their errors (raised here, before the first
    line): as `read_list`'s."""
    return _export_lines(client, _list_view(view, job, pipeline))


def _export_lines(client, view: View) -> Iterator[dict]:
    job = view.job
    generation = current_generation(client, job)
    keys = sorted(
        {
            key_id(k)
            for name in (view.name, f"{view.name}.{READS}")
            for k in client.scan_iter(match=view_pattern(name, generation), count=1000)
        }
    )
    heavy_entries: dict[str, list] = {}
    cap = None
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        snaps = _snapshots(client, view, generation, chunk, -1)
        needed = {h for _, heavy in snaps for h in heavy} - heavy_entries.keys()
        if needed:
            more, cap = _heavy(client, view, generation, job, needed, -1)
            heavy_entries.update(more)
        windows = _windows(client, view, generation, chunk)
        for k, (own, heavy), window in zip(chunk, snaps, windows, strict=True):
            own_ids = [e for _, e in own]
            ids = _merge(own, [heavy_entries[h] for h in heavy], cap, view.order[0][1]) if heavy else own_ids
            if ids:
                key = window.pop(view.key_name, k)
                yield {view.key_name: key, view.entries: ids, **window}


_WINDOW_FIELDS = ("window_start", "window_end", "final")


def _windows(client, view: View, generation: int, keys: list[str]) -> list[dict]:
    """The window of each list key of a windowed list view (`{}` each for a view without a window), one round
    trip."""
    if view.window is None:
        return [{} for _ in keys]
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.get(window_key(view.name, generation, k))
    return [orjson.loads(raw) if raw is not None else {} for raw in pipe.execute()]
