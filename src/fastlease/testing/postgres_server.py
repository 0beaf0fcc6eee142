"""A throwaway PostgreSQL server for tests, benchmarks and the demo: a fresh cluster (``initdb``) in a
temporary directory, its postmaster on a free 127.0.0.1 port, stopped by its PID.

From a shell, ``python -m fastlease.testing.postgres_server [--port N]`` prints ``READY <DSN>`` and serves
until SIGTERM or Ctrl-C.

``PostgresServer().start()`` returns ``postgresql://postgres@127.0.0.1:<port>/postgres``: the role
``postgres``, trusted without a password, and reachable on loopback only (TCP on 127.0.0.1, and a unix
socket in the temporary directory). Durability is off (``fsync``, ``synchronous_commit``,
``full_page_writes``): the cluster is deleted at the end anyway.

The postmaster runs in the foreground (``postgres -D ...``, which is what ``pg_ctl start`` runs, without
its detaching) under the launcher of :mod:`fastlease.testing._process`. So it is stopped like the other
test servers, with PostgreSQL's fast shutdown (SIGINT) and SIGKILL if it must, and it also stops, and its
directory is removed, when this process dies without stopping it.

PostgreSQL refuses to run as root: as root, ``initdb`` and the server run as the ``postgres`` user
(which Debian's package creates), else as ``nobody``, in a directory owned by that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

from ._process import HOST, ServerNotReady, ServerProcess, serve_until_stopped

__all__ = ["PostgresServer", "PostgresServerUnavailable", "postgres_bin_dir"]

#: The server's last line of a start-up (log line "database system is ready to accept connections").
READY_TEXT = "database system is ready to accept connections"
#: The executables a cluster needs: initdb makes it, postgres is the server (``pg_ctl start`` runs it).
EXECUTABLES = ("initdb", "postgres")
#: Where Debian and Ubuntu install each version (never on PATH): the highest version wins.
DEBIAN_BIN_DIRS = "/usr/lib/postgresql/*/bin"
#: Who runs the cluster when we are root: the Debian package's user, else the system's least privileged.
UNPRIVILEGED_USERS = ("postgres", "nobody")
#: Server settings of a throwaway cluster, on the postmaster's command line.
SETTINGS = {
    # Nothing need survive a crash: the cluster is deleted after the session.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # The suite runs 16 processes on one key, each with a couple of connections and a renewal process.
    "max_connections": "300",
    "shared_buffers": "32MB",
    # The readiness line is matched in English, on stderr (no logging collector).
    "lc_messages": "C",
    "logging_collector": "off",
    "log_destination": "stderr",
}
#: Lines of initdb's output kept for an error report.
OUTPUT_TAIL_CHARS = 2000


class PostgresServerUnavailable(RuntimeError):
    """There is no PostgreSQL (``initdb`` and ``postgres``) to run, or the server could not be started."""


def _has_executables(directory: str) -> bool:
    return all(os.access(os.path.join(directory, name), os.X_OK) for name in EXECUTABLES)


def _version_key(directory: str) -> tuple[int, ...]:
    """``/usr/lib/postgresql/15/bin`` -> (15,): numeric, so that 9.6 sorts below 10."""
    version = os.path.basename(os.path.dirname(directory))
    return tuple(int(part) for part in re.findall(r"\d+", version))


def postgres_bin_dir() -> Optional[str]:
    """The directory of ``initdb`` and ``postgres``: ``$PG_BINDIR`` when set (and only it), else the one
    of ``initdb`` on PATH, else the highest version's ``/usr/lib/postgresql/*/bin``; None if none has both."""
    configured = os.environ.get("PG_BINDIR")
    if configured:
        return configured if _has_executables(configured) else None
    on_path = shutil.which("initdb")
    if on_path is not None:
        # /usr/local/bin/initdb may be a symlink into the version's directory, where postgres sits too.
        directory = os.path.dirname(os.path.realpath(on_path))
        if _has_executables(directory):
            return directory
    installed = [directory for directory in glob.glob(DEBIAN_BIN_DIRS) if _has_executables(directory)]
    return max(installed, key=_version_key) if installed else None


def _unprivileged_identity() -> Optional[tuple[int, int]]:
    """(uid, gid) to run the cluster as when we are root; None when we are not (it runs as us)."""
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise PostgresServerUnavailable(
        f"running as root, and PostgreSQL refuses to run as root, but there is no user {UNPRIVILEGED_USERS} "
        "to run it as: create one (apt-get install postgresql creates 'postgres'), or run as another user"
    )


def _is_ready_line(line: str) -> bool:
    return READY_TEXT in line


def _read_postmaster_pid(data_directory: str) -> int:
    """The first line of ``postmaster.pid``, which the postmaster writes before it says it is ready."""
    with open(os.path.join(data_directory, "postmaster.pid")) as lock_file:
        return int(lock_file.readline())


class PostgresServer:
    """One throwaway PostgreSQL cluster and its postmaster on 127.0.0.1 (see the module docstring)."""

    def __init__(self) -> None:
        # SIGINT is PostgreSQL's fast shutdown: SIGTERM (smart) would wait for every client to disconnect.
        self._process = ServerProcess("postgres", stop_signal=signal.SIGINT)
        self._directory: Optional[str] = None  # the last start's, kept after stop() so callers can check it
        self._pid: Optional[int] = None  # the last postmaster's, kept after stop()

    @property
    def port(self) -> Optional[int]:
        """The port of the running server; None unless it is running."""
        return self._process.port

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres``; RuntimeError unless running."""
        if self.port is None:
            raise RuntimeError("PostgresServer is not running; call start() first")
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    @property
    def pid(self) -> int:
        """The postmaster's PID; RuntimeError if it was never started. Still the last one's after stop(),
        so callers can check it is gone."""
        if self._pid is None:
            raise RuntimeError("PostgresServer was never started")
        return self._pid

    @property
    def directory(self) -> str:
        """The temporary directory of the cluster (``data/``) and its unix socket; RuntimeError if it was
        never started. Still the last one's after stop(), which removes it."""
        if self._directory is None:
            raise RuntimeError("PostgresServer was never started")
        return self._directory

    def start(self, timeout_s: float = 30.0, attempts: int = 3, port: Optional[int] = None) -> str:
        """Make a cluster in a new temporary directory, start its server (on ``port``, or a free one) and
        wait until it accepts connections; returns its DSN. A second call while running returns the same
        DSN. PostgresServerUnavailable, with the output of initdb or of the server, if there is no
        PostgreSQL or it cannot start within ``timeout_s`` (initdb and the server's start together)."""
        if self._process.running():
            return self.dsn
        self.stop()  # a previous, dead server's directory
        deadline = time.monotonic() + timeout_s
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise PostgresServerUnavailable(
                "PostgreSQL is not installed: no initdb and postgres in $PG_BINDIR, on PATH or in "
                f"{DEBIAN_BIN_DIRS} (apt-get install -y postgresql, or set PG_BINDIR)"
            )
        identity = _unprivileged_identity()
        directory = tempfile.mkdtemp(prefix="fastlease-postgres-")
        self._directory = directory
        data = os.path.join(directory, "data")
        try:
            if identity is not None:
                os.chown(directory, *identity)
            self._initdb(bin_dir, data, identity, deadline - time.monotonic())

            def command(port: int) -> list[str]:
                argv = [os.path.join(bin_dir, "postgres"), "-D", data, "-h", HOST, "-p", str(port),
                        "-k", directory]
                for name, value in SETTINGS.items():
                    argv += ["-c", f"{name}={value}"]
                return argv

            self._process.start(command, _is_ready_line, timeout_s=max(0.0, deadline - time.monotonic()),
                                port=port, attempts=attempts, env=_server_environment(), run_as=identity,
                                remove_after_stop=directory)
            self._pid = _read_postmaster_pid(data)
        except ServerNotReady as error:
            self.stop()
            raise PostgresServerUnavailable(
                f"postgres did not start on {HOST}: {str(error)[-OUTPUT_TAIL_CHARS:]}"
            ) from error
        except BaseException:
            self.stop()
            raise
        return self.dsn

    @staticmethod
    def _initdb(bin_dir: str, data: str, identity: Optional[tuple[int, int]], timeout_s: float) -> None:
        """A new cluster in ``data``: role postgres, trusted (loopback only: the server listens nowhere
        else), UTF-8 with the C locale, and no fsync of its files (``--no-sync``)."""
        argv = [os.path.join(bin_dir, "initdb"), "-D", data, "--no-sync", "-A", "trust", "-U", "postgres",
                "-E", "UTF8", "--locale=C", "--no-instructions"]
        user, group = (None, None) if identity is None else identity
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  cwd=os.path.dirname(data), env=_server_environment(), timeout=max(0.0, timeout_s),
                                  user=user, group=group, extra_groups=None if identity is None else [])
        except subprocess.TimeoutExpired as error:  # subprocess.run has SIGKILLed and reaped it
            output = (error.output or b"").decode("utf-8", "replace")
            raise PostgresServerUnavailable(
                f"initdb did not finish within {timeout_s:.3g} s.\ncommand: {' '.join(argv)}\n"
                f"output:\n{output[-OUTPUT_TAIL_CHARS:]}"
            ) from error
        if done.returncode != 0:
            output = done.stdout.decode("utf-8", "replace")
            raise PostgresServerUnavailable(
                f"initdb failed (exit status {done.returncode}).\ncommand: {' '.join(argv)}\n"
                f"output:\n{output[-OUTPUT_TAIL_CHARS:]}"
            )

    def stop(self) -> None:
        """Stop the postmaster by its PID: fast shutdown (SIGINT, from its guard), SIGKILL if it must, reaped
        either way; then remove the temporary directory. Idempotent."""
        self._process.stop()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)  # the guard has removed it, unless it died

    def __enter__(self) -> "PostgresServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _server_environment() -> dict[str, str]:
    """This process's environment without libpq's PG* variables (PGDATA, PGPORT...), which would change
    what initdb and the server do, and with the C locale, which the cluster uses anyway."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("PG")}
    environment.update(LC_ALL="C", LANG="C")
    return environment


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fastlease.testing.postgres_server [--port N]``: see the module docstring."""
    server = PostgresServer()
    return serve_until_stopped("python -m fastlease.testing.postgres_server",
                               "a throwaway PostgreSQL cluster on 127.0.0.1, removed when it stops",
                               lambda port: server.start(port=port), server.stop, PostgresServerUnavailable, argv)


if __name__ == "__main__":
    sys.exit(main())
