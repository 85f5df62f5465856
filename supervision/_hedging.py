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

from sessiontree.protocol import Hedge, RejectedInputError

__all__ = ["Hedger", "hedge_of"]


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
