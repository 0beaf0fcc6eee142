"""The compiled engine is built and in use; the interpreted one is the same source; the native core and
its fallback match."""

from __future__ import annotations

import ast
import importlib.machinery
import os
from pathlib import Path

import pytest

import fastlease
from fastlease import _core_fallback, _impl

PACKAGE = Path(fastlease.__file__).parent


@pytest.mark.c_extension
def test_compiled_engine_is_the_one_in_use():
    if os.environ.get("FASTLEASE_NO_EXTENSIONS", "") not in ("", "0"):
        pytest.fail("FASTLEASE_NO_EXTENSIONS is set: this run would not exercise the compiled engine")
    import fastlease._core as native

    compiled = _impl.load("c")
    for module in (native, *compiled.MODULES):
        assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), module
    assert compiled.IMPLEMENTATION == fastlease.IMPLEMENTATION == "c"
    assert fastlease.MemoryClient().implementation == "c"


def test_both_engines_are_built_from_the_one_source(core):
    # The interpreted engine is _engine/*.py itself; the compiled one was cythonized from those files, each
    # with the .pxd beside it, and every such pair is one of the engine's modules.
    directory = PACKAGE / "_engine"
    names = sorted(module.__name__.rsplit(".", 1)[1] for module in core.MODULES)
    assert sorted(path.stem for path in directory.glob("*.py")) == sorted([*names, "__init__"])
    # A source tree has the declarations of every module beside it; an installed wheel ships none.
    assert sorted(path.stem for path in directory.glob("*.pxd")) in ([], names)
    for module in core.MODULES:
        source = directory / (module.__name__.rsplit(".", 1)[1] + ".py")
        if core.IMPLEMENTATION == "py":
            assert Path(module.__file__) == source
        else:  # the extension module of that same name, beside its source
            compiled = Path(module.__file__)
            assert compiled.parent == directory and compiled.name.split(".")[0] == source.stem
            assert compiled.suffix in (".so", ".pyd") and source.exists()
    assert Path(core.__file__) == directory / "__init__.py"  # the face is never compiled
    assert not (PACKAGE / "_core_py.py").exists() and not list(directory.glob("*.pyx"))


def test_native_core_its_fallback_and_its_stub_declare_the_same_names():
    import fastlease._core as native

    def public(names):
        return {name for name in names if not name.startswith("_")}

    stub = ast.parse((PACKAGE / "_core.pyi").read_text())
    stubbed = public(node.name for node in stub.body if isinstance(node, (ast.FunctionDef, ast.ClassDef)))
    fallback = public(name for name, value in vars(_core_fallback).items()
                      if callable(value) and not isinstance(value, type(ast)))
    fallback -= {"annotations"}
    compiled = public(name for name, value in vars(native).items() if callable(value))
    assert stubbed == fallback == compiled == {"Mutex", "Pulse", "new_token"}


@pytest.mark.parametrize("implementation", ["c", "py"])
def test_the_mutex_of_each_engine_excludes_and_releases(implementation):
    import threading

    mutex = _impl.load(implementation).timing.new_mutex()
    entered, inside = threading.Event(), []

    def other() -> None:
        entered.set()
        with mutex:
            inside.append("other")

    with mutex:
        thread = threading.Thread(target=other)
        thread.start()
        assert entered.wait(10)
        thread.join(0.2)  # it cannot get in while we hold the mutex
        assert thread.is_alive() and inside == []
        inside.append("us")
    thread.join(10)
    assert inside == ["us", "other"] and not thread.is_alive()
    assert mutex.acquire() is True
    mutex.release()


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


def test_an_install_without_the_compiled_engine_warns_clearly_and_runs_the_source(tmp_path):
    # The package as an sdist installs it where no compiler was found: every file but the compiled ones.
    import shutil
    import subprocess
    import sys

    package = os.path.dirname(fastlease.__file__)
    shutil.copytree(package, tmp_path / "fastlease", ignore=shutil.ignore_patterns(
        "*.so", "*.pyd", "*.c", "__pycache__"))
    probe = "import fastlease; print(fastlease.IMPLEMENTATION)"
    result = subprocess.run([sys.executable, "-W", "always", "-c", probe], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(tmp_path)), check=True)
    assert result.stdout.split() == ["py"]
    assert "compiled engine unavailable (it was not built when fastlease was installed)" in result.stderr
    assert "circular import" not in result.stderr


def _engine_module_names():
    return [module.__name__.rsplit(".", 1)[1] for module in _impl.load("c").MODULES]


def _import_copy(package_dir, changed=None):
    """``import fastlease`` from a copy of the package (its compiled modules included), with ``changed``
    edited after the build; warnings are errors unless a source was changed."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(os.path.dirname(fastlease.__file__), package_dir / "fastlease",
                    ignore=shutil.ignore_patterns("*.c", "__pycache__"))
    # A source tree, as an editable install has: the check looks for the declarations beside each module,
    # which an installed wheel (whose copy this may be) does not ship. Their content is not read.
    copy = package_dir / "fastlease"
    for module in ("_core", *(f"_engine/{name}" for name in _engine_module_names())):
        (copy / f"{module}.pxd").touch()
    for name in ("_core.pyx", "_pulse.h"):
        source = copy / name
        if not source.exists():  # a wheel ships the core compiled only: give it sources older than its build
            source.write_text("/* the native core's source, as a source tree has it */\n")
            built = os.stat(next(copy.glob("_core.*.so"))).st_mtime_ns
            os.utime(source, ns=(built - 10**9, built - 10**9))
    if changed is not None:
        with open(package_dir / "fastlease" / changed, "a") as source:
            source.write("\n# edited after the build\n")
    probe = ("import fastlease, fastlease._renewal_link as link; "
             "print(fastlease.IMPLEMENTATION, link._pulse_module().__name__, fastlease.__file__)")
    return subprocess.run([sys.executable, "-W", "error" if changed is None else "always", "-c", probe],
                          cwd=package_dir, capture_output=True, text=True, timeout=60, check=True,
                          env=dict(os.environ, PYTHONPATH=str(package_dir), FASTLEASE_NO_EXTENSIONS=""))


@pytest.mark.c_extension
@pytest.mark.parametrize(("changed", "pulse", "stale"), [
    ("_engine/lease.py", "fastlease._core", "fastlease._engine.lease was compiled from another lease.py (CRC "),
    ("_engine/timing.py", "fastlease._core", "fastlease._engine.timing was compiled from another timing.py (CRC "),
    ("_core.pyx", "fastlease._core_fallback", "fastlease._core was compiled from another _core.pyx and _pulse.h (CRC "),
    # The pulse's C alone: setup.py counts the header in the core's CRC.
    ("_pulse.h", "fastlease._core_fallback", "fastlease._core was compiled from another _core.pyx and _pulse.h (CRC "),
])
def test_a_compiled_module_older_than_its_source_is_not_used(tmp_path, changed, pulse, stale):
    # A checkout that moved on without a rebuild: the source runs, never the code of another commit.
    # A stale native core also gives way to the pure-Python pulse, which stops while the GIL is held.
    result = _import_copy(tmp_path, changed)
    implementation, pulse_module, path = result.stdout.split()
    assert (implementation, pulse_module) == ("py", pulse)
    assert path.startswith(str(tmp_path))
    assert stale in result.stderr
    assert "running the source with the pure-Python engine instead of a stale build" in result.stderr
    assert "pip install -e ." in result.stderr


@pytest.mark.c_extension
def test_compiled_modules_built_from_the_sources_beside_them_run_without_a_warning(tmp_path):
    implementation, pulse_module, path = _import_copy(tmp_path).stdout.split()
    assert (implementation, pulse_module) == ("c", "fastlease._core") and path.startswith(str(tmp_path))


@pytest.mark.parametrize(("value", "expected"), [("1", "py"), ("0", "c"), ("", "c")])
def test_environment_variable_selects_the_interpreted_engine_in_one_place(value, expected):
    import subprocess
    import sys

    env = dict(os.environ, FASTLEASE_NO_EXTENSIONS=value)
    probe = "import fastlease, fastlease._impl as i; print(fastlease.IMPLEMENTATION, i.core.__name__)"
    result = subprocess.run([sys.executable, "-W", "error", "-c", probe], env=env, capture_output=True,
                            text=True, timeout=60, check=True)
    module = "fastlease._engine_py" if expected == "py" else "fastlease._engine"
    assert result.stdout.split() == [expected, module]


@pytest.mark.posix
def test_fork_start_method_child_gets_a_clear_error_and_a_fresh_client_works(core):
    import multiprocessing

    from fastlease import MemoryClient, SyncDistributedLock

    inherited = MemoryClient(_engine_module=core)
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
        fresh = MemoryClient(_engine_module=core)
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
