"""The one place that picks the engine: the compiled ``_core`` or its pure-Python twin ``_core_py``.

``FASTLEASE_NO_EXTENSIONS=1`` or a non-CPython interpreter selects the twin. On CPython, a missing
compiled core (an sdist built without a compiler) falls back to the twin with a RuntimeWarning.
"""

from __future__ import annotations

import os
import platform
import warnings
from importlib.util import find_spec
from types import ModuleType

from . import _core_py


def _select() -> ModuleType:
    if os.environ.get("FASTLEASE_NO_EXTENSIONS", "") not in ("", "0"):
        return _core_py
    if platform.python_implementation() != "CPython":
        return _core_py
    try:
        from . import _core
    except ImportError as error:
        # No module file at all is the usual case (an sdist installed without a C compiler): say that,
        # rather than Python's "partially initialized module" wording, which suggests a circular import.
        reason = "it was not built when fastlease was installed" if find_spec(f"{__package__}._core") is None else error
        warnings.warn(
            f"fastlease: compiled core unavailable ({reason}); using the slower pure-Python engine. "
            "Reinstall with a C compiler and the Python headers to build it",
            RuntimeWarning,
            stacklevel=3,
        )
        return _core_py
    return _core


core: ModuleType = _select()
#: "c" for the compiled core, "py" for the twin.
IMPLEMENTATION: str = core.IMPLEMENTATION
