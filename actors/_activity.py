"""Counting what is in flight, so a node can tell when its tree has settled."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Activity"]


class Activity:
    """Messages queued or being handled, plus skills that are running.

    A message counts from the moment it is posted until its handler returns;
    a skill counts from submission until it ends or blocks at a checkpoint
    (waiting on children, parked), and again from the moment something wakes
    it. Whoever wakes a skill counts it *before* finishing its own message, so
    the total never touches zero while work is still being handed on.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self.on_idle: Callable[[], None] | None = None
        """Called (on the thread that ended the last piece of work) when nothing is
        left in flight; it must be quick and must not raise."""

    def begin(self) -> None:
        """One more message or running skill."""
        with self._cond:
            self._busy += 1

    def end(self) -> None:
        """One fewer; wakes ``wait_idle`` when nothing is left."""
        with self._cond:
            self._busy -= 1
            if self._busy > 0:
                return
        hook = self.on_idle
        if hook is not None:
            hook()  # it may hand on more work (begin): then we are not idle after all
        with self._cond:
            if self._busy <= 0:
                self._cond.notify_all()

    @property
    def busy(self) -> int:
        """What is in flight right now."""
        return self._busy

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is in flight; False if ``timeout`` (real seconds) ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: self._busy <= 0, timeout=timeout)
