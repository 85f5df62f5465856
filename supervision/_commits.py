"""How the Cortex waits for the store: shared commits, and the rest of an
operation once what it wrote is durable.

The store's one writer makes every write; the Cortex never blocks on one. An
operation that must wait for a write is split where it waits: its first part
runs in the Cortex's turn (so what it admits is atomic with the turn), takes
what to await from ``durable`` and hands its rest, a coroutine, to ``after``,
which runs it on the node's loop as a task: one ``await`` where the write must
be durable, straight-line code after it. Writes made inside ``one_commit``
share one transaction and one wait; what must only wait until they are
submitted (queued in order ahead of any later write) uses ``when_submitted``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Coroutine, Generator, Iterator
from typing import Any

from sessiontree.actors.runtime import Reply, handler_scope
from sessiontree.protocol import ErrorCode, ErrorInfo, NodeClosedError
from sessiontree.supervision._entry import TreeEntry
from sessiontree.supervision._persist import Persister
from sessiontree.supervision._runtime import Runtime

__all__ = ["Commits", "Refused", "Written", "answer_durable", "answer_written", "store_error"]

log = logging.getLogger("sessiontree.cortex")


class Refused(Exception):  # noqa: N818 - what happened, as the store's own errors read
    """Raised by the rest of an operation (``Commits.after``): the store refused
    the write it waited for, and its caller is answered with ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class _Stopped(BaseException):
    """The Cortex stopped or failed while a write was awaited: nothing more is
    decided from its index."""


class Written:
    """What the rest of an operation awaits for one store write (made by
    ``Commits.durable``): None once the write is durable, else the store's
    error. Awaited once the Cortex stopped or failed, it ends the operation
    there (its caller hears ``NodeClosedError``); it may be awaited by several."""

    __slots__ = ("commits", "waiter")

    def __init__(self, commits: Commits, waiter: asyncio.Future[BaseException | None]) -> None:
        self.commits, self.waiter = commits, waiter

    def __await__(self) -> Generator[Any, None, BaseException | None]:
        if not self.commits.down:
            error = yield from self.waiter.__await__()
            if not self.commits.down:
                return error
        raise _Stopped


class Commits:
    """The Cortex's side of the store's group commit (Cortex thread only)."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.persist = runtime.persist
        self.submitted: list[Callable[[], None]] | None = None  # run once the batch is submitted
        # the open batch's future and its one wait (every write in it shares them)
        self.shared_wait: tuple[concurrent.futures.Future[None], Written] | None = None
        # the open batch's future and how many writes in it count_failures counts
        self.counted_writes: tuple[concurrent.futures.Future[None], list[int]] | None = None
        self.down = False  # the Cortex stopped or failed: no rest of an operation runs
        # writes finished on the writer's thread, handed to the loop in one wake-up
        self.finished: collections.deque[
            tuple[asyncio.Future[BaseException | None], BaseException | None]
        ] = collections.deque()
        self.wake_pending = False
        # how a raise in the rest of an operation fails the node: wired by the Cortex
        self.raised: Callable[[BaseException, Reply | None], None] = _unwired

    def durable(self, future: concurrent.futures.Future[None], *, urgent: bool = True) -> Written:
        """What to await for the store write ``future`` (call it in the Cortex's
        turn). ``urgent`` (default): someone outside waits on it, so it commits
        now; otherwise it goes with the next write someone waits on."""
        if urgent:
            self.persist.hurry()
        shared = self.shared_wait
        if shared is not None and shared[0] is future:
            return shared[1]
        written = Written(self, self.rt.loop().loop.create_future())
        future.add_done_callback(functools.partial(self._settle, written.waiter))
        if future is self.persist.shared:
            self.shared_wait = (future, written)
        return written

    def _settle(
        self, waiter: asyncio.Future[BaseException | None], write: concurrent.futures.Future[None]
    ) -> None:
        """On the writer's thread: hand ``write``'s outcome to the loop. A group
        commit finishes the writes of many operations at once; one wake-up of
        the loop (a system call) takes them all."""
        self.finished.append((waiter, write.exception()))
        if self.wake_pending:
            return
        self.wake_pending = True
        try:
            self.rt.loop().loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody is left to wait
            log.warning("a store write finished after the node's loop closed")

    def _wake(self) -> None:
        # On the loop. The flag is cleared before the queue is read, so a write
        # finished after this point always finds it clear and wakes the loop again.
        self.wake_pending = False
        finished = self.finished
        while finished:
            waiter, error = finished.popleft()
            if not waiter.done():
                waiter.set_result(error)

    def after(self, work: Coroutine[Any, Any, Any], reply: Reply | None = None) -> None:
        """Run ``work``, the rest of an operation, as a task on the node's loop
        (its first step after this turn; it re-reads what it acts on after each
        await, as anything may have changed meanwhile). ``reply`` is answered
        with what it returns, or failed with the error of a ``Refused`` it
        raises. Until it finishes it counts as the node's activity
        (``wait_idle``); it runs as a Cortex handler does (``handler_scope``),
        and any other raise in it fails the node as a raise in a handler does."""
        if self.down:
            work.close()
            if reply is not None:
                reply.fail(NodeClosedError("the node stopped before answering"))
            return
        self.rt.activity.begin()
        self.rt.loop().loop.create_task(self._run(work, reply))

    async def _run(self, work: Coroutine[Any, Any, Any], reply: Reply | None) -> None:
        try:
            with handler_scope():
                value = await work
        except Refused as refused:
            if reply is not None:
                reply.fail(refused.error)
        except (_Stopped, asyncio.CancelledError):  # the Cortex, or the loop, is gone
            if reply is not None:
                reply.fail(NodeClosedError("the node stopped before the store answered"))
        except BaseException as exc:  # noqa: BLE001 - fails the node loudly, as in a handler
            self.raised(exc, reply)
        else:
            if reply is not None:
                reply.set(value)
        finally:
            self.rt.activity.end()

    def if_refused(
        self, future: concurrent.futures.Future[None], then: Callable[[BaseException], None]
    ) -> None:
        """Run ``then(error)`` on the node's loop, as a Cortex handler, only if the
        write ``future`` fails (nothing crosses to the loop for a durable one:
        a Main's snapshot, a settled call)."""
        loop, activity = self.rt.loop().loop, self.rt.activity

        def done(finished: concurrent.futures.Future[None]) -> None:  # the writer's thread
            error = finished.exception()
            if error is None:
                return
            activity.begin()
            try:
                loop.call_soon_threadsafe(self._refused, then, error)
            except RuntimeError:  # the loop is closed: nothing runs there any more
                activity.end()
                log.warning("a store write failed after the node's loop closed: %r", error)

        future.add_done_callback(done)

    def _refused(self, then: Callable[[BaseException], None], error: BaseException) -> None:
        try:
            if not self.down:
                with handler_scope():
                    then(error)
        except BaseException as exc:  # noqa: BLE001 - fails the node loudly, as in a handler
            self.raised(exc, None)
        finally:
            self.rt.activity.end()

    def stop(self) -> None:
        """The Cortex stopped or failed: the rest of an operation still waiting
        for the store ends there (its caller hears ``NodeClosedError``)."""
        self.down = True

    def when_submitted(self, then: Callable[[], None]) -> None:
        """Run ``then()`` on the Cortex thread once every write made so far has been
        submitted to the store: at once, or as the open ``one_commit`` ends. A
        write submitted after that, from any thread, commits after them (the
        writer commits in submission order)."""
        if self.submitted is None:
            then()
        else:
            self.submitted.append(then)

    @contextlib.contextmanager
    def one_commit(self) -> Iterator[None]:
        """Every write made inside goes into one store batch (one commit), and
        whatever awaits those writes awaits one wait (``durable``): a batched
        spawn, a cascade, a batch of ended runs cost one transaction, not one
        each."""
        if self.submitted is not None:
            yield
            return
        self.submitted = []
        self.persist.open_batch()
        try:
            yield
        finally:
            submitted, self.submitted = self.submitted, None
            self.shared_wait = None
            # who waits urgently asked for it as it joined (the batch is hurried as it closes)
            self.persist.close_batch()
            for after in submitted:
                after()

    def count_failures(self, future: concurrent.futures.Future[None]) -> None:
        """Count ``future``'s failure (once per write made) as a store write error.

        The writes of an open batch share one future, so it gets one callback
        that counts them all: one per ending cost a callback call each.
        """
        counted = self.counted_writes
        if counted is not None and counted[0] is future:
            counted[1][0] += 1
            return
        writes = [1]
        if future is self.persist.shared:
            self.counted_writes = (future, writes)
        counters = self.rt.counters

        def count(finished: concurrent.futures.Future[None]) -> None:
            # on the writer thread: only counted here; the waiters get the error
            if finished.exception() is not None:
                counters["store_write_errors"] += writes[0]

        future.add_done_callback(count)


def answer_durable(entry: TreeEntry, reply: Reply, persist: Persister) -> None:
    """Answer ``reply`` with the ended session's result once its terminal
    write is durable (the store's error if that write failed)."""
    result, future = entry.result, entry.final_write
    if future is None:
        reply.set(result)
        return
    if not future.done():
        persist.hurry()

    def answer(finished: concurrent.futures.Future[None]) -> None:
        error = finished.exception()
        if error is None:
            reply.set(result)
        else:
            reply.fail(error)

    future.add_done_callback(answer)


def answer_written(
    future: concurrent.futures.Future[None] | None,
    reply: Reply,
    session_id: uuid.UUID,
    persist: Persister,
) -> None:
    """Answer ``reply`` with None once the write ``future`` is durable (at once
    without a store), or with the store's error for ``session_id``."""
    if future is None:
        reply.set(None)
        return
    persist.hurry()

    def answer(finished: concurrent.futures.Future[None]) -> None:
        error = finished.exception()
        reply.set(None if error is None else store_error(error, session_id))

    future.add_done_callback(answer)


def store_error(error: BaseException, session_id: uuid.UUID) -> ErrorInfo:
    """What a caller is told when the store refused a write for ``session_id``."""
    code = getattr(error, "code", ErrorCode.STORE_FAILED)
    if not isinstance(code, ErrorCode):
        code = ErrorCode.STORE_FAILED
    return ErrorInfo(
        code=code,
        message=f"session {session_id}: the store refused the write: {error}",
        detail={"session_id": str(session_id)},
    )


def _unwired(error: BaseException, reply: Reply | None) -> None:
    log.critical("the rest of an operation raised, and no cortex is wired", exc_info=error)
