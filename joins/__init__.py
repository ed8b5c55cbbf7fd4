"""Joins as DataFrame -> DataFrame transforms, one module per join kind, each with its state (no Redis, no CLI).

| module | join kind | state |
|---|---|---|
| `table` (+ `table_list`: its list views) | table-table of two current tables, maintained incrementally | `table_state.TableStore` |
| `interval` | stream-stream interval join of two event topics | `interval_state.IntervalStore` |
| `asof` | stream-table as-of join with a versioned table (`<key>@<ms>`) | `asof_state.AsofState` |

`sides` reads a job's two topics as one stream and gives each side's records, identities and keys.

Every state class implements `state.JoinState`; errors derive from `errors.JoinError`.
"""

__all__ = [
    "table",
    "table_list",
    "table_state",
    "interval",
    "interval_state",
    "asof",
    "asof_state",
    "sides",
    "state",
    "errors",
]
