"""The one store factory of the ``fastlease`` command and its demo: what ``--store`` and its options mean.

``cli.py`` and ``demo.py`` both build their clients here, so an option means the same thing in each
and a bad one gets the same message. They differ only in what they do when an option is left out,
before calling in: the inspecting commands read ``./fastlease.db``, the Redis at
``$FASTLEASE_REDIS_URL`` (else 127.0.0.1:6379) and the PostgreSQL at ``$FASTLEASE_POSTGRES_DSN`` (else
they refuse to guess), while the demo makes a temporary file and starts a moto server, a
``redis-server`` or a throwaway PostgreSQL cluster of its own.

Clients whose store needs an optional library (boto3, redis-py, psycopg) are imported only when that
store is chosen, so the command starts without them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Optional, Sequence

from .client import LeaseClient
from .memory import MemoryClient
from .sqlite import SQLiteClient
from .stores.memory import MemoryStore
from .stores.registry import BACKENDS

#: The values of --store, in the order messages list them.
STORES = tuple(kind for kind, backend in BACKENDS.items() if backend.command_line)
DEFAULT_SQLITE_PATH = "fastlease.db"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_URL_VARIABLE = "FASTLEASE_REDIS_URL"
POSTGRES_DSN_VARIABLE = "FASTLEASE_POSTGRES_DSN"
#: The shape of a DSN, for messages that ask for one.
DSN_EXAMPLE = "postgresql://USER@HOST:5432/DBNAME"



class StoreOptionError(ValueError):
    """A store option that cannot work as given; the message names the value and how to fix it."""


class BadOption(StoreOptionError):
    """A value that no command line should give (an unknown store, a demo size out of range, a DSN that
    cannot be one): the command exits 2, as for any bad command line."""


class BadConnectionString(BadOption):
    """A PostgreSQL DSN (``--dsn`` or ``$FASTLEASE_POSTGRES_DSN``) that cannot be a connection string: a
    bad command line, so the command exits 2. The message hides any password."""


@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """The store options of the command line, None where not given. Picklable: the demo sends them
    to its worker processes.

    ``store`` is ``--store``; ``path`` is ``--path`` (the SQLite file); ``endpoint_url`` and
    ``region`` are ``--endpoint-url`` and ``--region`` (DynamoDB; None: the AWS configuration);
    ``url`` is ``--url`` (the Redis URL); ``dsn`` is ``--dsn`` (the PostgreSQL connection string).
    """

    store: str = "sqlite"
    path: Optional[str] = None
    endpoint_url: Optional[str] = None
    region: Optional[str] = None
    url: Optional[str] = None
    dsn: Optional[str] = None

    def __post_init__(self) -> None:
        if self.store not in STORES:
            raise BadOption(f"unknown store {self.store!r}; pass --store {_alternatives(STORES)}")


def _alternatives(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1]


def redis_url_from_environment(options: StoreOptions) -> Optional[str]:
    """``--url``, else ``$FASTLEASE_REDIS_URL``, else None (the caller picks the fallback)."""
    return options.url or os.environ.get(REDIS_URL_VARIABLE) or None


def postgres_dsn_from_environment(options: StoreOptions) -> Optional[str]:
    """``--dsn``, else ``$FASTLEASE_POSTGRES_DSN``, else None (the demo then starts a server; the
    other commands refuse)."""
    return options.dsn or os.environ.get(POSTGRES_DSN_VARIABLE) or None


def check_postgres_dsn(dsn: str, source: str = "--dsn") -> None:
    """Raise BadConnectionString unless libpq can parse ``dsn`` (a URI or ``key=value`` settings) and
    its ports are port numbers; nothing is sent. ``source`` names where it came from, for the message."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from .postgres import _without_password

    try:
        settings = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as error:
        problem = str(error).strip()
    else:
        ports = [port for port in str(settings.get("port") or "").split(",") if port]
        bad = [port for port in ports if not (port.isdigit() and 1 <= int(port) <= 65535)]
        if not bad:
            return
        problem = f"port {bad[0]!r} is not a number from 1 to 65535"
    raise BadConnectionString(f"bad PostgreSQL connection string {_without_password(dsn)!r} ({source}): {problem}; "
                              f"pass a URI like {DSN_EXAMPLE} or key=value settings like 'host=HOST dbname=DB'")


def require_library(store: str) -> None:
    """Raise StoreOptionError, naming the ``pip install`` to run, if the store's optional library is missing.

    It looks the library up without importing it (boto3 takes a noticeable time to import)."""
    backend = BACKENDS.get(store)
    library = backend.library if backend is not None else None
    if library is not None:
        module, name, extra = library
        if importlib.util.find_spec(module) is None:
            raise StoreOptionError(f"--store {store} needs {name}: pip install 'fastlease[{extra}]'")


def client_from_options(options: StoreOptions, *, memory_store: Optional[MemoryStore] = None,
                        must_exist: bool = False, shared_observations: bool = False) -> LeaseClient:
    """The client for ``options``.

    Left out, ``--path`` is ``./fastlease.db``, ``--url`` is ``$FASTLEASE_REDIS_URL`` or
    ``redis://127.0.0.1:6379/0``, and ``--dsn`` is ``$FASTLEASE_POSTGRES_DSN`` (without either,
    StoreOptionError: there is no server to guess). ``must_exist`` refuses a SQLite file that does not
    exist yet (opening one creates it: commands that only inspect must not). ``memory_store`` is the
    MemoryStore a memory client uses (a new one if None). ``shared_observations`` as for every client. Raises
    StoreOptionError for an option that cannot work, and what the client raises for a bad value
    (a bad Redis URL: ValueError; a SQLite file in a missing directory: StoreError), or
    BadConnectionString for a DSN that cannot be one.
    """
    require_library(options.store)
    if options.store == "sqlite":
        path = options.path or DEFAULT_SQLITE_PATH
        if must_exist and not os.path.exists(path):
            directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(directory):
                why = f"its directory {directory!r} does not exist: check the path"
            elif options.path:
                why = "no lease has used that file yet, or the path is wrong"
            else:
                why = "no lease has used it yet: pass --path with the file your application uses"
            raise StoreOptionError(f"no SQLite lock file at {path!r} ({why})")
        return SQLiteClient(path, shared_observations=shared_observations)
    if options.store == "dynamodb":
        import boto3

        from .dynamodb import DynamoDBClient

        if options.region is None and boto3.session.Session().region_name is None:
            # (The client's own advice names region_name=, which a command line has no use for.)
            raise StoreOptionError("--store dynamodb needs an AWS Region and none is configured: pass --region "
                                   "(for example --region eu-west-1), or set AWS_DEFAULT_REGION or `region` in "
                                   "~/.aws/config for your profile")
        return DynamoDBClient(endpoint_url=options.endpoint_url, region_name=options.region,
                              shared_observations=shared_observations)
    if options.store == "redis":
        from .redis import RedisClient

        try:
            return RedisClient(redis_url_from_environment(options) or DEFAULT_REDIS_URL,
                               shared_observations=shared_observations)
        except ValueError as error:  # the URL: RedisClient's own message, which names it
            raise BadOption(str(error)) from None
    if options.store == "postgres":
        from .postgres import PostgresClient

        dsn = postgres_dsn_from_environment(options)
        if dsn is None:
            raise StoreOptionError(f"--store postgres needs a server: pass --dsn {DSN_EXAMPLE} or set "
                                   f"${POSTGRES_DSN_VARIABLE}")
        check_postgres_dsn(dsn, "--dsn" if options.dsn else f"${POSTGRES_DSN_VARIABLE}")
        return PostgresClient(dsn, shared_observations=shared_observations)
    return MemoryClient(store=memory_store, shared_observations=shared_observations)
