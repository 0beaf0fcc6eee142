"""The fast request path for the lock's own DynamoDB requests.

Plain boto3 spends ≈1.2 ms of client CPU per request here, most of it in request building, the
signer (≈40 µs, re-deriving the signing key every time) and urllib3. Lock requests are five fixed
shapes, so this transport sends them itself:

* JSON bodies byte-identical to ``json.dumps`` (ASCII, as botocore sends them): the hot requests'
  filled into their text (``bodies.Shape``), the others from one reused C encoder; responses read by
  one call of the C scanner;
* SigV4 with a cached daily signing key (``sigv4.SigV4Signer``); credentials are read from the boto3
  client's provider on *every* request, so refreshed or rotated credentials keep working;
* HTTP/1.1 keep-alive on raw sockets (TLS where the endpoint is https, verified like botocore) with a
  minimal response parser, one connection per concurrent request from a small idle pool; the request
  head is written from a per-operation prefix and the two signed values, and sent with the body in one
  ``sendall``;
* ``before-send.dynamodb.<Operation>`` is emitted on the boto3 client's event system first, and an
  answer is used when one comes back: that is how moto's ``mock_aws`` serves requests in-process, so
  fastlease keeps working inside your own ``mock_aws`` tests. It is skipped only when the emitter
  itself would call no handler (``FastTransport._may_answer``).

In an uncontended acquire+release cycle against a local moto server most of the client's CPU is the
wake-up after each response and the interpreter running cold between requests, so what counts is how
much code a request runs, not its syscalls: ``bench/dynamodb_cycle.py`` measures it.

Failure classes (what the engine needs to know):

* no connection could be made: ``StoreError(maybe_committed=False)``;
* anything after the first byte was sent (timeouts, resets, a stale keep-alive connection the server
  had closed, a malformed response): ``StoreError(maybe_committed=True)``; the engine reconciles it;
* an error response: ``ServiceError(code, message, status)``, classified by the store.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional
from urllib.parse import urlsplit

from ...exceptions import StoreError
from .bodies import Body, as_text
from .sigv4 import CONTENT_TYPE, SigV4Signer
from .transport import ServiceError, classify_unsent

if TYPE_CHECKING:
    import ssl

TARGET_PREFIX = "DynamoDB_20120810."
#: Idle keep-alive connections older than this are closed rather than reused: servers drop idle
#: connections after a while, and a request on a dropped one can only fail as "maybe committed".
IDLE_REUSE_S = 20.0
MAX_IDLE_CONNECTIONS = 8
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_HEADER_END = b"\r\n\r\n"
_decode_json = json.JSONDecoder().decode
# The C scanner under json.loads, called directly: one call for a whole document, with no Python-level
# decode()/raw_decode() frames or whitespace regexes around it. Anything it does not take whole (leading
# or trailing whitespace, a syntax error) goes to _decode_json, which also gives the precise error.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _decode_object(text: str) -> dict[str, Any]:
    """A JSON object document (all DynamoDB returns) as a dict; ValueError for anything else."""
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):  # not one whole document from the first character: let json say what it is
        value = _decode_json(text)
    if type(value) is not dict:
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    return value


class FastPathUnavailable(Exception):
    """This client's configuration needs plain boto3 (proxies, client certificates, FIPS, ...)."""


class _Connection:
    __slots__ = ("sock", "last_used", "buffer")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.last_used = time.monotonic()
        self.buffer = bytearray()


def _recv(sock: socket.socket, deadline: float) -> bytes:
    """One recv bounded by the request's overall deadline, so a trickling server cannot stretch a
    request past its timeout by sending a byte at a time."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout("request deadline passed")
    sock.settimeout(remaining)
    return sock.recv(65536)


def _field(fields: bytes, name: bytes) -> Optional[bytes]:
    """The value of the first header ``name`` (lowercase, with the leading CRLF and the colon) in
    ``fields`` (the lowercased header block, starting with CRLF), stripped of blanks; None if absent."""
    start = fields.find(name)
    if start < 0:
        return None
    start += len(name)
    end = fields.find(b"\r\n", start)
    return fields[start:end if end >= 0 else len(fields)].strip(b" \t")


def _parse_head(head: bytes) -> tuple[int, int, bool, bool]:
    """(status, content length or -1, chunked, keep_alive) of a response head (without the blank line).

    Plain finds on the lowercased block instead of a per-line loop or multiline regexes: this runs on every
    request. A Content-Length that is not a plain number is an error, not "no length".
    """
    status_line, _, fields = head.partition(b"\r\n")
    if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12 or not status_line[9:12].isdigit():
        raise ValueError(f"malformed status line {status_line!r}")
    status = int(status_line[9:12])
    fields = b"\r\n" + fields.lower()
    value = _field(fields, b"\r\ncontent-length:")
    if value is None:
        length = -1
    elif value.isdigit():
        length = int(value)
    else:
        raise ValueError(f"malformed Content-Length {value!r}")
    encoding = _field(fields, b"\r\ntransfer-encoding:")
    chunked = encoding is not None and b"chunked" in encoding
    connection = _field(fields, b"\r\nconnection:")
    if status_line.startswith(b"HTTP/1.1"):
        keep_alive = connection != b"close"
    else:
        keep_alive = connection == b"keep-alive"
    return status, length, chunked, keep_alive


def _read_response(connection: _Connection, deadline: float) -> tuple[int, bytes, bool]:
    """Read one HTTP/1.1 response: (status, body, keep_alive). Raises OSError or ValueError."""
    sock = connection.sock
    buffer = connection.buffer
    if not buffer:
        # The common case: the first recv holds exactly one whole response with a Content-Length, which is
        # then sliced once, with no buffer copies. Anything else continues below with what was read.
        data = _recv(sock, deadline)
        end = data.find(_HEADER_END)
        if end >= 0:
            status, length, chunked, keep_alive = _parse_head(data[:end])
            if not chunked and length >= 0 and len(data) - end - 4 == length:
                return status, data[end + 4:], keep_alive
        if not data:
            raise ConnectionError("connection closed before the response headers")
        buffer += data
    while True:
        end = buffer.find(_HEADER_END)
        if end >= 0:
            break
        if len(buffer) > 65536:
            raise ValueError("response headers too large")
        chunk = _recv(sock, deadline)
        if not chunk:
            raise ConnectionError("connection closed before the response headers")
        buffer += chunk
    status, length, chunked, keep_alive = _parse_head(bytes(buffer[:end]))
    del buffer[: end + 4]
    if chunked:
        return status, _read_chunked(sock, buffer, deadline), keep_alive
    if length < 0:
        # No length: the body runs to the end of the connection, which cannot be reused.
        while True:
            chunk = _recv(sock, deadline)
            if not chunk:
                break
            buffer += chunk
            if len(buffer) > MAX_RESPONSE_BYTES:
                raise ValueError("response too large")
        body = bytes(buffer)
        buffer.clear()
        return status, body, False
    if length > MAX_RESPONSE_BYTES:
        raise ValueError("response too large")
    while len(buffer) < length:
        chunk = _recv(sock, deadline)
        if not chunk:
            raise ConnectionError("connection closed inside the response body")
        buffer += chunk
    body = bytes(buffer[:length])
    del buffer[:length]
    return status, body, keep_alive


def _read_chunked(sock: socket.socket, buffer: bytearray, deadline: float) -> bytes:
    body = bytearray()
    while True:
        while b"\r\n" not in buffer:
            chunk = _recv(sock, deadline)
            if not chunk:
                raise ConnectionError("connection closed inside a chunked body")
            buffer += chunk
        line_end = buffer.find(b"\r\n")
        size = int(bytes(buffer[:line_end]).split(b";")[0].strip() or b"0", 16)
        del buffer[: line_end + 2]
        while len(buffer) < size + 2:
            chunk = _recv(sock, deadline)
            if not chunk:
                raise ConnectionError("connection closed inside a chunk")
            buffer += chunk
        if size == 0:
            # Trailers are not used by DynamoDB; the terminating CRLF was just read.
            del buffer[:2]
            return bytes(body)
        body += buffer[:size]
        del buffer[: size + 2]
        if len(body) > MAX_RESPONSE_BYTES:
            raise ValueError("response too large")


class FastTransport:
    """Sends the lock's DynamoDB requests directly (see the module docstring)."""

    name = "fast"
    _delegable_memo: Optional[tuple[Any, tuple[Any, ...]]]

    def __init__(self, boto3_client: Any, user_agent: str) -> None:
        meta = boto3_client.meta
        config = meta.config
        if getattr(config, "proxies", None) or _environment_proxy(meta.endpoint_url):
            raise FastPathUnavailable("a proxy is configured")
        if getattr(config, "client_cert", None):
            raise FastPathUnavailable("a client certificate is configured")
        if getattr(config, "use_fips_endpoint", False) or getattr(config, "use_dualstack_endpoint", False):
            raise FastPathUnavailable("FIPS or dual-stack endpoints are configured")
        url = urlsplit(meta.endpoint_url)
        if url.scheme not in ("http", "https") or not url.hostname or url.query:
            raise FastPathUnavailable(f"unsupported endpoint {meta.endpoint_url!r}")
        credentials = getattr(getattr(boto3_client, "_request_signer", None), "_credentials", None)
        if credentials is None:
            raise FastPathUnavailable("the client has no credentials")
        events = meta.events
        # boto3's meta.events is an EventAliaser around a HierarchicalEmitter: names are aliased once per
        # operation (_operation_miss) and emitted straight to the inner emitter, as the aliaser itself does.
        emitter = getattr(events, "_emitter", events)
        alias: Callable[[str], str] = getattr(events, "_alias_event_name", str)
        from botocore.exceptions import BotoCoreError

        self._verify = _verify_setting(boto3_client)
        #: What reading the credentials may raise (a refresh that failed): botocore's errors here, none
        #: in the renewal process, whose credentials are the holder's, held as plain values.
        self._credential_errors: tuple[type[Exception], ...] = (BotoCoreError,)
        self._setup(meta.endpoint_url, meta.region_name, credentials, emitter, alias, user_agent)

    @classmethod
    def for_renewal(cls, config: Any, credentials: Any) -> FastTransport:
        """The renewal process's transport, from the holder's ``renewal_config()``: no boto3 client, no
        event handlers, the holder's credentials (``update_credentials`` when they are refreshed)."""
        _, endpoint_url, region, user_agent, verify = config
        transport = cls.__new__(cls)
        transport._verify = verify
        transport._credential_errors = ()
        held = _HeldCredentials()
        held.update(credentials)
        transport._setup(endpoint_url, region, held, None, str, user_agent)
        return transport

    def renewal_config(self) -> Any:
        """What the renewal process needs to send this transport's requests (not the credentials)."""
        return (self._endpoint_url, self._signer_region, self._user_agent, self._verify)

    def renewal_credentials(self) -> Any:
        """(access key, secret key, token, expiry as epoch seconds or None), read from the provider
        (which may refresh them, as before any request), or None when they cannot be read now."""
        try:
            frozen = self._credentials.get_frozen_credentials()
        except self._credential_errors:
            return None
        expiry: Any = getattr(self._credentials, "_expiry_time", None)  # RefreshableCredentials' datetime
        return (frozen.access_key, frozen.secret_key, frozen.token,
                expiry.timestamp() if hasattr(expiry, "timestamp") else None)

    def update_credentials(self, credentials: Any) -> None:
        self._credentials.update(credentials)

    def renewal_delegable(self) -> bool:
        """False while a handler in this process may answer the lock's requests (moto's ``mock_aws``
        active, a stub): another process would send them to the endpoint instead."""
        if self._emitter is None:
            return True
        # Asked at every lease. The handlers found change only when one is (un)registered, which gives
        # botocore's emitter a new _lookup_cache (see _may_answer), so they are searched again only then;
        # their `enabled` flags (mock_aws turns its stubber on and off in place) are read every time.
        cache = getattr(self._emitter, "_lookup_cache", None)
        memo = self._delegable_memo
        if memo is not None and memo[0] is cache and type(cache) is dict:
            found = memo[1]
        else:
            handlers = getattr(self._emitter, "_handlers", None)
            if handlers is None:
                return False
            found = tuple(handlers.prefix_search(self._alias("before-send.dynamodb.UpdateItem")))
            self._delegable_memo = (cache, found)  # one attribute store: a racing thread's is as good
        return all(type(handler).__name__ == "BotocoreStubber" and getattr(handler, "enabled", True) is False
                   for handler in found)

    def _setup(self, endpoint_url: str, region: str, credentials: Any, emitter: Any, alias: Callable[[str], str],
               user_agent: str) -> None:
        url = urlsplit(endpoint_url)
        hostname = url.hostname or ""  # (__init__ refused an endpoint without one)
        self._credentials = credentials
        self._emitter = emitter
        self._alias = alias
        self._user_agent = user_agent
        self._signer_region = region
        # operation -> (target, event name, request head prefix); see _operation_miss.
        self._operations: dict[str, tuple[str, str, str]] = {}
        self._endpoint_url = endpoint_url
        self._secure = url.scheme == "https"
        self._hostname = hostname
        default_port = 443 if self._secure else 80
        self._port = url.port or default_port
        host = hostname.lower()
        if ":" in host:
            host = f"[{host}]"
        self._host_header = host if self._port == default_port else f"{host}:{self._port}"
        self._path = url.path or "/"
        self._request_url = f"{url.scheme}://{self._host_header}{self._path}"
        self._signer = SigV4Signer(region)
        self._request_line = f"POST {self._path} HTTP/1.1\r\n"
        self._fixed_headers = f"User-Agent: {user_agent}\r\nConnection: keep-alive\r\n"
        self._ssl_context = self._make_ssl_context(self._verify) if self._secure else None
        self._idle: list[_Connection] = []
        self._idle_lock = threading.Lock()
        # (the emitter's lookup cache, the before-send handlers found while it was current): see renewal_delegable
        self._delegable_memo = None

    @staticmethod
    def _make_ssl_context(verify: Any) -> ssl.SSLContext:
        """Verify certificates exactly as the boto3 client would (``_verify_setting``). ssl is imported
        here, for an https endpoint only: the renewal process of an http one (a local moto server)
        then never loads OpenSSL."""
        import ssl

        if verify is False:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        return ssl.create_default_context(cafile=verify)

    # ---- requests ----------------------------------------------------------------------------
    def call(self, operation: str, params: dict[str, Any] | Body, timeout_s: float) -> dict[str, Any]:
        body = as_text(params).encode()
        try:
            frozen = self._credentials.get_frozen_credentials()  # may refresh (STS, IMDS, a process)
        except self._credential_errors as error:  # nothing was sent
            unsent = classify_unsent(operation, error)
            raise unsent or StoreError(f"DynamoDB {operation} not sent: {error}", maybe_committed=False) from error
        target, event, head = self._operations.get(operation) or self._operation_miss(operation)
        token = frozen.token
        headers = self._signer.sign(
            host=self._host_header,
            body=body,
            target=target,
            access_key=frozen.access_key,
            secret_key=frozen.secret_key,
            token=token,
            now_s=time.time(),
            path=self._path,
        )
        answered = self._answer_in_process(event, headers, body) if self._may_answer(event) else None
        if answered is not None:
            status, payload = answered
        else:
            # The signed headers in sign()'s order (Host, Content-Type and X-Amz-Target are in `head`).
            token_line = f"X-Amz-Security-Token: {token}\r\n" if token else ""
            message = (f"{head}{headers['X-Amz-Date']}\r\n{token_line}Authorization: {headers['Authorization']}\r\n"
                       f"Content-Length: {len(body)}\r\n{self._fixed_headers}\r\n").encode("latin-1") + body
            status, payload = self._exchange(operation, message, timeout_s)
        if status == 200:
            try:
                return _decode_object(payload.decode()) if payload else {}
            except ValueError as error:  # a garbled success: the write may well have been applied
                raise StoreError(f"DynamoDB {operation}: undecodable response", maybe_committed=True) from error
        try:
            reply = _decode_object(payload.decode("utf-8", "replace"))
            code = str(reply.get("__type", "")).rpartition("#")[2]
            message_text = str(reply.get("message") or reply.get("Message") or "")
            reasons = reply.get("CancellationReasons")
        except ValueError:
            code, message_text, reasons = "", payload[:200].decode("utf-8", "replace"), None
        raise ServiceError(code or f"HTTP{status}", message_text, status,
                           reasons if type(reasons) is list else None)

    def _operation_miss(self, operation: str) -> tuple[str, str, str]:
        """(X-Amz-Target, the before-send event name as the emitter sees it, the request head up to the
        X-Amz-Date value) of an operation, built once and remembered."""
        target = TARGET_PREFIX + operation
        event = self._alias(f"before-send.dynamodb.{operation}")
        head = (f"{self._request_line}Host: {self._host_header}\r\nContent-Type: {CONTENT_TYPE}\r\n"
                f"X-Amz-Target: {target}\r\nX-Amz-Date: ")
        shape = (target, event, head)
        self._operations[operation] = shape  # a single dict store; racing threads store the same value
        return shape

    def _may_answer(self, event: str) -> bool:
        """False only when the emitter would call no handler at all for ``event``.

        Building the AWSPreparedRequest and emitting costs about as much as signing, and usually nothing
        listens (outside ``mock_aws``). botocore's HierarchicalEmitter keeps ``_lookup_cache``, event name ->
        the handlers it calls, filled by the first emit of a name and replaced by a new dict on every
        (un)register; an empty entry is exactly its own "no handlers, return []" short cut. Any other
        emitter, or a name not looked up yet since the last registration, is emitted to.
        """
        if self._emitter is None:  # the renewal process's transport: no handlers exist there
            return False
        cache = getattr(self._emitter, "_lookup_cache", None)
        if type(cache) is not dict:
            return True
        handlers = cache.get(event)
        return handlers is None or len(handlers) > 0

    def _answer_in_process(self, event: str, headers: dict[str, str], body: bytes) -> Optional[tuple[int, bytes]]:
        """Let a ``before-send`` handler (moto's ``mock_aws``) answer, as botocore itself would."""
        # Imported here: the renewal process, which has no handlers, never needs it (or urllib3).
        from botocore.awsrequest import AWSPreparedRequest

        request = AWSPreparedRequest("POST", self._request_url, headers, body, False)
        for _, response in self._emitter.emit(event, request=request):
            if response is not None:
                return int(response.status_code), bytes(response.content)
        return None

    def _exchange(self, operation: str, message: bytes, timeout_s: float) -> tuple[int, bytes]:
        connection = self._checkout()
        if connection is None:
            try:
                connection = self._connect(timeout_s)
            except OSError as error:
                raise StoreError(f"DynamoDB {operation} not sent: {error!r}", maybe_committed=False) from error
        deadline = time.monotonic() + timeout_s
        sock = connection.sock
        try:
            # Every recv sets its own timeout (what is left until the deadline), so the sendall only needs
            # one no longer than this request's: usually the last recv's left-over already is, which saves
            # a syscall per request.
            current = sock.gettimeout()
            if current is None or current > timeout_s:
                sock.settimeout(timeout_s)
            sock.sendall(message)
            status, payload, keep_alive = _read_response(connection, deadline)
        except (OSError, ValueError) as error:
            # Bytes may have reached the server (even on a keep-alive connection it had closed): the
            # write's outcome is unknown, so it must be reconciled.
            sock.close()
            raise StoreError(f"DynamoDB {operation} failed after sending: {error!r}", maybe_committed=True) from error
        if keep_alive:
            self._checkin(connection)
        else:
            sock.close()
        return status, payload

    def _connect(self, timeout_s: float) -> _Connection:
        sock = socket.create_connection((self._hostname, self._port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl_context is not None:
            try:
                sock = self._ssl_context.wrap_socket(sock, server_hostname=self._hostname)
            except BaseException:
                sock.close()
                raise
        return _Connection(sock)

    def _checkout(self) -> Optional[_Connection]:
        now = time.monotonic()
        with self._idle_lock:
            while self._idle:
                connection = self._idle.pop()
                if now - connection.last_used < IDLE_REUSE_S and not connection.buffer:
                    return connection
                connection.sock.close()
        return None

    def _checkin(self, connection: _Connection) -> None:
        connection.last_used = time.monotonic()
        with self._idle_lock:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(connection)
                return
        connection.sock.close()

    def close(self) -> None:
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.sock.close()


def _verify_setting(boto3_client: Any) -> Any:
    """The boto3 client's certificate check: False (none), or the CA bundle file it verifies with."""
    from botocore.httpsession import get_cert_path

    verify = getattr(getattr(boto3_client, "_endpoint", None), "http_session", None)
    verify = getattr(verify, "_verify", True)
    return False if verify is False else get_cert_path(verify)


class _Frozen:
    __slots__ = ("access_key", "secret_key", "token")

    def __init__(self, access_key: str, secret_key: str, token: Optional[str]) -> None:
        self.access_key, self.secret_key, self.token = access_key, secret_key, token


class _HeldCredentials:
    """The renewal process's credentials: the holder's, as last sent; refused after their expiry, so
    that a holder that cannot refresh them loses its leases instead of renewing on stale ones."""

    def __init__(self) -> None:
        self._frozen: Optional[_Frozen] = None
        self._expiry_s: Optional[float] = None

    def update(self, credentials: Any) -> None:
        if credentials is None:
            return
        access_key, secret_key, token, expiry_s = credentials
        self._frozen = _Frozen(access_key, secret_key, token)
        self._expiry_s = expiry_s

    def get_frozen_credentials(self) -> _Frozen:
        from botocore.exceptions import CredentialRetrievalError

        if self._frozen is None:
            raise CredentialRetrievalError(provider="the lease holder", error_msg="no credentials were sent")
        if self._expiry_s is not None and time.time() >= self._expiry_s:
            raise CredentialRetrievalError(provider="the lease holder",
                                           error_msg="its credentials expired and no refreshed ones came")
        return self._frozen


def _environment_proxy(endpoint_url: str) -> bool:
    """True if HTTP(S)_PROXY would apply to this endpoint, as botocore honours it."""
    import urllib.request

    url = urlsplit(endpoint_url)
    proxies = urllib.request.getproxies()
    if url.scheme not in proxies:
        return False
    return not urllib.request.proxy_bypass(url.hostname or "")
