"""Retry policy of coordination patterns: opt-in, exponential backoff with jitter, bounded.

No retry is implicit: ``max_attempts`` is 1 unless
a caller asks for more, and every attempt is a fresh session. The backoff
schedule is tenacity's ``wait_exponential``; the jitter comes from a
generator that a ``seed`` makes repeatable; the waiting itself happens on the
node's ``Clock`` (tests advance a virtual one). Restarts are also bounded the
OTP way: at most ``intensity`` within ``period`` seconds per parent, past
which the pattern escalates instead of retrying.
"""

from __future__ import annotations

import collections
import math
import random
import threading
import uuid
from dataclasses import dataclass, field

import tenacity

from sessiontree.protocol import NON_RETRYABLE, ErrorCode, ErrorInfo

__all__ = ["Restarts", "Retry"]


@dataclass(frozen=True)
class Retry:
    """How a pattern retries a child that failed.

    ``max_attempts``: attempts per task, the first included (1: no retry).
    Attempt ``n`` waits ``min(initial * multiplier ** (n - 2), max_backoff)``
    plus a uniform jitter in ``[0, jitter]`` seconds before it starts.
    ``fallback_skill``: the skill of every attempt after the first (e.g. a
    sturdier, costlier one). ``retry_on``: the error codes worth a retry
    (default: any code not in ``NON_RETRYABLE``; a skill raising
    ``NonRetryableError`` is never retried). ``intensity``/``period``: at most
    that many restarts per parent within that many seconds, then escalate.
    Raises ``ValueError`` naming a bad field.
    """

    max_attempts: int = 1
    initial: float = 1.0
    multiplier: float = 2.0
    max_backoff: float = 60.0
    jitter: float = 0.0
    fallback_skill: str | None = None
    retry_on: frozenset[ErrorCode] | None = None
    intensity: int = 10
    period: float = 60.0
    seed: int | None = None
    _rng: random.Random = field(init=False, repr=False, compare=False)
    _wait: tenacity.wait_exponential = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or not 1 <= self.max_attempts <= 100:
            msg = f"Retry.max_attempts must be an integer in 1..100, got {self.max_attempts!r}"
            raise ValueError(msg)
        if not isinstance(self.intensity, int) or self.intensity < 0:
            msg = f"Retry.intensity must be an integer >= 0, got {self.intensity!r}"
            raise ValueError(msg)
        for name in ("initial", "multiplier", "max_backoff", "jitter", "period"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                msg = f"Retry.{name} must be a finite number >= 0, got {value!r}"
                raise ValueError(msg)
        if self.multiplier < 1:
            msg = f"Retry.multiplier must be >= 1, got {self.multiplier!r}"
            raise ValueError(msg)
        object.__setattr__(self, "_rng", random.Random(self.seed))  # noqa: S311 - jitter, not secrets
        object.__setattr__(
            self,
            "_wait",
            tenacity.wait_exponential(
                multiplier=self.initial, exp_base=self.multiplier, max=self.max_backoff
            ),
        )

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt number ``attempt`` (2, 3, …)."""
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt - 1
        jitter = self._rng.uniform(0.0, self.jitter) if self.jitter else 0.0
        return float(self._wait(state)) + jitter

    def retryable(self, error: ErrorInfo | None) -> bool:
        """Whether a failure with ``error`` is worth another attempt."""
        if error is None:
            return False
        if error.detail.get("retryable") is False:
            return False
        if self.retry_on is not None:
            return error.code in self.retry_on
        return error.code not in NON_RETRYABLE


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
