"""One implementation per operation (``supervision/_faces.py``): the blocking
method is derived from the awaitable one (or the awaitable from a blocking
one), with the operation's signature, docstring and name; it waits for the
Cortex on the calling thread, refused on the node's loop, and raises
``NodeClosedError`` once the node is shut down."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sessiontree.actors import AskTimeoutError
from sessiontree.actors.runtime import Reply
from sessiontree.protocol import (
    DeadlockError,
    NodeClosedError,
    SessionState,
    UnknownSessionError,
)
from sessiontree.supervision import Agent, Node, SessionRef
from sessiontree.supervision._faces import answer, blocking, offloaded, run_blocking
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


def test_a_blocking_face_on_the_nodes_loop_is_refused_before_anything_is_asked(
    make_node: Any,
) -> None:
    node: Node = make_node(Agent("agent", {"main": idle}))
    main = node.main("agent")
    before = len(node.sessions())

    async def on_the_loop() -> list[type[BaseException]]:
        raised = []
        calls: tuple[Any, ...] = (
            lambda: node.get(main),
            main.info,
            node.sessions,
            lambda: node.spawn(main, kind="worker", skill="main"),
            lambda: main.spawn(kind="worker", skill="main"),
        )
        for call in calls:
            try:
                call()
            except DeadlockError as exc:
                raised.append(type(exc))
        return raised

    raised = asyncio.run_coroutine_threadsafe(on_the_loop(), node.loop).result(WAIT)
    assert raised == [DeadlockError] * 5
    gc.collect()  # a coroutine made and never awaited would warn here (warnings are errors)
    assert node.wait_idle(WAIT)
    assert len(node.sessions()) == before  # nothing was spawned
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


def test_a_blocking_face_waits_for_the_answer_on_the_calling_thread_without_a_loop() -> None:
    reply = Reply()
    timer = threading.Timer(0.01, reply.set, args=("answered",))
    timer.start()
    # a plain thread with no event loop: awaiting the reply there would need one
    assert run_blocking(answer(reply, WAIT)) == "answered"
    timer.join(WAIT)
    with pytest.raises(AskTimeoutError):
        run_blocking(answer(Reply(), 0.01))
    failed = Reply()
    failed.fail(UnknownSessionError("gone"))
    with pytest.raises(UnknownSessionError, match="gone"):
        run_blocking(answer(failed, WAIT))


def test_an_awaited_answer_on_a_loop_is_not_a_blocking_wait() -> None:
    async def on_a_loop() -> Any:
        reply = Reply()
        asyncio.get_running_loop().call_later(0.01, reply.set, "awaited")
        return await answer(reply, WAIT)

    assert asyncio.run(on_a_loop()) == "awaited"


def test_an_operation_that_awaits_anything_else_is_refused_and_closed() -> None:
    cleaned: list[str] = []

    async def strays() -> None:
        try:
            await asyncio.sleep(0)  # not the Cortex's answer: would need a loop
        finally:
            cleaned.append("closed")

    with pytest.raises(RuntimeError, match="awaited something besides"):
        run_blocking(strays())
    assert cleaned == ["closed"]
    gc.collect()  # nothing left unawaited (warnings are errors)


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
