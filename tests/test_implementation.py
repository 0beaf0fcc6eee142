"""The compiled core is built and in use, and the twin matches it name for name."""

from __future__ import annotations

import importlib.machinery
import os

import pytest

import fastlease
import fastlease._core_py as twin


@pytest.mark.c_extension
def test_compiled_core_is_the_one_in_use():
    if os.environ.get("FASTLEASE_NO_EXTENSIONS", "") not in ("", "0"):
        pytest.fail("FASTLEASE_NO_EXTENSIONS is set: this run would not exercise the compiled core")
    import fastlease._core as compiled

    assert compiled.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert fastlease.IMPLEMENTATION == "c"
    assert fastlease.MemoryClient().implementation == "c"


def test_twin_and_core_export_the_same_public_names(core):
    def public(module):
        return {name for name in vars(module) if not name.startswith("_")} - {
            "annotations", "Any", "Optional", "TYPE_CHECKING", "cast",
            "heapq", "logging", "os", "random", "threading", "time", "uuid",
            "LockLost", "LockNotAcquired", "LockReleaseError", "MalformedLockRow", "StoreError", "cython",
        }

    assert public(core) == public(twin)


def test_twin_and_core_agree_on_constants(core):
    for name in ("PROTOCOL_V1", "MIN_LEASE_MS", "MAX_DURATION_MS", "MAX_KEY_BYTES", "OBSERVATION_CACHE_SIZE",
                 "POLL_INTERVAL_MS", "ERROR_BACKOFF_MS", "SCHEDULER_IDLE_EXIT_MS", "RENEWAL_WORKERS",
                 "YIELD_WINDOW_MS", "WAITING_MARK_AFTER_MS", "STATE_NAMES",
                 "NEW", "ACQUIRING", "HELD", "RELEASING", "RELEASED", "LOST", "FAILED"):
        assert getattr(core, name) == getattr(twin, name), name
    for lease_ms in (100, 999, 30_000, 86_400_000):
        for fn in ("validity_ns", "renew_interval_ns", "renew_retry_ns", "request_timeout_ns", "cleanup_budget_ns"):
            assert getattr(core, fn)(lease_ms) == getattr(twin, fn)(lease_ms), (fn, lease_ms)


def test_tokens_are_uuid4_strings(core):
    import uuid

    tokens = {core.new_token() for _ in range(5000)}
    assert len(tokens) == 5000
    for token in list(tokens)[:200]:
        parsed = uuid.UUID(token)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == token


def test_forked_child_draws_different_tokens(core, in_forked_child):
    core.new_token()  # fill the pool in the parent
    child_token = in_forked_child(core.new_token)
    parent_next = core.new_token()
    assert len(child_token) == 36 and child_token != parent_next


def test_an_install_without_the_compiled_core_warns_clearly_and_runs_the_twin(tmp_path):
    # The package as an sdist installs it where no compiler was found: every file but the compiled core.
    import shutil
    import subprocess
    import sys

    package = os.path.dirname(fastlease.__file__)
    shutil.copytree(package, tmp_path / "fastlease", ignore=shutil.ignore_patterns("_core.*.so", "_core.*.pyd",
                                                                                   "_core.c", "__pycache__"))
    probe = "import fastlease; print(fastlease.IMPLEMENTATION)"
    result = subprocess.run([sys.executable, "-W", "always", "-c", probe], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(tmp_path)), check=True)
    assert result.stdout.split() == ["py"]
    assert "compiled core unavailable (it was not built when fastlease was installed)" in result.stderr
    assert "circular import" not in result.stderr


@pytest.mark.parametrize(("value", "expected"), [("1", "py"), ("0", "c"), ("", "c")])
def test_environment_variable_selects_the_twin_in_one_place(value, expected):
    import subprocess
    import sys

    env = dict(os.environ, FASTLEASE_NO_EXTENSIONS=value)
    probe = "import fastlease, fastlease._impl as i; print(fastlease.IMPLEMENTATION, i.core.__name__)"
    result = subprocess.run([sys.executable, "-W", "error", "-c", probe], env=env, capture_output=True,
                            text=True, timeout=60, check=True)
    module = "fastlease._core_py" if expected == "py" else "fastlease._core"
    assert result.stdout.split() == [expected, module]


@pytest.mark.posix
def test_fork_start_method_child_gets_a_clear_error_and_a_fresh_client_works(core):
    import multiprocessing

    from fastlease import MemoryClient, SyncDistributedLock

    inherited = MemoryClient(_core=core)
    with SyncDistributedLock(inherited, table="locks", key="warm"):  # the renewal thread is running
        pass
    receiver, sender = multiprocessing.Pipe(duplex=False)

    def child() -> None:
        report = []
        try:
            SyncDistributedLock(inherited, table="locks", key="k")
            report.append("inherited client accepted")
        except RuntimeError as error:
            report.append("inherited: " + ("clear" if "Create the client in the worker" in str(error) else str(error)))
        fresh = MemoryClient(_core=core)
        with SyncDistributedLock(fresh, table="locks", key="k", lease_duration=0.3) as lease:
            lease.raise_if_lost()
            report.append(f"fresh: {lease.state}")
        fresh.close()
        sender.send(report)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    try:
        assert receiver.poll(30), "the forked child reported nothing"
        assert receiver.recv() == ["inherited: clear", "fresh: held"]
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)
        inherited.close()
    assert process.exitcode == 0
