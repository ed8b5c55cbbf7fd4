"""A lease on the lake: at most one holder of a name at a time, among processes on any machines that share the lake.

A lease `key` (e.g. `jobs/timeline/lease`) is a row of objects beside each other, `<key>.<epoch>` (ten digits),
each written by one holder: `{"holder", "node", "pid", "start", "renewals", "renewed_ms", "ttl_ms", "released"}`.
The highest epoch is the current one. Its correctness rests on one primitive, `Lake.create` (of several racing
creators of one key exactly one wins, on every store: `link(2)` locally, HDFS's rename without overwrite, S3's
conditional PUT), never on a local lock or on synchronized clocks:

- **acquire**: a holder takes epoch e+1 by creating `<key>.<e+1>`, and only when epoch e is free: released, its
  holder provably dead (on this machine: same boot and PID namespace, and its process gone), or *expired*: its
  object did not change for TTL_S by the acquirer's own monotonic clock, while it watched. Of several acquirers
  that find e free, the create lets exactly one win; the others see the new epoch and give up (or wait). A winner
  lists the row once more and holds the epoch only if it is still the highest (older epochs are pruned, so a
  create of a pruned number by a very late acquirer succeeds, and is then seen not to be the highest).
- **renew**: a thread rewrites the holder's own object every HEARTBEAT_S (`renewals` + 1), then lists the row: a
  higher epoch means another holder took over (`lost`, final). A renewal that succeeds makes the lease `valid` for
  TTL_S - HEARTBEAT_S from the moment it *started*; one that cannot reach the store is retried every second.
- **doubt**: past that, without a renewal (the store does not answer, the process was paused), the holder is no
  longer `valid` (it must not act; the deployed job stops its query and waits), and once the store answers it
  does not rewrite its epoch (a taker may be creating e+1 at that moment) but competes for e+1 like any
  acquirer: it wins (`valid` again) or it `lost`.
- **release**: the holder marks its object released (the next acquirer takes over at once) and stops renewing.

The guarantee: at any moment at most one process holds a `valid` lease, provided (1) the store's `create` is
atomic as above and a read sees an object whole, and (2) no taker's clock runs more than TTL_S / (TTL_S -
HEARTBEAT_S) times as fast as the holder's (1.5 with the defaults); the clocks need not agree on the time.
Proof sketch: the holder's last renewal started at s and its validity ends at s + TTL_S - HEARTBEAT_S by its
clock; a taker last saw the object change at t0 > s (a renewal's write lands after it started) and creates e+1 no
earlier than t0 + TTL_S by its own. A renewal whose write lands after a take-over finds the higher epoch in the
listing that follows it, and is not counted. What the lease cannot do alone is stop an action the holder
*started* while valid (a micro-batch in flight): such an action has HEARTBEAT_S (10 s) to end before a taker may
start (the deployed job stops its query as soon as its lease is not valid); one that runs longer (a holder paused
mid-batch) is stopped by the epoch as a fencing token: the new holder raises the job's fence in Redis to its epoch
before its first write, and every Redis write carries its writer's epoch and is refused atomically, in the same
script call, when it is lower (`views.fence`); the writer checks its lease again before Spark commits a batch to the
lake (`jobs.core.fencing.check_lease`), and the join state and output logs are written per batch id.

TTL_S = 30 s (LEASE_TTL, the same for every process of a lake) and HEARTBEAT_S = TTL_S / 3: a deployed job killed with kill -9 is taken over by a driver started on
another machine (another working directory, another HOME) 30 s after that driver started watching, and at once on
the same machine (its process is seen gone); a store that does not answer for 20 s puts the holder in doubt; a
renewal costs one small write and one listing per 10 s. `holder_of` reports who holds a lease (by wall clock:
for display and for choosing what to leave alone, never for correctness).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

import orjson

from changelog.storage import Lake, NotFound, StorageError
from spec.durations import parse_duration_ms

__all__ = ["Lease", "holder_of", "held", "this_node", "TTL_S", "HEARTBEAT_S"]


def _ttl_s() -> float:
    """LEASE_TTL (a duration, default 30 s): how long a holder elsewhere may go unrenewed before it is taken over."""
    text = os.environ.get("LEASE_TTL", "").strip()
    return parse_duration_ms(text) / 1000 if text else 30.0


TTL_S = _ttl_s()
HEARTBEAT_S = TTL_S / 3
_WIDTH = 10


_HELD: dict[str, Lease] = {}  # lease key -> the lease this process acquired and has not released


def held(key: str) -> Lease | None:
    """The lease `key` this process acquired and has not released (lost to another holder or not: its epoch still
    fences its writes), else None."""
    return _HELD.get(key.strip("/"))


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:  # machine-local, not a lake path
            return fh.read().strip()
    except OSError:
        return socket.gethostname()


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_NODE = f"{socket.gethostname()}/{_boot_id()}/{_pid_namespace()}"


def this_node() -> str:
    """This machine's boot and PID namespace: two records with the same node name processes of one PID space."""
    return _NODE


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _alive(record: dict) -> bool | None:
    """Whether the holder of `record` lives: True/False on this node (its pid and start time), None elsewhere."""
    if record.get("node") != _NODE:
        return None
    try:
        return _start_ticks(int(record["pid"])) == record.get("start")
    except (KeyError, TypeError, ValueError):
        return False


def _parse(raw: bytes | None) -> dict | None:
    try:
        got = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None
    return got if isinstance(got, dict) else None


class _Row:
    """The objects `<key>.<epoch>` of one lease in `lake`."""

    def __init__(self, lake: Lake, key: str):
        self.lake, self.key = lake, key.strip("/")
        self.parent, _, self.base = self.key.rpartition("/")

    def name(self, epoch: int) -> str:
        return f"{self.key}.{epoch:0{_WIDTH}d}"

    def epochs(self) -> list[int]:
        prefix = self.base + "."
        return sorted(
            int(e.name[len(prefix) :])
            for e in self.lake.list(self.parent)
            if not e.is_dir and e.name.startswith(prefix) and e.name[len(prefix) :].isdigit()
        )

    def top(self) -> int:
        return max(self.epochs(), default=0)

    def current(self) -> tuple[int, bytes | None]:
        """(the highest epoch, its object's bytes); (0, None) when there is none."""
        for _ in range(3):  # a prune racing the read: look again
            epoch = self.top()
            if epoch == 0:
                return 0, None
            try:
                return epoch, self.lake.read_bytes(self.name(epoch))
            except NotFound:
                pass
        return 0, None

    def prune(self, below: int) -> None:
        """Remove epochs below `below` - 1 (the one before the current stays: see `Lease` on late creators)."""
        for epoch in self.epochs():
            if epoch < below - 1:
                self.lake.delete(self.name(epoch))


def _new_record(holder: str, ttl_s: float) -> dict:
    """The object a new holder of an epoch creates: who and where it is, its process, not yet renewed or released."""
    return {
        "holder": holder,
        "node": _NODE,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start": _start_ticks(os.getpid()),
        "renewals": 0,
        "renewed_ms": int(time.time() * 1000),
        "ttl_ms": int(ttl_s * 1000),
        "released": False,
    }


class Lease:
    """A held lease (see the module docstring): `epoch`, `valid` (may act now), `lost` (another holder took it over;
    final), `release()`. Made by `acquire`; usable as a context manager (released on exit)."""

    def __init__(self, row: _Row, record: dict, epoch: int, started: float, ttl_s, heartbeat_s, on_lost):
        self._row, self.record, self.epoch = row, record, epoch
        self.ttl_s, self.heartbeat_s = ttl_s, heartbeat_s
        self._valid_until = started + ttl_s - heartbeat_s
        self._on_lost = on_lost
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self._done = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"lease {row.key}")
        _HELD[row.key] = self
        self._thread.start()

    @property
    def key(self) -> str:
        return self._row.key

    @property
    def valid(self) -> bool:
        """Whether this holder may act now: not lost, and a renewal succeeded within TTL_S - HEARTBEAT_S."""
        return not self.lost.is_set() and not self._done.is_set() and time.monotonic() < self._valid_until

    def wait_valid(self, stop: threading.Event, every_s: float = 0.5) -> bool:
        """Wait until the lease is valid again (True), or lost or `stop` set (False)."""
        while not self.valid:
            if self.lost.is_set() or self._done.is_set() or stop.wait(every_s):
                return False
        return True

    @classmethod
    def acquire(
        cls,
        lake: Lake,
        key: str,
        holder: str,
        *,
        ttl_s: float = TTL_S,
        heartbeat_s: float = HEARTBEAT_S,
        wait_for_holder: bool = False,
        stop: threading.Event | None = None,
        on_lost: Callable[[Lease], None] | None = None,
    ) -> Lease | None:
        """The lease `key` of `lake` for `holder` (a name people read: what holds it, e.g. `timeline driver`), or
        None when another holder has it.

        A free lease (none, released, its holder's process gone on this machine) is taken at once. A holder that
        may live elsewhere is watched: renewing, it is alive (None, or with `wait_for_holder` watched further
        until it releases or expires); unchanged for `ttl_s`, it expired and is taken over. `stop` set gives up
        (None). `on_lost(lease)` runs in the renewing thread once another holder took the lease over.
        Raises `StorageError` (`LakeUnreachable`) when the store does not answer."""
        row = _Row(lake, key)
        poll = min(1.0, heartbeat_s / 4)
        seen: tuple[int, bytes] | None = None
        since = 0.0
        while True:
            epoch, raw = row.current()
            record = _parse(raw)
            take = raw is None
            if not take and record is not None and (record.get("released") or _alive(record) is False):
                take = True
            elif not take and record is not None and _alive(record) and not wait_for_holder:
                return None
            elif not take and (epoch, raw) != seen:
                if seen is not None and not wait_for_holder:
                    return None  # it renewed (or another took it): alive
                seen, since = (epoch, raw), time.monotonic()
            elif not take and time.monotonic() - since >= ttl_s:
                take = True
            if take:
                started, mine = time.monotonic(), _new_record(holder, ttl_s)
                if lake.create(orjson.dumps(mine), row.name(epoch + 1)) and row.top() == epoch + 1:
                    lease = cls(row, mine, epoch + 1, started, ttl_s, heartbeat_s, on_lost)
                    row.prune(epoch + 1)
                    return lease
                if not wait_for_holder:
                    return None  # another acquirer won just now
                seen = None
                continue
            if stop is None:
                time.sleep(poll)
            elif stop.wait(poll):
                return None

    # --- the holder's thread -------------------------------------------------------------------------------------
    def _lose(self, why: str) -> None:
        self.lost_reason = why
        self.lost.set()
        if self._on_lost is not None:
            self._on_lost(self)

    def _beat(self) -> bool:
        """One renewal (or, in doubt, one attempt to take the next epoch). False when the store did not answer."""
        row, started = self._row, time.monotonic()
        try:
            with self._mutex:
                if self._done.is_set():
                    return True
                if started < self._valid_until:
                    self.record["renewals"] += 1
                    self.record["renewed_ms"] = int(time.time() * 1000)
                    row.lake.write_bytes(orjson.dumps(self.record), row.name(self.epoch))
                    top = row.top()
                    if top == self.epoch:
                        self._valid_until = started + self.ttl_s - self.heartbeat_s
                        return True
                else:  # in doubt: compete for the next epoch as any acquirer does
                    top = row.top()
                    if top == self.epoch:
                        self.record.update(renewals=0, renewed_ms=int(time.time() * 1000))
                        nxt = self.epoch + 1
                        if row.lake.create(orjson.dumps(self.record), row.name(nxt)) and row.top() == nxt:
                            self.epoch, self._valid_until = nxt, started + self.ttl_s - self.heartbeat_s
                            row.prune(nxt)
                            return True
                        top = nxt
            _, raw = row.current()
            other = (_parse(raw) or {}).get("holder", "another holder")
            self._lose(f"{row.key}: epoch {top} is held by {other} (this holder had {self.epoch})")
            return True
        except StorageError:
            return False

    def _run(self) -> None:
        wait = self.heartbeat_s
        while not self._done.wait(wait) and not self.lost.is_set():
            wait = self.heartbeat_s if self._beat() else min(1.0, self.heartbeat_s / 4)

    def release(self) -> None:
        """Stop renewing and mark the lease released (when this holder still has the highest epoch), so the next
        acquirer takes it at once. A store that does not answer leaves it to expire. Idempotent."""
        with self._mutex:
            if self._done.is_set():
                return
            self._done.set()
            if _HELD.get(self._row.key) is self:
                del _HELD[self._row.key]
            if self.lost.is_set():
                return
            try:
                if self._row.top() == self.epoch:
                    self.record["released"] = True
                    self._row.lake.write_bytes(orjson.dumps(self.record), self._row.name(self.epoch))
            except StorageError:
                pass

    close = release

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holder_of(lake: Lake, key: str) -> dict | None:
    """The record of the current holder of lease `key` (with its `epoch`) when it may be alive: not released, its
    process alive on this machine, or elsewhere renewed within two TTLs by this machine's wall clock. None when
    the lease is free. For display and for leaving a holder's work alone, never for mutual exclusion."""
    epoch, raw = _Row(lake, key).current()
    record = _parse(raw)
    if record is None or record.get("released"):
        return None
    alive = _alive(record)
    if alive is None:
        ttl_ms = int(record.get("ttl_ms") or TTL_S * 1000)
        alive = time.time() * 1000 - int(record.get("renewed_ms") or 0) < 2 * ttl_ms
    return {**record, "epoch": epoch} if alive else None
