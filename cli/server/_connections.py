"""The node's HTTP connections, bounded: header, body and idle timeouts and a
cap on open connections (``node start --header-timeout``, ``--body-timeout``,
``--idle-timeout``, ``--max-connections``).

uvicorn closes a kept-alive connection that stays idle after an answer
(``timeout_keep_alive``) but has no bound on a connection that never
finishes its request: one opened and left silent, or trickling its head or
body a byte at a time, is held for ever. Its ``limit_concurrency`` answers
a plain-text 503 past the cap yet keeps every connection. So the node
serves with ``guarded_protocol``, uvicorn's h11 protocol with one deadline
at a time on each connection:

- from its opening (or the first byte of a request that follows an answer)
  the whole head must arrive within ``header_timeout``;
- then the whole body within ``body_timeout``;
- between requests, an idle connection is closed after ``idle_timeout``
  (uvicorn's keep-alive timer, given this value).

Bytes arriving never move a deadline, so trickling does not extend it. A
connection that sent nothing is closed in silence; one that sent part of a
request is answered 408 with an ``ErrorBody`` and closed. An answer in
progress (a long-poll, an event stream) is not timed. A connection opened
while ``max_connections`` are open is answered 503 ``capacity_exceeded``
once its head arrives, and closed.

The h11 protocol is always used (never httptools, which uvicorn would
import if installed): the guard is written against it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from litestar.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from sessiontree.cli.server._refusal import error_body, send_refusal
from sessiontree.protocol import ErrorCode

__all__ = ["ConnectionLimits", "guarded_protocol"]

log = logging.getLogger("sessiontree.cli.connections")

HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 30.0
IDLE_TIMEOUT = 5.0
MAX_CONNECTIONS = 1000
_WARN_EVERY = 10.0  # seconds between two warnings of refused connections


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Seconds a request's head and body may take to arrive, an idle
    connection may stay open, and how many connections may be open at once
    (see the module's docstring)."""

    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "idle_timeout"):
            if not getattr(self, name) > 0:
                msg = f"{name} must be > 0 seconds, not {getattr(self, name)!r}"
                raise ValueError(msg)
        if self.max_connections < 1:
            msg = f"max_connections must be >= 1, not {self.max_connections!r}"
            raise ValueError(msg)


def _over_capacity(cap: int) -> Any:
    """An ASGI app answering 503 ``capacity_exceeded`` and closing."""
    message = f"the node has {cap} connections open (its --max-connections); try again shortly"

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"retry-after", b"1"), (b"connection", b"close")]
        await send_refusal(send, 503, ErrorCode.CAPACITY_EXCEEDED, message, headers=headers)

    return refuse


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the cap of ``limits``."""

    limits: ClassVar[ConnectionLimits]
    _warned_at: ClassVar[float | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn arms its keep-alive timer with this after each answer
        self.timeout_keep_alive = self.limits.idle_timeout  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None
        self._awaiting: str | None = None  # "head" or "body": what the deadline is for

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        over = len(self.connections) >= self.limits.max_connections
        super().connection_made(transport)
        if over:
            self._warn()
            self.app = _over_capacity(self.limits.max_connections)
        self._expect("head")

    @classmethod
    def _warn(cls) -> None:
        now = time.monotonic()
        if cls._warned_at is None or now - cls._warned_at >= _WARN_EVERY:
            cls._warned_at = now
            log.warning(
                "%d connections are open (--max-connections): refusing new ones",
                cls.limits.max_connections,
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._expect(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """Set the deadline for what the connection now waits on from the client."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._expect("body")
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            self._expect("head")  # part of a request has come
        elif state is h11.IDLE and self._awaiting == "head" and self.cycle is None:
            pass  # a new connection: its first head is still due
        else:
            self._expect(None)  # a request in hand, an idle keep-alive, or closing

    def _expect(self, what: str | None) -> None:
        if what == self._awaiting:
            return  # arriving bytes never move a deadline
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._awaiting = what
        if what is not None:
            seconds = self.limits.header_timeout if what == "head" else self.limits.body_timeout
            self._deadline = self.loop.call_later(seconds, self._expired, what)

    def _expired(self, what: str) -> None:
        self._deadline = None
        self._awaiting = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        started = cycle is not None and cycle.response_started and not cycle.response_complete
        partial = what == "body" or bool(self.conn.trailing_data[0])
        if partial and not started:
            seconds = self.limits.header_timeout if what == "head" else self.limits.body_timeout
            body = error_body(
                408,
                ErrorCode.REJECTED_INPUT,
                f"the request's {what} did not arrive within {seconds:g} s",
            )
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's answer, if it comes, goes nowhere
            cycle.message_event.set()
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class bounded by ``limits`` (for ``uvicorn.Config(http=…)``)."""
    return type("GuardedH11Protocol", (_GuardedH11,), {"limits": limits})
