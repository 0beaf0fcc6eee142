"""The fast request path's transport: real sockets on 127.0.0.1 against scripted HTTP servers, and
moto's mock_aws through ``before-send``."""

from __future__ import annotations

import calendar
import datetime
import ipaddress
import json
import socket
import ssl
import threading
import time
from typing import Any, Callable, Optional

import boto3
import pytest
from moto import mock_aws

from fastlease import SyncDistributedLock
from fastlease.dynamodb import DynamoDBClient
from fastlease.exceptions import StoreError
from fastlease.stores.dynamodb.bodies import encode_json
from fastlease.stores.dynamodb.fastpath import FastTransport
from fastlease.stores.dynamodb.sigv4 import SigV4Signer
from fastlease.stores.dynamodb.transport import ServiceError

OK_BODY = b'{"ConsumedCapacity":{"TableName":"t","CapacityUnits":0.5}}'


def response(body: bytes = OK_BODY, status: str = "200 OK", extra: str = "", chunked: bool = False) -> bytes:
    if chunked:
        half = len(body) // 2
        payload = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in (body[:half], body[half:]) if p)
        payload += b"0\r\n\r\n"
        head = f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n{extra}\r\n"
        return head.encode() + payload
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


class ScriptedServer:
    """A one-thread HTTP server on 127.0.0.1: for each request, ``script(n)`` gives the bytes to send
    (None: close the connection without answering; b"": never answer)."""

    def __init__(self, script: Callable[[int], Optional[bytes]], tls: Optional[ssl.SSLContext] = None) -> None:
        self.script = script
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            if self.tls is not None:
                try:
                    conn.settimeout(2.0)
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except OSError:  # the client refused the certificate
                    conn.close()
                    continue
            with conn:
                conn.settimeout(0.1)  # short, so close() is noticed promptly
                buffer = b""
                while not self.stop.is_set():
                    try:
                        while b"\r\n\r\n" not in buffer:
                            try:
                                chunk = conn.recv(65536)
                            except socket.timeout:
                                if self.stop.is_set():
                                    raise ConnectionError from None
                                continue
                            if not chunk:
                                raise ConnectionError
                            buffer += chunk
                        head, _, rest = buffer.partition(b"\r\n\r\n")
                        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                          if line.lower().startswith(b"content-length")))
                        while len(rest) < length:
                            chunk = conn.recv(65536)
                            if not chunk:  # the peer closed mid-body
                                raise ConnectionError
                            rest += chunk
                        self.requests.append(head + b"\r\n\r\n" + rest[:length])
                        buffer = rest[length:]
                    except (OSError, ConnectionError, StopIteration):
                        break
                    answer = self.script(len(self.requests))
                    if answer is None:
                        break
                    if answer == b"":
                        self.stop.wait(10)
                        break
                    if isinstance(answer, list):  # trickle: one piece every 0.1 s
                        for piece in answer:
                            conn.sendall(piece)
                            if self.stop.wait(0.1):
                                break
                        continue
                    conn.sendall(answer)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def scripted():
    servers = []

    def start(script, tls=None):
        server = ScriptedServer(script, tls)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def boto3_client_for(port: int, token: Optional[str] = None) -> Any:
    return boto3.client("dynamodb", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                        aws_access_key_id="AKID", aws_secret_access_key="secret", aws_session_token=token)


def transport_for(port: int) -> FastTransport:
    return FastTransport(boto3_client_for(port), "fastlease-test")


GET = ("GetItem", {"TableName": "t", "Key": {"key": {"S": "k"}}, "ConsistentRead": True})


def test_keep_alive_reuses_one_connection_and_sends_signed_json(scripted):
    server = scripted(lambda n: response())
    transport = transport_for(server.port)
    for _ in range(3):
        assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    transport.close()
    assert server.connections == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert json.loads(body) == GET[1]
    assert b"X-Amz-Target: DynamoDB_20120810.GetItem" in head
    assert b"Authorization: AWS4-HMAC-SHA256 Credential=AKID/" in head
    assert f"Host: 127.0.0.1:{server.port}".encode() in head


def test_chunked_and_connection_close_responses(scripted):
    server = scripted(lambda n: response(chunked=True) if n == 1 else response(extra="Connection: close\r\n"))
    transport = transport_for(server.port)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)  # the server closed: a new connection
    assert server.connections == 2


def test_error_responses_become_service_errors(scripted):
    body = b'{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"no"}'
    server = scripted(lambda n: response(body, status="400 Bad Request"))
    with pytest.raises(ServiceError) as info:
        transport_for(server.port).call(*GET, 2.0)
    assert (info.value.code, info.value.message, info.value.status) == ("ConditionalCheckFailedException", "no", 400)


def test_a_garbled_success_response_may_have_committed(scripted):
    server = scripted(lambda n: response(b"{not json"))
    with pytest.raises(StoreError) as info:
        transport_for(server.port).call(*GET, 2.0)
    assert info.value.maybe_committed is True


def test_refused_connection_is_not_committed():
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    with pytest.raises(StoreError) as info:
        transport_for(port).call(*GET, 1.0)
    assert info.value.maybe_committed is False


def test_a_dropped_connection_after_sending_may_have_committed(scripted):
    server = scripted(lambda n: None)  # reads the request, then hangs up without answering
    with pytest.raises(StoreError) as info:
        transport_for(server.port).call(*GET, 2.0)
    assert info.value.maybe_committed is True


def test_a_timeout_after_sending_may_have_committed(scripted):
    server = scripted(lambda n: b"")  # never answers
    with pytest.raises(StoreError) as info:
        transport_for(server.port).call(*GET, 0.2)
    assert info.value.maybe_committed is True


def test_a_trickling_response_cannot_stretch_the_request_timeout(scripted):
    whole = response()
    server = scripted(lambda n: [whole[i:i + 1] for i in range(len(whole))])  # ~0.1 s per byte
    with pytest.raises(StoreError) as info:
        transport_for(server.port).call(*GET, 0.35)
    assert info.value.maybe_committed is True


def test_a_stale_keep_alive_connection_is_ambiguous_then_replaced(scripted):
    # First request answered keep-alive, then the server drops that connection silently.
    server = scripted(lambda n: response() if n % 2 == 1 else None)
    transport = transport_for(server.port)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    with pytest.raises(StoreError) as info:  # sent on the reused connection the server dropped
        transport.call(*GET, 2.0)
    assert info.value.maybe_committed is True
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)  # a fresh connection
    assert server.connections == 2


def test_credentials_are_read_on_every_request():
    with mock_aws():
        session = boto3.session.Session(aws_access_key_id="AKIDFIRST", aws_secret_access_key="s1",
                                        region_name="us-east-1")
        user = session.client("dynamodb")
        seen: list[str] = []

        def record(request, **kwargs):
            value = request.headers["Authorization"]
            seen.append(value.decode() if isinstance(value, bytes) else value)

        user.meta.events.register("before-send.dynamodb.*", record)
        client = DynamoDBClient(user)
        try:
            assert client.transport == "fast"
            client.create_lock_table("locks")
            with SyncDistributedLock(client, table="locks", key="k"):
                credentials = user._request_signer._credentials
                credentials.access_key = "AKIDROTATED"  # a provider refresh, as boto3 would do
                credentials.secret_key = "s2"
            lock_requests = [auth for auth in seen if "AKIDFIRST" in auth or "AKIDROTATED" in auth]
            assert "Credential=AKIDFIRST/" in lock_requests[-2]  # the acquire (after CreateTable)
            assert "Credential=AKIDROTATED/" in lock_requests[-1]  # the release
        finally:
            client.close()


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////token+/="])
def test_the_head_sent_is_what_is_signed(scripted, token):
    """The transport writes the request head itself (no header dict): its signed headers, in order, must be
    exactly what the signer signs for the same request at the second it names."""
    server = scripted(lambda n: response())
    transport = FastTransport(boto3_client_for(server.port, token), "fastlease-test")
    transport.call(*GET, 2.0)
    transport.close()
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    assert request_line == "POST / HTTP/1.1"
    sent = [tuple(line.split(": ", 1)) for line in lines]
    now_s = calendar.timegm(time.strptime(dict(sent)["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    signed = SigV4Signer("us-east-1").sign(host=f"127.0.0.1:{server.port}", body=body,
                                           target="DynamoDB_20120810.GetItem", access_key="AKID",
                                           secret_key="secret", token=token, now_s=now_s)
    assert sent == [*signed.items(), ("Content-Length", str(len(body))), ("User-Agent", "fastlease-test"),
                    ("Connection", "keep-alive")]


class CannedResponse:
    status_code = 200
    content = b'{"Item":{"key":{"S":"canned"}}}'


def test_a_before_send_handler_registered_after_requests_still_answers(scripted):
    """Emitting is skipped only while the emitter would call no handler; registering one must end that."""
    server = scripted(lambda n: response())
    user = boto3_client_for(server.port)
    transport = FastTransport(user, "fastlease-test")
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    seen: list[Any] = []

    def answer(request, **kwargs):
        seen.append(request)
        return CannedResponse()

    user.meta.events.register("before-send.dynamodb.GetItem", answer)
    assert transport.call(*GET, 2.0) == json.loads(CannedResponse.content)
    assert json.loads(seen[0].body) == GET[1]
    assert "Credential=AKID/" in seen[0].headers["Authorization"]
    user.meta.events.unregister("before-send.dynamodb.GetItem", answer)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    transport.close()
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    "answer, connections",
    [
        pytest.param(f"HTTP/1.1 200 OK\r\ncontent-length:{len(OK_BODY)}\r\n\r\n".encode() + OK_BODY, 1, id="lowercase"),
        pytest.param(f"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: \t{len(OK_BODY)} \r\nX-A: b\r\n\r\n".encode() + OK_BODY, 1,
                     id="blanks"),
        pytest.param(f"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: {len(OK_BODY)}\r\n\r\n".encode()
                     + OK_BODY, 1, id="http10-keep-alive"),
        pytest.param(response(extra="Connection: CLOSE\r\n"), 2, id="close-uppercase"),
        pytest.param(response(extra="connection:close\r\n"), 2, id="close-lowercase"),
        pytest.param(f"HTTP/1.0 200 OK\r\nContent-Length: {len(OK_BODY)}\r\n\r\n".encode() + OK_BODY, 2, id="http10"),
    ],
)
def test_response_heads_are_read_case_and_blank_insensitively(scripted, answer, connections):
    """Header names in any case, blanks around values; a connection is reused unless the response closes it."""
    server = scripted(lambda n: answer)
    transport = transport_for(server.port)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    transport.close()
    assert server.connections == connections


def test_a_response_in_pieces_is_reassembled(scripted):
    whole = response()
    cut = whole.index(b"\r\n\r\n")
    # The head without its blank line, then the rest: the first recv cannot hold the whole response.
    server = scripted(lambda n: [whole[:cut], whole[cut:cut + 3], whole[cut + 3:]])
    transport = transport_for(server.port)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    transport.close()
    assert server.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n{}", id="bad-length"),
        pytest.param(b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n{}", id="bad-status"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]", id="not-an-object"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{}}", id="trailing-garbage"),
    ],
)
def test_a_malformed_response_may_have_committed(scripted, answer):
    server = scripted(lambda n: answer)
    with pytest.raises(StoreError) as info:
        transport_for(server.port).call(*GET, 2.0)
    assert info.value.maybe_committed is True


def test_blanks_around_a_json_body_are_accepted(scripted):
    body = b" \r\n" + OK_BODY + b"\n "
    server = scripted(lambda n: response(body))
    assert transport_for(server.port).call(*GET, 2.0) == json.loads(OK_BODY)


@pytest.mark.parametrize(
    "params",
    [
        GET[1],
        {"TableName": "t", "Item": {"k": {"S": "é日本🔒\"\\\n\x00"}, "n": {"N": "-12"}}, "B": True, "F": False,
         "L": [1, 2.5, None, {"x": []}]},
    ],
)
def test_bodies_are_encoded_as_json_dumps_does(params):
    assert encode_json(params) == json.dumps(params, separators=(",", ":"))
    assert encode_json(params).isascii()


def test_an_unencodable_value_is_a_type_error():
    with pytest.raises(TypeError):
        encode_json({"k": object()})


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for 127.0.0.1: (server context, path of the certificate to trust)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context, str(cert_path)


def tls_transport_for(port: int, verify: Any) -> FastTransport:
    client = boto3.client("dynamodb", endpoint_url=f"https://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="AKID", aws_secret_access_key="secret", verify=verify)
    return FastTransport(client, "fastlease-test")


def test_tls_keep_alive_with_a_trusted_certificate(scripted, certificate):
    context, cert_path = certificate
    whole = response()
    cut = whole.index(b"\r\n\r\n")
    answers = [response(), [whole[:cut], whole[cut:]], response(chunked=True)]
    server = scripted(lambda n: answers[(n - 1) % 3], tls=context)
    transport = tls_transport_for(server.port, cert_path)
    for _ in range(4):
        assert transport.call(*GET, 2.0) == json.loads(OK_BODY)
    transport.close()
    assert server.connections == 1
    assert json.loads(server.requests[0].partition(b"\r\n\r\n")[2]) == GET[1]


def test_tls_with_an_untrusted_certificate_is_not_sent(scripted, certificate):
    context, _ = certificate
    server = scripted(lambda n: response(), tls=context)
    with pytest.raises(StoreError) as info:
        tls_transport_for(server.port, True).call(*GET, 2.0)  # the system CAs do not know this certificate
    assert info.value.maybe_committed is False
    assert server.requests == []


def test_delegability_follows_handlers_registered_and_switched_after_the_first_look():
    """renewal_delegable, asked at every lease, remembers the handlers it found until one is registered
    or unregistered; a handler switched on in place (moto's stubber under ``mock_aws``) is seen at once."""
    transport = FastTransport(boto3_client_for(1), "fastlease-test")
    events = transport._emitter
    try:
        assert transport.renewal_delegable() and transport.renewal_delegable()
        with mock_aws():
            assert not transport.renewal_delegable()
        assert transport.renewal_delegable()

        def answer(**kwargs):
            return None

        events.register("before-send.dynamodb.UpdateItem", answer)
        assert not transport.renewal_delegable()
        events.unregister("before-send.dynamodb.UpdateItem", answer)
        assert transport.renewal_delegable()
    finally:
        transport.close()
