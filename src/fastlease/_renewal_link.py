"""The holder's side of the renewal process: renewals that go on while this process's GIL is held.

A thread of this process cannot send a renewal while another thread holds the GIL in a long C call
(a regex, ``json.loads`` of a large document, pandas, compression): every renewal request needs the
GIL. So leases are renewed by a *renewal process* (``_renewal_process``): **one per holder process**,
whatever the number of clients and stores, started at the first lease that it can renew. Each client
has a ``RenewalLink`` (its store's settings, known to the renewal process by a store id); all of them
share the process's ``_Hub``, which owns the renewal process and everything joined to it:

* a pipe, written only by the native *pulse* thread (``_core.Pulse``), which never takes the GIL:
  every 100 ms a pulse, and before it the registrations of leases acquired since (they are staged in
  C, so an acquisition makes no system call). The renewal process renews only while pulses arrive:
  a holder stopped as a whole (SIGSTOP, a frozen Lambda) stops its renewals; one that died closes the
  pipe and the socket, and the renewal process exits;
* a socket pair: the holder sends each store's settings before the first registration on it, "stop"
  before it releases a lease, refreshed credentials, and "drop" when a client closes; the renewal
  process reports each confirmed renewal with the stamps taken before its write was sent, and each loss.

The holder keeps the one validity truth: ``Lease.apply_renewal`` extends validity from a confirmed
write's stamps, and only while the lease is held and the stamp lies within the validity it extends.
Reports are applied whenever the holder looks (``is_valid``, ``raise_if_lost``, its own renewal
thread's step every lease/3, a release), so after a long GIL-holding call the first check sees the
renewals made during it.

**A renewal process that dies** (``kill -9``, the OOM killer) is replaced. Its leases are renewed by
this process's renewal thread at once (a held GIL then stops them again); the WARNING says so, and
when a new renewal process will be started: at the next lease, after a back-off that doubles from 1 s
to 60 s while they keep dying. Once the new one is ready, each lease renewed here goes back to it from
its own renewal step, right after a renewal confirmed here, with that renewal's version and stamps, so
that no renewal of it is in flight in this process when the other takes over.

What stays in this process (see docs/architecture.md): leases shorter than 1 s, the memory store,
injected clocks, stores whose settings cannot be given to another process (each store's
``renewal_config`` says why, logged once at INFO), and a lease while no renewal process runs.
"""

from __future__ import annotations

import itertools
import marshal
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

from . import _impl
from ._logging import get_logger

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_log = get_logger("fastlease.renewal")

#: The pulse's interval; the renewal process renews only within PULSE_SILENCE_MS of the last pulse.
PULSE_INTERVAL_MS = 100
PULSE_SILENCE_MS = 400
#: How long a release waits for the renewal process to confirm it has stopped renewing a lease (on
#: top of the lease's own request bound, which an in-flight renewal may take); then it is stopped.
STOP_GRACE_S = 2.0
#: While a release waits for that answer, it reads the socket for this long at a time, under the hub's
#: lock, which other leases' checks take in between.
STOP_POLL_S = 0.02
#: After a renewal process dies, the next one starts at the next lease, this long after the death at
#: the earliest; the wait doubles with each death up to RESTART_MAX_S, and is back to the first once a
#: renewal process has run RESTART_MAX_S.
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 60.0

#: The frames between holder and renewal process, as this version writes and reads them: given to the
#: renewal process on its command line, which refuses to run with another. Bump it with any change to
#: them. (The renewal process is whatever ``python -m fastlease._renewal_process`` finds now: after an
#: upgrade in place, a long-running holder's next one is the new version's.)
PROTOCOL = 2
# Holder -> renewal process, on the socket: frames of u32 length + marshal((kind, ...)).
STOP, CREDENTIALS, STORE, DROP = 1, 2, 3, 4
# Renewal process -> holder: (kind, id, version or cause, mono_ns, wall_ns, counters). REFUSED (its
# reason in the third field) comes instead of READY from a renewal process of another protocol.
RENEWED, LOST, STOPPED, READY, REFUSED = 1, 2, 3, 4, 5
_LENGTH = struct.Struct("=I")


def _pulse_module() -> Any:
    """The compiled core (a native pulse), unless extensions are off, missing or stale: then the pure-Python
    pulse, which stops while the GIL is held, so that a held GIL loses the lease instead."""
    native = _impl.native_core()
    if native is not None:
        return native
    from . import _core_fallback

    return _core_fallback


def _runs_python_modules() -> bool:
    """Whether ``sys.executable -m module`` starts this Python: not in frozen applications or
    embedding programs (uWSGI's executable is uWSGI)."""
    if getattr(sys, "frozen", False) or not sys.executable or not os.access(sys.executable, os.X_OK):
        return False
    return os.path.basename(sys.executable).lower().startswith(("python", "pypy"))


def frame(message: Any) -> bytes:
    """One socket frame: the length, then the message (marshal: parent and child share one Python)."""
    body = marshal.dumps(message)
    return _LENGTH.pack(len(body)) + body


def split_frames(buffer: bytearray) -> list[Any]:
    """Take every complete frame off the front of ``buffer``."""
    messages = []
    at = 0
    while len(buffer) - at >= 4:
        (size,) = _LENGTH.unpack_from(buffer, at)
        if len(buffer) - at - 4 < size:
            break
        messages.append(marshal.loads(bytes(buffer[at + 4:at + 4 + size])))
        at += 4 + size
    del buffer[:at]
    return messages


class RenewalLink:
    """One client's part of the process's renewal process. Nothing starts until its first lease.

    ``config()`` returns the store's settings for the renewal process (a marshal-able tuple), or a
    reason string when they cannot be reproduced there; ``credentials()`` returns what the store
    signs with now (or None), re-sent when it changes; ``delegable()`` is checked at each lease (False
    while something in this process must see the requests, such as moto's ``mock_aws``).

    What the engine uses: ``register``, ``fast_pulse`` and ``store_id`` (the one-C-call registration),
    ``sync``, ``refresh``, ``stop``, ``takes_back`` and ``close``.
    """

    def __init__(self, config: Callable[[], Any], credentials: Callable[[], Any] = lambda: None,
                 delegable: Optional[Callable[[], bool]] = None) -> None:
        self._config = config
        self._credentials = credentials
        self._delegable = delegable
        self._hub = _hub()
        #: This client's store in the renewal process (written once, under the hub's lock).
        self.store_id = next(_store_ids)
        self._settings: Any = None  # (config, credentials) once read; a str: renewals stay here, for good
        self._closed = False

    # ---- the engine's calls ------------------------------------------------------------------------
    def register(self, lease: Any, mono_ns: int, wall_ns: int, hold_until_ns: int, renew_at_ns: int) -> int:
        """Hand a just-acquired lease to the renewal process, its first renewal due at ``renew_at_ns``: its
        registration id, or 0 when it renews here."""
        if self._delegable is not None and not self._delegable():
            return 0
        pulse = self._hub.pulse_for(self)
        if pulse is None:
            return 0
        return int(pulse.register(lease, lease.table, lease.key, lease.owner, lease.version, lease.lease_ms,
                                  lease.fencing_token, mono_ns, wall_ns, hold_until_ns, renew_at_ns, self.store_id))

    @property
    def fast_pulse(self) -> Any:
        """The pulse, once nothing else needs checking at a registration (the renewal process running
        and collected, this store known to it, no per-lease check such as DynamoDB's): the engine then
        registers through it directly, one C call per lease. None otherwise."""
        return self._hub.fast_pulse if self._delegable is None and self._hub.knows(self) else None

    def registered(self, lease: Any, link_id: int) -> bool:
        """Whether ``link_id`` is ``lease``'s registration with the running renewal process: False once
        that process has ended (its registrations were handed back), even if its id is reused since."""
        return self._hub.holds(lease, link_id)

    def takes_back(self) -> bool:
        """Whether a lease of this client renewed here may go (back) to the renewal process now: one is
        running and ready, and knows this store. The lease registers itself through ``fast_pulse``."""
        return self._hub.ready() and self.fast_pulse is not None

    def sync(self) -> None:
        """Apply every report waiting on the socket (non-blocking)."""
        self._hub.sync()

    def refresh(self) -> None:
        """Send the store's credentials again if they changed (a refreshed STS session)."""
        settings = self._settings
        if isinstance(settings, tuple):
            current = self._credentials()
            if current is not None and current != settings[1]:
                self._settings = (settings[0], current)
                self._hub.send((CREDENTIALS, self.store_id, current))

    def stop(self, lease: Any, link_id: int, wait: bool = True) -> None:
        """The renewal process stops renewing ``lease``; returns once it has, or at once unless ``wait``
        (see ``_Hub.stop``)."""
        self._hub.stop(lease, link_id, wait)

    def close(self) -> None:
        """The client closes: the renewal process stops renewing its leases, which lapse at their
        validity, like every lease of a closed client; with the last client, the process exits."""
        if not self._closed:
            self._closed = True
            self._hub.drop(self)

    # ---- the hub's calls ----------------------------------------------------------------------------
    def settings(self) -> Any:
        """(config, credentials) for the renewal process, or why there can be none (a str, logged once)."""
        if self._settings is None:
            config = self._config() if _runs_python_modules() else (
                f"this process's executable ({sys.executable!r}) cannot run a Python module (an embedded or frozen "
                "interpreter)")
            if isinstance(config, str):
                _log.info("renewals stay in this process (a held GIL stops them): %s", config)
                self._settings = config
            else:
                self._settings = (config, self._credentials())
        return self._settings

    # ---- for tests and benchmarks -----------------------------------------------------------------
    @property
    def pid(self) -> Optional[int]:
        """The renewal process's id, once it has reported ready and while it knows this client's store."""
        return self._hub.pid_for(self)

    @property
    def renewing(self) -> int:
        """Leases of this client that the renewal process renews now."""
        return self._hub.renewing(self)

    @property
    def ready_after_s(self) -> Optional[float]:
        """How long the current renewal process took to report ready (s), once it has."""
        return self._hub.ready_after_s

    @property
    def started_at(self) -> float:
        """When the current renewal process was started (monotonic s; 0.0 before the first)."""
        return self._hub.started_at


_store_ids = itertools.count(1)  # next() of a count is atomic: store ids are never reused in a process


class _Hub:
    """The process's renewal process, from the holder's side: started at the first lease that can use
    it, replaced (after a back-off) when it dies, stopped when the last client that used it closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the socket's reading side, the registry, the state below
        self._send_lock = threading.Lock()
        self._state = "idle"  # idle -> running -> gone (-> running again) ; idle again once every client left
        self._links: dict[int, RenewalLink] = {}  # store id -> the links the running process knows
        self._leases: dict[int, Any] = {}  # registration id -> lease: the pulse's own dict, once it exists
        self._buffer = bytearray()
        self._sock: Optional[socket.socket] = None
        self._pulse: Any = None
        #: The pulse, once nothing else needs checking at a registration (running, the starter collected).
        self.fast_pulse: Any = None
        self._renewer_pid = 0  # the renewal process's id, from its READY report
        self._reaped = False  # the process the pulse started, which forks the renewal process and exits
        self._pid = os.getpid()
        self._restart_after_s = RESTART_FIRST_S  # the back-off before the next restart, after a death
        self._restart_at = 0.0  # no renewal process starts before this (monotonic s)
        #: When the current renewal process was started (monotonic s), and how long it took to report ready.
        self.started_at = 0.0
        self.ready_after_s: Optional[float] = None

    # ---- registration ------------------------------------------------------------------------------
    def pulse_for(self, link: RenewalLink) -> Any:
        """The pulse to stage ``link``'s registration on (its store sent to the renewal process first,
        and the process started if needs be), or None: the lease renews in this process."""
        if self._state == "running" and link.store_id in self._links:
            if not self._reaped:
                self._reap_starter(wait_s=0.0)  # (until it is collected: a client may never sync or close)
            return self._pulse
        with self._lock:
            settings = link.settings()
            if isinstance(settings, str) or link._closed:
                return None
            if self._state != "running" and not self._start_locked():
                return None
            if link.store_id not in self._links:
                self._links[link.store_id] = link
                # Before the registration is staged: the renewal process reads the socket in order, and
                # parks a registration of a store it does not know yet until this arrives.
                if not self._send((STORE, link.store_id, settings[0], settings[1])):
                    del self._links[link.store_id]
                    return None
            return self._pulse

    def holds(self, lease: Any, link_id: int) -> bool:
        """Whether ``link_id`` is ``lease``'s registration with the running renewal process."""
        return bool(link_id) and self._leases.get(link_id) is lease

    def knows(self, link: RenewalLink) -> bool:
        return self.fast_pulse is not None and link.store_id in self._links

    def ready(self) -> bool:
        """A renewal process runs, has reported ready and has been collected: a hand-back is quick."""
        return self._state == "running" and self._renewer_pid != 0 and self.fast_pulse is not None

    def stop(self, lease: Any, link_id: int, wait: bool = True) -> None:
        """The renewal process stops renewing ``lease``. A registration not yet sent is simply taken back.
        Otherwise "stop" is sent, and with ``wait`` this returns once the renewal process has stopped (its
        last confirmed renewal applied), so that after a loss or at ``max_hold`` the row is not kept alive
        in the store by renewals the holder no longer counts; a renewal process that does not answer in
        time is killed. Without ``wait`` (a release) it returns at once, and the lease's later reports are
        ignored: a renewal sent after the release fails in the store, because every renewal is
        conditioned on this acquisition's own owner id and the release deletes the row of that owner (or,
        sent before it, it only changed the version, which the release does not look at). Waiting there
        would hold the release up for the renewal process's whole start-up at a process's first lease,
        while nothing renews the lease."""
        pulse = self._pulse
        # Registration ids start at 1 again in each renewal process: an id from an earlier one may name
        # another lease in this one, which must be left alone (this lease's ended with its process).
        if pulse is None or not self.holds(lease, link_id):
            return
        if pulse.take_back(link_id):  # never written: the renewal process never knew of it
            return
        if not self._send((STOP, link_id)) or not wait:
            with self._lock:
                self._read_locked(block_s=0.0)  # the reports already here count (the lease's metrics)
                if self.holds(lease, link_id):
                    del self._leases[link_id]
            return
        deadline = time.monotonic() + lease.request_timeout_s * 2 + STOP_GRACE_S
        while True:
            # The lock is taken for each read, not across the wait: other leases' checks read their
            # reports meanwhile (a renewal process still starting answers only once it runs).
            with self._lock:
                if not self.holds(lease, link_id) or self._state != "running":
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    _log.warning("the renewal process did not stop renewing %r in time: stopping it", lease.key)
                    self._kill_locked()
                    break
                self._read_locked(block_s=min(left, STOP_POLL_S))
        with self._lock:
            if self.holds(lease, link_id):
                del self._leases[link_id]

    def drop(self, link: RenewalLink) -> None:
        """``link``'s client closed: its leases stop renewing there (they lapse), and once no client is
        left the renewal process is stopped (it sees the socket close and exits)."""
        with self._lock:
            known = self._links.pop(link.store_id, None) is not None
            leases = [(link_id, lease) for link_id, lease in self._leases.items() if lease.renewal_link is link]
            for link_id, _ in leases:
                del self._leases[link_id]
            last = not self._links
        for _, lease in leases:
            lease.delegation_ended()
        if known and not last:
            self._send((DROP, link.store_id))
        if last and self._state == "running":
            self._shut_down(wait_reap_s=1.0)

    # ---- reports -----------------------------------------------------------------------------------
    def sync(self) -> None:
        with self._lock:
            self._read_locked(block_s=0.0)

    def _read_locked(self, block_s: float) -> None:
        sock = self._sock
        if self._state != "running" or sock is None:
            return
        if not self._reaped:
            child = self._pulse.child
            if child < 0:
                self._gone_locked(f"could not start the renewal process ({os.strerror(-child)})")
                return
            self._reap_starter(wait_s=0.0)
        if block_s > 0:
            select.select([sock], [], [], block_s)
        ended = False
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                ended = True  # (the reports before the end are applied first: they may be its last)
                break
            self._buffer += data
            if len(data) < 65536:
                break
        refused = None
        for kind, link_id, detail, mono_ns, wall_ns, counters in split_frames(self._buffer):
            if kind == READY:
                self._renewer_pid = mono_ns
                self.ready_after_s = time.monotonic() - self.started_at
                continue
            if kind == REFUSED:
                refused = str(detail)
                continue
            lease = self._leases.get(link_id)
            if lease is None:
                continue
            if kind in (LOST, STOPPED):
                del self._leases[link_id]
            try:
                if kind == LOST:
                    lease.apply_loss(detail, counters)
                else:
                    lease.apply_renewal(detail, mono_ns, wall_ns, counters)
            except Exception:  # noqa: BLE001 - an observer's error: the reports after it still count
                _log.warning("applying a renewal report to %r raised", lease.key, exc_info=True)
        if refused is not None and self._state == "running":
            # Never again in this process: every renewal process started from now on is the same.
            _log.warning("%s: the leases of this process are renewed in it, where a GIL-holding call stops "
                         "their renewals; restart the process to have a renewal process again", refused)
            self._restart_at = float("inf")
            self._end_locked()
        elif ended:
            self._gone_locked("the renewal process exited")

    # ---- lifecycle -----------------------------------------------------------------------------------
    def _start_locked(self) -> bool:
        """Make the pipe, the socket pair and the pulse; the pulse thread spawns the process, so that
        no acquisition waits for it. False while a restart is held back, or when no pulse can run."""
        if time.monotonic() < self._restart_at:
            return False
        core = _pulse_module()
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        pulse_read, pulse_write = os.pipe()
        given = theirs.detach()
        for fd in (given, pulse_read):
            os.set_inheritable(fd, True)  # for the renewal process only: the pulse closes them once it has
        argv = [os.path.abspath(sys.executable), "-m", "fastlease._renewal_process", str(given), str(pulse_read),
                str(PROTOCOL)]
        try:
            # The pulse thread starts the process itself: it needs no GIL, so the start is not held up
            # by a thread that goes straight from its first acquisition into a long C call.
            pulse = core.Pulse(pulse_write, PULSE_INTERVAL_MS, argv, (given, pulse_read))
        except OSError as error:
            for fd in (pulse_read, given):
                os.close(fd)
            ours.close()
            _log.info("renewals stay in this process: no pulse thread (%s)", error)
            self._restart_at = float("inf")
            return False
        finally:
            os.close(pulse_write)  # the pulse writes to its own duplicate
        self._sock, self._pulse, self._leases = ours, pulse, pulse.leases  # registered by the pulse, in C
        self._buffer.clear()
        self._renewer_pid, self._reaped, self.fast_pulse, self.ready_after_s = 0, False, None, None
        self._links.clear()
        self._state = "running"
        self.started_at = time.monotonic()
        return True

    def _gone_locked(self, why: str) -> None:
        """The renewal process has ended: every lease it renewed is renewed here again, from the last
        version it reported (a renewal it made but did not report makes the next one fail: lost), and
        a new one starts at the next lease after the back-off."""
        if self._state != "running":
            return
        ran_s = time.monotonic() - self.started_at
        self._restart_after_s = RESTART_FIRST_S if ran_s >= RESTART_MAX_S else self._restart_after_s
        self._restart_at = time.monotonic() + self._restart_after_s
        _log.warning("%s: its leases are renewed in this process now, where a GIL-holding call stops their "
                     "renewals; a new renewal process starts at the next lease, in %g s at the earliest, and "
                     "takes them back", why, self._restart_after_s)
        self._restart_after_s = min(self._restart_after_s * 2, RESTART_MAX_S)
        self._end_locked()

    def _end_locked(self) -> None:
        self._state = "gone"
        self.fast_pulse = None
        leases = list(self._leases.values())
        self._leases.clear()
        self._links.clear()
        for lease in leases:
            lease.delegation_ended()
        self._reap_starter(wait_s=0.5)
        self._close_socket()
        if self._pulse is not None:
            self._pulse.close()

    def _shut_down(self, wait_reap_s: float) -> None:
        """The last client closed: the renewal process exits (it sees the socket close)."""
        with self._lock:
            if self._state == "running":
                self._end_locked()
                self._state = "idle"

    def _kill_locked(self) -> None:
        if self._renewer_pid:
            try:
                os.kill(self._renewer_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._gone_locked("the renewal process was stopped")

    def _reap_starter(self, wait_s: float) -> None:
        """Collect the exit status of the process the pulse started. It forks the renewal process and
        exits at once, so the renewal process is not our child: it never becomes a zombie of ours,
        and ``os.wait()`` in the application never returns it. Waits at most ``wait_s`` (the pulse
        thread may not have started it yet)."""
        pulse = self._pulse
        if self._reaped or pulse is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            child = pulse.child
            if child < 0:
                self._reaped = True
                return
            if child > 0:
                try:
                    done, _ = os.waitpid(child, os.WNOHANG)
                except ChildProcessError:
                    done = child
                if done:
                    self._reaped = True
                    if self._state == "running" and pulse is self._pulse:
                        self.fast_pulse = pulse
                    return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.002)

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def send(self, message: object) -> bool:
        return self._send(message)

    def _send(self, message: object) -> bool:
        sock = self._sock
        if sock is None or self._state != "running":
            return False
        view = memoryview(frame(message))
        with self._send_lock:  # the socket stays non-blocking: another thread may be reading it
            deadline = time.monotonic() + STOP_GRACE_S
            while view:
                try:
                    view = view[sock.send(view):]
                except (BlockingIOError, InterruptedError):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    select.select([], [sock], [], left)
                except OSError:
                    return False
        return True

    # ---- for tests --------------------------------------------------------------------------------
    def pid_for(self, link: RenewalLink) -> Optional[int]:
        self.sync()
        return (self._renewer_pid or None) if link.store_id in self._links else None

    def renewing(self, link: RenewalLink) -> int:
        with self._lock:
            return sum(1 for lease in self._leases.values() if lease.renewal_link is link)

    def _forget_in_child(self) -> None:
        """A forked child: the renewal process belongs to the parent. Close our copies of its socket
        and pulse pipe (so that it sees EOF when the parent exits) and never touch them again."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if self._pulse is not None:
            self._pulse.forget_in_child()
        self.fast_pulse = None
        self._state = "gone"
        self._restart_at = float("inf")  # a child's own leases renew in it (clients there are its own)
        self._leases = {}  # (the pulse's own dict is never touched in a child)
        self._links = {}


_the_hub: Optional[_Hub] = None
_hub_lock = threading.Lock()


def _hub() -> _Hub:
    """The process's one hub (a forked child gets a new one at its first client)."""
    global _the_hub
    hub = _the_hub
    if hub is None or hub._pid != os.getpid():
        with _hub_lock:
            if _the_hub is None or _the_hub._pid != os.getpid():
                _the_hub = _Hub()
            hub = _the_hub
    return hub


def _forget_hub_in_child() -> None:
    global _the_hub
    if _the_hub is not None:
        _the_hub._forget_in_child()
        _the_hub = None  # the child's clients, if it makes any, get a hub of their own


os.register_at_fork(after_in_child=_forget_hub_in_child)
