"""Builds the one compiled extension, fastlease._core; none when FASTLEASE_NO_EXTENSIONS=1 or off CPython."""

import os
import platform

from setuptools import setup

ext_modules = []
if os.environ.get("FASTLEASE_NO_EXTENSIONS", "") in ("", "0") and platform.python_implementation() == "CPython":
    from Cython.Build import cythonize
    from setuptools import Extension

    ext_modules = cythonize(
        [Extension("fastlease._core", ["src/fastlease/_core.pyx"])],
        compiler_directives={"language_level": "3"},
    )

setup(ext_modules=ext_modules)
