"""The renewal process: renews a holder process's leases while the holder's own threads may be stuck.

Started by ``_renewal_link`` (one per holder process) as ``python -m fastlease._renewal_process SOCKET
PIPE PROTOCOL`` (it refuses to run for a holder of another ``PROTOCOL``); it runs the same engine
(``Lease.adopt`` takes over the holder's confirmed acquisition, and the engine's renewal scheduler and
steps renew it, with reconciliation of unknown outcomes), on each store the holder's clients described
(a STORE message each, built when it arrives, so that only the modules of stores in use are imported).
It adds three rules of its own:

* it sends a request only within ``PULSE_SILENCE_MS`` of the holder's last pulse (``GatedStore``),
  dated no later than it was written (``Pulses``): a holder stopped as a whole renews nothing, so a
  contender takes over after the lease;
* it reports every confirmed renewal (version, the stamps taken before its write, counters) and
  every loss; the holder extends its own validity from those reports only;
* "stop" makes a lease stop renewing, and is answered once no renewal write of it is in flight.

It exits when the holder closes the socket or the pipe (the client closed, or the holder died).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import types

from . import _impl
from ._core_fallback import REGISTRATION_NUMBERS  # (what _core.Pulse.register writes)
from ._renewal_link import (
    CREDENTIALS,
    DROP,
    LOST,
    PROTOCOL,
    PULSE_INTERVAL_MS,
    PULSE_SILENCE_MS,
    READY,
    REFUSED,
    RENEWED,
    STOP,
    STOPPED,
    STORE,
    frame,
    split_frames,
)
from .exceptions import StoreError
from .stores.registry import store_class

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Any, Optional

_log = logging.getLogger("fastlease.renewal")
_PIPE_HEAD = struct.Struct("=IQ")
#: A monotonic time before any this process can see: a date that proves nothing.
NEVER_NS = -(1 << 62)
_TEXT_LENGTH = struct.Struct("=H")


class Pulses:
    """When the holder's last pulse was written, at the latest that can be proved (monotonic ns).

    A pulse is not dated when it is read: if this process's loop was held up (a store being built, a
    starved CPU) while the holder was being stopped, the pipe would hand over a backlog of old pulses
    at once, and a stopped holder would look alive for another PULSE_SILENCE_MS. Instead, ``arrived``
    takes the pulses of one read and the time of the read before it, which emptied the pipe: they were
    all written after that read began, and the pulse thread writes at most one per PULSE_INTERVAL_MS, so
    the last of ``count`` was written at least ``(count - 1) * PULSE_INTERVAL_MS`` after it. In steady
    state that dates a pulse one interval early, which the 400 ms of silence allowed absorb.

    Nothing is dated before the first read that empties the pipe: what the first read brings was written
    at any time since the holder started this process, which may have died meanwhile (a process started
    late on a busy host, reading the pulses and the registration of a holder killed since)."""

    def __init__(self) -> None:
        self.last_ns = NEVER_NS
        self.ended = False

    def arrived(self, count: int, since_ns: int) -> None:
        """``count`` pulses came in one read; the read before it began at ``since_ns``."""
        if count > 0:
            self.last_ns = max(self.last_ns, since_ns + (count - 1) * PULSE_INTERVAL_MS * 1_000_000)

    def fresh(self) -> bool:
        return not self.ended and time.monotonic_ns() - self.last_ns < PULSE_SILENCE_MS * 1_000_000

    def end(self) -> None:
        """The holder closed its end (it died, or its last client closed): nothing more is renewed for
        it, not even within the silence allowed, while this process shuts down."""
        self.ended = True


class GatedStore:
    """The store, for the two requests renewal makes, refused while the holder sends no pulse.

    ``paused`` holds the (table, key) of leases whose last request was refused so: if such a lease
    lapses, its holder was stopped (SIGSTOP, a frozen Lambda), not cut off from the store, and the
    loss is reported ``expired`` (the failure model's cause for a paused holder), not ``unreachable``.
    """

    def __init__(self, store: Any, pulses: Pulses) -> None:
        self.store = store
        self._pulses = pulses
        self.paused: set[tuple[str, str]] = set()  # written by the renewal workers, read by _lost

    def _check(self, table: str, key: str) -> None:
        if not self._pulses.fresh():
            self.paused.add((table, key))
            why = ("the holder closed its pipe (it died, or its last client closed)" if self._pulses.ended else
                   f"no pulse from the holder proved within {PULSE_SILENCE_MS} ms (stopped, frozen, or not yet "
                   "heard from since this process started)")
            raise StoreError(f"{why}: not renewing", maybe_committed=False)
        self.paused.discard((table, key))

    def read(self, table: str, key: str, timeout_s: float, usage: Any) -> Any:
        self._check(table, key)
        return self.store.read(table, key, timeout_s, usage)

    def update_version_if(self, table: str, key: str, owner: str, version: str, new_version: str,
                          timeout_s: float, usage: Any, lease_ms: int = 0) -> bool:
        self._check(table, key)
        return bool(self.store.update_version_if(table, key, owner, version, new_version, timeout_s, usage, lease_ms))


def build_store(config: Any, credentials: Any) -> Any:
    """The store a holder described with its ``renewal_config()``."""
    return store_class(config[0]).from_renewal_config(config, credentials)


class _Store:
    """One holder client's store, as this process renews on it: the store rebuilt from its settings,
    behind the pulse gate, and an engine of its own (its scheduler and workers)."""

    def __init__(self, config: Any, credentials: Any, pulses: Pulses, renewed: Any, core: Any) -> None:
        self.store = build_store(config, credentials)
        self.gate = GatedStore(self.store, pulses)
        self.engine = core.Engine(self.gate, None, core.ObservationCache(16))
        self.engine.renewal_listener = renewed
        self.client = types.SimpleNamespace(engine=self.engine)

    def close(self) -> None:
        self.engine.close()
        close = getattr(self.store, "close", None)
        if close is not None:
            close()


class RenewalProcess:
    """The holder's stores (added by STORE, removed by DROP), their adopted leases, and the reports."""

    def __init__(self, sock: socket.socket, pipe: int) -> None:
        self._sock = sock
        self._pipe = pipe
        self._pulses = Pulses()
        self._pipe_read_ns = NEVER_NS  # when the last read of the pipe that emptied it began (none yet)
        self._buffer = bytearray()
        self._pipe_buffer = bytearray()
        self._core = _impl.core
        self._stores: dict[int, _Store] = {}  # store id -> the store, as the holder's STORE gave it
        # Registrations of a store whose STORE has not been read yet (the pipe was read first): adopted
        # once it is, with the stamps of the acquisition, so the wait can only cost validity.
        self._parked: dict[int, list[tuple[int, bytes]]] = {}
        self._leases: dict[int, Any] = {}  # registration id -> the lease renewed here
        self._ids: dict[int, int] = {}  # id() of such a lease -> its registration id
        self._store_of: dict[int, int] = {}  # registration id -> its store id
        self._outbox: dict[int, tuple[Any, ...]] = {}  # the latest report per lease: newer ones replace it
        self._outbox_ready = threading.Condition()
        self._closing = False
        threading.Thread(target=self._send_reports, name="fastlease-renewal-reports", daemon=True).start()
        self._report(0, (READY, 0, "", os.getpid(), 0, (0, 0, 0, 0, 0)))

    # ---- reports to the holder -----------------------------------------------------------------
    def _report(self, link_id: int, message: tuple[Any, ...]) -> None:
        with self._outbox_ready:
            self._outbox[link_id] = message
            self._outbox_ready.notify()

    def _renewed(self, lease: Any) -> None:
        link_id = self._ids.get(id(lease))
        if link_id is None:
            return
        version, mono_ns, wall_ns, counters = lease.renewal_state()
        self._report(link_id, (RENEWED, link_id, version, mono_ns, wall_ns, counters))

    def _forget(self, link_id: int) -> Any:
        lease = self._leases.pop(link_id, None)
        self._store_of.pop(link_id, None)
        if lease is not None:
            self._ids.pop(id(lease), None)
        return lease

    def _lost(self, link_id: int, cause: str) -> None:
        store = self._stores.get(self._store_of.get(link_id, 0))
        lease = self._forget(link_id)
        if lease is None:
            return
        if cause == "unreachable" and store is not None and (lease.table, lease.key) in store.gate.paused:
            cause = "expired"  # its renewals were held back because the holder was stopped
        _, _, _, counters = lease.renewal_state()
        self._report(link_id, (LOST, link_id, cause, 0, 0, counters))

    def _send_reports(self) -> None:
        while True:
            with self._outbox_ready:
                while not self._outbox and not self._closing:
                    self._outbox_ready.wait()
                closing = self._closing
                reports, self._outbox = list(self._outbox.values()), {}
            try:
                if reports:  # (what is queued when closing is sent too: a last LOST or STOPPED)
                    self._sock.sendall(b"".join(frame(report) for report in reports))
            except OSError:
                return
            if closing:
                return

    # ---- requests from the holder ----------------------------------------------------------------
    def _adopt(self, link_id: int, payload: bytes) -> None:
        numbers = REGISTRATION_NUMBERS.unpack_from(payload)
        lease_ms, fence, mono_ns, wall_ns, hold_until_ns, renew_at_ns, store_id = numbers
        store = self._stores.get(store_id)
        if store is None:
            self._parked.setdefault(store_id, []).append((link_id, payload))
            return
        at, texts = REGISTRATION_NUMBERS.size, []
        for _ in range(4):  # table, key, owner, version: u16 length + UTF-8
            (size,) = _TEXT_LENGTH.unpack_from(payload, at)
            texts.append(payload[at + 2:at + 2 + size].decode())
            at += 2 + size
        table, key, owner, version = texts
        fence = None if fence < 0 else fence
        lease = self._core.Lease(store.client, table, key, lease_ms, 0, 0,
                                 lambda lost: self._lost(link_id, str(lost.cause)))
        self._leases[link_id] = lease
        self._ids[id(lease)] = link_id
        self._store_of[link_id] = store_id
        if not lease.adopt(owner, version, fence, mono_ns, wall_ns, hold_until_ns, renew_at_ns):
            self._forget(link_id)
            self._report(link_id, (LOST, link_id, "expired", 0, 0, (0, 0, 0, 0, 0)))

    def _add_store(self, store_id: int, config: Any, credentials: Any) -> None:
        self._stores[store_id] = _Store(config, credentials, self._pulses, self._renewed, self._core)
        for link_id, payload in self._parked.pop(store_id, []):
            self._adopt(link_id, payload)

    def _drop_store(self, store_id: int) -> None:
        """The holder's client closed: its leases stop renewing here (they lapse in the holder), unreported."""
        # (A copy: renewal workers remove leases they lose from this dict meanwhile.)
        for link_id in [link_id for link_id, owner in self._store_of.copy().items() if owner == store_id]:
            lease = self._forget(link_id)
            if lease is not None:
                lease.stop_renewing()
        self._parked.pop(store_id, None)
        store = self._stores.pop(store_id, None)
        if store is not None:
            store.close()

    def _stop(self, link_id: int) -> None:
        for parked in self._parked.values():  # not adopted yet: nothing to stop, only to answer
            for entry in parked:
                if entry[0] == link_id:
                    parked.remove(entry)
                    self._report(link_id, (STOPPED, link_id, "", 0, 0, (0, 0, 0, 0, 0)))
                    return
        lease = self._forget(link_id)
        if lease is None:  # lost meanwhile: its LOST report answers the holder
            return

        def stop() -> None:
            lease.stop_renewing()
            version, mono_ns, wall_ns, counters = lease.renewal_state()
            self._report(link_id, (STOPPED, link_id, version, mono_ns, wall_ns, counters))

        if lease._renewing:  # a write is in flight: wait for it off the main loop
            threading.Thread(target=stop, daemon=True).start()
        else:
            stop()

    def _on_socket(self) -> bool:
        data = self._sock.recv(65536)
        if not data:
            return False
        self._buffer += data
        self._handle(split_frames(self._buffer))
        return True

    def _handle(self, messages: list[Any]) -> None:
        for message in messages:
            kind = message[0]
            if kind == STORE:
                self._add_store(message[1], message[2], message[3])
            elif kind == STOP:
                self._read_pipe()  # the registration it answers may still wait in the pipe
                self._stop(message[1])
            elif kind == CREDENTIALS:
                store = self._stores.get(message[1])
                if store is not None:
                    store.store.update_credentials(message[2])
            elif kind == DROP:
                self._read_pipe()
                self._drop_store(message[1])

    def _read_pipe(self) -> bool:
        reading_ns = time.monotonic_ns()  # (before the read: every pulse it misses is written after it)
        try:
            data = os.read(self._pipe, 65536)
        except BlockingIOError:
            self._pipe_read_ns = reading_ns
            return True
        if not data:
            return False
        self._pipe_buffer += data
        at, buffer, pulses = 0, self._pipe_buffer, 0
        while len(buffer) - at >= 4:
            size, link_id = _PIPE_HEAD.unpack_from(buffer, at)
            if len(buffer) - at - 4 < size:
                break
            if link_id == 0:
                pulses += 1
            else:
                self._adopt(link_id, bytes(buffer[at + 12:at + 4 + size]))
            at += 4 + size
        del buffer[:at]
        self._pulses.arrived(pulses, self._pipe_read_ns)
        if len(data) < 65536:  # the pipe is empty now: later pulses are written after this read began
            self._pipe_read_ns = reading_ns
        return True

    def run(self) -> None:
        os.set_blocking(self._pipe, False)
        try:
            while True:
                ready, _, _ = select.select([self._sock.fileno(), self._pipe], [], [], 1.0)
                if self._pipe in ready and not self._read_pipe():
                    return
                if self._sock.fileno() in ready and not self._on_socket():
                    return
        finally:
            # First: a renewal due while the stores close must not go out for a holder known gone.
            self._pulses.end()
            with self._outbox_ready:
                self._closing = True
                self._outbox_ready.notify()
            for store in list(self._stores.values()):
                store.engine.close()


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # Fork once and let the first process exit: the holder collects it at once, and this process is
    # then nobody's child there (no zombie for it to collect, nothing for its os.wait() to return).
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the holder, which then releases
    logging.basicConfig(level=logging.WARNING, format="fastlease renewal process: %(message)s")
    # A loss is the holder's to log (when it applies the report), not a second time here.
    logging.getLogger("fastlease.engine").setLevel(logging.ERROR)
    sock = socket.socket(fileno=int(args[0]))
    theirs = args[2] if len(args) > 2 else "none"
    if theirs != str(PROTOCOL):
        # A holder of another version (fastlease was upgraded or downgraded under a running process):
        # its frames would be misread. Say so, and exit; the holder renews its leases itself.
        reason = (f"the installed fastlease speaks renewal protocol {PROTOCOL}, not this process's ({theirs}): it "
                  "was upgraded or downgraded under this process")
        try:
            sock.sendall(frame((REFUSED, 0, reason, 0, 0, (0, 0, 0, 0, 0))))
        except OSError:
            pass
        return 0
    try:
        RenewalProcess(sock, int(args[1])).run()
    except (OSError, SystemExit):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
