"""Holding no actor when none is needed (the scale issue): idle Mains are
passivated to the store and come back on their next message; suspended
branches park without an actor. A real LMDB store in tmp_path, the virtual
clock for idleness and ticks."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from sessiontree.actors import VirtualClock
from sessiontree.protocol import ErrorCode, SessionKind, SessionState
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig
from sessiontree.supervision._requests import GetActorRef
from tests.conftest import WAIT, settle
from tests.test_persistence import MainLog

IDLE = 60.0  # passivate_after in these tests
TICK = 5.0  # check_interval


def parks(session: Any) -> str:
    session.checkpoint()
    session.sleep(100)
    return "done"


async def parks_async(session: Any) -> str:
    await session.sleep(100)
    return "done"


def quick(session: Any) -> str:
    return "ok"


@pytest.fixture
def log() -> MainLog:
    return MainLog()


@pytest.fixture
def open_node(clock: VirtualClock, tmp_path: pathlib.Path, log: MainLog) -> Iterator[Any]:
    nodes: list[Node] = []

    def open_(*, store: bool = True, **config: Any) -> Node:
        agent = Agent(
            "agent",
            {"main": log, "parks": parks, "parks_async": parks_async, "quick": quick},
            main_skill="main",
            ttls=config.pop("ttls", {}),
        )
        settings = {"passivate_after": IDLE, "check_interval": TICK, "grace": 1.0, **config}
        node = Node(
            [agent],
            NodeConfig(**settings),
            clock=clock,
            store=tmp_path / "store" if store else None,
        )
        nodes.append(node)
        return node

    yield open_
    for node in nodes:
        node.shutdown(grace=0, timeout=5.0)


def idle_for(node: Node, clock: VirtualClock, seconds: float) -> None:
    """Let ``seconds`` of virtual time pass tick by tick, settling after each."""
    settle(node)
    for _ in range(int(seconds // TICK) + 1):
        clock.advance(TICK)
        settle(node)


def actor_of(node: Node, session: Any) -> Any:
    """The session's actor ref, None while it holds none (a diagnostic: never
    brings a passivated Main back)."""
    sid = getattr(session, "session_id", session)
    return node._call(GetActorRef(sid))


def events_of(node: Node, kind: EventKind) -> list[Event]:
    seen: list[Event] = []
    node.subscribe(lambda e: e.kind is kind and seen.append(e))  # type: ignore[func-returns-value]
    return seen


# -- idle Mains ---------------------------------------------------------------------


def test_an_idle_main_is_written_out_and_holds_no_actor(open_node: Any, clock: Any) -> None:
    node = open_node()
    passivated = events_of(node, EventKind.PASSIVATED)
    main = node.main("agent", "telegram:dm:42")
    main.send("hello")
    idle_for(node, clock, IDLE)
    assert [e.session_id for e in passivated] == [main.session_id]
    assert actor_of(node, main) is None
    stats = node.stats()
    assert stats["dormant_sessions"] == 1
    assert stats["passivated"] == 1
    # still listed, and still the one Main of its key
    listed = node.sessions(kind=SessionKind.MAIN)
    assert [(i.session_id, i.state) for i in listed] == [(main.session_id, SessionState.ACTIVE)]
    assert node.main("agent", "telegram:dm:42").session_id == main.session_id
    assert node.get(main).key == "telegram:dm:42"


def test_the_next_message_brings_a_passivated_main_back_with_its_context(
    open_node: Any, clock: Any, log: MainLog
) -> None:
    node = open_node()
    main = node.main("agent")
    main.send("one")
    idle_for(node, clock, IDLE)
    assert actor_of(node, main) is None
    assert main.send("two") is None
    settle(node)
    assert actor_of(node, main) is not None
    assert [(m, ctx) for m, _, ctx in log.cycles] == [("one", []), ("two", ["one"])]
    assert node.stats()["reactivated"] == 1
    # and it is passivated again once idle, and back again, messages in order
    idle_for(node, clock, IDLE)
    main.send("three")
    settle(node)
    assert [m for m, _, _ in log.cycles] == ["one", "two", "three"]
    assert node.stats()["passivated"] == 2


def test_a_reactivated_main_keeps_its_inbox_numbers_across_a_restart(
    open_node: Any, clock: Any, log: MainLog
) -> None:
    node = open_node()
    main = node.main("agent")
    main.send("one")
    idle_for(node, clock, IDLE)
    main.send("two")
    settle(node)
    node.shutdown(timeout=WAIT)
    again = open_node()
    assert again.main("agent").session_id == main.session_id
    again.send(main, "three")
    settle(again)
    assert [m for m, _, _ in log.cycles] == ["one", "two", "three"]


def test_a_main_that_got_a_message_lately_is_not_passivated(open_node: Any, clock: Any) -> None:
    node = open_node()
    main = node.main("agent")
    for _ in range(4):
        idle_for(node, clock, IDLE / 2)
        main.send("still here")
    settle(node)
    assert actor_of(node, main) is not None
    assert node.stats().get("passivated", 0) == 0


def test_a_main_with_live_children_is_not_passivated(open_node: Any, clock: Any) -> None:
    node = open_node()
    main = node.main("agent")
    child = main.spawn(kind="branch", skill="parks_async").ref
    idle_for(node, clock, IDLE)
    assert actor_of(node, main) is not None
    assert node.get(child).state is SessionState.ACTIVE


def test_without_a_store_nothing_is_passivated(open_node: Any, clock: Any) -> None:
    node = open_node(store=False)
    main = node.main("agent")
    idle_for(node, clock, IDLE)
    assert actor_of(node, main) is not None
    assert node.stats()["dormant_sessions"] == 0


def test_passivation_can_be_turned_off(open_node: Any, clock: Any) -> None:
    node = open_node(passivate_after=None)
    main = node.main("agent")
    idle_for(node, clock, IDLE * 2)
    assert actor_of(node, main) is not None


def test_a_passivated_main_still_expires_at_its_ttl(open_node: Any, clock: Any) -> None:
    node = open_node(ttls={SessionKind.MAIN: IDLE * 3})
    main = node.main("agent")
    idle_for(node, clock, IDLE)
    assert actor_of(node, main) is None
    idle_for(node, clock, IDLE * 2)
    result = main.wait(timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.EXPIRED
    assert result.error is not None
    assert result.error.code is ErrorCode.TTL_EXPIRED


def test_a_passivated_main_can_be_cancelled(open_node: Any, clock: Any) -> None:
    node = open_node()
    main = node.main("agent")
    idle_for(node, clock, IDLE)
    assert main.cancel() is None
    result = main.wait(timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.CANCELLED


def test_results_of_a_passivated_main_are_still_listed(open_node: Any, clock: Any) -> None:
    node = open_node()
    main = node.main("agent")
    assert node.run(main, kind="worker", skill="quick", timeout=WAIT).ok
    idle_for(node, clock, IDLE)
    assert actor_of(node, main) is None
    assert [r.summary for r in main.results()] == ["ok"]


def test_the_store_lists_a_passivated_main_as_active(open_node: Any, clock: Any) -> None:
    node = open_node()
    main = node.main("agent")
    idle_for(node, clock, IDLE)
    assert node.store is not None
    node.store.flush()
    record = node.store.session(main.session_id)
    assert record is not None
    assert record.info.state is SessionState.ACTIVE


def test_a_message_racing_the_passivation_is_never_lost(
    open_node: Any, clock: Any, log: MainLog
) -> None:
    node = open_node()
    main = node.main("agent")
    for i in range(30):  # messages land between the ask and the answer, or not
        idle_for(node, clock, IDLE - TICK)
        clock.advance(TICK)
        main.send(f"m{i}")
    settle(node)
    assert [m for m, _, _ in log.cycles] == [f"m{i}" for i in range(30)]


# -- suspended branches -------------------------------------------------------------


@pytest.mark.parametrize("skill", ["parks", "parks_async"])
def test_a_branch_holds_no_actor_and_suspends_and_resumes(
    open_node: Any, clock: Any, skill: str
) -> None:
    node = open_node(passivate_after=None)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill=skill).ref
    settle(node)
    assert actor_of(node, branch) is None  # the Cortex starts and steers it
    assert branch.suspend() is None
    settle(node)
    assert node.get(branch).state is SessionState.SUSPENDED
    assert actor_of(node, branch) is None
    assert branch.resume() is None
    clock.advance(101)
    result = branch.wait(timeout=WAIT)
    assert result is not None
    assert result.summary == "done"


def test_a_suspended_branch_without_an_actor_can_be_cancelled(open_node: Any, clock: Any) -> None:
    node = open_node(passivate_after=None)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="parks_async").ref
    settle(node)
    branch.suspend()
    settle(node)
    assert actor_of(node, branch) is None
    assert branch.cancel() is None
    result = branch.wait(timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.CANCELLED


def test_a_branch_restored_suspended_runs_again_without_an_actor(
    open_node: Any, clock: Any
) -> None:
    node = open_node(passivate_after=None)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="parks").ref
    settle(node)
    branch.suspend()
    settle(node)
    node.shutdown(timeout=WAIT)
    again = open_node(passivate_after=None)
    assert again.get(branch.session_id).state is SessionState.SUSPENDED
    assert actor_of(again, branch.session_id) is None
    assert again.resume(branch.session_id) is None
    settle(again)
    assert again.get(branch.session_id).state is SessionState.ACTIVE
    assert actor_of(again, branch.session_id) is None
    clock.advance(101)
    result = again.wait(branch.session_id, timeout=WAIT)
    assert result is not None
    assert result.summary == "done"
