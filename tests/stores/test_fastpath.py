"""The fast request path's transport: real sockets on 127.0.0.1 against scripted HTTP servers, and
moto's mock_aws through ``before-send``."""

from __future__ import annotations

import json
import socket
import threading
from typing import Callable, Optional

import boto3
import pytest
from moto import mock_aws

from fastlease import SyncDistributedLock
from fastlease.dynamodb import DynamoDBClient
from fastlease.exceptions import StoreError
from fastlease.stores._fastpath import FastTransport
from fastlease.stores.dynamodb import ServiceError

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

    def __init__(self, script: Callable[[int], Optional[bytes]]) -> None:
        self.script = script
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

    def start(script):
        server = ScriptedServer(script)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def transport_for(port: int) -> FastTransport:
    client = boto3.client("dynamodb", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="AKID", aws_secret_access_key="secret")
    return FastTransport(client, "fastlease-test")


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
