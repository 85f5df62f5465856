"""``Node.astart``: a node on the application's own event loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from sessiontree.actors import VirtualClock
from sessiontree.protocol import DeadlockError, SessionState
from sessiontree.supervision import Agent, Node, NodeConfig
from tests.conftest import WAIT

SEEN: dict[str, Any] = {}


async def inbox(session: Any) -> None:
    if isinstance(session.message, str):  # a message, not a child's result
        SEEN.setdefault("messages", []).append(session.message)


async def on_the_loop(session: Any) -> str:
    SEEN["async"] = (asyncio.get_running_loop(), threading.get_ident())
    return "ok"


def on_a_step_thread(session: Any) -> str:
    SEEN["sync"] = threading.get_ident()
    return "ok"


async def waits(session: Any) -> str:
    await session.sleep(3_600.0)
    return "woke"


async def fans_out(session: Any) -> str:
    gathered = await session.fan_out(["a", "b", "c"], skill="async")
    return str(len(gathered.results))


SKILLS = {
    "inbox": inbox,
    "async": on_the_loop,
    "sync": on_a_step_thread,
    "waits": waits,
    "fans_out": fans_out,
}
AGENT = Agent("agent", SKILLS, main_skill="inbox")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, WAIT))


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sessiontree-loop"]


def node_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("sessiontree-")}


def test_a_node_started_on_the_application_loop_runs_async_skills_there() -> None:
    SEEN.clear()
    before, loops = node_threads(), loop_threads()

    async def scenario() -> None:
        loop, here = asyncio.get_running_loop(), threading.get_ident()
        async with await Node.astart([AGENT], NodeConfig(grace=0.0)) as node:
            assert node.loop is loop
            assert loop_threads() == loops  # no loop thread of its own
            main = await node.amain("agent")
            for skill in ("async", "sync", "fans_out"):
                result = await main.arun(kind="branch", skill=skill, timeout=WAIT)
                assert result is not None
                assert result.ok, result
            assert SEEN["async"] == (loop, here)
            assert SEEN["sync"] != here  # sync skills keep their step threads
            assert await main.asend("hello") is None
            assert await node.await_idle(WAIT)
            assert SEEN["messages"] == ["hello"]

    run(scenario())
    assert node_threads() <= before  # nothing of the node's is left running


def test_blocking_calls_on_that_loop_are_refused_until_it_shuts_down() -> None:
    async def scenario() -> None:
        node = await Node.astart([AGENT], NodeConfig(grace=0.0))
        main = await node.amain("agent")
        with pytest.raises(DeadlockError):
            node.get(main)  # it would wait for a turn of this very loop
        with pytest.raises(DeadlockError):
            node.shutdown()
        assert (await node.aget(main)).state is SessionState.ACTIVE  # still serving
        await node.ashutdown()
        # the thread is the application's again: another node's blocking calls work
        with Node([AGENT], NodeConfig(grace=0.0)) as other:
            assert other.main("agent").state is SessionState.ACTIVE

    run(scenario())


def test_a_shutdown_cancels_the_nodes_tasks_and_leaves_the_applications_running() -> None:
    async def scenario() -> None:
        mine = asyncio.create_task(asyncio.sleep(3_600.0))
        node = await Node.astart([AGENT], NodeConfig(grace=0.0))
        main = await node.amain("agent")
        spawned = await main.aspawn(kind="worker", skill="waits")
        assert spawned.ref is not None
        assert await node.await_idle(WAIT)
        await node.ashutdown()
        final = {s.session_id: s.state for s in node.final_sessions}
        assert final[spawned.ref.session_id] is SessionState.CANCELLED
        assert not mine.done()  # the application's task runs on
        mine.cancel()
        await asyncio.sleep(0)  # the loop still turns for its owner
        assert mine.cancelled()

    run(scenario())


def test_two_nodes_on_one_loop_each_keep_it_refusing_blocking_calls() -> None:
    async def scenario() -> None:
        first = await Node.astart([AGENT], NodeConfig(grace=0.0))
        second = await Node.astart([AGENT], NodeConfig(grace=0.0))
        await first.ashutdown()
        with pytest.raises(DeadlockError):
            second.main("agent")  # the second still serves on this loop
        main = await second.amain("agent")
        result = await main.arun(kind="worker", skill="async", timeout=WAIT)
        assert result is not None
        assert result.ok
        await second.ashutdown()

    run(scenario())


def test_a_loop_cannot_be_adopted_from_its_own_thread() -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError, match="astart"):
            Node([AGENT], NodeConfig(), loop=asyncio.get_running_loop())

    run(scenario())


def test_a_stored_node_on_the_application_loop_comes_back_after_a_restart(
    tmp_path: Path,
) -> None:
    SEEN.clear()
    clock = VirtualClock()

    async def first() -> str:
        async with await Node.astart([AGENT], NodeConfig(), store=tmp_path, clock=clock) as node:
            main = await node.amain("agent")
            assert await main.asend("kept") is None
            assert await node.await_idle(WAIT)
            return str(main.session_id)

    async def second(main_id: str) -> None:
        async with await Node.astart([AGENT], NodeConfig(), store=tmp_path, clock=clock) as node:
            main = await node.amain("agent")
            assert str(main.session_id) == main_id
            assert await main.asend("again") is None
            assert await node.await_idle(WAIT)

    main_id = run(first())
    run(second(main_id))
    assert SEEN["messages"] == ["kept", "again"]
