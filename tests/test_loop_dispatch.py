"""The one execution mode: the Cortex and every session actor take their
messages on the node's event loop, the thread that runs async skills; sync
skills' steps run on the step threads. On the loop a blocking ask would wait
for a turn that cannot come, so it is refused at once. The settings that
chose other modes are refused, saying they are gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiontree.actors import AsyncSession
from sessiontree.cli import main as cli_main
from sessiontree.protocol import DeadlockError, ErrorCode, SessionState
from sessiontree.supervision import Agent, Node, NodeConfig
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


def test_the_cortex_and_the_sessions_take_their_messages_on_the_loop(
    make_node: Any,
) -> None:
    node: Node = make_node(agent())
    main = node.main("agent")
    assert actor_threads(node, main.session_id) == "sessiontree-loop"
    names = {thread.name for thread in threading.enumerate()}
    assert not any("Cortex" in name or name.startswith("sessiontree-session") for name in names)

    result = main.run(kind="branch", skill="fan", timeout=WAIT)
    assert result.artifacts["summaries"] == sorted(f"t{n}" for n in range(8))


async def blocks_on_the_node(session: AsyncSession) -> str:
    node: Node = WHERE_NODE["node"]
    node.stats()  # a blocking ask, on the thread that would have to answer it
    return "never"


def test_a_blocking_node_call_from_an_async_skill_fails_that_session_at_once(
    make_node: Any,
) -> None:
    """On the loop it would deadlock: it is refused."""
    skills = {"main": idle, "blocks": blocks_on_the_node}
    node: Node = make_node(Agent("agent", skills, main_skill="main"))
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


@pytest.mark.parametrize("name", ["actor_type", "dispatch", "dispatcher_threads"])
def test_a_removed_setting_is_refused_naming_it_and_saying_it_is_gone(name: str) -> None:
    wanted = rf"NodeConfig\.{name} was removed \(.*a node has one execution mode"
    with pytest.raises(ValueError, match=wanted):
        NodeConfig(**{name: "threads"})
    with pytest.raises(ValueError, match=wanted):
        dataclasses.replace(NodeConfig(), **{name: 2})


def test_a_sync_skill_fan_out_runs_on_step_threads(
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


@pytest.mark.parametrize(
    ("flag", "name"),
    [
        ("--actor-type", "actor_type"),
        ("--dispatch", "dispatch"),
        ("--dispatcher-threads", "dispatcher_threads"),
    ],
)
def test_node_start_refuses_a_removed_flag_saying_it_is_gone(
    tmp_path: Path, flag: str, name: str
) -> None:
    args = ["node", "start", "--store", str(tmp_path / "store"), flag, "threads"]
    outcome = CliRunner().invoke(cli_main, args)
    assert outcome.exit_code == 2
    assert flag in outcome.output
    assert f"NodeConfig.{name} was removed" in outcome.output
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("name", ["actor_type", "dispatch", "dispatcher_threads"])
def test_node_start_refuses_a_removed_setting_in_the_environment(tmp_path: Path, name: str) -> None:
    env = {f"SESSIONTREE_NODE_START_{name.upper()}": "pooled"}
    args = ["node", "start", "--store", str(tmp_path / "store")]
    outcome = CliRunner().invoke(cli_main, args, env=env)
    assert outcome.exit_code == 2
    assert f"NodeConfig.{name} was removed" in outcome.output
    assert not (tmp_path / "store").exists()


def test_node_start_refuses_a_removed_setting_in_its_config_file(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[node]\ndispatch = "threads"\n')
    args = ["node", "start", "--store", str(tmp_path / "store"), "--config", str(config)]
    outcome = CliRunner().invoke(cli_main, args)
    assert outcome.exit_code == 2
    assert "[node] dispatch: NodeConfig.dispatch was removed" in outcome.output
    assert not (tmp_path / "store").exists()
