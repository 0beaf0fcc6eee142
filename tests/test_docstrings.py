"""Every public symbol has a docstring (the style guide's convention 10).

Checked: every name in ``__all__`` of the public entry modules; every public class and function defined
in the store, lock, async and client modules; and the public methods and properties of all those
classes, including what they inherit from fastlease classes (not from the standard library). An
override without a docstring of its own counts as documented when the fastlease class it overrides
documents it. Constants cannot carry a docstring: they need a ``#:`` comment (Sphinx's form) on the
line above their assignment, in the module that assigns them.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import types
from typing import Any, Iterator, List, Optional

import pytest

#: Modules whose ``__all__`` names must all be documented.
ALL_MODULES = ("fastlease", "fastlease.exceptions", "fastlease.idempotency", "fastlease.idempotency.fastapi",
               "fastlease.idempotency.http", "fastlease.testing", "fastlease.celery", "fastlease.django",
               "fastlease.django.idempotency")
#: Modules whose public classes and functions (those they define) must all be documented.
DEFINING_MODULES = (
    "fastlease.lock",
    "fastlease.aio",
    "fastlease.client",
    "fastlease.stores",
    "fastlease.stores.base",
    "fastlease.stores.memory",
    "fastlease.stores.sqlite",
    "fastlease.stores.redis.store",
    "fastlease.stores.redis.scripts",
    "fastlease.stores.redis.cluster",
    "fastlease.stores.dynamodb.store",
    "fastlease.stores.dynamodb.transport",
    # Beyond the brief's minimum: the rest of the public surface is documented too.
    "fastlease.decorator",
    "fastlease.semaphores",
    "fastlease.election",
    "fastlease.dynamodb",
    "fastlease.pydynox_compat",
    "fastlease._offloop",
    "fastlease.observations",
    "fastlease.otel",
    "fastlease.cli",
    "fastlease._store_factory",
    "fastlease.demo",
    "fastlease.django.apps",
    "fastlease.django.management.commands.fastlease",
    "fastlease.testing.redis_server",
    "fastlease.testing.moto_server",
)
#: Modules that need moto's server mode to import: marked ``server``, as the wheel tests do not install it.
SERVER_MODULES = frozenset({"fastlease.testing.moto_server"})


def _public(name: str) -> bool:
    return not name.startswith("_")


def _own_doc(obj: Any) -> Optional[str]:
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return doc.strip() if isinstance(doc, str) and doc.strip() else None


def _is_routine(value: Any) -> bool:
    return isinstance(value, (types.FunctionType, property, classmethod, staticmethod))


def _fastlease_classes(cls: type) -> List[type]:
    return [klass for klass in cls.__mro__ if klass.__module__.split(".")[0] == "fastlease"]


def _missing_members(cls: type) -> Iterator[str]:
    """Public methods and properties of ``cls`` (own or from fastlease bases) without a docstring."""
    classes = _fastlease_classes(cls)
    names = {name for klass in classes for name, value in vars(klass).items() if _public(name) and _is_routine(value)}
    for name in sorted(names):
        definitions = [vars(klass)[name] for klass in classes if name in vars(klass)]
        if not _is_routine(definitions[0]):
            continue  # a data attribute overriding a method is not a method here
        if not any(_own_doc(definition.__func__ if isinstance(definition, (classmethod, staticmethod))
                                else definition) for definition in definitions):
            yield f"{cls.__module__}.{cls.__qualname__}.{name}"


def _has_doc_comment(module: types.ModuleType, name: str, seen: Optional[set[str]] = None) -> bool:
    """A ``#:`` comment above ``name``'s assignment in ``module``, or in the module it is imported from."""
    seen = seen if seen is not None else set()
    if module.__name__ in seen:
        return False
    seen.add(module.__name__)
    source = inspect.getsource(module)
    lines = source.splitlines()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return node.lineno >= 2 and lines[node.lineno - 2].lstrip().startswith("#:")
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
            package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
            origin = importlib.import_module("." * node.level + (node.module or ""), package) if node.level else \
                importlib.import_module(node.module or "")
            return _has_doc_comment(origin, name, seen)
    return False


def _missing_in(module_name: str) -> List[str]:
    module = importlib.import_module(module_name)
    missing: List[str] = []
    if module_name in ALL_MODULES:
        candidates = [(name, getattr(module, name)) for name in module.__all__]
    else:
        candidates = [(name, value) for name, value in vars(module).items()
                      if _public(name) and (isinstance(value, type) or inspect.isfunction(value))
                      and value.__module__ == module_name]
    for name, value in candidates:
        if isinstance(value, type) or inspect.isroutine(value):
            if _own_doc(value) is None:
                missing.append(f"{module_name}.{name}")
            if isinstance(value, type):
                missing += _missing_members(value)
        elif not _has_doc_comment(module, name):
            missing.append(f"{module_name}.{name} (a constant: needs a '#:' comment above its assignment)")
    return missing


@pytest.mark.parametrize("module_name", [
    pytest.param(name, marks=pytest.mark.server) if name in SERVER_MODULES else name
    for name in ALL_MODULES + DEFINING_MODULES
])
def test_public_symbols_have_docstrings(module_name: str) -> None:
    missing = sorted(set(_missing_in(module_name)))
    assert not missing, f"{len(missing)} public symbols without a docstring:\n  " + "\n  ".join(missing)


def test_the_check_finds_undocumented_symbols() -> None:
    module = types.ModuleType("fastlease._docstring_probe")
    exec(  # noqa: S102 - a fixed probe module
        "class Documented:\n"
        "    '''Has one.'''\n"
        "    def method(self):\n"
        "        '''Has one.'''\n"
        "class Bare(Documented):\n"
        "    def method(self):\n"  # an override: documented by its base
        "        pass\n"
        "    def other(self):\n"
        "        pass\n"
        "    @property\n"
        "    def size(self):\n"
        "        return 0\n"
        "class Failure(Exception):\n"  # not documented by Exception's own docstring
        "    pass\n",
        module.__dict__,
    )
    sys.modules[module.__name__] = module
    try:
        assert list(_missing_members(module.Bare)) == [
            "fastlease._docstring_probe.Bare.other", "fastlease._docstring_probe.Bare.size"
        ]
        assert _own_doc(module.Bare) is None and _own_doc(module.Failure) is None
        assert _own_doc(module.Documented) == "Has one."
    finally:
        del sys.modules[module.__name__]
