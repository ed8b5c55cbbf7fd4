"""Redis commands in the wire protocol (RESP), built as Spark SQL expressions so no Python code handles a single
operation: the executors only forward the text (`views.redis_io.send_packed`). Lengths are in bytes
(`octet_length`), and the text is sent UTF-8 encoded.

Every function takes and returns the SQL text of an expression (`F.expr` or `selectExpr` turns it into a column):
a whole command is one expression to parse (why: docs/architecture.md, "Building a micro-batch's plans").
`payload_rows` and `forward` send a DataFrame of such commands to Redis from the executors."""

from __future__ import annotations

from views.fence import GATE_SHA
from views.keys import _ESCAPES, view_key

__all__ = [
    "lit",
    "bulk",
    "command",
    "array_command",
    "args",
    "array_args",
    "gated",
    "view_key_column",
    "hash_tag_column",
    "payload_rows",
    "forward",
]


def lit(value: str) -> str:
    """`value` as a Spark SQL string literal (backslash, quote, CR and LF escaped)."""
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\r", "\\r").replace("\n", "\\n")
    return f"'{escaped}'"


_CRLF = lit("\r\n")


def bulk(value: str) -> str:
    """One bulk string of the string expression `value`: `$<bytes>\\r\\n<value>\\r\\n`."""
    return f"concat('$', cast(octet_length({value}) AS string), {_CRLF}, {value}, {_CRLF})"


def command(*parts: str) -> str:
    """One command (an array of bulk strings) of the given string expressions."""
    head = lit(f"*{len(parts)}\r\n")
    return f"concat({head}, {', '.join(bulk(p) for p in parts)})"


def array_command(name: str, key: str, items: str, per_item: int = 1) -> str:
    """`name key <items...>`: `items` is an array of already encoded bulk strings (`per_item` of them in each
    element, e.g. 2 for a ZADD score and member), appended as they are."""
    head = lit(f"\r\n${len(name)}\r\n{name}\r\n")
    return f"concat('*', cast(size({items}) * {per_item} + 2 AS string), {head}, {bulk(key)}, array_join({items}, ''))"


def args(*parts: str) -> tuple[str, str]:
    """One command for `gated`: (its number of arguments, SQL text of its bulk strings) of the string expressions
    `parts` (its name first)."""
    return str(len(parts)), f"concat({', '.join(bulk(p) for p in parts)})"


def array_args(name: str, key: str, items: str, per_item: int = 1) -> tuple[str, str]:
    """`array_command` for `gated`: `name key <items...>`, `items` an array of encoded bulk strings."""
    head = lit(f"${len(name)}\r\n{name}\r\n")
    text = f"concat({head}, {bulk(key)}, array_join({items}, ''))"
    return f"(size({items}) * {per_item} + 2)", text


def gated(fence, key: str, *commands: tuple[str | None, tuple[str, str]]) -> str:
    """One call of the fence's gate (`views.fence.GATE_LUA`): the commands whose condition holds (SQL text; None:
    always), each an `args`/`array_args` pair, applied on `key` (the SQL text of the key they write) only if
    `fence` (`views.fence.Fence`) is not below the job's fence. One reply."""
    counts, texts = [], []
    for when, (n, text) in commands:
        one = f"concat({bulk(f'CAST({n} AS string)')}, {text})"
        counts.append(f"(1 + {n})" if when is None else f"CASE WHEN {when} THEN 1 + {n} ELSE 0 END")
        texts.append(one if when is None else f"CASE WHEN {when} THEN {one} ELSE '' END")
    total = " + ".join(["6", *counts])
    head = lit(f"\r\n$7\r\nEVALSHA\r\n$40\r\n{GATE_SHA}\r\n$1\r\n2\r\n")
    fixed = f"{bulk(lit(fence.key))}, {bulk(key)}, {bulk(lit(str(fence.epoch)))}"
    body = ", ".join(texts) or "''"
    return f"concat('*', CAST({total} AS string), {head}, {fixed}, {body})"


def _encoded(ident: str) -> str:
    for raw, enc in _ESCAPES:
        ident = f"replace({ident}, {lit(raw)}, {lit(enc)})"
    return ident


def view_key_column(view: str, generation: int, ident: str) -> str:
    """`views.keys.view_key(view, generation, <ident>)` for each row: `mv:<view>:<g>:{<ident>}`, the id encoded
    as `views.keys.encode_id` does."""
    return f"concat({lit(view_key(view, generation, '')[:-1])}, {_encoded(ident)}, '}}')"


def hash_tag_column(ident: str) -> str:
    """The hash tag `{<ident>}` of every key of the entity `<ident>` (encoded as in `view_key_column`): what a
    Redis Cluster hashes to place them (`views.redis_io.Forwarder` routes by it)."""
    return f"concat('{{', {_encoded(ident)}, '}}')"


def payload_rows(commands, *, cluster: bool, chunk: int = 1000):
    """`commands` (`cmd`: one command's wire text; `tag`: the hash tag of its key) as rows to forward (`payload`,
    `n` commands, `tag`): on one server `chunk` consecutive commands of a partition concatenated into one row (the
    commands of one key stay in their order), on a Redis Cluster one command per row with its tag, for
    `views.redis_io.Forwarder` to route. Python only forwards these strings, it never builds a single command."""
    from pyspark.sql import functions as F

    if cluster:
        return commands.select(F.col("cmd").alias("payload"), F.lit(1).alias("n"), "tag")
    return (
        commands.select("cmd", F.floor(F.monotonically_increasing_id() / chunk).alias("chunk"))
        .groupBy("chunk")
        .agg(F.concat_ws("", F.collect_list("cmd")).alias("payload"), F.count("*").alias("n"))
        .select("payload", "n", F.lit(None).cast("string").alias("tag"))
    )


def _forward_partition(rows, url: str, what: str, scripts: tuple[str, ...]) -> None:
    from views.redis_io import Forwarder, sink_client

    with Forwarder(sink_client(url), what=what, scripts=scripts) as out:
        for payload, n, tag in rows:
            out.add(payload.encode(), n, tag)


def forward(payloads, url: str, *, what: str, scripts: tuple[str, ...] = ()) -> None:
    """Send `payload_rows` to the Redis at `url` from the executors (one `Forwarder` per partition, `scripts`
    loaded first), one Spark job; returns once every command is acknowledged (a failed one raises)."""
    payloads.foreachPartition(lambda rows: _forward_partition(rows, url, what, scripts))
