"""The import graph of ``src/fastlease``: no cycles, and every layer imports only downwards.

The layers (docs/architecture.md): the public API on top, the engine below it, the stores at the
bottom, and ``exceptions`` under all three. Every import statement counts, including those inside
functions (which could otherwise hide a cycle); only ``if TYPE_CHECKING:`` blocks, which never run,
are left out. Packages' ``__init__`` modules count as modules of their own: a face that gathers names
must still import only its own layer or below.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from types import MappingProxyType
from typing import AbstractSet, Mapping

import pytest

import fastlease

ROOT = Path(fastlease.__file__).parent
PACKAGE = "fastlease"

#: Modules of the engine layer besides the engine package (``fastlease._engine`` and its modules): its
#: native core and fallback, the selector, and the renewal process's two sides.
ENGINE = frozenset({"fastlease._core", "fastlease._core_fallback", "fastlease._impl",
                    "fastlease._renewal_link", "fastlease._renewal_process"})
ENGINE_PACKAGE = "fastlease._engine"
#: Imported by every layer.
SHARED = frozenset({"fastlease.exceptions", "fastlease._logging", "fastlease._typing"})


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (compiled-only modules by their source)."""
    found: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*")):
        if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
            continue
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if path.name == "__init__.py" else parts)] = path
    return found


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules that ``module`` imports when it runs."""
    if path.suffix == ".pyx":
        source = "\n".join(line for line in path.read_text().splitlines()
                           if not line.lstrip().startswith(("cimport ", "from cpython", "from libc", "cdef ")))
        tree = ast.parse(source) if _parses(source) else ast.parse("")
    else:
        tree = ast.parse(path.read_text())
    package = _package_of(module, path)
    targets: set[str] = set()

    def resolve(base: str, names: list[str]) -> None:
        for name in names:
            candidate = f"{base}.{name}" if base else name
            if candidate in known:
                targets.add(candidate)
            elif base in known:
                targets.add(base)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE):
                    resolve(alias.name, [])
                    if alias.name in known:
                        targets.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base.startswith(PACKAGE):
                resolve(base, [alias.name for alias in node.names])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    targets.discard(module)
    return targets


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


@functools.cache
def graph() -> Mapping[str, frozenset[str]]:
    """Each module's imports of the package. Parsed once per run (every source of the package, about
    0.35 s) and shared by the tests below, so it is read-only."""
    known = module_names()
    return MappingProxyType({name: frozenset(imports_of(name, path, known)) for name, path in known.items()})


def layer(module: str) -> int:
    if module in SHARED:
        return 0
    if module.startswith("fastlease.stores."):
        return 1
    if module in ENGINE or module == ENGINE_PACKAGE or module.startswith(ENGINE_PACKAGE + "."):
        return 2
    return 3  # the public API: guards, decorator, async, clients, idempotency, testing, the CLI


def find_cycle(edges: Mapping[str, AbstractSet[str]]) -> list[str]:
    """One import cycle as a path that starts and ends on the same module, or [] when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = walk(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for start in sorted(edges):
        if start not in state:
            found = walk(start)
            if found:
                return found
    return []


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking_blocks():
    edges = graph()
    # fastlease.dynamodb imports the fast path inside DynamoDBClient.__init__ only.
    assert "fastlease.stores.dynamodb.fastpath" in edges["fastlease.dynamodb"]
    # the engine names its observer's Lease only for the type checker: no edge from engine up to lease.
    assert "fastlease._engine.lease" not in edges["fastlease._engine.engine"]
    assert {"fastlease._engine", "fastlease._engine.lease", "fastlease.stores.sqlite", "fastlease.lock"} <= set(edges)


def test_there_are_no_import_cycles():
    assert find_cycle(graph()) == []


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(graph()))
def test_every_module_imports_only_its_own_layer_or_below(module):
    upward = sorted(target for target in graph()[module] if layer(target) > layer(module))
    assert not upward, f"{module} (layer {layer(module)}) imports from above: {upward}"


def test_stores_import_nothing_of_the_engine_or_the_api():
    edges = graph()
    stores = [name for name in edges if name.startswith("fastlease.stores.")]
    assert stores
    for store in stores:
        assert edges[store] <= SHARED | set(stores), (store, edges[store])


def test_the_engine_imports_only_its_own_modules_its_native_core_the_store_rules_and_the_exceptions():
    edges = graph()
    modules = {name for name in edges if name == ENGINE_PACKAGE or name.startswith(ENGINE_PACKAGE + ".")}
    assert len(modules) >= 8, modules  # the face and its seven pairs
    allowed = modules | {"fastlease._core", "fastlease._core_fallback", "fastlease.stores.base", *SHARED}
    for module in modules:
        assert edges[module] <= allowed, (module, edges[module] - allowed)


def test_the_engine_modules_import_only_those_before_them():
    """The order the engine's face lists them in (``MODULES``) is the order they may import each other."""
    order = [module.__name__ for module in fastlease._impl.load("py").MODULES]
    order = [name.replace("fastlease._engine_py.", ENGINE_PACKAGE + ".") for name in order]
    edges = graph()
    for index, module in enumerate(order):
        later = {name for name in edges[module] if name.startswith(ENGINE_PACKAGE + ".")} - set(order[:index])
        assert not later, f"{module} imports {sorted(later)}, which come after it in MODULES"
