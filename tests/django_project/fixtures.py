"""The fixtures of the Django tests (a plugin that their modules name in ``pytest_plugins``): Django set
up once per pytest process on this project (``django_setup``), and the database alias of each test, on
SQLite or PostgreSQL, with its tables made by the ``fastlease`` management command (``django_alias``).

Settings are read once per process, so the project's databases are fixed at set-up: ``default`` on a
SQLite file of the session and, when the session's PostgreSQL server runs, ``postgres`` on it. The
environment variables that name them are set only while Django reads its settings, then restored;
:func:`server_environment` gives them to a server process started by a test."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

import django
import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import override_settings

from django_project.environment import DATABASE_VARIABLE, POSTGRES_VARIABLE, SQLITE_VARIABLE
from fastlease.django import close_client

#: The aliases of the project's databases, by the store they are on.
ALIASES = {"sqlite": "default", "postgres": "postgres"}


class Project(NamedTuple):
    """The databases Django was set up with."""

    sqlite_path: Path
    postgres_dsn: Optional[str]


_project: Optional[Project] = None  # set once per process, by the first test that needs Django


def _environment(project: Project, alias: str) -> dict[str, str]:
    variables = {"DJANGO_SETTINGS_MODULE": "django_project.settings",
                 SQLITE_VARIABLE: str(project.sqlite_path),
                 DATABASE_VARIABLE: alias}
    if project.postgres_dsn is not None:
        variables[POSTGRES_VARIABLE] = project.postgres_dsn
    return variables


def server_environment(project: Project, alias: str) -> dict[str, str]:
    """The environment of a server process that serves this project with its leases on ``alias``."""
    return {**os.environ, **_environment(project, alias)}


@pytest.fixture(scope="session")
def django_setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Project:
    """Django, set up on this project (once per process, whichever test module asks first)."""
    global _project
    if _project is None:
        try:
            dsn: Optional[str] = request.getfixturevalue("postgres_dsn")
        except pytest.skip.Exception:  # no PostgreSQL here (never in CI, where the fixture fails instead)
            dsn = None
        project = Project(tmp_path_factory.mktemp("django") / "site.db", dsn)
        variables = _environment(project, "default")
        saved = {name: os.environ.get(name) for name in variables}
        os.environ.update(variables)
        try:
            django.setup()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        _project = project
    return _project


@pytest.fixture(params=sorted(ALIASES))
def django_alias(request: pytest.FixtureRequest, django_setup: Project) -> Iterator[str]:
    """The alias of this test's database (the test's id names its store), with the leases' client on it,
    the Execution table and the lock tables ``locks`` and ``payments`` made. SQLite's file is the
    session's (tests use keys of their own); PostgreSQL's schema is emptied for each test."""
    from django_project.models import Execution

    alias = ALIASES[request.param]
    connections.close_all()
    close_client()
    if request.param == "postgres":
        if django_setup.postgres_dsn is None:
            request.getfixturevalue("postgres_dsn")  # skips, as every PostgreSQL test does without a server
        request.getfixturevalue("postgres_db")
    overridden = override_settings(FASTLEASE={"DATABASE": alias})
    overridden.enable()
    try:
        connection = connections[alias]
        if Execution._meta.db_table not in connection.introspection.table_names():
            with connection.schema_editor() as editor:
                editor.create_model(Execution)
        call_command("fastlease", "createtables", "--lock-table", "locks", "--idempotency-table", "payments",
                     stdout=io.StringIO())
        yield alias
    finally:
        overridden.disable()
        close_client()
        connections.close_all()
