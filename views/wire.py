"""Redis commands in the wire protocol (RESP), built as Spark SQL columns so no Python code handles a single
operation: the executors only forward the text (`views.redis_io.send_packed`). Lengths are in bytes
(`octet_length`), and the text is sent UTF-8 encoded."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from views.keys import view_key

__all__ = ["bulk", "command", "array_command", "view_key_column"]


def bulk(value: Column) -> Column:
    """One bulk string: `$<bytes>\\r\\n<value>\\r\\n`."""
    return F.concat(F.lit("$"), F.octet_length(value).cast("string"), F.lit("\r\n"), value, F.lit("\r\n"))


def command(*parts: Column) -> Column:
    """One command (an array of bulk strings) of the given parts."""
    return F.concat(F.lit(f"*{len(parts)}\r\n"), *[bulk(p) for p in parts])


def array_command(name: str, key: Column, items: Column, per_item: int = 1) -> Column:
    """`name key <items...>`: `items` is an array of already encoded bulk strings (`per_item` of them in each
    element, e.g. 2 for a ZADD score and member), appended as they are."""
    n = F.size(items) * per_item + 2
    return F.concat(
        F.lit("*"),
        n.cast("string"),
        F.lit(f"\r\n${len(name)}\r\n{name}\r\n"),
        bulk(key),
        F.array_join(items, ""),
    )


def view_key_column(view: str, generation: int, ident: Column) -> Column:
    """`views.keys.view_key(view, generation, <ident>)` for each row: `mv:<view>:<g>:{<ident>}`."""
    return F.concat(F.lit(view_key(view, generation, "")[:-1]), ident, F.lit("}"))
