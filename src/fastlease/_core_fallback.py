"""The pure-Python stand-ins for ``_core.pyx``, used by the interpreted engine: same names, same
results (the suite compares the two)."""

from __future__ import annotations

import os
import struct
import threading
import uuid

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Optional

#: The CRC-32 of the source of a compiled module; this one is not compiled.
BUILT_FROM = ""

#: The lock of the engine's short critical sections (``_core.Mutex`` compiled).
Mutex = threading.Lock


def new_token() -> str:
    """A random UUID4 string: used for every owner and every version."""
    return str(uuid.uuid4())


#: A registration's numbers (``Pulse.register``; the native core packs the same in C): lease_ms, fence (-1:
#: none), the acquisition's monotonic and wall stamps, max_hold's end (0: none), when its first renewal is
#: due (monotonic), the store id. Table, key, owner and version follow, each a u16 length and UTF-8.
REGISTRATION_NUMBERS = struct.Struct("=7q")


class Pulse:
    """The renewal pulse on a Python thread (``_core.Pulse`` is native): the same frames, but it
    needs the GIL, so it stops, and renewal with it, while another thread holds the GIL."""

    native = False

    def __init__(self, fd: int, interval_ms: int, argv: "Optional[list[str]]" = None,
                 give: tuple[int, int] = (-1, -1)) -> None:
        if interval_ms < 1:
            raise ValueError(f"interval_ms must be at least 1, got {interval_ms}")
        self._argv, self._give = argv, give
        self._child = 0
        self._fd = os.dup(fd)
        os.set_blocking(self._fd, False)
        self._interval_s = interval_ms / 1000
        self._lock = threading.Lock()
        self._staged: list[tuple[int, bytes]] = []
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._pulses = 0
        self._next_id = 0
        self.leases: dict[int, object] = {}
        threading.Thread(target=self._run, name="fastlease-pulse", daemon=True).start()

    def _usable(self) -> bool:
        return not self._stop.is_set() and self._pid == os.getpid()

    def register(self, lease: object, table: str, key: str, owner: str, version: str, lease_ms: int,
                 fence: "Optional[int]", mono_ns: int, wall_ns: int, hold_until_ns: int, renew_at_ns: int,
                 store_id: int) -> int:
        payload = REGISTRATION_NUMBERS.pack(lease_ms, -1 if fence is None else fence, mono_ns, wall_ns,
                                            hold_until_ns, renew_at_ns, store_id)
        for text in (table, key, owner, version):
            data = text.encode()
            payload += struct.pack("=H", len(data)) + data
        with self._lock:
            self._next_id += 1
            frame_id = self._next_id
        self.leases[frame_id] = lease
        if self.stage(frame_id, payload):
            return frame_id
        del self.leases[frame_id]
        return 0

    def take_back(self, frame_id: int) -> bool:
        if self.unstage(frame_id):
            self.leases.pop(frame_id, None)
            return True
        return False

    def stage(self, frame_id: int, payload: bytes) -> bool:
        if frame_id == 0 or len(payload) + 12 > PULSE_WRITE_MAX or not self._usable():
            return False
        with self._lock:
            self._staged.append((frame_id, payload))
        return True

    def unstage(self, frame_id: int) -> bool:
        if not self._usable():
            return False
        with self._lock:
            for index, (staged_id, _) in enumerate(self._staged):
                if staged_id == frame_id:
                    del self._staged[index]
                    return True
        return False

    @property
    def pulses(self) -> int:
        return self._pulses

    @property
    def child(self) -> int:
        return self._child

    def forget_in_child(self) -> None:
        if self._pid != os.getpid() and not self._stop.is_set():
            self._stop.set()
            self._close_fd_locked()  # (at fork, in the child's only thread: the lock may be the parent's)

    def close(self) -> None:
        """As ``_core.Pulse.close``: stop, drop what is staged and close the pipe, from any thread."""
        with self._lock:
            self._stop.set()
            self._staged.clear()
            self._close_fd_locked()

    def _close_fd_locked(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _run(self) -> None:
        if self._argv is not None:
            try:
                self._child = os.posix_spawn(self._argv[0], self._argv, os.environ)
            except OSError as error:
                self._child = -(error.errno or 1)
            for fd in self._give:
                if fd >= 0:
                    os.close(fd)
        try:
            while not self._stop.wait(self._interval_s):
                with self._lock:
                    if self._fd < 0:
                        break
                    frames = self._staged or [(0, b"")]
                    while frames:
                        frame_id, payload = frames[0]
                        try:
                            os.write(self._fd, struct.pack("=IQ", 8 + len(payload), frame_id) + payload)
                        except (BlockingIOError, OSError):
                            break
                        if frame_id == 0:
                            self._pulses += 1
                        frames.pop(0)
        finally:
            with self._lock:
                self._close_fd_locked()


#: Frames up to this size are written whole (PIPE_BUF), so they are never split.
PULSE_WRITE_MAX = 4096
