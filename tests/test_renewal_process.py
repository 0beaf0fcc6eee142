"""The renewal process's safety rules (``_renewal_link``, ``_renewal_process``), one test per rule.

Leases of 1 s or more are renewed by a per-client renewal process. What must hold whatever it does:

1. the holder keeps the one validity truth: a confirmation never revives a lease;
2. a forked child cannot release or disturb its parent's delegated lease;
3. no renewal write lands after a release (the release does not wait for the renewal process: at most
   one renewal, sent before "stop" arrived, reaches the store after it, and the store refuses it), and
   none is sent after a loss or ``max_hold``;
4. on DynamoDB it signs with the holder's current credentials, and with none once they expired;
5. it reproduces the Redis connection settings, and refuses (once, logged) those it cannot;
6. it costs nothing until needed, and nothing at all for the memory store and short leases;
7. one client's thousand leases keep a fixed number of holder threads.

Everything runs against real stores (SQLite files, redis-server, the serialised moto server) and real
renewal processes, each stopped by its PID when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from chaos.proxy import FaultProxy
from fastlease import LockLost, MemoryClient, SQLiteClient, SyncDistributedLock, _impl
from fastlease.testing import FakeClock
from helpers.lock_waiter import hand_over_between
from helpers.waiting import wait_until

# The safety rules hold on every Python that CI runs: make test runs these on 3.12 and 3.13 too.
pytestmark = [pytest.mark.all_pythons, pytest.mark.posix]

LEASE_S = 1.0  # the shortest lease the renewal process takes: renewals every 333 ms
_PAUSE = threading.Event()  # never set: waited on for plain pauses


# ---- processes and threads of this process, from /proc ------------------------------------------
def _threads() -> set[int]:
    """Thread ids of this process, native threads included (the renewal pulse is one). Compared as
    sets: a thread of an earlier test that ends meanwhile must not hide a new one."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _children() -> set[int]:
    """PIDs whose parent is this process (zombies included)."""
    me = os.getpid()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.add(int(name))
    return found


def _stop_child(pid: Optional[int]) -> None:
    """SIGKILL ``pid`` if it is still a child of this process, and reap it (bounded)."""
    if not pid or pid not in _children():
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for _ in range(500):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        _PAUSE.wait(0.01)


@pytest.fixture
def renewal_processes() -> Iterator[list[int]]:
    """PIDs of renewal processes a test saw (append ``client.engine.link.pid``), stopped after it."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            _stop_child(pid)


def _renewals(guard: SyncDistributedLock) -> int:
    guard.is_valid()  # applies the renewal process's reports first
    return guard.metrics.renewals


def _renewal_pid(client: Any, seen: list[int]) -> int:
    """The client's renewal process, once it has started (bounded wait); recorded for the teardown."""
    link = client.engine.link
    assert link is not None, "this client renews in process"
    wait_until(lambda: link.pid is not None, 10, "the renewal process to start")
    seen.append(link.pid)
    return int(link.pid)


# ---- 1. one validity truth -----------------------------------------------------------------------
class _DelegatingLink:
    """Stands for the client's renewal link, so that a lease counts as delegated while the test hands
    ``Lease.apply_renewal`` the confirmations itself, at chosen stamps, on a fake clock."""

    fast_pulse = None  # registrations go through register()

    def register(self, lease: Any, mono_ns: int, wall_ns: int, hold_until_ns: int, renew_at_ns: int) -> int:
        return 1

    def registered(self, lease: Any, link_id: int) -> bool:
        return link_id == 1

    def sync(self) -> None:
        pass

    def refresh(self) -> None:
        pass

    def stop(self, lease: Any, link_id: int, wait: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


COUNTERS = (1, 0, 0, 0, 1)  # what a renewal process reports with a confirmation: its request counters


def test_a_confirmation_outside_validity_or_after_the_end_never_revives(core, make_client):
    clock = FakeClock()
    client = make_client(clock=clock)
    client.engine.link = _DelegatingLink()
    lease_ms = 3000  # validity 2.7 s from each confirmed write's stamp
    s = 1_000_000_000

    def held() -> Any:
        lease = core.Lease(client, "locks", f"k{clock.monotonic_ns()}", lease_ms, 0)
        lease.acquire()
        return lease, clock.monotonic_ns(), clock.time_ns()

    # A confirmation inside validity extends it (what the rules below refuse is therefore a refusal).
    lease, mono, wall = held()
    lease.apply_renewal("v1", mono + s, wall + s, COUNTERS)
    assert lease.version == "v1"
    clock.advance(3.0)  # past the acquisition's validity (2.7 s), inside the renewal's (3.7 s)
    assert lease.is_valid()
    lease.release()

    # A late confirmation, stamped before the validity it would extend began: nothing changes.
    lease, mono, wall = held()
    version = lease.version
    lease.apply_renewal("stale", mono - 1, wall - 1, COUNTERS)
    assert lease.version == version
    clock.advance(2.8)
    assert not lease.is_valid()
    with pytest.raises(LockLost):
        lease.raise_if_lost()

    # Validity has ended but nothing has looked yet (the holder's thread was busy): a confirmation
    # stamped now lies outside it and does not revive the lease.
    lease, mono, wall = held()
    client.engine.scheduler.cancel(lease)  # the holder's own step never runs: only the report arrives
    clock.advance(2.8)
    lease.apply_renewal("too-late", clock.monotonic_ns(), clock.time_ns(), COUNTERS)
    assert lease.version != "too-late"
    assert not lease.is_valid()
    with pytest.raises(LockLost) as info:
        lease.raise_if_lost()
    assert info.value.cause == "expired"

    # Marked lost, then a confirmation stamped inside the old validity arrives: still lost.
    lease, mono, wall = held()
    clock.advance(2.8)
    with pytest.raises(LockLost):
        lease.raise_if_lost()
    lease.apply_renewal("after-loss", mono + s, wall + s, COUNTERS)
    assert lease.state_name == "lost" and lease.version != "after-loss"
    assert not lease.is_valid()
    with pytest.raises(LockLost):
        lease.raise_if_lost()

    # Released, then a confirmation stamped inside validity arrives: still released.
    lease, mono, wall = held()
    lease.release()
    lease.apply_renewal("after-release", mono + 1, wall + 1, COUNTERS)
    assert lease.state_name == "released" and lease.version != "after-release"
    assert not lease.is_valid()


# ---- 2. fork ------------------------------------------------------------------------------------
FORK_RAISED, FORK_RETURNED, FORK_OTHER = 10, 11, 12


@contextlib.contextmanager
def _delegated_lease(path: Path, key: str, seen: list[int]) -> Iterator[tuple[Any, Any, int]]:
    """(client, guard, renewal process PID) of a SQLite lease of 1 s on ``key`` that its client's
    renewal process has renewed; released, then the client closed, when the block ends."""
    client = SQLiteClient(path)
    try:
        with SyncDistributedLock(client, table="locks", key=key, lease_duration=LEASE_S) as lease:
            pid = _renewal_pid(client, seen)
            wait_until(lambda: _renewals(lease) >= 1, 5, "a renewal from the renewal process")
            yield client, lease, pid
    finally:
        client.close()


def _assert_collected(pid: int) -> None:
    """The renewal process ``pid`` has exited and its client collected it: no zombie is left."""
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 5,
               lambda: f"renewal process {pid} to be collected: {Path(f'/proc/{pid}/stat').read_text()[:80]!r}")


@pytest.mark.posix
def test_a_forked_child_cannot_release_and_the_parent_keeps_renewing(tmp_path, renewal_processes):
    with _delegated_lease(tmp_path / "locks.db", "forked", renewal_processes) as (client, lease, pid):
        child = os.fork()
        if child == 0:  # the child: report by exit code only, never return into pytest
            code = FORK_OTHER
            try:
                lease.__exit__(None, None, None)
                code = FORK_RETURNED
            except RuntimeError as error:
                code = FORK_RAISED if "forked child" in str(error) else FORK_OTHER
            finally:
                os._exit(code)
        status = None
        for _ in range(1000):  # bounded: the child only raises and exits
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                break
            _PAUSE.wait(0.01)
        else:
            _stop_child(child)
        assert status is not None and os.WIFEXITED(status), status
        assert os.WEXITSTATUS(status) == FORK_RAISED
        after_child = _renewals(lease)
        _PAUSE.wait(2.2)
        assert _renewals(lease) >= after_child + 3  # every 333 ms: about 6
        assert lease.is_valid()
        assert client.engine.link.pid == pid
        assert client.engine.link.renewing == 1
        assert [row["owner"] for row in client.inspect("locks")] == [lease.owner]
    assert lease.state == "released"
    _assert_collected(pid)  # the renewal process exits with the client


@pytest.mark.posix
def test_a_renewal_process_that_stops_answering_is_killed_and_collected(tmp_path, renewal_processes):
    with pytest.raises(LockLost, match="lapsed"), \
            _delegated_lease(tmp_path / "locks.db", "frozen", renewal_processes) as (client, lease, pid):
        os.kill(pid, signal.SIGSTOP)  # renews nothing and answers nothing from now on
        # Lapses 0.9 s after its last renewal; the loss asks the renewal process to stop, and after
        # min(lease/3, 5 s) * 2 + STOP_GRACE_S without an answer it is killed, before the loss is told.
        assert lease.lost.wait(5) and lease.lost_cause == "expired"
        assert client.engine.link.renewing == 0  # renewals are this process's again
        _assert_collected(pid)
    assert lease.state == "lost"  # the row was still ours: the release deleted it


def test_a_backlog_of_pulses_read_late_does_not_make_a_stopped_holder_look_alive():
    """A pulse is dated by the read before the one that brings it (the pipe was empty then), plus one
    interval per pulse after the first: never later than it was written. Dated by its own read, a backlog
    handed over after the renewal process's loop was held up would make a holder stopped meanwhile look
    alive for another PULSE_SILENCE_MS, and renewals would go on."""
    from fastlease._renewal_link import PULSE_INTERVAL_MS, PULSE_SILENCE_MS
    from fastlease._renewal_process import Pulses

    ms = 1_000_000
    pulses = Pulses()
    held_up_at = time.monotonic_ns() - 2 * PULSE_SILENCE_MS * ms  # the last read before the loop was held up
    pulses.last_ns = held_up_at
    pulses.arrived(3, held_up_at)  # three pulses, then the holder stopped; all read at once, now
    assert pulses.last_ns == held_up_at + 2 * PULSE_INTERVAL_MS * ms
    assert not pulses.fresh()  # written 800 ms ago at the latest (600 ms, then stopped): no renewal
    pulses.arrived(0, time.monotonic_ns())  # a read that brought only registrations dates nothing
    assert not pulses.fresh()
    pulses.arrived(1, time.monotonic_ns() - PULSE_INTERVAL_MS * ms)  # steady state: a read per pulse
    assert pulses.fresh()
    latest = pulses.last_ns
    pulses.arrived(1, held_up_at)  # an older lower bound never moves the date back
    assert pulses.last_ns == latest


def test_a_holder_counts_as_alive_only_between_a_proved_pulse_and_the_end_of_its_pipe():
    """Renewals go out only while the holder is proved alive. What the pipe holds when the renewal process
    starts proves nothing: written at any time since the holder started it, by a holder that may have been
    killed since (a process started late on a busy host would renew a dead holder's lease, and its takeover
    would wait a whole lease more). A pulse read after a read that emptied the pipe proves it. Once the
    holder's end closes (it died, or its last client closed), nothing is renewed while the process shuts
    down, though the last pulse is well within the silence allowed."""
    import socket

    from fastlease._renewal_process import GatedStore, RenewalProcess
    from fastlease.exceptions import StoreError

    pulse = (8).to_bytes(4, sys.byteorder) + bytes(8)  # a pulse: 8 bytes of message, link id 0
    holder_end, process_end = socket.socketpair()
    pipe_read, pipe_write = os.pipe()
    try:
        os.write(pipe_write, pulse * 3)  # written before the process started
        process = RenewalProcess(process_end, pipe_read)
        gated = GatedStore(object(), process._pulses)  # its store is never reached: every request is refused
        assert process._read_pipe() and not process._pulses.fresh()
        with pytest.raises(StoreError) as refused:
            gated.update_version_if("locks", "k", "owner", "v1", "v2", 1.0, None)
        assert refused.value.maybe_committed is False and "not yet heard from" in str(refused.value)
        os.write(pipe_write, pulse)  # written after a read that emptied the pipe: the holder is alive
        assert process._read_pipe() and process._pulses.fresh()
        os.close(pipe_write)
        pipe_write = -1
        process.run()  # returns at the end of the pipe
        assert not process._pulses.fresh()
        with pytest.raises(StoreError, match="the holder closed its pipe"):
            gated.update_version_if("locks", "k", "owner", "v1", "v2", 1.0, None)
    finally:
        for fd in (pipe_read, pipe_write):
            if fd >= 0:
                os.close(fd)
        holder_end.close()
        process_end.close()


def _stopped(pid: int) -> bool:
    """Whether the kernel reports ``pid`` stopped (state T)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] == "T"


@pytest.mark.server
def test_a_release_does_not_wait_for_the_renewal_process(redis_url, renewal_processes):
    """A release tells the renewal process to stop and goes on. At a process's first lease the renewal
    process may still be starting, for longer than the lease under load, and nothing renews the lease
    meanwhile: a release that waited for its answer then found the Redis key expired and ended the block
    in LockLost (issue 32's drill, on the cluster). Here the renewal process is stopped, so it cannot
    answer: the release must still delete the row while the lease is valid, and raise nothing."""
    from fastlease import RedisClient

    client = RedisClient(redis_url)
    pid = 0
    try:
        with SyncDistributedLock(client, table="locks", key="unanswered", lease_duration=LEASE_S) as lease:
            pid = _renewal_pid(client, renewal_processes)
            wait_until(lambda: _renewals(lease) >= 1, 5, "a renewal from the renewal process")
            os.kill(pid, signal.SIGSTOP)
            wait_until(lambda: _stopped(pid), 5, "the renewal process to be stopped")
            lease.raise_if_lost()  # valid when the block ends: its release follows at once
        assert lease.state == "released"
        assert client.inspect("locks", "unanswered") == []
        os.kill(pid, signal.SIGCONT)  # it then reads "stop", and then the end of the socket at close()
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)
        client.close()
    _assert_collected(pid)


@pytest.mark.server
def test_a_lease_handed_over_is_first_renewed_a_quarter_second_after_its_stamp(redis_url, redis_db, renewal_processes):
    """On Redis a release hands the lease to the head of the key's line: the waiter holds it with the
    handover's 1.5 s validity, counted from the stamp before its read in line. The renewal process renews
    it from the schedule the holder registered: 250 ms after that stamp (HANDED_FIRST_RENEWAL_MS), not at
    once, as a schedule kept from the lease's own L/3 would have it (that moment has passed)."""
    from fastlease import RedisClient
    from fastlease.stores.redis.scripts import NodeLayout

    holder, taker = RedisClient(redis_url), RedisClient(redis_url)
    lease = SyncDistributedLock(taker, table="locks", key="handed", lease_duration=30, wait_timeout=30)
    thread = threading.Thread(target=lease.__enter__, daemon=True)
    try:
        # First the taker's renewal process runs and knows its store: its start must not delay the renewal.
        with SyncDistributedLock(taker, table="locks", key="warm-up", lease_duration=LEASE_S) as warm_up:
            _renewal_pid(taker, renewal_processes)
            wait_until(lambda: _renewals(warm_up) >= 1, 10, "a renewal of the warm-up lease")
        with SyncDistributedLock(holder, table="locks", key="handed", lease_duration=30):
            thread.start()
            line = NodeLayout().line("locks", "handed")
            wait_until(lambda: redis_db.zcard(line) == 1, 10, "the waiter's place in line")
        thread.join(10)
        assert not thread.is_alive() and lease.is_valid()
        assert lease.metrics.write_requests == 1  # its refused put: the handover needed no write
        stamp_ns = lease._lease.valid_until_ns() - 1_350_000_000
        wait_until(lambda: _renewals(lease) >= 1, 10, "the first renewal, from the renewal process")
        renewed_at_ns = lease._lease.valid_until_ns() - 27_000_000_000
        # (1 ms for the two clocks the validity's end is the earlier of)
        assert renewed_at_ns >= stamp_ns + 250_000_000 - 1_000_000, (renewed_at_ns - stamp_ns) / 1e6
        lease.__exit__(None, None, None)
    finally:
        thread.join(10)
        holder.close()
        taker.close()


@pytest.mark.server
def test_a_lease_handed_over_on_postgresql_gets_its_lease_ms_back_from_the_renewal_process(postgres_db,
                                                                                           renewal_processes):
    """On PostgreSQL the handover writes the handover's 1.5 s as the row's lease_ms (a row does not expire):
    the first renewal, which the renewal process sends, must write the lease's own 30 s back, or a
    contender could take the key over 1.5 s after any renewal while the holder counts 27 s of validity."""
    import psycopg

    from fastlease import PostgresClient
    from fastlease.stores.postgres.sql import line_table

    holder, taker = PostgresClient(postgres_db), PostgresClient(postgres_db)
    holder.create_lock_table("locks")
    try:
        with psycopg.connect(postgres_db, autocommit=True) as admin:
            def lease_ms() -> int:
                return int(admin.execute("SELECT lease_ms FROM locks WHERE key = 'handed'").fetchone()[0])

            # First the taker's renewal process runs and knows its store, so that it sends that renewal.
            with SyncDistributedLock(taker, table="locks", key="warm-up", lease_duration=LEASE_S) as warm_up:
                _renewal_pid(taker, renewal_processes)
                wait_until(lambda: _renewals(warm_up) >= 1, 10, "a renewal of the warm-up lease")
            places = f"SELECT waiter FROM {line_table('locks')}"
            lease = hand_over_between(holder, taker, lambda: admin.execute(places).fetchall(), "handed")
            assert lease_ms() == 1_500
            wait_until(lambda: _renewals(lease) >= 1, 10, "the first renewal, from the renewal process")
            assert lease_ms() == 30_000
            lease.__exit__(None, None, None)
    finally:
        holder.close()
        taker.close()


# ---- 3. no renewal write lands after a release; none is sent after a loss or max_hold (MONITOR) ------
class CommandLog:
    """Every command the Redis server runs, in its order: MONITOR on a connection of its own, read by
    a thread until ``close`` (bounded)."""

    def __init__(self, url: str) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._monitor = self._redis.monitor()
        self._monitor.__enter__()  # MONITOR is answered before any later command is reported
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="test-redis-monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        connection = self._monitor.connection
        while not self._stop.is_set():
            if connection.can_read(timeout=0.05):
                entry = self._monitor.next_command()
                with self._lock:
                    self._entries.append(entry)

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._entries)

    def mark(self, redis_db: Any, text: str) -> None:
        """Send ECHO ``text`` and wait (bounded) until it is logged: everything the server ran before
        it is in the log then."""
        redis_db.echo(text)
        wait_until(lambda: any(e["command"] == f"ECHO {text}" for e in self.entries()), 5, f"ECHO {text} in the log")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._monitor.__exit__()
        self._redis.close()

    def __enter__(self) -> CommandLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _script_calls(entries: list[dict[str, Any]], name: str, key: str) -> list[int]:
    """Positions in ``entries`` of the calls of script ``name`` (RENEW, RELEASE ...) on lock ``key``."""
    from fastlease.stores.redis import scripts as store

    script = next(s for s in store.NODE_SCRIPTS.all if s.name == name)
    # The lease is always the first key; RELEASE names the key's line of waiters too.
    pattern = re.compile(f"EVALSHA {script.sha.decode()} [1-9] {re.escape(store.lease_key('locks', key).decode())} ")

    def refused(at: int) -> bool:  # answered NOSCRIPT: the same client's next command loads the script
        port = entries[at].get("client_port")
        later = next((entry for entry in entries[at + 1:] if entry.get("client_port") == port), None)
        return later is not None and later["command"].startswith("SCRIPT LOAD")

    return [i for i, entry in enumerate(entries) if pattern.match(entry["command"]) and not refused(i)]


@pytest.fixture
def command_log(redis_url: str) -> Iterator[CommandLog]:
    with CommandLog(redis_url) as log:
        yield log


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[Any]:
    from fastlease import RedisClient

    with RedisClient(redis_url) as client:
        yield client


def test_release_stops_renewals_and_none_lands_after_it(redis_client, redis_db, command_log, renewal_processes):
    from fastlease.stores.redis.scripts import lease_key

    with SyncDistributedLock(redis_client, table="locks", key="released", lease_duration=LEASE_S) as lease:
        _renewal_pid(redis_client, renewal_processes)
        _PAUSE.wait(1.5)  # four renewals, from the renewal process
        assert lease.is_valid()
    _PAUSE.wait(1.0)  # three renewal intervals after the release
    command_log.mark(redis_db, "released-end")
    entries = command_log.entries()
    renewals = _script_calls(entries, "RENEW", "released")
    releases = _script_calls(entries, "RELEASE", "released")
    assert len(renewals) >= 3 and releases, [e["command"][:60] for e in entries]
    # "stop" went with the release: at most the one renewal already under way follows it, on a key that is
    # gone, so it changes nothing; none of the three intervals after it renews.
    assert len([i for i in renewals if i > releases[0]]) <= 1, "renewals went on after the release"
    assert redis_db.exists(lease_key("locks", "released")) == 0, "a renewal revived the released lease"
    # The renewals came from the renewal process's connections, the release from the holder's.
    assert {entries[i]["client_port"] for i in renewals}.isdisjoint(entries[i]["client_port"] for i in releases)


def test_no_renewal_write_after_a_loss(redis_client, redis_db, command_log, renewal_processes):
    from fastlease.stores.redis.scripts import lease_key

    with pytest.raises(LockLost) as info:
        with SyncDistributedLock(redis_client, table="locks", key="stolen", lease_duration=LEASE_S) as lease:
            _renewal_pid(redis_client, renewal_processes)
            wait_until(lambda: _renewals(lease) >= 2, 5, "two renewals")
            redis_db.hset(lease_key("locks", "stolen"), "owner", "thief")  # the next renewal fails
            wait_until(lambda: not lease.is_valid(), 3, "the stolen lease to be lost")
            _PAUSE.wait(1.0)
            command_log.mark(redis_db, "stolen-end")
    assert info.value.cause == "stolen"
    entries = command_log.entries()
    stolen_at = [e["command"] for e in entries].index("HSET fastlease:locks:lease:stolen owner thief")
    renewals = _script_calls(entries, "RENEW", "stolen")
    assert any(i < stolen_at for i in renewals)
    assert len([i for i in renewals if i > stolen_at]) <= 1, "renewals went on after the store refused one"


def test_renewals_stop_at_max_hold(redis_client, redis_db, command_log, renewal_processes):
    with pytest.raises(LockLost) as info:
        with SyncDistributedLock(redis_client, table="locks", key="max-hold", lease_duration=LEASE_S,
                                 max_hold=1.5) as lease:
            _renewal_pid(redis_client, renewal_processes)
            assert lease.lost.wait(5)  # lapses 0.9 s after the last renewal before max_hold
            cause = lease.lost_cause
            _PAUSE.wait(1.0)
            command_log.mark(redis_db, "max-hold-end")
    # (The release then finds the row expired, and reports that as the row no longer being ours.)
    assert cause == "cancelled" and info.value.cause in ("cancelled", "stolen")
    renewals = _script_calls(command_log.entries(), "RENEW", "max-hold")
    # Renewal k cannot start before k * 333 ms: four fit in 1.5 s, a fifth only if max_hold were ignored.
    assert 2 <= len(renewals) <= 4, len(renewals)


# ---- 4. DynamoDB credentials ----------------------------------------------------------------------
class SigningRecorder(FaultProxy):
    """The suite's TCP proxy (no faults set), recording which access key signed each request that
    passes through it, and its X-Amz-Target: ``requests`` is a list of (time.time(), target, key)."""

    _HEAD = re.compile(rb"X-Amz-Target: (\S+).*?Credential=([^/]+)/", re.S | re.I)

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__(upstream_host, upstream_port)
        self.requests: list[tuple[float, str, str]] = []

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool,
                    other: asyncio.StreamWriter) -> None:
        if upstream:
            reader = _Tap(reader, self.requests)  # type: ignore[assignment]
        await super()._pump(reader, writer, upstream, other)

    def of(self, target: str) -> list[tuple[float, str]]:
        return [(at, key) for at, name, key in list(self.requests) if name.endswith("." + target)]


class _Tap:
    """Reads one connection's requests as they pass: heads are parsed, bodies skipped."""

    def __init__(self, reader: asyncio.StreamReader, requests: list[tuple[float, str, str]]) -> None:
        self._reader = reader
        self._requests = requests
        self._buffer = b""

    async def read(self, size: int) -> bytes:
        chunk = await self._reader.read(size)
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = self._buffer[:end]
            length = re.search(rb"Content-Length: (\d+)", head, re.I)
            size_of_body = int(length.group(1)) if length else 0
            if len(self._buffer) < end + 4 + size_of_body:
                break
            found = SigningRecorder._HEAD.search(head)
            if found:
                self._requests.append((time.time(), found.group(1).decode(), found.group(2).decode()))
            self._buffer = self._buffer[end + 4 + size_of_body:]
        return chunk


@pytest.fixture
def dynamodb_table(moto_session: Any, moto_endpoint: str) -> Iterator[str]:
    from fastlease import DynamoDBClient

    admin = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint, fast_path=False)
    name = f"renewal-{os.getpid()}-{time.monotonic_ns()}"
    admin.create_lock_table(name)
    try:
        yield name
    finally:
        admin.boto3_client.delete_table(TableName=name)
        admin.close()


@pytest.fixture
def recorder(moto_endpoint: str) -> Iterator[SigningRecorder]:
    from urllib.parse import urlsplit

    upstream = urlsplit(moto_endpoint)
    proxy = SigningRecorder(upstream.hostname or "127.0.0.1", upstream.port or 80)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def _refreshable_client(endpoint_url: str, access_key: str, expires_in_s: float,
                        refresh: Callable[[], dict[str, Any]], advisory_s: float, mandatory_s: float) -> Any:
    """A boto3 DynamoDB client whose credentials are botocore RefreshableCredentials, found by the
    session's own credential chain (a provider placed first)."""
    import boto3
    import botocore.credentials
    import botocore.session

    credentials = botocore.credentials.RefreshableCredentials.create_from_metadata(
        {"access_key": access_key, "secret_key": "secret", "token": "token",
         "expiry_time": _expiry(expires_in_s)},
        refresh_using=refresh, method="test-refresh", advisory_timeout=advisory_s, mandatory_timeout=mandatory_s)

    class Provider(botocore.credentials.CredentialProvider):
        METHOD = "test-refresh"

        def load(self) -> Any:
            return credentials

    session = botocore.session.Session()
    session.get_component("credential_provider").insert_before("env", Provider())
    return boto3.session.Session(botocore_session=session, region_name="us-east-1").client(
        "dynamodb", endpoint_url=endpoint_url)


def _expiry(in_s: float) -> str:
    import datetime

    return (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=in_s)).isoformat()


def test_renewals_are_signed_with_refreshed_credentials(dynamodb_table, recorder, renewal_processes):
    from fastlease import DynamoDBClient

    refreshed_at: list[float] = []

    def refresh() -> dict[str, Any]:
        refreshed_at.append(time.time())
        return {"access_key": "AKIDNEW", "secret_key": "secret2", "token": "token2", "expiry_time": _expiry(3600)}

    # Refresh is due 2 s from now (38 s before the 40 s expiry): while the renewal process renews.
    boto3_client = _refreshable_client(f"http://127.0.0.1:{recorder.port}", "AKIDOLD", 40, refresh, 38, 1)
    client = DynamoDBClient(boto3_client)
    try:
        assert client.transport == "fast"
        with SyncDistributedLock(client, table=dynamodb_table, key="rotated", lease_duration=LEASE_S) as lease:
            _renewal_pid(client, renewal_processes)
            wait_until(lambda: refreshed_at, 5, "the credentials to be refreshed")
            _PAUSE.wait(1.5)
            assert lease.is_valid() and client.engine.link.renewing == 1
    finally:
        client.close()
    keys = [key for _, key in recorder.of("UpdateItem")]
    assert "AKIDOLD" in keys and "AKIDNEW" in keys, keys
    first_new = keys.index("AKIDNEW")
    assert set(keys[:first_new]) == {"AKIDOLD"} and set(keys[first_new:]) == {"AKIDNEW"}, keys
    assert len(keys) - first_new >= 3, keys  # the renewal process kept signing with the new key


def test_expired_credentials_end_renewals_and_the_lease(dynamodb_table, recorder, renewal_processes):
    from botocore.exceptions import CredentialRetrievalError

    from fastlease import DynamoDBClient
    from fastlease.exceptions import LockReleaseError

    def refresh() -> dict[str, Any]:
        raise CredentialRetrievalError(provider="test-refresh", error_msg="no new credentials")

    expires_at = time.time() + 3.0
    boto3_client = _refreshable_client(f"http://127.0.0.1:{recorder.port}", "AKIDOLD", 3.0, refresh, 1, 0.5)
    client = DynamoDBClient(boto3_client)
    guard = SyncDistributedLock(client, table=dynamodb_table, key="expiring", lease_duration=LEASE_S)
    try:
        guard.__enter__()
        _renewal_pid(client, renewal_processes)
        wait_until(lambda: not guard.is_valid(), 3.0 + 0.9 + 2.0, "the lease to end with its credentials")
        lost_at = time.time()
        _PAUSE.wait(1.0)
        assert not guard.is_valid()
        with pytest.raises(LockLost) as info:
            guard.raise_if_lost()
        assert info.value.cause in ("unreachable", "expired")
    finally:
        try:
            guard.__exit__(None, None, None)
        except (LockLost, LockReleaseError):
            pass  # the holder cannot sign the release either
        client.close()
    renewals = recorder.of("UpdateItem")
    assert len(renewals) >= 3 and {key for _, key in renewals} == {"AKIDOLD"}, renewals
    assert max(at for at, _ in renewals) < expires_at + 0.2, "a renewal was signed after the credentials expired"
    assert lost_at < expires_at + 0.9 + 1.0  # validity ran out from the last renewal before the expiry


# ---- 5. Redis connection settings ---------------------------------------------------------------
PASSWORD = "s3cret-for-tests"


@pytest.fixture
def unix_redis() -> Iterator[str]:
    """A redis-server on a unix socket only (no TCP port), whose one user is ``fastlease`` with a
    password; the default user is off. Stopped by its PID."""
    from fastlease.testing._process import ServerProcess
    from fastlease.testing.redis_server import READY_TEXT, redis_server_path

    executable = redis_server_path()
    if executable is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    directory = tempfile.mkdtemp(prefix="fl-redis-")  # short: a socket path has 107 bytes at most
    path = os.path.join(directory, "redis.sock")
    server = ServerProcess("redis-server (unix socket)")

    def command(port: int) -> list[str]:
        return [executable, "--port", "0", "--unixsocket", path, "--unixsocketperm", "700", "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--logfile", "", "--dir", directory,
                "--user", "default", "off", "--user", "fastlease", "on", f">{PASSWORD}", "~*", "&*", "+@all"]

    server.start(command, lambda line: READY_TEXT in line.lower(), timeout_s=20)
    try:
        yield path
    finally:
        server.stop()
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


@pytest.mark.server
def test_redis_unix_socket_database_and_acl_user_renew_from_the_renewal_process(unix_redis, renewal_processes):
    import redis

    from fastlease import RedisClient
    from fastlease.stores.redis.scripts import lease_key

    def connect(db: int) -> Any:
        return redis.Redis(unix_socket_path=unix_redis, db=db, username="fastlease", password=PASSWORD)

    client = RedisClient(connect(3))
    try:
        with SyncDistributedLock(client, table="locks", key="unix", lease_duration=LEASE_S) as lease:
            _renewal_pid(client, renewal_processes)
            _PAUSE.wait(1.5)
            assert _renewals(lease) >= 3 and lease.is_valid()
            assert client.engine.link.renewing == 1
            with connect(3) as db3, connect(0) as db0:
                assert db3.hget(lease_key("locks", "unix"), "owner") == lease.owner.encode()
                assert not db0.exists(lease_key("locks", "unix"))
    finally:
        client.close()


@pytest.mark.server
def test_a_setting_that_cannot_be_reproduced_keeps_renewals_here_logged_once(unix_redis, caplog):
    import redis

    from fastlease import RedisClient

    provider = redis.UsernamePasswordCredentialProvider("fastlease", PASSWORD)
    before = _children()
    client = RedisClient(redis.Redis(unix_socket_path=unix_redis, db=3, credential_provider=provider))
    try:
        with caplog.at_level(logging.INFO, logger="fastlease.renewal"):
            for key in ("first", "second"):
                with SyncDistributedLock(client, table="locks", key=key, lease_duration=LEASE_S) as lease:
                    _PAUSE.wait(0.8)
                    assert lease.metrics.renewals >= 2 and lease.is_valid()  # renewed in this process
        assert client.engine.link.pid is None and not _children() - before
    finally:
        client.close()
    reasons = [r.getMessage() for r in caplog.records if r.name == "fastlease.renewal"]
    assert len(reasons) == 1 and "credential_provider" in reasons[0], reasons
    assert caplog.records[0].levelno == logging.INFO


# ---- 6. cost ------------------------------------------------------------------------------------
def test_nothing_starts_until_a_lease_needs_the_renewal_process(tmp_path):
    threads, children = _threads(), _children()
    client = SQLiteClient(tmp_path / "locks.db")
    try:
        assert client.inspect("locks") == []
        assert client.engine.link is not None and client.engine.link.pid is None
        assert not _threads() - threads and not _children() - children  # a client that never acquires
        with SyncDistributedLock(client, table="locks", key="short", lease_duration=0.5) as lease:
            _PAUSE.wait(0.6)
            assert lease.metrics.renewals >= 2 and lease.is_valid()  # renewed here, every 167 ms
        assert client.engine.link.pid is None and not _children() - children
    finally:
        client.close()
    memory = MemoryClient()
    try:
        assert memory.engine.link is None
        with SyncDistributedLock(memory, table="locks", key="memory", lease_duration=LEASE_S) as lease:
            _PAUSE.wait(0.5)
            assert lease.metrics.renewals >= 1 and lease.is_valid()
        assert not _children() - children
    finally:
        memory.close()


def test_an_acquisition_does_not_wait_for_the_renewal_process(tmp_path, monkeypatch, renewal_processes):
    # Every Python process started from here now takes 1.5 s to start (a sitecustomize that sleeps):
    # an acquisition that waited for the renewal process could not return sooner.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(1.5)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    client = SQLiteClient(tmp_path / "locks.db")
    try:
        started = time.monotonic()
        with SyncDistributedLock(client, table="locks", key="slow-start", lease_duration=3) as lease:
            acquired_in = time.monotonic() - started
            assert acquired_in < 1.0, acquired_in
            _renewal_pid(client, renewal_processes)
            wait_until(lambda: _renewals(lease) >= 1, 8, "a renewal once the renewal process is up")
            assert lease.is_valid()
    finally:
        client.close()


# ---- 7. a thousand leases ---------------------------------------------------------------------------
def test_a_thousand_leases_renew_from_the_renewal_process_on_a_few_threads(tmp_path, capsys, renewal_processes):
    threads = _threads()
    client = SQLiteClient(tmp_path / "locks.db")
    guards = [SyncDistributedLock(client, table="locks", key=f"k{i}", lease_duration=10) for i in range(1000)]
    started = time.monotonic()
    try:
        for guard in guards:
            guard.__enter__()
        acquired_s = time.monotonic() - started
        _renewal_pid(client, renewal_processes)
        wait_until(lambda: all(_renewals(guard) >= 1 for guard in guards), 12, "a renewal of every lease",
                   interval=0.25)
        held_s = time.monotonic() - started
        lost = [guard.key for guard in guards if not guard.is_valid()]
        new = _threads() - threads
        # (Without the compiled core, the pulse is a Python thread of that name.)
        new_python = new & {t.native_id for t in threading.enumerate() if t.name != "fastlease-pulse"}
        delegated = client.engine.link.renewing
    finally:
        release_started = time.monotonic()
        for guard in guards:
            guard.__exit__(None, None, None)
        released_s = time.monotonic() - release_started
        client.close()
    with capsys.disabled():
        print(f"\n1000 leases x 10 s from the renewal process: acquired in {acquired_s:.2f} s, all renewed "
              f"after {held_s:.2f} s, released in {released_s:.2f} s; holder threads +{len(new)} "
              f"({len(new_python)} scheduler and workers, {len(new - new_python)} pulse)")
    assert lost == [] and delegated == 1000
    assert sum(guard.metrics.lost for guard in guards) == 0
    # The scheduler and its workers (at most 1 + RENEWAL_WORKERS = 4 Python threads), and the pulse.
    assert len(new_python) <= 1 + _impl.core.RENEWAL_WORKERS
    assert len(new - new_python) <= 1
    with sqlite3.connect(tmp_path / "locks.db") as db:
        assert db.execute('SELECT count(*) FROM "fastlease_lock_locks" WHERE owner IS NOT NULL').fetchone() == (0,)


# ---- 8. one renewal process per holder process, replaced when it dies --------------------------------
def _hold_gil(seconds: float) -> None:
    """Hold the GIL for ``seconds``: sum() C calls back to back, no other thread given the GIL between."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sum(range(200_000))
    finally:
        sys.setswitchinterval(previous)


@pytest.mark.server
def test_three_clients_on_two_stores_share_one_renewal_process(tmp_path, redis_url, renewal_processes):
    from fastlease import RedisClient

    clients = [SQLiteClient(tmp_path / "a.db"), SQLiteClient(tmp_path / "b.db"), RedisClient(redis_url)]
    guards = [SyncDistributedLock(client, table="locks", key=f"shared-{index}", lease_duration=LEASE_S)
              for index, client in enumerate(clients)]
    try:
        for guard in guards:
            guard.__enter__()
        pids = {_renewal_pid(client, renewal_processes) for client in clients}
        assert len(pids) == 1, pids
        wait_until(lambda: all(_renewals(guard) >= 2 for guard in guards), 5, "two renewals of each lease")
        assert [client.engine.link.renewing for client in clients] == [1, 1, 1]
        guards[0].__exit__(None, None, None)
        clients[0].close()  # one client leaves: the others renew on, in the same process
        _PAUSE.wait(0.8)
        assert all(guard.is_valid() for guard in guards[1:]) and clients[2].engine.link.pid == pids.pop()
    finally:
        for guard, client in zip(guards, clients):
            if guard.state == "held":
                guard.__exit__(None, None, None)
            client.close()


@pytest.mark.c_extension  # its last step holds the GIL 2.5 s: the pure-Python pulse stops meanwhile
def test_a_killed_renewal_process_is_replaced_and_takes_the_held_lease_back(tmp_path, caplog, renewal_processes):
    from fastlease import _renewal_link

    client = SQLiteClient(tmp_path / "locks.db")
    first = SyncDistributedLock(client, table="locks", key="survivor", lease_duration=LEASE_S)
    second = SyncDistributedLock(client, table="locks", key="next", lease_duration=LEASE_S)
    link = client.engine.link
    try:
        with caplog.at_level(logging.WARNING, logger="fastlease.renewal"):
            first.__enter__()
            old = _renewal_pid(client, renewal_processes)
            wait_until(lambda: _renewals(first) >= 1, 5, "a renewal from the renewal process")
            os.kill(old, signal.SIGKILL)  # the OOM killer
            # The holder notices at its next look, and renews the lease itself meanwhile.
            wait_until(lambda: link.renewing == 0, 5, "the holder to take its lease back")
            assert first.is_valid()
            in_process = _renewals(first)
            wait_until(lambda: _renewals(first) >= in_process + 2, 5, "two renewals in process")
            assert first.is_valid()
        warnings = [r.getMessage() for r in caplog.records if r.name == "fastlease.renewal"]
        assert len(warnings) == 1 and "a new renewal process starts at the next lease" in warnings[0], warnings
        hub = _renewal_link._hub()
        wait_until(lambda: time.monotonic() >= hub._restart_at, _renewal_link.RESTART_MAX_S,
                   "the restart delay to pass")
        second.__enter__()  # the next lease starts a new renewal process ...
        new = _renewal_pid(client, renewal_processes)
        assert new != old
        # ... and the held lease goes back to it from its own renewal step.
        wait_until(lambda: link.renewing == 2, 5, lambda: f"both leases delegated (renewing: {link.renewing})")
        before = _renewals(first)
        _hold_gil(2.5)  # renewed through a GIL-holding call again: it is the renewal process's once more
        assert first.is_valid() and second.is_valid()
        assert _renewals(first) >= before + 4
    finally:
        for guard in (first, second):
            if guard.state == "held":
                guard.__exit__(None, None, None)
        client.close()
    assert first.state == second.state == "released"


# ---- 9. registrations across renewal processes ---------------------------------------------------
class _StandInPulse:
    """Stands in for ``_core.Pulse`` in a hub driven by hand: ``register`` runs ``during_register`` (the
    renewal process ending meanwhile) before it returns the id; ``take_back`` is recorded."""

    def __init__(self, during_register: Callable[[], None] = lambda: None) -> None:
        self.leases: dict[int, Any] = {}
        self.taken_back: list[int] = []
        self.during_register = during_register
        self.child = 0

    def register(self, lease: Any, *fields: Any) -> int:
        frame_id = len(self.leases) + 1
        self.leases[frame_id] = lease
        self.during_register()
        return frame_id

    def take_back(self, frame_id: int) -> bool:
        self.taken_back.append(frame_id)
        self.leases.pop(frame_id, None)
        return True

    def close(self) -> None:
        pass


def _hub_running_on(client: Any, pulse: _StandInPulse) -> Any:
    """A hub of its own for ``client``'s link, as if a renewal process were running and ready on ``pulse``."""
    from fastlease import _renewal_link

    hub = _renewal_link._Hub()
    link = client.engine.link
    link._hub = hub
    hub._pulse, hub._leases, hub.fast_pulse = pulse, pulse.leases, pulse
    hub._state, hub._reaped, hub._renewer_pid = "running", True, 1
    hub._links[link.store_id] = link
    return hub


def test_a_registration_staged_while_the_renewal_process_ends_is_renewed_here(tmp_path):
    # The renewal process ends (its leases handed back) between the staging of a registration and the
    # engine taking its id: before, the lease kept the dead process's id, nobody renewed it, and it lapsed.
    client = SQLiteClient(tmp_path / "locks.db", _engine_module=_impl.load("py"))
    try:
        hub: Any = None

        def renewal_process_ends() -> None:
            with hub._lock:
                hub._end_locked()

        hub = _hub_running_on(client, _StandInPulse(renewal_process_ends))
        with SyncDistributedLock(client, table="locks", key="k", lease_duration=LEASE_S) as lease:
            assert lease._lease._link_id == 0  # renewed by this process's renewal thread
            wait_until(lambda: lease.metrics.renewals >= 2, 5.0, lambda: f"two renewals ({lease.metrics})")
            assert lease.is_valid()
    finally:
        client.close()


def test_a_release_leaves_alone_a_registration_id_that_now_names_another_lease(tmp_path):
    # Registration ids start at 1 in each renewal process: after a replacement, a stale id names
    # another lease's registration, which a release must neither take back nor stop.
    client = SQLiteClient(tmp_path / "locks.db", _engine_module=_impl.load("py"))
    try:
        pulse = _StandInPulse()
        hub = _hub_running_on(client, pulse)
        other = SyncDistributedLock(client, table="locks", key="other", lease_duration=LEASE_S)
        pulse.leases[1] = other._lease  # the next process's registration 1
        mine = SyncDistributedLock(client, table="locks", key="mine", lease_duration=LEASE_S)
        hub.stop(mine._lease, 1)
        assert pulse.taken_back == [] and pulse.leases == {1: other._lease}
        assert not client.engine.link.registered(mine._lease, 1) and client.engine.link.registered(other._lease, 1)
    finally:
        client.close()


def test_a_report_that_raises_does_not_lose_the_reports_after_it(tmp_path, caplog):
    import socket as socket_module

    from fastlease import _renewal_link

    class Failing:
        key = "a"

        def apply_renewal(self, *report: Any) -> None:
            raise RuntimeError("an observer's bug")

    class Recording:
        key = "b"
        losses: list[str] = []

        def apply_loss(self, cause: str, counters: Any) -> None:
            self.losses.append(cause)

    client = SQLiteClient(tmp_path / "locks.db")
    ours, theirs = socket_module.socketpair()
    try:
        pulse = _StandInPulse()
        hub = _hub_running_on(client, pulse)
        ours.setblocking(False)
        hub._sock = ours
        failing, recording = Failing(), Recording()
        pulse.leases.update({1: failing, 2: recording})
        theirs.sendall(_renewal_link.frame((_renewal_link.RENEWED, 1, "v2", 1, 1, (1, 0, 0, 0, 1)))
                       + _renewal_link.frame((_renewal_link.LOST, 2, "stolen", 0, 0, (1, 0, 1, 0, 0))))
        with caplog.at_level(logging.WARNING, logger="fastlease.renewal"):
            hub.sync()
        assert recording.losses == ["stolen"] and 2 not in pulse.leases  # applied after the failing one
        assert any("raised" in record.getMessage() for record in caplog.records)
    finally:
        hub._sock = None
        pulse.leases.clear()  # (stand-ins, not leases of the client)
        ours.close()
        theirs.close()
        client.close()


def test_a_renewal_process_of_another_protocol_refuses_and_renewals_stay_here(tmp_path, monkeypatch, caplog):
    # fastlease upgraded under a running holder: the next renewal process is the installed version's,
    # whose frames this holder would misread. It refuses at once; the holder renews its leases itself,
    # says so, and starts no other.
    from fastlease import _renewal_link

    monkeypatch.setattr(_renewal_link, "PROTOCOL", _renewal_link.PROTOCOL + 1000)  # the installed one differs
    monkeypatch.setattr(_renewal_link, "_the_hub", None)  # a hub of this test's own
    client = SQLiteClient(tmp_path / "locks.db")
    try:
        with caplog.at_level(logging.WARNING, logger="fastlease.renewal"):
            for key in ("first", "second"):
                with SyncDistributedLock(client, table="locks", key=key, lease_duration=LEASE_S) as lease:
                    wait_until(lambda: lease.metrics.renewals >= 2, 5.0, lambda: f"two renewals here ({lease.metrics})")
                    assert lease.is_valid() and client.engine.link.pid is None
        refusals = [r.getMessage() for r in caplog.records if "renewal protocol" in r.getMessage()]
        assert len(refusals) == 1, refusals
        assert f"protocol {_renewal_link.PROTOCOL - 1000}, not this process's ({_renewal_link.PROTOCOL})" in refusals[0]
        assert client.engine.link._hub._restart_at == float("inf")
    finally:
        client.close()
