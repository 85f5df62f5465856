"""A local stand-in for an OpenAI-compatible chat model, over real sockets.

``StandinServer`` is a real HTTP/1.1 server on 127.0.0.1 that speaks the
chat-completions API (``POST /v1/chat/completions``, ``GET /v1/models``), so
the official ``openai`` SDK talks to it exactly as it talks to a provider. The
offline demo runs its model calls on it, and tests use it to count what
reached "the provider" and to inject the faults a real one has.

It runs an asyncio server on one thread of its own (so a thousand concurrent
streams cost no threads); ``start()`` returns once it listens and ``close()``
stops it, drops every open connection and joins that thread. Every public
method is thread-safe and may be called from any thread, including from a
coroutine on another event loop (none of them blocks except the ``wait_*``
methods, which take a bounded timeout).

**Replies are deterministic.** A reply is the next one queued with
:meth:`StandinServer.script`, or, with the queue empty, ``"echo "`` followed
by the text of the last user message. Tokens are counted as
whitespace-separated words (:func:`count_tokens`):

- ``prompt_tokens`` = for every message, 1 (its role) + the words of its text
  content + the words of its tool calls' names and arguments
  (:func:`prompt_tokens`); ``tools`` and other request fields are not counted;
- ``completion_tokens`` = the words of the reply's text + the words of each
  tool call's name and arguments (:func:`completion_tokens`).

``max_tokens`` (or ``max_completion_tokens``) is honoured: the text is cut to
that many words, tool calls that no longer fit are dropped, and the finish
reason is ``"length"``. Tool calls are sent only when the request has
``tools``; otherwise only the scripted text goes out.

**Streaming** (``"stream": true``) sends server-sent events in the
chat-completions chunk format: a first chunk with the role, one chunk per
word of text (``words_per_chunk``), tool-call deltas (the call's id and name
first, then its arguments in pieces), a chunk with the finish reason, then,
when ``stream_options.include_usage`` is true, a chunk with empty
``choices`` and the ``usage`` (every earlier chunk then carries
``"usage": null``), and finally ``data: [DONE]``. The body uses chunked
transfer encoding, as OpenAI's does.

**Faults** (:class:`Fault`, kinds in :class:`FaultKind`) are queued with
:meth:`StandinServer.fail_next` and taken one per chat-completions request in
arrival order, or chosen per request with the ``x-standin-fault`` header
(e.g. ``extra_headers={"x-standin-fault": "slow;delay=0.5"}``), which wins
over the queue and leaves it untouched.

**What it counts** (all readable while it runs): requests received at the
chat-completions endpoint, whatever became of them (a body over the cap is
not counted); completions served (a reply written to its end, counted just
before its last bytes go out, so a client never holds a reply the count
lacks); tokens served, summed from the ``usage`` it
reported (a reply that reported none adds nothing); client disconnects seen
before a reply was finished; and the JSON bodies of the last
``max_recorded`` requests. ``wait_for_requests``, ``wait_for_completions``
and ``wait_for_disconnects`` block until a count is reached, with a timeout.

Only 127.0.0.1 is served. Bodies over ``max_body_bytes`` get 413; invalid
JSON and bad fields get 400 with an OpenAI-style error body
(``{"error": {"message", "type", "param", "code"}}``); other paths 404.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

__all__ = [
    "Fault",
    "FaultKind",
    "Reply",
    "StandinServer",
    "StandinStats",
    "ToolCall",
    "completion_tokens",
    "count_tokens",
    "prompt_tokens",
]

HOST = "127.0.0.1"
CREATED = 1_700_000_000  # the fixed `created` of every reply: replies are deterministic
_HEADER_LIMIT = 64 * 1024  # bytes of a request line plus headers
_DRAIN_FACTOR = 8  # an oversized body up to this many times the cap is read before 413
_START_TIMEOUT = 10.0  # seconds start() waits for the server thread to listen
_CLOSE_TIMEOUT = 10.0  # seconds close() waits for the server thread to end
_MIN_SHUTDOWN_TURNS = 5  # loop turns close() gives connections still being accepted
_SHUTDOWN_TURNS = 100  # at most
_STREAM_HEADERS = {
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


# --- tokens ------------------------------------------------------------------------


def count_tokens(text: str) -> int:
    """The stand-in's token count of ``text``: its whitespace-separated words."""
    return len(text.split())


def _content_text(content: object) -> str:
    """A message's text: a string, or the ``text`` of each part of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _tool_call_words(calls: object) -> int:
    """Words of the names and arguments of chat-format ``tool_calls``."""
    if not isinstance(calls, list):
        return 0
    total = 0
    for call in calls:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        if isinstance(function, Mapping):
            total += count_tokens(str(function.get("name", "")))
            total += count_tokens(str(function.get("arguments", "")))
    return total


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The ``prompt_tokens`` the stand-in reports for ``messages``: per message
    1 + the words of its text + the words of its tool calls."""
    return sum(
        1 + count_tokens(_content_text(m.get("content"))) + _tool_call_words(m.get("tool_calls"))
        for m in messages
    )


def completion_tokens(text: str, tool_calls: Sequence[ToolCall] = ()) -> int:
    """The ``completion_tokens`` of a reply: the words of its text and of each
    tool call's name and arguments."""
    return count_tokens(text) + sum(call.tokens for call in tool_calls)


# --- replies and faults ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call a scripted reply makes: the function's name and its arguments
    (a mapping is sent as compact JSON with sorted keys, a string as it is)."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        """The arguments as the wire carries them (a JSON string)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments), sort_keys=True, separators=(", ", ": "))

    @property
    def tokens(self) -> int:
        """This call's share of ``completion_tokens``."""
        return count_tokens(self.name) + count_tokens(self.arguments_json)


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted reply: its text and, if the request offers ``tools``, the tool
    calls it makes (its finish reason is then ``"tool_calls"``)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


class FaultKind(enum.StrEnum):
    """What a :class:`Fault` does to one chat-completions request."""

    RATE_LIMIT = "rate_limit"  # 429 with Retry-After: <retry_after> seconds
    SERVER_ERROR = "server_error"  # 500 with an error body
    SLOW = "slow"  # wait <delay> s before the headers, <chunk_delay> s between chunks
    DROP = "drop"  # read the request, close the connection without a byte
    DROP_MID_REPLY = "drop_mid_reply"  # headers and <after_chunks> chunks, then close
    INVALID_JSON = "invalid_json"  # 200, application/json, a body that is not JSON
    MISSING_CHOICES = "missing_choices"  # 200, valid JSON without `choices`
    NO_USAGE = "no_usage"  # a normal reply that reports no usage


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault for one request. ``retry_after`` (seconds) is for ``RATE_LIMIT``;
    ``delay`` and ``chunk_delay`` (seconds) for ``SLOW``; ``after_chunks`` (how
    many stream chunks, or for a non-streamed reply whether half the body, go
    out before the close) for ``DROP_MID_REPLY``."""

    kind: FaultKind
    retry_after: int = 1
    delay: float = 0.0
    chunk_delay: float = 0.0
    after_chunks: int = 1

    @classmethod
    def parse(cls, header: str) -> Fault:
        """A fault from an ``x-standin-fault`` header: ``kind[;name=value]...``.

        Raises ``ValueError`` naming the part that is not understood."""
        kind, *params = (part.strip() for part in header.split(";"))
        values: dict[str, Any] = {}
        for param in params:
            name, sep, value = param.partition("=")
            if not sep or name not in {"retry_after", "delay", "chunk_delay", "after_chunks"}:
                raise ValueError(f"x-standin-fault: unknown parameter {param!r}")
            values[name] = float(value) if "delay" in name else int(value)
        return cls(FaultKind(kind), **values)


@dataclass(frozen=True, slots=True)
class StandinStats:
    """A consistent snapshot of what a :class:`StandinServer` counted."""

    requests_received: int
    completions_served: int
    prompt_tokens_served: int
    completion_tokens_served: int
    disconnects: int

    @property
    def tokens_served(self) -> int:
        """Prompt plus completion tokens of every reply that reported usage."""
        return self.prompt_tokens_served + self.completion_tokens_served


class _HTTPError(Exception):
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


@dataclass(frozen=True, slots=True)
class _Completion:
    """A reply about to go out: its id, model, text, tool calls, finish reason,
    usage (None under ``NO_USAGE``) and sequence number."""

    ident: str
    model: str
    text: str
    calls: tuple[ToolCall, ...]
    finish: str
    usage: dict[str, int] | None
    index: int


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class _TrackedProtocol(asyncio.StreamReaderProtocol):
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


class _ClientGoneError(Exception):
    """The client closed its connection before the reply was finished."""


@dataclass(slots=True)
class _Conn:
    """One client connection, as its handler sees it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    eof: asyncio.Task[bytes] | None = None  # a read that ends when the client goes away
    dirty: bool = False  # the client sent bytes mid-reply: close after it

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds``; raises ``_ClientGoneError`` as soon as the client
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
                raise _ClientGoneError
            self.dirty = True  # HTTP/1.1 clients never pipeline: close after this reply
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            break

    def stop_watching(self) -> None:
        if self.eof is not None:
            self.eof.cancel()
            self.eof = None


# --- the server --------------------------------------------------------------------


class StandinServer:
    """A chat-completions server on 127.0.0.1 for tests and the offline demo.

    ``port=0`` (the default) takes an ephemeral port; ``url`` is the base URL
    to hand to ``openai.OpenAI(base_url=...)``. ``models`` are listed by
    ``GET /v1/models`` (a chat request may name any model; it is echoed).
    ``max_body_bytes`` caps a request body; ``max_recorded`` bounds the list of
    recorded request bodies; ``words_per_chunk`` sets how much text a stream
    chunk carries.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        models: Sequence[str] = ("standin-small", "standin-large"),
        max_body_bytes: int = 1 << 20,
        max_recorded: int = 1000,
        words_per_chunk: int = 1,
    ) -> None:
        if words_per_chunk < 1:
            raise ValueError(f"words_per_chunk must be at least 1, got {words_per_chunk}")
        self._port = port
        self._models = tuple(models)
        self._max_body = max_body_bytes
        self._words_per_chunk = words_per_chunk
        self._cond = threading.Condition()
        self._script: collections.deque[Reply] = collections.deque()
        self._faults: collections.deque[Fault] = collections.deque()
        self._recorded: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_recorded)
        self._received = 0
        self._served = 0
        self._prompt_served = 0
        self._completion_served = 0
        self._disconnects = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._bound_port: int | None = None
        self._sequence = 0  # completions begun, numbering their ids

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> Self:
        """Start listening and return once the port is bound.

        Raises ``RuntimeError`` if already started, or the ``OSError`` of a
        bind that failed (e.g. a fixed port in use)."""
        if self._thread is not None:
            raise RuntimeError("StandinServer already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="standin-server", daemon=True
        )
        self._thread.start()
        if not ready.wait(_START_TIMEOUT):
            raise RuntimeError("StandinServer did not start listening in time")
        if failure:
            self._thread.join(_CLOSE_TIMEOUT)
            raise failure[0]
        return self

    def close(self) -> None:
        """Stop: close the listening socket and every open connection (a reply in
        progress is cut off), then join the server thread. Idempotent; raises
        ``RuntimeError`` if the thread does not end within 10 s."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(stopping.set)
        thread.join(_CLOSE_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError("StandinServer thread did not stop in time")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The bound port; raises ``RuntimeError`` before ``start()``."""
        if self._bound_port is None:
            raise RuntimeError("StandinServer is not started")
        return self._bound_port

    @property
    def url(self) -> str:
        """The base URL, ending in ``/v1``; raises ``RuntimeError`` before ``start()``."""
        return f"http://{HOST}:{self.port}/v1"

    # --- scripting -----------------------------------------------------------------

    def script(self, *replies: Reply | str) -> None:
        """Queue replies (a string is a text reply); each completion takes the next."""
        with self._cond:
            self._script.extend(Reply(r) if isinstance(r, str) else r for r in replies)

    def fail_next(
        self,
        kind: FaultKind | str,
        *,
        times: int = 1,
        retry_after: int = 1,
        delay: float = 0.0,
        chunk_delay: float = 0.0,
        after_chunks: int = 1,
    ) -> None:
        """Queue a fault for the next ``times`` chat-completions requests.

        Raises ``ValueError`` for an unknown kind or a negative number."""
        if times < 0 or retry_after < 0 or delay < 0 or chunk_delay < 0 or after_chunks < 0:
            raise ValueError("fail_next: times, retry_after, delays and after_chunks are >= 0")
        fault = Fault(FaultKind(kind), retry_after, delay, chunk_delay, after_chunks)
        with self._cond:
            self._faults.extend([fault] * times)

    # --- observing -----------------------------------------------------------------

    def stats(self) -> StandinStats:
        """Every count at one instant."""
        with self._cond:
            return StandinStats(
                self._received,
                self._served,
                self._prompt_served,
                self._completion_served,
                self._disconnects,
            )

    @property
    def requests_received(self) -> int:
        """Chat-completions requests read in full, whatever was answered."""
        return self.stats().requests_received

    @property
    def completions_served(self) -> int:
        """Completions whose reply was written to its end."""
        return self.stats().completions_served

    @property
    def tokens_served(self) -> int:
        """Prompt plus completion tokens, summed over the usage it reported."""
        return self.stats().tokens_served

    @property
    def disconnects(self) -> int:
        """Clients that went away before their reply was finished."""
        return self.stats().disconnects

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the last ``max_recorded`` chat requests, oldest first."""
        with self._cond:
            return list(self._recorded)

    def wait_until(self, predicate: Callable[[StandinStats], bool], timeout: float) -> bool:
        """Block until ``predicate(stats)`` holds; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self._stats_locked()), timeout)

    def wait_for_requests(self, n: int, timeout: float) -> bool:
        """Block until ``n`` chat requests have arrived; False on timeout."""
        return self.wait_until(lambda s: s.requests_received >= n, timeout)

    def wait_for_completions(self, n: int, timeout: float) -> bool:
        """Block until ``n`` completions were served; False on timeout."""
        return self.wait_until(lambda s: s.completions_served >= n, timeout)

    def wait_for_disconnects(self, n: int, timeout: float) -> bool:
        """Block until ``n`` client disconnects were seen; False on timeout."""
        return self.wait_until(lambda s: s.disconnects >= n, timeout)

    def _stats_locked(self) -> StandinStats:
        return StandinStats(
            self._received,
            self._served,
            self._prompt_served,
            self._completion_served,
            self._disconnects,
        )

    def _count(self, **deltas: int) -> None:
        with self._cond:
            self._received += deltas.get("received", 0)
            self._served += deltas.get("served", 0)
            self._prompt_served += deltas.get("prompt", 0)
            self._completion_served += deltas.get("completion", 0)
            self._disconnects += deltas.get("disconnects", 0)
            self._cond.notify_all()

    # --- the server thread -----------------------------------------------------------

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        """The server thread: an event loop of its own until ``close()``."""
        try:
            asyncio.run(self._serve(ready))
        except BaseException as exc:  # reported to start() if it happened there
            if not ready.is_set():
                failure.append(exc)
                ready.set()
            else:
                raise

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping = asyncio.Event()
        transports: set[asyncio.Transport] = set()

        def connection() -> asyncio.Protocol:
            return _TrackedProtocol(transports, stopping, self._handle)

        server = await self._loop.create_server(connection, HOST, self._port, backlog=2048)
        self._bound_port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await stopping.wait()
        finally:
            # Stop accepting first but close the server last: a connection whose
            # accept is under way must find the server open (3.11 asserts it
            # is, and a failed accept leaks the socket). Then end every
            # connection: a handler mid-reply is cancelled, one accepted just
            # now may not have started (and one still being accepted aborts
            # itself in connection_made). Each abort's connection_lost, which
            # closes the socket, runs a turn later; so turn until none is left.
            for sock in server.sockets:
                self._loop.remove_reader(sock.fileno())
            for turn in range(_SHUTDOWN_TURNS):
                for task in list(self._conns):
                    task.cancel()
                for transport in list(transports):
                    transport.abort()
                await asyncio.sleep(0)
                if turn >= _MIN_SHUTDOWN_TURNS and not transports and not self._conns:
                    break
            server.close()
            await asyncio.gather(*self._conns, return_exceptions=True)
            await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: requests one after another until either side closes.

        It never ends in an exception (3.11's stream protocol would log a
        cancelled handler as an error); a cancellation comes only from
        ``close()`` and ends the connection at once."""
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        conn = _Conn(reader, writer)
        stopped = False
        try:
            while await self._one_request(conn):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            stopped = True
        finally:
            conn.stop_watching()
            self._conns.discard(task)
            if stopped:
                writer.transport.abort()
            else:
                writer.close()  # what was written still goes out, then FIN

    async def _one_request(self, conn: _Conn) -> bool:
        """Read and answer one request; False when the connection is to close."""
        try:
            request = await self._read_request(conn.reader)
        except _HTTPError as err:
            await self._send_error(conn, err)
            return False
        if request is None:
            return False
        try:
            keep = await self._route(conn, request)
        except _HTTPError as err:
            await self._send_error(conn, err)
            keep = not err.close
        except _ClientGoneError:
            self._count(disconnects=1)
            return False
        finally:
            conn.stop_watching()
        return keep and request.keep_alive and not conn.dirty

    async def _read_request(self, reader: asyncio.StreamReader) -> _Request | None:
        """The next request, or None at a clean end of the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as err:
            if err.partial.strip():
                raise _HTTPError(400, "incomplete request head", close=True) from err
            return None
        except asyncio.LimitOverrunError as err:
            raise _HTTPError(431, "request head too large", close=True) from err
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise _HTTPError(400, f"malformed request line {lines[0]!r}", close=True)
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _HTTPError(411, "chunked request bodies are not accepted", close=True)
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as err:
            raise _HTTPError(400, "invalid Content-Length", close=True) from err
        if length < 0:
            raise _HTTPError(400, "invalid Content-Length", close=True)
        if length > self._max_body:
            if length <= self._max_body * _DRAIN_FACTOR:  # so the client reads the 413
                await reader.readexactly(length)
            raise _HTTPError(
                413,
                f"request body of {length} bytes exceeds the limit of {self._max_body}",
                code="request_too_large",
                close=True,
            )
        body = await reader.readexactly(length) if length else b""
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
        return _Request(method, target.split("?", 1)[0], headers, body, keep_alive)

    async def _route(self, conn: _Conn, request: _Request) -> bool:
        path = request.path.rstrip("/")
        if path == "/v1/models":
            if request.method != "GET":
                raise _HTTPError(405, f"{request.method} is not allowed on {path}")
            data = [
                {"id": m, "object": "model", "created": CREATED, "owned_by": "standin"}
                for m in self._models
            ]
            await self._send_json(conn, 200, {"object": "list", "data": data})
            return True
        if path == "/v1/chat/completions":
            if request.method != "POST":
                raise _HTTPError(405, f"{request.method} is not allowed on {path}")
            return await self._chat(conn, request)
        raise _HTTPError(404, f"no route {request.method} {request.path}", code="not_found")

    # --- chat completions ------------------------------------------------------------

    async def _chat(self, conn: _Conn, request: _Request) -> bool:
        try:
            body = json.loads(request.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            self._count(received=1)
            raise _HTTPError(
                400, f"request body is not valid JSON: {err}", code="invalid_json"
            ) from err
        with self._cond:
            self._received += 1
            if isinstance(body, dict):
                self._recorded.append(body)
            self._cond.notify_all()
        messages, model, stream, include_usage, limit = _validate(body)
        fault = self._take_fault(request.headers.get("x-standin-fault"))
        kind = fault.kind if fault else None
        if kind is FaultKind.RATE_LIMIT:
            assert fault is not None
            raise _HTTPError(
                429,
                "Rate limit reached for requests (stand-in)",
                kind="requests",
                code="rate_limit_exceeded",
                headers={"retry-after": str(fault.retry_after)},
            )
        if kind is FaultKind.SERVER_ERROR:
            raise _HTTPError(500, "The server had an error (stand-in)", kind="server_error")
        if kind is FaultKind.DROP:
            return False
        if kind is FaultKind.SLOW:
            assert fault is not None
            await conn.pause(fault.delay)
        if kind in (FaultKind.INVALID_JSON, FaultKind.MISSING_CHOICES):
            await self._send_malformed(conn, kind is FaultKind.INVALID_JSON, stream)
            return True
        reply, index = self._next_reply(messages)
        tools_offered = bool(body.get("tools"))
        text, calls, finish = _shape(reply, tools_offered, limit)
        usage = None
        if kind is not FaultKind.NO_USAGE:
            p, c = prompt_tokens(messages), completion_tokens(text, calls)
            usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        ident = f"chatcmpl-standin-{index}"
        if stream:
            done = _Completion(ident, model, text, calls, finish, usage, index)
            return await self._stream(conn, fault, done, include_usage)
        message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
        if calls:
            message["tool_calls"] = [_call_json(call, index, i) for i, call in enumerate(calls)]
        payload: dict[str, Any] = {
            "id": ident,
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "system_fingerprint": "standin",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
        }
        if usage is not None:
            payload["usage"] = usage
        data = json.dumps(payload).encode()
        if kind is FaultKind.DROP_MID_REPLY:
            assert fault is not None
            head = _head(
                200, {"content-type": "application/json", "content-length": str(len(data))}
            )
            cut = data[: len(data) // 2] if fault.after_chunks else b""
            await _write(conn, head + cut)
            return False
        head = _head(200, {"content-type": "application/json", "content-length": str(len(data))})
        await self._finish(conn, head + data, usage)
        return True

    async def _stream(
        self,
        conn: _Conn,
        fault: Fault | None,
        done: _Completion,
        include_usage: bool,
    ) -> bool:
        """Send a reply as server-sent events (its usage in a last chunk if
        ``include_usage``); False if the connection must close."""
        ident, model, index = done.ident, done.model, done.index
        usage = done.usage if include_usage else None
        chunk_delay = fault.chunk_delay if fault and fault.kind is FaultKind.SLOW else 0.0
        drop_after = (
            fault.after_chunks if fault and fault.kind is FaultKind.DROP_MID_REPLY else None
        )

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            body: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": model,
                "system_fingerprint": "standin",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
                ],
            }
            if include_usage:
                body["usage"] = None
            return body

        events: list[dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in _pieces(done.text, self._words_per_chunk)]
        for i, call in enumerate(done.calls):
            first = _call_json(call, index, i)
            first["function"] = {"name": call.name, "arguments": ""}
            events.append(chunk({"tool_calls": [{"index": i, **first}]}))
            events += [
                chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
                for part in _split(call.arguments_json, 3)
            ]
        events.append(chunk({}, done.finish))
        if usage is not None:
            events.append(
                {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": CREATED,
                    "model": model,
                    "system_fingerprint": "standin",
                    "choices": [],
                    "usage": usage,
                }
            )
        await _write(conn, _head(200, _STREAM_HEADERS))
        for sent, event in enumerate(events):
            if drop_after is not None and sent >= drop_after:
                return False
            if sent:
                await conn.pause(chunk_delay)
            data = _chunked(b"data: " + json.dumps(event).encode() + b"\n\n")
            if sent < len(events) - 1:
                await _write(conn, data)
        await self._finish(conn, data + _chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n", usage)
        return True

    async def _send_malformed(self, conn: _Conn, invalid_json: bool, stream: bool) -> None:
        """A 200 whose body (or, streamed, whose one event) is not JSON, or is
        JSON without ``choices``."""
        obj = "chat.completion.chunk" if stream else "chat.completion"
        data = (
            b'{"id": "chatcmpl-standin", "choices": ['
            if invalid_json
            else json.dumps({"id": "chatcmpl-standin", "object": obj}).encode()
        )
        if not stream:
            await self._send_raw(conn, 200, data)
            return
        await _write(conn, _head(200, _STREAM_HEADERS))
        events = _chunked(b"data: " + data + b"\n\n") + _chunked(b"data: [DONE]\n\n")
        await _write(conn, events + b"0\r\n\r\n")

    async def _finish(self, conn: _Conn, data: bytes, usage: Mapping[str, int] | None) -> None:
        """Write a reply's last bytes, counting it served *before*: a client that
        has its reply always finds it counted. If the write fails (the client is
        gone) the count is taken back and ``_ClientGoneError`` raised."""
        prompt = usage["prompt_tokens"] if usage else 0
        completion = usage["completion_tokens"] if usage else 0
        self._count(served=1, prompt=prompt, completion=completion)
        try:
            await _write(conn, data)
        except _ClientGoneError:
            self._count(served=-1, prompt=-prompt, completion=-completion)
            raise

    def _take_fault(self, header: str | None) -> Fault | None:
        if header is not None:
            try:
                return Fault.parse(header)
            except ValueError as err:
                raise _HTTPError(
                    400, str(err), code="invalid_fault", param="x-standin-fault"
                ) from err
        with self._cond:
            return self._faults.popleft() if self._faults else None

    def _next_reply(self, messages: Sequence[Mapping[str, Any]]) -> tuple[Reply, int]:
        """The scripted reply (or the echo) and this completion's sequence number."""
        with self._cond:
            self._sequence += 1
            sequence = self._sequence
            if self._script:
                return self._script.popleft(), sequence
        last_user = next(
            (
                _content_text(m.get("content"))
                for m in reversed(messages)
                if m.get("role") == "user"
            ),
            "",
        )
        return Reply(" ".join(["echo", *last_user.split()])), sequence

    # --- writing -----------------------------------------------------------------------

    async def _send_error(self, conn: _Conn, err: _HTTPError) -> None:
        data = json.dumps(err.body).encode()
        headers = {"content-type": "application/json", "content-length": str(len(data))}
        headers.update(err.headers)
        if err.close:
            headers["connection"] = "close"
        with contextlib.suppress(ConnectionError, _ClientGoneError):
            await _write(conn, _head(err.status, headers) + data)

    async def _send_json(self, conn: _Conn, status: int, payload: object) -> None:
        await self._send_raw(conn, status, json.dumps(payload).encode())

    async def _send_raw(self, conn: _Conn, status: int, data: bytes) -> None:
        head = _head(status, {"content-type": "application/json", "content-length": str(len(data))})
        await _write(conn, head + data)


# --- helpers -------------------------------------------------------------------------


def _validate(body: object) -> tuple[list[dict[str, Any]], str, bool, bool, int | None]:
    """Check a chat request's fields; raises a 400 ``_HTTPError`` naming the field."""
    if not isinstance(body, dict):
        raise _HTTPError(400, "request body must be a JSON object", code="invalid_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _HTTPError(
            400, "`model` must be a non-empty string", param="model", code="invalid_type"
        )
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise _HTTPError(
            400,
            "`messages` must be a non-empty list of objects with a `role`",
            param="messages",
            code="invalid_type",
        )
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise _HTTPError(
            400,
            "`max_tokens` must be a non-negative integer",
            param="max_tokens",
            code="invalid_type",
        )
    return messages, model, stream, include_usage, limit


def _shape(
    reply: Reply, tools_offered: bool, limit: int | None
) -> tuple[str, tuple[ToolCall, ...], str]:
    """The text, tool calls and finish reason a reply goes out with under ``limit``."""
    calls = reply.tool_calls if tools_offered else ()
    words = reply.text.split()
    if limit is None or len(words) + sum(c.tokens for c in calls) <= limit:
        return reply.text, calls, "tool_calls" if calls else "stop"
    return " ".join(words[:limit]), (), "length"


def _call_json(call: ToolCall, index: int, position: int) -> dict[str, Any]:
    return {
        "id": f"call_standin_{index}_{position}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


def _pieces(text: str, words_per_chunk: int) -> Iterator[str]:
    """The text in chunks of ``words_per_chunk`` words, spacing kept: joined, they
    give back the text exactly."""
    if not text:
        return
    words = text.split(" ")
    for start in range(0, len(words), words_per_chunk):
        piece = " ".join(words[start : start + words_per_chunk])
        yield piece if start == 0 else " " + piece


def _split(text: str, parts: int) -> list[str]:
    """``text`` in up to ``parts`` non-empty pieces that join back to it."""
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _head(status: int, headers: Mapping[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}", "server: sessiontree-standin"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _write(conn: _Conn, data: bytes) -> None:
    """Write and drain; raises ``_ClientGoneError`` if the client has gone."""
    if conn.writer.transport.is_closing():
        raise _ClientGoneError
    conn.writer.write(data)
    try:
        await conn.writer.drain()
    except (ConnectionError, OSError) as err:
        raise _ClientGoneError from err
