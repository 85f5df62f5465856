"""Compute slots: a bound on how many skills run at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["ComputeSlots"]


class ComputeSlots:
    """At most ``limit`` holders at once; waiters are served first come, first served.

    A waiter is a callback called (on the releasing thread) once the slot is
    handed to it: the slot then belongs to the waiter without ever being free.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = limit
        # An insertion-ordered dict, not a deque: forgetting a waiter (a pending
        # session cancelled in a cascade) must be O(1), not a scan of the queue.
        self._waiters: dict[Callable[[], None], None] = {}
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        """Slots held right now."""
        return self.limit - self._free

    @property
    def waiting(self) -> int:
        """Callers queued for a slot."""
        return len(self._waiters)

    def acquire_or_queue(self, granted: Callable[[], None]) -> bool:
        """Take a slot now (True) or queue ``granted`` to be called with one later (False)."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
            self._waiters[granted] = None
            return False

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody queues for it; never queues."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
            return False

    def forget(self, granted: Callable[[], None]) -> bool:
        """Drop a queued waiter; False if it was already served (it then holds a slot)."""
        with self._lock:
            if granted not in self._waiters:
                return False
            del self._waiters[granted]
            return True

    def acquire_blocking(self) -> None:
        """Block the calling thread until it holds a slot."""
        event = threading.Event()
        if not self.acquire_or_queue(event.set):
            event.wait()

    def release(self) -> None:
        """Give a slot back, straight to the first waiter if there is one."""
        with self._lock:
            if self._waiters:
                granted = next(iter(self._waiters))
                del self._waiters[granted]
            else:
                self._free += 1
                return
        granted()
