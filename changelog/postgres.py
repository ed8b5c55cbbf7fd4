"""Change data capture of a PostgreSQL table into the `profiles` topic, by logical replication (`pgoutput`).

The table (`PgSource.table`) has the primary key `user_id` and text columns `name`, `country`, optionally
`updated_at timestamptz`. The capture owns a publication and a logical replication slot, both named
`PgSource.slot`.

- First start (no slot): creates the publication `FOR TABLE` the table and the slot (`CREATE_REPLICATION_SLOT
  ... LOGICAL pgoutput EXPORT_SNAPSHOT`), reads every row in the snapshot the slot exported (a second connection,
  `SET TRANSACTION SNAPSHOT`) and appends them as upserts in one Delta commit; then streams from the slot's
  consistent point, so no change is lost or doubled between the snapshot and the stream. A snapshot row's `ts` is
  its `updated_at` when not null, else the time the snapshot was taken: the server's clock just before the slot
  was made, less 1 ms, so it is earlier than the commit time of every streamed change.
- Stream: every committed transaction, in commit order. Insert and update -> `{"op":"upsert","user_id","name",
  "country","ts"}` with `ts` = the new row's `updated_at` when the column exists and is not null, else the commit
  time (epoch ms); delete -> `{"op":"delete","user_id","ts"}` with the commit time. An update that changes the
  key also deletes the old key. Several changes of one key in one transaction give one record, the state at
  the commit (the only one another transaction could see). Each record is validated by
  `changelog.records.validate`.
- Exactly once: transactions are appended to the topic's Delta log whole, several per commit, and each commit
  records the end LSN of its last transaction as Delta's idempotent transaction (`txn`: app id `cdc:<slot>`,
  version = the LSN as an integer). The slot's flushed position is confirmed to the server only after that
  commit; on a restart, transactions ending at or below the recorded LSN are skipped. A slot whose snapshot was
  never committed (killed during the first start) is dropped and made again. A dropped slot (`drop_slot`) means
  the next start takes a new snapshot.
- Bad rows and schema drift never become a wrong version: a change that is not a valid record (null or empty
  key, a null `name`/`country`, an `updated_at` out of range), a change of a table whose columns no longer fit (a
  required column dropped or renamed, a column of another type), an unchanged TOASTed value the server did not
  send, and a TRUNCATE become dead letters in `LAKE_DIR/deadletter/profiles.jsonl` (`{"file","line","lsn",
  "reason","raw","raw_bytes","at"}`, `file` = `postgresql:<table>`, `line` = the change's place in its
  transaction, `lsn` = the transaction's commit LSN), each once: a transaction the slot sends again after a crash
  before its commit finds its dead letters written and adds none; capture goes on with the next change. A table
  that does not fit at the first start is an error (`CdcFailed`), and nothing is captured.
- `once`: stops when every transaction committed before the capture started (at `pg_current_wal_insert_lsn()` then) is
  in the log. Otherwise runs until `stop` is set.
- `progress`, after the snapshot's commit and each commit of the stream: the run's counts so far (`appended`, `rejected`), the `lsn`
  recorded, and the `seconds` the commit took (the Delta append and the slot's confirmation).
"""

from __future__ import annotations

import re
import select
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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

__all__ = ["PgSource", "capture", "probe", "wal_lag", "drop_slot", "shown_dsn", "lsn_text"]

_PG_EPOCH_MS = 946_684_800_000  # 2000-01-01T00:00:00Z, PostgreSQL's epoch, in Unix epoch ms
_TEXT = {25: "text", 1043: "varchar", 1042: "char"}
_TIMESTAMPTZ = 1184
_REQUIRED = ("user_id", "name", "country")
_UNCHANGED = object()  # an unchanged TOASTed value pgoutput did not send
_FLUSH_ROWS = 50_000  # a Delta commit closes after the transaction that brings it to this many records
_FLUSH_S = 0.5  # or when this long has passed since its first transaction


@dataclass(frozen=True)
class PgSource:
    dsn: str = field(repr=False)  # may hold a password
    table: str
    slot: str

    @property
    def app_id(self) -> str:
        return f"cdc:{self.slot}"


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


# --- the table's shape ----------------------------------------------------------------------------------------


def _schema_problem(table: str, columns: dict[str, int]) -> str | None:
    """Why a table with `columns` (name -> type oid) cannot be captured, or None."""
    for name in _REQUIRED:
        if name not in columns:
            return (
                f"table {table} has no column {name!r} (dropped or renamed?): the cdc job needs user_id, name,"
                " country (text) and optionally updated_at (timestamptz)"
            )
        if columns[name] not in _TEXT:
            return f"column {table}.{name} has type oid {columns[name]}, not text: alter it to text"
    if "updated_at" in columns and columns["updated_at"] != _TIMESTAMPTZ:
        return f"column {table}.updated_at has type oid {columns['updated_at']}, not timestamptz: alter it"
    return None


def _check_table(cur, source: PgSource) -> dict[str, int]:
    """The table's columns (name -> type oid); `CdcFailed` if it does not exist, does not fit, or cannot
    publish its updates and deletes (no primary key and no REPLICA IDENTITY FULL)."""
    cur.execute("SELECT to_regclass(%s)::oid", (_ident(source.table),))
    (oid,) = cur.fetchone()
    if oid is None:
        raise CdcFailed(f"no table {source.table} in the database at PG_DSN: create it or set PG_TABLE")
    cur.execute(
        "SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (oid,),
    )
    columns = dict(cur.fetchall())
    problem = _schema_problem(source.table, columns)
    if problem:
        raise CdcFailed(problem)
    cur.execute(
        "SELECT relreplident, EXISTS (SELECT 1 FROM pg_index WHERE indrelid = %s AND indisprimary)"
        " FROM pg_class WHERE oid = %s",
        (oid, oid),
    )
    ident, has_pk = cur.fetchone()
    if ident == "n" or (ident == "d" and not has_pk):
        raise CdcFailed(
            f"table {source.table} has no primary key, so PostgreSQL cannot publish its updates and deletes:"
            f" add one (user_id) or ALTER TABLE {source.table} REPLICA IDENTITY FULL"
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
    name: str
    columns: list[str]
    problem: str | None


@dataclass
class _Txn:
    commit_lsn: int
    commit_ms: int
    end_lsn: int = 0
    records: dict[str, dict] = field(default_factory=dict)  # user_id -> its last change in the transaction
    dead: list[dict] = field(default_factory=list)
    changes: int = 0  # row changes so far: a dead letter's `line` is its change's place in the transaction


class _Decoder:
    """pgoutput messages in, whole transactions out (`feed` returns a transaction at its Commit)."""

    def __init__(self, source: PgSource):
        self.source = source
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
            self._bad(None, "TRUNCATE is not captured: the rows it removed stay in the changelog", {})
        return None

    def _relation(self, r: _Reader) -> None:
        (relid,) = r.unpack("!i")
        schema, name = r.string(), r.string()
        _ident_, ncols = r.unpack("!bh")
        columns: dict[str, int] = {}
        for _ in range(ncols):
            r.unpack("!b")
            col = r.string()
            columns[col] = r.unpack("!ii")[0]
        table = f"{schema}.{name}"
        self.relations[relid] = _Relation(table, list(columns), _schema_problem(table, columns))

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
            return self._record(rel, {"op": "delete", "user_id": old.get("user_id"), "ts": ms})
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
        ts = new.get("updated_at")
        upsert = {"op": "upsert", **{c: new.get(c) for c in _REQUIRED}, "ts": ms if ts is None else ts}
        if old is not None and old.get("user_id") not in (None, new.get("user_id")):  # the key changed
            delete = {"op": "delete", "user_id": old["user_id"], "ts": ms}
            try:
                record = validate("profiles", upsert)
            except InvalidRecord as e:
                return self._bad(rel, e.reason, upsert)
            return self._record(rel, delete, then=record)
        self._record(rel, upsert)

    def _record(self, rel: _Relation, candidate: dict, then: dict | None = None) -> None:
        """Validate `candidate` and keep it (then the validated record `then`), or dead-letter it."""
        try:
            record = validate("profiles", candidate)
        except InvalidRecord as e:
            return self._bad(rel, e.reason, candidate)
        self._add(record)
        if then is not None:
            self._add(then)

    def _add(self, record: dict) -> None:
        """Keep the transaction's last change per key: only the state at its commit was ever visible."""
        self.txn.changes += 1
        self.txn.records.pop(record["user_id"], None)
        self.txn.records[record["user_id"]] = record

    def _bad(self, rel: _Relation | None, reason: str, row: dict) -> None:
        """A dead letter of the transaction in progress: `raw` is `row` as a JSON line, truncated as ingest
        truncates a line over the maximum record size; `raw_bytes` is the line's size."""
        self.txn.changes += 1
        name = rel.name if rel else self.source.table
        line = orjson.dumps(row, default=str)
        self.txn.dead.append(
            {
                "file": f"postgresql:{name}",
                "line": self.txn.changes,
                "reason": f"{name}: {reason}",
                "raw": dead_letter_raw(line, len(line)),
                "raw_bytes": len(line),
            }
        )


# --- the Delta log ----------------------------------------------------------------------------------------------


class _Log:
    """The `profiles` topic's Delta log, appended by delta-rs; each commit records its last LSN (`txn`)."""

    def __init__(self, lake_dir: Path, source: PgSource):
        from changelog.ingest import deadletter_path
        from changelog.topics import ensure_topic

        self.path = ensure_topic(None, lake_dir, "profiles")
        self.app_id = source.app_id
        self.dead_path = deadletter_path(lake_dir, "profiles")
        self.appended = self.rejected = self.commits = 0

    def last_lsn(self) -> int | None:
        from deltalake import DeltaTable

        return DeltaTable(self.path).transaction_version(self.app_id)

    def append(self, txns: list[_Txn], lsn: int, note: str, *, snapshot: bool = False) -> None:
        """Dead letters first, then one Delta commit of the transactions' records recording `lsn` (and, for the
        snapshot, `lsn` as the slot's snapshot marker). A snapshot commit is made even when it holds no row."""
        from changelog.errors import NotStored
        from changelog.topics import RecordTable, append_table

        dead = [d for t in txns for d in t.dead]
        written = self._dead_letters(txns) if dead else 0
        records = [r for t in txns for r in t.records.values()]
        if records or snapshot:
            table = RecordTable("profiles")
            for r in records:
                table.add(r)
            arrow = table.table()
            if table.unfit is not None:
                raise NotStored("profiles", f"postgresql:{note}", len(records), table.unfit)
            txns_ = (
                ((self.app_id, lsn), (f"{self.app_id}:snapshot", lsn)) if snapshot else ((self.app_id, lsn),)
            )
            append_table(self.path, arrow, note=note, transactions=txns_)
            self.commits += 1
        self.appended += len(records)
        self.rejected += written

    def _dead_letters(self, txns: list[_Txn]) -> int:
        """Append the transactions' dead letters but those the log holds already (written before a crash that came
        before the transactions' commit, so the slot sends them again); return how many were appended."""
        from changelog.ingest import append_dead_letters

        at = int(time.time() * 1000)
        entries = [{**d, "lsn": lsn_text(t.commit_lsn), "at": at} for t in txns for d in t.dead]
        return append_dead_letters(self.dead_path, entries, _dead_letter_key)


def _dead_letter_key(e: dict) -> tuple | None:
    """(table, (commit LSN, place in the transaction)) of a dead letter of the capture (`append_dead_letters`)."""
    if str(e.get("file", "")).startswith("postgresql:") and isinstance(e.get("lsn"), str):
        return e["file"], (_lsn(e["lsn"]), e["line"])
    return None


# --- slot, snapshot, stream --------------------------------------------------------------------------------------


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _ensure_publication(cur, source: PgSource) -> None:
    cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (source.slot,))
    tables = cur.fetchall()
    cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (source.slot,))
    if cur.fetchone() is None:
        cur.execute(f"CREATE PUBLICATION {_q(source.slot)} FOR TABLE {_ident(source.table)}")
    elif tables != [_split(source.table)]:
        raise CdcFailed(
            f"publication {source.slot} publishes {tables or 'no table'}, not {source.table}: remove it and the slot"
            " with `mview stop cdc --drop-slot`, or set PG_SLOT to another name"
        )


def _marker(state_dir: Path, source: PgSource) -> Path:
    """The consistent point of the slot we made last, written before its snapshot is committed."""
    return state_dir / f"slot-{source.slot}.lsn"


def _snapshot_done(cur, source: PgSource, log: _Log, state_dir: Path) -> bool:
    """Whether the slot exists and its snapshot is in the log. A slot whose snapshot never was (a start killed
    before the snapshot's commit) is dropped here."""
    cur.execute("SELECT plugin, active FROM pg_replication_slots WHERE slot_name = %s", (source.slot,))
    row = cur.fetchone()
    if row is None:
        return False
    if row[0] != "pgoutput":
        raise CdcFailed(
            f"replication slot {source.slot} exists with plugin {row[0]}: set PG_SLOT to another name"
        )
    try:
        made = _lsn(_marker(state_dir, source).read_text().strip())
    except (FileNotFoundError, ValueError):
        made = None
    from deltalake import DeltaTable

    if made is not None and DeltaTable(log.path).transaction_version(f"{log.app_id}:snapshot") == made:
        return True
    cur.execute("SELECT pg_drop_replication_slot(%s)", (source.slot,))  # its snapshot is gone: start over
    return False


def _snapshot(repl, source: PgSource, log: _Log, dec: _Decoder, state_dir: Path) -> int:
    """Make the slot, append the table as of its exported snapshot in one commit, return the consistent point."""
    marker = _marker(state_dir, source)
    marker.unlink(missing_ok=True)
    conn = _connect(source)
    try:
        with conn.cursor() as cur:  # the server's clock before the slot: every streamed commit comes later
            cur.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1")
            (taken_ms,) = cur.fetchone()
        rcur = repl.cursor()
        rcur.execute(f"CREATE_REPLICATION_SLOT {_q(source.slot)} LOGICAL pgoutput EXPORT_SNAPSHOT")
        _name, point_text, snapshot, _plugin = rcur.fetchone()
        point = _lsn(point_text)
        state_dir.mkdir(parents=True, exist_ok=True)
        marker.touch(mode=0o600)  # owner-only, as everything in the job's directory (removed above)
        marker.write_text(point_text + "\n")
        conn.autocommit = False
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        _read_snapshot(conn, snapshot, source, dec, _Txn(point, taken_ms, end_lsn=point))
    finally:
        conn.close()
    txn, dec.txn = dec.txn, None
    log.append([txn], point, f"cdc snapshot of {source.table} at {point_text}", snapshot=True)
    return point


def _read_snapshot(conn, snapshot: str, source: PgSource, dec: _Decoder, txn: _Txn) -> None:
    """Every row of the table as of the exported `snapshot`, as upserts (or dead letters) of `txn`."""
    with conn.cursor() as cur:
        cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
        columns = _check_table(cur, source)
    dec.txn = txn
    rel = _Relation(source.table, list(columns), None)
    cols = [c for c in (*_REQUIRED, "updated_at") if c in columns]
    with conn.cursor(name="mview_snapshot") as rows:
        rows.itersize = 20_000
        rows.execute(f"SELECT {', '.join(f'{_q(c)}::text' for c in cols)} FROM {_ident(source.table)}")
        for row in rows:
            dec.apply(rel, None, dict(zip(cols, row, strict=True)))


def capture(
    source: PgSource,
    lake_dir: Path,
    state_dir: Path,
    *,
    once: bool,
    stop: Callable[[], bool] = lambda: False,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Capture `source` into the `profiles` log (see the module's docstring); return the counts of this run.
    `state_dir` keeps the slot's marker. Raises `PostgresUnavailable` / `CdcFailed` (one line, what to do)."""
    import psycopg2

    try:
        return _capture(source, Path(lake_dir), state_dir, once=once, stop=stop, progress=progress)
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
    hint = hint.format(slot=source.slot, table=source.table)
    return f"PostgreSQL at PG_DSN ({shown_dsn(source.dsn)}) refused the capture of {source.table}: {reason}: {hint}"


def probe(source: PgSource) -> PostgresUnavailable | None:
    """Whether PG_DSN can be used, without capturing anything: None when the server accepts a connection, the
    `PostgresUnavailable` to wait for when nothing answers now; raises the permanent problems (`PgDsnInvalid`,
    `PostgresAuthFailed`, `CdcFailed` for an empty PG_DSN), which retrying cannot fix."""
    try:
        _connect(source, connect_timeout=3).close()
    except PostgresUnavailable as e:
        return e
    return None


def _capture(source: PgSource, lake_dir: Path, state_dir: Path, *, once: bool, stop, progress) -> dict:
    from psycopg2.extras import LogicalReplicationConnection

    started = time.monotonic()
    log = _Log(lake_dir, source)
    dec = _Decoder(source)
    with _connect(source) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn()::text")
        stop_lsn = _lsn(cur.fetchone()[0])
        _check_table(cur, source)
        _ensure_publication(cur, source)
        done = _snapshot_done(cur, source, log, state_dir)
    conn.close()
    repl = _connect(source, connection_factory=LogicalReplicationConnection)
    try:
        snapshot = 0
        if not done:
            took = time.monotonic()
            _snapshot(repl, source, log, dec, state_dir)
            snapshot = log.appended + log.rejected
            if progress:
                took = time.monotonic() - took
                lsn = lsn_text(log.last_lsn() or 0)
                progress({"appended": log.appended, "rejected": log.rejected, "lsn": lsn, "seconds": took})
        _Stream(repl, source, log, dec, stop_lsn if once else None, stop, progress).run()
    finally:
        repl.close()
    return {
        "snapshot_rows": snapshot,
        "appended": log.appended,
        "rejected": log.rejected,
        "commits": log.commits,
        "seconds": round(time.monotonic() - started, 3),
    }


class _Stream:
    """Reads the slot from the last LSN in the log; appends whole transactions; confirms after each commit."""

    def __init__(self, repl, source, log: _Log, dec: _Decoder, stop_lsn, stop, progress):
        self.cur, self.source, self.log, self.dec = repl.cursor(), source, log, dec
        self.stop_lsn, self.stop, self.progress = stop_lsn, stop, progress
        self.done_lsn = log.last_lsn() or 0
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
        self.log.append(self.pending, lsn, f"cdc {self.source.table} to {lsn_text(lsn)}")
        self.pending, self.rows, self.done_lsn = [], 0, lsn
        self.confirm(lsn)
        if self.progress:
            took = time.monotonic() - started
            self.progress(
                {
                    "appended": self.log.appended,
                    "rejected": self.log.rejected,
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
