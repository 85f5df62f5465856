"""The embedded API: mains and message cycles, results, shared memory, async twins, events."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sessiontree.actors import Session
from sessiontree.protocol import (
    ErrorCode,
    NodeClosedError,
    NotAllowedError,
    Outcome,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.supervision import Agent, EventKind, Node
from tests.conftest import WAIT, settle

SEEN: list[Any] = []


def main_skill(session: Session) -> None:
    SEEN.append((session.cycle, session.message))
    if session.message == "research":
        session.spawn(kind="branch", skill="researcher", task="find facts")
    elif session.message == "research and wait":
        child = session.spawn(kind="worker", skill="writer", task="draft")
        SEEN.append(("waited", session.wait(child.session_id).summary))


def researcher(session: Session) -> Outcome:
    memory_id = session.memory_put("facts", ["sky is blue"])
    worker = session.spawn(kind="worker", skill="reader", task="read facts")
    result = session.wait(worker.session_id)
    return Outcome(summary=result.summary, memory_ids=(memory_id,))


def reader(session: Session) -> str:
    facts = session.memory_get("facts")
    try:
        session.memory_put("notes", "workers never write")
    except NotAllowedError as exc:
        return f"read {len(facts)} fact(s); {exc}"
    return "wrote memory"


def writer(session: Session) -> str:
    return "draft v1"


def bad_return(session: Session) -> Any:
    return 42


def unjsonable(session: Session) -> Any:
    return {"when": object()}


async def async_branch(session: Any) -> str:
    child = await session.spawn(kind="worker", skill="writer")
    result = await session.wait(child.session_id)
    return f"async got {result.summary}"


AGENT = Agent(
    "agent",
    {
        "main": main_skill,
        "researcher": researcher,
        "reader": reader,
        "writer": writer,
        "bad_return": bad_return,
        "unjsonable": unjsonable,
        "async_branch": async_branch,
    },
)


@pytest.fixture
def node(make_node: Any) -> Node:
    SEEN.clear()
    return make_node(AGENT)


def test_one_main_per_agent_and_key(node: Node) -> None:
    first = node.main("agent", "telegram:dm:42")
    assert node.main("agent", "telegram:dm:42") == first
    assert node.main("agent", "discord:channel:987") != first
    info = first.info()
    assert info.kind is SessionKind.MAIN
    assert info.depth == 0
    assert info.parent_id is None
    assert info.key == "telegram:dm:42"


@pytest.mark.parametrize("key", ["", "telegram", "Telegram:dm:1", "telegram:dm:has space"])
def test_malformed_session_keys_are_rejected(node: Node, key: str) -> None:
    with pytest.raises(RejectedInputError):
        node.main("agent", key)


def test_unknown_agent_is_rejected_by_name(node: Node) -> None:
    with pytest.raises(RejectedInputError, match="nobody"):
        node.main("nobody")


def test_a_main_runs_one_cycle_per_message_and_one_per_child_result(node: Node) -> None:
    main = node.main("agent")
    main.send("hello")
    main.send("research")
    settle(node)
    assert [c for c, _ in SEEN] == [1, 2, 3]
    assert SEEN[0] == (1, "hello")
    _cycle, message = SEEN[2]
    assert isinstance(message, SessionResult)
    assert message.status is SessionState.COMPLETED
    assert message.summary.startswith("read 1 fact(s); worker session")
    assert len(message.memory_ids) == 1
    assert node.memory.by_id(message.memory_ids[0]) == ["sky is blue"]
    assert main.state is SessionState.ACTIVE
    assert [r.session_id for r in main.results()] == [message.session_id]


def test_a_result_a_cycle_waited_for_does_not_start_another_cycle(node: Node) -> None:
    main = node.main("agent")
    main.send("research and wait")
    settle(node)
    assert SEEN == [(1, "research and wait"), ("waited", "draft v1")]
    assert len(main.results()) == 1


def test_async_skills_spawn_and_wait_without_threads(node: Node) -> None:
    result = node.run(node.main("agent"), kind="branch", skill="async_branch", timeout=WAIT)
    assert result.summary == "async got draft v1"


@pytest.mark.parametrize("skill", ["bad_return", "unjsonable"])
def test_a_return_value_that_is_not_a_result_is_a_crash(node: Node, skill: str) -> None:
    result = node.run(node.main("agent"), kind="worker", skill=skill, timeout=WAIT)
    assert result.error.code is ErrorCode.CRASHED
    assert result.error.detail["type"] == "builtins.TypeError"


def test_awaitable_twins_mirror_the_blocking_api(node: Node) -> None:
    async def scenario() -> tuple[Any, ...]:
        main = await node.amain("agent")
        spawned = await node.aspawn(main, kind="branch", skill="async_branch")
        result = await spawned.ref.await_result(WAIT)
        ran = await node.arun(main, kind="worker", skill="writer", timeout=WAIT)
        info = await spawned.ref.ainfo()
        refused = await node.aspawn(main, kind="main")
        idle = await node.await_idle(WAIT)
        return result, ran, info, refused, idle

    result, ran, info, refused, idle = asyncio.run(scenario())
    assert result.summary == "async got draft v1"
    assert ran.summary == "draft v1"
    assert info.state is SessionState.COMPLETED
    assert refused.error.code is ErrorCode.DEPTH_EXCEEDED
    assert idle


def test_every_transition_is_emitted_exactly_once(node: Node) -> None:
    events: list[Any] = []
    node.subscribe(events.append)
    main = node.main("agent")
    result = node.run(main, kind="branch", skill="researcher", timeout=WAIT)
    settle(node)
    transitions = [
        (e.session_id, e.previous, e.state) for e in events if e.kind is EventKind.TRANSITION
    ]
    assert len(transitions) == len(set(transitions))
    branch_moves = [(p, s) for sid, p, s in transitions if sid == result.session_id]
    assert branch_moves == [("pending", "active"), ("active", "completed")]
    delivered = [e.session_id for e in events if e.kind is EventKind.RESULT_DELIVERED]
    assert sorted(delivered) == sorted({*delivered})  # one result per session
    assert len(delivered) == 2


def test_tree_and_listing_show_the_sessions(node: Node) -> None:
    main = node.main("agent")
    node.run(main, kind="branch", skill="researcher", timeout=WAIT)
    tree = node.tree(main)
    (branch,) = tree["children"]
    (worker,) = branch["children"]
    assert branch["result"].status is SessionState.COMPLETED
    assert worker["info"].kind is SessionKind.WORKER
    assert worker["info"].depth == 2
    completed = node.sessions(state=SessionState.COMPLETED)
    assert {s.kind for s in completed} == {SessionKind.BRANCH, SessionKind.WORKER}
    assert [s.session_id for s in node.sessions(kind=SessionKind.MAIN)] == [main.session_id]


def test_a_closed_node_refuses_work(make_node: Any) -> None:
    node = make_node(AGENT)
    main = node.main("agent")
    node.shutdown(grace=0)
    assert node.closed
    with pytest.raises(NodeClosedError):
        node.main("agent")
    with pytest.raises(NodeClosedError):
        main.spawn(kind="worker")
    node.shutdown()  # idempotent


def test_node_as_context_manager_shuts_down(clock: Any) -> None:
    with Node([AGENT], clock=clock) as node:
        node.main("agent").send("hello")
        assert node.wait_idle(WAIT)
    assert node.closed


def test_polling_and_timed_out_waits_leave_no_waiters_behind(make_node: Any) -> None:
    def waits(session: Session) -> str:
        session.sleep(10_000)
        return "done"

    node = make_node(Agent("agent", {"main": main_skill, "waits": waits}))
    ref = node.main("agent").spawn(kind="branch", skill="waits").ref
    for _ in range(20):
        assert ref.result() is None
        assert ref.wait(0.001) is None
    settle(node)
    assert node.stats()["result_waiters"] == 0
    ref.cancel()
    assert ref.wait(WAIT).status is SessionState.CANCELLED


def test_async_listing_twins(node: Node) -> None:
    async def scenario() -> tuple[Any, ...]:
        main = await node.amain("agent")
        await node.arun(main, kind="worker", skill="writer", timeout=WAIT)
        return (
            await node.aresults(main),
            await node.atree(main),
            await node.asessions(kind=SessionKind.WORKER),
            await node.astats(),
        )

    results, tree, workers, stats = asyncio.run(scenario())
    assert len(results) == 1
    assert len(tree["children"]) == 1
    assert len(workers) == 1
    assert stats["live_sessions"] == 1


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_collect_timeout_gives_timed_out_entries_and_the_child_keeps_running(
    make_node: Any, clock: Any, flavour: str
) -> None:
    def slow(session: Session) -> str:
        session.sleep(100.0)
        return "slow done"

    def gather(session: Session) -> dict[str, Any]:
        slow_id = session.spawn(kind="worker", skill="slow").session_id
        session.spawn(kind="worker", skill="writer")
        entries = session.collect(timeout=5.0)
        return {
            "entries": [(e.session_id == slow_id, e.timed_out, e.result is None) for e in entries]
        }

    async def gather_async(session: Any) -> dict[str, Any]:
        slow_id = (await session.spawn(kind="worker", skill="slow")).session_id
        await session.spawn(kind="worker", skill="writer")
        entries = await session.collect(timeout=5.0)
        return {
            "entries": [(e.session_id == slow_id, e.timed_out, e.result is None) for e in entries]
        }

    skills = {
        "main": main_skill,
        "slow": slow,
        "writer": writer,
        "gather": gather,
        "gather_async": gather_async,
    }
    node = make_node(Agent("agent", skills))
    skill = "gather" if flavour == "sync" else "gather_async"
    branch = node.main("agent").spawn(kind="branch", skill=skill).ref
    settle(node)
    assert branch.state is SessionState.ACTIVE
    clock.advance(5.0)
    result = branch.wait(WAIT)
    # the finished child first (completion order), then the one that timed out
    assert result.artifacts["entries"] == [[False, False, False], [True, True, True]]
    settle(node)
    (slow_child,) = [c for c in node.tree(branch)["children"] if c["info"].skill == "slow"]
    # it kept running until its parent ended, then it was cancelled like any orphan
    assert node.wait(slow_child["info"].session_id, WAIT).error.code is ErrorCode.PARENT_TERMINATED
