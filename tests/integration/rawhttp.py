"""A real server on a random port, and raw HTTP clients that hang up or stop reading."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from exporter.definitions import Definitions
from exporter.settings import Settings
from exporter.web.app import create_app, make_runner
from exporter.web.config import WebConfig


@dataclass
class Served:
    """An exporter app served on 127.0.0.1 with the production runner."""

    app: web.Application
    port: int


@asynccontextmanager
async def serving(
    settings: Settings, definitions: Definitions, web_config: WebConfig | None = None
) -> AsyncIterator[Served]:
    """Serve the exporter with the same runner options as production."""
    app = create_app(settings, definitions, web_config)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Served(app, port)
    finally:
        await runner.cleanup()


Start = Callable[..., Awaitable[Served]]  # the ``start`` fixture: (cluster, yaml, **settings)


@dataclass
class Response:
    """What a raw client read back."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


class RawClient:
    """One HTTP/1.1 request on its own socket, so the test controls hang-ups and reading."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def send(
        cls,
        port: int,
        path: str = "/metrics",
        headers: dict[str, str] | None = None,
        *,
        receive_buffer: int | None = None,
        method: str = "GET",
    ) -> RawClient:
        """Connect and send a GET; a small receive buffer makes a slow reader."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        return cls(reader, writer)

    async def response(self, limit: float = 60.0) -> Response:
        """Read the whole response (the server closes the connection after it)."""
        async with asyncio.timeout(limit):
            head = await self.reader.readuntil(b"\r\n\r\n")
            body = await self.reader.read()
        self.hang_up()
        status_line, *header_lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in header_lines if ": " in line)
        return Response(int(status_line.split()[1]), headers, body)

    def hang_up(self) -> None:
        """Close the socket without reading further: the client went away."""
        self.writer.close()


async def get(port: int, path: str = "/metrics", **headers: str) -> Response:
    """A complete request and response."""
    client = await RawClient.send(port, path, headers)
    return await client.response()


async def poll(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    """Wait until ``check`` holds, yielding to the event loop; fail after ``within`` s."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def poll_async(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    """Like :func:`poll` for checks that block (psql), run off the event loop."""
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
