"""Budget arithmetic as pure functions over ``Usage`` and ``Budget``.

The Cortex keeps, per session, what its subtree has used and what is
reserved for calls and spawns in flight; these rules say what is left, what
a child may have, and whether one more call or spawn fits. "Fits" counts
what is used plus what is reserved (issue 20: a fan-out launched at once
cannot overshoot).
"""

from __future__ import annotations

from typing import TypeVar

from sessiontree.protocol import COST_UNIT, Budget, Usage

__all__ = ["DIMENSIONS", "bound_of", "crossed_soft", "first_exceeded", "left", "narrow", "spent"]

N = TypeVar("N", int, float)

#: Each bounded dimension, by the field name ``Budget`` and this module use.
DIMENSIONS = ("tokens", "cost", "calls", "descendants")


def spent(usage: Usage, dimension: str) -> int:
    """``usage``'s figure in ``dimension`` (one of ``DIMENSIONS``); cost in
    whole units (``COST_UNIT``), so every comparison here is exact."""
    if dimension == "tokens":
        return usage.tokens
    if dimension == "cost":
        return usage.cost_units
    value: int = getattr(usage, dimension)
    return value


def bound_of(budget: Budget, dimension: str) -> int | None:
    """``budget``'s bound in ``dimension``, in the units ``spent`` counts in."""
    bound: int | float | None = getattr(budget, dimension)
    if bound is None:
        return None
    return round(bound * COST_UNIT) if dimension == "cost" else int(bound)


def left(budget: Budget, used: Usage, reserved: Usage) -> Budget:
    """What ``budget`` still allows after ``used`` and ``reserved`` (never
    below zero; an unbounded dimension stays unbounded)."""
    taken = used + reserved
    return Budget(
        tokens=None if budget.tokens is None else max(budget.tokens - taken.tokens, 0),
        cost=(
            None
            if budget.cost is None
            else max(round(budget.cost * COST_UNIT) - taken.cost_units, 0) / COST_UNIT
        ),
        calls=None if budget.calls is None else max(budget.calls - taken.calls, 0),
        descendants=(
            None if budget.descendants is None else max(budget.descendants - taken.descendants, 0)
        ),
        soft=budget.soft,
    )


def narrow(requested: Budget | None, allowed: Budget | None) -> tuple[Budget | None, bool]:
    """The budget a child gets: ``requested`` capped, dimension by dimension,
    by what its parent has ``allowed`` (left); and whether anything was
    clamped. A child asking for nothing gets what its parent has left."""
    if allowed is None:
        return requested, False
    if requested is None:
        return allowed, False
    narrowed = Budget(
        tokens=_cap(requested.tokens, allowed.tokens),
        cost=_cap(requested.cost, allowed.cost),
        calls=_cap(requested.calls, allowed.calls),
        descendants=_cap(requested.descendants, allowed.descendants),
        soft=requested.soft,
    )
    return narrowed, narrowed != requested


def _cap(asked: N | None, cap: N | None) -> N | None:
    if cap is None:
        return asked
    return cap if asked is None or asked > cap else asked


def first_exceeded(budget: Budget, used: Usage, reserved: Usage, ask: Usage) -> str | None:
    """The first dimension in which ``ask`` does not fit beside what is
    ``used`` and ``reserved`` (None: it fits)."""
    after = used + reserved + ask
    for dimension in DIMENSIONS:
        bound = bound_of(budget, dimension)
        if bound is not None and spent(ask, dimension) > 0 and spent(after, dimension) > bound:
            return dimension
    return None


def crossed_soft(budget: Budget, before: Usage, after: Usage) -> str | None:
    """The first dimension whose soft threshold (``budget.soft`` of its bound)
    ``after`` reaches and ``before`` had not (None: none crossed)."""
    for dimension in DIMENSIONS:
        bound = bound_of(budget, dimension)
        if bound is None or bound == 0:
            continue
        line = bound * budget.soft
        if spent(before, dimension) < line <= spent(after, dimension):
            return dimension
    return None
