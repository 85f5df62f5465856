"""Every row of the cancellation table (the README's Execution model), for sync and async skills."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.protocol import ErrorCode, SessionState
from sessiontree.supervision import Agent, EventKind
from tests.conftest import WAIT, settle


def idle_main(session: Any) -> None:
    return None


def make_skills(release: threading.Event, caught: threading.Event | None = None) -> dict[str, Any]:
    """The same behaviours as sync and async skills (suffix ``_async``).

    ``ignores_cancel`` sets ``caught`` once it has taken its ``Cancelled``.
    """
    caught = caught or threading.Event()

    def returns(session: Any) -> Any:
        session.checkpoint()
        return {"answer": 42, "task": session.task}

    async def returns_async(session: Any) -> Any:
        await session.checkpoint()
        return {"answer": 42, "task": session.task}

    def crashes(session: Any) -> Any:
        session.checkpoint()
        raise ValueError("model refused")

    async def crashes_async(session: Any) -> Any:
        await session.checkpoint()
        raise ValueError("model refused")

    def reports_then_waits(session: Any) -> Any:
        session.progress("half way", pct=50)
        session.sleep(10_000)
        return "never"

    async def reports_then_waits_async(session: Any) -> Any:
        await session.progress("half way", pct=50)
        await session.sleep(10_000)
        return "never"

    def wraps_up(session: Any) -> Any:
        try:
            session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "finished"

    async def wraps_up_async(session: Any) -> Any:
        try:
            await session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "finished"

    def ignores_cancel(session: Any) -> Any:
        try:
            session.sleep(10_000)
        except Cancelled:
            caught.set()
            release.wait(WAIT)  # keeps "working" past any grace
        return "too late"

    async def ignores_cancel_async(session: Any) -> Any:
        try:
            await session.sleep(10_000)
        except Cancelled:
            caught.set()
            await asyncio.sleep(WAIT)
        return "too late"

    def spawns_wrapper_and_returns(session: Any) -> Any:
        session.spawn(kind="branch", skill="wraps_up", task="child")
        return "parent done"

    async def spawns_wrapper_and_returns_async(session: Any) -> Any:
        await session.spawn(kind="branch", skill="wraps_up_async", task="child")
        return "parent done"

    return {k: v for k, v in locals().items() if callable(v) and k not in ("release", "caught")}


@pytest.fixture
def node(make_node: Any, release: threading.Event, caught: threading.Event) -> Any:
    agent = Agent("agent", {"main": idle_main, **make_skills(release, caught)})
    return make_node(agent, grace=30.0)


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "sync" else "_async"


def spawn(node: Any, skill: str, **fields: Any) -> Any:
    main = node.main("agent")
    spawned = node.spawn(main, kind="branch", skill=skill, task=skill, **fields)
    assert spawned.ok, spawned.error
    return spawned.ref


def test_skill_that_returns_completes_with_its_value(node: Any, flavour: str) -> None:
    ref = spawn(node, "returns" + flavour)
    result = ref.wait(WAIT)
    assert result.status is SessionState.COMPLETED
    assert result.error is None
    assert result.artifacts == {"answer": 42, "task": "returns" + flavour}
    assert ref.state is SessionState.COMPLETED


def test_skill_that_raises_fails_as_crashed_with_traceback(node: Any, flavour: str) -> None:
    ref = spawn(node, "crashes" + flavour)
    result = ref.wait(WAIT)
    assert result.status is SessionState.FAILED
    assert result.error.code is ErrorCode.CRASHED
    assert result.error.detail["type"] == "builtins.ValueError"
    assert result.error.detail["message"] == "model refused"
    assert "raise ValueError" in result.error.detail["traceback"]


def test_ttl_expiry_is_final_at_once_and_keeps_reported_progress(
    node: Any, clock: VirtualClock, flavour: str
) -> None:
    ref = spawn(node, "reports_then_waits" + flavour, ttl=60.0)
    settle(node)
    clock.advance(59.9)
    settle(node)
    assert ref.state is SessionState.ACTIVE
    clock.advance(0.1)
    result = ref.wait(WAIT)
    assert result.status is SessionState.EXPIRED
    assert result.error.code is ErrorCode.TTL_EXPIRED
    assert result.summary == "half way"
    assert result.artifacts == {"progress": {"pct": 50}}
    settle(node)
    assert node.stats()["zombies"] == 0  # the fenced skill got Cancelled and left


def test_explicit_cancel_wrapped_up_in_grace_is_cancelled_with_partial(
    node: Any, flavour: str
) -> None:
    ref = spawn(node, "wraps_up" + flavour)
    settle(node)
    assert ref.cancel() is None
    result = ref.wait(WAIT)
    assert result.status is SessionState.CANCELLED
    assert result.error.code is ErrorCode.CANCELLED
    assert result.summary == "partial"


def test_parent_ending_cancels_child_which_wraps_up_as_parent_terminated(
    node: Any, flavour: str
) -> None:
    parent = spawn(node, "spawns_wrapper_and_returns" + flavour)
    assert parent.wait(WAIT).status is SessionState.COMPLETED
    settle(node)
    (child,) = node.tree(parent)["children"]
    result = node.wait(child["info"].session_id, WAIT)
    assert result.status is SessionState.CANCELLED
    assert result.error.code is ErrorCode.PARENT_TERMINATED
    assert result.summary == "partial"
    # the parent was already terminal, so the result is filed on its record
    assert [r.session_id for r in parent.results()] == [result.session_id]


def test_skill_still_running_at_the_deadline_is_terminated_by_force(
    node: Any,
    clock: VirtualClock,
    flavour: str,
    release: threading.Event,
    caught: threading.Event,
) -> None:
    ref = spawn(node, "ignores_cancel" + flavour)
    settle(node)
    ref.cancel()
    # the skill takes its Cancelled in grace; were the deadline first, that
    # checkpoint itself would be refused as fenced
    assert caught.wait(WAIT)
    clock.advance(29.0)
    assert ref.result() is None  # still in grace
    clock.advance(1.0)
    result = ref.wait(WAIT)
    assert result.status is SessionState.CANCELLED
    assert result.error.code is ErrorCode.TERMINATED_BY_FORCE
    assert result.summary == ""
    if flavour == "":
        assert node.stats()["zombies"] == 1  # a thread cannot be killed: it is fenced
        release.set()
        settle(node)
        stats = node.stats()
        assert stats["zombies"] == 0
        assert stats["refused_after_fence"] == 1  # its late "too late" was refused
    assert ref.wait(WAIT).summary == ""


def test_cancel_after_the_skill_returned_changes_nothing(node: Any) -> None:
    ref = spawn(node, "returns")
    assert ref.wait(WAIT).status is SessionState.COMPLETED
    error = ref.cancel()
    assert error is not None
    assert error.code is ErrorCode.INVALID_TRANSITION
    assert ref.wait(WAIT).status is SessionState.COMPLETED


def test_one_cancel_request_fixes_one_deadline_for_the_whole_subtree(
    make_node: Any, clock: VirtualClock, release: threading.Event
) -> None:
    def stubborn(session: Any) -> Any:
        if session.depth < 3:
            session.spawn(kind="branch", task="deeper", skill="stubborn")
        try:
            session.sleep(10_000)
        except Cancelled:
            release.wait(WAIT)
        return "late"

    node = make_node(Agent("agent", {"main": idle_main, "stubborn": stubborn}), grace=10.0)
    top = node.spawn(node.main("agent"), kind="branch", skill="stubborn").ref
    settle(node)
    subtree = [top.session_id]
    level = node.tree(top)
    while level["children"]:
        level = level["children"][0]
        subtree.append(level["info"].session_id)
    assert len(subtree) == 3
    top.cancel()  # the skills catch Cancelled and keep running: no settle from here
    clock.advance(5.0)
    top.cancel()  # a second request must not move the deadline
    clock.advance(4.9)
    assert all(node.get(s).state is SessionState.ACTIVE for s in subtree)
    clock.advance(0.1)
    codes = [node.wait(s, WAIT).error.code for s in subtree]
    assert codes == [
        ErrorCode.TERMINATED_BY_FORCE,
        ErrorCode.TERMINATED_BY_FORCE,
        ErrorCode.TERMINATED_BY_FORCE,
    ]
    release.set()


def test_parent_result_goes_up_before_its_children_are_cleaned_up(node: Any, flavour: str) -> None:
    events: list[Any] = []
    node.subscribe(events.append)
    parent = spawn(node, "spawns_wrapper_and_returns" + flavour)
    parent.wait(WAIT)
    settle(node)
    mine = [
        (e.kind, e.session_id)
        for e in events
        if e.kind in (EventKind.RESULT_DELIVERED, EventKind.CANCEL_REQUESTED)
    ]
    first_delivery = mine.index((EventKind.RESULT_DELIVERED, parent.session_id))
    child_cancel = next(i for i, (k, _) in enumerate(mine) if k is EventKind.CANCEL_REQUESTED)
    assert first_delivery < child_cancel


def test_grace_zero_terminates_at_once(make_node: Any, release: threading.Event) -> None:
    node = make_node(Agent("agent", {"main": idle_main, **make_skills(release)}), grace=0.0)
    ref = node.spawn(node.main("agent"), kind="branch", skill="ignores_cancel").ref
    settle(node)
    ref.cancel()
    result = ref.wait(WAIT)
    assert result.error.code is ErrorCode.TERMINATED_BY_FORCE
    release.set()


def test_everything_a_fenced_skill_does_later_is_refused_and_counted(
    make_node: Any, clock: VirtualClock
) -> None:
    forced = threading.Event()
    caught = threading.Event()
    attempts: list[str] = []

    def stubborn(session: Any) -> Any:
        try:
            session.sleep(10_000)
        except Cancelled:
            caught.set()
            forced.wait(WAIT)  # past the deadline now: the session is fenced
        for call in (
            lambda: session.spawn(kind="worker"),
            lambda: session.memory_put("k", 1),
            lambda: session.progress("still here"),
        ):
            try:
                call()
            except Cancelled as exc:
                attempts.append(exc.code.value)
        return "too late"

    node = make_node(Agent("agent", {"main": idle_main, "stubborn": stubborn}), grace=1.0)
    ref = node.main("agent").spawn(kind="branch", skill="stubborn").ref
    settle(node)
    ref.cancel()
    assert caught.wait(WAIT)
    clock.advance(1.0)
    assert ref.wait(WAIT).error.code is ErrorCode.TERMINATED_BY_FORCE
    forced.set()
    settle(node)
    assert attempts == ["terminated_by_force"] * 3
    stats = node.stats()
    assert stats["refused_after_fence"] == 4  # three calls and the late result
    assert stats["zombies"] == 0
    assert len(node.tree(ref)["children"]) == 0
