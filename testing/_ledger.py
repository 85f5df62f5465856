"""The stand-in's shared state: the queues of scripted replies and faults, the
recorded request bodies, and the counters, under one condition variable.

``StandinServer`` owns one ``Ledger`` and hands it to its chat handler: the
test's thread scripts and reads it, the server thread takes from it and
counts into it. Every method takes the lock, so any thread may call any of
them; only ``wait_until`` blocks, and for at most its timeout.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from typing import Any

from sessiontree.testing._script import Fault, Reply, StandinStats


class Ledger:
    """Replies and faults waiting to be taken, the last ``max_recorded``
    request bodies, and what was counted."""

    def __init__(self, max_recorded: int) -> None:
        self._cond = threading.Condition()
        self._script: collections.deque[Reply] = collections.deque()
        self._faults: collections.deque[Fault] = collections.deque()
        self._recorded: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_recorded)
        self._received = 0
        self._served = 0
        self._prompt_served = 0
        self._completion_served = 0
        self._disconnects = 0
        self._sequence = 0  # completions begun, numbering their ids

    # --- the test's side ---------------------------------------------------------

    def script(self, replies: Iterable[Reply]) -> None:
        """Queue replies; each completion takes the next."""
        with self._cond:
            self._script.extend(replies)

    def queue_faults(self, fault: Fault, times: int) -> None:
        """Queue ``fault`` for the next ``times`` chat-completions requests."""
        with self._cond:
            self._faults.extend([fault] * times)

    def stats(self) -> StandinStats:
        """Every count at one instant."""
        with self._cond:
            return self._stats_locked()

    def requests(self) -> list[dict[str, Any]]:
        """The recorded request bodies, oldest first."""
        with self._cond:
            return list(self._recorded)

    def wait_until(self, predicate: Callable[[StandinStats], bool], timeout: float) -> bool:
        """Block until ``predicate(stats)`` holds; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self._stats_locked()), timeout)

    # --- the server's side -------------------------------------------------------

    def receive(self, body: object) -> None:
        """Count a chat request whose body parsed, recording it if an object."""
        with self._cond:
            self._received += 1
            if isinstance(body, dict):
                self._recorded.append(body)
            self._cond.notify_all()

    def count(self, **deltas: int) -> None:
        """Add ``received``, ``served``, ``prompt``, ``completion`` and
        ``disconnects`` (each may be negative) and wake the waiters."""
        with self._cond:
            self._received += deltas.get("received", 0)
            self._served += deltas.get("served", 0)
            self._prompt_served += deltas.get("prompt", 0)
            self._completion_served += deltas.get("completion", 0)
            self._disconnects += deltas.get("disconnects", 0)
            self._cond.notify_all()

    def take_fault(self) -> Fault | None:
        """The next queued fault, or None."""
        with self._cond:
            return self._faults.popleft() if self._faults else None

    def take_reply(self) -> tuple[Reply | None, int]:
        """The next scripted reply (None if none is queued) and this
        completion's sequence number."""
        with self._cond:
            self._sequence += 1
            return (self._script.popleft() if self._script else None), self._sequence

    def _stats_locked(self) -> StandinStats:
        return StandinStats(
            self._received,
            self._served,
            self._prompt_served,
            self._completion_served,
            self._disconnects,
        )
