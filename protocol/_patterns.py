"""What a skill's handle asks its host to run: a coordination pattern, typed.

The patterns themselves (``sessiontree.supervision``: ``fan_out``,
``pipeline``, ``map_reduce``, ``continue_run``) sit above the handle; a
handle hands its host one of the calls here (``FanOut``, ``Pipeline``,
``MapReduce``, ``ContinueRun``, ``QuorumCollect``), each holding the
pattern's arguments and its options as one of the ``…Options`` typed
dictionaries, so a type checker sees a skill's options and a misspelt one
is refused, naming it, before anything is spawned. ``Retry`` and ``Hedge``
are the policies those options take.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypedDict

import tenacity

from sessiontree.protocol._coordination import NON_RETRYABLE, AggregateStrategy
from sessiontree.protocol._errors import ErrorCode, ErrorInfo, RejectedInputError
from sessiontree.protocol._states import SessionKind

__all__ = [
    "ContinueOptions",
    "ContinueRun",
    "FanOut",
    "FanOutOptions",
    "Hedge",
    "MapReduce",
    "MapReduceOptions",
    "PatternCall",
    "Pipeline",
    "PipelineOptions",
    "QuorumCollect",
    "Retry",
    "Summarizer",
]

Summarizer: TypeAlias = Callable[[Sequence[str]], str]
"""Turns the children's summaries (task order) into one; an LLM call is just another one."""


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


@dataclass(frozen=True)
class Hedge:
    """When to start a duplicate of a child still running.

    ``after``: clock seconds (the delay while fewer than ``min_samples``
    children have succeeded, when ``percentile`` is given too; None: no
    duplicate until then). ``percentile`` (0 < p < 100): the delay is that
    percentile of the successful children's run times so far. At least one of
    the two. ``RejectedInputError`` naming the field otherwise (a bool is not
    a number: ``after=True`` is refused as ``hedge_after=True`` is), at
    construction; ``hedge_of`` checks a mapping of these fields the same way.
    """

    after: float | None = None
    percentile: float | None = None
    min_samples: int = 5

    def __post_init__(self) -> None:
        if self.after is None and self.percentile is None:
            raise RejectedInputError("a Hedge needs after or percentile", field="hedge")
        if self.after is not None and not (
            _is_number(self.after) and math.isfinite(self.after) and self.after >= 0
        ):
            msg = f"hedge after must be a number of seconds >= 0, got {self.after!r}"
            raise RejectedInputError(msg, field="hedge.after")
        if self.percentile is not None and not (
            _is_number(self.percentile) and 0 < self.percentile < 100
        ):
            msg = f"hedge percentile must be between 0 and 100, got {self.percentile!r}"
            raise RejectedInputError(msg, field="hedge.percentile")
        if (
            not isinstance(self.min_samples, int)
            or isinstance(self.min_samples, bool)
            or self.min_samples < 1
        ):
            msg = f"hedge min_samples must be an integer >= 1, got {self.min_samples!r}"
            raise RejectedInputError(msg, field="hedge.min_samples")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# -- the options each pattern takes (see the patterns' docstrings) ----------------------------


class _Gather(TypedDict, total=False):
    kind: str | SessionKind
    skill: str | None
    ttl: float | None
    retry: Retry | None
    timeout: float | None
    on_timeout: str


class FanOutOptions(_Gather, total=False):
    """``fan_out``'s options."""

    aggregate: AggregateStrategy | str | None
    summarizer: Summarizer | None
    quorum: int | None
    hedge: Hedge | Mapping[str, Any] | None


class PipelineOptions(_Gather, total=False):
    """``pipeline``'s options."""

    aggregate: AggregateStrategy | str | None
    summarizer: Summarizer | None


class MapReduceOptions(_Gather, total=False):
    """``map_reduce``'s options."""

    batch_size: int
    reduce_skill: str | None


class ContinueOptions(TypedDict, total=False):
    """``continue_run``'s options."""

    retry: Retry | None
    timeout: float | None
    on_timeout: str


# -- the calls ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FanOut:
    """One child per task."""

    tasks: list[Any]
    options: FanOutOptions


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Stages in order, each seeded with the previous stage's results."""

    stages: list[Any]
    options: PipelineOptions


@dataclass(frozen=True, slots=True)
class MapReduce:
    """Map batches of ``items`` in parallel, then reduce."""

    items: list[Any]
    map_task: Any
    reduce_task: Any
    options: MapReduceOptions


@dataclass(frozen=True, slots=True)
class ContinueRun:
    """A fresh session continuing the run a token names."""

    token: str
    context: str
    options: ContinueOptions


@dataclass(frozen=True, slots=True)
class QuorumCollect:
    """``collect`` of ``children`` with a quorum."""

    children: list[Any]
    quorum: int
    timeout: float | None = None
    aggregate: str | None = None


PatternCall: TypeAlias = FanOut | Pipeline | MapReduce | ContinueRun | QuorumCollect
