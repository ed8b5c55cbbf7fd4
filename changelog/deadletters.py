"""Dead letters: the records a source rejected, with their reasons, as objects of the lake written once per batch.

A topic's dead letters are the objects `LAKE_DIR/deadletter/<topic>/<batch>.jsonl`, one JSON line per rejected
record (`changelog.ingest` and `changelog.kafka` say what an entry holds). An object is created whole and exactly
once (`Lake.create`: a temporary file renamed or linked without overwrite, or a conditional PUT), never appended
to, since appends are not atomic on object stores: of several writers of one batch exactly one writes it, and a
batch written again after a crash finds its object and writes nothing. `<batch>` names the batch by its source,
so that the names of one source sort in the order they were written:

- `mview ingest`: `ingest-<the run's start, ns since the epoch, 19 digits>-<run id>-<the piece's first line, 12
  digits>`, one per committed piece of a file, its name recorded in the piece's commit (`changelog.ingest`);
- the `kafka` job: `kafka-<app id>-<batch id, 12 digits>`, one per micro-batch;
- the `cdc` job: `cdc-<slot>-<the transaction's commit LSN, 16 hex digits>-txn`, one per transaction (the
  snapshot's: `cdc-<slot>-<its consistent point>-snapshot`).

`read_dead_letters` reads them all, in key order. The objects are readable by their owner only on a local lake (mode
0600): they hold raw input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import orjson

from changelog.storage import Lake, NotFound
from spec.model import Topic

__all__ = [
    "deadletter_key",
    "deadletter_path",
    "write_dead_letters",
    "read_dead_letters",
    "count_dead_letters",
]

_BATCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a batch's name: one key part, never hidden


def deadletter_key(topic: Topic) -> str:
    """`deadletter/<topic>`: the key under which the topic's dead letters are (a topic read `from:` another: that
    one's, whose log it reads)."""
    return f"deadletter/{topic.source or topic.name}"


def deadletter_path(lake: Lake, topic: Topic) -> str:
    """Where the topic's dead letters are, as a user reaches them (`Lake.uri`: a local directory or a URI)."""
    return lake.uri(deadletter_key(topic))


def write_dead_letters(lake: Lake, topic: Topic, batch: str, entries: Iterable[dict | bytes]) -> bool:
    """Write the dead letters `entries` of the batch `batch` (module docstring) of `topic` as one object, unless it
    exists; True when this call wrote it, False when it existed (the batch was written before) or `entries` is
    empty. An entry is a dict, or one JSON line (bytes, its newline included). Raises `changelog.storage.
    StorageError` (its `reason`: the store's, e.g. no space left) when the store cannot write it: then nothing of
    it is written."""
    if not _BATCH.match(batch):
        raise ValueError(f"a dead-letter batch name is letters, digits, '.', '_' and '-', not {batch!r}")
    data = b"".join(e if isinstance(e, bytes) else orjson.dumps(e) + b"\n" for e in entries)
    if not data:
        return False
    return lake.create(data, deadletter_key(topic), f"{batch}.jsonl")


def _objects(lake: Lake, topic: Topic) -> Iterator[bytes]:
    """The bytes of each dead-letter object of `topic`, in key order."""
    key = deadletter_key(topic)
    names = [
        f"{key}/{e.name}"
        for e in lake.list(key)
        if not e.is_dir and e.name.endswith(".jsonl") and not e.name.startswith(".")
    ]
    for name in names:
        try:
            yield lake.read_bytes(name)
        except NotFound:  # removed since it was listed
            continue


def read_dead_letters(lake: Lake, topic: Topic) -> Iterator[dict]:
    """Every dead letter of `topic`, in key order (module docstring): each object, created whole, is one JSON
    object per line."""
    for data in _objects(lake, topic):
        for line in data.splitlines():
            if line.strip():
                yield orjson.loads(line)


def count_dead_letters(lake: Lake, topic: Topic) -> int:
    """How many dead letters `topic` has: the non-blank lines of its objects."""
    return sum(sum(1 for line in data.splitlines() if line.strip()) for data in _objects(lake, topic))
