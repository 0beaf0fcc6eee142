"""Rooms sized by job (docs/architecture.md, "Sizes"): no source file of the package over 600 lines and no
Python function over 60, so that a new primitive gets a module of its own instead of growing one past
what a reader holds in mind. A function's lines run from its ``def`` to its last line (decorators
excluded, docstring included)."""

from __future__ import annotations

import ast
from pathlib import Path

import fastlease

ROOT = Path(fastlease.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
SOURCE_SUFFIXES = (".py", ".pyx", ".pxd", ".h")


def sources() -> list[Path]:
    found = [path for path in sorted(ROOT.rglob("*"))
             if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts]
    # An installed wheel has only the .py sources: those are checked there, and everything in a source tree.
    assert any(path.name == "lease.py" for path in found), f"no engine sources under {ROOT}"
    return found


def test_no_source_file_is_over_600_lines():
    long = {str(path.relative_to(ROOT)): lines for path in sources()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by job: {long}"


def test_no_function_is_over_60_lines():
    long = {}
    for path in sources():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"split these by job: {long}"
