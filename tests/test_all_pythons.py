"""Tests marked ``all_pythons`` run on every interpreter of ``make test``: the main suite's, then each of
the Makefile's EXTRA_PYTHONS (3.12 and 3.13) in a venv of its own. They are for behaviour that changes
between versions, such as renewal under a held GIL. This file's tests check the ground they stand on:
that the venv built the compiled engine for its own interpreter, and that it is the one in use; and that
the Makefile's list of the files that hold them (ALL_PYTHONS_TESTS) misses none."""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
from pathlib import Path

import pytest

import fastlease
from fastlease import MemoryClient, SyncDistributedLock, _impl


@pytest.mark.all_pythons
@pytest.mark.c_extension
def test_the_compiled_engine_is_built_for_this_interpreter_and_in_use():
    if os.environ.get("FASTLEASE_NO_EXTENSIONS", "") not in ("", "0"):
        pytest.fail("FASTLEASE_NO_EXTENSIONS is set: this run would not exercise the compiled engine")
    import fastlease._core as native

    # The most specific suffix carries this interpreter's tag (.cpython-313-x86_64-linux-gnu.so): an
    # extension built for another version beside it would not be importable here at all.
    own_suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    assert f"{sys.version_info.major}{sys.version_info.minor}" in own_suffix, own_suffix
    for module in (native, *_impl.load("c").MODULES):
        assert Path(module.__file__).name.endswith(own_suffix), (sys.version, module.__file__)
    assert fastlease.IMPLEMENTATION == "c", sys.version
    with MemoryClient() as client:
        assert client.implementation == "c"
        with SyncDistributedLock(client, table="all_pythons", key="k", lease_duration=5) as lease:
            assert lease.fencing_token == 1


def test_the_makefile_runs_every_file_that_holds_all_pythons_tests():
    """make test runs the all_pythons tests of the files it names (ALL_PYTHONS_TESTS) on the other
    interpreters: a file with such a test that the list lacks would quietly run on 3.11 only."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "Makefile").exists():
        pytest.skip("no Makefile here: the suite runs against an installed wheel")
    listed = re.search(r"^ALL_PYTHONS_TESTS :=(.*)$", (root / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    assert listed, "the Makefile sets no ALL_PYTHONS_TESTS"
    marked = sorted(str(path.relative_to(root)) for path in (root / "tests").rglob("*.py")
                    if "mark.all_pythons" in path.read_text(encoding="utf-8"))
    assert "tests/test_renewal_gil.py" in marked  # the scan finds what it looks for
    assert sorted(listed.group(1).split()) == marked
