"""A cancel's own grace and force termination (``Node.cancel(sid, grace=…)``,
``Node.terminate``), on the virtual clock: the README's cancellation table holds, one
request fixes one deadline, a later one may bring it closer, never later."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.protocol import ErrorCode, RejectedInputError, SessionState
from sessiontree.supervision import Agent
from tests.conftest import WAIT, settle

pytestmark = pytest.mark.timeout(60)


def idle_main(session: Any) -> None:
    return None


@pytest.fixture
def release() -> threading.Event:
    return threading.Event()


@pytest.fixture
def node(make_node: Any, release: threading.Event) -> Any:
    def stubborn(session: Any) -> Any:
        """Spawns one branch below it (down to depth 2), then ignores Cancelled."""
        if session.depth < 2:
            session.spawn(kind="branch", task="deeper", skill="stubborn")
        try:
            session.sleep(10_000)
        except Cancelled:
            release.wait(WAIT)
        return "late"

    def wraps_up(session: Any) -> Any:
        try:
            session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "finished"

    agent = Agent("agent", {"main": idle_main, "stubborn": stubborn, "wraps_up": wraps_up})
    running = make_node(agent, grace=30.0)
    yield running
    release.set()


def subtree_of(node: Any, skill: str) -> list[Any]:
    top = node.spawn(node.main("agent"), kind="branch", skill=skill).ref
    settle(node)
    ids = [top.session_id]
    level = node.tree(top)
    while level["children"]:
        level = level["children"][0]
        ids.append(level["info"].session_id)
    return ids


def codes(node: Any, ids: list[Any]) -> list[ErrorCode]:
    return [node.wait(s, WAIT).error.code for s in ids]


def test_terminate_ends_the_whole_subtree_at_once_by_force(node: Any) -> None:
    subtree = subtree_of(node, "stubborn")
    assert len(subtree) == 2
    assert node.terminate(subtree[0]) is None  # no clock advance: no grace at all
    assert codes(node, subtree) == [ErrorCode.TERMINATED_BY_FORCE] * 2
    assert all(node.get(s).state is SessionState.CANCELLED for s in subtree)


def test_a_cancel_with_its_own_grace_uses_it_not_the_nodes(node: Any, clock: VirtualClock) -> None:
    subtree = subtree_of(node, "stubborn")
    assert node.cancel(subtree[0], grace=2.0) is None
    clock.advance(1.9)
    assert all(node.get(s).state is SessionState.ACTIVE for s in subtree)
    clock.advance(0.1)
    assert codes(node, subtree) == [ErrorCode.TERMINATED_BY_FORCE] * 2


def test_a_skill_wrapping_up_within_its_grace_is_cancelled_with_its_partial(node: Any) -> None:
    ref = node.spawn(node.main("agent"), kind="branch", skill="wraps_up").ref
    settle(node)
    assert ref.cancel(grace=5.0) is None
    result = ref.wait(WAIT)
    assert result.status is SessionState.CANCELLED
    assert result.error.code is ErrorCode.CANCELLED
    assert result.summary == "partial"


def test_a_second_cancel_with_a_shorter_grace_brings_the_deadline_closer(
    node: Any, clock: VirtualClock
) -> None:
    subtree = subtree_of(node, "stubborn")
    node.cancel(subtree[0])  # the node's 30 s
    clock.advance(5.0)
    node.cancel(subtree[0], grace=3.0)  # deadline now at 8 s, not 30 s
    clock.advance(2.9)
    assert all(node.get(s).state is SessionState.ACTIVE for s in subtree)
    clock.advance(0.1)
    assert codes(node, subtree) == [ErrorCode.TERMINATED_BY_FORCE] * 2


def test_a_second_cancel_with_a_longer_grace_never_pushes_the_deadline_back(
    node: Any, clock: VirtualClock
) -> None:
    subtree = subtree_of(node, "stubborn")
    node.cancel(subtree[0], grace=4.0)
    clock.advance(1.0)
    node.cancel(subtree[0], grace=100.0)
    clock.advance(3.0)
    assert codes(node, subtree) == [ErrorCode.TERMINATED_BY_FORCE] * 2


def test_terminate_after_a_cancel_ends_what_still_runs_at_once(
    node: Any, clock: VirtualClock
) -> None:
    subtree = subtree_of(node, "stubborn")
    node.cancel(subtree[0])
    clock.advance(1.0)
    assert node.terminate(subtree[1]) is None  # only the child's deadline moves
    assert node.wait(subtree[1], WAIT).error.code is ErrorCode.TERMINATED_BY_FORCE
    assert node.get(subtree[0]).state is SessionState.ACTIVE
    clock.advance(29.0)
    assert node.wait(subtree[0], WAIT).error.code is ErrorCode.TERMINATED_BY_FORCE


def test_terminating_a_session_that_ended_is_an_invalid_transition(node: Any) -> None:
    subtree = subtree_of(node, "stubborn")
    node.terminate(subtree[0])
    node.wait(subtree[0], WAIT)
    error = node.terminate(subtree[0])
    assert error is not None
    assert error.code is ErrorCode.INVALID_TRANSITION


@pytest.mark.parametrize("grace", [-1.0, math.inf, math.nan, "5", True])
def test_a_bad_grace_is_refused_naming_grace(node: Any, grace: Any) -> None:
    ref = node.spawn(node.main("agent"), kind="branch", skill="wraps_up").ref
    with pytest.raises(RejectedInputError, match="grace") as raised:
        node.cancel(ref, grace=grace)
    assert raised.value.field == "grace"
    with pytest.raises(RejectedInputError, match="grace"):
        ref.cancel(grace=grace)
    assert node.get(ref).state is not SessionState.CANCELLED


def test_the_awaitable_twins_take_a_grace_and_terminate(node: Any, clock: VirtualClock) -> None:
    first, second = subtree_of(node, "wraps_up"), subtree_of(node, "stubborn")

    async def drive() -> None:
        ref = node.ref(first[0])
        assert await ref.acancel(grace=1.0) is None
        assert await node.aterminate(second[0]) is None
        assert await node.aget(second[0]) is not None

    asyncio.run(drive())
    assert node.wait(first[0], WAIT).error.code is ErrorCode.CANCELLED
    assert codes(node, second) == [ErrorCode.TERMINATED_BY_FORCE] * 2
