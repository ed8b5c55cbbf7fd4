"""Joins as DataFrame -> DataFrame transforms, one module per join kind, each with its state (no Redis, no CLI).

| module | join kind | state |
|---|---|---|
| `table_table` | table-table, maintained incrementally (the home timeline) | `table_table_state.TimelineStore` |
| `interval` | stream-stream interval join (searches x clicks) | `interval_state.IntervalStore` |
| `asof` | stream-table as-of join with versioned dimensions (`user@ts`) | `asof_state.AsofState` |

Every state class implements `state.JoinState`; errors derive from `errors.JoinError`.
"""

__all__ = [
    "table_table",
    "table_table_state",
    "interval",
    "interval_state",
    "asof",
    "asof_state",
    "state",
    "errors",
]
