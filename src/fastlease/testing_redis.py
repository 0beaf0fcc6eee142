"""A throwaway ``redis-server`` for tests, benchmarks and the demo: started on a free 127.0.0.1 port
with no persistence, stopped by its PID.

``RedisServer().start()`` returns its ``redis://127.0.0.1:<port>/0`` URL. The server runs as a child of
this process; on Linux it is also killed if this process dies without stopping it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Optional

__all__ = ["RedisServer", "RedisServerUnavailable", "redis_server_path"]

HOST = "127.0.0.1"


class RedisServerUnavailable(RuntimeError):
    """There is no ``redis-server`` executable, or it could not be started."""


def redis_server_path() -> Optional[str]:
    """The ``redis-server`` executable (``$REDIS_SERVER`` or on PATH, /usr/bin and /usr/sbin), or None."""
    configured = os.environ.get("REDIS_SERVER")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin:/usr/sbin:/usr/local/bin")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


class RedisServer:
    """One ``redis-server`` child process on 127.0.0.1, without persistence (``--save '' --appendonly no``)."""

    def __init__(self) -> None:
        self._proc: Optional["subprocess.Popen[bytes]"] = None
        self._log: Optional[IO[bytes]] = None
        self.port: Optional[int] = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``; RuntimeError unless running."""
        if self.port is None:
            raise RuntimeError("RedisServer is not running; call start() first")
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        """The server process's PID; RuntimeError if it was never started."""
        if self._proc is None:
            raise RuntimeError("RedisServer was never started")
        return self._proc.pid

    def start(self, timeout_s: float = 20.0, attempts: int = 3, port: Optional[int] = None) -> str:
        """Start the server (on ``port``, or a free one) and wait until it answers PING; returns its URL.
        RedisServerUnavailable (with the server's own output) if it cannot start within ``timeout_s``."""
        executable = redis_server_path()
        if executable is None:
            raise RedisServerUnavailable(
                "redis-server is not installed (apt-get install -y redis-server, or set REDIS_SERVER)"
            )
        problem = ""
        wanted = port
        for _ in range(attempts if wanted is None else 1):  # a free port can be taken before the server binds it
            port = _free_port() if wanted is None else wanted
            self._log = tempfile.TemporaryFile(prefix="fastlease-redis-")
            command = [executable, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
                       "--daemonize", "no", "--protected-mode", "yes", "--logfile", "",
                       # DEBUG SLEEP stalls the server on purpose in fault tests (loopback clients only).
                       "--enable-debug-command", "local"]
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self._proc.poll() is None:  # bounded by the deadline
                if _answers_ping(port):
                    self.port = port
                    return self.url
                time.sleep(0.02)
            problem = self._output()
            self.stop()
        raise RedisServerUnavailable(f"redis-server did not start on {HOST}: {problem[-2000:]}")

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; the process is reaped either way."""
        proc, self._proc, self.port = self._proc, None, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "RedisServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False
