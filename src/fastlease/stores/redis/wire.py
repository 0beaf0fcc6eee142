"""A Redis connection of our own, for the renewal process: RESP2 over a socket, nothing else.

The renewal process sends two requests, RENEW and OBSERVE (``EVALSHA``, with ``SCRIPT LOAD`` after a
``NOSCRIPT``), on a single Redis server or on the nodes of a Redis Cluster (with ``CLUSTER SLOTS`` and
``ASKING``; a ``MOVED`` or ``ASK`` reply is a ``ResponseError`` whose text the cluster store reads), and
importing redis-py for them cost it about 18 MiB of its 33 MiB (21 of 36 on a cluster). ``RedisStore``
talks to a connection through six members of redis-py's ``Connection`` (``connect``,
``send_packed_command``, ``send_command``, ``can_read``, ``read_response``, ``disconnect``, plus
``register_connect_callback`` and the two timeout attributes); this class has the same members, and
``library`` stands in for the ``redis`` module where the store reads its exceptions. So the store's
requests, error handling and reconciliation are the very code the holder runs: only the bytes on the
socket are read by other code.

What it speaks: RESP2 (no ``HELLO``; a script's reply is the same in RESP2 and RESP3), ``AUTH`` with a
username or without, ``SELECT``, ``CLIENT SETNAME``, TCP, a unix socket, and TLS through the ``ssl``
module (imported only for a ``rediss://`` store). ``SETTINGS`` lists the settings it honours; a store
configured with any other (``IGNORED`` lists those that change nothing here) is renewed through
redis-py, as before (``RedisStore.from_renewal_config``, ``RedisClusterStore.from_renewal_config``).
"""

from __future__ import annotations

import contextlib
import select
import socket

TYPE_CHECKING = False  # typing is not imported at run time: see _typing.py
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator, Optional

#: The connection settings (redis-py's names) this connection honours. ``protocol`` is accepted and
#: ignored: the replies renewal reads are the same in RESP2 and RESP3.
SETTINGS = frozenset({
    "host", "port", "path", "db", "username", "password", "client_name", "protocol",
    "socket_timeout", "socket_connect_timeout", "socket_keepalive",
    "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_ca_data",
    "ssl_check_hostname", "ssl_password", "ssl_ciphers",
})

_CRLF = b"\r\n"
_READ_SIZE = 65536


class RedisError(Exception):
    """Base of this module's errors (redis-py's names, so that the store handles both alike)."""


class ConnectionError(RedisError):  # noqa: A001 - the name the store catches, as in redis-py
    pass


class TimeoutError(RedisError):  # noqa: A001
    pass


class AuthenticationError(ConnectionError):
    pass


class ResponseError(RedisError):
    """An error reply, with its code as the message's first word (``NOSCRIPT No matching script``)."""


class NoScriptError(ResponseError):
    pass


class _NeverRaised(ResponseError):
    """redis-py's classes for replies that carry their code in the class: this connection keeps the
    code in the message instead, so ``reply_code`` reads it there and these are never raised."""


class exceptions:  # noqa: N801 - stands in for ``redis.exceptions``
    RedisError = RedisError
    ConnectionError = ConnectionError
    TimeoutError = TimeoutError
    AuthenticationError = AuthenticationError
    ResponseError = ResponseError
    NoScriptError = NoScriptError
    MovedError = AskError = MasterDownError = ClusterDownError = TryAgainError = _NeverRaised
    ClusterCrossSlotError = ReadOnlyError = OutOfMemoryError = NoPermissionError = _NeverRaised


class library:  # noqa: N801 - stands in for the ``redis`` module in ``RedisStore._redis``
    exceptions = exceptions


def pack_command(command: tuple[Any, ...]) -> bytes:
    """One command in RESP (an array of bulk strings). Our arguments are only bytes, str (UTF-8) and
    int, so this is all redis-py's encoder would do, in a third of the time."""
    parts = [b"*%d\r\n" % len(command)]
    for argument in command:
        if type(argument) is str:
            argument = argument.encode("utf-8")
        elif type(argument) is int:
            argument = b"%d" % argument
        elif type(argument) is not bytes:
            raise TypeError(f"Redis command argument of type {type(argument).__name__}")
        parts.append(b"$%d\r\n%s\r\n" % (len(argument), argument))
    return b"".join(parts)


#: Settings that only shape what redis-py does with replies or its own checks (decoding, health checks,
#: the library's name), which this connection has no use for, at any value.
IGNORED = frozenset({"socket_read_size", "encoding", "encoding_errors", "health_check_interval",
                     "legacy_responses", "lib_name", "lib_version"})


def honours(settings: dict[str, Any]) -> bool:
    """Whether this connection can connect with these settings (else redis-py renews)."""
    for name, value in settings.items():
        if value is None or value is False or name in SETTINGS or name in IGNORED:
            continue  # (None and False ask for nothing: no OCSP check, ...)
        if name == "socket_type" and value == 0:  # 0: the address's own family, as ours does
            continue
        return False
    return True


class ConnectionPool:
    """What ``RedisStore`` reads of a redis-py pool: the connection class and its settings."""

    library = library

    def __init__(self, kind: str, settings: dict[str, Any]) -> None:
        if kind not in ("tcp", "ssl", "unix"):
            raise ValueError(f"unknown Redis connection kind {kind!r}")
        self.connection_kwargs = dict(settings)
        self.kind = kind

    def connection_class(self, **settings: Any) -> Connection:
        return Connection(self.kind, settings)


class Connection:
    """One connection, used by one thread at a time (the store keeps one per thread)."""

    def __init__(self, kind: str, settings: dict[str, Any]) -> None:
        self.kind = kind
        self.settings = settings
        self.socket_timeout: Optional[float] = settings.get("socket_timeout")
        self.socket_connect_timeout: Optional[float] = settings.get("socket_connect_timeout")
        self._sock: Any = None
        self._buffer = bytearray()
        self._callbacks: list[Callable[[Connection], None]] = []

    def register_connect_callback(self, callback: Callable[[Connection], None]) -> None:
        self._callbacks.append(callback)

    # ---- connecting --------------------------------------------------------------------------
    def connect(self) -> None:
        """Open the socket and log in (a no-op when connected). Raises ConnectionError or
        TimeoutError before anything is sent, AuthenticationError when the credentials are refused."""
        if self._sock is not None:
            return
        try:
            self._sock = self._open()
        except socket.timeout as error:
            raise TimeoutError(f"connecting to {self._where()} timed out") from error
        except OSError as error:
            raise ConnectionError(f"cannot connect to {self._where()}: {error}") from error
        try:
            self._log_in()
            for callback in self._callbacks:
                callback(self)
        except BaseException:
            self.disconnect()
            raise

    def _where(self) -> str:
        settings = self.settings
        if self.kind == "unix":
            return f"unix://{settings.get('path')}"
        return f"{settings.get('host', 'localhost')}:{settings.get('port', 6379)}"

    def _open(self) -> Any:
        settings = self.settings
        if self.kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.socket_connect_timeout)
            try:
                sock.connect(settings["path"])
            except BaseException:
                sock.close()
                raise
        else:
            host = settings.get("host", "localhost")
            sock = socket.create_connection((host, settings.get("port", 6379)), self.socket_connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if settings.get("socket_keepalive"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if self.kind == "ssl":
                try:
                    sock = _tls_context(settings).wrap_socket(sock, server_hostname=host)
                except BaseException:
                    sock.close()
                    raise
        sock.settimeout(self.socket_timeout)
        return sock

    def _log_in(self) -> None:
        settings = self.settings
        password = settings.get("password")
        if password is not None:
            username = settings.get("username")
            self.send_command(*((b"AUTH", username, password) if username else (b"AUTH", password)))
            try:
                self.read_response()
            except ResponseError as error:
                raise AuthenticationError(str(error)) from None
        if settings.get("db"):
            self.send_command(b"SELECT", int(settings["db"]))
            self.read_response()
        if settings.get("client_name"):
            self.send_command(b"CLIENT", b"SETNAME", settings["client_name"])
            self.read_response()

    def disconnect(self) -> None:
        sock, self._sock = self._sock, None
        self._buffer.clear()
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    # ---- requests ------------------------------------------------------------------------------
    def send_packed_command(self, packed: Any, check_health: bool = False) -> None:
        if self._sock is None:
            self.connect()
        data = packed if isinstance(packed, bytes) else b"".join(packed)
        with self._io("sending to"):
            self._sock.sendall(data)

    def send_command(self, *args: Any, check_health: bool = False) -> None:
        self.send_packed_command(pack_command(args))

    def can_read(self, timeout: float = 0.0) -> bool:
        """Whether a reply has begun to arrive within ``timeout`` seconds."""
        sock = self._sock
        if sock is None:
            raise ConnectionError(f"not connected to {self._where()}")
        if self._buffer or (self.kind == "ssl" and sock.pending()):
            return True
        readable, _, _ = select.select([sock], [], [], timeout)
        return bool(readable)

    def read_response(self) -> Any:
        """The next reply; an error reply raises ResponseError (NoScriptError for NOSCRIPT), having
        been read whole, so the connection stays usable."""
        with self._io("reading from"):
            reply = self._parse()
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    @contextlib.contextmanager
    def _io(self, doing: str) -> Iterator[None]:
        """Socket I/O: a failure drops the connection (a reply may still be on its way, and must never
        be read as the next request's) and becomes TimeoutError or ConnectionError."""
        try:
            yield
        except socket.timeout as error:
            self.disconnect()
            raise TimeoutError(f"{doing} {self._where()} timed out") from error
        except OSError as error:
            self.disconnect()
            raise ConnectionError(f"{doing} {self._where()} failed: {error}") from error
        except (ValueError, IndexError) as error:  # (only parsing raises these)
            self.disconnect()
            raise ConnectionError(f"{self._where()} sent a reply that is not RESP: {error}") from error

    def _fill(self) -> None:
        data = self._sock.recv(_READ_SIZE)
        if not data:
            raise OSError(f"{self._where()} closed the connection")
        self._buffer += data

    def _line(self) -> bytes:
        while True:
            end = self._buffer.find(_CRLF)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 2]
                return line
            self._fill()

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size + 2:
            self._fill()
        data = bytes(self._buffer[:size])
        del self._buffer[:size + 2]
        return data

    def _parse(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._exactly(size)
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._parse() for _ in range(count)]
        if kind == b"-":
            message = rest.decode("utf-8", "replace")
            return (NoScriptError if message.startswith("NOSCRIPT") else ResponseError)(message)
        raise ValueError(f"unknown reply type {kind!r}")


def _tls_context(settings: dict[str, Any]) -> Any:
    """An ``ssl`` context from redis-py's TLS settings, with its defaults: certificates required, and
    the host name checked unless certificates are not."""
    import ssl

    context = ssl.create_default_context()
    requirement = settings.get("ssl_cert_reqs", "required")
    if isinstance(requirement, str):
        requirement = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
                       "required": ssl.CERT_REQUIRED}[requirement.lower()]
    context.check_hostname = bool(settings.get("ssl_check_hostname", True)) and requirement != ssl.CERT_NONE
    context.verify_mode = requirement
    if settings.get("ssl_ca_certs") or settings.get("ssl_ca_path") or settings.get("ssl_ca_data"):
        context.load_verify_locations(cafile=settings.get("ssl_ca_certs"), capath=settings.get("ssl_ca_path"),
                                      cadata=settings.get("ssl_ca_data"))
    if settings.get("ssl_certfile"):
        context.load_cert_chain(settings["ssl_certfile"], settings.get("ssl_keyfile"), settings.get("ssl_password"))
    if settings.get("ssl_ciphers"):
        context.set_ciphers(settings["ssl_ciphers"])
    return context
