"""The one place that picks the engine: ``_engine`` compiled, or the same sources interpreted.

Both are built from the engine's modules (``_engine/*.py``). Compiled, each is an extension module that
the import system finds before the source beside it. ``FASTLEASE_NO_EXTENSIONS=1`` or a non-CPython
interpreter selects the sources as they are; on CPython a missing extension (an sdist built without a
compiler) falls back to them with a RuntimeWarning. ``load("py")`` loads the sources as a package of its
own name (``fastlease._engine_py``) even where the extensions exist, so that one test run exercises both.

A compiled module carries the CRC-32 of the source it was compiled from (``BUILT_FROM``). Where that
source sits beside it in a source tree, was written after the module, and differs (a checkout moved
on and the editable install was not rebuilt), the build is stale: it would run code that is no longer in the
tree, so fastlease warns and runs the sources instead; a stale native core also gives way to its
fallback (``native_core``).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

TYPE_CHECKING = False  # neither typing nor types is imported at run time: see _typing.py
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Optional

_PY_NAME = f"{__package__}._engine_py"
#: The C the native core includes besides its .pyx (setup.py compiles the same list into it).
CORE_HEADERS = ("_pulse.h",)


def load(implementation: str) -> ModuleType:
    """The engine package: ``"c"`` (compiled; ImportError if it was not built) or ``"py"``."""
    if implementation == "c":
        module = importlib.import_module(f"{__package__}._engine")
        if module.IMPLEMENTATION != "c":
            raise ImportError("it was not built when fastlease was installed")
        return module
    if implementation != "py":
        raise ValueError(f"implementation must be 'c' or 'py', got {implementation!r}")
    plain = sys.modules.get(f"{__package__}._engine")
    if plain is not None and plain.IMPLEMENTATION == "py":
        return plain  # no extension was built: the import system already loaded the sources
    loaded = sys.modules.get(_PY_NAME)
    if loaded is None:
        loaded = _load_sources()
    return loaded


def _load_sources() -> ModuleType:
    """The engine's sources as the package ``fastlease._engine_py``: its modules import each other by
    relative imports, which resolve inside it, and the rest of fastlease by ``..``, which is shared."""
    # Only here: importlib.util costs 3 ms of `import fastlease` on the compiled path.
    from importlib.util import module_from_spec, spec_from_file_location

    directory = os.path.join(os.path.dirname(__file__), "_engine")

    class SourcesOnly:
        """Finds the package's modules as their .py files: the path finder would pick the extension
        modules beside them first."""

        @staticmethod
        def find_spec(name: str, path: Optional[Sequence[str]] = None,
                      target: Optional[ModuleType] = None) -> Optional[ModuleSpec]:
            if not name.startswith(_PY_NAME + "."):
                return None
            return spec_from_file_location(name, os.path.join(directory, name.rsplit(".", 1)[1] + ".py"))

    if not any(type(finder).__name__ == "SourcesOnly" for finder in sys.meta_path):
        sys.meta_path.insert(0, SourcesOnly())
    spec = spec_from_file_location(_PY_NAME, os.path.join(directory, "__init__.py"), submodule_search_locations=[])
    assert spec is not None and spec.loader is not None  # a .py path always has a source loader
    loaded = module_from_spec(spec)
    sys.modules[_PY_NAME] = loaded
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        for name in [name for name in sys.modules if name == _PY_NAME or name.startswith(_PY_NAME + ".")]:
            del sys.modules[name]
        raise
    return loaded


def stale_build(module: ModuleType, source_suffix: str = ".py", headers: tuple[str, ...] = ()) -> str:
    """Why compiled ``module`` is not built from its sources beside it (its name with ``source_suffix``,
    then the C ``headers`` setup.py compiled into it); "" when it is, or outside a source tree."""
    compiled = module.__file__ or ""
    directory = os.path.dirname(compiled)
    stem = os.path.join(directory, module.__name__.rsplit(".", 1)[1])
    paths = [stem + source_suffix, *(os.path.join(directory, header) for header in headers)]
    try:
        # Only a source tree (an editable install) can hold a stale build: it has the Cython declarations
        # beside the modules, which a wheel does not ship. There, a source written before its module was
        # compiled has not changed since (a checkout writes the files it changes at the current time).
        # So an import costs one or two stat calls per module, not binascii (0.4 ms) and a read.
        built_ns = os.stat(compiled).st_mtime_ns
        if not os.path.exists(stem + ".pxd") or all(os.stat(path).st_mtime_ns <= built_ns for path in paths):
            return ""
        data = []
        for path in paths:
            with open(path, "rb") as source:
                data.append(source.read())
    except OSError:
        return ""
    import binascii

    crc = 0
    for chunk in data:
        crc = binascii.crc32(chunk, crc)
    found = f"{crc:08x}"
    built_from = getattr(module, "BUILT_FROM", "")  # a build older than this check has none
    if built_from == found:
        return ""
    names = " and ".join(os.path.basename(path) for path in paths)
    return (f"{module.__name__} was compiled from another {names} (CRC {built_from or 'not recorded'}; "
            f"the source beside it has {found})")


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
    return None if stale_build(native, ".pyx", CORE_HEADERS) else native


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
    stale = "; ".join(filter(None, [*(stale_build(module) for module in compiled.MODULES),
                                    stale_build(sys.modules[f"{__package__}._core"], ".pyx", CORE_HEADERS)]))
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
