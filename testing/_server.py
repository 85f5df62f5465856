"""``StandinServer``: the stand-in's lifecycle, its thread and event loop, the
connection loop and routing, and the public face of its queues and counters.

The chat-completions endpoint is ``ChatHandler``'s (``_chat``), the HTTP
plumbing ``_http``'s, and the queues and counters live in a ``Ledger``
(``_ledger``) that the server and its handler share.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

from sessiontree.testing._chat import ChatHandler
from sessiontree.testing._http import (
    CREATED,
    HOST,
    ClientGoneError,
    Conn,
    HTTPError,
    Request,
    TrackedProtocol,
    read_request,
    send_error,
    send_json,
)
from sessiontree.testing._ledger import Ledger
from sessiontree.testing._script import Fault, FaultKind, Reply, StandinStats

_START_TIMEOUT = 10.0  # seconds start() waits for the server thread to listen
_CLOSE_TIMEOUT = 10.0  # seconds close() waits for the server thread to end
_MIN_SHUTDOWN_TURNS = 5  # loop turns close() gives connections still being accepted
_SHUTDOWN_TURNS = 100  # at most


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
        self._ledger = Ledger(max_recorded)
        self._chat = ChatHandler(self._ledger, words_per_chunk)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._bound_port: int | None = None

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
        self._ledger.script(Reply(r) if isinstance(r, str) else r for r in replies)

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
        self._ledger.queue_faults(fault, times)

    def hold(self) -> None:
        """From now on, hold every chat request once it is received (counted in
        ``requests_received``) and answer it only after ``release``: calls in
        flight for exactly as long as a test needs. ``close`` ends held ones."""
        self._set_gate(open_=False)

    def release(self) -> None:
        """Answer the held requests, and every later one at once."""
        self._set_gate(open_=True)

    def _set_gate(self, *, open_: bool) -> None:
        """Open or close the gate on the server's loop, and return once it is."""
        loop, gate = self._loop, self._chat.gate
        if loop is None or gate is None:
            raise RuntimeError("StandinServer is not running")
        done = threading.Event()

        def apply() -> None:
            if open_:
                gate.set()
            else:
                gate.clear()
            done.set()

        loop.call_soon_threadsafe(apply)
        if not done.wait(_START_TIMEOUT):
            raise RuntimeError("StandinServer did not take the hold or release in time")

    # --- observing -----------------------------------------------------------------

    def stats(self) -> StandinStats:
        """Every count at one instant."""
        return self._ledger.stats()

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
        return self._ledger.requests()

    def wait_until(self, predicate: Callable[[StandinStats], bool], timeout: float) -> bool:
        """Block until ``predicate(stats)`` holds; False if ``timeout`` passed first."""
        return self._ledger.wait_until(predicate, timeout)

    def wait_for_requests(self, n: int, timeout: float) -> bool:
        """Block until ``n`` chat requests have arrived; False on timeout."""
        return self.wait_until(lambda s: s.requests_received >= n, timeout)

    def wait_for_completions(self, n: int, timeout: float) -> bool:
        """Block until ``n`` completions were served; False on timeout."""
        return self.wait_until(lambda s: s.completions_served >= n, timeout)

    def wait_for_disconnects(self, n: int, timeout: float) -> bool:
        """Block until ``n`` client disconnects were seen; False on timeout."""
        return self.wait_until(lambda s: s.disconnects >= n, timeout)

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
        self._chat.gate = asyncio.Event()
        self._chat.gate.set()
        transports: set[asyncio.Transport] = set()

        def connection() -> asyncio.Protocol:
            return TrackedProtocol(transports, stopping, self._handle)

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
        conn = Conn(reader, writer)
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

    async def _one_request(self, conn: Conn) -> bool:
        """Read and answer one request; False when the connection is to close."""
        try:
            request = await read_request(conn.reader, self._max_body)
        except HTTPError as err:
            await send_error(conn, err)
            return False
        if request is None:
            return False
        try:
            keep = await self._route(conn, request)
        except HTTPError as err:
            await send_error(conn, err)
            keep = not err.close
        except ClientGoneError:
            self._ledger.count(disconnects=1)
            return False
        finally:
            await conn.unwatch()
        return keep and request.keep_alive and not conn.dirty

    async def _route(self, conn: Conn, request: Request) -> bool:
        path = request.path.rstrip("/")
        if path == "/v1/models":
            if request.method != "GET":
                raise HTTPError(405, f"{request.method} is not allowed on {path}")
            data = [
                {"id": m, "object": "model", "created": CREATED, "owned_by": "standin"}
                for m in self._models
            ]
            await send_json(conn, 200, {"object": "list", "data": data})
            return True
        if path == "/v1/chat/completions":
            if request.method != "POST":
                raise HTTPError(405, f"{request.method} is not allowed on {path}")
            return await self._chat.handle(conn, request)
        raise HTTPError(404, f"no route {request.method} {request.path}", code="not_found")
