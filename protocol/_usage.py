"""What sessions spend (``Usage``), what they may spend (``Budget``), and one
session's accounts as the node reports them (``Spending``).

A ``Usage`` adds up: a session's own (its model calls), its subtree's (its own
and every descendant's, each counted once), what is reserved for calls in
flight. A ``Budget`` bounds a session's subtree in each dimension it names;
``None`` leaves a dimension unbounded, ``0`` refuses everything in it.
"""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import msgspec

from sessiontree.protocol._errors import RejectedInputError

__all__ = ["COST_UNIT", "MAX_BUDGET_COST", "MAX_BUDGET_COUNT", "Budget", "Spending", "Usage"]

MAX_BUDGET_COUNT = 10**12  # tokens, calls or descendants: far past any real budget
MAX_BUDGET_COST = 1e12  # in the price table's currency

# msgspec's bounds refuse NaN (it compares false) and, with an upper bound, inf;
# what it decodes or converts is checked here before ``Budget.__post_init__``
# runs, with the field's path. A count is decoded as a number (JSON has one
# number type) and kept as an int (see Budget.__post_init__).
Count = Annotated[float, msgspec.Meta(ge=0, le=MAX_BUDGET_COUNT, multiple_of=1)]
Cost = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_BUDGET_COST)]
Fraction = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
Tally = Annotated[int, msgspec.Meta(ge=0)]  # a usage figure, as decoded

#: Costs are kept to a billionth of the price table's currency (a nano-dollar
#: for a table in dollars) and added as integers of that unit, so what is
#: reserved and then settled nets to exactly zero: no float residue.
COST_UNIT = 10**9


def cost_units(cost: float) -> int:
    r"""``cost`` in whole ``COST_UNIT``\ ths of the currency (rounded to the nearest)."""
    return round(cost * COST_UNIT)


_COUNTS = ("tokens", "calls", "descendants")


class Usage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Tokens, cost, model calls and sessions spawned: one call's, one
    session's, or a subtree's. A call to a model the price table does not name
    adds no cost and counts in ``unpriced_calls``.

    ``cost`` is a number of the currency kept to ``1 / COST_UNIT`` of it:
    ``+`` and ``-`` add it as whole units (``cost_units``), so sums are exact
    and a reservation settled is exactly zero.

    Decoding refuses a negative figure and a NaN or infinite cost (a damaged
    record is corrupt, never a figure that fails the arithmetic later)."""

    prompt_tokens: Tally = 0
    completion_tokens: Tally = 0
    cost: Cost = 0.0
    calls: Tally = 0
    descendants: Tally = 0
    unpriced_calls: Tally = 0  # calls to a model the price table does not name

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_units(self) -> int:
        """``cost`` as a whole number of ``1 / COST_UNIT`` of the currency."""
        return cost_units(self.cost)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost=(cost_units(self.cost) + cost_units(other.cost)) / COST_UNIT,
            calls=self.calls + other.calls,
            descendants=self.descendants + other.descendants,
            unpriced_calls=self.unpriced_calls + other.unpriced_calls,
        )

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens - other.prompt_tokens,
            completion_tokens=self.completion_tokens - other.completion_tokens,
            cost=(cost_units(self.cost) - cost_units(other.cost)) / COST_UNIT,
            calls=self.calls - other.calls,
            descendants=self.descendants - other.descendants,
            unpriced_calls=self.unpriced_calls - other.unpriced_calls,
        )


class Budget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a session's subtree may spend: ``tokens`` (prompt and completion),
    ``cost``, model ``calls`` and ``descendants`` spawned; ``None`` bounds
    nothing, ``0`` refuses every call (or spawn). ``soft`` is the fraction of
    any bound at which a warning is emitted once.

    A bound that is not a number (a bool is not one), is negative, NaN or
    infinite, or past ``MAX_BUDGET_COUNT`` (``MAX_BUDGET_COST``), a count
    with a fraction, or a ``soft`` outside (0, 1] is refused with
    ``RejectedInputError`` naming the field (``budget.calls``), however the
    budget is made: built directly, converted from a mapping, or decoded.
    JSON has one number type, so a count written ``31.0`` is the count 31
    (as JSON Schema reads "integer").
    """

    tokens: Count | None = None
    cost: Cost | None = None
    calls: Count | None = None
    descendants: Count | None = None
    soft: Fraction = 0.8

    def __post_init__(self) -> None:
        # Decoding and conversion checked all this already (naming the path);
        # built directly nothing is checked before this.
        for name in _COUNTS:
            value = getattr(self, name)
            if value is not None and type(value) is not int:
                msgspec.structs.force_setattr(self, name, _count(name, value))
            elif value is not None and not 0 <= value <= MAX_BUDGET_COUNT:
                _refuse(name, value, f"a whole number from 0 to {MAX_BUDGET_COUNT}")
        cost = self.cost
        if cost is not None and not (_is_number(cost) and 0 <= cost <= MAX_BUDGET_COST):
            _refuse("cost", self.cost, f"a number from 0 to {MAX_BUDGET_COST:g}")
        if not (_is_number(self.soft) and 0 < self.soft <= 1):
            _refuse("soft", self.soft, "a fraction above 0 and at most 1")

    @property
    def bounded(self) -> bool:
        """True when at least one dimension is bounded."""
        return not (
            self.tokens is None
            and self.cost is None
            and self.calls is None
            and self.descendants is None
        )


def _is_number(value: object) -> bool:
    """An int or float (a bool is not a number here); NaN fails every bound."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(name: str, value: Any) -> int:
    """A bound that is not an int already, as the whole number it is."""
    if not (_is_number(value) and 0 <= value <= MAX_BUDGET_COUNT):
        _refuse(name, value, f"a whole number from 0 to {MAX_BUDGET_COUNT}")
    if not float(value).is_integer():
        _refuse(name, value, "a whole number")
    return int(value)


def _refuse(name: str, value: object, what: str) -> NoReturn:
    msg = f"budget.{name} must be {what}, got {value!r}"
    raise RejectedInputError(msg, field=f"budget.{name}")


class Spending(msgspec.Struct, frozen=True, kw_only=True):
    """One session's accounts, as the node reports them (``Node.spending``, the
    HTTP API, the CLI).

    ``usage`` is what its own model calls spent, ``subtree_usage`` that and
    every descendant's (each counted once), ``reserved`` what calls in flight
    in its subtree hold. For a session that has ended, ``usage`` and
    ``subtree_usage`` are its result's. ``budget`` is what bounds its subtree
    (after narrowing; a Main's holds per message cycle) and ``budget_left``
    what it still allows after what is used and reserved (a Main's: in this
    cycle); both None without a budget. ``budget_clamped``: the budget is
    narrower than its spawn asked. ``budget_exhausted`` names the dimension
    (``tokens``, ``cost``, ``calls``, ``descendants``) whose hard limit was
    reached, or is None.
    """

    usage: Usage = msgspec.field(default_factory=Usage)
    subtree_usage: Usage = msgspec.field(default_factory=Usage)
    reserved: Usage = msgspec.field(default_factory=Usage)
    budget: Budget | None = None
    budget_left: Budget | None = None
    budget_clamped: bool = False
    budget_exhausted: str | None = None
