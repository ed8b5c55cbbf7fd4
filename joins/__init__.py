"""Joins as DataFrame -> DataFrame transforms, one module per join kind (no Redis, no CLI here)."""

__all__ = ["table_table", "interval"]
