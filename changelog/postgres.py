"""Change data capture of PostgreSQL tables into their topics, by logical replication (`pgoutput`).

Every topic of the pipeline with `capture: {postgres: <table>}` (`PgSource.topics`) is filled from its table: one
publication and one logical replication slot, both named `PgSource.slot`, for all of them. A table needs a
primary key (or `REPLICA IDENTITY FULL`), and a column for each field of its topic: the column of the same name,
or the one `capture.columns` names (`spec.model.Capture.column`); an optional field's column and the time field's
column may be missing (null, and the commit time). A column's type must fit its field's:

| field type | PostgreSQL column types |
|---|---|
| id, string | text, varchar, char, uuid (as text) |
| long | smallint, integer, bigint |
| double | real, double precision, numeric (a float; NaN, infinity or one out of its range is a dead letter), or an integer type |
| boolean | boolean |
| timestamp | timestamptz, timestamp (read as UTC); epoch ms |

- First start (no slot): creates the publication `FOR TABLE` the tables and the slot (`CREATE_REPLICATION_SLOT
  ... LOGICAL pgoutput EXPORT_SNAPSHOT`), reads every row of every table in the snapshot the slot exported (a
  second connection, `SET TRANSACTION SNAPSHOT`) and appends them as upserts, one Delta commit per topic; then
  streams from the slot's consistent point, so no change is lost or doubled between the snapshot and the stream. A
  snapshot row's time is its time column when not null, else the time the snapshot was taken: the server's clock
  just before the slot was made, less 1 ms, so it is earlier than the commit time of every streamed change. With
  several tables, the snapshot's records are first written to staging objects beside the slot's marker, so a
  start killed between the topics' commits completes the others from it on the next start.
- Stream: every committed transaction, in commit order. Insert and update -> an upsert of the new row (the
  topic's `op` upsert name when it has `op:`) with the time field = its column when the column exists and is not
  null, else the commit time (epoch ms); delete -> a remove (the topic's remove name) of the old row's key (and
  `remove_fields`) at the commit time. An update that changes the key also removes the old key. Several changes of
  one key in one transaction give one record, the state at the commit (the only one another transaction could
  see). Each record is validated against its topic (`changelog.records.validate`), as the same record from a
  file or Kafka would be.
- Exactly once: transactions are appended to the topics' Delta logs whole, several per commit, and each commit
  records the end LSN of its last transaction as Delta's idempotent transaction (`txn`: app id `cdc:<slot>`,
  version = the LSN as an integer), per log. The slot's flushed position is confirmed to the server only after
  every log's commit; on a restart, each log skips the transactions ending at or below the LSN it recorded. A
  slot whose snapshot is in no log (killed during the first start) is dropped and made again. A dropped slot
  (`drop_slot`) means the next start takes a new snapshot.
- Bad rows and schema drift never become a wrong version: a change that is not a valid record (a null or empty
  key, a null required field, a time out of range, a number that does not fit), a change of a table whose columns
  no longer fit (a required column dropped or renamed, a column of another type), an unchanged TOASTed value the
  server did not send, a delete on a topic without `op:`, and a TRUNCATE become dead letters of the topic
  (`{"file","line","lsn","reason","raw","raw_bytes","at"}`, `file` = `postgresql:<table>`, `line` = the change's
  place in its transaction, `lsn` = the transaction's commit LSN), one object per transaction and topic
  (`deadletter/<topic>/cdc-<slot>-<commit LSN>-txn.jsonl`, the snapshot's `-snapshot`, `changelog.deadletters`),
  written before the transaction's commit and created once: a transaction the slot sends again after a crash
  before its commit finds its dead letters written and adds none; capture goes on with the next change. A table
  that does not fit at the start is an error (`CdcFailed`, one line), and nothing is captured.
- `once`: stops when every transaction committed before the capture started (at `pg_current_wal_insert_lsn()`
  then) is in the logs. Otherwise runs until `stop` is set.
- The slot's marker and a snapshot's staged records are objects of the lake under the capture's state key
  (`capture`'s `state`), so a capture started on another machine finds them.
- `progress`, after the snapshot's commits and each commit of the stream: the run's counts so far (`appended`,
  `rejected`, and per topic in `topics`: its records and dead letters), the `lsn` recorded, and the `seconds`
  the commit took (the Delta appends and the slot's confirmation).
"""

from __future__ import annotations

import re
import select
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from changelog.errors import (
    CdcFailed,
    ChangelogError,
    InvalidRecord,
    PgDsnInvalid,
    PostgresAuthFailed,
    PostgresUnavailable,
    redact,
)
from changelog.records import dead_letter_raw, validate
from changelog.storage import Lake, NotFound, StorageError
from spec.model import Topic

__all__ = ["PgSource", "capture", "probe", "wal_lag", "drop_slot", "shown_dsn", "lsn_text", "captured_topics"]

_PG_EPOCH_MS = 946_684_800_000  # 2000-01-01T00:00:00Z, PostgreSQL's epoch, in Unix epoch ms
_UNCHANGED = object()  # an unchanged TOASTed value pgoutput did not send
_FLUSH_ROWS = 50_000  # a Delta commit closes after the transaction that brings it to this many records
_FLUSH_S = 0.5  # or when this long has passed since its first transaction

# PostgreSQL's type oids and names, by what they read as
_TEXT = {25: "text", 1043: "varchar", 1042: "char", 2950: "uuid"}
_INTEGER = {21: "smallint", 23: "integer", 20: "bigint"}
_FLOAT = {700: "real", 701: "double precision", 1700: "numeric"}
_BOOLEAN = {16: "boolean"}
_TIMESTAMP = {1184: "timestamptz", 1114: "timestamp"}
_FITS: dict[str, dict[int, str]] = {  # field type -> the column types that fill it
    "id": _TEXT,
    "string": _TEXT,
    "long": _INTEGER,
    "double": {**_FLOAT, **_INTEGER},
    "boolean": _BOOLEAN,
    "timestamp": _TIMESTAMP,
}


def captured_topics(topics) -> tuple[Topic, ...]:
    """The topics of `topics` (a pipeline's, in declared order) that have `capture: {postgres: ...}`."""
    return tuple(t for t in topics if t.capture is not None and t.capture.postgres)


@dataclass(frozen=True)
class PgSource:
    """What the `cdc` job captures: the database at `dsn`, the tables of `topics` (each with `capture`), through
    the publication and slot `slot`."""

    dsn: str = field(repr=False)  # may hold a password
    topics: tuple[Topic, ...]
    slot: str

    def __post_init__(self) -> None:
        if not self.topics or any(t.capture is None for t in self.topics):
            raise ValueError("PgSource captures topics with `capture: {postgres: <table>}`, at least one")

    @property
    def app_id(self) -> str:
        return f"cdc:{self.slot}"

    @property
    def tables(self) -> tuple[str, ...]:
        """The captured tables, as their topics name them (`schema.table` or `table`)."""
        return tuple(t.capture.postgres for t in self.topics)

    @property
    def shown_tables(self) -> str:
        return ", ".join(self.tables)


def shown_dsn(dsn: str) -> str:
    """`dsn` without its password, for messages."""
    from psycopg2.extensions import parse_dsn

    try:
        params = parse_dsn(dsn)
    except Exception:  # noqa: BLE001 - a DSN we cannot parse is shown as such, never echoed
        return "an unparseable connection string"
    return " ".join(f"{k}={v}" for k, v in params.items() if "password" not in k) or "empty"


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def _lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _connect(source: PgSource, **kw):
    import psycopg2

    if not source.dsn:
        raise CdcFailed(
            "PG_DSN is empty: set it to the database to capture (`make postgres` starts a local one)"
        )
    try:
        conn = psycopg2.connect(source.dsn, **{"connect_timeout": 5, **kw})
    except psycopg2.ProgrammingError as e:  # psycopg2's parse of the DSN: "invalid dsn: ..."
        raise PgDsnInvalid(_first_line(e), source.dsn) from None
    except psycopg2.Error as e:
        raise _pg_error(source, e) from None
    if "connection_factory" not in kw:
        conn.autocommit = True
    return conn


def _split(table: str) -> tuple[str, str]:
    schema, _, name = table.rpartition(".")
    return schema or "public", name


def _ident(table: str) -> str:
    return ".".join('"' + p.replace('"', '""') + '"' for p in _split(table))


# --- the tables' shape ----------------------------------------------------------------------------------------


def _type_name(oid: int) -> str:
    for names in (_TEXT, _INTEGER, _FLOAT, _BOOLEAN, _TIMESTAMP):
        if oid in names:
            return names[oid]
    return f"oid {oid}"


def _schema_problem(table: str, columns: dict[str, int], topic: Topic) -> str | None:
    """Why a table with `columns` (name -> type oid) cannot fill `topic`, or None."""
    column = topic.capture.column
    for name, kind in topic.fields:
        col = column(name)
        if col not in columns:
            if name in topic.optional or name == topic.time:
                continue
            needed = ", ".join(
                f"{column(n)} ({t})" for n, t in topic.fields if n not in topic.optional and n != topic.time
            )
            return (
                f"table {table} has no column {col!r} (dropped or renamed?): the cdc job fills topic"
                f" {topic.name} from its columns {needed}, and optionally {column(topic.time)} (its time)"
            )
        if columns[col] not in _FITS[kind]:
            return (
                f"column {table}.{col} has type {_type_name(columns[col])}, which does not fill the {kind} field"
                f" {name!r} of topic {topic.name}: alter it to {' or '.join(_FITS[kind].values())}"
            )
    return None


def _check_table(cur, source: PgSource, topic: Topic) -> dict[str, int]:
    """The columns (name -> type oid) of `topic`'s table; `CdcFailed` if it does not exist, does not fit, or
    cannot publish its updates and deletes with the topic's key (no primary key and no REPLICA IDENTITY FULL, or
    a key outside the replica identity)."""
    table = topic.capture.postgres
    cur.execute("SELECT to_regclass(%s)::oid", (_ident(table),))
    (oid,) = cur.fetchone()
    if oid is None:
        raise CdcFailed(
            f"no table {table} in the database at PG_DSN: create it, or change the `capture` of topic {topic.name}"
        )
    cur.execute(
        "SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (oid,),
    )
    columns = dict(cur.fetchall())
    problem = _schema_problem(table, columns, topic)
    if problem:
        raise CdcFailed(problem)
    cur.execute(
        "SELECT relreplident, EXISTS (SELECT 1 FROM pg_index WHERE indrelid = %s AND indisprimary)"
        " FROM pg_class WHERE oid = %s",
        (oid, oid),
    )
    ident, has_pk = cur.fetchone()
    keys = [topic.capture.column(k) for k in topic.key or topic.identity]
    if ident == "n" or (ident == "d" and not has_pk):
        raise CdcFailed(
            f"table {table} has no primary key, so PostgreSQL cannot publish its updates and deletes:"
            f" add one ({', '.join(keys)}) or ALTER TABLE {table} REPLICA IDENTITY FULL"
        )
    if ident in ("d", "i") and topic.op is not None:
        cur.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND"
            " CASE WHEN %s = 'd' THEN i.indisprimary ELSE i.indisreplident END",
            (oid, ident),
        )
        identity = {r[0] for r in cur.fetchall()}
        needed = keys + [topic.capture.column(f) for f in topic.remove_fields]
        outside = [c for c in needed if c in columns and c not in identity]
        if outside:
            raise CdcFailed(
                f"table {table}: a delete names only its replica identity ({', '.join(sorted(identity))}), not"
                f" {', '.join(outside)}, which a remove of topic {topic.name} needs: make the key of the topic the"
                f" table's primary key, or ALTER TABLE {table} REPLICA IDENTITY FULL"
            )
    return columns


# --- pgoutput (protocol version 1) ----------------------------------------------------------------------------
class _Reader:
    __slots__ = ("b", "i")

    def __init__(self, b: bytes):
        self.b, self.i = b, 1  # after the message type byte

    def unpack(self, fmt: str):
        v = struct.unpack_from(fmt, self.b, self.i)
        self.i += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        end = self.b.index(0, self.i)
        s = self.b[self.i : end].decode()
        self.i = end + 1
        return s

    def tuple(self) -> list:
        b, i = self.b, self.i
        n = int.from_bytes(b[i : i + 2], "big")
        i += 2
        out = []
        for _ in range(n):
            kind = b[i]
            if kind == 0x74:  # 't': text
                size = int.from_bytes(b[i + 1 : i + 5], "big")
                out.append(b[i + 5 : i + 5 + size].decode())
                i += 5 + size
            else:  # 'n' null, 'u' unchanged TOASTed value
                out.append(None if kind == 0x6E else _UNCHANGED)
                i += 1
        self.i = i
        return out


@dataclass
class _Relation:
    name: str  # the table, as pgoutput names it (`schema.table`) or as its topic does (the snapshot)
    columns: list[str]
    types: dict[str, int]  # column -> type oid
    topic: Topic | None  # None: a published table no topic captures
    problem: str | None


@dataclass
class _Txn:
    commit_lsn: int
    commit_ms: int
    end_lsn: int = 0
    records: dict[tuple, dict] = field(
        default_factory=dict
    )  # (topic, key) -> its last change in the transaction
    dead: list[tuple[str, dict]] = field(default_factory=list)  # (topic, dead letter)
    changes: int = 0  # row changes so far: a dead letter's `line` is its change's place in the transaction


def _read(text: str | None, oid: int | None):
    """A column's text (pgoutput's, or a `::text` cast's) as the value its field's check expects."""
    if text is None or oid is None:
        return None
    if oid in _TEXT:
        return text
    if oid in _INTEGER:
        return int(text)
    if oid in _FLOAT:
        return float(text)  # NaN, infinity and a numeric out of a float's range: rejected as not finite
    if oid in _BOOLEAN:
        return text in ("t", "true")
    if oid == 1114 and text[:1].isdigit():  # timestamp without time zone: read as UTC
        return text + "+00:00"
    return text  # timestamptz: ISO-8601 with its zone, judged by the record's rules


class _Decoder:
    """pgoutput messages in, whole transactions out (`feed` returns a transaction at its Commit)."""

    def __init__(self, source: PgSource):
        self.source = source
        self.by_table = {_split(t.capture.postgres): t for t in source.topics}
        self.relations: dict[int, _Relation] = {}
        self.txn: _Txn | None = None

    def feed(self, b: bytes) -> _Txn | None:
        kind, r = b[:1], _Reader(b)
        if kind == b"B":
            final_lsn, ts_us, _xid = r.unpack("!qqi")
            self.txn = _Txn(final_lsn, _PG_EPOCH_MS + ts_us // 1000)
        elif kind == b"C":
            _flags, _lsn_, end_lsn, _ts = r.unpack("!bqqq")
            txn, self.txn = self.txn, None
            txn.end_lsn = end_lsn
            return txn
        elif kind == b"R":
            self._relation(r)
        elif kind in (b"I", b"U", b"D"):
            self._change(kind, r)
        elif kind == b"T":
            (count,) = r.unpack("!i")
            r.unpack("!b")  # options
            for relid in r.unpack(f"!{count}i") if count > 0 else ():
                self._bad(
                    self.relations.get(relid),
                    "TRUNCATE is not captured: the rows it removed stay in the changelog",
                    {},
                )
        return None

    def _relation(self, r: _Reader) -> None:
        (relid,) = r.unpack("!i")
        schema, name = r.string(), r.string()
        _ident_, ncols = r.unpack("!bh")
        types: dict[str, int] = {}
        for _ in range(ncols):
            r.unpack("!b")
            col = r.string()
            types[col] = r.unpack("!ii")[0]
        table = f"{schema}.{name}"
        topic = self.by_table.get((schema, name))
        problem = (
            _schema_problem(table, types, topic)
            if topic
            else f"table {table} is published, but no topic captures it"
        )
        self.relations[relid] = _Relation(table, list(types), types, topic, problem)

    def _change(self, kind: bytes, r: _Reader) -> None:
        (relid,) = r.unpack("!i")
        rel = self.relations[relid]
        old = new = None
        tag = r.b[r.i : r.i + 1]
        if tag in (b"K", b"O"):
            r.i += 1
            old = dict(zip(rel.columns, r.tuple(), strict=True))
            tag = r.b[r.i : r.i + 1]
        if tag == b"N":
            r.i += 1
            new = dict(zip(rel.columns, r.tuple(), strict=True))
        self.apply(rel, old, new)

    def _key(self, rel: _Relation, row: dict) -> tuple:
        column = rel.topic.capture.column
        return tuple(row.get(column(k)) for k in rel.topic.identity)

    def _upsert(self, rel: _Relation, row: dict, ms: int) -> dict:
        """The upsert of the topic for the table's `row` (column texts), not yet validated."""
        topic, column, types = rel.topic, rel.topic.capture.column, rel.types
        record = {"op": topic.op[0]} if topic.op else {}
        for name in topic.names:
            record[name] = _read(row.get(column(name)), types.get(column(name)))
        if record[topic.time] is None:
            record[topic.time] = ms
        return record

    def _remove(self, rel: _Relation, row: dict, ms: int) -> dict:
        """The remove of the topic for the deleted `row` (its replica identity's columns), not yet validated."""
        topic, column, types = rel.topic, rel.topic.capture.column, rel.types
        kept = set(topic.identity) | set(topic.remove_fields)
        record = {"op": topic.op[1]}
        for name in topic.names:
            if name in kept:
                record[name] = _read(row.get(column(name)), types.get(column(name)))
        record[topic.time] = ms
        return record

    def apply(self, rel: _Relation, old: dict | None, new: dict | None) -> None:
        """One row change (`new` None: a delete of `old`) of the transaction in progress -> record or dead letter.

        The change becomes the record it stands for and goes through `validate`, which also applies the maximum
        record size to the record's JSON line, so a captured row is judged exactly as the same record would be
        from a file or Kafka; a rejected record's dead letter keeps that line (`raw`, truncated as ingest does).
        A change no record can be made of (a table that does not fit, an unsent value) keeps the row's columns."""
        shown = {k: v for k, v in (new or old or {}).items() if v is not _UNCHANGED}
        if rel.problem:
            return self._bad(rel, rel.problem, shown)
        ms = self.txn.commit_ms
        if new is None:
            if rel.topic.op is None:
                return self._bad(
                    rel,
                    f"a deleted row, and topic {rel.topic.name} has no remove records (it declares no `op:`)",
                    shown,
                )
            return self._record(rel, self._remove(rel, old, ms))
        for k, v in new.items():
            if v is _UNCHANGED:  # REPLICA IDENTITY FULL sends the old value
                if old is None or old.get(k, _UNCHANGED) is _UNCHANGED:
                    return self._bad(
                        rel,
                        f"column {k!r} was not sent (an unchanged TOASTed value): ALTER TABLE {rel.name}"
                        " REPLICA IDENTITY FULL",
                        shown,
                    )
                new[k] = old[k]
        upsert = self._upsert(rel, new, ms)
        if old is not None:
            before = self._key(rel, old)
            if any(v is not None and v is not _UNCHANGED for v in before) and before != self._key(rel, new):
                try:  # the key changed: a remove of the old key, then the new row
                    record = validate(rel.topic, upsert)
                except InvalidRecord as e:
                    return self._bad(rel, e.reason, upsert)
                return self._record(rel, self._remove(rel, old, ms), then=record)
        self._record(rel, upsert)

    def _record(self, rel: _Relation, candidate: dict, then: dict | None = None) -> None:
        """Validate `candidate` and keep it (then the validated record `then`), or dead-letter it."""
        try:
            record = validate(rel.topic, candidate)
        except (InvalidRecord, ValueError) as e:
            return self._bad(rel, getattr(e, "reason", str(e)), candidate)
        self._add(rel.topic, record)
        if then is not None:
            self._add(rel.topic, then)

    def _add(self, topic: Topic, record: dict) -> None:
        """Keep the transaction's last change per key: only the state at its commit was ever visible."""
        self.txn.changes += 1
        key = (topic.name, tuple(record[k] for k in topic.identity))
        self.txn.records.pop(key, None)
        self.txn.records[key] = record

    def _bad(self, rel: _Relation | None, reason: str, row: dict) -> None:
        """A dead letter of the transaction in progress, in its topic's dead-letter log: `raw` is `row` as a JSON
        line, truncated as ingest truncates a line over the maximum record size; `raw_bytes` is the line's size."""
        self.txn.changes += 1
        name = rel.name if rel else self.source.shown_tables
        topic = rel.topic if rel is not None and rel.topic is not None else self.source.topics[0]
        line = orjson.dumps(row, default=str)
        self.txn.dead.append(
            (
                topic.name,
                {
                    "file": f"postgresql:{name}",
                    "line": self.txn.changes,
                    "reason": f"{name}: {reason}",
                    "raw": dead_letter_raw(line, len(line)),
                    "raw_bytes": len(line),
                },
            )
        )


# --- the Delta logs ---------------------------------------------------------------------------------------------


class _Log:
    """The captured topics' Delta logs, appended by delta-rs; each commit records its last LSN (`txn`), per log.
    `state` and `state_key`: where the slot's marker and a snapshot's staged records are."""

    def __init__(self, lake: Lake, source: PgSource, state: Lake, state_key: str):
        from changelog.topics import open_topic, topic_key

        self.lake, self.source, self.app_id = lake, source, source.app_id
        self.topics = {t.name: t for t in source.topics}
        for t in source.topics:
            open_topic(lake, t)  # a changed declaration: refused
        self.keys = {t.name: topic_key(t) for t in source.topics}
        self.state, self.state_key = state, state_key
        self.staging = _key(state_key, f"snapshot-{source.slot}")
        self.appended = self.rejected = self.commits = 0
        self.per_topic = {name: {"appended": 0, "rejected": 0} for name in self.topics}
        self.done = self.recorded()

    def marker(self) -> str:
        """The key of the consistent point of the slot we made last, written before its snapshot is committed."""
        return _key(self.state_key, f"slot-{self.source.slot}.lsn")

    def recorded(self, app_id: str | None = None) -> dict[str, int]:
        """Per topic, the LSN its log recorded for `app_id` (default: the capture's), 0 when none."""
        from deltalake import DeltaTable

        app, opts = app_id or self.app_id, self.lake.delta_options() or None
        return {
            name: DeltaTable(self.lake.delta_uri(key), storage_options=opts).transaction_version(app) or 0
            for name, key in self.keys.items()
        }

    def last_lsn(self) -> int:
        """The LSN up to which every log holds the capture (the smallest they recorded; 0 when one has none)."""
        return min(self.done.values())

    def counts(self) -> dict[str, int]:
        """Per topic, the records and dead letters of this run so far."""
        return {name: c["appended"] + c["rejected"] for name, c in self.per_topic.items()}

    def append(self, txns: list[_Txn], lsn: int, note: str, *, snapshot: bool = False) -> None:
        """Dead letters first, then per topic one Delta commit of the transactions' records it does not hold yet,
        recording `lsn` (and, for the snapshot, `lsn` as the slot's snapshot marker). A snapshot commit is made in
        every log, even when it holds no row; the snapshot of several topics is staged first (module docstring)."""
        written = self._dead_letters(txns, snapshot) if any(t.dead for t in txns) else 0
        per: dict[str, list[dict]] = {name: [] for name in self.topics}
        for t in txns:
            for (name, _key), record in t.records.items():
                if snapshot or t.end_lsn > self.done[name]:
                    per[name].append(record)
        if snapshot and len(self.topics) > 1:
            self._stage(per, lsn)
        for name, records in per.items():
            if records or snapshot:
                self._commit(name, records, lsn, note, snapshot=snapshot)
        if snapshot:
            self.state.delete_tree(self.staging)
        self.rejected += written

    def _commit(self, name: str, records: list[dict], lsn: int, note: str, *, snapshot: bool) -> None:
        from changelog.errors import NotStored
        from changelog.topics import RecordTable, append_table

        table = RecordTable(self.topics[name])
        for r in records:
            table.add(r)
        arrow = table.table()
        if table.unfit is not None:
            raise NotStored(name, f"postgresql:{note}", len(records), table.unfit)
        txns = ((self.app_id, lsn), (f"{self.app_id}:snapshot", lsn)) if snapshot else ((self.app_id, lsn),)
        append_table(
            self.lake, arrow, key=self.keys[name], note=note, time=self.topics[name].time, transactions=txns
        )
        self.commits += 1
        self.done[name] = lsn
        self.appended += len(records)
        self.per_topic[name]["appended"] += len(records)

    def _dead_letters(self, txns: list[_Txn], snapshot: bool) -> int:
        """Write the transactions' dead letters (those of the snapshot: `snapshot`), one object per transaction and
        topic, but those written before (a crash that came before the transactions' commit, so the slot sends them
        again); return how many were written."""
        from changelog.deadletters import write_dead_letters

        at = int(time.time() * 1000)
        written = 0
        for t in txns:
            by_topic: dict[str, list[dict]] = {}
            for name, d in t.dead:
                by_topic.setdefault(name, []).append({**d, "lsn": lsn_text(t.commit_lsn), "at": at})
            batch = f"cdc-{self.source.slot}-{t.commit_lsn:016X}-{'snapshot' if snapshot else 'txn'}"
            for name, entries in by_topic.items():
                if write_dead_letters(self.lake, self.topics[name], batch, entries):
                    self.per_topic[name]["rejected"] += len(entries)
                    written += len(entries)
        return written

    def _stage(self, per: dict[str, list[dict]], lsn: int) -> None:
        """Write the snapshot's records of every topic beside the slot's marker (its LSN last: then it is whole)."""
        self.state.delete_tree(self.staging)
        for name, records in per.items():
            self.state.write_bytes(
                b"".join(orjson.dumps(r) + b"\n" for r in records), self.staging, f"{name}.jsonl"
            )
        self.state.write_bytes((lsn_text(lsn) + "\n").encode(), self.staging, "lsn")

    def complete_snapshot(self, made: int) -> bool:
        """Whether the snapshot taken at `made` is in every log: True when it is, or when some logs hold it and
        the others are completed here from its staged records; False when no log holds it (or it cannot be
        completed), and the slot's snapshot is to be taken again."""
        have = self.recorded(f"{self.app_id}:snapshot")
        if all(v == made for v in have.values()):
            return True
        if not any(v == made for v in have.values()):
            return False
        try:
            if _lsn(self.state.read_bytes(self.staging, "lsn").decode().strip()) != made:
                return False
            staged = {
                name: [
                    orjson.loads(x) for x in self.state.read_bytes(self.staging, f"{name}.jsonl").splitlines()
                ]
                for name in self.topics
            }
        except (StorageError, ValueError):
            return False
        for name, lsn in have.items():
            if lsn != made:
                table = self.topics[name].capture.postgres
                note = f"cdc snapshot of {table} at {lsn_text(made)} (completed)"
                self._commit(name, staged[name], made, note, snapshot=True)
        self.state.delete_tree(self.staging)
        return True


def _key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _state(lake: Lake, state: str | Lake) -> tuple[Lake, str]:
    """The store and key of the capture's state (`capture`'s `state`)."""
    if isinstance(state, Lake):
        return state, ""
    return lake, state.strip("/")


# --- slot, snapshot, stream --------------------------------------------------------------------------------------


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _ensure_publication(cur, source: PgSource) -> None:
    cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (source.slot,))
    tables = {tuple(r) for r in cur.fetchall()}
    want = {_split(t) for t in source.tables}
    cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (source.slot,))
    if cur.fetchone() is None:
        listed = ", ".join(_ident(t) for t in source.tables)
        cur.execute(f"CREATE PUBLICATION {_q(source.slot)} FOR TABLE {listed}")
    elif tables != want:
        has = ", ".join(f"{s}.{n}" for s, n in sorted(tables)) or "no table"
        wanted = ", ".join(f"{s}.{n}" for s, n in sorted(want))
        raise CdcFailed(
            f"publication {source.slot} publishes {has}, not {wanted}: remove it and the slot with `mview stop cdc"
            " --drop-slot` (the next start takes a new snapshot), or set PG_SLOT to another name"
        )


def _snapshot_done(cur, source: PgSource, log: _Log) -> bool:
    """Whether the slot exists and its snapshot is in the logs (completed from its staged records where a start
    was killed between the logs' commits). A slot whose snapshot is in no log (a start killed before the
    snapshot's commits) is dropped here."""
    cur.execute("SELECT plugin, active FROM pg_replication_slots WHERE slot_name = %s", (source.slot,))
    row = cur.fetchone()
    if row is None:
        return False
    if row[0] != "pgoutput":
        raise CdcFailed(
            f"replication slot {source.slot} exists with plugin {row[0]}: set PG_SLOT to another name"
        )
    try:
        made = _lsn(log.state.read_bytes(log.marker()).decode().strip())
    except (NotFound, ValueError):
        made = None
    if made is not None and log.complete_snapshot(made):
        return True
    cur.execute("SELECT pg_drop_replication_slot(%s)", (source.slot,))  # its snapshot is gone: start over
    return False


def _snapshot(repl, source: PgSource, log: _Log, dec: _Decoder) -> int:
    """Make the slot, append the tables as of its exported snapshot (one commit per topic), return the
    consistent point."""
    log.state.delete(log.marker())
    conn = _connect(source)
    try:
        with conn.cursor() as cur:  # the server's clock before the slot: every streamed commit comes later
            cur.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1")
            (taken_ms,) = cur.fetchone()
        rcur = repl.cursor()
        rcur.execute(f"CREATE_REPLICATION_SLOT {_q(source.slot)} LOGICAL pgoutput EXPORT_SNAPSHOT")
        _name, point_text, snapshot, _plugin = rcur.fetchone()
        point = _lsn(point_text)
        log.state.write_bytes((point_text + "\n").encode(), log.marker())  # owner-only on a local lake
        conn.autocommit = False
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        _read_snapshot(conn, snapshot, source, dec, _Txn(point, taken_ms, end_lsn=point))
    finally:
        conn.close()
    txn, dec.txn = dec.txn, None
    log.append([txn], point, f"cdc snapshot of {source.shown_tables} at {point_text}", snapshot=True)
    return point


def _read_snapshot(conn, snapshot: str, source: PgSource, dec: _Decoder, txn: _Txn) -> None:
    """Every row of every captured table as of the exported `snapshot`, as upserts (or dead letters) of `txn`."""
    with conn.cursor() as cur:
        cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
        shapes = [(topic, _check_table(cur, source, topic)) for topic in source.topics]
    dec.txn = txn
    for topic, columns in shapes:
        table = topic.capture.postgres
        rel = _Relation(table, list(columns), columns, topic, None)
        cols = [c for c in dict.fromkeys(topic.capture.column(n) for n in topic.names) if c in columns]
        with conn.cursor(name="mview_snapshot") as rows:
            rows.itersize = 20_000
            rows.execute(f"SELECT {', '.join(f'{_q(c)}::text' for c in cols)} FROM {_ident(table)}")
            for row in rows:
                dec.apply(rel, None, dict(zip(cols, row, strict=True)))


def capture(
    source: PgSource,
    lake: Lake,
    state: str | Lake,
    *,
    once: bool,
    stop: Callable[[], bool] = lambda: False,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Capture the tables of `source` into their topics' logs (see the module's docstring); return the counts of
    this run (`snapshot_rows`, `appended`, `rejected`, `commits`, `seconds`, and per topic in `topics` its
    `appended` and `rejected`). `state` keeps the slot's marker (and a snapshot's staged records): a key of `lake`
    (such as `jobs/cdc`), or a store of its own (a `Lake`). Raises `PostgresUnavailable` / `CdcFailed` /
    `TopicChanged` (one line, what to do)."""
    import psycopg2

    try:
        return _capture(source, lake, *_state(lake, state), once=once, stop=stop, progress=progress)
    except psycopg2.Error as e:
        raise _pg_error(source, e) from None


# What a refusal of the server means for the cdc job: (words in PostgreSQL's message, what to do).
_HINTS = (
    ("wal_level", "set wal_level = logical in postgresql.conf and restart the server"),
    ("is active for pid", "another capture reads the slot (a deployed cdc job?): stop it, or set PG_SLOT"),
    (
        "replication role",
        "grant it: ALTER ROLE <user> REPLICATION (and max_replication_slots/max_wal_senders > 0)",
    ),
    (
        "permission denied for database",
        "a publication needs CREATE on the database and the table's ownership: have the table's owner run"
        " CREATE PUBLICATION {slot} FOR TABLE {table}",
    ),
    ("must be owner", "have the table's owner run CREATE PUBLICATION {slot} FOR TABLE {table}"),
    ("permission denied for table", "GRANT SELECT ON {table} TO <user>"),
)


# libpq's and the server's words for a login the server refuses: SQLSTATE class 28 (28P01 a wrong password; 28000
# no pg_hba.conf entry, an unknown role, a failed peer/ident/cert check) or a password the server asks for and
# PG_DSN lacks. At the start of a connection libpq hands a client only the message, not the SQLSTATE, so these are
# matched (the server's words in English, its default lc_messages).
_AUTH_REFUSED = re.compile(
    r"authentication failed|no pg_hba\.conf entry|pg_hba\.conf rejects|no password supplied|password is required"
    r'|role ".*" does not exist',
    re.I,
)
# libpq's words for a connection string it cannot parse or use (an option's value): PG_DSN must change.
_DSN_INVALID = re.compile(
    r"^(invalid dsn|invalid connection option|invalid integer value|invalid port number|invalid \w+ value"
    r"|could not match \d+ port numbers)",
    re.I,
)


def _pg_error(source: PgSource, e: Exception) -> ChangelogError:
    """A psycopg2 error as one line, every password in it masked (`redact`):

    - PG_DSN that libpq cannot use -> `PgDsnInvalid`, and credentials the server refuses (SQLSTATE class 28) ->
      `PostgresAuthFailed`: both permanent (`PostgresMisconfigured`), never retried;
    - a refusal we know (privileges, settings) -> `CdcFailed` saying what to change;
    - a connection that failed otherwise (nothing answers, the server restarts) -> `PostgresUnavailable`,
      retried by a deployed job; any other error -> `CdcFailed`."""
    import psycopg2

    lines = [redact(line, source.dsn) for line in str(e).strip().splitlines()] or [type(e).__name__]
    if isinstance(e, psycopg2.OperationalError) and _DSN_INVALID.search(lines[0]):
        return PgDsnInvalid(lines[0], source.dsn)
    refused = [line for line in lines if _AUTH_REFUSED.search(line)]  # several hosts: one line each
    if (getattr(e, "pgcode", None) or "").startswith("28") or (
        isinstance(e, psycopg2.OperationalError) and refused
    ):
        return PostgresAuthFailed(shown_dsn(source.dsn), (refused or lines)[0], source.dsn)
    text = " ".join(lines).lower()
    if isinstance(e, psycopg2.OperationalError) and not any(words in text for words, _h in _HINTS):
        return PostgresUnavailable(shown_dsn(source.dsn), lines[0])
    return CdcFailed(_refused(source, lines[0]))


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _refused(source: PgSource, reason: str) -> str:
    hint = next((h for words, h in _HINTS if words in reason.lower()), "see the server's log")
    hint = hint.format(slot=source.slot, table=source.shown_tables)
    return (
        f"PostgreSQL at PG_DSN ({shown_dsn(source.dsn)}) refused the capture of {source.shown_tables}: {reason}:"
        f" {hint}"
    )


def probe(source: PgSource) -> PostgresUnavailable | None:
    """Whether PG_DSN can be used, without capturing anything: None when the server accepts a connection, the
    `PostgresUnavailable` to wait for when nothing answers now; raises the permanent problems (`PgDsnInvalid`,
    `PostgresAuthFailed`, `CdcFailed` for an empty PG_DSN), which retrying cannot fix."""
    try:
        _connect(source, connect_timeout=3).close()
    except PostgresUnavailable as e:
        return e
    return None


def _capture(
    source: PgSource, lake: Lake, state: Lake, state_key: str, *, once: bool, stop, progress
) -> dict:
    from psycopg2.extras import LogicalReplicationConnection

    started = time.monotonic()
    log = _Log(lake, source, state, state_key)
    dec = _Decoder(source)
    with _connect(source) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn()::text")
        stop_lsn = _lsn(cur.fetchone()[0])
        for topic in source.topics:
            _check_table(cur, source, topic)
        _ensure_publication(cur, source)
        done = _snapshot_done(cur, source, log)
    conn.close()
    repl = _connect(source, connection_factory=LogicalReplicationConnection)
    try:
        snapshot = 0
        if not done:
            took = time.monotonic()
            _snapshot(repl, source, log, dec)
            snapshot = log.appended + log.rejected
            if progress:
                took = time.monotonic() - took
                lsn = lsn_text(log.last_lsn())
                progress(
                    {
                        "appended": log.appended,
                        "rejected": log.rejected,
                        "topics": log.counts(),
                        "lsn": lsn,
                        "seconds": took,
                    }
                )
        _Stream(repl, source, log, dec, stop_lsn if once else None, stop, progress).run()
    finally:
        repl.close()
    return {
        "snapshot_rows": snapshot,
        "appended": log.appended,
        "rejected": log.rejected,
        "commits": log.commits,
        "seconds": round(time.monotonic() - started, 3),
        "topics": {name: dict(c) for name, c in log.per_topic.items()},
    }


class _Stream:
    """Reads the slot from the last LSN every log holds; appends whole transactions (to each log those it does not
    hold); confirms after each commit."""

    def __init__(self, repl, source, log: _Log, dec: _Decoder, stop_lsn, stop, progress):
        self.cur, self.source, self.log, self.dec = repl.cursor(), source, log, dec
        self.stop_lsn, self.stop, self.progress = stop_lsn, stop, progress
        self.done_lsn = log.last_lsn()
        self.pending: list[_Txn] = []
        self.rows = 0
        self.confirmed = 0
        self.feedback_at = 0.0

    def run(self) -> None:
        self.cur.start_replication(
            slot_name=self.source.slot,
            decode=False,
            start_lsn=self.done_lsn,
            options={"proto_version": "1", "publication_names": self.source.slot},
        )
        while True:
            msg = self.cur.read_message()
            if msg is not None:
                txn = self.dec.feed(msg.payload)
                if txn is not None and txn.end_lsn > self.done_lsn:
                    self.pending.append(txn)
                    self.rows += len(txn.records) + len(txn.dead)
                    if self.rows >= _FLUSH_ROWS:
                        self.flush()
                continue
            self.flush()
            if self.idle_done():
                return
            select.select([self.cur], [], [], 0.2)

    def flush(self) -> None:
        if not self.pending:
            return
        lsn, started = self.pending[-1].end_lsn, time.monotonic()
        self.log.append(self.pending, lsn, f"cdc {self.source.shown_tables} to {lsn_text(lsn)}")
        self.pending, self.rows, self.done_lsn = [], 0, lsn
        self.confirm(lsn)
        if self.progress:
            took = time.monotonic() - started
            self.progress(
                {
                    "appended": self.log.appended,
                    "rejected": self.log.rejected,
                    "topics": self.log.counts(),
                    "lsn": lsn_text(lsn),
                    "seconds": took,
                }
            )

    def confirm(self, lsn: int, *, reply: bool = False) -> None:
        self.confirmed = max(self.confirmed, lsn)
        self.cur.send_feedback(write_lsn=self.confirmed, flush_lsn=self.confirmed, reply=reply, force=True)
        self.feedback_at = time.monotonic()

    def idle_done(self) -> bool:
        """Nothing pending: confirm up to what the server has sent (nothing of ours lies before it); True when
        the capture should end (stop asked, or `once` and every transaction before `stop_lsn` is in)."""
        if self.dec.txn is not None:
            return self.stop()  # a stop mid-transaction drops its part: the next start reads it again
        end = self.cur.wal_end or 0
        if self.stop_lsn is not None and end >= self.stop_lsn:
            self.confirm(max(end, self.done_lsn))
            return True
        if self.stop():
            return True
        if time.monotonic() - self.feedback_at > (0.2 if self.stop_lsn is not None else 1.0):
            self.confirm(max(end, self.done_lsn), reply=True)
        return False


# --- operations -------------------------------------------------------------------------------------------------


def wal_lag(source: PgSource) -> int | None:
    """WAL bytes the slot has not confirmed (`pg_current_wal_insert_lsn() - confirmed_flush_lsn`); None when the
    database does not answer or the slot does not exist."""
    import psycopg2

    try:
        conn = _connect(source, connect_timeout=2)  # `mview status` waits for it
    except Exception:  # noqa: BLE001 - status reports "unknown", never fails
        return None
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT (pg_current_wal_insert_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (source.slot,),
            )
            row = cur.fetchone()
        return None if row is None else max(0, int(row[0]))
    except psycopg2.Error:
        return None
    finally:
        conn.close()


def drop_slot(source: PgSource) -> list[str]:
    """Remove the slot and the publication (what exists of them); return what was removed. `CdcFailed` if the
    slot is in use (the cdc job runs)."""
    import psycopg2

    removed = []
    conn = _connect(source)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (source.slot,))
            row = cur.fetchone()
            if row is not None:
                try:
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (source.slot,))
                except psycopg2.errors.ObjectInUse:
                    raise CdcFailed(
                        f"replication slot {source.slot} is in use: stop the cdc job first (mview stop cdc)"
                    ) from None
                removed.append(f"replication slot {source.slot}")
            cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (source.slot,))
            if cur.fetchone() is not None:
                cur.execute(f"DROP PUBLICATION {_q(source.slot)}")
                removed.append(f"publication {source.slot}")
    finally:
        conn.close()
    return removed
