"""The test project's settings. The databases come from the environment, set by the tests' fixture
(``django_project.fixtures``) before Django starts, and inherited by the gunicorn it runs:

* ``FASTLEASE_DJANGO_SQLITE``: the SQLite file of the ``default`` database (required);
* ``FASTLEASE_DJANGO_POSTGRES_DSN``: a PostgreSQL DSN, which becomes the ``postgres`` database;
* ``FASTLEASE_DJANGO_DATABASE``: the alias that leases and the views' writes use (default ``default``).
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from django_project.environment import DATABASE_VARIABLE, POSTGRES_VARIABLE, SQLITE_VARIABLE

SECRET_KEY = "fastlease-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
ROOT_URLCONF = "django_project.urls"
INSTALLED_APPS = ["rest_framework", "fastlease.django", "django_project"]
MIDDLEWARE: list[str] = []  # no sessions, no CSRF: the API views are called by machines
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# No django.contrib.auth: DRF's views need no users here.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_USER": None,
}

if SQLITE_VARIABLE not in os.environ:
    raise ImproperlyConfigured(f"set {SQLITE_VARIABLE} to the SQLite file of the test project's default database")
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ[SQLITE_VARIABLE],
                         # SQLite takes its write lock at BEGIN: check_in and concurrent writers never deadlock.
                         "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20}}}
if os.environ.get(POSTGRES_VARIABLE):
    from psycopg.conninfo import conninfo_to_dict

    _dsn = conninfo_to_dict(os.environ[POSTGRES_VARIABLE])
    DATABASES["postgres"] = {
        "ENGINE": "django.db.backends.postgresql", "NAME": _dsn.get("dbname", ""), "USER": _dsn.get("user", ""),
        "PASSWORD": _dsn.get("password", ""), "HOST": _dsn.get("host", ""), "PORT": _dsn.get("port", ""),
    }

# Aliases that the settings tests point FASTLEASE at, which fastlease must refuse (never connected to).
DATABASES["memory"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
DATABASES["oracle"] = {"ENGINE": "django.db.backends.oracle", "NAME": "orcl"}

FASTLEASE = {"DATABASE": os.environ.get(DATABASE_VARIABLE, "default")}
