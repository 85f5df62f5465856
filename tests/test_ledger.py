"""Budgets and usage kept in the tree, driven through the Cortex's typed requests
(the model calls of issue 20 will make the same ``Reserve`` and ``Settle``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from sessiontree.actors import AsyncSession, VirtualClock
from sessiontree.protocol import (
    Budget,
    ErrorCode,
    ErrorInfo,
    RejectedInputError,
    SessionKind,
    SessionState,
    Usage,
)
from sessiontree.supervision import Agent, Event, EventKind, Node, SessionRef
from sessiontree.supervision._config import Price
from sessiontree.supervision._ledger import Reserve, Reserved, Settle
from tests.conftest import WAIT, settle

REPLY = Usage(prompt_tokens=30, completion_tokens=12, calls=1)


async def waits(session: AsyncSession) -> str:
    """A session that holds still (at a checkpoint) until cancelled."""
    await session.sleep(3600)
    return "woke"


async def lead(session: AsyncSession) -> None:
    return None


@pytest.fixture
def node(make_node: Callable[..., Node]) -> Node:
    return make_node(Agent("agent", {"lead": lead, "waits": waits}, main_skill="lead"), grace=5.0)


def reserve(
    node: Node, sid: uuid.UUID, prompt: int = 30, most: int | None = 20, price: Price | None = None
) -> Reserved | ErrorInfo:
    return node._call(Reserve(sid, prompt, most, price))


def branch(node: Node, budget: Budget | None = None) -> SessionRef:
    spawned = node.main("agent").spawn(kind="branch", skill="waits", budget=budget)
    assert spawned.ref is not None, spawned.error
    return spawned.ref


def workers(parent: SessionRef, n: int) -> list[SessionRef]:
    refs = []
    for _ in range(n):
        spawned = parent.spawn(kind="worker", skill="waits")
        assert spawned.ref is not None, spawned.error
        refs.append(spawned.ref)
    return refs


def test_a_fan_out_of_eight_under_a_budget_of_five_calls_gets_exactly_five(node: Node) -> None:
    parent = branch(node, Budget(calls=5))
    children = workers(parent, 8)
    settle(node)
    answers = [reserve(node, child.session_id) for child in children]
    granted = [a for a in answers if isinstance(a, Reserved)]
    refused = [a for a in answers if isinstance(a, ErrorInfo)]
    assert len(granted) == 5
    assert [r.code for r in refused] == [ErrorCode.BUDGET_EXHAUSTED] * 3
    assert refused[0].detail == {"dimension": "calls", "session_id": str(parent.session_id)}


def test_the_hard_limit_cancels_the_bounded_subtree_with_budget_exhausted(node: Node) -> None:
    parent = branch(node, Budget(calls=1))
    first, second = workers(parent, 2)
    settle(node)
    held = reserve(node, first.session_id)
    assert isinstance(held, Reserved)
    node._call(Settle(held, REPLY))
    refused = reserve(node, second.session_id)
    assert isinstance(refused, ErrorInfo)
    assert refused.code is ErrorCode.BUDGET_EXHAUSTED
    for ref in (parent, first, second):
        result = ref.wait(WAIT)
        assert result is not None
        assert result.status is SessionState.CANCELLED
        assert result.error is not None
        assert result.error.code is ErrorCode.BUDGET_EXHAUSTED, ref
    # the spend rolled up once: the worker's own, the branch's subtree
    assert first.result().usage == REPLY
    assert parent.result().subtree_usage == REPLY + Usage(descendants=2)


def test_usage_rolls_up_exactly_once_through_every_ancestor(node: Node) -> None:
    parent = branch(node)
    children = workers(parent, 3)
    settle(node)
    for child in children:
        held = reserve(node, child.session_id)
        assert isinstance(held, Reserved)
        node._call(Settle(held, REPLY))
    parent.cancel()
    result = parent.wait(WAIT)
    assert result is not None
    assert result.usage == Usage()  # it called nothing itself
    assert result.subtree_usage == REPLY + REPLY + REPLY
    assert [c.wait(WAIT).usage for c in children] == [REPLY] * 3


def test_a_child_budget_only_narrows_what_its_parent_has_left(node: Node) -> None:
    parent = branch(node, Budget(tokens=1000, calls=4))
    wide = parent.spawn(kind="worker", skill="waits", budget=Budget(tokens=5000))
    assert wide.ref is not None
    assert wide.clamped
    assert wide.ref.info().budget == Budget(tokens=1000, calls=4)
    narrow = parent.spawn(kind="worker", skill="waits", budget=Budget(tokens=10, calls=1))
    assert narrow.ref is not None
    assert not narrow.clamped
    assert narrow.ref.info().budget == Budget(tokens=10, calls=1)
    silent = parent.spawn(kind="worker", skill="waits")
    assert silent.ref is not None
    assert silent.ref.info().budget == Budget(tokens=1000, calls=4)  # what is left


def test_a_descendants_budget_stops_runaway_spawning(node: Node) -> None:
    parent = branch(node, Budget(descendants=2))
    ok = [parent.spawn(kind="worker", skill="waits") for _ in range(2)]
    assert all(s.ok for s in ok)
    third = parent.spawn(kind="worker", skill="waits")
    assert third.error is not None
    assert third.error.code is ErrorCode.BUDGET_EXHAUSTED
    assert third.error.detail["dimension"] == "descendants"
    result = parent.wait(WAIT)
    assert result is not None
    assert result.error is not None
    assert result.error.code is ErrorCode.BUDGET_EXHAUSTED


def test_max_tokens_is_capped_to_what_every_bounded_ancestor_leaves(node: Node) -> None:
    parent = branch(node, Budget(tokens=100))
    (child,) = workers(parent, 1)
    settle(node)
    held = reserve(node, child.session_id, prompt=30, most=None)
    assert isinstance(held, Reserved)
    assert held.max_tokens == 70
    again = reserve(node, child.session_id, prompt=30, most=500)
    assert isinstance(again, ErrorInfo)  # the first still holds its 100
    assert again.code is ErrorCode.BUDGET_EXHAUSTED


def test_a_zero_budget_refuses_every_call(node: Node) -> None:
    parent = branch(node, Budget(calls=0))
    refused = reserve(node, parent.session_id)
    assert isinstance(refused, ErrorInfo)
    assert refused.code is ErrorCode.BUDGET_EXHAUSTED


def test_a_cost_budget_needs_a_price(node: Node) -> None:
    parent = branch(node, Budget(cost=1.0))
    unpriced = reserve(node, parent.session_id, price=None)
    assert isinstance(unpriced, ErrorInfo)
    assert unpriced.code is ErrorCode.BUDGET_UNENFORCEABLE
    assert unpriced.detail["field"] == "budget.cost"
    priced = reserve(node, parent.session_id, prompt=100, most=None, price=Price(0.001, 0.002))
    assert isinstance(priced, Reserved)
    assert priced.max_tokens == 450  # (1.0 - 100 * 0.001) / 0.002
    assert priced.ask.cost == pytest.approx(1.0)


def test_the_soft_threshold_is_announced_once(node: Node) -> None:
    seen: list[Event] = []
    node.subscribe(lambda e: seen.append(e) if e.kind is EventKind.BUDGET_WARNING else None)
    parent = branch(node, Budget(calls=5, soft=0.6))
    for _ in range(4):
        held = reserve(node, parent.session_id)
        assert isinstance(held, Reserved)
        node._call(Settle(held, REPLY))
    settle(node)
    assert [(e.session_id, e.data["dimension"]) for e in seen] == [(parent.session_id, "calls")]
    assert node.stats()["budget_warnings"] == 1


def test_a_call_of_a_session_that_is_stopping_is_refused(node: Node) -> None:
    parent = branch(node)
    parent.cancel()
    refused = reserve(node, parent.session_id)
    assert isinstance(refused, ErrorInfo)
    assert refused.code is ErrorCode.SESSION_NOT_ACTIVE


def test_an_agent_budget_is_each_sessions_default(
    make_node: Callable[..., Node], clock: VirtualClock
) -> None:
    agent = Agent(
        "agent", {"lead": lead, "waits": waits}, main_skill="lead", budget=Budget(calls=2)
    )
    node = make_node(agent)
    child = node.main("agent").spawn(kind="branch", skill="waits")
    assert child.ref is not None
    assert child.ref.info().budget == Budget(calls=2)
    assert node.main("agent").info().budget == Budget(calls=2)


@pytest.mark.parametrize("bad", [{"tokens": -1}, {"cost": float("nan")}, {"calls": -2}])
def test_an_agent_with_a_bad_budget_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(RejectedInputError) as refused:  # by the Budget, as it is built
        Agent("agent", {"s": lead}, budget=Budget(**bad))
    assert refused.value.field == f"budget.{next(iter(bad))}"


def test_a_spawn_under_a_worker_kind_is_still_refused_before_budgets(node: Node) -> None:
    parent = branch(node, Budget(descendants=0))
    (child,) = [parent.spawn(kind="worker", skill="waits")]
    assert child.error is not None
    assert child.error.code is ErrorCode.BUDGET_EXHAUSTED
    assert parent.info().kind is SessionKind.BRANCH
