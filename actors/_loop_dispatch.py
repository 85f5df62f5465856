"""A dispatcher that serves every mailbox on one asyncio event loop's thread.

With :class:`LoopDispatcher` the node's actors (the Cortex and the sessions)
take their messages on the thread that runs async skills. An async skill
that spawns, collects or reports then posts to an actor served on its own
thread: the message is a ``deque`` append and the turn a ``call_soon``, with
no lock hand-off and no wake-up of another thread. Threads that are not the
loop's (sync skills, the store's writer, an embedding application) post as
before; one ``call_soon_threadsafe`` wakes the loop for all that queued
since its last turn.

The rule for handlers holds twice over: a handler that blocks now also holds
up every async skill. The blocking guard still reports such a handler
(logged, counted, handed to ``on_blocked``), but no thread can stand in for
the loop's.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sessiontree.actors._clock import RealClock
from sessiontree.actors._pooled import BlockedHandler, Dispatcher, _Worker

if TYPE_CHECKING:
    from sessiontree.actors._execution import EventLoopThread
    from sessiontree.actors._pooled import _Inbox

__all__ = ["LoopDispatcher"]

_REAL_TIME = RealClock()


class LoopDispatcher(Dispatcher):
    """A :class:`Dispatcher` whose one thread is ``loop``'s.

    Each turn of the loop serves the inboxes ready at its start, ``batch``
    messages each at most, then yields to the loop's other callbacks and
    tasks (fairness with async skills). On the loop's thread a blocking ask
    raises ``DeadlockError`` (it would wait for a turn that cannot come).
    Once the loop is closed, nothing queued is served again.
    """

    def __init__(
        self,
        loop: EventLoopThread,
        *,
        batch: int = 64,
        block_threshold: float = 1.0,
        on_blocked: Callable[[BlockedHandler], None] | None = None,
        now: Callable[[], float] | None = None,
        name: str = "sessiontree-loop-dispatch",
        watchdog: bool = True,
    ) -> None:
        super().__init__(
            1,
            batch=batch,
            block_threshold=block_threshold,
            max_extra_threads=0,
            on_blocked=on_blocked,
            now=now,
            name=name,
            watchdog=watchdog,
        )
        self.loop = loop
        self._queue: collections.deque[_Inbox] = collections.deque()
        self._turn_pending = False
        self._worker = _Worker()
        self._started = False

    def _start_pool(self) -> None:
        with self._lock:
            if self._started or self._closed.is_set():
                return
            self._started = True
            if self._watchdog:
                self._watchdog_thread = threading.Thread(
                    target=self._watch, name=f"{self.name}-watchdog", daemon=True
                )
                self._watchdog_thread.start()

    @property
    def live_threads(self) -> int:
        """1 (the loop's thread) from the first actor's start until ``close``."""
        return int(self._started and not self._closed.is_set())

    def _schedule(self, inbox: _Inbox) -> None:
        if not self._started:
            self._start_pool()
        with self._lock:
            self._pending += 1
        self._requeue(inbox)

    def _requeue(self, inbox: _Inbox) -> None:
        self._queue.append(inbox)
        if self._turn_pending:
            return
        self._turn_pending = True
        if self.loop.is_current():
            self.loop.loop.call_soon(self._turn)
            return
        try:
            self.loop.loop.call_soon_threadsafe(self._turn)
        except RuntimeError:  # the loop is closed: nothing will serve it again
            self._turn_pending = False

    def _turn(self) -> None:
        # The flag is cleared before the queue is read: an inbox queued after
        # this point finds it clear and asks for another turn.
        self._turn_pending = False
        queue, worker = self._queue, self._worker
        for _ in range(len(queue)):
            self._serve(queue.popleft(), worker)

    def _serve(self, inbox: _Inbox, worker: _Worker) -> None:
        try:
            inbox.serve(self, worker)
        except BaseException:  # noqa: BLE001 - a hook pykka lets through; _serve_failed logs it
            self._serve_failed(inbox)

    def _serving(self) -> list[_Worker]:
        return [self._worker]

    def close(self, timeout: float = 5.0) -> None:
        """Serve what is queued (on the loop), then stop the watchdog; idempotent."""
        if self._closed.is_set():
            return
        deadline = _REAL_TIME.monotonic() + timeout
        with self._lock:
            if not self.loop.is_current():
                self._drained.wait_for(lambda: self._pending == 0, timeout)
            self._closed.set()
        thread = self._watchdog_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - _REAL_TIME.monotonic()))
