"""One implementation per operation (``supervision/_faces.py``): the blocking
method is derived from the awaitable one (or the awaitable from a blocking
one), with the operation's signature, docstring and name, the loop-thread
guard, and ``NodeClosedError`` once the node's loop is gone."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sessiontree.protocol import DeadlockError, NodeClosedError, SessionState
from sessiontree.supervision import Agent, Node, SessionRef
from sessiontree.supervision._faces import blocking, offloaded, wait_on_loop
from sessiontree.supervision._node_patterns import Patterns
from sessiontree.supervision._node_recovery import Recovery
from sessiontree.supervision._node_replay import Recordings
from tests.conftest import WAIT

FACED = (Node, SessionRef, Patterns, Recovery, Recordings)


def idle(session: Any) -> None:
    return None


def _faces(cls: type[Any]) -> Iterator[tuple[str, Any]]:
    for name, value in vars(cls).items():
        if isinstance(value, blocking | offloaded):
            yield name, value


@pytest.mark.parametrize("cls", FACED, ids=lambda cls: cls.__name__)
def test_each_face_shows_its_operations_signature_docstring_and_name(cls: type[Any]) -> None:
    faces = dict(_faces(cls))
    assert faces, f"{cls.__name__} has no derived faces"
    for name, face in faces.items():
        method = getattr(cls, name)
        assert method.__name__ == name
        assert method.__qualname__ == f"{cls.__name__}.{name}"
        assert method.__doc__, f"{cls.__name__}.{name} has no docstring"
        assert method.__doc__ == face.operation.__doc__
        assert inspect.signature(method) == inspect.signature(face.operation)
        # the blocking face is a plain method, the awaitable one a coroutine function
        assert inspect.iscoroutinefunction(method) is isinstance(face, offloaded)


def test_the_node_writes_each_operation_on_sessions_once() -> None:
    pairs = {
        "main": "amain",
        "spawn": "aspawn",
        "spawn_many": "aspawn_many",
        "run": "arun",
        "get": "aget",
        "cancel": "acancel",
        "terminate": "aterminate",
        "suspend": "asuspend",
        "resume": "aresume",
        "send": "asend",
        "wait": "await_result",
        "result": "aresult",
        "results": "aresults",
        "spending": "aspending",
        "sessions": "asessions",
        "tree": "atree",
        "stuck": "astuck",
    }
    for sync, awaitable in pairs.items():
        face = inspect.getattr_static(Node, sync)
        assert isinstance(face, blocking), sync
        assert face.operation is inspect.getattr_static(Node, awaitable), sync


def test_a_blocking_face_on_the_nodes_loop_is_refused_and_runs_nothing(make_node: Any) -> None:
    node: Node = make_node(Agent("agent", {"main": idle}))
    main = node.main("agent")

    async def on_the_loop() -> list[type[BaseException]]:
        raised = []
        calls: tuple[Any, ...] = (node.get, main.info, node.sessions)
        for call, args in zip(calls, ((main,), (), ()), strict=True):
            try:
                call(*args)
            except DeadlockError as exc:
                raised.append(type(exc))
        return raised

    raised = asyncio.run_coroutine_threadsafe(on_the_loop(), node.loop).result(WAIT)
    assert raised == [DeadlockError] * 3
    gc.collect()  # a coroutine made and never awaited would warn here (warnings are errors)
    assert node.get(main).state is SessionState.ACTIVE  # the node goes on


def test_after_shutdown_both_faces_raise_node_closed(make_node: Any) -> None:
    node: Node = make_node(Agent("agent", {"main": idle}))
    main = node.main("agent")
    node.shutdown(grace=0, timeout=WAIT)
    with pytest.raises(NodeClosedError):
        node.get(main)
    with pytest.raises(NodeClosedError):
        main.info()
    with pytest.raises(NodeClosedError):
        node.spawn(main, kind="worker", skill="main")

    async def awaited() -> None:
        await node.aget(main)

    with pytest.raises(NodeClosedError):
        asyncio.run(awaited())
    gc.collect()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    if loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT)
    loop.close()


def test_wait_on_loop_returns_and_raises_what_the_operation_does(
    loop: asyncio.AbstractEventLoop,
) -> None:
    async def answer() -> str:
        return "done"

    async def fails() -> None:
        raise TimeoutError("the operation's own timeout")  # not the wait's

    assert wait_on_loop(loop, answer()) == "done"
    with pytest.raises(TimeoutError, match="the operation's own"):
        wait_on_loop(loop, fails())


def test_a_loop_that_stops_under_a_blocking_face_ends_it_with_node_closed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    def stop_once_started() -> None:
        assert started.wait(WAIT)
        loop.call_soon_threadsafe(loop.stop)

    stopper = threading.Thread(target=stop_once_started)
    stopper.start()
    with pytest.raises(NodeClosedError):
        wait_on_loop(loop, forever())  # bounded: the face looks at the loop every 0.5 s
    stopper.join(WAIT)


def test_a_closed_loop_refuses_a_blocking_face_and_closes_its_coroutine() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    ran: list[str] = []

    async def never() -> None:
        ran.append("ran")

    with pytest.raises(NodeClosedError):
        wait_on_loop(loop, never())
    gc.collect()  # closed, not left unawaited (warnings are errors)
    assert ran == []


class _Where:
    def where(self, suffix: str = "") -> str:
        """The thread it ran on."""
        return threading.current_thread().name + suffix

    awhere = offloaded(where)


def test_an_offloaded_face_runs_its_operation_on_a_worker_thread() -> None:
    async def both() -> tuple[str, str]:
        return threading.current_thread().name, await _Where().awhere("!")

    here, there = asyncio.run(both())
    assert there.endswith("!")
    assert there != f"{here}!"
    assert _Where.awhere.__name__ == "awhere"
    assert _Where.awhere.__doc__ == "The thread it ran on."
