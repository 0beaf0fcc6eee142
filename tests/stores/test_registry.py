"""The one list of backends (``fastlease.stores.registry``) agrees with the code it names."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import fastlease
from fastlease import _store_factory
from fastlease.stores.registry import BACKENDS, backend, load, store_class

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.mark.parametrize("kind", list(BACKENDS))
def test_each_backend_names_an_adapter_of_its_kind_and_a_client_the_package_exports(kind):
    entry = backend(kind)
    adapter = store_class(kind)
    assert adapter.kind == kind  # the first field of its renewal_config(), which the renewal process reads
    client = load(entry.client)
    assert getattr(fastlease, entry.client_name) is client
    if kind != "memory":  # an in-process store is never renewed by another process
        assert callable(adapter.from_renewal_config) and callable(adapter.renewal_config)


def test_each_optional_library_is_an_extra_of_the_package():
    if not PYPROJECT.exists():
        pytest.skip("an installed wheel: no pyproject.toml beside the tests")
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for entry in BACKENDS.values():
        if entry.library is not None:
            module, _name, extra = entry.library
            assert extra in extras, entry
            assert any(requirement.startswith(module) for requirement in extras[extra]), entry


def test_the_command_line_offers_the_backends_marked_for_it():
    assert _store_factory.STORES == ("sqlite", "dynamodb", "redis", "postgres", "memory")
    assert "redis-cluster" in BACKENDS and "redis-cluster" not in _store_factory.STORES


def test_an_unknown_kind_is_refused_naming_the_kinds():
    with pytest.raises(ValueError, match=r"unknown store kind 'etcd'; the kinds are sqlite, dynamodb, redis, "
                                         r"redis-cluster, postgres, memory"):
        store_class("etcd")
