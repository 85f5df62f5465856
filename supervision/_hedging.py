"""Hedged children (issue 26): a duplicate for a child in the slow tail.

A fan-out with a ``Hedge`` starts one duplicate of a task whose child has
run longer than the hedge's delay: a fixed number of clock seconds, or a
percentile of how long the fan-out's children took so far ("The Tail at
Scale", Dean and Barroso, 2013). The first of the two to succeed is the
task's result; the other is cancelled with the node's grace. A duplicate is
a fresh session like any attempt: it counts against the children limit and
the budget (a duplicate the limit refuses is simply not started).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from sessiontree.protocol import RejectedInputError

__all__ = ["Hedge", "Hedger", "hedge_of"]


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


_FIELDS = ("after", "percentile", "min_samples")


def hedge_of(value: object) -> Hedge | None:
    """A pattern's ``hedge`` option as a ``Hedge``: one as it is, a mapping of
    its fields (``{"after": 2.0}``) checked as ``Hedge`` checks them, None as
    None. ``RejectedInputError`` naming the field (``hedge.after``, an unknown
    ``hedge.<key>``, or ``hedge`` for anything else)."""
    if value is None or isinstance(value, Hedge):
        return value
    if isinstance(value, Mapping):
        for key in value:
            if key not in _FIELDS:
                msg = f"hedge has no field {key!r} (it has {', '.join(_FIELDS)})"
                raise RejectedInputError(msg, field=f"hedge.{key}", reason="unknown_field")
        return Hedge(**value)
    msg = f"hedge must be a Hedge or a mapping of its fields, not {type(value).__name__}"
    raise RejectedInputError(msg, field="hedge")


class Hedger:
    """A gather's bookkeeping for its hedge: when each child started, how long
    the successful ones took, which tasks were hedged already (once each)."""

    def __init__(self, hedge: Hedge) -> None:
        self.hedge = hedge
        self.started: dict[uuid.UUID, float] = {}
        self.took: list[float] = []
        self.hedged: set[int] = set()

    def delay(self) -> float | None:
        """How long a child runs before it gets a duplicate, now (None: not yet)."""
        hedge = self.hedge
        if hedge.percentile is not None and len(self.took) >= hedge.min_samples:
            ranked = sorted(self.took)
            at = math.ceil(hedge.percentile / 100 * len(ranked)) - 1
            return ranked[min(max(at, 0), len(ranked) - 1)]
        return hedge.after

    def ended(self, child: uuid.UUID, now: float, ok: bool) -> None:
        began = self.started.pop(child, None)
        if ok and began is not None:
            self.took.append(now - began)

    def due(self, alone: dict[int, uuid.UUID], now: float) -> tuple[list[int], float | None]:
        """Of the tasks running ``alone`` (task index -> its one child), those to
        hedge now, and when the next one falls due (None: none will)."""
        delay = self.delay()
        if delay is None:
            return [], None
        now_due, soonest = [], None
        for index, child in alone.items():
            if index in self.hedged or child not in self.started:
                continue
            when = self.started[child] + delay
            if when <= now:
                now_due.append(index)
            elif soonest is None or when < soonest:
                soonest = when
        return now_due, soonest
