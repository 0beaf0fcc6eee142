"""Django integration (``pip install 'fastlease[django]'``): a lease client made from your settings,
``check_in`` inside ``transaction.atomic()``, idempotent views (``fastlease.django.idempotency``) and the
``fastlease`` management command. Add the app, and say where the leases live::

    INSTALLED_APPS = [..., "fastlease.django"]
    FASTLEASE = {"DATABASE": "default"}       # the default: your "default" database

``FASTLEASE`` takes one of ``DATABASE`` (an alias of ``DATABASES``, on PostgreSQL or SQLite; the
client opens connections of its own to that database), ``POSTGRES_DSN`` (a PostgreSQL connection
string) or ``SQLITE_PATH`` (a SQLite file), and ``CLIENT_OPTIONS``, keyword arguments for the client
(say ``{"shared_observations": True}``). :func:`get_client` returns the client of this process, made
at its first call, in the process that calls it (a worker forked after that makes its own).

:func:`check_in` runs ``lease.check_in`` on Django's own connection, inside your atomic block, so the
block commits only while the lease is held (the lock table must be on that database).

Nothing here needs configured settings until it is called: importing this module reads none. Bad
settings raise ``django.core.exceptions.ImproperlyConfigured``, naming the setting and the fix.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from .._store_factory import StoreOptions
from ..client import LeaseClient
from ..postgres import PostgresClient
from ..sqlite import SQLiteClient

__all__ = ["SETTING", "check_in", "close_client", "get_client", "store_options"]

#: The name of the settings dict.
SETTING = "FASTLEASE"
#: The keys ``FASTLEASE`` may have; at most one of the first three.
SETTING_KEYS = ("DATABASE", "POSTGRES_DSN", "SQLITE_PATH", "CLIENT_OPTIONS")
#: The ENGINEs of Django's own backends (GeoDjango's too) that a ``DATABASE`` alias may be on, and the
#: store each one is.
ENGINE_STORES = {
    "django.db.backends.postgresql": "postgres",
    "django.contrib.gis.db.backends.postgis": "postgres",
    "django.db.backends.sqlite3": "sqlite",
    "django.contrib.gis.db.backends.spatialite": "sqlite",
}
#: The same by the backend's ``vendor``, for backends of other packages (say, one that wraps PostgreSQL's).
SUPPORTED_VENDORS = {"postgresql": "postgres", "sqlite": "sqlite"}
#: SQLite NAMEs of a database in memory (so is a URI filename with ``mode=memory``).
_MEMORY_SQLITE = (":memory:", "")

# The client of this process: (pid, client). Written under _lock by the first caller in each process;
# read without it (one tuple, replaced whole). A forked child sees its parent's pid and makes its own.
_cached: Optional[tuple[int, LeaseClient]] = None
_lock = threading.Lock()


def _renew_lock_in_child() -> None:
    """A fork can happen while another thread holds ``_lock``: the child gets a fresh one."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)


def _settings() -> dict[str, Any]:
    """``settings.FASTLEASE``, checked (read at each use: tests may override it)."""
    configured = getattr(settings, SETTING, {})
    if not isinstance(configured, dict):
        raise ImproperlyConfigured(f"settings.{SETTING} must be a dict such as {{'DATABASE': 'default'}}, "
                                   f"got {type(configured).__name__}")
    unknown = sorted(set(configured) - set(SETTING_KEYS))
    if unknown:
        raise ImproperlyConfigured(f"settings.{SETTING} has unknown keys {unknown}: it takes {', '.join(SETTING_KEYS)}")
    stores = [key for key in SETTING_KEYS[:3] if configured.get(key) is not None]
    if len(stores) > 1:
        raise ImproperlyConfigured(f"settings.{SETTING} names its store {len(stores)} times ({', '.join(stores)}): "
                                   f"keep one")
    return configured


def store_options() -> StoreOptions:
    """Where ``settings.FASTLEASE`` puts the leases, as the ``fastlease`` command's store options
    (``StoreOptions("postgres", dsn=...)`` or ``StoreOptions("sqlite", path=...)``; the DSN may hold
    the database's password, so never print it). Raises ImproperlyConfigured for a setting that names
    no usable store: an unknown alias, another database engine, an in-memory SQLite database."""
    configured = _settings()
    if configured.get("POSTGRES_DSN") is not None:
        return StoreOptions("postgres", dsn=str(configured["POSTGRES_DSN"]))
    if configured.get("SQLITE_PATH") is not None:
        return StoreOptions("sqlite", path=os.fspath(configured["SQLITE_PATH"]))
    return _database_options(configured.get("DATABASE", DEFAULT_DB_ALIAS))


def _database_options(alias: str) -> StoreOptions:
    """The store options of the database ``alias``, from the settings its connection uses (which the
    test runner changes to its test database's)."""
    if alias not in connections.settings:
        raise ImproperlyConfigured(f"settings.{SETTING}['DATABASE'] is {alias!r}, which is not in settings.DATABASES "
                                   f"(its aliases: {', '.join(map(repr, connections.settings))})")
    # The dict its connection uses (never a connection: a backend whose driver is missing stays unloaded).
    database = connections.settings[alias]
    store = ENGINE_STORES.get(database["ENGINE"]) or _store_of_vendor(alias)
    if store is None:
        raise ImproperlyConfigured(
            f"fastlease cannot keep leases on DATABASES[{alias!r}], whose ENGINE is {database['ENGINE']!r}: it "
            f"supports PostgreSQL (django.db.backends.postgresql) and SQLite (django.db.backends.sqlite3). Point "
            f"settings.{SETTING}['DATABASE'] at such a database, or set {SETTING}['POSTGRES_DSN'] or "
            f"{SETTING}['SQLITE_PATH'] (or use fastlease's other clients directly)")
    if store == "postgres":
        return StoreOptions("postgres", dsn=_conninfo(database))
    name = os.fspath(database["NAME"] or "")
    if name in _MEMORY_SQLITE or "mode=memory" in name:
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] is an in-memory SQLite database ({name!r}), which fastlease's own connections "
            f"cannot share: give it a file as NAME (under the test runner, TEST's NAME too)")
    return StoreOptions("sqlite", path=name)


def _store_of_vendor(alias: str) -> Optional[str]:
    """The store of a backend that is not Django's own, by its vendor; None if it is unsupported, or if
    its module cannot even be loaded (its driver is missing)."""
    try:
        vendor = connections[alias].vendor  # (loads the backend)
    except (ImportError, ImproperlyConfigured):
        return None
    return SUPPORTED_VENDORS.get(vendor)


def _conninfo(database: dict[str, Any]) -> str:
    """A libpq connection string from a DATABASES entry: NAME, USER, PASSWORD, HOST, PORT and the
    ``OPTIONS`` that are libpq keywords (Django's own, such as ``pool`` or ``isolation_level``, are not)."""
    from psycopg import pq  # (psycopg is needed on PostgreSQL only)
    from psycopg.conninfo import make_conninfo

    keywords = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    params = {name: value for name, value in (database.get("OPTIONS") or {}).items() if name in keywords}
    # NAME None connects to the "postgres" database, as Django's own backend does.
    params["dbname"] = "postgres" if database.get("NAME", "") is None else database.get("NAME", "")
    for keyword, setting in (("user", "USER"), ("password", "PASSWORD"), ("host", "HOST"), ("port", "PORT")):
        params[keyword] = database.get(setting)
    return make_conninfo("", **{name: str(value) for name, value in params.items() if value not in (None, "")})


def _new_client() -> LeaseClient:
    configured = _settings()
    options = store_options()
    extra = configured.get("CLIENT_OPTIONS") or {}
    if not isinstance(extra, dict):
        raise ImproperlyConfigured(f"settings.{SETTING}['CLIENT_OPTIONS'] must be a dict of the client's keyword "
                                   f"arguments, got {type(extra).__name__}")
    try:
        if options.store == "postgres":
            return PostgresClient(options.dsn, **extra)
        return SQLiteClient(str(options.path), **extra)
    except (TypeError, ValueError) as error:
        client = "PostgresClient" if options.store == "postgres" else "SQLiteClient"
        raise ImproperlyConfigured(f"settings.{SETTING} makes no {client}: {error}") from error


def get_client() -> LeaseClient:
    """The lease client of this process, made from ``settings.FASTLEASE`` at the first call (a
    :class:`~fastlease.PostgresClient` or :class:`~fastlease.SQLiteClient`). Every call in the process
    returns it; a forked child makes its own. Raises ImproperlyConfigured for bad settings."""
    global _cached
    pid = os.getpid()
    cached = _cached
    if cached is not None and cached[0] == pid:
        return cached[1]
    with _lock:
        cached = _cached
        if cached is None or cached[0] != pid:
            cached = _cached = (pid, _new_client())  # a parent's client is dropped, never used or closed here
        return cached[1]


def close_client() -> None:
    """Close this process's client, if it has made one; the next :func:`get_client` makes a new one
    from the settings then in force. Called when a test changes ``FASTLEASE`` or ``DATABASES``
    (``override_settings``), once the app is installed."""
    global _cached
    with _lock:
        cached, _cached = _cached, None
    if cached is not None and cached[0] == os.getpid():
        cached[1].close()


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    """Receiver of Django's ``setting_changed``: the client follows its settings."""
    if setting in (SETTING, "DATABASES"):
        close_client()


def check_in(lease: Any, using: str = DEFAULT_DB_ALIAS) -> None:
    """``lease.check_in`` on Django's connection ``using``, inside your ``transaction.atomic(using=...)``
    block: the block commits only while the lease is held. ``lease`` is a lease (a guard, a semaphore
    slot, an election term) or an :class:`~fastlease.idempotency.IdempotentCall`, of a client on the
    same database (PostgreSQL: the same database and search_path; SQLite: the same file).

    Raises ``django.db.transaction.TransactionManagementError`` outside an atomic block, or in one that
    has already failed; ``fastlease.LockLost`` if the lease is lost (taken over, expired); ValueError
    for a connection on another database. Any failure also marks the atomic block for rollback, so
    its writes are rolled back even if the exception is caught inside it.
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            f"fastlease.django.check_in(lease, using={using!r}) runs inside transaction.atomic(using={using!r}), "
            "whose commit it guards: put the writes and the check_in in one atomic block")
    if connection.needs_rollback:
        raise transaction.TransactionManagementError(
            f"check_in: the atomic block on {using!r} has already failed (an error inside it was caught), so it "
            "will roll back: leave the block, and check in within a new one")
    connection.ensure_connection()
    try:
        lease.check_in(connection.connection)
    except BaseException:
        transaction.set_rollback(True, using=using)
        raise
