"""A replayed model call's share of the node's activity (``CallHold``), and
where the task that makes the call finds it (``HOLD``).

``ModelCalls`` takes one for each call of a replayed session; the replay's
tape drops it while the call waits out its recorded latency, so the
replay's clock moves only when nothing runs.
"""

from __future__ import annotations

import contextvars
import threading

from sessiontree.actors.runtime import Activity

__all__ = ["HOLD", "CallHold"]


class CallHold:
    """A replayed model call's share of the node's activity: held while the
    call runs, dropped while it waits out its recorded latency, and let go
    for good when it ends (in whatever order those come from their threads)."""

    __slots__ = ("_activity", "_closed", "_held", "_lock")

    def __init__(self, activity: Activity) -> None:
        self._activity = activity
        self._lock = threading.Lock()
        self._held = True
        self._closed = False
        activity.begin()

    def take(self) -> None:
        with self._lock:
            if self._held or self._closed:
                return
            self._held = True
        self._activity.begin()

    def drop(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._activity.end()

    def close(self, _done: object = None) -> None:
        with self._lock:
            self._closed = True
        self.drop()


HOLD: contextvars.ContextVar[CallHold | None] = contextvars.ContextVar("hold", default=None)
"""The hold of the replayed model call the running task makes (``ModelCalls``)."""
