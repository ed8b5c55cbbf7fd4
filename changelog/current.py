"""The current-table rule of a table topic, written once: which record of a key decides the key's row.

Per key, the record with the greatest time wins; on equal times a remove wins, then the record whose non-key
fields, compared in their declared order, are greatest. With `final_deletes`, a remove of a key is final whatever
the times: the key is never live again, and its row is the greatest upsert (by time, then the non-key fields).
So the current table is a function of the *set* of records: arrival order and batch boundaries never change it.

Everything here is SQL text over a topic's records (its log's columns, `spec.model.Topic.columns()`), for the
join's state (`joins.table`) and for log compaction (`mview maintain`) alike.
"""

from __future__ import annotations

from spec.model import Topic

__all__ = ["quoted", "is_remove", "rank", "upsert_rank", "key_columns", "compaction_keys", "compaction_order"]


def quoted(name: str) -> str:
    """A column name as SQL text (backquoted: a field may be named like a keyword)."""
    return f"`{name}`"


def is_remove(topic: Topic) -> str:
    """SQL text: true for a remove record of `topic` (false for every record of a topic without `op`)."""
    if topic.op is None:
        return "false"
    return f"coalesce(op = '{topic.op[1].replace(chr(39), chr(39) * 2)}', false)"


def _values(topic: Topic) -> list[str]:
    return [quoted(n) for n in topic.values if n != topic.time]


def rank(topic: Topic) -> str:
    """SQL text of the struct whose greatest value per key decides the key's row (a topic without
    `final_deletes`): `struct(<time>, <is remove>, <non-key fields in declared order>)`."""
    fields = ", ".join([f"{quoted(topic.time)} AS _t", f"{is_remove(topic)} AS _r", *_values(topic)])
    return f"struct({fields})"


def upsert_rank(topic: Topic) -> str:
    """SQL text of the struct whose greatest value among a key's upserts is the key's row under `final_deletes`:
    `struct(<time>, <non-key fields in declared order>)`."""
    return f"struct({', '.join([f'{quoted(topic.time)} AS _t', *_values(topic)])})"


def key_columns(topic: Topic) -> list[str]:
    return [quoted(k) for k in topic.key or topic.id]


def compaction_keys(topic: Topic) -> list[str]:
    """SQL texts to partition a table topic's records by for compaction: the key, and with `final_deletes` also
    whether the record is a remove (so a tombstone is kept beside the greatest upsert)."""
    keys = key_columns(topic)
    return keys + [f"{is_remove(topic)}"] if topic.final_deletes else keys


def compaction_order(topic: Topic) -> str:
    """SQL text to order a partition of `compaction_keys` by, greatest first: its first record decides the key."""
    return f"{upsert_rank(topic) if topic.final_deletes else rank(topic)} DESC"
