"""``Node.loop``: the one asyncio loop a node's async skills run on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sessiontree.protocol import NodeClosedError
from sessiontree.supervision import Agent, Node
from tests.conftest import WAIT

SEEN: dict[str, Any] = {}


def idle(session: Any) -> None:
    return None


async def on_the_loop(session: Any) -> str:
    SEEN["async"] = (asyncio.get_running_loop(), threading.current_thread().name)
    return "ok"


def on_a_step_thread(session: Any) -> str:
    SEEN["sync"] = threading.current_thread().name
    return "ok"


def test_async_skills_run_on_node_loop_and_sync_skills_on_step_threads(make_node: Any) -> None:
    SEEN.clear()
    skills = {"main": idle, "async": on_the_loop, "sync": on_a_step_thread}
    node: Node = make_node(Agent("agent", skills))
    main = node.main("agent")
    for skill in ("async", "sync"):
        assert main.run(kind="worker", skill=skill, timeout=WAIT).summary == "ok"
    loop, thread = SEEN["async"]
    assert loop is node.loop
    assert thread == "sessiontree-loop"
    assert SEEN["sync"].startswith("sessiontree-step-")

    async def where() -> str:
        return threading.current_thread().name

    assert asyncio.run_coroutine_threadsafe(where(), node.loop).result(WAIT) == "sessiontree-loop"


def test_the_loop_of_a_shut_node_is_refused(make_node: Any) -> None:
    node: Node = make_node(Agent("agent", {"main": idle}))
    assert node.loop.is_running()
    node.shutdown(grace=0, timeout=WAIT)
    with pytest.raises(NodeClosedError):
        _ = node.loop
