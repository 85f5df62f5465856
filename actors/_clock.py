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
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "LoopTimer", "RealClock", "TimerHandle", "VirtualClock"]

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


class LoopTimer:
    """A callback :meth:`RealClock.call_later_on` put on an event loop;
    ``cancel()`` (on the loop's thread) makes sure it never runs and lets go of
    it at once."""

    __slots__ = ("callback", "timers")

    def __init__(self, callback: Callable[[], None], timers: _LoopTimers) -> None:
        self.callback: Callable[[], None] | None = callback
        self.timers: _LoopTimers | None = timers  # None once fired or cancelled

    def cancel(self) -> None:
        """Cancel the timer (idempotent; nothing once it fired)."""
        self.callback = None
        timers = self.timers
        if timers is not None:
            self.timers = None
            timers.dropped()


class _LoopTimers:
    """One clock's timers on one event loop: one heap, and one loop timer for
    the earliest only. Used on the loop's thread only.

    A loop timer per wait cost a handle, a push onto the loop's heap and a
    cancel each, and ten thousand sessions sleeping for a day are the usual
    case. Cancelled entries stay in the heap until it is half dead, then it is
    rebuilt (as asyncio does with its own); once all are, the loop's timer goes
    too. A due timer runs as a loop callback of its own.
    """

    __slots__ = ("_dead", "_heap", "_seq", "_timer", "_timer_when")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, LoopTimer]] = []
        self._seq = itertools.count()  # ties in time fire in the order they were added
        self._dead = 0  # cancelled entries still in the heap
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = 0.0

    def add(
        self, loop: asyncio.AbstractEventLoop, delay: float, callback: Callable[[], None]
    ) -> LoopTimer:
        when = loop.time() + delay
        timer = LoopTimer(callback, self)
        heapq.heappush(self._heap, (when, next(self._seq), timer))
        if self._timer is None or when < self._timer_when:
            self._schedule(loop, when)
        return timer

    def dropped(self) -> None:
        """One entry was cancelled."""
        self._dead += 1
        heap = self._heap
        if self._dead == len(heap):
            heap.clear()
        elif self._dead > _MIN_DEAD and 2 * self._dead > len(heap):
            self._heap = heap = [entry for entry in heap if entry[2].timers is self]
            heapq.heapify(heap)
        else:
            return
        self._dead = 0
        if not heap and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def fire_due(self, loop: asyncio.AbstractEventLoop, now: float | None = None) -> None:
        """Hand every timer due at ``now`` (default: the loop's time) to the loop,
        in order, and time the loop for the next one. The loop's timer calls it."""
        if now is None:
            now = loop.time()
        heap = self._heap
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)[2]
            if timer.timers is None or timer.callback is None:  # cancelled
                self._dead -= 1
                continue
            timer.timers = None
            loop.call_soon(timer.callback, context=_EMPTY_CONTEXT)
        if heap:
            self._schedule(loop, heap[0][0])
        elif self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self.fire_due, loop, context=_EMPTY_CONTEXT)
        self._timer_when = when


_MIN_DEAD = 64  # a heap with fewer cancelled entries is never rebuilt


class RealClock:
    """The system clock; timers fire on one daemon thread started on first use."""

    def __init__(self) -> None:
        self._heap = _TimerHeap()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        # the timers of call_later_on, per loop (they go with their loop, or the clock)
        self._on_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopTimers] = (
            weakref.WeakKeyDictionary()
        )

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
    ) -> LoopTimer:
        """``call_later`` timed by ``loop`` itself, for a wait of a coroutine on that
        loop; call it on the loop's thread. No timer-thread hop (an asyncio
        loop's time is ``time.monotonic``, this clock's monotonic time); the
        clock keeps its timers on a loop in one heap, and ``callback`` runs as a
        loop callback in an empty context (asyncio would copy the caller's)."""
        timers = self._on_loops.get(loop)
        if timers is None:
            timers = self._on_loops[loop] = _LoopTimers()
        return timers.add(loop, delay, callback)

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
    with ``monotonic()`` set to its own due time for that thread. Every other
    thread sees the advance's end at once: an actor that handles what a
    timer posted, while the advance goes on, reads one instant whatever the
    threads' timing, and a timer it arms then is due after that instant
    (never in the past, where no advance would fire it). ``jump_wall``
    moves only the wall clock (as NTP would), which must never change when
    deadlines fire.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall_offset = start
        self._mono = 0.0
        self._heap = _TimerHeap()
        self._lock = threading.RLock()
        # While an advance fires a timer: (the advancing thread, the timer's due time).
        self._firing: tuple[int, float] | None = None

    def time(self) -> float:
        return self._wall_offset + self.monotonic()

    def monotonic(self) -> float:
        firing = self._firing
        if firing is not None and firing[0] == threading.get_ident():
            return firing[1]
        return self._mono

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        with self._lock:  # another thread's waits for an advance to end
            return self.call_at(self.monotonic() + delay, callback)

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
            start = self.monotonic()
            target = start + seconds
            self._mono = max(self._mono, target)  # an advance from a timer never moves it back
            me = threading.get_ident()
            try:
                while True:
                    handle = self._heap.pop_due(target)
                    if handle is None:
                        break
                    self._firing = (me, max(start, handle.when))
                    _fire(handle)
            finally:
                self._firing = None

    def jump_wall(self, seconds: float) -> None:
        """Jump the wall clock by ``seconds`` (either way) without moving monotonic time."""
        with self._lock:
            self._wall_offset += seconds

    @property
    def pending_timers(self) -> int:
        """How many timers are scheduled (cancelled ones may still count)."""
        return len(self._heap)

    @property
    def next_timer(self) -> float | None:
        """When (monotonic) the next scheduled timer is due, None with none: a
        driver can ``advance`` straight to it instead of stepping (trio's
        autojump); cancelled timers are skipped."""
        with self._lock:
            return self._heap.next_when()
