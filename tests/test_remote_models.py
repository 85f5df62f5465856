"""Remote steps call models through the node (issue 20).

A step on the ``process`` or ``ray`` backend sends its call to the node,
which reserves, sends and settles it as it does an inline session's, and
hands the reply back to the step. So usage rolls up, budgets refuse before
sending, and a cancelled or killed step has its request closed, wherever the
step runs. A real stand-in server on 127.0.0.1 counts what reached "the
provider"; the worker processes and the Ray cluster are real too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessiontree.actors import AsyncSession, VirtualClock
from sessiontree.actors.backends import ProcessBackend, RayBackend
from sessiontree.protocol import (
    Budget,
    ErrorCode,
    SessionKind,
    SessionResult,
    SessionState,
    Usage,
)
from sessiontree.supervision import Agent, Node, Provider, SessionRef
from sessiontree.testing import FaultKind, StandinServer
from tests import _remote_skills as skills
from tests.conftest import WAIT, settle

pytestmark = pytest.mark.timeout(120)


def _main(session: Any) -> None:
    return None


async def _waits(session: AsyncSession) -> None:
    """An inline parent that holds still (at a checkpoint) until cancelled."""
    await session.sleep(3600)


AGENT = Agent(
    "agent",
    {
        "main": _main,
        "waits": _waits,
        "asks": skills.asks_model,
        "async_asks": skills.async_asks_model,
        "asks_once": skills.asks_model_once,
        "waits_on_model": skills.waits_on_model,
        "async_waits_on_model": skills.async_waits_on_model,
    },
    main_skill="main",
    models={"small": "m", "large": "m"},
)


@pytest.fixture
def server() -> Iterator[StandinServer]:
    with StandinServer() as standin:
        yield standin


@pytest.fixture(params=("process", "ray"))
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "ray":
        request.getfixturevalue("ray_cluster")
    return name


@pytest.fixture
def node_on(make_node: Callable[..., Node], server: StandinServer) -> Callable[..., Node]:
    """A node whose workers run on the given backend and call the stand-in."""

    def make(backend: str) -> Node:
        node = make_node(
            AGENT,
            backend=backend,
            process_workers=1,
            ray_actors=1,
            grace=30.0,
            providers=(Provider(base_url=server.url, max_retries=0),),
        )
        pool = node.backends.get(backend)
        assert isinstance(pool, ProcessBackend | RayBackend)
        assert pool.wait_ready(60.0), f"the {backend} pool did not start"
        return node

    return make


def _parent(node: Node) -> SessionRef:
    """An inline branch under the agent's main, waiting to be cancelled."""
    spawned = node.main("agent").spawn(kind=SessionKind.BRANCH, skill="waits")
    assert spawned.ref is not None, spawned.error
    return spawned.ref


def _worker(
    parent: SessionRef, skill: str, tmp_path: Path, *, stream: bool = False, **fields: Any
) -> SessionRef:
    metadata = {"dir": str(tmp_path), "stream": stream}
    spawned = parent.spawn(kind=SessionKind.WORKER, skill=skill, metadata=metadata, **fields)
    assert spawned.ref is not None, spawned.error
    return spawned.ref


def _result(ref: SessionRef) -> SessionResult:
    result = ref.wait(WAIT * 3)
    assert result is not None, "the session never ended"
    return result


def _ended(ref: SessionRef) -> SessionResult:
    """Cancel ``ref`` (a waiting parent) and return its result."""
    assert ref.cancel() is None
    return _result(ref)


def test_a_remote_step_calls_the_model_through_the_node_and_its_usage_rolls_up(
    node_on: Callable[..., Node], server: StandinServer, backend: str, tmp_path: Path
) -> None:
    node = node_on(backend)
    deltas: list[Any] = []
    node.subscribe(lambda e: deltas.append(e.data) if e.kind.value == "progress" else None)
    parent = _parent(node)
    child = _worker(
        parent, "asks", tmp_path, task="hello there", context_summary="Be brief.", stream=True
    )
    result = _result(child)
    assert result.status is SessionState.COMPLETED, result.error
    assert result.artifacts["texts"] == ["echo hello there", "echo and again"]
    assert result.artifacts["errors"] == []
    assert result.artifacts["pid"] != os.getpid()  # the skill ran in a worker
    # the worker built the calls from what it has: its context_summary, then
    # what the step's context recorded of the first exchange
    assert result.artifacts["recorded"] == ["user", "assistant", "user", "assistant"]
    assert server.requests[-1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "echo hello there"},
        {"role": "user", "content": "and again"},
    ]
    stats = server.stats()
    spent = Usage(
        prompt_tokens=stats.prompt_tokens_served,
        completion_tokens=stats.completion_tokens_served,
        calls=2,
        unpriced_calls=2,
    )
    assert stats.requests_received == 2
    assert result.usage == spent
    assert _ended(parent).subtree_usage == spent
    settle(node)
    # the first call streamed: its text reached the session's progress on the node
    assert "".join(d["delta"] for d in deltas if "delta" in d) == "echo hello there"


def test_an_async_remote_step_calls_the_model_too(
    node_on: Callable[..., Node], server: StandinServer, tmp_path: Path
) -> None:
    node = node_on("process")
    result = _result(_worker(_parent(node), "async_asks", tmp_path, task="one two"))
    assert result.status is SessionState.COMPLETED, result.error
    assert result.artifacts["text"] == "echo one two"
    assert result.artifacts["tokens"] == server.tokens_served
    assert result.usage.calls == 1


def test_a_budget_refuses_a_remote_call_before_it_is_sent(
    node_on: Callable[..., Node], server: StandinServer, tmp_path: Path
) -> None:
    node = node_on("process")
    child = _worker(_parent(node), "asks_once", tmp_path, task="hi", budget=Budget(calls=0))
    result = _result(child)
    assert server.requests_received == 0
    assert result.artifacts == {"text": None, "error": "budget_exhausted"}
    assert result.status is SessionState.CANCELLED  # the hard limit, with grace
    assert result.error is not None
    assert result.error.code is ErrorCode.BUDGET_EXHAUSTED
    assert result.usage == Usage()


@pytest.mark.parametrize(
    ("backend", "skill"),
    [("process", "waits_on_model"), ("process", "async_waits_on_model"), ("ray", "waits_on_model")],
    indirect=["backend"],
)
def test_cancelling_a_remote_step_mid_call_closes_the_request_and_settles_it(
    node_on: Callable[..., Node], server: StandinServer, backend: str, skill: str, tmp_path: Path
) -> None:
    node = node_on(backend)
    server.fail_next(FaultKind.SLOW, delay=60.0)
    child = _worker(_parent(node), skill, tmp_path, task="slow one")
    assert server.wait_for_requests(1, WAIT * 3), "the call never reached the server"
    assert child.cancel() is None
    result = _result(child)
    assert result.status is SessionState.CANCELLED
    assert result.summary == "partial after cancelled"
    assert server.wait_for_disconnects(1, WAIT), "the request was left open"
    assert server.completions_served == 0
    # settled before the step's end was reported: one call, its prompt as estimated
    assert result.usage.calls == 1
    assert result.usage.completion_tokens == 0
    assert result.usage.prompt_tokens > 0


def test_a_remote_step_killed_mid_call_has_its_request_closed(
    node_on: Callable[..., Node], server: StandinServer, clock: VirtualClock, tmp_path: Path
) -> None:
    node = node_on("process")
    server.fail_next(FaultKind.SLOW, delay=60.0)
    child = _worker(_parent(node), "waits_on_model", tmp_path, task="slow one", ttl=5.0)
    pid = skills.started_pid(tmp_path, child.session_id, WAIT)
    assert pid is not None, "the step never started"
    assert server.wait_for_requests(1, WAIT), "the call never reached the server"
    clock.advance(5.0)  # expired: fenced at once, its worker killed
    result = _result(child)
    assert result.status is SessionState.EXPIRED
    assert server.wait_for_disconnects(1, WAIT), "the request of a killed step was left open"
    assert _gone(pid), "the worker of an expired step still runs"
    assert server.completions_served == 0


def _gone(pid: int) -> bool:
    """Wait (bounded) until process ``pid`` no longer exists."""
    ticks = threading.Event()
    for _ in range(int(WAIT * 100)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        ticks.wait(0.01)
    return False
