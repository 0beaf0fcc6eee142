"""The holder's side of the renewal process: renewals that go on while this process's GIL is held.

A thread of this process cannot send a renewal while another thread holds the GIL in a long C call
(a regex, ``json.loads`` of a large document, pandas, compression): every renewal request needs the
GIL. So the leases of a client are renewed by a *renewal process* (``_renewal_process``), one per
client, started at the client's first lease that it can renew. The two are joined by:

* a pipe, written only by the native *pulse* thread (``_core.Pulse``), which never takes the GIL:
  every 100 ms a pulse, and before it the registrations of leases acquired since (they are staged in
  C, so an acquisition makes no system call). The renewal process renews only while pulses arrive:
  a holder stopped as a whole (SIGSTOP, a frozen Lambda) stops its renewals; one that died closes the
  pipe and the socket, and the renewal process exits;
* a socket pair: the renewal process reports each confirmed renewal with the stamps taken before its
  write was sent, and each loss; the holder sends "stop" before it releases, and refreshed
  credentials.

The holder keeps the one validity truth: ``Lease.apply_renewal`` extends validity from a confirmed
write's stamps, and only while the lease is held and the stamp lies within the validity it extends.
Reports are applied whenever the holder looks (``is_valid``, ``raise_if_lost``, its own renewal
thread's step every lease/3, a release), so after a long GIL-holding call the first check sees the
renewals made during it.

What stays in this process (see docs/architecture.md): leases shorter than 1 s, the memory store,
injected clocks, stores whose settings cannot be given to another process (each store's
``renewal_config`` says why, logged once at INFO), and every lease once the renewal process has gone.
"""

from __future__ import annotations

import marshal
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import weakref

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

# Holder -> renewal process, on the socket: frames of u32 length + marshal((kind, ...)).
STOP, CREDENTIALS = 1, 2
# Renewal process -> holder: (kind, id, version or cause, mono_ns, wall_ns, counters).
RENEWED, LOST, STOPPED, READY = 1, 2, 3, 4
_LENGTH = struct.Struct("=I")


def _pulse_module() -> Any:
    """The compiled core (a native pulse), unless extensions are off or missing: then the pure-Python
    pulse, which stops while the GIL is held, so that a held GIL loses the lease instead."""
    if not os.environ.get("FASTLEASE_NO_EXTENSIONS"):
        try:
            from . import _core

            return _core
        except ImportError:
            pass
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
    """One client's renewal process, from the holder's side. Nothing starts until the first lease.

    ``config()`` returns the store's settings for the renewal process (a marshal-able tuple), or a
    reason string when they cannot be reproduced there; ``credentials()`` returns what the store
    signs with now (or None), re-sent when it changes; ``delegable()`` is checked at each lease (False
    while something in this process must see the requests, such as moto's ``mock_aws``).
    """

    def __init__(self, config: Callable[[], Any], credentials: Callable[[], Any] = lambda: None,
                 delegable: Optional[Callable[[], bool]] = None) -> None:
        self._config = config
        self._credentials = credentials
        self._delegable = delegable
        self._lock = threading.Lock()  # the socket's reading side, the registry, the state below
        self._send_lock = threading.Lock()
        self._state = "new"  # new -> running -> gone (also: unavailable, never started)
        self._leases: dict[int, Any] = {}  # registration id -> lease: the pulse's, once it exists
        self._buffer = bytearray()
        self._sent_credentials: Any = None
        self._sock: Optional[socket.socket] = None
        self._pulse: Any = None
        #: The pulse, once nothing else needs checking at a registration (running, the starter
        #: collected, no per-lease check such as DynamoDB's): the engine then registers through it
        #: directly, one C call per lease. None otherwise.
        self.fast_pulse: Any = None
        self._renewer_pid = 0  # the renewal process's id, from its READY report
        self._reaped = False  # the process the pulse started, which forks the renewal process and exits
        self._pid = os.getpid()
        _links.add(self)
        #: When the renewal process was started (monotonic s), and how long it took to report ready.
        self.started_at = 0.0
        self.ready_after_s: Optional[float] = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def _start_locked(self) -> bool:
        """Make the pipe, the socket pair and the pulse; spawn the process from a thread, so that no
        acquisition waits for it. False (for good) when the renewal process cannot be used."""
        config = self._config() if _runs_python_modules() else (
            f"this process's executable ({sys.executable!r}) cannot run a Python module (an embedded or frozen "
            "interpreter)")
        if isinstance(config, str):
            _log.info("renewals stay in this process (a held GIL stops them): %s", config)
            self._state = "unavailable"
            return False
        core = _pulse_module()
        ours, theirs = socket.socketpair()
        self._sent_credentials = self._credentials()
        ours.sendall(frame((config, self._sent_credentials)))  # waits in the socket for the process
        ours.setblocking(False)
        pulse_read, pulse_write = os.pipe()
        given = theirs.detach()
        for fd in (given, pulse_read):
            os.set_inheritable(fd, True)  # for the renewal process only: the pulse closes them once it has
        argv = [os.path.abspath(sys.executable), "-m", "fastlease._renewal_process", str(given), str(pulse_read)]
        try:
            # The pulse thread starts the process itself: it needs no GIL, so the start is not held up
            # by a thread that goes straight from its first acquisition into a long C call.
            self._pulse = core.Pulse(pulse_write, PULSE_INTERVAL_MS, argv, (given, pulse_read))
        except OSError as error:
            for fd in (pulse_read, given):
                os.close(fd)
            ours.close()
            _log.info("renewals stay in this process: no pulse thread (%s)", error)
            self._state = "unavailable"
            return False
        finally:
            os.close(pulse_write)  # the pulse writes to its own duplicate
        self._sock = ours
        self._leases = self._pulse.leases  # registered by the pulse's register(), in C
        self._state = "running"
        self.started_at = time.monotonic()
        return True

    def close(self) -> None:
        """The client closes: the renewal process exits (it sees the socket close), and the leases it
        renewed lapse at their validity, like every lease of a closed client."""
        with self._lock:
            self._state = "gone" if self._state == "running" else self._state
            self.fast_pulse = None
            leases = list(self._leases.values())
            self._leases.clear()
        for lease in leases:
            lease.delegation_ended()
        self._close_socket()
        self._reap_starter(wait_s=1.0)
        if self._pulse is not None:
            self._pulse.close()

    def _reap_starter(self, wait_s: float) -> None:
        """Collect the exit status of the process the pulse started. It forks the renewal process and
        exits at once, so the renewal process is not our child: it never becomes a zombie of ours,
        and ``os.wait()`` in the application never returns it. Waits at most ``wait_s`` (the pulse
        thread may not have started it yet)."""
        if self._reaped or self._pulse is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            child = self._pulse.child
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
                    if self._state == "running" and self._delegable is None:
                        self.fast_pulse = self._pulse
                    return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.002)

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    # ---- the holder's calls (from the engine) --------------------------------------------------
    def register(self, lease: Any, mono_ns: int, wall_ns: int, hold_until_ns: int) -> int:
        """Hand a just-acquired lease to the renewal process: its id, or 0 when it renews here.

        On every hold's path, so it takes no lock once running: ``next`` of a counter and single dict
        operations are atomic. The registration is staged in C, written with the next pulse.
        """
        if self._state != "running":
            with self._lock:
                if self._state != "new" or not self._start_locked():
                    return 0
        if not self._reaped:
            self._reap_starter(wait_s=0.0)  # (until it is collected: a client may never sync or close)
        if self._delegable is not None and not self._delegable():
            return 0
        return int(self._pulse.register(lease, lease.table, lease.key, lease.owner, lease.version, lease.lease_ms,
                                        lease.fencing_token, mono_ns, wall_ns, hold_until_ns))

    def sync(self) -> None:
        """Apply every report waiting on the socket (non-blocking)."""
        with self._lock:
            self._read_locked(block_s=0.0)

    def refresh(self) -> None:
        """Send the store's credentials again if they changed (a refreshed STS session)."""
        current = self._credentials()
        if current is not None and current != self._sent_credentials:
            self._sent_credentials = current
            self._send((CREDENTIALS, current))

    def stop(self, lease: Any, link_id: int) -> None:
        """The renewal process stops renewing ``lease``; returns once it has (its last confirmed renewal
        applied), so the holder's release is never followed by a renewal. A registration not yet sent
        is simply taken back. A renewal process that does not answer in time is killed."""
        if self._pulse.take_back(link_id):  # never written: the renewal process never knew of it
            return
        if not self._send((STOP, link_id)):
            return
        deadline = time.monotonic() + lease.request_timeout_s * 2 + STOP_GRACE_S
        with self._lock:
            while link_id in self._leases and self._state == "running":
                left = deadline - time.monotonic()
                if left <= 0:
                    _log.warning("the renewal process did not stop renewing %r in time: stopping it", lease.key)
                    self._kill_locked()
                    break
                self._read_locked(block_s=left)
            self._leases.pop(link_id, None)

    # ---- internals ---------------------------------------------------------------------------
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
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                self._gone_locked("the renewal process exited")
                return
            self._buffer += data
            if len(data) < 65536:
                break
        for kind, link_id, detail, mono_ns, wall_ns, counters in split_frames(self._buffer):
            if kind == READY:
                self._renewer_pid = mono_ns
                self.ready_after_s = time.monotonic() - self.started_at
                continue
            lease = self._leases.get(link_id)
            if lease is None:
                continue
            if kind == RENEWED:
                lease.apply_renewal(detail, mono_ns, wall_ns, counters)
            elif kind == LOST:
                del self._leases[link_id]
                lease.apply_loss(detail, counters)
            elif kind == STOPPED:
                del self._leases[link_id]
                lease.apply_renewal(detail, mono_ns, wall_ns, counters)

    def _gone_locked(self, why: str) -> None:
        """The renewal process has ended: every lease it renewed is renewed here again (from the last
        version it reported; a renewal it made but did not report makes the next one fail: lost)."""
        if self._state == "running":
            _log.warning("%s: renewals continue in this process", why)
        self._state = "gone"
        self.fast_pulse = None
        leases = list(self._leases.values())
        self._leases.clear()
        for lease in leases:
            lease.delegation_ended()
        self._reap_starter(wait_s=0.5)
        if self._pulse is not None:
            self._pulse.close()
        self._close_socket()

    def _kill_locked(self) -> None:
        if self._renewer_pid:
            try:
                os.kill(self._renewer_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._gone_locked("the renewal process was stopped")

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
        self._leases = {}  # (the pulse's own dict is never touched in a child)

    @property
    def pid(self) -> Optional[int]:
        """The renewal process's id, once it has reported ready."""
        self.sync()
        return self._renewer_pid or None

    @property
    def renewing(self) -> int:
        """Leases the renewal process renews now."""
        with self._lock:
            return len(self._leases)


_links: "weakref.WeakSet[RenewalLink]" = weakref.WeakSet()


def _forget_links_in_child() -> None:
    for link in list(_links):
        link._forget_in_child()


os.register_at_fork(after_in_child=_forget_links_in_child)
