"""The supported Python versions, listed once (``SUPPORTED``) and checked against every setting of
pyproject.toml that names them: requires-python, the classifiers, the cibuildwheel build selection
(with the free-threaded builds and their classifier) and mypy's target. pyproject.toml is beside the
tests in a checkout, an sdist and the wheel's copy of the suite, so these run everywhere."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: CPython 3.11 to 3.14, oldest first: 3.9 and 3.10 are past their end of life.
SUPPORTED = ("3.11", "3.12", "3.13", "3.14")
#: The free-threaded builds that wheels are built for (3.13t and 3.14t).
FREE_THREADED = ("3.13", "3.14")
#: Their support level (pyproject.toml says why it is "1 - Unstable").
FREE_THREADING_CLASSIFIER = "Programming Language :: Python :: Free Threading :: 1 - Unstable"


def _pyproject() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)


def _abi_tag(version: str) -> str:
    return "cp" + version.replace(".", "")


def test_requires_python_is_the_oldest_supported_version() -> None:
    assert _pyproject()["project"]["requires-python"] == f">={SUPPORTED[0]}"


def test_the_version_classifiers_are_the_supported_versions() -> None:
    classifiers = _pyproject()["project"]["classifiers"]
    versions = [classifier.rsplit(" :: ", 1)[1] for classifier in classifiers
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", classifier)]
    assert versions == list(SUPPORTED)


def test_cibuildwheel_builds_the_supported_versions_and_their_free_threaded_builds() -> None:
    cibuildwheel = _pyproject()["tool"]["cibuildwheel"]
    assert cibuildwheel["build"] == ([f"{_abi_tag(version)}-*" for version in SUPPORTED]
                                     + [f"{_abi_tag(version)}t-*" for version in FREE_THREADED])
    # cibuildwheel 3.x builds 3.13t only behind this (deprecated) enable; 3.14t needs none.
    assert ("cpython-freethreading" in cibuildwheel.get("enable", [])) == ("3.13" in FREE_THREADED)
    assert not any(_abi_tag(version) in pattern for pattern in cibuildwheel.get("skip", []) for version in SUPPORTED)


def test_free_threaded_wheels_are_declared_with_one_support_level() -> None:
    declared = [classifier for classifier in _pyproject()["project"]["classifiers"]
                if classifier.startswith("Programming Language :: Python :: Free Threading")]
    assert declared == ([FREE_THREADING_CLASSIFIER] if FREE_THREADED else [])


def test_mypy_targets_the_oldest_supported_version() -> None:
    assert _pyproject()["tool"]["mypy"]["python_version"] == SUPPORTED[0]


def test_this_interpreter_is_a_supported_version() -> None:
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in SUPPORTED, sys.version
