"""`jobs.core.lease`: a lease on the lake. On a local lake: of racing acquirers (threads, processes) exactly one
holds it; a holder that may live elsewhere is taken over only once it stopped renewing for the TTL; a holder that
was paused past its validity notices that another took over and loses it (`lost`, `on_lost`) and was no longer
`valid` before the taker took it; one whose store did not answer takes the lease back when it answers; a released
lease, or one whose holder's process is gone on this machine, is taken at once. On the session's HDFS: racing
acquirers with their own clients, exactly one winner, and a take-over after expiry only."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest

import jobs.core.lease as lease_mod
from changelog.storage import LakeUnreachable, open_lake
from jobs.core.lease import Lease, holder_of

TTL, BEAT = 1.6, 0.4


def _race(lakes, key: str) -> list[Lease]:
    """Every lake of `lakes` acquires `key` in its own thread, all at once: the leases won."""
    start, won = threading.Barrier(len(lakes)), []

    def one(lake) -> None:
        start.wait()
        got = Lease.acquire(lake, key, f"racer {threading.get_ident()}", ttl_s=TTL, heartbeat_s=BEAT)
        if got is not None:
            won.append(got)

    threads = [threading.Thread(target=one, args=(lake,)) for lake in lakes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return won


def _elsewhere(monkeypatch, lake, key: str, **kw) -> Lease:
    """A lease acquired as if by a process of another machine (its record names another node)."""
    monkeypatch.setattr(lease_mod, "_NODE", "another-machine")
    try:
        got = Lease.acquire(lake, key, "elsewhere", ttl_s=TTL, heartbeat_s=BEAT, **kw)
    finally:
        monkeypatch.undo()
    assert got is not None
    return got


def test_of_racing_threads_exactly_one_holds_the_lease(tmp_path):
    lake = open_lake(tmp_path)
    won = _race([lake] * 16, "jobs/j/lease")
    assert len(won) == 1 and won[0].valid and won[0].epoch == 1
    won[0].release()
    again = _race([lake] * 16, "jobs/j/lease")  # released: taken at once, by one
    assert len(again) == 1 and again[0].epoch == 2
    again[0].release()


_RACER = """
import sys, time
from changelog.storage import open_lake
from jobs.core.lease import Lease
got = Lease.acquire(open_lake(sys.argv[1]), "jobs/j/lease", "process", ttl_s=5, heartbeat_s=1)
print(1 if got is not None else 0, flush=True)
time.sleep(60)
"""


def test_of_racing_processes_exactly_one_holds_the_lease_and_a_killed_one_is_taken_over_at_once(tmp_path):
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    try:
        answers = [p.stdout.readline().strip() for p in procs]
        assert sorted(answers) == ["0"] * 7 + ["1"]
        lake = open_lake(tmp_path)
        holder = holder_of(lake, "jobs/j/lease")
        assert holder is not None and holder["pid"] in {p.pid for p in procs}
        assert Lease.acquire(lake, "jobs/j/lease", "late", ttl_s=5, heartbeat_s=1) is None  # it lives here
        winner = next(p for p in procs if p.pid == holder["pid"])
        winner.kill()
        winner.wait()
        started = time.monotonic()
        got = Lease.acquire(lake, "jobs/j/lease", "next", ttl_s=5, heartbeat_s=1)
        assert got is not None and time.monotonic() - started < 1  # its process is gone: no TTL to wait
        got.release()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_holder_elsewhere_is_taken_over_only_after_it_stopped_renewing_for_the_ttl(tmp_path, monkeypatch):
    lake, key = open_lake(tmp_path), "jobs/j/lease"
    other = _elsewhere(monkeypatch, lake, key)
    started = time.monotonic()
    assert Lease.acquire(lake, key, "here", ttl_s=TTL, heartbeat_s=BEAT) is None  # it renews: alive
    assert time.monotonic() - started <= BEAT + 1
    gave_up = threading.Event()
    threading.Timer(3 * TTL, gave_up.set).start()
    patient = Lease.acquire(
        lake, key, "here", ttl_s=TTL, heartbeat_s=BEAT, wait_for_holder=True, stop=gave_up
    )
    assert (
        patient is None and other.valid and not other.lost.is_set()
    )  # it renewed all along: never taken over

    other._done.set()  # its process died (kill -9 elsewhere): no more renewals, nothing released
    started = time.monotonic()
    got = Lease.acquire(lake, key, "here", ttl_s=TTL, heartbeat_s=BEAT, wait_for_holder=True)
    assert got is not None and got.epoch == other.epoch + 1
    assert time.monotonic() - started >= TTL
    assert holder_of(lake, key)["holder"] == "here"
    got.release()
    assert holder_of(lake, key) is None


def test_a_paused_holder_is_invalid_before_the_take_over_and_notices_it_lost(tmp_path, monkeypatch):
    lake, key = open_lake(tmp_path), "jobs/j/lease"
    told = []
    other = _elsewhere(monkeypatch, lake, key, on_lost=lambda lease: told.append(lease.lost_reason))
    beat = other._beat
    other._beat = lambda: True  # paused (a long GC, SIGSTOP): it renews nothing
    got = Lease.acquire(lake, key, "here", ttl_s=TTL, heartbeat_s=BEAT, wait_for_holder=True)
    assert got is not None
    assert not other.valid  # its validity (TTL - heartbeat after its last renewal) ended before the take-over
    other._beat = beat  # it resumes: its next beat finds a higher epoch
    assert other.lost.wait(5 * BEAT) and told and "here" in told[0]
    time.sleep(2 * BEAT)
    assert got.valid and not got.lost.is_set()  # the one that lost did not disturb the new holder
    got.release()


def test_a_holder_whose_store_did_not_answer_takes_the_lease_back(tmp_path):
    lake, key = open_lake(tmp_path), "jobs/j/lease"
    held = Lease.acquire(lake, key, "holder", ttl_s=TTL, heartbeat_s=BEAT)
    write, create = lake.write_bytes, lake.create

    def down(*_a, **_k):
        raise LakeUnreachable(lake.uri(), key, "the store does not answer")

    lake.write_bytes = lake.create = down
    deadline = time.monotonic() + 3 * TTL
    while held.valid and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not held.valid and not held.lost.is_set()  # in doubt, not lost
    epoch = held.epoch
    lake.write_bytes, lake.create = write, create
    stop = threading.Event()
    threading.Timer(3 * TTL, stop.set).start()
    assert held.wait_valid(stop) and held.epoch == epoch + 1  # competed for the next epoch, and won
    held.release()


@pytest.mark.e2e
def test_on_hdfs_racing_acquirers_have_one_winner_and_a_take_over_waits_for_expiry(hdfs_server, monkeypatch):
    url = f"{hdfs_server.url}/lease-{uuid.uuid4().hex[:8]}"
    key = "jobs/j/lease"
    won = _race([open_lake(url) for _ in range(8)], key)  # each with its own NameNode client
    assert len(won) == 1
    first = won[0]
    lake = open_lake(url)
    assert holder_of(lake, key)["epoch"] == first.epoch
    first._done.set()  # killed: no renewal, no release
    monkeypatch.setattr(lease_mod, "_NODE", "another-machine")  # a driver started on another machine
    started = time.monotonic()
    got = Lease.acquire(lake, key, "takeover", ttl_s=TTL, heartbeat_s=BEAT, wait_for_holder=True)
    assert got is not None and got.epoch == first.epoch + 1 and time.monotonic() - started >= TTL
    racers = _race([open_lake(url) for _ in range(4)], key)  # it renews: nobody else gets it
    assert racers == [] and got.valid
    got.release()
    monkeypatch.undo()
