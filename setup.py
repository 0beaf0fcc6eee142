"""Builds the compiled modules: the native core (``_core.pyx``) and the engine, each of whose modules
(``_engine/*.py`` with a ``.pxd`` beside it) is compiled from the same source that runs interpreted. None
when FASTLEASE_NO_EXTENSIONS=1 or off CPython.

Where they cannot be compiled (no C compiler, no Python headers, no Cython), the package installs with
the interpreted engine and the build says so; fastlease also warns at import.
FASTLEASE_REQUIRE_EXTENSIONS=1 makes that a build error instead: release builds set it, so no wheel
ships without its compiled modules.
"""

import os
import platform
import sys
import zlib

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

FALLBACK_WARNING = """
********************************************************************************
WARNING: fastlease's compiled engine could not be built ({reason}).
fastlease will use its pure-Python engine: the same protocol, with more client CPU per lock operation.
Install a C compiler and the Python headers, then reinstall, to get the compiled engine.
********************************************************************************
"""


def flag(name):
    return os.environ.get(name, "") not in ("", "0")


#: Compile this many extensions at once (one C compiler each) unless the build is told otherwise
#: (``build_ext -j``): the ten modules take over a minute one after another, and every fresh venv (CI
#: builds four) compiles them all.
PARALLEL = os.cpu_count() or 1


class OptionalBuildExt(build_ext):
    """build_ext that falls back to the interpreted engine instead of failing the install."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = PARALLEL

    def run(self):
        try:
            super().run()
        except Exception as error:  # no compiler at all is raised here, before any extension
            self.fall_back(error)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as error:  # a compiler that fails: missing headers, a broken toolchain
            self.fall_back(error)

    def fall_back(self, error):
        if flag("FASTLEASE_REQUIRE_EXTENSIONS"):
            raise error
        print(FALLBACK_WARNING.format(reason=f"{type(error).__name__}: {error}"), flush=True)


def source_crc(paths):
    """The CRC-32 of a module's sources (one after the other), compiled into it: at import fastlease
    compares it with the sources beside the module and, when they differ (a checkout changed, the module
    was not rebuilt), runs the source instead of a stale build (fastlease/_impl.py)."""
    crc = 0
    for path in paths:
        with open(path, "rb") as source:
            crc = zlib.crc32(source.read(), crc)
    return f"{crc:08x}"


#: The engine's modules: each ``.py`` beside a ``.pxd`` in src/fastlease/_engine (the package's face,
#: ``__init__.py``, has none and stays interpreted).
ENGINE_MODULES = sorted(name[:-4] for name in os.listdir("src/fastlease/_engine") if name.endswith(".pxd"))


def compiled(name, path, headers=()):
    """The extension ``name`` from ``path``, with the C ``headers`` it includes (rebuilt when they change,
    and counted in its source CRC after ``path``)."""
    crc = source_crc([path, *headers])
    return Extension(name, [path], depends=list(headers), define_macros=[("FASTLEASE_SOURCE_CRC", f'"{crc}"')])


def extensions():
    if flag("FASTLEASE_NO_EXTENSIONS") or platform.python_implementation() != "CPython":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError as error:
        if flag("FASTLEASE_REQUIRE_EXTENSIONS"):
            raise
        print(FALLBACK_WARNING.format(reason=f"Cython is not installed: {error}"), flush=True)
        return []
    return cythonize(
        [
            compiled("fastlease._core", "src/fastlease/_core.pyx", ["src/fastlease/_pulse.h"]),
            *(compiled(f"fastlease._engine.{name}", f"src/fastlease/_engine/{name}.py") for name in ENGINE_MODULES),
        ],
        compiler_directives={"language_level": "3"},
        # Cython's own translation in worker processes too, where they fork (spawn would run setup.py again).
        nthreads=PARALLEL if sys.platform.startswith("linux") else 0,
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
