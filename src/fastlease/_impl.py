"""The one place that picks the engine: ``_engine`` compiled, or the same source interpreted.

Both are built from ``_engine.py``. Compiled, it is an extension module that the import system finds
before the source beside it. ``FASTLEASE_NO_EXTENSIONS=1`` or a non-CPython interpreter selects the
source as it is; on CPython a missing extension (an sdist built without a compiler) falls back to it
with a RuntimeWarning. ``load("py")`` loads the source under its own name even where the extension
exists, so that one test run exercises both.

A compiled module carries the CRC-32 of the source it was compiled from (``BUILT_FROM``). Where that
source sits beside it in a source tree, was written after the module, and differs (a checkout moved
on and the editable install was not rebuilt), the build is stale: it would run code that is no longer in the
tree, so fastlease warns and runs the source instead; a stale native core also gives way to its
fallback (``native_core``).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

TYPE_CHECKING = False  # neither typing nor types is imported at run time: see _typing.py
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Optional

_PY_NAME = f"{__package__}._engine_py"


def load(implementation: str) -> ModuleType:
    """The engine module: ``"c"`` (compiled; ImportError if it was not built) or ``"py"``."""
    if implementation == "c":
        module = importlib.import_module(f"{__package__}._engine")
        if module.IMPLEMENTATION != "c":
            raise ImportError("it was not built when fastlease was installed")
        return module
    if implementation != "py":
        raise ValueError(f"implementation must be 'c' or 'py', got {implementation!r}")
    plain = sys.modules.get(f"{__package__}._engine")
    if plain is not None and plain.IMPLEMENTATION == "py":
        return plain  # no extension was built: the import system already loaded the source
    loaded = sys.modules.get(_PY_NAME)
    if loaded is None:
        # Only here: importlib.util costs 3 ms of `import fastlease` on the compiled path.
        from importlib.util import module_from_spec, spec_from_file_location

        path = os.path.join(os.path.dirname(__file__), "_engine.py")
        spec = spec_from_file_location(_PY_NAME, path)
        assert spec is not None and spec.loader is not None  # a .py path always has a source loader
        loaded = module_from_spec(spec)
        sys.modules[_PY_NAME] = loaded
        try:
            spec.loader.exec_module(loaded)
        except BaseException:
            del sys.modules[_PY_NAME]
            raise
    return loaded


def stale_build(module: ModuleType, source_name: str) -> str:
    """Why compiled ``module`` is not built from ``source_name`` beside it; "" when it is, or outside a
    source tree."""
    here = os.path.dirname(__file__)
    path = os.path.join(here, source_name)
    try:
        # Only a source tree (an editable install) can hold a stale build: it has the Cython declarations
        # beside the modules, which a wheel does not ship. There, a source written before its module was
        # compiled has not changed since (a checkout writes the files it changes at the current time).
        # So an import costs one or two stat calls, not binascii (0.4 ms) and a read.
        if (not os.path.exists(os.path.join(here, source_name.rsplit(".", 1)[0] + ".pxd"))
                or os.stat(path).st_mtime_ns <= os.stat(module.__file__ or path).st_mtime_ns):
            return ""
        with open(path, "rb") as source:
            data = source.read()
    except OSError:
        return ""
    import binascii

    crc = f"{binascii.crc32(data):08x}"
    built_from = getattr(module, "BUILT_FROM", "")  # a build older than this check has none
    if built_from == crc:
        return ""
    return (f"{module.__name__} was compiled from another {source_name} (CRC {built_from or 'not recorded'}; "
            f"the file beside it has {crc})")


def _extensions_off() -> bool:
    """``FASTLEASE_NO_EXTENSIONS=1``, or an interpreter other than CPython: the source runs."""
    return os.environ.get("FASTLEASE_NO_EXTENSIONS", "") not in ("", "0") or sys.implementation.name != "cpython"


def native_core() -> Optional[ModuleType]:
    """The compiled native core (``_core``): None when extensions are off, it was not built, or its build
    is stale, so that the pure-Python pulse (which stops while the GIL is held) runs instead."""
    if _extensions_off():
        return None
    try:
        native = importlib.import_module(f"{__package__}._core")
    except ImportError:
        return None
    return None if stale_build(native, "_core.pyx") else native


def _select() -> ModuleType:
    if _extensions_off():
        return load("py")
    try:
        compiled = load("c")
    except ImportError as error:
        # Missing extension: the import above found and ran the source, which load("py") reuses.
        warnings.warn(
            f"fastlease: compiled engine unavailable ({error}); using the slower pure-Python engine. "
            "Reinstall with a C compiler and the Python headers to build it",
            RuntimeWarning,
            stacklevel=3,
        )
        return load("py")
    stale = stale_build(compiled, "_engine.py") or stale_build(sys.modules[f"{__package__}._core"], "_core.pyx")
    if stale:
        warnings.warn(
            f"fastlease: {stale}; running the source with the pure-Python engine instead of a stale build. "
            "Rebuild the compiled modules: pip install -e . (or make, in the fastlease tree)",
            RuntimeWarning,
            stacklevel=3,
        )
        return load("py")
    return compiled


core: ModuleType = _select()
#: "c" for the compiled engine, "py" for the interpreted one.
IMPLEMENTATION: str = core.IMPLEMENTATION
