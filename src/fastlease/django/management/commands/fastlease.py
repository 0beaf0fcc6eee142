"""``python manage.py fastlease``: the lock tables of the store that ``settings.FASTLEASE`` names.

    python manage.py fastlease createtables --lock-table locks --idempotency-table payments
    python manage.py fastlease status KEY --table T
    python manage.py fastlease holders KEY --table T [--limit N]
    python manage.py fastlease list --table T
    python manage.py fastlease release KEY --table T --force

``createtables`` creates each lock table (``create_lock_table``) and each idempotency table with its
lock table ``<name>_locks`` (``create_idempotency_table``) with the settings' client; a rerun changes
nothing, and on SQLite there is nothing to make (the first lease creates its tables). The other
subcommands are the ``fastlease`` command's own (``fastlease.cli``), run on the settings' store, with
its output and its rules. Every subcommand takes ``--json``. Errors are one line: exit status 2 for a
name or key the library refuses, 1 for the rest.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from typing import Any, Callable

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from .... import cli
from ...._store_factory import BadOption, StoreOptions
from ....exceptions import FastleaseError
from ....stores.base import check_table
from ....stores.postgres.sql import sql_identifier
from ... import get_client, store_options

#: The subcommands that are the ``fastlease`` command's own, by their name there.
CLI_SUBCOMMANDS = ("status", "holders", "list", "release")


class Command(BaseCommand):  # type: ignore[misc]  # (Django ships no type information)
    """``python manage.py fastlease SUBCOMMAND``: see the module documentation."""

    help = "Create and inspect fastlease's lock tables on the store that settings.FASTLEASE names."

    def add_arguments(self, parser: Any) -> None:
        """The subcommands and their arguments (those of the inspecting ones as the ``fastlease`` command has them)."""
        subcommands = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        create = subcommands.add_parser("createtables", help="create lock tables and idempotency tables")
        create.add_argument("--lock-table", action="append", default=[], metavar="NAME",
                            help=f"a lock table to create ({cli.TABLE_RULE}); may be repeated")
        create.add_argument("--idempotency-table", action="append", default=[], metavar="NAME",
                            help="an idempotency record table to create, with its lock table NAME_locks; "
                                 "may be repeated")
        status = subcommands.add_parser("status", help="who holds a key, and since when this host has seen it")
        status.add_argument("key", metavar="KEY", help=cli.KEY_HELP)
        holders = subcommands.add_parser("holders", help="who holds which slot of a semaphore")
        holders.add_argument("key", metavar="KEY", help="the semaphore's key, as given to Semaphore")
        holders.add_argument("--limit", type=int, help="the semaphore's limit (default: read from its first slot)")
        subcommands.add_parser("list", help="the held keys of a table")
        release = subcommands.add_parser("release", help="remove a lock row (only with --force)")
        release.add_argument("key", metavar="KEY", help=cli.KEY_HELP)
        release.add_argument("--force", action="store_true", help="really remove the row printed")
        for name in CLI_SUBCOMMANDS:
            subcommands.choices[name].add_argument("--table", required=True, help=cli.TABLE_HELP)
        for command in subcommands.choices.values():
            command.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the subcommand; its failures become one-line CommandErrors."""
        as_json = options["json"]

        def out(data: Any, text: str) -> None:
            self.stdout.write(json.dumps(data, default=str) if as_json else text)

        try:
            if options["subcommand"] == "createtables":
                _create_tables(options["lock_table"], options["idempotency_table"], out)
            else:
                _run_cli_command(options, out)
        except (cli.BadArgument, BadOption) as error:  # as the fastlease command: a bad command line, status 2
            raise CommandError(str(error), returncode=2) from error
        except (cli.UserError, FastleaseError, ValueError, TypeError, OSError, sqlite3.Error) as error:
            raise CommandError(str(error) or type(error).__name__) from error
        except (CommandError, ImproperlyConfigured):
            raise
        except Exception as error:  # noqa: BLE001 - a driver's error (the server is down): one line, as the CLI's
            raise CommandError(f"{type(error).__name__}: {error}") from error


def _create_tables(lock_tables: list[str], idempotency_tables: list[str], out: Callable[[Any, str], None]) -> None:
    """Create the tables with the settings' client; every name is checked before any table is made."""
    if not lock_tables and not idempotency_tables:
        raise cli.BadArgument("createtables: name the tables to create with --lock-table NAME and/or "
                              "--idempotency-table NAME")
    options = store_options()
    for option, names in (("--lock-table", lock_tables), ("--idempotency-table", idempotency_tables)):
        for name in names:
            try:
                for table in (name, f"{name}_locks") if option == "--idempotency-table" else (name,):
                    check_table(table)
                    if options.store == "postgres":
                        sql_identifier(table)
            except (TypeError, ValueError) as error:
                raise cli.BadArgument(f"argument {option} {name!r}: {error}") from None
    if options.store not in cli.TABLE_STORES:
        out({"created": False, "needed": False}, f"{cli.NO_TABLE_NEEDED[options.store]}; nothing to do")
        return
    client: Any = get_client()  # a PostgresClient: the one store of cli.TABLE_STORES that settings can name
    where = client.store.describe()
    for kind, names in (("lock table", lock_tables), ("idempotency table", idempotency_tables)):
        for name in names:
            existed = client.lock_table_exists(name)
            if kind == "lock table":
                client.create_lock_table(name)
            else:
                client.create_idempotency_table(name)
            if existed:
                out({"created": False, "exists": name}, f"{kind} {name!r} already exists on {where} with "
                                                        f"fastlease's columns; nothing to do")
            else:
                out({"created": name}, f"created {kind} {name!r} on {where}")


def _run_cli_command(options: dict[str, Any], out: Callable[[Any, str], None]) -> None:
    """The ``fastlease`` command's subcommand, with the settings' store as its store options."""
    store: StoreOptions = store_options()
    args = argparse.Namespace(
        command=options["subcommand"], key=options.get("key"), table=options["table"], limit=options.get("limit"),
        force=options.get("force", False), json=options["json"], store=store.store, path=store.path,
        endpoint_url=None, region=None, url=None, dsn=store.dsn)
    cli.check_arguments(args)
    cli.COMMANDS[args.command](args, out)
