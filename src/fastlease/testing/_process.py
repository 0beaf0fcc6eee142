"""The one launcher of the test servers (moto, redis-server, PostgreSQL): a child process on a free 127.0.0.1 port,
a bounded wait until it says it is ready, a stop by its PID, and a guard that stops it when the process
that started it dies.

The dying parent. Every server runs under a guard, this file run as a script (stdlib only, so it starts
in milliseconds)::

    test process ── guard (python -I _process.py --parent-pid P [options] -- argv…) ── the server (argv)

The guard polls its parent's PID (:func:`watch_parent`); once it has been reparented, the test process
is gone, and the guard stops the server (SIGTERM, then SIGKILL) and exits. Linux's PR_SET_PDEATHSIG is
not used because it fires when the *thread* that spawned the child exits, not the process: a server
started from a worker thread (a fixture run in a thread pool, a benchmark's setup thread) would be
killed while the test still uses it; it is also Linux-only, and it needs ``preexec_fn``, which is unsafe
in a process with threads. Polling is portable and tied to the process.

Stopping. :meth:`ServerProcess.stop` SIGTERMs the guard by its PID; the guard sends the server its stop
signal (SIGTERM, or the one the server's kind asks for: PostgreSQL's fast shutdown is SIGINT, its
SIGTERM waits for every client to leave), waits up to :data:`GUARD_GRACE_S`, SIGKILLs it if it must,
reaps it, removes the directory it was told to remove after a stop, and exits. So once the guard is
reaped, the server is too.

Options of the guard: ``--stop-signal N`` (the server's stop signal), ``--run-as UID:GID`` (the server
runs as that user, without supplementary groups: PostgreSQL refuses to run as root, and only the
server drops privileges, so the guard can always read its own script), ``--remove-after-stop DIR``
(removed once a stopped server has exited; not when the server exits by itself, so that the launcher
can retry in the same directory on another port).

Readiness is a line of the server's own output (moto's ``READY``, redis-server's "Ready to accept
connections"), not a probe of the port: a probe could be answered by another process that took the
port between :func:`free_port` and the server's bind, while the line can only come from our child. A
server that could not bind says "Address already in use" and exits; the launcher then tries another
port.
"""

from __future__ import annotations

import collections
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Deque, Mapping, Optional, Sequence

__all__ = ["HOST", "ServerNotReady", "ServerProcess", "free_port", "serve_until_stopped", "watch_parent"]

#: The only address the test servers bind: a fake AWS endpoint or a throwaway Redis never leaves loopback.
HOST = "127.0.0.1"
#: How often a guard checks that its parent is alive: the most a server outlives the test process by.
PARENT_POLL_S = 0.2
#: How long a guard lets its server shut down after SIGTERM before it SIGKILLs it.
GUARD_GRACE_S = 5.0
#: Lines of a server's output kept for error reports (the reader drains the rest, so the pipe never fills).
OUTPUT_LINES = 200

_GUARD_SCRIPT = os.path.abspath(__file__)


class ServerNotReady(RuntimeError):
    """A server's child process exited, or said nothing ready, before the launcher's deadline."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may still take it before the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def watch_parent(parent_pid: int, interval_s: float = PARENT_POLL_S) -> None:
    """SIGTERM this process (its own handler then shuts it down) once ``parent_pid`` is no longer its parent.

    A daemon thread polls :func:`os.getppid`: a process whose parent dies is reparented (to init or a
    subreaper), so the PID changes. This is the one way a test server learns that the test process died.
    """

    def stop_self() -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)  # a polling interval; nothing signals a parent's death portably
        stop_self()

    if os.getppid() != parent_pid:  # the parent died before we got here
        stop_self()
    threading.Thread(target=watch, name="fastlease-parent-watchdog", daemon=True).start()


class ServerProcess:
    """One server in a child process (under a guard, see the module docstring), stopped by its PID.

    The server's stdout and stderr are one pipe, read for the child's whole life by a thread that looks
    for the ready line and keeps the last :data:`OUTPUT_LINES` lines for error reports.
    """

    def __init__(self, name: str, stop_signal: int = signal.SIGTERM) -> None:
        self.name = name  # for messages: "moto test server", "redis-server"
        self.stop_signal = stop_signal  # what the guard sends the server to stop it
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._pid: Optional[int] = None  # the last guard's PID, kept after stop() so callers can check it
        self._reader: Optional[threading.Thread] = None
        self._output: Deque[str] = collections.deque(maxlen=OUTPUT_LINES)
        #: The port of the running server; None unless it is running.
        self.port: Optional[int] = None

    @property
    def pid(self) -> Optional[int]:
        """The guard's PID (the process stop() signals); the last one's after stop(); None before start()."""
        return self._pid

    def running(self) -> bool:
        """Whether a started server's process is still alive."""
        return self.port is not None and self._proc is not None and self._proc.poll() is None

    def output(self) -> str:
        """The last lines the server (and its guard) wrote to stdout or stderr."""
        return "".join(self._output)

    def start(
        self,
        command: Callable[[int], Sequence[str]],
        is_ready_line: Callable[[str], bool],
        *,
        timeout_s: float,
        port: Optional[int] = None,
        attempts: int = 3,
        env: Optional[Mapping[str, str]] = None,
        run_as: Optional[tuple[int, int]] = None,
        remove_after_stop: Optional[str] = None,
    ) -> int:
        """Run ``command(port)`` on ``port`` (or a free one) and wait at most ``timeout_s`` for a line of its
        output that ``is_ready_line`` accepts; returns the port. A server that could not bind a port it
        was not given is retried on another, ``attempts`` times in all. Raises :class:`ServerNotReady`,
        with the exit status and the output, otherwise. While running, returns the same port.

        ``run_as`` (uid, gid): the user the server runs as (the guard stays this process's user).
        ``remove_after_stop``: a directory the guard removes once it has stopped the server, so that it
        is gone even when this process dies without stopping it."""
        if self.running():
            assert self.port is not None
            return self.port
        self.stop()  # reap a previous, dead child
        tries = max(1, attempts) if port is None else 1  # a port the caller chose is not swapped for another
        for attempt in range(1, tries + 1):
            chosen = free_port() if port is None else port
            argv = list(command(chosen))
            options = ["--stop-signal", str(int(self.stop_signal))]
            if run_as is not None:
                options += ["--run-as", f"{run_as[0]}:{run_as[1]}"]
            if remove_after_stop is not None:
                options += ["--remove-after-stop", remove_after_stop]
            problem = self._launch(options, argv, is_ready_line, timeout_s, env)
            if problem is None:
                self.port = chosen
                return chosen
            status = self.stop()
            if attempt == tries or "address already in use" not in self.output().lower():
                raise ServerNotReady(
                    f"{self.name} {problem} (exit status {status}).\n"
                    f"command: {' '.join(argv)}\n"
                    f"output:\n{self.output()}"
                )
        raise AssertionError("unreachable: the last attempt raises")

    def _launch(
        self, options: list[str], argv: list[str], is_ready_line: Callable[[str], bool], timeout_s: float,
        env: Optional[Mapping[str, str]],
    ) -> Optional[str]:
        """Start the guard (with its ``options``) and the server; None once ready, else what went wrong."""
        self._output.clear()
        guarded = [sys.executable, "-I", _GUARD_SCRIPT, "--parent-pid", str(os.getpid()), *options, "--", *argv]
        self._proc = subprocess.Popen(
            guarded, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
        )
        self._pid = self._proc.pid
        ready: queue.Queue[bool] = queue.Queue()
        assert self._proc.stdout is not None
        self._reader = threading.Thread(
            target=self._read_output, args=(self._proc.stdout, is_ready_line, ready),
            name=f"fastlease-{self._proc.pid}-output", daemon=True,
        )
        self._reader.start()
        # Bounded: the reader does the blocking reads and reports True (ready) or False (EOF first).
        try:
            return None if ready.get(timeout=timeout_s) else "exited before it was ready"
        except queue.Empty:
            return f"was not ready within {timeout_s:g} s"

    def _read_output(self, stream: IO[bytes], is_ready_line: Callable[[str], bool], ready: queue.Queue[bool]) -> None:
        announced = False
        try:
            for raw in stream:
                line = raw.decode("utf-8", "replace")
                self._output.append(line)
                if not announced and is_ready_line(line):
                    announced = True
                    ready.put(True)
        except (OSError, ValueError):
            pass
        finally:
            if not announced:
                ready.put(False)

    def stop(self, timeout_s: float = 2 * GUARD_GRACE_S) -> Optional[int]:
        """SIGTERM the guard by its PID (it stops the server with the server's stop signal), wait up to
        ``timeout_s``, then SIGKILL it; returns the exit status (the server's). Idempotent: without a child
        it returns None."""
        self.port = None
        proc = self._proc
        returncode: Optional[int] = None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()  # a wedged guard: the server may outlive it, but the guard does not
                    proc.wait(timeout=timeout_s)  # SIGKILL cannot be ignored; a timeout here is a real fault
            returncode = proc.returncode
            self._proc = None  # only once it is reaped, so a failed stop() can be retried
        if self._reader is not None:
            # Both ends are dead, so the pipe is at EOF and the reader ends; join it before closing the
            # pipe, because closing a file another thread is blocked reading can itself block.
            self._reader.join(timeout=timeout_s)
            if not self._reader.is_alive() and proc is not None and proc.stdout is not None:
                proc.stdout.close()
            self._reader = None
        return returncode


class _Stop(Exception):
    """Raised in the guard's main thread by its SIGTERM/SIGINT handler."""


def _guard(
    parent_pid: int, argv: Sequence[str], stop_signal: int = signal.SIGTERM,
    run_as: Optional[tuple[int, int]] = None, remove_after_stop: Optional[str] = None,
) -> int:
    """Run ``argv`` (as ``run_as``, uid and gid) until it exits, or until this process is told to stop or
    its parent dies; then stop it with ``stop_signal`` and remove ``remove_after_stop``."""

    server: Optional[subprocess.Popen[bytes]] = None
    stop_requested = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True
        if server is not None:  # a stop during Popen is acted on once Popen has returned the server
            raise _Stop(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        user, group = (None, None) if run_as is None else run_as
        server = subprocess.Popen(  # stdout and stderr: the guard's own
            argv, stdin=subprocess.DEVNULL, user=user, group=group, extra_groups=None if run_as is None else [],
        )
        if stop_requested:
            raise _Stop()
        watch_parent(parent_pid)
        returncode = server.wait()
    except _Stop:
        assert server is not None
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second stop request must not cut the cleanup short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        server.send_signal(stop_signal)
        try:
            returncode = server.wait(timeout=GUARD_GRACE_S)
        except subprocess.TimeoutExpired:
            server.kill()
            returncode = server.wait()
        if remove_after_stop is not None:
            shutil.rmtree(remove_after_stop, ignore_errors=True)
    # A server killed by a signal: report it the way a shell does.
    return returncode if returncode >= 0 else 128 - returncode


def serve_until_stopped(prog: str, description: str, start: Callable[[Optional[int]], str],
                        stop: Callable[[], None], unavailable: type[Exception],
                        argv: Optional[Sequence[str]] = None, port_option: bool = True) -> int:
    """The command line of a test server module (``python -m fastlease.testing.redis_server`` and the
    others): start it (``--port``, 0 or left out for a free one, where ``port_option``), print one
    ``READY <address>`` line on stdout, serve until SIGTERM or SIGINT, stop it and return 0. A server
    that cannot start (``unavailable``) is one line on stderr and 1; a bad port, argparse's 2."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=description)
    if port_option:
        parser.add_argument("--port", type=int, default=0, help="port to bind; 0 (the default) picks a free one")
    args = parser.parse_args(argv)
    port = getattr(args, "port", 0)
    if not 0 <= port <= 65535:
        parser.error(f"--port must be in 0..65535, got {port}")
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            address = start(port or None)
        except unavailable as error:
            sys.stderr.write(f"{prog}: error: {error}\n")
            return 1
        try:
            sys.stdout.write(f"READY {address}\n")
            sys.stdout.flush()
            while not stopping.wait(1.0):  # woken by the signal handler; the timeout only re-checks
                pass
        finally:
            stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


#: The guard's options (see the module docstring), each followed by its value.
_GUARD_OPTIONS = ("--parent-pid", "--stop-signal", "--run-as", "--remove-after-stop")


def _main(args: Sequence[str]) -> int:
    """Parse ``--parent-pid PID [--stop-signal N] [--run-as UID:GID] [--remove-after-stop DIR] -- argv``."""
    options: dict[str, str] = {}
    rest = list(args)
    while len(rest) >= 2 and rest[0] in _GUARD_OPTIONS:
        name, value, *rest = rest
        options[name] = value
    if not rest or rest[0] != "--" or len(rest) < 2 or "--parent-pid" not in options:
        sys.stderr.write("usage: python -I _process.py --parent-pid PID [--stop-signal N] [--run-as UID:GID] "
                         "[--remove-after-stop DIR] -- COMMAND [ARG...]\n")
        return 2
    run_as: Optional[tuple[int, int]] = None
    if "--run-as" in options:
        uid, gid = options["--run-as"].split(":")
        run_as = (int(uid), int(gid))
    return _guard(int(options["--parent-pid"]), rest[1:], int(options.get("--stop-signal", signal.SIGTERM)),
                  run_as, options.get("--remove-after-stop"))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
