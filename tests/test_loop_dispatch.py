"""``NodeConfig.dispatch``: where the Cortex and the session actors take their messages.

``loop`` (the default) serves them on the node's event loop, the thread that
runs async skills; ``threads`` on a pool of threads, with the Cortex on a
thread of its own. Both run the same tree; on the loop, a blocking ask
would wait for a turn that cannot come, so it is refused at once.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiontree.actors import AsyncSession
from sessiontree.cli import main as cli_main
from sessiontree.protocol import DeadlockError, ErrorCode, SessionState
from sessiontree.supervision import Agent, Node, NodeConfig
from tests._running_node import RunningNode
from tests.conftest import WAIT, settle

WHERE: dict[str, str] = {}  # task -> the thread its skill ran on
WHERE_NODE: dict[str, Node] = {}  # the node a skill calls into


def idle(session: Any) -> None:
    return None


async def leaf(session: AsyncSession) -> str:
    await asyncio.sleep(0)
    return session.task


async def fan(session: AsyncSession) -> dict[str, Any]:
    gathered = await session.fan_out([f"t{n}" for n in range(8)], skill="leaf", kind="worker")
    return {"summaries": sorted(r.result.summary for r in gathered.reports if r.result)}


def agent() -> Agent:
    return Agent("agent", {"main": idle, "leaf": leaf, "fan": fan}, main_skill="main")


def actor_threads(node: Node, session_id: Any) -> str:
    name: str = node.inspect(session_id, lambda core: threading.current_thread().name)
    return name


def test_on_loop_dispatch_the_cortex_and_the_sessions_take_their_messages_on_the_loop(
    make_node: Any,
) -> None:
    node: Node = make_node(agent())
    assert node.config.dispatch == "loop"
    main = node.main("agent")
    assert actor_threads(node, main.session_id) == "sessiontree-loop"
    names = {thread.name for thread in threading.enumerate()}
    assert not any("Cortex" in name or name.startswith("sessiontree-session") for name in names)

    result = main.run(kind="branch", skill="fan", timeout=WAIT)
    assert result.artifacts["summaries"] == sorted(f"t{n}" for n in range(8))


def test_on_thread_dispatch_the_cortex_has_its_thread_and_sessions_a_pool(
    make_node: Any,
) -> None:
    node: Node = make_node(agent(), dispatch="threads", dispatcher_threads=2)
    main = node.main("agent")
    assert actor_threads(node, main.session_id).startswith("sessiontree-session-")
    assert any("Cortex" in thread.name for thread in threading.enumerate())

    result = main.run(kind="branch", skill="fan", timeout=WAIT)
    assert result.artifacts["summaries"] == sorted(f"t{n}" for n in range(8))


async def blocks_on_the_node(session: AsyncSession) -> str:
    node: Node = WHERE_NODE["node"]
    node.stats()  # a blocking ask, on the thread that would have to answer it
    return "never"


@pytest.mark.parametrize("dispatch", ["loop", "threads"])
def test_a_blocking_node_call_from_an_async_skill_fails_that_session_at_once(
    make_node: Any, dispatch: str
) -> None:
    """On the loop it would deadlock; on threads it is refused all the same, so
    a skill behaves alike whatever serves the actors."""
    skills = {"main": idle, "blocks": blocks_on_the_node}
    node: Node = make_node(Agent("agent", skills, main_skill="main"), dispatch=dispatch)
    WHERE_NODE["node"] = node
    try:
        result = node.main("agent").run(kind="worker", skill="blocks", timeout=WAIT)
    finally:
        WHERE_NODE.clear()
    assert result.status is SessionState.FAILED
    assert result.error is not None
    assert result.error.code is ErrorCode.CRASHED
    assert DeadlockError.__name__ in result.error.message
    assert "await the async twin" in result.error.message
    settle(node)
    assert node.stats()["live_sessions"] == 1  # the node lives on, and its Main


def test_an_unknown_dispatch_is_refused_naming_the_field() -> None:
    wanted = r"NodeConfig\.dispatch must be one of \['loop', 'threads'\], got 'fibers'"
    with pytest.raises(ValueError, match=wanted):
        NodeConfig(dispatch="fibers")


def test_a_sync_skill_fan_out_runs_on_step_threads_whatever_serves_the_actors(
    make_node: Any,
) -> None:
    def sync_leaf(session: Any) -> str:
        WHERE[session.task] = threading.current_thread().name
        return session.task

    def sync_fan(session: Any) -> str:
        return str(len(session.fan_out(["a", "b", "c"], skill="sync_leaf", kind="worker").reports))

    skills = {"main": idle, "sync_leaf": sync_leaf, "sync_fan": sync_fan}
    node: Node = make_node(Agent("agent", skills, main_skill="main"))
    WHERE.clear()
    result = node.main("agent").run(kind="branch", skill="sync_fan", timeout=WAIT)
    assert result.summary == "3"
    assert sorted(WHERE) == ["a", "b", "c"]
    assert all(name.startswith("sessiontree-step-") for name in WHERE.values())


@pytest.mark.timeout(120)
def test_node_start_takes_the_dispatch_from_its_flag(tmp_path: Path) -> None:
    running = RunningNode(tmp_path / "store", "--dispatch", "threads")
    try:
        assert running.config["node"]["dispatch"] == "threads"
        assert running.sources["dispatch"] == "flag"
        assert running.http.get("/v1/node").json()["config"]["dispatch"] == "threads"
    finally:
        assert running.stop() == 0


def test_node_start_refuses_an_unknown_dispatch_naming_the_flag(tmp_path: Path) -> None:
    args = ["node", "start", "--store", str(tmp_path / "store"), "--dispatch", "fibers"]
    outcome = CliRunner().invoke(cli_main, args)
    assert outcome.exit_code == 2
    assert "--dispatch" in outcome.output
    assert not (tmp_path / "store").exists()
