"""Restarts of coordination patterns, bounded the OTP way: at most a policy's
``intensity`` within its ``period`` seconds per parent, past which the
pattern escalates instead of retrying (the policy, ``Retry``, is protocol's:
opt-in, tenacity's exponential backoff with seeded jitter, waited on the
node's clock)."""

from __future__ import annotations

import collections
import threading
import uuid

from sessiontree.protocol import Retry

__all__ = ["Restarts"]


class Restarts:
    """Restart times per parent, for the intensity limit (shared by a node's patterns).

    ``retries``: restarts allowed so far (each schedules a fresh attempt);
    ``escalations``: restarts refused at the intensity limit (the metrics read both).
    """

    def __init__(self) -> None:
        self._times: dict[uuid.UUID, collections.deque[float]] = {}
        self._lock = threading.Lock()
        self.retries = 0
        self.escalations = 0

    def allow(self, parent: uuid.UUID, now: float, policy: Retry) -> bool:
        """Record a restart of one of ``parent``'s children at ``now`` if the
        policy allows one more within its period; False (nothing recorded) if not."""
        with self._lock:
            times = self._times.setdefault(parent, collections.deque())
            while times and times[0] <= now - policy.period:
                times.popleft()
            if len(times) >= policy.intensity:
                self.escalations += 1
                return False
            times.append(now)
            self.retries += 1
            return True

    def forget(self, parent: uuid.UUID, now: float, period: float) -> None:
        """Drop ``parent``'s record once nothing in it is recent (bounded memory)."""
        with self._lock:
            times = self._times.get(parent)
            if times is not None and (not times or times[-1] <= now - period):
                del self._times[parent]
