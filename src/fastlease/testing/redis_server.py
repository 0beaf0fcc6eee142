"""A throwaway ``redis-server`` for tests, benchmarks and the demo: started on a free 127.0.0.1 port
with no persistence, stopped by its PID. From a shell, ``python -m fastlease.testing.redis_server
[--port N]`` prints ``READY redis://127.0.0.1:<port>/0`` and serves until SIGTERM or Ctrl-C.

``RedisServer().start()`` returns its ``redis://127.0.0.1:<port>/0`` URL. The server runs under the
launcher of :mod:`fastlease.testing._process`, so it also stops when this process dies without
stopping it.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Optional, Sequence

from ._process import HOST, ServerNotReady, ServerProcess, serve_until_stopped

__all__ = ["RedisServer", "RedisServerUnavailable", "redis_server_path"]

#: What redis-server logs once it listens (2.x: "The server is now ready to accept connections on port").
READY_TEXT = "ready to accept connections"


class RedisServerUnavailable(RuntimeError):
    """There is no ``redis-server`` executable, or it could not be started."""


def redis_server_path() -> Optional[str]:
    """The ``redis-server`` executable (``$REDIS_SERVER`` or on PATH, /usr/bin and /usr/sbin), or None."""
    configured = os.environ.get("REDIS_SERVER")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin:/usr/sbin:/usr/local/bin")


def _is_ready_line(line: str) -> bool:
    return READY_TEXT in line.lower()


class RedisServer:
    """One ``redis-server`` child process on 127.0.0.1, without persistence (``--save '' --appendonly no``)."""

    def __init__(self) -> None:
        self._process = ServerProcess("redis-server")

    @property
    def port(self) -> Optional[int]:
        """The port of the running server; None unless it is running."""
        return self._process.port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``; RuntimeError unless running."""
        if self.port is None:
            raise RuntimeError("RedisServer is not running; call start() first")
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        """The PID stop() signals (the server's guard, which stops the server); RuntimeError if it was
        never started. Still the last one's after stop(), so callers can check it is gone."""
        if self._process.pid is None:
            raise RuntimeError("RedisServer was never started")
        return self._process.pid

    def start(self, timeout_s: float = 20.0, attempts: int = 3, port: Optional[int] = None) -> str:
        """Start the server (on ``port``, or a free one) and wait until it is ready; returns its URL. A
        second call while running returns the same URL. RedisServerUnavailable (with the server's own
        output) if it cannot start within ``timeout_s``."""
        executable = redis_server_path()
        if executable is None:
            raise RedisServerUnavailable(
                "redis-server is not installed (apt-get install -y redis-server, or set REDIS_SERVER)"
            )

        def command(port: int) -> list[str]:
            return [executable, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
                    "--daemonize", "no", "--protected-mode", "yes", "--logfile", "",
                    # DEBUG SLEEP stalls the server on purpose in fault tests (loopback clients only).
                    "--enable-debug-command", "local"]

        try:
            self._process.start(command, _is_ready_line, timeout_s=timeout_s, port=port, attempts=attempts)
        except ServerNotReady as error:
            raise RedisServerUnavailable(f"redis-server did not start on {HOST}: {str(error)[-2000:]}") from error
        return self.url

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, SIGKILL if it must); the process is reaped either way."""
        self._process.stop()

    def __enter__(self) -> "RedisServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fastlease.testing.redis_server [--port N]``: see the module docstring."""
    server = RedisServer()
    return serve_until_stopped("python -m fastlease.testing.redis_server",
                               "a throwaway redis-server on 127.0.0.1, no persistence",
                               lambda port: server.start(port=port), server.stop, RedisServerUnavailable, argv)


if __name__ == "__main__":
    sys.exit(main())
