"""Suspend/resume (branches only, cooperative), memory pressure, stuck sessions."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sessiontree.actors import VirtualClock
from sessiontree.protocol import ErrorCode, SessionState
from sessiontree.supervision import Agent, EventKind, Node
from sessiontree.supervision import _periodic as periodic_module
from tests.conftest import WAIT, settle

STARTED = threading.Event()


def idle_main(session: Any) -> None:
    return None


def make_agent(gate: threading.Event) -> Agent:
    def steps(session: Any) -> str:
        for _ in range(3):
            session.sleep(1.0)
        return "three steps"

    async def steps_async(session: Any) -> str:
        for _ in range(3):
            await session.sleep(1.0)
        return "three steps"

    def waits(session: Any) -> str:
        session.sleep(10_000)
        return "done"

    async def waits_async(session: Any) -> str:
        await session.sleep(10_000)
        return "done"

    def blocks(session: Any) -> str:
        session.checkpoint()
        STARTED.set()
        gate.wait(WAIT)  # no checkpoint while "in a model call"
        session.checkpoint()
        return "unblocked"

    return Agent(
        "agent",
        {
            "main": idle_main,
            "steps": steps,
            "steps_async": steps_async,
            "waits": waits,
            "waits_async": waits_async,
            "blocks": blocks,
        },
    )


@pytest.fixture
def gate() -> Any:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def node(make_node: Any, gate: threading.Event) -> Node:
    return make_node(make_agent(gate), grace=5.0, stuck_after=60.0, check_interval=10.0)


@pytest.mark.parametrize("skill", ["steps", "steps_async"])
def test_suspended_branch_parks_releases_its_slot_and_resumes(
    node: Node, clock: VirtualClock, skill: str
) -> None:
    ref = node.main("agent").spawn(kind="branch", skill=skill).ref
    settle(node)
    assert ref.suspend() is None
    clock.advance(1.0)  # the sleep ends; the next checkpoint parks
    settle(node)
    assert ref.state is SessionState.SUSPENDED
    assert node.stats()["slots_in_use"] == 0
    clock.advance(100.0)  # time passes while parked; the skill does not move
    settle(node)
    assert ref.state is SessionState.SUSPENDED
    assert ref.resume() is None
    settle(node)
    assert ref.state is SessionState.ACTIVE
    clock.advance(1.0)
    settle(node)
    clock.advance(1.0)
    assert ref.wait(WAIT).summary == "three steps"


def test_only_branches_suspend(node: Node) -> None:
    main = node.main("agent")
    worker = main.spawn(kind="worker", skill="waits").ref
    for ref in (main, worker):
        error = ref.suspend()
        assert error.code is ErrorCode.INVALID_TRANSITION
        assert "only branches" in error.message
    assert worker.resume().code is ErrorCode.INVALID_TRANSITION


def test_ttl_keeps_counting_while_suspended(node: Node, clock: VirtualClock) -> None:
    ref = node.main("agent").spawn(kind="branch", skill="steps", ttl=30.0).ref
    settle(node)
    ref.suspend()
    clock.advance(1.0)
    settle(node)
    assert ref.state is SessionState.SUSPENDED
    clock.advance(29.0)
    assert ref.wait(WAIT).error.code is ErrorCode.TTL_EXPIRED


@pytest.mark.parametrize("skill", ["steps", "steps_async"])
def test_cancelling_a_suspended_branch_ends_it(node: Node, clock: VirtualClock, skill: str) -> None:
    ref = node.main("agent").spawn(kind="branch", skill=skill).ref
    settle(node)
    ref.suspend()
    clock.advance(1.0)
    settle(node)
    ref.cancel()
    result = ref.wait(WAIT)
    assert result.status is SessionState.CANCELLED
    assert result.error.code is ErrorCode.CANCELLED


@pytest.mark.parametrize("skill", ["waits", "waits_async"])
def test_a_waiting_branch_parks_at_once_and_keeps_waiting_after_resume(
    node: Node, clock: VirtualClock, skill: str
) -> None:
    ref = node.main("agent").spawn(kind="branch", skill=skill, ttl=20_000.0).ref
    settle(node)
    ref.suspend()
    settle(node)
    assert ref.state is SessionState.SUSPENDED
    ref.resume()
    settle(node)
    assert ref.state is SessionState.ACTIVE
    clock.advance(9_999.0)
    settle(node)
    assert ref.state is SessionState.ACTIVE
    clock.advance(1.0)
    assert ref.wait(WAIT).summary == "done"


def test_resume_before_the_skill_parks_withdraws_the_suspension(
    node: Node, gate: threading.Event
) -> None:
    ref = node.main("agent").spawn(kind="branch", skill="blocks").ref
    ref.suspend()
    ref.resume()
    gate.set()
    assert ref.wait(WAIT).summary == "unblocked"


def test_memory_pressure_suspends_the_least_recently_active_branch(
    make_node: Any, clock: VirtualClock, gate: threading.Event
) -> None:
    pressure = threading.Event()
    node = make_node(make_agent(gate), check_interval=1.0, memory_pressure=pressure.is_set)
    main = node.main("agent")
    older = main.spawn(kind="branch", skill="waits").ref
    settle(node)
    clock.advance(0.5)
    newer = main.spawn(kind="branch", skill="waits").ref
    settle(node)
    clock.advance(1.0)
    settle(node)
    assert older.state is SessionState.ACTIVE
    pressure.set()
    clock.advance(1.0)
    settle(node)
    assert older.state is SessionState.SUSPENDED
    assert newer.state is SessionState.ACTIVE
    pressure.clear()
    clock.advance(5.0)
    settle(node)
    assert newer.state is SessionState.ACTIVE


def test_a_skill_without_checkpoints_is_flagged_stuck_never_killed(
    node: Node, clock: VirtualClock, gate: threading.Event
) -> None:
    events: list[Any] = []
    node.subscribe(events.append)
    waiting = node.main("agent").spawn(kind="branch", skill="waits").ref
    settle(node)
    STARTED.clear()
    ref = node.main("agent").spawn(kind="branch", skill="blocks").ref
    assert STARTED.wait(WAIT)
    clock.advance(70.0)
    assert [s.session_id for s in node.stuck()] == [ref.session_id]  # waiting is not stuck
    assert any(e.kind is EventKind.STUCK and e.session_id == ref.session_id for e in events)
    assert ref.state is SessionState.ACTIVE
    gate.set()
    assert ref.wait(WAIT).summary == "unblocked"
    assert waiting.state is SessionState.ACTIVE


def test_the_stuck_check_sweeps_a_large_node_over_several_checks(
    make_node: Any, clock: VirtualClock, gate: threading.Event, monkeypatch: Any
) -> None:
    monkeypatch.setattr(periodic_module, "SWEEP_SLICE", 2)  # a check looks at two sessions
    node = make_node(make_agent(gate), grace=5.0, stuck_after=60.0, check_interval=10.0)
    main = node.main("agent")
    for _ in range(3):
        assert main.spawn(kind="branch", skill="waits").ok
    settle(node)
    STARTED.clear()
    ref = main.spawn(kind="branch", skill="blocks").ref
    assert STARTED.wait(WAIT)
    flagged = []
    for _ in range(9):  # a check every 10 s; node.stuck() waits for each to be done
        clock.advance(10.0)
        flagged.append(len(node.stuck()))
    # stuck from the check at 60 s on, found by one of the three checks it takes
    # to look at all five sessions two at a time
    assert flagged[:5] == [0] * 5
    assert flagged[-1] == 1
    assert [s.session_id for s in node.stuck()] == [ref.session_id]
    gate.set()
    assert ref.wait(WAIT).summary == "unblocked"
