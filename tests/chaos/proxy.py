"""A TCP fault proxy on 127.0.0.1 (asyncio, in a thread of the harness), between clients and a server.

These machines have neither netem nor toxiproxy, so faults are made here, at the byte level, which
serves DynamoDB's HTTP and Redis's RESP alike. ``set_fault(name, seconds)`` starts a fault:

* ``lost_response``: the next reply from the server is dropped and that connection reset: the request
  was applied, and the client never learns it (one-shot);
* ``late_commit``: client bytes are held for ``seconds`` and then delivered anyway: the client has
  given up by then, and the server applies the request late;
* ``stall``: every byte in both directions is held for ``seconds``, then delivered;
* ``partition``: every byte in both directions is dropped for ``seconds`` (connections stay open);
* ``reset``: every open connection is reset now.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Optional

FAULTS = ("lost_response", "late_commit", "stall", "partition", "reset")


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._server: Optional[asyncio.base_events.Server] = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._fault: Optional[str] = None
        self._until = 0.0
        self.port = 0
        self.injected: dict[str, int] = dict.fromkeys(FAULTS, 0)

    def start(self) -> int:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self.port

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def set_fault(self, name: str, seconds: float = 0.0) -> None:
        """Start fault ``name`` (one of FAULTS) for ``seconds`` (one-shot faults ignore it)."""
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}")
        self.injected[name] += 1
        if name == "reset":
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._reset_all)
            return
        self._fault, self._until = name, time.monotonic() + seconds

    def _active(self) -> Optional[str]:
        if self._fault is not None and self._fault != "lost_response" and time.monotonic() >= self._until:
            self._fault = None
        return self._fault

    def _reset_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, server_writer))
        try:
            await asyncio.gather(self._pump(client_reader, server_writer, True, client_writer),
                                 self._pump(server_reader, client_writer, False, server_writer))
        finally:
            for writer in (client_writer, server_writer):
                self._writers.discard(writer)
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool,
                    other: asyncio.StreamWriter) -> None:
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                fault = self._active()
                if fault == "partition":
                    continue  # dropped on the floor
                if fault == "stall" or (fault == "late_commit" and upstream):
                    await asyncio.sleep(max(0.0, self._until - time.monotonic()))
                if fault == "lost_response" and not upstream:
                    self._fault = None  # one-shot: this reply is lost, and the connection with it
                    writer.transport.abort()
                    other.transport.abort()
                    break
                writer.write(chunk)
                await writer.drain()
            writer.close()  # end of stream: pass it on after what was written (a late commit included)
        except (ConnectionError, OSError):
            writer.transport.abort()
            other.transport.abort()
