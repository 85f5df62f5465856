"""Session ids as users hold them: a UUID, its canonical string (from JSON or the CLI), or a ref.

Anything else is refused with a ``RejectedInputError`` naming the argument,
before the Cortex is asked anything: a refused call creates nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from sessiontree.actors import Session
from sessiontree.protocol import RejectedInputError, SessionKind, SessionState, SpawnSpec
from sessiontree.supervision import Agent, Node, SessionRef
from sessiontree.supervision._refs import as_session_id
from tests.conftest import WAIT, settle

CYCLES: list[Any] = []


def main_skill(session: Session) -> None:
    CYCLES.append(session.message)


def writer(session: Session) -> str:
    return f"wrote {session.task}"


def waits(session: Session) -> str:
    session.sleep(10_000)
    return "done"


AGENT = Agent("agent", {"main": main_skill, "writer": writer, "waits": waits})


@pytest.fixture
def node(make_node: Any) -> Node:
    CYCLES.clear()
    return make_node(AGENT)


# -- the conversion ------------------------------------------------------------------


def test_a_uuid_its_canonical_string_and_a_ref_are_one_session_id(node: Node) -> None:
    sid = uuid.uuid4()
    assert as_session_id(sid) is sid
    assert as_session_id(str(sid)) == sid
    assert as_session_id(str(sid).upper()) == sid
    assert as_session_id(SessionRef(node, sid)) == sid
    assert SessionRef(node, str(sid)) == SessionRef(node, sid)
    assert node.ref(str(sid)).session_id == sid


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "",
        42,
        None,
        1.5,
        b"\x00" * 16,
        ["not", "an", "id"],
        "12345678123456781234567812345678",  # hex, no hyphens: not the canonical form
        "{12345678-1234-5678-1234-567812345678}",
        "urn:uuid:12345678-1234-5678-1234-567812345678",
        "12345678-1234-5678-1234-56781234567g",
    ],
)
def test_anything_else_is_refused_naming_the_argument(node: Node, value: Any) -> None:
    with pytest.raises(RejectedInputError, match=r"^parent .* is not a session id") as caught:
        as_session_id(value, "parent")
    assert caught.value.field == "parent"
    with pytest.raises(RejectedInputError) as caught:
        node.ref(value)
    assert caught.value.field == "session_id"


# -- every method takes the string form -----------------------------------------------


def test_the_blocking_methods_take_a_session_id_as_a_string(node: Node) -> None:
    main = str(node.main("agent").session_id)
    assert node.get(main).kind is SessionKind.MAIN
    spawned = node.spawn(main, kind="worker", skill="writer", task="a")
    assert spawned.ok
    child = str(spawned.session_id)
    assert node.wait(child, WAIT).summary == "wrote a"
    assert node.result(child).summary == "wrote a"
    assert node.run(main, kind="worker", skill="writer", task="b", timeout=WAIT).summary == (
        "wrote b"
    )
    batch = node.spawn_many(main, [node_spec("c"), node_spec("d")])
    assert all(s.ok for s in batch)
    settle(node)
    assert node.send(main, "hello") is None
    settle(node)
    assert "hello" in CYCLES
    assert len(node.results(main)) == 4
    assert len(node.tree(main)["children"]) == 4
    assert node.conversation(main).session_id == uuid.UUID(main)
    waiting = str(node.spawn(main, kind="branch", skill="waits").session_id)
    settle(node)
    assert node.suspend(waiting) is None
    assert node.resume(waiting) is None
    assert node.cancel(waiting) is None
    assert node.wait(waiting, WAIT).status is SessionState.CANCELLED
    gathered = node.patterns.fan_out(main, ["e", "f"], kind="worker", skill="writer")
    assert sorted(r.summary for r in gathered.results) == ["wrote e", "wrote f"]


def node_spec(task: str) -> SpawnSpec:
    return SpawnSpec(kind=SessionKind.WORKER, skill="writer", task=task)


def test_the_awaitable_twins_take_a_session_id_as_a_string(node: Node) -> None:
    async def scenario() -> dict[str, Any]:
        main = str((await node.amain("agent")).session_id)
        seen: dict[str, Any] = {"info": await node.aget(main)}
        spawned = await node.aspawn(main, kind="worker", skill="writer", task="a")
        child = str(spawned.session_id)
        seen["waited"] = await node.await_result(child, WAIT)
        seen["result"] = await node.aresult(child)
        seen["ran"] = await node.arun(main, kind="worker", skill="writer", task="b", timeout=WAIT)
        seen["batch"] = await node.aspawn_many(main, [node_spec("c")])
        assert await node.await_idle(WAIT)
        seen["sent"] = await node.asend(main, "hello")
        assert await node.await_idle(WAIT)
        seen["results"] = await node.aresults(main)
        seen["tree"] = await node.atree(main)
        waiting = str((await node.aspawn(main, kind="branch", skill="waits")).session_id)
        assert await node.await_idle(WAIT)
        seen["suspended"] = await node.asuspend(waiting)
        seen["resumed"] = await node.aresume(waiting)
        seen["cancelled"] = await node.acancel(waiting)
        seen["ended"] = await node.await_result(waiting, WAIT)
        seen["gathered"] = await node.patterns.afan_out(main, ["e"], kind="worker", skill="writer")
        return seen

    seen = asyncio.run(scenario())
    assert seen["info"].kind is SessionKind.MAIN
    assert seen["waited"].summary == seen["result"].summary == "wrote a"
    assert seen["ran"].summary == "wrote b"
    assert all(s.ok for s in seen["batch"])
    assert seen["sent"] is None
    assert len(seen["results"]) == 3
    assert len(seen["tree"]["children"]) == 3
    assert seen["suspended"] is seen["resumed"] is seen["cancelled"] is None
    assert seen["ended"].status is SessionState.CANCELLED
    assert [r.summary for r in seen["gathered"].results] == ["wrote e"]


def test_a_ref_takes_its_id_as_a_string_and_its_twins_answer(node: Node) -> None:
    main = node.ref(str(node.main("agent").session_id))

    async def scenario() -> tuple[Any, ...]:
        child = await main.aspawn(kind="worker", skill="writer", task="a")
        ran = await main.arun(kind="worker", skill="writer", task="b", timeout=WAIT)
        assert child.ref is not None
        waited = await child.ref.await_result(WAIT)
        assert await node.await_idle(WAIT)
        return waited, await child.ref.aresult(), ran, await main.aresults()

    waited, result, ran, results = asyncio.run(scenario())
    assert waited == result
    assert ran.summary == "wrote b"
    assert len(results) == 2


# -- a refused id creates nothing ---------------------------------------------------------

BAD = ["abc", 42, None]

CALLS: dict[str, tuple[str, Callable[[Node, Any], Any]]] = {
    "get": ("session_id", lambda n, v: n.get(v)),
    "spawn": ("parent", lambda n, v: n.spawn(v, kind="worker", skill="writer")),
    "spawn_many": ("parent", lambda n, v: n.spawn_many(v, [node_spec("x")])),
    "run": ("parent", lambda n, v: n.run(v, kind="worker", skill="writer", timeout=WAIT)),
    "cancel": ("session_id", lambda n, v: n.cancel(v)),
    "suspend": ("session_id", lambda n, v: n.suspend(v)),
    "resume": ("session_id", lambda n, v: n.resume(v)),
    "send": ("session_id", lambda n, v: n.send(v, "hello")),
    "wait": ("session_id", lambda n, v: n.wait(v, WAIT)),
    "result": ("session_id", lambda n, v: n.result(v)),
    "results": ("session_id", lambda n, v: n.results(v)),
    "tree": ("root", lambda n, v: n.tree(v)),
    "conversation": ("session_id", lambda n, v: n.conversation(v)),
    "inspect": ("session_id", lambda n, v: n.inspect(v, lambda core: None)),
    "fan_out": ("parent", lambda n, v: n.patterns.fan_out(v, ["x"], kind="worker", skill="writer")),
    "ref": ("session_id", lambda n, v: n.ref(v)),
    "aget": ("session_id", lambda n, v: asyncio.run(n.aget(v))),
    "aspawn": ("parent", lambda n, v: asyncio.run(n.aspawn(v, kind="worker", skill="writer"))),
    "aspawn_many": ("parent", lambda n, v: asyncio.run(n.aspawn_many(v, [node_spec("x")]))),
    "arun": ("parent", lambda n, v: asyncio.run(n.arun(v, kind="worker", skill="writer"))),
    "acancel": ("session_id", lambda n, v: asyncio.run(n.acancel(v))),
    "asuspend": ("session_id", lambda n, v: asyncio.run(n.asuspend(v))),
    "aresume": ("session_id", lambda n, v: asyncio.run(n.aresume(v))),
    "asend": ("session_id", lambda n, v: asyncio.run(n.asend(v, "hello"))),
    "await_result": ("session_id", lambda n, v: asyncio.run(n.await_result(v, WAIT))),
    "aresult": ("session_id", lambda n, v: asyncio.run(n.aresult(v))),
    "aresults": ("session_id", lambda n, v: asyncio.run(n.aresults(v))),
    "atree": ("root", lambda n, v: asyncio.run(n.atree(v))),
    "afan_out": (
        "parent",
        lambda n, v: asyncio.run(n.patterns.afan_out(v, ["x"], kind="worker", skill="writer")),
    ),
}


@pytest.mark.parametrize("value", BAD, ids=repr)
@pytest.mark.parametrize("method", sorted(CALLS))
def test_a_bad_session_id_is_refused_naming_the_argument_and_creates_nothing(
    node: Node, method: str, value: Any
) -> None:
    node.main("agent")
    settle(node)
    before = node.sessions()
    argument, call = CALLS[method]
    with pytest.raises(RejectedInputError, match=rf"^{argument} .* is not a session id") as caught:
        call(node, value)
    assert caught.value.field == argument
    settle(node)
    assert node.sessions() == before
    assert node.stats()["live_sessions"] == 1
