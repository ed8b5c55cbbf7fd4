"""Views: one module per view kind (`row`, `count`, `agg`, `list`, `log`) that turns a job's rows into the kind's
changes (through `frame`: what a view's expressions see), applies them with a sink (`sink.Sink`: `write(changes,
batch_id)`) and reads them back (a kind in parts is a package: `list`, whose parts serve a join job's lists and
every other job kind's); the state a view keeps on the lake (`state`), a job's views in one call per batch
(`changes`), a view's entries as a table topic's log (`table`), windows (`window`), the key
layout (`keys`), Redis I/O (`redis_io`, `wire`), the kinds by name and how each is read (`kinds`), the read side of
every view (`read`), errors (`errors`)."""

__all__ = [
    "sink",
    "frame",
    "row",
    "count",
    "agg",
    "list",
    "log",
    "keys",
    "redis_io",
    "wire",
    "kinds",
    "read",
    "table",
    "errors",
]
