"""A moto DynamoDB test server that handles one request at a time.

Why this exists: stock ``moto_server`` serves requests on many threads, and moto's DynamoDB backend does not
make a conditional write atomic (the condition is checked, then the item is written, with no lock around
the two). Under concurrent conditional puts it can let two writers both "win" (one measurement found 3 double
winners in 1,600 four-way ``attribute_not_exists`` races; the window is narrow, so it is rare and timing
dependent, which makes it worse, not better: a flaky false pass or fail). A lock library cannot be tested
against a store that breaks the very guarantee it relies on, so this module runs moto's own WSGI
application behind a middleware that holds one global lock for each whole request. Connections are still
accepted concurrently (a threaded HTTP/1.1 keep-alive server), so clients really do race on the wire; only
the store's handling of them is serialised, which is what real DynamoDB guarantees per item.

Use it as a script::

    python -m fastlease.testing.moto_server --host 127.0.0.1 --port 0
    READY http://127.0.0.1:40123

or from tests and benchmarks::

    with MotoServer() as server:
        client = boto3.client("dynamodb", endpoint_url=server.endpoint_url, ...)

moto is a test dependency (``pip install 'fastlease[testing]'`` installs it, with boto3 and pytest). Its
heavy imports happen lazily, in the server process only; importing this module just checks that moto is
installed, so that a missing moto is reported here, by name, rather than as a child process that never
becomes ready.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import signal
import socketserver
import sys
import threading
import time
from typing import IO, Any, Callable, Iterable, List, Optional, Sequence

from ._process import HOST, ServerProcess, watch_parent

__all__ = ["MotoServer", "SerialisedWSGIApp", "serve", "main", "ALLOWED_HOST", "INSTALL_HINT"]

#: The only address the server binds. Tests must never expose a fake AWS endpoint beyond loopback.
ALLOWED_HOST = HOST
#: What to run where moto's server mode is missing: the extra that installs what fastlease.testing needs.
INSTALL_HINT = "pip install 'fastlease[testing]'"
#: The start of the one line the server prints on stdout once it listens: ``READY http://127.0.0.1:<port>``.
READY_PREFIX = "READY "

# moto's server mode needs these at run time; flask and flask_cors come with the ``server`` extra.
_REQUIRED_MODULES = ("moto", "flask", "flask_cors", "werkzeug")
_missing = [name for name in _REQUIRED_MODULES if importlib.util.find_spec(name) is None]
if _missing:
    raise ImportError(
        f"fastlease.testing.moto_server needs moto's server mode (missing: {', '.join(_missing)}); "
        f"install it with: {INSTALL_HINT}"
    )
del _missing

_StartResponse = Callable[..., Any]
_WSGIApp = Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]


class SerialisedWSGIApp:
    """WSGI middleware: at most one request at a time inside the wrapped application.

    The lock covers calling the application *and* iterating and closing its response, because a WSGI
    application may do its work lazily while its body is iterated; releasing the lock when the call
    returns would let that work overlap the next request. The body is therefore buffered under the lock
    and sent after it is released; the server reads each request body off the socket before calling the
    application, so a slow client (in either direction) never holds up the others.

    The wait for the lock is bounded: if the application wedges, later requests get a 503 after
    ``lock_timeout_s`` instead of hanging forever.
    """

    def __init__(self, app: _WSGIApp, *, lock_timeout_s: float = 120.0) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._lock_timeout_s = lock_timeout_s

    def __call__(self, environ: dict[str, Any], start_response: _StartResponse) -> List[bytes]:
        if not self._lock.acquire(timeout=self._lock_timeout_s):
            body = b'{"__type":"com.amazonaws.dynamodb.v20120810#ServiceUnavailable","message":"server wedged"}'
            start_response(
                "503 Service Unavailable",
                [("Content-Type", "application/x-amz-json-1.0"), ("Content-Length", str(len(body)))],
            )
            return [body]
        try:
            result = self._app(environ, start_response)
            try:
                return [b"".join(result)]
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        finally:
            self._lock.release()


def _check_host(host: str) -> None:
    if host != ALLOWED_HOST:
        raise ValueError(f"refusing to bind {host!r}: the moto test server only ever binds {ALLOWED_HOST}")


def _load_moto() -> Any:
    """Import moto's server pieces (slow, and only needed in the server process)."""
    try:
        from moto.moto_server import werkzeug_app
    except ImportError as error:
        raise ImportError(
            f"fastlease.testing.moto_server needs moto's server mode ({error}); install: {INSTALL_HINT}"
        ) from error
    return werkzeug_app


class _KeepAliveHandler(socketserver.StreamRequestHandler):
    """HTTP/1.1 with keep-alive, as real DynamoDB endpoints behave.

    werkzeug's development server always answers ``Connection: close``, which would make every client
    open a TCP connection per request and leave the clients' connection reuse (and the ambiguity of a
    request sent on a connection the server has dropped) untested. Requests are small and carry a
    Content-Length (every AWS SDK sends one for DynamoDB), so a minimal parser is enough.
    """

    server: KeepAliveWSGIServer  # the server this handler is made by (socketserver sets it)

    def handle(self) -> None:
        while True:
            request_line = self.rfile.readline(65537)
            if not request_line:
                return
            if request_line in (b"\r\n", b"\n"):
                continue
            method, target, version = request_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
            headers: dict[str, str] = {}
            for _ in range(200):
                line = self.rfile.readline(65537)
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                key = name.strip().lower()
                headers[key] = f"{headers[key]},{value.strip()}" if key in headers else value.strip()
            body = self.rfile.read(int(headers.get("content-length") or 0))
            arrived = time.monotonic()
            close = version != "HTTP/1.1" or headers.get("connection", "").lower() == "close"
            status, response_headers, payload = self._call_app(method, target, headers, body)
            if self.server.verbose:
                sys.stderr.write(f"{method} {target} {headers.get('x-amz-target', '')} -> {status}\n")
            # Outside the serialising lock: other connections' requests go on meanwhile.
            time.sleep(max(0.0, arrived + self.server.latency_s - time.monotonic()))
            head = [f"HTTP/1.1 {status}"]
            head += [f"{name}: {value}" for name, value in response_headers
                     if name.lower() not in ("content-length", "connection", "transfer-encoding")]
            head += [f"Content-Length: {len(payload)}", f"Connection: {'close' if close else 'keep-alive'}"]
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
            self.wfile.flush()
            if close:
                return

    def _call_app(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[str, list[tuple[str, str]], bytes]:
        path, _, query = target.partition("?")
        host, port = self.server.server_address[:2]
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": host,
            "SERVER_PORT": str(port),
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": self.client_address[0],
            "CONTENT_TYPE": headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for name, value in headers.items():
            if name not in ("content-type", "content-length"):
                environ["HTTP_" + name.upper().replace("-", "_")] = value
        started: list[Any] = []

        def start_response(
            status: str, response_headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], None]:
            started[:] = [status, response_headers]
            return chunks.append

        chunks: list[bytes] = []
        result = self.server.app(environ, start_response)
        try:
            chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return started[0], started[1], b"".join(chunks)


class KeepAliveWSGIServer(socketserver.ThreadingTCPServer):
    """A threaded HTTP/1.1 keep-alive server for one WSGI app (moto's, serialised)."""

    daemon_threads = True
    allow_reuse_address = True
    server_address: tuple[str, int]  # an AF_INET server's (host, port)

    def __init__(self, address: tuple[str, int], app: Any, *, verbose: bool = False, latency_s: float = 0.0) -> None:
        self.app = app
        self.verbose = verbose  # one line per request on stderr (off: a piped stderr would fill up)
        #: No response leaves sooner than this after its request arrived (see serve()'s ``latency_ms``).
        self.latency_s = latency_s
        super().__init__(address, _KeepAliveHandler)

    @property
    def port(self) -> int:
        """The port the server listens on (the one picked when it was given 0)."""
        return int(self.server_address[1])


class _Stop(Exception):
    """Raised in the main thread by the SIGTERM/SIGINT handler to leave serve_forever()."""


def serve(
    host: str = ALLOWED_HOST,
    port: int = 0,
    *,
    parent_pid: Optional[int] = None,
    verbose: bool = False,
    ready_stream: Optional[IO[str]] = None,
    latency_ms: float = 0.0,
) -> None:
    """Run the serialised moto server in this process until SIGTERM or SIGINT. Main thread only.

    Prints exactly one ``READY http://127.0.0.1:<port>`` line to ``ready_stream`` (stdout) once the socket
    is listening. With ``parent_pid``, the server also stops when that process goes away. With
    ``latency_ms``, no response leaves sooner than that after its request arrived, whatever the operation,
    as with a remote endpoint: a benchmark of client CPU needs it, because on these machines a client's
    CPU per request grows with how long it idles between requests (caches and cores go cold), and moto
    takes longer over some operations (a transaction) than others.
    """
    _check_host(host)
    werkzeug_app = _load_moto()

    # The same factory pair moto's own ``moto_server`` and ThreadedMotoServer use: a dispatcher that builds
    # one Flask app per AWS service on demand. We wrap the dispatcher, so every service is serialised.
    app = SerialisedWSGIApp(werkzeug_app.DomainDispatcherApplication(werkzeug_app.create_backend_app))
    server = KeepAliveWSGIServer((host, port), app, verbose=verbose, latency_s=latency_ms / 1000)
    # Some moto services build URLs (e.g. SQS queue URLs) from MOTO_PORT, as moto_server sets it.
    os.environ.setdefault("MOTO_PORT", str(server.port))  # noqa: SIM112

    def on_signal(signum: int, frame: Any) -> None:
        raise _Stop(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    if parent_pid is not None:
        watch_parent(parent_pid)  # SIGTERMs this process, which on_signal turns into a clean stop
    stream = ready_stream if ready_stream is not None else sys.stdout
    try:
        # The server has already bound and listened, so clients that connect now simply queue.
        stream.write(f"{READY_PREFIX}http://{host}:{server.port}\n")
        stream.flush()
        server.serve_forever(poll_interval=0.2)
    except _Stop:
        pass
    finally:
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``python -m fastlease.testing.moto_server`` entry point: serve until SIGTERM or SIGINT, then return 0.
    A host other than 127.0.0.1 or a bad port exits with status 2."""
    parser = argparse.ArgumentParser(
        prog="python -m fastlease.testing.moto_server",
        description="moto DynamoDB test server with every request serialised (loopback only).",
    )
    parser.add_argument("--host", default=ALLOWED_HOST, help=f"address to bind; only {ALLOWED_HOST} is accepted")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="send no response sooner than this after its request arrived (default 0)")
    args = parser.parse_args(argv)
    try:
        _check_host(args.host)
    except ValueError as error:
        parser.error(str(error))  # exits with status 2 and the message on stderr
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    if not 0 <= args.latency_ms <= 60_000:
        parser.error(f"--latency-ms must be in 0..60000, got {args.latency_ms}")
    serve(args.host, args.port, parent_pid=args.parent_pid, verbose=args.verbose, latency_ms=args.latency_ms)
    return 0


class MotoServer:
    """A serialised moto server in a child process, started by the launcher of
    :mod:`fastlease.testing._process` and stopped by its PID.

    The child is ``sys.executable -m fastlease.testing.moto_server``; a separate process keeps moto's global
    state and its request threads out of the process under test, and it can be killed if it wedges. It runs
    in the caller's session and process group (so a terminal Ctrl-C reaches it too) and it stops on its
    own when this process dies.
    """

    def __init__(self, host: str = ALLOWED_HOST, *, latency_ms: float = 0.0) -> None:
        # Not validated here on purpose: the child refuses any other host and latency, and start() reports that.
        self._host = host
        self._latency_ms = latency_ms
        self._process = ServerProcess(f"moto test server (host {host!r})")

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``; RuntimeError unless running."""
        if self._process.port is None:
            raise RuntimeError("MotoServer is not running; call start() first")
        return f"http://{self._host}:{self._process.port}"

    @property
    def pid(self) -> int:
        """The PID stop() signals (the server's guard, which stops the server); still the last one's after
        stop(), so callers can check it is gone. RuntimeError if it was never started."""
        if self._process.pid is None:
            raise RuntimeError("MotoServer was never started")
        return self._process.pid

    def start(self, timeout_s: float = 30.0) -> str:
        """Start the child and wait (at most ``timeout_s``) for its READY line; returns the endpoint URL.

        Raises RuntimeError, with the child's exit status and output, if it is not ready in time. A second
        call while running returns the same URL.
        """
        env = dict(os.environ)
        # Make the child import this very copy of fastlease, installed or not.
        src_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src_dir, env.get("PYTHONPATH")) if p)

        def command(port: int) -> list[str]:
            return [sys.executable, "-m", "fastlease.testing.moto_server", "--host", self._host, "--port", str(port),
                    "--latency-ms", str(self._latency_ms)]

        self._process.start(command, _is_ready_line, timeout_s=timeout_s, env=env)
        return self.endpoint_url

    def stop(self, timeout_s: float = 10.0) -> Optional[int]:
        """SIGTERM the child (the guard, which stops the server), wait up to ``timeout_s``, then SIGKILL it;
        returns the exit status (the server's).

        Idempotent: without a child (never started, already stopped) it does nothing and returns None.
        """
        return self._process.stop(timeout_s)

    def __enter__(self) -> "MotoServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.endpoint_url}, pid {self.pid}" if self._process.running() else "stopped"
        return f"<MotoServer {state}>"


def _is_ready_line(line: str) -> bool:
    return line.startswith(READY_PREFIX)


if __name__ == "__main__":
    sys.exit(main())
