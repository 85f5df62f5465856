"""Usage and budgets: the protocol's types and the budget rules as plain functions."""

from __future__ import annotations

import math

import msgspec
import pytest

from sessiontree.protocol import Budget, RejectedInputError, SessionKind, Usage, make_spec
from sessiontree.supervision._budgets import crossed_soft, first_exceeded, left, narrow

CALL = Usage(prompt_tokens=40, completion_tokens=10, cost=0.5, calls=1)
SPAWN = Usage(descendants=1)


def test_usage_adds_and_subtracts_every_figure() -> None:
    twice = CALL + CALL
    assert twice == Usage(prompt_tokens=80, completion_tokens=20, cost=1.0, calls=2)
    assert twice.tokens == 100
    assert twice - CALL == CALL


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokens", -1),
        ("calls", -5),
        ("descendants", -1),
        ("cost", -0.01),
        ("cost", math.nan),
        ("cost", math.inf),
        ("tokens", "5"),
        ("soft", 0.0),
        ("soft", 1.5),
    ],
)
def test_a_bad_budget_is_refused_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(RejectedInputError) as caught:
        make_spec(kind="worker", budget={field: value})
    assert caught.value.field == f"budget.{field}"


def test_a_budget_object_is_checked_as_strictly_as_a_mapping() -> None:
    with pytest.raises(RejectedInputError, match=r"budget\.tokens"):
        make_spec(kind="worker", budget=Budget(tokens=-1))
    assert make_spec(kind=SessionKind.WORKER, budget=Budget(tokens=5)).budget == Budget(tokens=5)


def test_a_count_written_as_a_whole_float_is_that_count_and_a_fraction_is_refused() -> None:
    assert msgspec.json.decode(b'{"tokens": 31.0}', type=Budget).tokens == 31
    assert type(msgspec.json.decode(b'{"calls": 2.0}', type=Budget).calls) is int
    with pytest.raises(msgspec.ValidationError, match=r"multiple of 1\.0 - at `\$\.calls`"):
        msgspec.json.decode(b'{"calls": 2.5}', type=Budget)
    with pytest.raises(RejectedInputError, match="whole number") as refused:
        Budget(descendants=1.5)
    assert refused.value.field == "budget.descendants"
    assert Budget(calls=3.0).calls == 3
    assert type(Budget(calls=3.0).calls) is int


def test_a_budget_round_trips_through_json_and_refuses_unknown_fields() -> None:
    budget = Budget(tokens=100, cost=2.5, calls=3, descendants=0, soft=0.5)
    assert msgspec.json.decode(msgspec.json.encode(budget), type=Budget) == budget
    with pytest.raises(msgspec.ValidationError, match="dollars"):
        msgspec.json.decode(b'{"dollars": 5}', type=Budget)


def test_what_is_left_counts_the_used_and_the_reserved_and_never_goes_negative() -> None:
    budget = Budget(tokens=120, cost=1.0, calls=3)
    assert left(budget, CALL, CALL) == Budget(tokens=20, cost=0.0, calls=1)
    assert left(budget, CALL + CALL + CALL, CALL).tokens == 0
    assert left(Budget(), CALL, CALL) == Budget()


def test_a_call_fits_while_used_and_reserved_leave_room_for_it() -> None:
    budget = Budget(calls=2)
    assert first_exceeded(budget, Usage(), Usage(), CALL) is None
    assert first_exceeded(budget, CALL, Usage(), CALL) is None
    assert first_exceeded(budget, CALL, CALL, CALL) == "calls"  # reserved counts
    assert first_exceeded(Budget(tokens=60, calls=9), CALL, Usage(), CALL) == "tokens"


def test_a_zero_budget_refuses_every_call_and_a_spawn_only_by_descendants() -> None:
    assert first_exceeded(Budget(calls=0), Usage(), Usage(), CALL) == "calls"
    assert first_exceeded(Budget(tokens=0), Usage(), Usage(), CALL) == "tokens"
    assert first_exceeded(Budget(tokens=0), Usage(), Usage(), SPAWN) is None
    assert first_exceeded(Budget(descendants=0), Usage(), Usage(), SPAWN) == "descendants"


def test_a_child_budget_only_narrows_what_its_parent_has_left() -> None:
    allowed = Budget(tokens=100, calls=4)
    assert narrow(Budget(tokens=50), allowed) == (Budget(tokens=50, calls=4), True)
    assert narrow(Budget(tokens=50, calls=2), allowed) == (Budget(tokens=50, calls=2), False)
    assert narrow(Budget(tokens=500, calls=2), allowed) == (Budget(tokens=100, calls=2), True)
    assert narrow(None, allowed) == (allowed, False)
    assert narrow(Budget(cost=3.0), None) == (Budget(cost=3.0), False)


def test_the_soft_threshold_is_crossed_once_at_its_fraction() -> None:
    budget = Budget(calls=10, soft=0.8)
    seven, eight = Usage(calls=7), Usage(calls=8)
    assert crossed_soft(budget, seven, eight) == "calls"
    assert crossed_soft(budget, eight, eight + Usage(calls=1)) is None
    assert crossed_soft(budget, Usage(), seven) is None
    assert crossed_soft(Budget(calls=0), Usage(), CALL) is None
