"""The HTTP/1.1 plumbing of the stand-in: reading a request, the tracked
connection, writing response heads, chunked bodies and OpenAI-style errors.

All of it runs on the server thread's event loop. A client that has gone away
shows up as ``ClientGoneError`` from ``write`` and ``Conn.pause``; a request
the server refuses as an ``HTTPError``, which ``send_error`` answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

HOST = "127.0.0.1"
CREATED = 1_700_000_000  # the fixed `created` of every reply: replies are deterministic
_HEADER_LIMIT = 64 * 1024  # bytes of a request line plus headers
_DRAIN_FACTOR = 8  # an oversized body up to this many times the cap is read before 413
STREAM_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "transfer-encoding": "chunked",
    "cache-control": "no-cache",
}
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


class HTTPError(Exception):
    """A request the server answers with an error status and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
        self.headers = dict(headers or {})
        self.close = close


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class TrackedProtocol(asyncio.StreamReaderProtocol):
    """A stream connection that stays in ``transports`` until it is lost, so
    ``close()`` can end it even if its handler never started; one made once
    ``stopping`` is set is aborted at once."""

    def __init__(
        self,
        transports: set[asyncio.Transport],
        stopping: asyncio.Event,
        handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    ) -> None:
        super().__init__(asyncio.StreamReader(limit=_HEADER_LIMIT), handler)
        self._transports = transports
        self._stopping = stopping
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._transports.add(transport)
        super().connection_made(transport)
        if self._stopping.is_set():  # accepted while the server closes
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._transports.discard(self._transport)
        super().connection_lost(exc)


class ClientGoneError(Exception):
    """The client closed its connection before the reply was finished."""


@dataclass(slots=True)
class Conn:
    """One client connection, as its handler sees it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    eof: asyncio.Task[bytes] | None = None  # a read that ends when the client goes away
    dirty: bool = False  # the client sent bytes mid-reply: close after it

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds``; raises ``ClientGoneError`` as soon as the client
        disconnects."""
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            if self.eof is None:
                self.eof = asyncio.ensure_future(self.reader.read(1))
            done, _ = await asyncio.wait({self.eof}, timeout=left)
            if not done:
                break
            try:
                data = self.eof.result()
            except (ConnectionError, OSError):
                data = b""
            self.eof = None
            if not data:
                raise ClientGoneError
            self.dirty = True  # HTTP/1.1 clients never pipeline: close after this reply
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            break

    def stop_watching(self) -> None:
        if self.eof is not None:
            self.eof.cancel()
            self.eof = None

    async def unwatch(self) -> None:
        """``stop_watching``, and wait until the watching read has let go of the
        reader: the next request's read would otherwise find it still waiting
        ("readuntil() called while another coroutine is already waiting")."""
        eof, self.eof = self.eof, None
        if eof is None:
            return
        eof.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await eof


async def read_request(reader: asyncio.StreamReader, max_body: int) -> Request | None:
    """The next request, or None at a clean end of the connection; raises
    ``HTTPError`` for one it refuses (a body over ``max_body`` bytes gets 413)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if err.partial.strip():
            raise HTTPError(400, "incomplete request head", close=True) from err
        return None
    except asyncio.LimitOverrunError as err:
        raise HTTPError(431, "request head too large", close=True) from err
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise HTTPError(400, f"malformed request line {lines[0]!r}", close=True)
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HTTPError(411, "chunked request bodies are not accepted", close=True)
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError as err:
        raise HTTPError(400, "invalid Content-Length", close=True) from err
    if length < 0:
        raise HTTPError(400, "invalid Content-Length", close=True)
    if length > max_body:
        if length <= max_body * _DRAIN_FACTOR:  # so the client reads the 413
            await reader.readexactly(length)
        raise HTTPError(
            413,
            f"request body of {length} bytes exceeds the limit of {max_body}",
            code="request_too_large",
            close=True,
        )
    body = await reader.readexactly(length) if length else b""
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
    return Request(method, target.split("?", 1)[0], headers, body, keep_alive)


async def send_error(conn: Conn, err: HTTPError) -> None:
    """Answer ``err``; a client already gone is not an error."""
    data = json.dumps(err.body).encode()
    headers = {"content-type": "application/json", "content-length": str(len(data))}
    headers.update(err.headers)
    if err.close:
        headers["connection"] = "close"
    with contextlib.suppress(ConnectionError, ClientGoneError):
        await write(conn, response_head(err.status, headers) + data)


async def send_json(conn: Conn, status: int, payload: object) -> None:
    await send_raw(conn, status, json.dumps(payload).encode())


async def send_raw(conn: Conn, status: int, data: bytes) -> None:
    head = response_head(
        status, {"content-type": "application/json", "content-length": str(len(data))}
    )
    await write(conn, head + data)


def response_head(status: int, headers: Mapping[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}", "server: sessiontree-standin"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def write(conn: Conn, data: bytes) -> None:
    """Write and drain; raises ``ClientGoneError`` if the client has gone."""
    if conn.writer.transport.is_closing():
        raise ClientGoneError
    conn.writer.write(data)
    try:
        await conn.writer.drain()
    except (ConnectionError, OSError) as err:
        raise ClientGoneError from err
