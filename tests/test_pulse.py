"""The renewal pulse survives every method being called from several threads while it is closed and while
its reader (the renewal process) goes away: the ownership rule of ``_core.Pulse`` (docs/architecture.md,
"The pulse's memory"). Each run is a separate interpreter (``tests/pulse_hammer.py``), so a crash is an
exit status the test reports, not the end of the test session. Before that rule, the compiled pulse died
with SIGSEGV within the first few hundred trials.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

HAMMER = Path(__file__).with_name("pulse_hammer.py")
#: Trials of each run, and threads calling methods in each trial (a closer besides).
TRIALS = 2000
THREADS = 4


def _hammer(implementation: str, trials: int) -> str:
    env = dict(os.environ)
    env.pop("FASTLEASE_NO_EXTENSIONS", None)
    done = subprocess.run([sys.executable, str(HAMMER), str(trials), str(THREADS), implementation],
                          capture_output=True, text=True, timeout=240, env=env)
    if done.returncode < 0:
        pytest.fail(f"the pulse hammer died of {signal.Signals(-done.returncode).name}: {done.stderr[-2000:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.all_pythons
@pytest.mark.c_extension
@pytest.mark.posix
def test_native_pulse_methods_race_close_and_a_vanished_reader_without_crashing() -> None:
    out = _hammer("c", TRIALS)
    assert f"{TRIALS} trials" in out and "fastlease._core.Pulse" in out, out


@pytest.mark.posix
def test_python_pulse_methods_race_close_without_failing() -> None:
    out = _hammer("py", TRIALS // 10)
    assert "fastlease._core_fallback.Pulse" in out, out


@pytest.mark.c_extension
@pytest.mark.posix
def test_a_closed_native_pulse_stages_nothing_and_still_answers() -> None:
    from fastlease import _core

    read_end, write_end = os.pipe()
    try:
        pulse = _core.Pulse(write_end, 1000)
        lease = object()
        frame_id = pulse.register(lease, "locks", "k", "owner", "version", 1000, None, 1, 2, 0, 3, 1)
        registration = struct.pack("<7q", 1000, -1, 1, 2, 0, 3, 1) + b"".join(
            struct.pack("<H", len(part)) + part for part in (b"locks", b"k", b"owner", b"version"))
        assert frame_id == 1 and pulse.leases == {1: lease}
        pulse.close()
        pulse.close()  # idempotent
        assert pulse.take_back(frame_id) is False  # dropped at close: nothing to take back
        assert pulse.register(lease, "locks", "k", "o", "v", 1000, None, 1, 2, 0, 3, 1) == 0
        assert pulse.stage(5, b"x") is False and pulse.unstage(5) is False
        assert pulse.child == 0 and pulse.pulses in (0, 1)  # (its first pulse goes out at once)
        # close() closed the pulse's copy of the pipe. Before it, the thread's first round may have written
        # either a pulse frame (if it ran before register) or the staged registration in its place; after
        # it, nothing: the reader sees whole frames, then EOF.
        os.close(write_end)
        write_end = -1
        frames = _frames(_read_to_eof(read_end))
        assert frames in ([], [(0, b"")], [(1, registration)]), frames
        assert len(frames) == pulse.pulses or frames[0][0] == 1, (frames, pulse.pulses)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def _read_to_eof(fd: int) -> bytes:
    received = b""
    while chunk := os.read(fd, 4096):  # ends: the only write end was closed above
        received += chunk
    return received


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """Split the pipe's bytes into (id, payload) frames: a little-endian u32 length of what follows, a u64
    id (0 for a pulse), the payload. A torn frame fails the test."""
    frames, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        assert at + 4 + length <= len(data), f"a torn frame at byte {at}: {data!r}"
        (frame_id,) = struct.unpack_from("<Q", data, at + 4)
        frames.append((frame_id, data[at + 12:at + 4 + length]))
        at += 4 + length
    return frames
