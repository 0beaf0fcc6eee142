"""The one place that picks the engine: ``_engine`` compiled, or the same source interpreted.

Both are built from ``_engine.py``. Compiled, it is an extension module that the import system finds
before the source beside it. ``FASTLEASE_NO_EXTENSIONS=1`` or a non-CPython interpreter selects the
source as it is; on CPython a missing extension (an sdist built without a compiler) falls back to it
with a RuntimeWarning. ``load("py")`` loads the source under its own name even where the extension
exists, so that one test run exercises both.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

TYPE_CHECKING = False  # neither typing nor types is imported at run time: see _typing.py
if TYPE_CHECKING:
    from types import ModuleType

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


def _select() -> ModuleType:
    if os.environ.get("FASTLEASE_NO_EXTENSIONS", "") not in ("", "0"):
        return load("py")
    if sys.implementation.name != "cpython":
        return load("py")
    try:
        return load("c")
    except ImportError as error:
        # Missing extension: the import above found and ran the source, which load("py") reuses.
        warnings.warn(
            f"fastlease: compiled engine unavailable ({error}); using the slower pure-Python engine. "
            "Reinstall with a C compiler and the Python headers to build it",
            RuntimeWarning,
            stacklevel=3,
        )
        return load("py")


core: ModuleType = _select()
#: "c" for the compiled engine, "py" for the interpreted one.
IMPLEMENTATION: str = core.IMPLEMENTATION
