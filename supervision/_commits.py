"""How the Cortex waits for the store: shared commits and what runs after them.

The store's one writer makes every write; the Cortex never blocks on one. It
hands the writer its records, and what must happen once they are durable (a
spawn's answer, a child's start, a message's acceptance) comes back to the
Cortex's mailbox as an ``AfterWrite``. Writes made inside ``one_commit`` share
one transaction and one ``AfterWrite``; what must only wait until they are
submitted (queued in order ahead of any later write) uses ``when_submitted``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pykka

from sessiontree.actors.runtime import Reply, post
from sessiontree.protocol import ErrorCode, ErrorInfo
from sessiontree.supervision._entry import TreeEntry
from sessiontree.supervision._persist import Persister
from sessiontree.supervision._reports import AfterWrite
from sessiontree.supervision._runtime import Runtime

__all__ = ["Commits", "answer_durable", "answer_written", "store_error"]

log = logging.getLogger("sessiontree.cortex")

Then = Callable[[BaseException | None], None]


class Commits:
    """The Cortex's side of the store's group commit (Cortex thread only)."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.persist = runtime.persist
        self.ref: pykka.ActorRef[Any] | None = None  # the Cortex, once started
        self.batched: list[Then] | None = None
        self.submitted: list[Callable[[], None]] | None = None  # run once the batch is submitted
        # the open batch's future and how many writes in it count_failures counts
        self.counted_writes: tuple[concurrent.futures.Future[None], list[int]] | None = None

    def when_written(
        self, future: concurrent.futures.Future[None] | None, then: Then, *, urgent: bool = True
    ) -> None:
        """Run ``then(error)`` on the Cortex thread once the store write ``future``
        finished (at once without a store). The write counts as activity.
        ``urgent`` (default): someone outside waits on it, so it commits now;
        otherwise it goes with the next write someone waits on."""
        if future is None:
            then(None)
            return
        if urgent:
            self.persist.hurry()
        if self.batched is not None and future is self.persist.shared:
            self.batched.append(then)  # one AfterWrite for the whole batch
            return
        ref, activity = self.ref, self.rt.activity
        activity.begin()

        def done(finished: concurrent.futures.Future[None]) -> None:
            try:
                if ref is None or not post(ref, AfterWrite(then, finished.exception()), activity):
                    log.warning("a store write finished after the cortex stopped")
            finally:
                activity.end()

        future.add_done_callback(done)

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
        what waits for those writes runs in one ``AfterWrite``: a batched spawn,
        a cascade, a batch of ended runs cost one transaction, not one each."""
        if self.batched is not None:
            yield
            return
        self.batched, self.submitted = [], []
        self.persist.open_batch()
        shared = self.persist.shared
        try:
            yield
        finally:
            thens, self.batched = self.batched, None
            submitted, self.submitted = self.submitted, None
            self.persist.close_batch()
            if thens:

                def run_all(error: BaseException | None) -> None:
                    for then in thens:
                        then(error)

                # who waits urgently asked for it as it joined (the batch is hurried
                # as it closes): the batch as a whole is not urgent
                self.when_written(shared, run_all, urgent=False)
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
