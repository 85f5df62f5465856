"""Counting what is in flight, so a node can tell when its tree has settled."""

from __future__ import annotations

import collections
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
        self._cond = threading.Condition(threading.Lock())
        # One token per piece of work in flight. deque.append and deque.pop are
        # atomic, so counting takes no lock: every message and skill run passes
        # here twice, from every thread, and a contended lock cost more than the
        # rest of a spawn. The lock is only for waking wait_idle.
        self._tokens: collections.deque[None] = collections.deque()
        self.on_idle: Callable[[], None] | None = None
        """Called (on the thread that ended the last piece of work) when nothing is
        left in flight; it must be quick and must not raise."""

    def begin(self) -> None:
        """One more message or running skill."""
        self._tokens.append(None)

    def end(self) -> None:
        """One fewer; wakes ``wait_idle`` when nothing is left. An ``end``
        without its ``begin`` is ignored (the count never goes below zero)."""
        tokens = self._tokens
        # not contextlib.suppress: that is an object and two calls, on every end
        try:  # noqa: SIM105
            tokens.pop()
        except IndexError:
            pass
        if tokens:
            return
        hook = self.on_idle
        if hook is not None:
            hook()  # it may hand on more work (begin): then we are not idle after all
        with self._cond:  # a waiter checks under this lock, so it cannot miss this
            if not tokens:
                self._cond.notify_all()

    @property
    def busy(self) -> int:
        """What is in flight right now."""
        return len(self._tokens)

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is in flight; False if ``timeout`` (real seconds) ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._tokens, timeout=timeout)
