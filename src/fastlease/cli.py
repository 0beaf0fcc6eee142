"""The ``fastlease`` command (also ``python -m fastlease``): inspect and operate lock tables, run the demo.

    fastlease create-table NAME [--endpoint-url URL] [--region R]      (DynamoDB, the default)
    fastlease create-table NAME --store postgres [--dsn DSN]           (PostgreSQL)
    fastlease status KEY --table T [store options]
    fastlease list --table T [store options]
    fastlease release KEY --table T --force [store options]
    fastlease demo [--store sqlite|dynamodb|redis|postgres|memory] [--workers N] [--seconds S]
    fastlease --version

Store options: ``--store sqlite`` (the default; ``--path``, default ``./fastlease.db``), ``--store
dynamodb`` (``--endpoint-url``, ``--region``; credentials from the usual AWS chain), ``--store redis``
(``--url``, default ``$FASTLEASE_REDIS_URL`` or ``redis://127.0.0.1:6379/0``) or ``--store postgres``
(``--dsn``, default ``$FASTLEASE_POSTGRES_DSN``; without either, the commands other than the demo
refuse). The demo takes the same options, built into a client by the same factory
(``_store_factory.py``); where one is left out, it makes a temporary file or starts a server of its
own. Every command takes ``--json``. User errors print one line and exit 1, never a traceback; a bad
command line exits 2, and so do a key or table name that the library would refuse (checked with the
engine's own rules before any store is reached), an unknown store, a Redis URL or DSN that cannot be
one, and a demo size out of range. Nothing is deleted without ``--force``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, cast

from . import _impl, demo
from ._store_factory import (
    DEFAULT_REDIS_URL,
    DEFAULT_SQLITE_PATH,
    DSN_EXAMPLE,
    POSTGRES_DSN_VARIABLE,
    REDIS_URL_VARIABLE,
    STORES,
    BadOption,
    StoreOptions,
    client_from_options,
)
from ._version import __version__
from .client import LeaseClient
from .exceptions import FastleaseError
from .stores.base import NO_USAGE, NOT_DELETED, check_table
from .stores.postgres.sql import sql_identifier

if TYPE_CHECKING:  # annotations only: boto3's and psycopg's clients are imported when their store is chosen
    from .dynamodb import DynamoDBClient
    from .postgres import PostgresClient

#: The stores the inspecting commands can reach: a memory store lives inside one process.
INSPECTABLE = tuple(store for store in STORES if store != "memory")
#: The stores whose tables ``create-table`` makes (SQLite and Redis need none made); the first is the default.
TABLE_STORES = ("dynamodb", "postgres")


class UserError(Exception):
    """A problem with what the user asked for: printed as one line, exit status 1."""


class BadArgument(Exception):
    """A command-line value the library would refuse (a key, a table name): one line, exit status 2."""


#: Help texts shared by the commands that take the argument.
KEY_HELP = "the lock key: 1-2,048 UTF-8 bytes"
TABLE_RULE = "3-255 characters of A-Z a-z 0-9 _ . -"
TABLE_HELP = f"the lock table: {TABLE_RULE}"
DSN_HELP = (f"PostgreSQL connection string, a URI ({DSN_EXAMPLE}) or key=value settings; a password in it is "
            f"never printed (default ${POSTGRES_DSN_VARIABLE}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastlease", description="Distributed leases: inspect, operate, demo.")
    parser.add_argument("--version", action="version", version=f"fastlease {__version__}",
                        help="print the version of fastlease and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_store_options(command: argparse.ArgumentParser, stores: Sequence[str]) -> None:
        command.add_argument("--store", default="sqlite", help=f"one of {', '.join(stores)} (default sqlite)")
        command.add_argument("--path", help=f"SQLite file (default ./{DEFAULT_SQLITE_PATH}; demo: a temporary one)")
        command.add_argument("--endpoint-url", help="DynamoDB endpoint (default: the AWS configuration; demo: a "
                                                    "local moto server it starts)")
        command.add_argument("--region", help="DynamoDB Region (default: the AWS configuration; demo without "
                                              f"--endpoint-url: {demo.MOTO_REGION})")
        command.add_argument("--url", help=f"Redis URL (default ${REDIS_URL_VARIABLE}, else {DEFAULT_REDIS_URL}; "
                                           "demo: else a local redis-server it starts)")
        command.add_argument("--dsn", help=f"{DSN_HELP}; demo: else a throwaway local PostgreSQL server it starts)")
        command.add_argument("--json", action="store_true", help="print JSON")

    create = commands.add_parser("create-table", help="create a DynamoDB or PostgreSQL lock table")
    create.add_argument("name", metavar="NAME", help=f"the new table's name: {TABLE_RULE}")
    create.add_argument("--store", default=TABLE_STORES[0],
                        help="dynamodb (the default) or postgres; a rerun on a table that has fastlease's schema "
                             "does nothing (sqlite and redis need no table made)")
    create.add_argument("--endpoint-url", help="DynamoDB endpoint (default: the AWS configuration)")
    create.add_argument("--region", help="DynamoDB Region (default: the AWS configuration)")
    create.add_argument("--dsn", help=f"{DSN_HELP})")
    create.add_argument("--json", action="store_true", help="print JSON")

    status = commands.add_parser("status", help="who holds a key, and since when this host has seen it unchanged")
    status.add_argument("key", metavar="KEY", help=KEY_HELP)
    status.add_argument("--table", required=True, help=TABLE_HELP)
    add_store_options(status, INSPECTABLE)

    holders = commands.add_parser("holders", help="who holds which slot of a semaphore")
    holders.add_argument("key", metavar="KEY", help="the semaphore's key, as given to Semaphore")
    holders.add_argument("--table", required=True, help=TABLE_HELP)
    holders.add_argument("--limit", type=int, help="the semaphore's limit (default: read from its first slot's "
                                                   "holder; when that slot is free, every row of the table is read)")
    add_store_options(holders, INSPECTABLE)

    listing = commands.add_parser("list", help="the held keys of a table")
    listing.add_argument("--table", required=True, help=TABLE_HELP)
    add_store_options(listing, INSPECTABLE)

    release = commands.add_parser("release", help="remove a lock row (only with --force)")
    release.add_argument("key", metavar="KEY", help=KEY_HELP)
    release.add_argument("--table", required=True, help=TABLE_HELP)
    release.add_argument("--force", action="store_true", help="really remove the row printed")
    add_store_options(release, INSPECTABLE)

    demo_command = commands.add_parser("demo", help="worker processes contend on customer keys; one holder is killed")
    demo_command.add_argument("--workers", type=int, default=4, help="how many workers contend, 2 to 64 (default 4)")
    demo_command.add_argument("--seconds", type=float, default=10.0,
                              help="how long they contend, 2 to 600 (default 10)")
    add_store_options(demo_command, STORES)
    return parser


#: The arguments that name a key or a table, by command: (attribute, name in messages, the engine's check).
_CHECKED_ARGUMENTS: dict[str, tuple[tuple[str, str, Callable[[object], str]], ...]] = {
    "create-table": (("name", "NAME", check_table),),
    "status": (("key", "KEY", _impl.core.check_key), ("table", "--table", check_table)),
    "holders": (("key", "KEY", _impl.core.check_key), ("table", "--table", check_table),
                ("limit", "--limit", lambda limit: "" if limit is None else str(_impl.core.check_limit(limit)))),
    "list": (("table", "--table", check_table),),
    "release": (("key", "KEY", _impl.core.check_key), ("table", "--table", check_table)),
}


def check_arguments(args: argparse.Namespace) -> None:
    """Apply the engine's own rules to the keys and table names of a command line, before any store is
    reached: a key no lease can have (``""``, more than 2,048 bytes) would otherwise read as free; on
    PostgreSQL, a table name longer than it keeps (63 characters) too. Raises BadArgument naming the
    argument and the rule."""
    for attribute, name, check in _CHECKED_ARGUMENTS.get(args.command, ()):
        checks = [check]
        if check is check_table and getattr(args, "store", None) == "postgres":
            checks.append(cast("Callable[[object], str]", sql_identifier))
        try:
            for rule in checks:
                rule(getattr(args, attribute))
        except (TypeError, ValueError) as error:
            raise BadArgument(f"argument {name}: {error}") from None


def store_options(args: argparse.Namespace) -> StoreOptions:
    """The store options of a parsed command line (``create-table`` has only the DynamoDB and PostgreSQL ones)."""
    return StoreOptions(args.store, path=getattr(args, "path", None), endpoint_url=args.endpoint_url,
                        region=args.region, url=getattr(args, "url", None), dsn=args.dsn)


def _client(args: argparse.Namespace) -> LeaseClient:
    """The client an inspecting command uses: the file must exist, and sightings are shared on this host."""
    options = store_options(args)
    if options.store not in INSPECTABLE:
        raise UserError(f"--store {options.store} lives inside one process and cannot be inspected from the "
                        f"command line; pass --store {', '.join(INSPECTABLE[:-1])} or {INSPECTABLE[-1]}")
    return client_from_options(options, must_exist=True, shared_observations=True)


#: What create-table says for the stores whose tables nobody makes.
NO_TABLE_NEEDED = {
    "sqlite": "SQLite needs no lock table made: the first lease creates it in its file",
    "redis": "Redis needs no lock table made: a lease is a key, written by its acquisition",
    "memory": "the memory store needs no lock table made (and lives inside one process)",
}


def _create_table(args: argparse.Namespace, out: Callable[[Any, str], None]) -> int:
    """Create a lock table, or confirm it is there: a rerun (a deployment script run twice) succeeds and
    changes nothing, on DynamoDB (the same key schema) as on PostgreSQL (the same columns); a table of
    that name with another schema is refused."""
    options = store_options(args)
    if options.store in NO_TABLE_NEEDED:
        out({"created": False, "needed": False}, f"{NO_TABLE_NEEDED[options.store]}; nothing to do")
        return 0
    client = cast("DynamoDBClient | PostgresClient", client_from_options(options))
    try:
        existed = client.lock_table_exists(args.name)
        client.create_lock_table(args.name)
        where = f" on {client.store.describe()}" if options.store == "postgres" else ""
    finally:
        client.close()
    if existed:
        schema = "columns" if options.store == "postgres" else "key schema"
        out({"created": False, "exists": args.name},
            f"lock table {args.name!r} already exists{where} with fastlease's {schema}; nothing to do")
    else:
        out({"created": args.name}, f"created lock table {args.name!r}{where}")
    return 0


def _seconds_seen(client: Any, table: str, row: dict[str, Any]) -> float:
    """How long this host has seen the row unchanged (the shared observation cache; records a sighting)."""
    observations = client.engine.observations
    now_ns = client.clock.monotonic_ns()
    seen_ns = observations.observe((table, row["key"]), row["owner"], row["version"], row["lease_ms"], now_ns)
    return float(seen_ns) / 1e9


def _describe_row(row: dict[str, Any], seen_s: Optional[float]) -> str:
    lease_ms = row["lease_ms"]
    lease = f"lease {lease_ms / 1000:g} s" if isinstance(lease_ms, int) else f"lease_ms {lease_ms!r} (malformed)"
    parts = [f"{row['key']}: held by {row['owner']}", lease, f"protocol {row['protocol']}"]
    if row["fence"] is not None:
        parts.append(f"fencing token {row['fence']}")
    from .election import identity_of  # (an election's candidate holds the key)

    owner = str(row["owner"])
    identity = identity_of(owner)
    if owner.startswith(_impl.core.SEMAPHORE_OWNER):  # sem:<limit>:<identity>/<owner id>
        holder = owner.split(":", 2)[2].rpartition("/")[0]
        parts.append(f"a slot of {_impl.core.holder_kind(owner)}, held by {holder!r}")
    elif identity is not None:
        parts.append(f"leader {identity!r} in term {row['fence']}")
    if seen_s is not None:
        parts.append(f"seen unchanged by this host for {seen_s:.1f} s")
    return ", ".join(parts)


def _status(args: argparse.Namespace, out: Callable[[Any, str], None]) -> int:
    client = _client(args)
    try:
        rows = client.inspect(args.table, args.key)
        if not rows:
            out({"key": args.key, "held": False}, f"{args.key}: free")
            return 0
        row = rows[0]
        seen_s = _seconds_seen(client, args.table, row) if isinstance(row["lease_ms"], int) else None
    finally:
        client.close()
    out({**row, "held": True, "seen_unchanged_s": seen_s}, _describe_row(row, seen_s))
    return 0


def _holders(args: argparse.Namespace, out: Callable[[Any, str], None]) -> int:
    client = _client(args)
    try:
        rows = client.holders(args.table, args.key, args.limit)
    finally:
        client.close()
    text = "\n".join(f"slot {row['slot']}: {_describe_row(row, None)}" for row in rows) or f"{args.key}: no slot held"
    out(rows, text)
    return 0


def _list(args: argparse.Namespace, out: Callable[[Any, str], None]) -> int:
    client = _client(args)
    try:
        rows = client.inspect(args.table)
    finally:
        client.close()
    text = "\n".join(_describe_row(row, None) for row in rows) or f"no held keys in {args.table!r}"
    out(rows, text)
    return 0


def _release(args: argparse.Namespace, out: Callable[[Any, str], None]) -> int:
    client = _client(args)
    try:
        rows = client.inspect(args.table, args.key)
        if not rows:
            out({"key": args.key, "removed": False}, f"{args.key}: not held, nothing to remove")
            return 0
        row = rows[0]
        if not args.force:
            raise UserError(f"would remove {_describe_row(row, None)}; run again with --force to remove it")
        # Only the row printed: conditioned on its owner, so a new holder's row is never removed.
        removed = client.store.delete_if_owner(args.table, args.key, row["owner"], 10.0, NO_USAGE) != NOT_DELETED
    finally:
        client.close()
    if not removed:
        raise UserError(f"{args.key}: the row changed meanwhile (a new holder); nothing removed")
    out({**row, "removed": True}, f"removed {_describe_row(row, None)}")
    return 0


def _demo(args: argparse.Namespace, out: Callable[[Any, str], None]) -> int:
    say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    try:
        summary = demo.run(store_options(args), args.workers, args.seconds, say=say)
    except demo.DemoError as error:
        raise UserError(str(error)) from None
    if args.json:
        out(summary, "")
    return 1 if summary["errors"] else 0


COMMANDS = {"create-table": _create_table, "status": _status, "holders": _holders, "list": _list, "release": _release,
            "demo": _demo}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``fastlease`` command with ``argv`` (default: ``sys.argv[1:]``) and return its exit status:
    0, 1 for an error (one line on stderr), 130 when interrupted. A bad command line exits with 2, and
    so does a key or table name the library refuses (one line on stderr)."""
    args = _parser().parse_args(argv)
    as_json = getattr(args, "json", False)

    def out(data: Any, text: str) -> None:
        print(json.dumps(data, default=str) if as_json else text, flush=True)

    try:
        check_arguments(args)
    except BadArgument as error:
        print(f"fastlease {args.command}: error: {error}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        return COMMANDS[args.command](args, out)
    except BadOption as error:  # a bad command line, found once the store's library is known present
        print(f"fastlease {args.command}: error: {error}", file=sys.stderr)
        return 2
    except (UserError, FastleaseError, ValueError, TypeError, OSError, sqlite3.Error) as error:
        message = str(error) or type(error).__name__
        print(f"fastlease {args.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"fastlease {args.command}: interrupted after {time.monotonic() - started:.1f} s", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - AWS SDK errors and the like: one line, not a traceback
        print(f"fastlease {args.command}: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
