"""An acknowledged message is never consumed by a store refusal: a Main's
cycle that meets one (a conversation append refused, the write of its start
refused) keeps its message in the inbox (a child's result stays owed), is
told to the operator once, and runs again once the store takes writes — on
the periodic retry, at ``release_replay``, or after a restart. The map-full
run through a real ``node start`` is in ``tests/test_kept_cycles_node.py``."""

from __future__ import annotations

import logging
import pathlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import lmdb
import pytest

from sessiontree.actors import VirtualClock
from sessiontree.protocol import ErrorCode, SessionResult
from sessiontree.store import Store, StoreIO
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig, NodeMetrics
from tests.conftest import WAIT, settle

pytestmark = pytest.mark.timeout(60)

CHECK = 5.0  # the nodes' check_interval: the first retry comes after it


class FullIO(StoreIO):
    """Every put fails as a full map would while ``full`` is set."""

    def __init__(self) -> None:
        self.full = threading.Event()

    def put(self, txn: lmdb.Transaction, db: Any, key: bytes, value: bytes) -> None:
        if self.full.is_set():
            raise lmdb.MapFullError("injected: the map is full")
        super().put(txn, db, key, value)


@pytest.fixture
def io() -> FullIO:
    return FullIO()


@pytest.fixture
def store(tmp_path: pathlib.Path, io: FullIO) -> Iterator[Store]:
    opened = Store(tmp_path / "store", io=io)
    yield opened
    opened.close()


@pytest.fixture
def open_node(clock: VirtualClock, store: Store) -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def open_(agent: Agent) -> Node:
        node = Node([agent], NodeConfig(check_interval=CHECK), clock=clock, store=store)
        nodes.append(node)
        return node

    yield open_
    for node in nodes:
        node.shutdown(grace=0, timeout=5.0)


class Replier:
    """A Main's skill: answers each message (and child result) in its
    conversation, and notes it in its working context. The store starts
    refusing under the first cycle for each of ``fill_on`` (before its
    reply); on "spawn" it also spawns a worker that answers ``fill_on``."""

    def __init__(self, io: FullIO, *fill_on: str) -> None:
        self.io = io
        self.fill_on = set(fill_on or ("fill",))
        self.runs: list[tuple[Any, int]] = []

    def __call__(self, session: Any) -> None:
        message = session.message
        said = message.summary if isinstance(message, SessionResult) else message
        self.runs.append((said, session.attempt))
        if said in self.fill_on:
            self.fill_on.discard(said)
            self.io.full.set()
        if isinstance(message, SessionResult):
            session.conversation.append("assistant", f"heard: {said}")
            return
        session.add_message("assistant", f"noted {said}")
        session.conversation.append("assistant", f"reply to {said}")
        if said == "spawn":
            session.spawn(kind="worker", skill="answers", task="worker done")


def answers(session: Any) -> str:
    return str(session.task)


def transcript(node: Node, main: Any) -> list[tuple[str, Any]]:
    conversation = node.conversation(main)
    return [(m.role.value, m.content) for m in conversation.context(100)]


def inbox(store: Store, main: Any) -> list[tuple[bytes, bytes]]:
    """The Main's stored inbox entries: (key, raw record)."""
    store.flush()
    return list(store.scan("inbox", main.session_id.bytes))


def test_a_refused_cycle_keeps_its_message_and_runs_once_the_store_takes_writes(
    open_node: Callable[..., Node],
    io: FullIO,
    store: Store,
    clock: VirtualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    skill = Replier(io)
    node = open_node(Agent("agent", {"main": skill}))
    main = node.main("agent")
    ended: list[Event] = []
    node.subscribe(lambda e: ended.append(e) if e.kind is EventKind.CYCLE_ENDED else None)
    with caplog.at_level(logging.ERROR, logger="sessiontree.cortex"):
        assert main.send("fill") is None  # acknowledged: in the durable inbox
        settle(node)
        refused = main.send("after")  # the map is full: not acknowledged, and it says so
    assert refused is not None
    assert refused.code is ErrorCode.STORE_FULL
    settle(node)
    stats = node.stats()
    assert stats["main_cycles_refused"] == 1
    assert stats["store_held_mains"] == 1
    assert stats.get("main_cycles_failed", 0) == 0  # not a failed cycle: nothing was consumed
    metrics = NodeMetrics(node)
    try:
        sample = metrics.registry.get_sample_value
        assert sample("sessiontree_main_cycles_refused_total", {}) == 1
        assert sample("sessiontree_store_held_mains", {}) == 1
    finally:
        metrics.close()
    assert ended[0].code == ErrorCode.STORE_FULL
    assert ended[0].data["kept"] is True
    refusals = [r for r in caplog.records if "refused a write" in r.getMessage()]
    assert len(refusals) == 1, caplog.text
    assert "--map-size" in refusals[0].getMessage()
    assert "fill" in [record_message(key, raw) for key, raw in inbox(store, main)]
    assert node.get(main).state.value == "active"
    # the working context is as the cycle found it
    assert [m.content for m in node.inspect(main, lambda core: core.context.messages)] == []

    io.full.clear()  # the store takes writes again; the retry comes with the check
    clock.advance(CHECK)
    settle(node)
    assert node.stats()["store_held_mains"] == 0
    assert skill.runs[:2] == [("fill", 1), ("fill", 1)]  # a store refusal is not a crash
    said = transcript(node, main)
    assert said.count(("user", "fill")) == 1
    assert said.count(("assistant", "reply to fill")) == 1
    assert inbox(store, main) == []
    noted = node.inspect(main, lambda core: [m.content for m in core.context.messages])
    assert noted.count("noted fill") == 1


def record_message(key: bytes, raw: bytes) -> Any:
    from sessiontree.store import InboxRecord, decode_record  # noqa: PLC0415

    return decode_record(InboxRecord, raw, db="inbox", key=key).message


def test_messages_behind_a_kept_one_wait_and_run_after_it_in_order(
    open_node: Callable[..., Node], io: FullIO, clock: VirtualClock
) -> None:
    skill = Replier(io)
    node = open_node(Agent("agent", {"main": skill}))
    main = node.main("agent")
    assert main.send("fill") is None
    settle(node)
    io.full.clear()
    for text in ("second", "third"):
        assert main.send(text) is None  # the inbox takes them; the Main waits
    settle(node)
    assert [m for m, _ in skill.runs] == ["fill"]
    assert node.recovery.release_replay() == 1  # at once, without waiting for the check
    settle(node)
    assert [m for m, _ in skill.runs] == ["fill", "fill", "second", "third"]
    replies = [c for r, c in transcript(node, main) if r == "assistant"]
    assert replies == ["reply to fill", "reply to second", "reply to third"]


def test_a_refused_retry_waits_longer_and_the_operator_is_told_once(
    open_node: Callable[..., Node],
    io: FullIO,
    clock: VirtualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    skill = Replier(io)
    node = open_node(Agent("agent", {"main": skill}))
    main = node.main("agent")
    with caplog.at_level(logging.INFO, logger="sessiontree.cortex"):
        assert main.send("fill") is None
        settle(node)
        clock.advance(CHECK)  # retried while the map is still full: refused again
        settle(node)
        assert len(skill.runs) == 1  # its start was refused: the skill did not run
        clock.advance(CHECK)  # the next retry waits twice as long
        settle(node)
        assert len(skill.runs) == 1
        io.full.clear()
        clock.advance(CHECK)
        settle(node)
    assert len(skill.runs) == 2
    assert node.stats()["main_cycles_refused"] == 2
    text = caplog.text
    assert text.count("refused a write") == 1
    assert "the store takes writes again" in text
    assert transcript(node, main).count(("assistant", "reply to fill")) == 1


def test_a_refused_result_cycle_stays_owed_and_runs_once(
    open_node: Callable[..., Node], io: FullIO, store: Store
) -> None:
    skill = Replier(io, "worker done")
    node = open_node(Agent("agent", {"main": skill, "answers": answers}))
    main = node.main("agent")
    assert main.send("spawn") is None  # its worker's result fills the store
    settle(node)
    assert node.stats()["store_held_mains"] == 1
    assert skill.runs == [("spawn", 1), ("worker done", 1)]
    store.flush()
    assert len(list(store.scan("outbox"))) == 1  # the result is still owed
    io.full.clear()
    assert node.recovery.release_replay() == 1
    settle(node)
    assert skill.runs[-1] == ("worker done", 1)
    assert len(skill.runs) == 3
    heard = [c for r, c in transcript(node, main) if r == "assistant" and c.startswith("heard")]
    assert heard == ["heard: worker done"]
    assert [r.summary for r in node.results(main)] == ["worker done"]
    store.flush()
    assert list(store.scan("outbox")) == []


def test_a_kept_message_runs_once_after_a_restart(
    clock: VirtualClock, io: FullIO, store: Store
) -> None:
    skill = Replier(io)
    agent = Agent("agent", {"main": skill})
    node = Node([agent], NodeConfig(check_interval=CHECK), clock=clock, store=store)
    main = node.main("agent")
    assert main.send("fill") is None
    settle(node)
    assert node.stats()["store_held_mains"] == 1
    io.full.clear()  # room again, but the node is stopped before its retry
    node.shutdown(timeout=WAIT)
    again = Node([agent], NodeConfig(check_interval=CHECK), clock=clock, store=store)
    try:
        assert again.wait_idle(WAIT)
        settle(again)
        assert [m for m, _ in skill.runs] == ["fill", "fill"]
        said = transcript(again, main)
        assert said.count(("user", "fill")) == 1
        assert said.count(("assistant", "reply to fill")) == 1
        assert inbox(store, main) == []
    finally:
        again.shutdown(grace=0, timeout=5.0)


def test_every_held_main_runs_again_once_the_first_retry_runs_through(
    open_node: Callable[..., Node],
    io: FullIO,
    clock: VirtualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    skill = Replier(io, "fill one", "fill two")
    node = open_node(Agent("agent", {"main": skill}))
    one = node.main("agent", "internal:thread:one")
    two = node.main("agent", "internal:thread:two")
    with caplog.at_level(logging.INFO, logger="sessiontree.cortex"):
        assert one.send("fill one") is None
        settle(node)
        io.full.clear()  # room for the next message, whose cycle fills the map again
        assert two.send("fill two") is None
        settle(node)
        assert node.stats()["store_held_mains"] == 2
        clock.advance(CHECK)  # one Main is retried alone: refused again
        settle(node)
        assert [m for m, _ in skill.runs] == ["fill one", "fill two"]
        io.full.clear()
        clock.advance(2 * CHECK)  # the next retry (the other's turn) runs through: both run
        settle(node)
    assert node.stats()["store_held_mains"] == 0
    assert sorted(m for m, _ in skill.runs) == ["fill one", "fill one", "fill two", "fill two"]
    assert caplog.text.count("refused a write") == 1
    assert caplog.text.count("the store takes writes again") == 1
    for ref, text in ((one, "fill one"), (two, "fill two")):
        assert transcript(node, ref).count(("assistant", f"reply to {text}")) == 1


def test_a_result_whose_cycle_snapshot_is_refused_runs_once_across_a_restart(
    open_node: Callable[..., Node], io: FullIO, store: Store
) -> None:
    runs: list[Any] = []

    def main_skill(session: Any) -> None:
        message = session.message
        if isinstance(message, SessionResult):
            runs.append(message.summary)
            store.flush()  # what came before (the worker's end) is in
            io.full.set()  # the cycle ran; its snapshot, filing the result, is refused
        elif message == "spawn":
            session.spawn(kind="worker", skill="answers", task="worker done")

    agent = Agent("agent", {"main": main_skill, "answers": answers}, main_skill="main")
    node = open_node(agent)
    main = node.main("agent")
    assert main.send("spawn") is None
    settle(node)
    assert runs == ["worker done"]
    io.full.clear()
    assert main.send("after") is None  # its snapshot files the result the refused one took
    settle(node)
    node.shutdown(timeout=WAIT)

    again = open_node(agent)
    again.main("agent")
    settle(again)
    assert runs == ["worker done"]  # filed once: never delivered a second time
