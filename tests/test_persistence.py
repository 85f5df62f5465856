"""Durable sessions at node level: a real LMDB store in tmp_path and restarts.

A restart here is a graceful ``node.shutdown()`` and a new ``Node`` on the same
directory; what a crash leaves behind is written straight into the store with
``WriteBatch`` (an in-process test cannot kill -9 itself).
"""

from __future__ import annotations

import asyncio
import errno
import os
import pathlib
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import lmdb
import pytest

from sessiontree.actors import Cancelled, SessionContext, VirtualClock
from sessiontree.actors.runtime import Reply
from sessiontree.protocol import (
    CorruptRecordError,
    ErrorCode,
    NotAllowedError,
    Outcome,
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnSpec,
    StoreError,
    StoreLockedError,
    UnknownSessionError,
    new_session_id,
)
from sessiontree.store import (
    ContextEntry,
    ContextRecord,
    InboxRecord,
    MemoryRecord,
    SessionRecord,
    Store,
    StoreIO,
    WriteBatch,
    decode_record,
    encode_record,
)
from sessiontree.supervision import Agent, Event, Node, NodeConfig
from sessiontree.supervision._requests import SpawnMany
from tests.conftest import WAIT, settle

# -- fixtures and helpers -------------------------------------------------------


@pytest.fixture
def store_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "store"


@pytest.fixture
def make_store() -> Iterator[Callable[..., Store]]:
    """Stores a test opens itself (a node given a ``Store`` does not close it);
    closed after every node of the test is shut down."""
    stores: list[Store] = []

    def make(path: pathlib.Path, **options: Any) -> Store:
        store = Store(path, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def open_node(
    clock: VirtualClock, make_store: Callable[..., Store]
) -> Iterator[Callable[..., Node]]:
    """Open a node on ``store`` (a directory, a ``Store`` or None) on the test's
    virtual clock; every node is shut down after the test."""
    nodes: list[Node] = []

    def open_(store: Any, *agents: Agent, **config: Any) -> Node:
        node = Node(list(agents), NodeConfig(**config), clock=clock, store=store)
        nodes.append(node)
        return node

    yield open_
    for node in nodes:
        node.shutdown(grace=0, timeout=5.0)


def shut(node: Node) -> None:
    """The graceful half of a restart: branches park, the store is flushed and closed."""
    node.shutdown(timeout=WAIT)
    assert node.closed


def contents(context: SessionContext | ContextRecord | None) -> list[Any]:
    assert context is not None
    return [message.content for message in context.messages]


def said(record: SessionRecord, store: Store) -> list[Any]:
    """What a spawned session wrote to its context: its branch of its root
    Main's conversation, as the store holds it (oldest first)."""
    conversation = record.info.conversation
    assert conversation is not None
    state, _ = store.conversation_read(conversation)
    assert state is not None
    (branch,) = [b for b in state.branches if b.session_id == record.info.session_id]
    walked = store.walk(conversation, branch.tip, 100, branch.id)
    return [message.content for message in reversed(walked)]


def stored(node: Node, session_id: uuid.UUID) -> SessionRecord:
    """The session's record once everything the node queued so far is committed."""
    assert node.store is not None
    node.store.flush()
    record = node.store.session(session_id)
    assert record is not None, f"no record of {session_id}"
    return record


class MainLog:
    """A Main skill that records every cycle: its message (a child's result as
    ``("result", child_id)``), whether it is resumed, and its context before."""

    def __init__(self) -> None:
        self.cycles: list[tuple[Any, bool, list[Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, session: Any) -> None:
        message = session.message
        if isinstance(message, SessionResult):
            message = ("result", message.session_id)
        with self.lock:
            self.cycles.append((message, session.resumed, contents(session.context)))
        if isinstance(session.message, str):
            session.add_message("user", session.message)

    @property
    def messages(self) -> list[Any]:
        with self.lock:
            return [message for message, _, _ in self.cycles]

    def result_cycles(self, child: uuid.UUID) -> int:
        return self.messages.count(("result", child))


def finished(session: Any) -> str:
    return "done"


# -- 1. Mains -------------------------------------------------------------------------


def test_a_mains_context_survives_a_restart_and_it_comes_back_dormant(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    log = MainLog()
    agent = Agent("agent", {"chat": log})
    node = open_node(store_path, agent)
    main = node.main("agent", "telegram:dm:42")
    assert main.send("hello") is None
    settle(node)
    assert contents(stored(node, main.session_id).context) == ["hello"]  # after every cycle
    assert main.send("again") is None
    settle(node)
    record = stored(node, main.session_id)
    assert contents(record.context) == ["hello", "again"]
    assert node.store is not None
    assert node.store.inbox(main.session_id) == []  # both cycles ran: nothing left to replay
    shut(node)

    node = open_node(store_path, agent)
    assert node.recovery.figures["mains"] == 1
    same = node.main("agent", "telegram:dm:42")
    assert same.session_id == main.session_id
    # dormant: listed and readable, yet nothing runs for it
    assert [info.session_id for info in node.sessions()] == [main.session_id]
    assert node.get(same).state is SessionState.ACTIVE
    assert node.stats()["indexed_sessions"] == 0
    with pytest.raises(UnknownSessionError):
        node.inspect(same, lambda core: core.context)
    assert node.stats()["indexed_sessions"] == 0
    assert same.send("third") is None
    settle(node)
    assert log.cycles[-1] == ("third", True, ["hello", "again"])
    assert node.stats()["indexed_sessions"] == 1
    assert node.inspect(same, lambda core: contents(core.context)) == ["hello", "again", "third"]
    assert contents(stored(node, main.session_id).context) == ["hello", "again", "third"]


def test_another_key_gets_a_new_main_after_a_restart(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    agent = Agent("agent", {"chat": MainLog()})
    node = open_node(store_path, agent)
    first = node.main("agent", "telegram:dm:1").session_id
    shut(node)
    node = open_node(store_path, agent)
    other = node.main("agent", "telegram:dm:2").session_id
    assert other != first
    shut(node)
    node = open_node(store_path, agent)
    assert node.recovery.figures["mains"] == 2
    assert node.main("agent", "telegram:dm:1").session_id == first
    assert node.main("agent", "telegram:dm:2").session_id == other


# -- 2. Suspended branches -------------------------------------------------------


def make_research_agent(log: MainLog, runs: list[bool]) -> Agent:
    """A Main that spawns ``research`` (or ``research_async``) on "go" ("go_async")."""

    def research(session: Any) -> Any:
        runs.append(session.resumed)
        if session.resumed:
            seen = [m.content for m in session.conversation.context()]
            return Outcome(summary="resumed", artifacts={"context": seen})
        session.add_message("assistant", "read chapter 1")
        session.sleep(10_000)  # parks here when suspended
        return "finished without a restart"

    async def research_async(session: Any) -> Any:
        runs.append(session.resumed)
        if session.resumed:
            seen = [m.content for m in session.conversation.context()]
            return Outcome(summary="resumed", artifacts={"context": seen})
        await session.add_message("assistant", "read chapter 1")
        await session.sleep(10_000)
        return "finished without a restart"

    def main(session: Any) -> None:
        log(session)
        message = session.message
        if isinstance(message, str) and message.startswith("go") and not session.resumed:
            skill = "research" + message.removeprefix("go")
            session.spawn(kind="branch", skill=skill, task="read the book", ttl=86_400.0)

    return Agent("agent", {"main": main, "research": research, "research_async": research_async})


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "sync" else "_async"


def only_branch(node: Node) -> uuid.UUID:
    (branch,) = node.sessions(kind=SessionKind.BRANCH)
    return branch.session_id


def test_a_branch_parked_by_shutdown_runs_again_by_itself_after_restart(
    open_node: Callable[..., Node], store_path: pathlib.Path, flavour: str
) -> None:
    log, runs = MainLog(), []
    agent = make_research_agent(log, runs)
    node = open_node(store_path, agent, grace=5.0)
    main = node.main("agent")
    main.send("go" + flavour)
    settle(node)
    branch = only_branch(node)
    assert node.get(branch).state is SessionState.ACTIVE
    shut(node)
    with Store(store_path) as store:  # what the shutdown left
        record = store.session(branch)
        assert record is not None
        assert record.info.state is SessionState.SUSPENDED
        assert record.resume is True
        assert said(record, store) == ["read chapter 1"]

    node = open_node(store_path, agent, grace=5.0)
    assert node.recovery.figures["suspended"] == 1
    result = node.wait(branch, WAIT)
    assert result is not None
    assert result.status is SessionState.COMPLETED
    assert result.summary == "resumed"
    assert result.artifacts == {"context": ["read chapter 1"]}
    assert runs == [False, True]
    settle(node)
    assert log.result_cycles(branch) == 1
    assert [r.session_id for r in node.results(main)] == [branch]
    shut(node)

    node = open_node(store_path, agent, grace=5.0)  # nothing is owed any more
    assert node.recovery.figures.get("outbox", 0) == 0
    assert node.recovery.figures.get("suspended", 0) == 0
    before = len(log.cycles)
    node.main("agent").send("ping")
    settle(node)
    assert log.messages[before:] == ["ping"]
    assert [r.session_id for r in node.results(main)] == [branch]
    assert node.get(branch).state is SessionState.COMPLETED
    assert runs == [False, True]


def test_an_explicitly_suspended_branch_stays_suspended_until_resumed(
    open_node: Callable[..., Node], store_path: pathlib.Path, flavour: str
) -> None:
    log, runs = MainLog(), []
    agent = make_research_agent(log, runs)
    node = open_node(store_path, agent, grace=5.0)
    main = node.main("agent")
    main.send("go" + flavour)
    settle(node)
    branch = node.ref(only_branch(node))
    assert branch.suspend() is None
    settle(node)
    assert branch.state is SessionState.SUSPENDED
    record = stored(node, branch.session_id)
    assert record.info.state is SessionState.SUSPENDED
    assert record.resume is False
    assert node.store is not None
    assert said(record, node.store) == ["read chapter 1"]
    shut(node)

    node = open_node(store_path, agent, grace=5.0)
    assert node.recovery.figures["suspended"] == 1
    settle(node)
    assert node.get(branch.session_id).state is SessionState.SUSPENDED
    assert runs == [False]  # not run again by itself
    assert node.resume(branch.session_id) is None
    result = node.wait(branch.session_id, WAIT)
    assert result is not None
    assert result.summary == "resumed"
    assert result.artifacts == {"context": ["read chapter 1"]}
    assert runs == [False, True]
    settle(node)
    assert log.result_cycles(branch.session_id) == 1
    assert [r.session_id for r in node.results(main)] == [branch.session_id]


def test_a_suspended_branch_restored_but_cancelled_ends_without_running(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    log, runs = MainLog(), []
    agent = make_research_agent(log, runs)
    node = open_node(store_path, agent, grace=5.0)
    node.main("agent").send("go")
    settle(node)
    branch = node.ref(only_branch(node))
    branch.suspend()
    settle(node)
    shut(node)

    node = open_node(store_path, agent, grace=5.0)
    assert node.cancel(branch.session_id) is None
    result = node.wait(branch.session_id, WAIT)
    assert result is not None
    assert result.status is SessionState.CANCELLED
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    settle(node)
    assert runs == [False]
    assert log.result_cycles(branch.session_id) == 1


def test_a_branch_asked_to_suspend_before_the_shutdown_is_waited_for_and_stays_suspended(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    started, gate = threading.Event(), threading.Event()

    def blocks(session: Any) -> str:
        if session.resumed:
            return "resumed"
        session.checkpoint()
        started.set()
        gate.wait(WAIT)  # "in a model call": the suspension waits for the next checkpoint
        session.checkpoint()
        return "never parked"

    def wraps_up(session: Any) -> str:
        try:
            session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "finished"

    agent = Agent("agent", {"main": MainLog(), "blocks": blocks, "wraps_up": wraps_up})
    node = open_node(store_path, agent, grace=5.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="blocks").ref
    worker = main.spawn(kind="worker", skill="wraps_up").ref
    assert started.wait(WAIT)
    assert branch.suspend() is None

    def release_when_closing(event: Event) -> None:
        # The shutdown cancelled the worker; as it ends, the branch may go on to park.
        if event.session_id == worker.session_id and event.state == "cancelled":
            gate.set()

    node.subscribe(release_when_closing)
    try:
        shut(node)
    finally:
        gate.set()
    final = {info.session_id: info.state for info in node.final_sessions}
    assert final[branch.session_id] is SessionState.SUSPENDED  # parked within the grace

    node = open_node(store_path, agent, grace=5.0)
    assert node.recovery.figures["suspended"] == 1
    settle(node)
    assert node.get(branch.session_id).state is SessionState.SUSPENDED  # waits for resume
    assert node.resume(branch.session_id) is None
    assert node.wait(branch.session_id, WAIT).summary == "resumed"


# -- 3. Results owed across a restart ------------------------------------------------


def test_a_result_the_main_had_not_yet_taken_is_delivered_once_after_restart(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    log = MainLog()
    blocked, gate = threading.Event(), threading.Event()
    children: list[uuid.UUID] = []

    def main(session: Any) -> None:
        log(session)
        if session.message == "spawn" and not session.resumed:
            spawned = session.spawn(kind="worker", skill="finished", task="quick")
            children.append(spawned.session_id)
            blocked.set()
            gate.wait(WAIT)  # "in a model call" while the child's result arrives

    agent = Agent("agent", {"main": main, "finished": finished})
    node = open_node(store_path, agent, grace=0.0)
    try:
        main_ref = node.main("agent")
        main_ref.send("spawn")
        assert blocked.wait(WAIT)
        (child,) = children
        result = node.wait(child, WAIT)  # its terminal write (and the outbox entry) is durable
        assert result is not None
        assert result.status is SessionState.COMPLETED
        assert log.result_cycles(child) == 0  # the Main's cycle for it has not run
        shut(node)
    finally:
        gate.set()  # the abandoned cycle ends; its node is gone

    node = open_node(store_path, agent)
    assert node.recovery.figures["outbox"] == 1
    assert node.recovery.figures["inbox"] == 1  # "spawn" never finished its cycle: replayed
    settle(node)
    assert log.result_cycles(child) == 1
    assert log.messages.count("spawn") == 2
    assert [r.session_id for r in node.results(main_ref)] == [child]
    assert node.store is not None
    node.store.flush()
    assert list(node.store.outbox()) == []  # the Main's snapshot recorded its receipt
    shut(node)

    node = open_node(store_path, agent)
    assert node.recovery.figures.get("outbox", 0) == 0
    assert node.recovery.figures.get("inbox", 0) == 0
    before = len(log.cycles)
    node.main("agent").send("ping")
    settle(node)
    assert log.messages[before:] == ["ping"]
    assert log.result_cycles(child) == 1


def test_a_worker_cancelled_by_the_shutdown_reaches_its_main_once_after_restart(
    open_node: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    # Its result arrives while the node closes; a Main cycle started then could
    # end after the Cortex stopped and run again after the restart.
    def wraps_up(session: Any) -> str:
        try:
            session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "finished"

    for attempt in range(5):
        log = MainLog()
        agent = Agent("agent", {"main": log, "wraps_up": wraps_up})
        path = tmp_path / f"store-{attempt}"
        node = open_node(path, agent)
        main = node.main("agent")
        worker = main.spawn(kind="worker", skill="wraps_up").ref
        settle(node)
        shut(node)
        final = {info.session_id: info.state for info in node.final_sessions}
        assert final[worker.session_id] is SessionState.CANCELLED

        node = open_node(path, agent)
        settle(node)
        assert log.result_cycles(worker.session_id) == 1
        (result,) = node.results(main)
        assert result.status is SessionState.CANCELLED
        assert result.summary == "partial"
        shut(node)


def test_a_branch_parked_by_shutdown_gets_its_cancelled_workers_result_once(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    runs: list[bool] = []

    def wraps_up(session: Any) -> str:
        try:
            session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "finished"

    def lead(session: Any) -> Any:
        runs.append(session.resumed)
        if session.resumed:
            return {"got": [r.summary for r in session.results()]}
        session.spawn(kind="worker", skill="wraps_up")
        session.collect(timeout=10_000)  # parks here on shutdown
        return "never restarted"

    log = MainLog()
    agent = Agent("agent", {"main": log, "lead": lead, "wraps_up": wraps_up})
    node = open_node(store_path, agent)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="lead").ref
    settle(node)
    shut(node)
    final = {info.session_id: info.state for info in node.final_sessions}
    assert final[branch.session_id] is SessionState.SUSPENDED
    (worker,) = [sid for sid, state in final.items() if state is SessionState.CANCELLED]

    node = open_node(store_path, agent)
    result = node.wait(branch.session_id, WAIT)
    assert result is not None
    assert result.artifacts == {"got": ["partial"]}
    assert runs == [False, True]
    assert [r.session_id for r in node.results(branch.session_id)] == [worker]
    settle(node)
    assert log.result_cycles(branch.session_id) == 1
    assert log.result_cycles(worker) == 0  # a worker's result goes to its own parent only


def test_ttl_keeps_counting_while_the_node_is_down(
    open_node: Callable[..., Node], store_path: pathlib.Path, clock: VirtualClock
) -> None:
    log, runs = MainLog(), []
    agent = make_research_agent(log, runs)
    node = open_node(store_path, agent, grace=5.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="research", ttl=100.0).ref
    settle(node)
    clock.advance(10.0)
    branch.suspend()
    settle(node)
    shut(node)
    clock.advance(50.0)  # down for 50 s of wall-clock time

    node = open_node(store_path, agent, grace=5.0)
    settle(node)  # recovery applied: the TTL timer runs from now on
    clock.advance(39.9)
    settle(node)
    assert node.get(branch.session_id).state is SessionState.SUSPENDED
    clock.advance(0.1)
    result = node.wait(branch.session_id, WAIT)
    assert result is not None
    assert result.status is SessionState.EXPIRED
    assert result.error is not None
    assert result.error.code is ErrorCode.TTL_EXPIRED
    settle(node)
    assert runs == [False]
    assert log.result_cycles(branch.session_id) == 1


def test_a_suspended_branch_whose_skill_is_gone_ends_cancelled_and_its_main_is_told(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    log, runs = MainLog(), []
    agent = make_research_agent(log, runs)
    node = open_node(store_path, agent, grace=5.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="research").ref
    settle(node)
    branch.suspend()
    settle(node)
    shut(node)

    without = Agent("agent", {"main": log})  # the skill was removed before the restart
    node = open_node(store_path, without)
    assert node.recovery.figures["orphans_cancelled"] == 1
    settle(node)
    result = node.result(branch.session_id)
    assert result is not None
    assert result.status is SessionState.CANCELLED
    assert result.error is not None
    assert result.error.code is ErrorCode.PARENT_TERMINATED
    assert log.result_cycles(branch.session_id) == 1
    assert runs == [False]


def test_an_ended_main_is_read_from_the_store_and_its_key_gets_a_new_main(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    agent = Agent("agent", {"main": MainLog()})
    node = open_node(store_path, agent)
    old = node.main("agent")
    assert old.cancel() is None
    assert old.wait(WAIT).status is SessionState.CANCELLED
    shut(node)

    node = open_node(store_path, agent)
    assert node.recovery.figures.get("mains", 0) == 0
    assert node.get(old.session_id).state is SessionState.CANCELLED
    new = node.main("agent")
    assert new.session_id != old.session_id
    shut(node)
    node = open_node(store_path, agent)
    assert node.main("agent").session_id == new.session_id


def test_a_spawn_under_a_dormant_main_wakes_it_and_the_result_reaches_it(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    log = MainLog()
    agent = Agent("agent", {"main": log, "finished": finished})
    node = open_node(store_path, agent)
    main = node.main("agent").session_id
    shut(node)
    node = open_node(store_path, agent)
    child = node.spawn(main, kind="branch", skill="finished").ref
    assert child.wait(WAIT).summary == "done"
    settle(node)
    assert log.result_cycles(child.session_id) == 1
    assert [r.session_id for r in node.results(main)] == [child.session_id]


def test_the_awaitable_twins_answer_once_written(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    log = MainLog()
    node = open_node(store_path, Agent("agent", {"main": log, "finished": finished}))

    async def drive() -> tuple[Any, Any, Any]:
        main = await node.amain("agent")
        spawned = await node.aspawn(main, kind="branch", skill="finished")
        result = await node.await_result(spawned.session_id, WAIT)
        assert await node.asend(main, "hello") is None
        return main, spawned, result

    main, spawned, result = asyncio.run(drive())
    assert result.summary == "done"
    assert store_path.joinpath("data.mdb").exists()
    assert node.store is not None
    assert node.store.main_of("agent", "internal:main:main") == main.session_id
    assert node.store.session(spawned.session_id).info.state is SessionState.COMPLETED
    settle(node)
    assert "hello" in log.messages


# -- 4. Workers ------------------------------------------------------------------------


def test_workers_are_stored_with_identity_and_state_only(
    open_node: Callable[..., Node], store_path: pathlib.Path, clock: VirtualClock
) -> None:
    def working(session: Any) -> str:
        session.add_message("assistant", "private notes")
        session.sleep(1.0)
        return "done"

    agent = Agent("agent", {"main": MainLog(), "working": working})
    node = open_node(store_path, agent)
    main = node.main("agent")
    spec = {
        "skill": "working",
        "task": "secret task",
        "context_summary": "secret summary",
        "metadata": {"customer": "acme"},
    }
    worker = main.spawn(kind="worker", **spec).ref
    branch = main.spawn(kind="branch", **spec).ref
    settle(node)
    for ref in (worker, branch):
        assert ref is not None
        assert ref.info().task == "secret task"  # the live node keeps it in memory

    record = stored(node, worker.session_id)
    assert record.context is None
    assert record.info.session_id == worker.session_id
    assert record.info.parent_id == main.session_id
    assert record.info.kind is SessionKind.WORKER
    assert record.info.state is SessionState.PENDING  # written at spawn, then at its end
    assert (record.info.task, record.info.context_summary, record.info.metadata) == ("", "", {})

    clock.advance(1.0)
    assert worker.wait(WAIT).status is SessionState.COMPLETED
    assert branch.wait(WAIT).status is SessionState.COMPLETED
    record = stored(node, worker.session_id)
    assert record.info.state is SessionState.COMPLETED
    assert record.context is None
    assert (record.info.task, record.info.context_summary, record.info.metadata) == ("", "", {})
    # a branch keeps its task and its context at its end
    kept = stored(node, branch.session_id)
    assert kept.info.task == "secret task"
    assert node.store is not None
    assert said(kept, node.store) == ["private notes"]
    # the worker's notes lived in memory only: its branch is in no store
    state, _ = node.store.conversation_read(main.session_id)
    assert state is not None
    assert worker.session_id not in {b.session_id for b in state.branches}


# -- 5. Recovery of what a crash left -------------------------------------------------------


def _info(
    kind: SessionKind,
    state: SessionState,
    *,
    parent: SessionInfo | None = None,
    skill: str = "work",
    key: str | None = None,
    now: float,
) -> SessionInfo:
    return SessionInfo(
        session_id=new_session_id(),
        agent_id="agent",
        parent_id=parent.session_id if parent else None,
        kind=kind,
        state=state,
        depth=parent.depth + 1 if parent else 0,
        created_at=now - 60.0,
        ttl=None,
        deadline=None,
        task="" if kind is SessionKind.WORKER else "a task",
        model_tier="large",
        skill=skill,
        key=key,
    )


def _crash_result(info: SessionInfo) -> SessionResult:
    return SessionResult(
        session_id=info.session_id,
        status=SessionState.COMPLETED,
        parent_id=info.parent_id,
        kind=info.kind,
        summary="finished before the crash",
    )


def test_what_was_running_at_a_crash_ends_failed_and_every_parent_is_told_once(
    open_node: Callable[..., Node], store_path: pathlib.Path, clock: VirtualClock
) -> None:
    now = clock.time()
    main = _info(
        SessionKind.MAIN, SessionState.ACTIVE, skill="main", key="internal:main:main", now=now
    )
    running = _info(SessionKind.BRANCH, SessionState.ACTIVE, parent=main, now=now)
    waiting = _info(SessionKind.WORKER, SessionState.PENDING, parent=main, now=now)
    done = _info(SessionKind.BRANCH, SessionState.COMPLETED, parent=main, now=now)
    under_running = _info(SessionKind.WORKER, SessionState.ACTIVE, parent=running, now=now)
    orphan = _info(SessionKind.BRANCH, SessionState.SUSPENDED, parent=running, now=now)
    under_done = _info(SessionKind.WORKER, SessionState.ACTIVE, parent=done, now=now)
    done_result = _crash_result(done)

    with Store(store_path) as store:
        batch = WriteBatch()
        context = ContextRecord(messages=[ContextEntry(role="user", content="before the crash")])
        batch.session(SessionRecord(info=main, context=context))
        batch.main("agent", "internal:main:main", main.session_id)
        for info in (running, waiting, done, under_running, orphan, under_done):
            assert info.parent_id is not None
            batch.link(info.parent_id, info.session_id)
            branch_context = None if info.kind is SessionKind.WORKER else ContextRecord()
            result = done_result if info is done else None
            batch.session(SessionRecord(info=info, context=branch_context, result=result))
        batch.owe(main.session_id, done_result)  # ended, its receipt never written
        store.write(batch)

    log = MainLog()
    agent = Agent("agent", {"main": log, "work": finished})
    node = open_node(store_path, agent)
    figures = node.recovery.figures
    assert figures["mains"] == 1
    assert figures["failed"] == 4
    assert figures["orphans_cancelled"] == 1
    assert figures["outbox"] == 1
    assert figures["terminal"] == 1
    assert figures.get("suspended", 0) == 0
    settle(node)

    for info in (running, waiting, under_running, under_done):
        result = node.result(info.session_id)
        assert result is not None, info.kind
        assert result.status is SessionState.FAILED
        assert result.error is not None
        assert result.error.code is ErrorCode.NODE_RESTARTED
        assert node.get(info.session_id).state is SessionState.FAILED
    cancelled = node.result(orphan.session_id)
    assert cancelled is not None
    assert cancelled.status is SessionState.CANCELLED
    assert cancelled.error is not None
    assert cancelled.error.code is ErrorCode.PARENT_TERMINATED
    assert node.get(orphan.session_id).state is SessionState.CANCELLED

    # the Main came back and ran one cycle per result owed to it
    for child in (running, waiting, done):
        assert log.result_cycles(child.session_id) == 1
    assert len(log.cycles) == 3
    assert all(resumed for _, resumed, _ in log.cycles)
    assert all(context == ["before the crash"] for _, _, context in log.cycles)
    assert {r.session_id for r in node.results(main.session_id)} == {
        running.session_id,
        waiting.session_id,
        done.session_id,
    }
    # results owed to parents that did not come back are filed on them
    assert {r.session_id for r in node.results(running.session_id)} == {
        under_running.session_id,
        orphan.session_id,
    }
    assert [r.session_id for r in node.results(done.session_id)] == [under_done.session_id]
    tree = node.tree(main.session_id)
    assert {c["info"].session_id for c in tree["children"]} == {
        running.session_id,
        waiting.session_id,
        done.session_id,
    }
    assert node.store is not None
    node.store.flush()
    assert list(node.store.outbox()) == []
    shut(node)

    node = open_node(store_path, agent)  # a second restart owes nothing
    assert node.recovery.figures.get("failed", 0) == 0
    assert node.recovery.figures.get("outbox", 0) == 0
    assert node.recovery.figures["terminal"] == 6
    node.main("agent").send("ping")
    settle(node)
    assert log.messages[3:] == ["ping"]
    assert len(node.results(main.session_id)) == 3


def test_recovery_runs_every_resumed_branch_and_queued_message_once(
    open_node: Callable[..., Node], tmp_path: pathlib.Path, clock: VirtualClock
) -> None:
    # Recovery starts them at once, as the node starts: each run's end must reach
    # the Cortex (once a run reported to a Node that had no Cortex reference yet).
    log = MainLog()
    agent = Agent("agent", {"main": log, "work": finished})
    for attempt in range(3):
        path = tmp_path / f"store-{attempt}"
        now = clock.time()
        main = _info(
            SessionKind.MAIN, SessionState.ACTIVE, skill="main", key="internal:main:main", now=now
        )
        branches = [
            _info(SessionKind.BRANCH, SessionState.SUSPENDED, parent=main, now=now)
            for _ in range(5)
        ]
        with Store(path) as store:
            batch = WriteBatch()
            batch.session(SessionRecord(info=main, context=ContextRecord()))
            batch.main("agent", "internal:main:main", main.session_id)
            for info in branches:
                batch.session(SessionRecord(info=info, context=ContextRecord(), resume=True))
                batch.link(main.session_id, info.session_id)
            for seq in range(5):
                record = InboxRecord(
                    session_id=main.session_id, seq=seq, message=f"m{seq}", received_at=now
                )
                batch.inbox(record)
            store.write(batch)
        log.cycles.clear()

        node = open_node(path, agent)
        settle(node)
        for info in branches:
            result = node.result(info.session_id)
            assert result is not None
            assert result.summary == "done"
            assert log.result_cycles(info.session_id) == 1
        assert [m for m in log.messages if isinstance(m, str)] == [f"m{i}" for i in range(5)]
        shut(node)


# -- 6. Unreadable records --------------------------------------------------------


def test_unreadable_records_are_quarantined_and_the_rest_loads(
    open_node: Callable[..., Node], store_path: pathlib.Path, clock: VirtualClock
) -> None:
    now = clock.time()
    main = _info(
        SessionKind.MAIN, SessionState.ACTIVE, skill="main", key="internal:main:main", now=now
    )
    future = _info(SessionKind.MAIN, SessionState.ACTIVE, skill="main", now=now)
    garbage_id = new_session_id()
    with Store(store_path) as store:
        batch = WriteBatch()
        batch.session(SessionRecord(info=main, context=ContextRecord()))
        batch.main("agent", "internal:main:main", main.session_id)
        batch.raw("sessions", garbage_id.bytes, b"\xc1 this is not msgpack")
        batch.raw(
            "sessions", future.session_id.bytes, encode_record(SessionRecord(v=99, info=future))
        )
        for damaged in (garbage_id, future.session_id):  # records of live sessions, damaged
            batch.raw("live", damaged.bytes, b"")
        store.write(batch)

    node = open_node(store_path, Agent("agent", {"main": MainLog()}))
    assert node.recovery.figures["quarantined"] == 2
    assert node.recovery.figures["mains"] == 1
    assert node.store is not None
    quarantined = {(q.db, q.key): q.reason for q in node.store.quarantine_list()}
    assert set(quarantined) == {
        ("sessions", garbage_id.bytes),
        ("sessions", future.session_id.bytes),
    }
    assert "schema version 99" in quarantined["sessions", future.session_id.bytes]
    assert node.stats()["store_quarantined"] == 2
    assert node.main("agent").session_id == main.session_id
    assert [s.session_id for s in node.sessions()] == [main.session_id]
    for bad in (garbage_id, future.session_id):
        with pytest.raises(UnknownSessionError):
            node.get(bad)


def test_a_corrupt_inbox_record_is_quarantined_and_the_rest_of_the_inbox_runs(
    open_node: Callable[..., Node], store_path: pathlib.Path, clock: VirtualClock
) -> None:
    main = _info(
        SessionKind.MAIN,
        SessionState.ACTIVE,
        skill="main",
        key="internal:main:main",
        now=clock.time(),
    )
    bad_key = main.session_id.bytes + (0).to_bytes(8, "big")
    with Store(store_path) as store:
        batch = WriteBatch()
        batch.session(SessionRecord(info=main, context=ContextRecord()))
        batch.main("agent", "internal:main:main", main.session_id)
        batch.raw("inbox", bad_key, b"\xc1")
        batch.inbox(InboxRecord(session_id=main.session_id, seq=1, message="kept", received_at=0.0))
        store.write(batch)

    log = MainLog()
    node = open_node(store_path, Agent("agent", {"main": log}))
    assert node.recovery.figures["quarantined"] == 1
    assert node.recovery.figures["inbox"] == 1
    settle(node)
    assert log.messages == ["kept"]
    assert node.store is not None
    assert [(q.db, q.key) for q in node.store.quarantine_list()] == [("inbox", bad_key)]
    assert node.main("agent").send("next") is None  # numbered after what came back
    settle(node)
    assert log.messages == ["kept", "next"]


def test_sessions_of_an_unregistered_agent_are_left_as_stored(
    open_node: Callable[..., Node], store_path: pathlib.Path, clock: VirtualClock
) -> None:
    now = clock.time()
    main = _info(
        SessionKind.MAIN, SessionState.ACTIVE, skill="main", key="internal:main:main", now=now
    )
    child = _info(SessionKind.BRANCH, SessionState.SUSPENDED, parent=main, now=now)
    with Store(store_path) as store:
        batch = WriteBatch()
        for info in (main, child):
            batch.session(SessionRecord(info=info, context=ContextRecord()))
        batch.link(main.session_id, child.session_id)
        batch.main("agent", "internal:main:main", main.session_id)
        store.write(batch)

    node = open_node(store_path, Agent("other", {"main": MainLog()}))
    assert node.recovery.figures["unknown_agent"] == 2
    assert node.sessions() == []
    assert node.get(child.session_id).state is SessionState.SUSPENDED
    assert node.store is not None
    assert node.store.session(child.session_id) is not None
    shut(node)
    node = open_node(store_path, Agent("agent", {"main": MainLog(), "work": finished}))
    assert node.recovery.figures["mains"] == 1
    assert node.recovery.figures["suspended"] == 1
    assert node.main("agent").session_id == main.session_id


# -- 7. A full map ------------------------------------------------------------------


def test_a_full_map_refuses_spawns_cleanly_until_the_store_grows(
    open_node: Callable[..., Node],
    store_path: pathlib.Path,
    make_store: Callable[..., Store],
    clock: VirtualClock,
) -> None:
    def short(session: Any) -> str:
        session.sleep(1.0)
        return "short"

    store = make_store(store_path, map_size=1 << 18)
    agent = Agent("agent", {"main": MainLog(), "short": short}, max_children=64)
    node = open_node(store, agent)
    main = node.main("agent")
    spawned = []
    refusal = None
    for _ in range(60):
        answer = main.spawn(kind="branch", skill="short", task="x" * 16_000)
        if not answer.ok:
            refusal = answer.error
            break
        spawned.append(answer.session_id)
    assert refusal is not None, "the map never filled"
    assert spawned
    assert refusal.code is ErrorCode.STORE_FULL
    refused_id = uuid.UUID(refusal.detail["session_id"])
    with pytest.raises(UnknownSessionError):
        node.get(refused_id)
    # reads go on; the refused spawn left no child anywhere
    branches = {s.session_id for s in node.sessions(kind=SessionKind.BRANCH)}
    assert branches == set(spawned)
    assert {c["info"].session_id for c in node.tree(main)["children"]} == set(spawned)
    assert set(store.children(main.session_id)) == set(spawned)
    assert node.get(main).state is SessionState.ACTIVE
    stats = node.stats()
    assert stats["store_store_full"] >= 1
    assert stats["live_sessions"] == len(spawned) + 1

    store.grow(1 << 23)
    again = main.spawn(kind="branch", skill="short", task="x" * 16_000)
    assert again.ok, again.error
    settle(node)
    clock.advance(1.0)
    for sid in [*spawned, again.session_id]:
        result = node.wait(sid, WAIT)
        assert result is not None
        assert result.status is SessionState.COMPLETED


# -- 8. Failing commits --------------------------------------------------------------


class FailingIO(StoreIO):
    """Every commit fails with EIO while ``failing`` is set, and so do the next
    ``fail_next(n)`` commits; ``hold`` makes commits wait until ``release``."""

    def __init__(self) -> None:
        self.failing = threading.Event()
        self.hold = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._fail_count = 0

    def fail_next(self, count: int) -> None:
        with self._lock:
            self._fail_count = count

    def commit(self, txn: lmdb.Transaction) -> None:
        if self.hold.is_set():
            self.release.wait(WAIT)
        with self._lock:
            counted = self._fail_count > 0
            self._fail_count -= counted
        if counted or self.failing.is_set():
            raise OSError(errno.EIO, "injected I/O error")
        super().commit(txn)


def failing_main(
    open_node: Callable[..., Node],
    store_path: pathlib.Path,
    make_store: Callable[..., Store],
    **skills: Callable[..., Any],
) -> tuple[FailingIO, Store, Node, Any]:
    """A node on a store whose commits fail while ``io.failing`` is set, and its
    settled Main (whose skill ``finished``, and ``skills``, children can run)."""
    io = FailingIO()
    store = make_store(store_path, io=io)
    agent = Agent("agent", {"main": MainLog(), "finished": finished, **skills})
    node = open_node(store, agent)
    main = node.main("agent")
    settle(node)
    return io, store, node, main


def test_a_failed_commit_refuses_the_spawn_and_the_node_goes_on(
    open_node: Callable[..., Node], store_path: pathlib.Path, make_store: Callable[..., Store]
) -> None:
    io, store, node, main = failing_main(open_node, store_path, make_store)
    errors_before = node.stats()["store_write_errors"]
    io.failing.set()
    refused = main.spawn(kind="branch", skill="finished")
    io.failing.clear()
    assert not refused.ok
    assert refused.error is not None
    assert refused.error.code is ErrorCode.STORE_FAILED
    assert "injected I/O error" in refused.error.message
    assert node.stats()["store_write_errors"] > errors_before
    assert store.stats()["write_errors"] >= 1
    assert node.sessions(kind=SessionKind.BRANCH) == []
    assert store.children(main.session_id) == []
    assert not node.closed

    spawned = main.spawn(kind="branch", skill="finished")
    assert spawned.ok, spawned.error
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert result.summary == "done"
    assert stored(node, spawned.session_id).info.state is SessionState.COMPLETED


def test_a_failed_commit_refuses_every_spawn_of_a_batch(
    open_node: Callable[..., Node], store_path: pathlib.Path, make_store: Callable[..., Store]
) -> None:
    io, store, node, main = failing_main(open_node, store_path, make_store)
    errors_before = node.stats()["store_write_errors"]
    io.failing.set()
    answers = main.spawn_many([SpawnSpec(kind=SessionKind.BRANCH, skill="finished")] * 3)
    io.failing.clear()
    assert [a.ok for a in answers] == [False] * 3
    for answer in answers:
        assert answer.error is not None
        assert answer.error.code is ErrorCode.STORE_FAILED
        assert "injected I/O error" in answer.error.message
    assert node.stats()["store_write_errors"] >= errors_before + 3  # one per child
    assert node.sessions(kind=SessionKind.BRANCH) == []
    assert store.children(main.session_id) == []
    settle(node)
    again = main.spawn_many([SpawnSpec(kind=SessionKind.BRANCH, skill="finished")] * 2)
    assert all(a.ok for a in again)
    for answer in again:
        result = answer.ref.wait(WAIT)
        assert result is not None
        assert result.summary == "done"


def test_a_main_whose_record_cannot_be_written_is_not_created(
    open_node: Callable[..., Node], store_path: pathlib.Path, make_store: Callable[..., Store]
) -> None:
    io = FailingIO()
    store = make_store(store_path, io=io)
    node = open_node(store, Agent("agent", {"main": MainLog()}))
    io.failing.set()
    with pytest.raises(StoreError) as raised:
        node.main("agent")
    io.failing.clear()
    assert raised.value.code is ErrorCode.STORE_FAILED
    assert node.sessions() == []
    main = node.main("agent")
    assert stored(node, main.session_id).info.kind is SessionKind.MAIN
    assert store.main_of("agent", "internal:main:main") == main.session_id


def test_a_skills_child_starts_while_its_record_commits(
    open_node: Callable[..., Node],
    store_path: pathlib.Path,
    make_store: Callable[..., Store],
    clock: VirtualClock,
) -> None:
    # The record still commits before anything the child writes, and the spawn
    # returns to the skill at once: nothing outside the process has its id. (A
    # branch: a worker a running branch spawns is not written at all.)
    started = threading.Event()
    answered = threading.Event()
    answers: list[Any] = []

    def child(session: Any) -> str:
        started.set()
        return "ran"

    def spawner(session: Any) -> str:
        session.sleep(1.0)
        answers.append(session.spawn(kind="branch", skill="child"))
        answered.set()
        session.collect()
        return "went on"

    io, store, node, main = failing_main(
        open_node, store_path, make_store, spawner=spawner, child=child
    )
    ref = main.spawn(kind="branch", skill="spawner").ref
    settle(node)
    io.hold.set()  # commits wait: the child's record is queued, not durable
    try:
        clock.advance(1.0)
        assert started.wait(WAIT), "the child did not start before its record was durable"
        assert answered.wait(WAIT), "the spawn waited for the record"
    finally:
        io.release.set()
    result = ref.wait(WAIT)
    assert result is not None
    assert result.summary == "went on"
    (answer,) = answers
    assert answer.ok, answer.error
    assert stored(node, answer.session_id).info.state is SessionState.COMPLETED
    assert store.children(ref.session_id) == [answer.session_id]


class PutOrder(StoreIO):
    """Records every put in the order the writer makes them (commit order)."""

    def __init__(self) -> None:
        self.puts: list[tuple[bytes, bytes]] = []

    def put(self, txn: lmdb.Transaction, db: Any, key: bytes, value: bytes) -> None:
        self.puts.append((bytes(key), bytes(value)))  # the writer thread only
        super().put(txn, db, key, value)


def test_what_an_early_child_writes_commits_after_its_record(
    open_node: Callable[..., Node],
    store_path: pathlib.Path,
    make_store: Callable[..., Store],
    clock: VirtualClock,
) -> None:
    # A skill's children start before their records are durable, but only once
    # those are queued: a child's own write can never commit ahead of its record.
    def writes(session: Any) -> str:
        session.memory_put("k", session.session_id.hex)
        return "wrote"

    async def spawner(session: Any) -> str:
        await session.spawn_many([SpawnSpec(kind=SessionKind.BRANCH, skill="writes")] * 16)
        await session.collect()
        return "done"

    io = PutOrder()
    store = make_store(store_path, io=io)
    agent = Agent(
        "agent", {"main": MainLog(), "writes": writes, "spawner": spawner}, max_children=32
    )
    node = open_node(store, agent)
    ref = node.main("agent").spawn(kind="branch", skill="spawner").ref
    result = ref.wait(WAIT)
    assert result is not None
    assert result.summary == "done"
    assert node.store is not None
    node.store.flush()
    children = {c["info"].session_id for c in node.tree(ref)["children"]}
    assert len(children) == 16
    first_record: dict[uuid.UUID, int] = {}
    memory_writes: dict[uuid.UUID, int] = {}
    for i, (key, value) in enumerate(io.puts):
        if len(key) == 16 and uuid.UUID(bytes=key) in children:
            first_record.setdefault(uuid.UUID(bytes=key), i)
            continue
        try:
            memory = decode_record(MemoryRecord, value, db="memory", key=key)
        except CorruptRecordError:
            continue
        if memory.session_id in children:
            memory_writes[memory.session_id] = i
    assert set(memory_writes) == children
    for child, at in memory_writes.items():
        assert first_record[child] < at, f"{child}'s memory write committed before its record"


def waits_a_minute(session: Any) -> str:
    session.sleep(60.0)
    return "never"


@pytest.mark.parametrize("how", ["spawn", "spawn_many"])
def test_a_skills_child_whose_record_cannot_be_written_ends_failed_with_the_stores_code(
    open_node: Callable[..., Node],
    store_path: pathlib.Path,
    make_store: Callable[..., Store],
    clock: VirtualClock,
    how: str,
) -> None:
    answers: list[Any] = []
    collected: list[Any] = []

    def spawner(session: Any) -> str:
        session.sleep(1.0)
        if how == "spawn":
            answers.append(session.spawn(kind="branch", skill="waits"))
        else:
            answers.extend(
                session.spawn_many([SpawnSpec(kind=SessionKind.BRANCH, skill="waits")] * 3)
            )
        collected.extend(session.collect())
        return "went on"

    io, _store, node, main = failing_main(
        open_node, store_path, make_store, spawner=spawner, waits=waits_a_minute
    )
    ref = main.spawn(kind="branch", skill="spawner").ref
    settle(node)
    errors_before = node.stats()["store_write_errors"]
    io.fail_next(1)  # the children's records (one commit), and nothing else
    clock.advance(1.0)
    result = ref.wait(WAIT)
    assert result is not None
    assert result.summary == "went on"
    assert all(a.ok for a in answers)  # they ran: the spawn answers the children
    assert {c.session_id for c in collected} == {a.session_id for a in answers}
    for entry in collected:
        child = entry.result
        assert child is not None
        assert child.status is SessionState.FAILED
        assert child.error is not None
        assert child.error.code is ErrorCode.STORE_FAILED
        assert str(entry.session_id) in child.error.message
        assert node.get(entry.session_id).state is SessionState.FAILED
    assert node.stats()["store_write_errors"] >= errors_before + len(answers)  # one each


@pytest.mark.parametrize("failing", ["its record", "every write"])
def test_a_run_whose_record_cannot_be_written_returns_the_refusal(
    open_node: Callable[..., Node],
    store_path: pathlib.Path,
    make_store: Callable[..., Store],
    clock: VirtualClock,
    failing: str,
) -> None:
    # A run's fresh session starts at once; its caller sees only its result,
    # here the store's refusal (as a refused spawn), never a raise.
    io, store, node, main = failing_main(open_node, store_path, make_store, waits=waits_a_minute)
    if failing == "its record":
        io.fail_next(1)
    else:
        io.failing.set()
    try:
        result = main.run(kind="branch", skill="waits")
    finally:
        io.failing.clear()
    assert result is not None
    assert result.status is SessionState.FAILED
    assert result.error is not None
    assert result.error.code is ErrorCode.STORE_FAILED
    child = uuid.UUID(result.error.detail["session_id"])
    assert node.get(child).state is SessionState.FAILED  # it ran, and was ended
    if failing == "its record":  # its end committed, with its link under the Main
        assert stored(node, child).info.state is SessionState.FAILED
        assert child in store.children(main.session_id)


def test_a_spawn_repeated_while_the_first_record_fails_gets_the_child_that_ran(
    open_node: Callable[..., Node],
    store_path: pathlib.Path,
    make_store: Callable[..., Store],
    clock: VirtualClock,
) -> None:
    got: list[Any] = []
    started = threading.Event()

    def waits(session: Any) -> str:
        started.set()
        session.sleep(60.0)
        return "never"

    def spawner(session: Any) -> str:
        session.sleep(1.0)
        got.append(session.spawn(kind="branch", skill="waits", request_id="once"))
        session.sleep(1.0)  # its own end is written after the child's record failed
        return "went on"

    io, _store, node, main = failing_main(
        open_node, store_path, make_store, spawner=spawner, waits=waits
    )
    ref = main.spawn(kind="branch", skill="spawner").ref
    settle(node)
    spec = SpawnSpec(kind=SessionKind.BRANCH, skill="waits", request_id="once")
    again = Reply()
    io.hold.set()
    io.fail_next(1)  # the child's record, held until released
    try:
        clock.advance(1.0)
        assert started.wait(WAIT), "the child did not start while its record was held"
        node._send(SpawnMany(ref.session_id, (spec,)), again)  # the repeat, not waited on
        node.get(ref)  # answered after the repeat: the Cortex takes its mailbox in order
        # the skill's own spawn was answered at once; a repeat from outside the
        # skill waits for the first record
        assert not again.done
    finally:
        io.release.set()
    (repeat,) = node._all_spawned(again.get(WAIT))
    ended = None
    for _ in range(3):  # its second sleep may be armed just after an advance: then one more
        clock.advance(1.0)
        ended = ref.wait(WAIT / 5)
        if ended is not None:
            break
    assert ended is not None
    (first,) = got
    assert first.ok, first.error
    assert repeat.ok, repeat.error
    assert repeat.existing
    assert repeat.session_id == first.session_id
    assert node.get(first.session_id).state is SessionState.FAILED


def test_a_session_is_not_forgotten_before_its_ending_is_durable(
    open_node: Callable[..., Node],
    store_path: pathlib.Path,
    make_store: Callable[..., Store],
    clock: VirtualClock,
) -> None:
    # Evicted sessions are read from the store, which must not show an older state.
    def short(session: Any) -> str:
        session.sleep(1.0)
        return "short"

    def parent(session: Any) -> None:
        session.sleep(3600.0)  # receives the results without a Main's cycle (which waits
        # for its start to be durable)

    io = FailingIO()
    store = make_store(store_path, io=io)
    agent = Agent("agent", {"main": MainLog(), "short": short, "parent": parent})
    node = open_node(store, agent, retain_terminal=1)
    main = node.main("agent")
    holder = main.spawn(kind="branch", skill="parent").ref
    assert holder is not None
    refs = [holder.spawn(kind="branch", skill="short").ref for _ in range(3)]
    settle(node)
    io.hold.set()  # the endings are queued, not yet durable
    try:
        clock.advance(1.0)
        settle(node)
        for ref in refs:
            assert node.get(ref.session_id).state is SessionState.COMPLETED
            assert node.result(ref.session_id) is not None
    finally:
        io.release.set()
    for ref in refs:
        result = node.wait(ref.session_id, WAIT)
        assert result is not None
        assert result.summary == "short"
    assert all(stored(node, r.session_id).info.state is SessionState.COMPLETED for r in refs)


# -- 9. One node per directory ------------------------------------------------------


def test_a_second_node_on_the_same_directory_is_refused(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    agent = Agent("agent", {"main": MainLog()})
    node = open_node(store_path, agent)
    main = node.main("agent").session_id
    with pytest.raises(StoreLockedError, match="already open in this process"):
        Node([agent], store=store_path)
    assert node.main("agent").session_id == main  # the first node is untouched
    shut(node)
    node = open_node(store_path, agent)  # released by the shutdown
    assert node.main("agent").session_id == main


def test_a_node_in_another_process_is_refused_naming_the_holder(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    open_node(store_path, Agent("agent", {"main": MainLog()}))
    script = (
        "import sys\n"
        "from sessiontree.protocol import StoreLockedError\n"
        "from sessiontree.supervision import Node\n"
        "try:\n"
        "    Node(store=sys.argv[1])\n"
        "except StoreLockedError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(store_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert f"pid {os.getpid()}" in done.stdout


# -- 10. Shared memory ------------------------------------------------------------------


def make_memory_agent(seen: dict[str, Any]) -> Agent:
    def writer(session: Any) -> Outcome:
        memory_id = session.memory_put("facts", ["sky is blue"])
        return Outcome(summary="wrote", memory_ids=(memory_id,))

    def reader(session: Any) -> dict[str, Any]:
        return {"facts": session.memory_get("facts")}

    def worker_writes(session: Any) -> str:
        try:
            session.memory_put("notes", "workers never write")
        except NotAllowedError as exc:
            seen["worker"] = exc.code
            return "refused"
        return "wrote"

    def unstorable(session: Any) -> str:
        try:
            session.memory_put("bad", object())
        except RejectedInputError as exc:
            seen["unstorable"] = exc.field
            return "refused"
        return "stored"

    async def async_writer(session: Any) -> Outcome:
        memory_id = await session.memory_put("async-facts", {"n": 1})
        return Outcome(memory_ids=(memory_id,))

    skills = {
        "main": MainLog(),
        "writer": writer,
        "reader": reader,
        "worker_writes": worker_writes,
        "unstorable": unstorable,
        "async_writer": async_writer,
    }
    return Agent("agent", skills)


def test_shared_memory_lives_in_the_store_and_survives_a_restart(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    seen: dict[str, Any] = {}
    agent = make_memory_agent(seen)
    node = open_node(store_path, agent)
    main = node.main("agent")
    wrote = main.run(kind="branch", skill="writer", timeout=WAIT)
    assert wrote is not None
    (memory_id,) = wrote.memory_ids
    read = main.run(kind="branch", skill="reader", timeout=WAIT)  # a sibling reads it
    assert read is not None
    assert read.artifacts == {"facts": ["sky is blue"]}
    async_wrote = main.run(kind="branch", skill="async_writer", timeout=WAIT)
    assert async_wrote is not None
    assert async_wrote.status is SessionState.COMPLETED, async_wrote.error
    (async_id,) = async_wrote.memory_ids
    assert node.memory.by_id(async_id) == {"n": 1}

    refused = main.run(kind="worker", skill="worker_writes", timeout=WAIT)
    assert refused is not None
    assert refused.summary == "refused"
    assert seen["worker"] is ErrorCode.NOT_ALLOWED
    unstorable = main.run(kind="branch", skill="unstorable", timeout=WAIT)
    assert unstorable is not None
    assert unstorable.summary == "refused"
    assert seen["unstorable"] == "value"
    assert node.store is not None
    assert node.store.memory("agent", "bad") is None
    assert node.store.memory("agent", "notes") is None
    shut(node)

    node = open_node(store_path, agent)
    assert node.memory.by_id(memory_id) == ["sky is blue"]
    assert node.memory.by_id(async_id) == {"n": 1}
    read = node.main("agent").run(kind="branch", skill="reader", timeout=WAIT)
    assert read is not None
    assert read.artifacts == {"facts": ["sky is blue"]}
    rewrote = node.main("agent").run(kind="branch", skill="writer", timeout=WAIT)
    assert rewrote is not None
    with pytest.raises(KeyError):
        node.memory.by_id(memory_id)  # replaced by the later write to the same key
    assert node.memory.by_id(rewrote.memory_ids[0]) == ["sky is blue"]


# -- 11. Context messages ------------------------------------------------------------------


def test_a_context_message_that_is_not_json_is_refused_in_the_skill(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    fields: list[str | None] = []

    def careful(session: Any) -> str:
        try:
            session.add_message("user", object())
        except RejectedInputError as exc:
            fields.append(exc.field)
        session.add_message("user", {"kept": [1, 2]})
        return "careful"

    async def careful_async(session: Any) -> str:
        try:
            await session.add_message("user", object())
        except RejectedInputError as exc:
            fields.append(exc.field)
        await session.add_message("user", "kept")
        return "careful"

    agent = Agent("agent", {"main": MainLog(), "careful": careful, "careful_async": careful_async})
    node = open_node(store_path, agent)
    main = node.main("agent")
    sync_ref = main.spawn(kind="branch", skill="careful").ref
    async_ref = main.spawn(kind="branch", skill="careful_async").ref
    for ref in (sync_ref, async_ref):
        result = ref.wait(WAIT)
        assert result is not None
        assert result.status is SessionState.COMPLETED, result.error
    assert fields == ["content", "content"]
    assert node.store is not None
    assert said(stored(node, sync_ref.session_id), node.store) == [{"kept": [1, 2]}]
    assert said(stored(node, async_ref.session_id), node.store) == ["kept"]
    assert node.stats().get("context_unstorable", 0) == 0


# -- 12. A Main's inbox ----------------------------------------------------------------------


def test_a_message_whose_inbox_write_fails_is_refused_and_never_runs(
    open_node: Callable[..., Node], store_path: pathlib.Path, make_store: Callable[..., Store]
) -> None:
    io = FailingIO()
    store = make_store(store_path, io=io)
    log = MainLog()
    node = open_node(store, Agent("agent", {"main": log}))
    main = node.main("agent")
    assert main.send("first") is None
    settle(node)
    io.failing.set()
    error = main.send("lost")
    io.failing.clear()
    assert error is not None
    assert error.code is ErrorCode.STORE_FAILED
    assert str(main.session_id) in error.message
    settle(node)
    assert log.messages == ["first"]
    assert main.send("second") is None
    settle(node)
    assert log.messages == ["first", "second"]
    assert contents(stored(node, main.session_id).context) == ["first", "second"]


def test_an_accepted_message_whose_cycle_never_ran_is_run_after_restart(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    log = MainLog()
    blocked, gate = threading.Event(), threading.Event()

    def main(session: Any) -> None:
        log(session)
        if session.message == "slow" and not session.resumed:
            blocked.set()
            gate.wait(WAIT)

    agent = Agent("agent", {"main": main})
    node = open_node(store_path, agent)
    try:
        ref = node.main("agent")
        assert ref.send("slow") is None
        assert blocked.wait(WAIT)
        assert ref.send("queued") is None  # accepted: durable in the inbox
        shut(node)
    finally:
        gate.set()
    node = open_node(store_path, agent)
    assert node.recovery.figures["inbox"] == 2
    settle(node)
    assert log.messages == ["slow", "slow", "queued"]
    assert log.cycles[-1] == ("queued", True, ["slow"])


# -- ended sessions after a restart -----------------------------------------------------------


def test_sessions_that_ended_before_a_restart_are_read_from_the_store(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    agent = Agent("agent", {"main": MainLog(), "finished": finished})
    node = open_node(store_path, agent)
    main = node.main("agent")
    child = main.spawn(kind="branch", skill="finished", task="a task").ref
    assert child.wait(WAIT).summary == "done"
    settle(node)
    shut(node)

    node = open_node(store_path, agent)
    assert node.get(child.session_id).state is SessionState.COMPLETED
    assert node.get(child.session_id).task == "a task"
    result = node.result(child.session_id)
    assert result is not None
    assert result.summary == "done"
    waited = node.wait(child.session_id, WAIT)
    assert waited == result
    tree = node.tree(main.session_id)
    assert [c["info"].session_id for c in tree["children"]] == [child.session_id]
    assert tree["children"][0]["result"] == result
    assert [r.session_id for r in node.results(main.session_id)] == [child.session_id]
    assert node.stats()["indexed_sessions"] == 0  # none of these reads woke the Main


# -- 13. The lifecycle with and without a store ------------------------------------------------


@pytest.fixture(params=["in-memory", "lmdb"])
def store_dir(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> pathlib.Path | None:
    return None if request.param == "in-memory" else tmp_path / "store"


def make_lifecycle_agent(release: threading.Event) -> Agent:
    def returns(session: Any) -> Any:
        session.checkpoint()
        return {"answer": 42}

    def crashes(session: Any) -> Any:
        session.checkpoint()
        raise ValueError("model refused")

    def reports_then_waits(session: Any) -> Any:
        session.progress("half way", pct=50)
        session.sleep(10_000)
        return "never"

    def wraps_up(session: Any) -> Any:
        try:
            session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "finished"

    def ignores_cancel(session: Any) -> Any:
        try:
            session.sleep(10_000)
        except Cancelled:
            release.wait(WAIT)
        return "too late"

    def spawns_wrapper_and_returns(session: Any) -> Any:
        session.spawn(kind="branch", skill="wraps_up")
        return "parent done"

    async def returns_async(session: Any) -> Any:
        await session.checkpoint()
        return "async"

    skills = {k: v for k, v in locals().items() if callable(v) and k != "release"}
    return Agent("agent", {"main": MainLog(), **skills})


@pytest.fixture
def life(
    open_node: Callable[..., Node], store_dir: pathlib.Path | None, release: threading.Event
) -> Node:
    return open_node(store_dir, make_lifecycle_agent(release), grace=30.0)


def branch(node: Node, skill: str, **fields: Any) -> Any:
    spawned = node.main("agent").spawn(kind="branch", skill=skill, **fields)
    assert spawned.ok, spawned.error
    return spawned.ref


def check_stored(node: Node, result: SessionResult) -> None:
    """With a store, the answer came only once the ending was durable."""
    if node.store is None:
        return
    record = node.store.session(result.session_id)  # no flush: wait() already waited
    assert record is not None
    assert record.info.state is result.status
    assert record.result == result


@pytest.mark.parametrize("skill", ["returns", "returns_async"])
def test_lifecycle_a_returning_skill_completes(life: Node, skill: str) -> None:
    ref = branch(life, skill)
    result = ref.wait(WAIT)
    assert result.status is SessionState.COMPLETED
    check_stored(life, result)
    settle(life)
    assert [r.session_id for r in life.main("agent").results()] == [ref.session_id]


def test_lifecycle_a_raising_skill_fails_as_crashed(life: Node) -> None:
    result = branch(life, "crashes").wait(WAIT)
    assert result.status is SessionState.FAILED
    assert result.error.code is ErrorCode.CRASHED
    assert result.error.detail["message"] == "model refused"
    check_stored(life, result)


def test_lifecycle_cancel_wrapped_up_in_grace_keeps_the_partial(life: Node) -> None:
    ref = branch(life, "wraps_up")
    settle(life)
    assert ref.cancel() is None
    result = ref.wait(WAIT)
    assert result.status is SessionState.CANCELLED
    assert result.error.code is ErrorCode.CANCELLED
    assert result.summary == "partial"
    check_stored(life, result)


def test_lifecycle_a_skill_past_the_grace_is_terminated_by_force(
    life: Node, clock: VirtualClock, release: threading.Event
) -> None:
    ref = branch(life, "ignores_cancel")
    settle(life)
    ref.cancel()
    clock.advance(29.0)
    assert ref.result() is None
    clock.advance(1.0)
    result = ref.wait(WAIT)
    assert result.error.code is ErrorCode.TERMINATED_BY_FORCE
    check_stored(life, result)
    release.set()
    settle(life)
    assert life.stats()["zombies"] == 0


def test_lifecycle_ttl_expiry_keeps_the_progress(life: Node, clock: VirtualClock) -> None:
    ref = branch(life, "reports_then_waits", ttl=60.0)
    settle(life)
    clock.advance(59.9)
    settle(life)
    assert ref.state is SessionState.ACTIVE
    clock.advance(0.1)
    result = ref.wait(WAIT)
    assert result.status is SessionState.EXPIRED
    assert result.error.code is ErrorCode.TTL_EXPIRED
    assert result.summary == "half way"
    check_stored(life, result)


def test_lifecycle_an_ended_parents_child_wraps_up_and_is_filed_on_it(life: Node) -> None:
    parent = branch(life, "spawns_wrapper_and_returns")
    assert parent.wait(WAIT).status is SessionState.COMPLETED
    settle(life)
    (child,) = life.tree(parent)["children"]
    result = life.wait(child["info"].session_id, WAIT)
    assert result.error.code is ErrorCode.PARENT_TERMINATED
    assert result.summary == "partial"
    check_stored(life, result)
    assert [r.session_id for r in parent.results()] == [result.session_id]


def test_lifecycle_spawn_refusals_and_repeated_requests_are_unchanged(life: Node) -> None:
    main = life.main("agent")
    first = main.spawn(kind="branch", skill="wraps_up", request_id="r-1")
    again = main.spawn(kind="branch", skill="wraps_up", request_id="r-1")
    assert again.existing
    assert again.session_id == first.session_id
    worker = main.spawn(kind="worker", skill="wraps_up").ref
    refused = life.spawn(worker, kind="worker")
    assert refused.error.code is ErrorCode.WORKER_CANNOT_SPAWN
    unknown = life.spawn(new_session_id(), kind="branch")
    assert unknown.error.code is ErrorCode.UNKNOWN_SESSION
    assert len(life.sessions(kind=SessionKind.BRANCH)) == 1
    if life.store is not None:
        life.store.flush()
        assert len(life.store.children(main.session_id)) == 2


def test_lifecycle_shutdown_keeps_mains_parks_branches_and_cancels_workers(
    life: Node,
) -> None:
    main = life.main("agent")
    kept = main.spawn(kind="branch", skill="wraps_up").ref
    worker = main.spawn(kind="worker", skill="wraps_up").ref
    settle(life)
    life.shutdown(timeout=WAIT)
    final = {info.session_id: info.state for info in life.final_sessions}
    assert final[main.session_id] is SessionState.ACTIVE
    assert final[kept.session_id] is SessionState.SUSPENDED
    assert final[worker.session_id] is SessionState.CANCELLED
    if life.store is not None:
        with Store(life.store.path) as store:
            states = {sid: store.session(sid).info.state for sid in final}
        assert states == final


def test_a_repeated_request_id_after_a_restart_returns_the_first_session(
    tmp_path: pathlib.Path,
) -> None:
    def main(session: Any) -> None:
        return None

    def work(session: Any) -> None:
        session.sleep(60.0)

    agents = [Agent("req", {"main": main, "work": work}, default_skill="work", main_skill="main")]
    first_node = Node(agents, NodeConfig(grace=1.0), clock=VirtualClock(), store=tmp_path)
    main_ref = first_node.main("req")
    first = first_node.spawn(main_ref, kind=SessionKind.BRANCH, request_id="r1")
    assert first.ok
    assert first_node.wait_idle(WAIT)
    first_node.shutdown()
    second_node = Node(agents, NodeConfig(grace=1.0), clock=VirtualClock(), store=tmp_path)
    try:
        again = second_node.spawn(main_ref.session_id, kind=SessionKind.BRANCH, request_id="r1")
        assert again.existing
        assert again.session_id == first.session_id
    finally:
        second_node.shutdown()


# -- what a tree writes: workers a running branch spawned ---------------------------


def worker_done(session: Any) -> str:
    return "done"


def worker_sleeps(session: Any) -> str:
    session.sleep(1000.0)
    return "slept"


def test_a_worker_its_running_branch_spawned_is_never_written(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    """Its parent does not survive a restart (it would end ``failed``), so nothing
    would read the worker's record: none is written, nor its result; the
    branch gets it all the same. A worker spawned from outside is written."""
    children: list[uuid.UUID] = []

    def branch(session: Any) -> str:
        answers = session.spawn_many([SpawnSpec(kind=SessionKind.WORKER, skill="work")] * 3)
        children.extend(a.session_id for a in answers)
        results = session.collect()
        return ",".join(sorted(str(r.result.summary) for r in results))

    def holds(session: Any) -> str:
        session.sleep(1000.0)
        return "held"

    skills = {"main": MainLog(), "branch": branch, "work": worker_done, "holds": holds}
    node = open_node(store_path, Agent("agent", skills))
    main = node.main("agent")
    result = main.run(kind="branch", skill="branch")
    assert result is not None
    assert result.summary == "done,done,done"
    store = node.store
    assert store is not None
    store.flush()
    assert len(children) == 3
    for child in children:
        assert node.get(child).state is SessionState.COMPLETED  # known while indexed
        assert store.session(child) is None
    assert store.children(result.session_id) == []
    assert store.received(result.session_id) == []
    owed = [o for o in store.outbox() if not isinstance(o, CorruptRecordError)]
    assert not {o.result.session_id for o in owed} & set(children)
    held = main.spawn(kind="branch", skill="holds").ref
    assert held is not None
    outside = node.spawn(held, kind="worker", skill="work").ref  # acknowledged outside
    assert outside is not None
    assert stored(node, outside.session_id).info.parent_id == held.session_id


def test_a_suspend_writes_the_branchs_workers_and_owes_what_it_has_not_taken(
    open_node: Callable[..., Node], store_path: pathlib.Path
) -> None:
    """A suspended branch may come back after a restart: its workers are
    written with its snapshot (a restart can then fail the live ones and tell
    it), and the results it has not taken yet are owed in the outbox."""
    ids: dict[str, uuid.UUID] = {}

    def branch(session: Any) -> str:
        quick, slow = session.spawn_many(
            [
                SpawnSpec(kind=SessionKind.WORKER, skill="quick"),
                SpawnSpec(kind=SessionKind.WORKER, skill="slow"),
            ]
        )
        ids["quick"], ids["slow"] = quick.session_id, slow.session_id
        session.sleep(500.0)
        return "woke"

    agent = Agent(
        "agent",
        {"main": MainLog(), "branch": branch, "quick": worker_done, "slow": worker_sleeps},
    )
    node = open_node(store_path, agent)
    main = node.main("agent")
    ref = main.spawn(kind="branch", skill="branch").ref
    assert ref is not None
    settle(node)
    assert node.get(ids["quick"]).state is SessionState.COMPLETED
    store = node.store
    assert store is not None
    store.flush()
    assert store.session(ids["slow"]) is None  # not written while its branch runs
    assert ref.suspend() is None
    settle(node)
    assert ref.state is SessionState.SUSPENDED
    slow = stored(node, ids["slow"])
    assert slow.info.kind is SessionKind.WORKER
    assert slow.info.parent_id == ref.session_id
    assert ids["slow"] in store.children(ref.session_id)
    owed = [o for o in store.outbox() if not isinstance(o, CorruptRecordError)]
    assert [(o.parent_id, o.result.session_id) for o in owed] == [(ref.session_id, ids["quick"])]
    assert owed[0].result.status is SessionState.COMPLETED
    quick = stored(node, ids["quick"])  # ended, still indexed: known after a restart too
    assert quick.info.state is SessionState.COMPLETED
    assert ids["quick"] in store.children(ref.session_id)


def test_a_skills_spawns_commit_nothing_by_themselves(tmp_path: pathlib.Path) -> None:
    """A skill's spawns are answered once their records are queued; the records
    go with the next write someone waits on (here: none, and a long linger)."""
    spawned = threading.Event()
    go_on = threading.Event()

    def spawner(session: Any) -> str:
        session.spawn_many([SpawnSpec(kind=SessionKind.BRANCH, skill="sleeps")] * 3)
        session.spawn(kind="branch", skill="sleeps")
        spawned.set()
        assert go_on.wait(WAIT)
        return "done"

    def sleeps(session: Any) -> str:
        session.sleep(1000.0)
        return "slept"

    store = Store(tmp_path / "s", linger=3600.0)
    agent = Agent("agent", {"main": MainLog(), "spawner": spawner, "sleeps": sleeps})
    node = Node([agent], NodeConfig(), clock=VirtualClock(), store=store)
    try:
        main = node.main("agent")
        before = store.stats()["commits"]
        ref = main.spawn(kind="branch", skill="spawner").ref  # from outside: durable
        assert ref is not None
        assert spawned.wait(WAIT)
        assert store.stats()["commits"] == before + 1  # the spawner's record alone
        go_on.set()
    finally:
        go_on.set()
        node.shutdown(grace=0)
        store.close()
