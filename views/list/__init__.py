"""The `list` view kind: per list key, the first `cap` entries in the view's order, refilled from the key's other
live rows when an entry leaves. (The built-in `timeline` view is one: per follower, the newest 800 tweets of the
users they follow.) The kind is this package; `views.kinds` registers it from here, and nothing outside it knows
its parts:

- `file`: how it is declared in a pipeline file (`FILE`: its keys, the job kinds it serves, its checks);
- `sink`: its Redis operations (`LIST_OPS_SCHEMA`) and the sink that applies them (`ListViewSink`), fenced per key;
- `join`: a `join` job's lists, maintained from the join's step (`ListView`, `join_lists`: the list shape's own
  algorithm of `joins.table_list`, or the join's delta for any other shape, chosen from the declaration);
- `rows`: every other job kind's lists, from its row changes, with their own state on the lake (`TopList`,
  `list_views`, the kind's `state`), windowed too;
- `read`: the read side (`read_list`, `query_list`, `export_list`).

Redis (`<v>`: the view's name, `<g>`: the job's generation), written alike by `join` and `rows`:
- `mv:<v>:<g>:{<key>}`: sorted set, member the entry id, score the order value (ties by the entry, in the same
  direction: `ZREVRANGE` reads a descending list, `ZRANGE` an ascending one); the first `cap`;
- `mv:<v>.entry:<g>:{<entry>}`: JSON of the view's `fields` of the entry, in declared order, kept once per entry;
- with a fan-out limit: `mv:<v>.heavy:<g>:{<match value>}`, a heavy match value's first `cap` entries (sorted set),
  and `mv:<v>.reads:<g>:{<key>}`, the heavy values a list key reads (set); readers merge them (`read_list`);
- a windowed view: `mv:<v>.window:<g>:{<key>}`, the key's window (`rows`).
The generation's meta hash (`mv:meta:<job>:<g>`) keeps the `<view>.cap` and `fanout_limit` it was built with.
"""

from views.list.file import FILE
from views.list.join import ListView, generic_spec, join_lists, list_caps, list_shape
from views.list.read import export_list, item_entry_name, query_list, read_list
from views.list.rows import ListStep, TopList, list_views
from views.list.sink import (
    ENTRY_CARRY,
    LIST_OPS_SCHEMA,
    RETIRE_SECONDS,
    Few,
    ListViewSink,
    body_sql,
    entry,
    member,
)

__all__ = [
    "FILE",
    "LIST_OPS_SCHEMA",
    "ENTRY_CARRY",
    "RETIRE_SECONDS",
    "ListView",
    "ListViewSink",
    "Few",
    "join_lists",
    "list_caps",
    "list_shape",
    "generic_spec",
    "entry",
    "member",
    "body_sql",
    "read_list",
    "query_list",
    "export_list",
    "item_entry_name",
    "TopList",
    "ListStep",
    "list_views",
]
