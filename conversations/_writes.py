"""One conversation's state and its write queue, shared by every handle on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sessiontree.conversations._backend import ConversationBackend, TimeSource
from sessiontree.conversations._values import new_branch_id
from sessiontree.protocol import (
    Branch,
    ConversationError,
    ConversationState,
    ErrorCode,
    Message,
    StoreError,
)

__all__ = ["SharedConversation"]

_SETTLE_TIMEOUT = 60.0  # seconds a write may wait for the store before it is given up
F = TypeVar("F")


class SharedConversation:
    """One conversation's state, shared by every handle on it.

    ``durable`` is the last acknowledged state (what reads see: they never
    wait); ``tip`` the last one submitted (what the next write builds on).
    ``lock`` is never held across I/O by an append: appends of one
    conversation are built and queued in order under it, then wait for their
    commit outside it, so they share commits. A failed write makes the tip
    stale: the next write reloads from the backend once every queued write of
    this conversation has settled. A write whose waiter gave up (a cancelled
    coroutine, a timeout) is booked when it really settles.
    """

    def __init__(
        self, session_id: uuid.UUID, backend: ConversationBackend, clock: TimeSource
    ) -> None:
        self.session_id = session_id
        self.backend = backend
        self.clock = clock
        self.lock = threading.RLock()
        self.settled = threading.Condition(self.lock)
        self.inflight = 0
        self._durable: ConversationState | None = None
        self._tip: ConversationState | None = None
        # platform id -> (message, rev of its write): queued, not yet acknowledged
        self.pending_platform: dict[str, tuple[Message, int]] = {}
        # writes queued by ``post`` (children's results landing) that nobody waits
        # for and that are not booked yet: a read of a context first waits for them
        self.unbooked = 0

    def state(self) -> ConversationState:
        """The acknowledged state (loaded on first use, when nothing is in flight)."""
        with self.lock:
            if self._durable is None:
                self._load()
            assert self._durable is not None
            return self._durable

    def tip(self) -> ConversationState:
        """The state the next write builds on."""
        with self.lock:
            if self._tip is None:
                self._load()
            assert self._tip is not None
            return self._tip

    def latest(self) -> ConversationState:
        """The last state submitted if it is still good, else the acknowledged one
        (never waits for the store: after a failed write, no reload happens here)."""
        with self.lock:
            return self._tip if self._tip is not None else self.state()

    def settle(self) -> ConversationState:
        """Wait (lock held) until no write of this conversation is in flight; the state."""
        self._drain()
        return self.state()

    def _drain(self) -> None:
        if not self.settled.wait_for(lambda: self.inflight == 0, timeout=_SETTLE_TIMEOUT):
            msg = f"session {self.session_id}: conversation writes did not settle"
            raise StoreError(msg)

    def _load(self) -> None:
        self._drain()  # after a failure: what the backend holds once the queue drained
        loaded = self.backend.load(self.session_id)
        if loaded is None:
            now = self.clock.time()
            main = Branch(number=1, id=new_branch_id(), name="main", base_id=None, created_at=now)
            loaded = ConversationState(
                session_id=self.session_id,
                branches=[main],
                current=main.id,
                created_at=now,
                updated_at=now,
            )
        self._durable = self._tip = loaded
        self.pending_platform.clear()

    def queued(self, state: ConversationState, put: Sequence[Message]) -> None:
        """A write of ``state`` putting ``put`` was submitted (lock held)."""
        self._tip = state
        self.inflight += 1
        for message in put:
            if message.platform_id is not None:
                self.pending_platform[message.platform_id] = (message, state.rev)

    def acknowledged(self, state: ConversationState) -> None:
        with self.lock:
            self.inflight -= 1
            if self._durable is None or state.rev > self._durable.rev:
                self._durable = state
            for key, (_, rev) in list(self.pending_platform.items()):
                if rev <= state.rev:
                    del self.pending_platform[key]
            if self.inflight == 0:
                self.settled.notify_all()

    def failed(self) -> None:
        """A write failed: what was acknowledged stays true, the tip is rebuilt."""
        with self.lock:
            self.inflight -= 1
            self._tip = None
            self.pending_platform.clear()
            self.settled.notify_all()

    def book_later(
        self,
        future: concurrent.futures.Future[None] | asyncio.Future[None],
        state: ConversationState,
    ) -> None:
        """The waiter of a write gave up: book the write when it settles."""

        def settled(done: Any) -> None:
            if done.cancelled() or done.exception() is not None:
                self.failed()
            else:
                self.acknowledged(state)

        future.add_done_callback(settled)

    def submit(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> tuple[ConversationState, concurrent.futures.Future[None]]:
        """Queue a write of ``state`` (lock held); the state as written, and its future."""
        return state, self._queue(state, put, delete, self.backend.submit)

    def submit_awaitable(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> tuple[ConversationState, asyncio.Future[None]]:
        """``submit`` from a coroutine on a running event loop."""
        return state, self._queue(state, put, delete, self.backend.submit_awaitable)

    def _queue(
        self,
        state: ConversationState,
        put: Sequence[Message],
        delete: Sequence[Message],
        send: Callable[[ConversationState, Sequence[Message], Sequence[Message]], F],
    ) -> F:
        """Number ``state`` (a new object, so in place), hand it to ``send``, note it queued."""
        state.rev = self.tip().rev + 1
        future = send(state, put, delete)
        self.queued(state, put)
        return future

    def commit_now(
        self,
        state: ConversationState,
        put: Sequence[Message] = (),
        delete: Sequence[Message] = (),
    ) -> ConversationState:
        """Write ``state`` and wait for it (lock held, nothing in flight)."""
        state, future = self.submit(state, put, delete)
        self.wait(future, state)
        return state

    def can_queue(self) -> bool:
        """Whether an append can be built now without waiting for a reload (lock held)."""
        return self._tip is not None or self.inflight == 0

    def wait(self, future: concurrent.futures.Future[None], state: ConversationState) -> None:
        """Wait for a queued write; a failure is booked now, a give-up when it settles."""
        try:
            future.result(timeout=_SETTLE_TIMEOUT)
        except concurrent.futures.TimeoutError as exc:
            self.book_later(future, state)
            msg = f"session {self.session_id}: the store did not acknowledge the write in time"
            raise StoreError(msg) from exc
        except Exception:
            self.failed()
            raise
        except BaseException:
            self.book_later(future, state)
            raise
        self.acknowledged(state)

    def posted_write(
        self, future: concurrent.futures.Future[None], state: ConversationState
    ) -> None:
        """A write nobody waits for was queued (lock held): booked when it
        settles, and waited for by the next read of a context."""
        self.unbooked += 1

        def booked(done: concurrent.futures.Future[None]) -> None:
            if done.cancelled() or done.exception() is not None:
                self.failed()
            else:
                self.acknowledged(state)
            with self.lock:
                self.unbooked -= 1
                self.settled.notify_all()

        future.add_done_callback(booked)

    def posts_settled(self) -> None:
        """Wait (bounded) until every posted write is booked, so a read sees
        what they wrote (a failed one is simply not there)."""
        with self.lock:
            if self.unbooked:
                self.settled.wait_for(lambda: self.unbooked == 0, timeout=_SETTLE_TIMEOUT)

    async def aposts_settled(self) -> None:
        """``posts_settled`` without blocking the event loop."""
        if self.unbooked:  # a stale read only costs a hop to a thread
            await asyncio.to_thread(self.posts_settled)

    def stored_platform_id(self, platform_id: str) -> Message | None:
        """The stored message recorded for a chat platform's id."""
        found = self.backend.by_platform_id(self.session_id, platform_id)
        return None if found is None else self.backend.message(self.session_id, found)

    def known_platform_id(self, platform_id: str) -> Message | None:
        """The message recorded (or queued) for a chat platform's id (lock held)."""
        pending = self.pending_platform.get(platform_id)
        return pending[0] if pending is not None else self.stored_platform_id(platform_id)

    def need(self, message_id: uuid.UUID, field: str) -> Message:
        """The message ``message_id``, or ``ConversationError`` (``unknown_message``)."""
        found = self.backend.message(self.session_id, message_id)
        if found is None:
            raise self.error(
                f"message {message_id} is not in this session's conversation",
                ErrorCode.UNKNOWN_MESSAGE,
                field,
            )
        return found

    def error(self, message: str, code: ErrorCode, field: str) -> ConversationError:
        """A ``ConversationError`` of this conversation."""
        return ConversationError(
            f"session {self.session_id}: {message}",
            code=code,
            field=field,
            session_id=self.session_id,
        )
