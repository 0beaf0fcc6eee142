"""A DynamoDB endpoint that stores nothing and answers every request with success, for
``bench/dynamodb_cycle.py``: what a client's cycle costs when the server costs (almost) nothing.

moto is a Python program on the same two cores as the client: between a request and its answer it runs
a millisecond or more of its own code, and the client's code and data come back colder for it. A real
endpoint runs elsewhere. This one reads a request, waits until ``--latency-ms`` after it arrived, and
answers 200 with the ``ConsumedCapacity`` the request asked for (one entry per table of a transaction),
as DynamoDB answers an uncontended lock request. It has no table and checks no condition: a benchmark
of uncontended cycles is all it is for.

Run by ``CannedEndpoint`` (a child process on a free 127.0.0.1 port, stopped by its PID); by hand:
``.venv/bin/python bench/canned_endpoint.py --port 0 --latency-ms 5`` prints ``READY <url>``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Optional

from fastlease.testing._process import HOST, ServerProcess

READY_PREFIX = "READY "


def answer(target: str, body: bytes) -> bytes:
    """The success response's body for one request (``target``: its X-Amz-Target)."""
    request = json.loads(body or b"{}")
    reply: dict[str, Any] = {}
    if request.get("ReturnConsumedCapacity") == "TOTAL":
        if target.endswith(".TransactWriteItems"):
            tables = dict.fromkeys(next(iter(item.values()))["TableName"] for item in request["TransactItems"])
            reply["ConsumedCapacity"] = [{"TableName": table, "CapacityUnits": 2.0, "WriteCapacityUnits": 2.0}
                                         for table in tables]
        else:
            reply["ConsumedCapacity"] = {"TableName": request.get("TableName"), "CapacityUnits": 1.0}
    return json.dumps(reply).encode()


def _serve_connection(connection: socket.socket, latency_s: float) -> None:
    buffer = b""
    with connection:
        while True:  # one request after another on a kept-alive connection, until the client closes it
            while b"\r\n\r\n" not in buffer:
                data = connection.recv(65536)
                if not data:
                    return
                buffer += data
            arrived = time.monotonic()
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            fields = dict(line.split(":", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ":" in line)
            headers = {name.strip().lower(): value.strip() for name, value in fields.items()}
            length = int(headers.get("content-length", "0"))
            while len(buffer) < length:
                data = connection.recv(65536)
                if not data:
                    return
                buffer += data
            body, buffer = buffer[:length], buffer[length:]
            payload = answer(headers.get("x-amz-target", ""), body)
            response = (f"HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\n"
                        f"x-amzn-RequestId: canned\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
            time.sleep(max(0.0, arrived + latency_s - time.monotonic()))
            connection.sendall(response)


def serve(port: int, latency_ms: float) -> None:
    listener = socket.create_server((HOST, port))
    print(f"{READY_PREFIX}http://{HOST}:{listener.getsockname()[1]}", flush=True)
    while True:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_connection, args=(connection, latency_ms / 1000), daemon=True).start()


class CannedEndpoint:
    """The endpoint in a child process, for a ``with`` block: ``endpoint_url`` while it runs."""

    def __init__(self, latency_ms: float = 0.0) -> None:
        self._latency_ms = latency_ms
        self._process = ServerProcess("canned DynamoDB endpoint")
        self.endpoint_url: Optional[str] = None

    def __enter__(self) -> CannedEndpoint:
        def command(port: int) -> list[str]:
            return [sys.executable, os.path.abspath(__file__), "--port", str(port), "--latency-ms",
                    str(self._latency_ms)]

        self._process.start(command, lambda line: line.startswith(READY_PREFIX), timeout_s=30.0)
        self.endpoint_url = f"http://{HOST}:{self._process.port}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._process.stop(10.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    serve(args.port, args.latency_ms)  # (ServerProcess's guard stops it when its parent goes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
