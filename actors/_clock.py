"""Time, injected: a ``Clock`` protocol, the real clock and a virtual one for tests.

Every TTL, grace period, timeout and backoff in sessiontree reads one Clock.
A clock also schedules callbacks (one heap per clock, so one per node): the
real clock fires them on a single timer thread, the virtual clock fires them
in the thread that calls :meth:`VirtualClock.advance`. Callbacks must be
quick and must not raise; they only post messages.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "RealClock", "TimerHandle", "VirtualClock"]

log = logging.getLogger("sessiontree.clock")


_EMPTY_CONTEXT = contextvars.Context()  # see RealClock.call_later_on


class TimerHandle:
    """A scheduled callback; ``cancel()`` makes sure it never fires."""

    __slots__ = ("callback", "cancelled", "heap", "when")

    def __init__(
        self, when: float, callback: Callable[[], None], heap: _TimerHeap | None = None
    ) -> None:
        self.when = when
        self.callback: Callable[[], None] | None = callback
        self.cancelled = False
        self.heap = heap

    def cancel(self) -> None:
        """Cancel the timer (idempotent, safe from any thread)."""
        if self.cancelled:
            return
        self.cancelled = True
        self.callback = None
        if self.heap is not None:
            self.heap.cancelled += 1


class Clock(Protocol):
    """Wall-clock time, monotonic time and timers.

    ``time()`` is seconds since the epoch (for stored instants); ``monotonic()``
    never jumps (for enforcing deadlines). ``call_at(when, cb)`` runs ``cb``
    once ``monotonic() >= when``.
    """

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle: ...


class _TimerHeap:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self.cancelled = 0  # approximate: bumped by TimerHandle.cancel from any thread

    def push(self, handle: TimerHandle) -> None:
        # Cancelled timers (a TTL whose session ended) would pile up until due:
        # rebuild once they are most of the heap, so memory follows live timers.
        if self.cancelled > 64 and self.cancelled * 2 > len(self._heap):
            self._heap = [item for item in self._heap if not item[2].cancelled]
            heapq.heapify(self._heap)
            self.cancelled = 0
        heapq.heappush(self._heap, (handle.when, next(self._seq), handle))

    def first(self) -> TimerHandle | None:
        """The earliest timer on the heap (possibly a cancelled one)."""
        return self._heap[0][2] if self._heap else None

    def next_when(self) -> float | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
            self.cancelled = max(0, self.cancelled - 1)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> TimerHandle | None:
        when = self.next_when()
        if when is None or when > now:
            return None
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)


def _fire(handle: TimerHandle) -> None:
    handle.heap = None  # already off the heap: not a cancelled entry left behind
    callback = handle.callback
    handle.cancel()
    if callback is None:
        return
    try:
        callback()
    except Exception:
        log.exception("timer callback %r raised; the timer is dropped", callback)


class RealClock:
    """The system clock; timers fire on one daemon thread started on first use."""

    def __init__(self) -> None:
        self._heap = _TimerHeap()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self.call_at(self.monotonic() + delay, callback)

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(when, callback, self._heap)
        with self._cond:
            self._heap.push(handle)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="sessiontree-timers", daemon=True
                )
                self._thread.start()
            if self._heap.first() is handle:
                # Only a new earliest timer changes how long the thread sleeps:
                # waking it for every later one (a TTL per spawn) cost a switch each.
                self._cond.notify()
        return handle

    def call_later_on(
        self, loop: asyncio.AbstractEventLoop, delay: float, callback: Callable[[], None]
    ) -> asyncio.TimerHandle:
        """``call_later`` timed by ``loop`` itself, for a wait of a coroutine on that
        loop: no timer-thread hop (an asyncio loop's time is ``time.monotonic``,
        this clock's monotonic time). ``callback`` runs in an empty context
        (asyncio would copy the caller's into every timer)."""
        return loop.call_later(delay, callback, context=_EMPTY_CONTEXT)

    def close(self) -> None:
        """Stop the timer thread; pending timers never fire."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    when = self._heap.next_when()
                    now = time.monotonic()
                    if when is not None and when <= now:
                        handle = self._heap.pop_due(now)
                        break
                    self._cond.wait(None if when is None else when - now)
            if handle is not None:
                _fire(handle)


class VirtualClock:
    """A clock that moves only when told to: ``advance(30)`` takes microseconds.

    Timers due within the advance fire in order, in the calling thread, each
    with ``monotonic()`` set to its own due time. ``jump_wall`` moves only the
    wall clock (as NTP would), which must never change when deadlines fire.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall_offset = start
        self._mono = 0.0
        self._heap = _TimerHeap()
        self._lock = threading.RLock()

    def time(self) -> float:
        return self._wall_offset + self._mono

    def monotonic(self) -> float:
        return self._mono

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self.call_at(self._mono + delay, callback)

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(when, callback, self._heap)
        with self._lock:
            self._heap.push(handle)
        return handle

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer that falls due."""
        if seconds < 0:
            msg = f"cannot advance a clock backwards ({seconds})"
            raise ValueError(msg)
        with self._lock:
            target = self._mono + seconds
            while True:
                handle = self._heap.pop_due(target)
                if handle is None:
                    break
                self._mono = max(self._mono, handle.when)
                _fire(handle)
            self._mono = target

    def jump_wall(self, seconds: float) -> None:
        """Jump the wall clock by ``seconds`` (either way) without moving monotonic time."""
        with self._lock:
            self._wall_offset += seconds

    @property
    def pending_timers(self) -> int:
        """How many timers are scheduled (cancelled ones may still count)."""
        return len(self._heap)
