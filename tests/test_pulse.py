"""The renewal pulse survives every method being called from several threads while it is closed and while
its reader (the renewal process) goes away: the ownership rule of ``_core.Pulse`` (docs/architecture.md,
"The pulse's memory"). Each run is a separate interpreter (``tests/pulse_hammer.py``), so a crash is an
exit status the test reports, not the end of the test session. Before that rule, the compiled pulse died
with SIGSEGV within the first few hundred trials.
"""

from __future__ import annotations

import os
import signal
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
        frame_id = pulse.register(lease, "locks", "k", "owner", "version", 1000, None, 1, 2, 0, 1)
        assert frame_id == 1 and pulse.leases == {1: lease}
        pulse.close()
        pulse.close()  # idempotent
        assert pulse.take_back(frame_id) is False  # dropped at close: nothing to take back
        assert pulse.register(lease, "locks", "k", "o", "v", 1000, None, 1, 2, 0, 1) == 0
        assert pulse.stage(5, b"x") is False and pulse.unstage(5) is False
        assert pulse.child == 0 and pulse.pulses in (0, 1)  # (its first pulse goes out at once)
        # close() closed the pulse's copy of the pipe: after at most that first pulse, the reader sees EOF.
        os.close(write_end)
        write_end = -1
        received = os.read(read_end, 4096)
        assert len(received) in (0, 12) and os.read(read_end, 4096) == b"", received
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
