"""Moving one slot's trees between stores and nodes, on real LMDB stores.

The store's part: a slot's records exported in one read transaction while
other slots take traffic, imported elsewhere whole or not at all (a digest,
absent keys), then released from the source behind a tombstone that answers
``slot_moved``. The node's part: a freeze parks the slot's Branches, lets
its Workers finish and abandons at its deadline without killing anything;
the tree released from one node comes back on the next one that opens the
store it was imported into.
"""

from __future__ import annotations

import pathlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from sessiontree.actors import VirtualClock
from sessiontree.protocol import (
    NodeClosedError,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SessionState,
    SlotConflictError,
    SlotFrozenError,
    SlotMovedError,
    new_session_id,
    slot_for,
    slot_of,
)
from sessiontree.store import Store, WriteBatch, export_jsonl, import_jsonl, verify_store
from sessiontree.store._slots import SlotExport, encode_export
from sessiontree.supervision import Agent, Node, NodeConfig
from tests._served import ServedNode
from tests.conftest import WAIT, wait_until

pytestmark = pytest.mark.timeout(90)

AGENT = "mover"


def key_in_another_slot(key: str) -> str:
    """A session key of ``AGENT`` whose slot is not ``key``'s."""
    n = 0
    while slot_for(AGENT, f"telegram:dm:other{n}") == slot_for(AGENT, key):
        n += 1
    return f"telegram:dm:other{n}"


class Tree:
    """The skills of the moved tree, and what the test sees of their runs.

    A Main's message ``"tree"`` spawns a Branch that writes tree memory,
    spawns a Worker held on ``gate`` and waits at checkpoints (it parks there
    when its slot freezes); ``"linger"`` spawns a Branch with a TTL that waits
    at checkpoints forever. Back after a move (``session.resumed``) the first
    takes its Worker's result; the second waits on.
    """

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.stop = threading.Event()  # set at teardown: nothing is left polling
        self.main_got: list[Any] = []
        self.collected: list[list[str]] = []
        self.lock = threading.Lock()

    def main(self, session: Any) -> None:
        message = session.message
        with self.lock:
            self.main_got.append(message)
        if message == "tree":
            session.spawn(kind="branch", skill="branch", task="tree")
        elif message == "linger":
            session.spawn(kind="branch", skill="linger", task="linger", ttl=100.0)

    def branch(self, session: Any) -> str:
        if session.resumed:  # run again where it came back: its worker's result arrives
            deadline = time.monotonic() + WAIT
            while not session.results() and time.monotonic() < deadline:
                session.checkpoint()
                self.stop.wait(0.01)
            summaries = [r.summary for r in session.results()]
            with self.lock:
                self.collected.append(summaries)
            return f"collected {summaries}"
        session.broadcast("seen", "tree")
        session.spawn(kind="worker", skill="worker", task="w")
        while not self.stop.wait(0.01):
            session.checkpoint()  # parks here once its slot freezes
        return "stopped"

    def linger(self, session: Any) -> str:
        while not self.stop.wait(0.01):
            session.checkpoint()
        return "stopped"

    def worker(self, session: Any) -> str:
        while not self.gate.wait(0.01):
            session.checkpoint()
        return "worker done"

    def agent(self) -> Agent:
        skills = {
            "main": self.main,
            "branch": self.branch,
            "linger": self.linger,
            "worker": self.worker,
        }
        return Agent(AGENT, skills, main_skill="main")


@pytest.fixture
def tree() -> Iterator[Tree]:
    skills = Tree()
    yield skills
    skills.gate.set()
    skills.stop.set()


def node_on(store: pathlib.Path, tree: Tree, clock: VirtualClock) -> Node:
    return Node([tree.agent()], NodeConfig(memory_scope="tree"), clock=clock, store=store)


def slot_sessions(node: Node, slot: int) -> list[Any]:
    return [s for s in node.sessions() if slot_of(s.session_id) == slot]


def entries_of(data: bytes) -> SlotExport:
    return msgspec.msgpack.decode(data, type=SlotExport)


# -- the store's part -----------------------------------------------------------------


def test_a_slot_moves_to_another_store_while_other_slots_take_traffic(
    tmp_path: pathlib.Path, tree: Tree, clock: VirtualClock
) -> None:
    tree.gate.set()
    tree.stop.set()  # the tree runs to its end
    node = node_on(tmp_path / "src", tree, clock)
    try:
        key = "telegram:dm:moved"
        slot = slot_for(AGENT, key)
        main = node.main(AGENT, key)
        assert main.send("tree") is None
        assert node.wait_idle(WAIT)
        assert len(slot_sessions(node, slot)) == 3
        busy = node.main(AGENT, key_in_another_slot(key))
        sent = threading.Event()
        stop = threading.Event()

        def traffic() -> None:  # another slot keeps writing while the export reads
            n = 0
            while not stop.is_set():
                busy.send(f"m{n}")
                n += 1
                sent.set()

        thread = threading.Thread(target=traffic, daemon=True)
        thread.start()
        assert sent.wait(WAIT)
        assert node.store is not None
        data = node.store.slots.export(slot)
        stop.set()
        thread.join(WAIT)
    finally:
        tree.stop.set()
        node.shutdown(grace=0)
    export = entries_of(data)
    counts = export.header.counts
    assert export.header.slot == slot
    # the Main and its Branch (a Worker a running Branch spawned is never
    # written: its Branch's result stands for it), the Main's conversation,
    # the Branch's result filed on it, the tree's memory
    assert counts == {
        "sessions": 2,
        "children": 1,
        "mains": 1,
        "conversations": 1,
        "branches": 1,
        "messages": 1,
        "memory": 1,
        "memory_ids": 1,
        "received": 1,
        "live": 1,
    }
    assert {
        slot_of(uuid.UUID(bytes=k[:16])) for db, k, _ in export.entries if db == "sessions"
    } == {slot}
    with Store(tmp_path / "dst") as dst:
        header = dst.slots.import_(data)
        assert header.counts == counts
        again = dst.slots.export(slot)
        assert entries_of(again).entries == export.entries  # the same records
        assert entries_of(again).header.digest == export.header.digest  # the same digest
        assert dst.count("sessions") == 2  # nothing of the other slot
        assert dst.main_of(AGENT, key) == main.session_id
        assert dst.memory(f"tree:{main.session_id}", "seen") is not None


def test_an_export_that_does_not_match_its_digest_is_refused(tmp_path: pathlib.Path) -> None:
    slot = 7
    with Store(tmp_path / "src") as src:
        sid = new_session_id(slot)
        src.write(WriteBatch().raw("usage", sid.bytes, b"spent"))
        data = src.slots.export(slot)
    export = entries_of(data)
    db, key, _ = export.entries[0]
    export.entries[0] = (db, key, b"altered")
    altered = msgspec.msgpack.encode(export)
    with Store(tmp_path / "dst") as dst:
        with pytest.raises(RejectedInputError, match="does not match its digest") as refused:
            dst.slots.import_(altered)
        assert refused.value.field == "digest"
        with pytest.raises(RejectedInputError, match="not a slot export") as cut:
            dst.slots.import_(data[: len(data) // 2])
        assert cut.value.field == "data"
        assert dst.count("usage") == 0  # nothing written
        dst.slots.import_(data)
        assert dst.count("usage") == 1


def test_an_export_naming_keys_outside_its_slot_is_refused(tmp_path: pathlib.Path) -> None:
    foreign = new_session_id(8)
    data = encode_export(7, "elsewhere", [("usage", foreign.bytes, b"x")])
    meta = encode_export(7, "elsewhere", [("meta", b"meta", b"x")])
    other_main = encode_export(7, "elsewhere", [("mains", b"mover\x00k", foreign.bytes)])
    agent_memory = encode_export(7, "elsewhere", [("memory", b"mover\x00seen", b"x")])
    with Store(tmp_path / "dst") as dst:
        with pytest.raises(RejectedInputError, match="outside slot 7") as outside:
            dst.slots.import_(data)
        assert outside.value.field == "entries"
        with pytest.raises(RejectedInputError, match="never moves"):
            dst.slots.import_(meta)
        for outside_data in (other_main, agent_memory):
            with pytest.raises(RejectedInputError, match="outside slot 7"):
                dst.slots.import_(outside_data)
        assert dst.count("usage") == 0


def test_an_import_onto_a_present_key_names_it_and_writes_nothing(tmp_path: pathlib.Path) -> None:
    slot = 9
    first, second = new_session_id(slot), new_session_id(slot)
    with Store(tmp_path / "src") as src:
        src.write(WriteBatch().raw("usage", first.bytes, b"1").raw("cycles", second.bytes, b"2"))
        data = src.slots.export(slot)
    with Store(tmp_path / "dst") as dst:
        dst.write(WriteBatch().raw("cycles", second.bytes, b"mine"))
        with pytest.raises(SlotConflictError, match="is already in this store") as conflict:
            dst.slots.import_(data)
        assert (conflict.value.db, conflict.value.key) == ("cycles", second.bytes)
        assert conflict.value.to_info().detail["db"] == "cycles"
        assert dst.count("usage") == 0  # the entry before the conflict was not written
        assert dict(dst.scan("cycles")) == {second.bytes: b"mine"}


def test_unslotted_ids_belong_to_no_slot(tmp_path: pathlib.Path) -> None:
    slot = 11
    slotted = new_session_id(slot)
    unslotted = uuid.UUID(int=(slot << 114) | 12345, version=4)  # the same top bits
    assert slot_of(unslotted) is None
    assert unslotted.int >> 114 == slot
    with Store(tmp_path / "src") as src:
        src.write(
            WriteBatch().raw("usage", slotted.bytes, b"a").raw("usage", unslotted.bytes, b"b")
        )
        export = entries_of(src.slots.export(slot))
        assert [k for _, k, _ in export.entries] == [slotted.bytes]
        src.slots.release(slot, "node-b")
        assert dict(src.scan("usage")) == {unslotted.bytes: b"b"}  # it stays


@pytest.mark.parametrize("slot", [-1, 16_384, "3", True, None])
def test_a_slot_that_is_not_one_is_refused(tmp_path: pathlib.Path, slot: Any) -> None:
    with Store(tmp_path / "s") as store:
        with pytest.raises(RejectedInputError, match="slot must be an integer") as refused:
            store.slots.export(slot)
        assert refused.value.field == "slot"
        with pytest.raises(RejectedInputError):
            store.slots.release(slot, "node-b")


def test_a_release_needs_its_new_owner(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path / "s") as store:
        for owner in ("", None, "x" * 257):
            with pytest.raises(RejectedInputError) as refused:
                store.slots.release(3, owner)  # type: ignore[arg-type]
            assert refused.value.field == "new_owner"
        assert store.slots.moved(3) is None


def test_a_released_slots_tombstone_answers_slot_moved(
    tmp_path: pathlib.Path, tree: Tree, clock: VirtualClock
) -> None:
    tree.gate.set()
    node = node_on(tmp_path / "src", tree, clock)
    key = "telegram:dm:gone"
    slot = slot_for(AGENT, key)
    main = node.main(AGENT, key).session_id
    other = node.main(AGENT, key_in_another_slot(key)).session_id
    node.shutdown(grace=0)
    with Store(tmp_path / "src") as store:
        moved = store.slots.release(slot, "node-b")
        assert (moved.slot, moved.owner, moved.records) == (slot, "node-b", 3)  # record, main, live
        assert store.session(main) is None
        assert store.main_of(AGENT, key) is None
        with pytest.raises(SlotMovedError):
            store.slots.export(slot)
        assert verify_store(store).clean  # the tombstone reads as a record
        counts = export_jsonl(store, tmp_path / "whole.jsonl")
        assert counts["moved"] == 1
    with Store(tmp_path / "restored") as restored:  # a whole-store export keeps it
        import_jsonl(restored, tmp_path / "whole.jsonl")
        tombstone = restored.slots.moved(slot)
        assert tombstone is not None
        assert tombstone.owner == "node-b"
    node = node_on(tmp_path / "src", tree, clock)  # the tombstone is read at open
    served = ServedNode(node)
    try:
        for operation in (
            lambda: node.get(main),
            lambda: node.send(main, "hello"),
            lambda: node.spawn(main, kind="worker", skill="worker"),
            lambda: node.main(AGENT, key),
        ):
            with pytest.raises(SlotMovedError, match="moved to node node-b") as refused:
                operation()
            assert (refused.value.slot, refused.value.owner) == (slot, "node-b")
            assert refused.value.to_info().detail["owner"] == "node-b"
        assert node.get(other).kind is SessionKind.MAIN  # another slot is served here
        for answer in (
            served.http.get(f"/v1/sessions/{main}"),
            served.http.post(f"/v1/sessions/{main}/messages", json={"message": "hi"}),
        ):
            assert answer.status_code == 409, answer.text
            error = answer.json()["error"]
            assert error["code"] == "slot_moved"
            assert (error["detail"]["owner"], error["detail"]["slot"]) == ("node-b", slot)
            assert error["session_id"] == str(main)
    finally:
        served.close()
        node.shutdown(grace=0)
    with Store(tmp_path / "src") as store:  # an import of the slot takes the tombstone away
        store.slots.import_(encode_export(slot, "node-b", [("sessions", main.bytes, b"x")]))
        assert store.slots.moved(slot) is None
        assert store.count("moved") == 0


# -- the node's part -------------------------------------------------------------------


@pytest.mark.parametrize("running", [False, True], ids=["into-its-store", "into-a-running-node"])
def test_a_tree_moves_to_another_node_and_comes_back_there(
    tmp_path: pathlib.Path, tree: Tree, clock: VirtualClock, running: bool
) -> None:
    """The destination takes the slot into its store before a node opens it,
    or into its running node (whose other slots go on meanwhile)."""
    key = "telegram:dm:traveller"
    slot = slot_for(AGENT, key)
    source = node_on(tmp_path / "src", tree, clock)
    target = node_on(tmp_path / "dst", tree, clock) if running else None
    try:
        main = source.main(AGENT, key).session_id
        assert source.send(main, "tree") is None
        assert source.send(main, "linger") is None
        wait_until(lambda: len(slot_sessions(source, slot)) == 4, "the tree")
        branches = {s.task: s for s in slot_sessions(source, slot) if s.kind is SessionKind.BRANCH}
        deadline = branches["linger"].deadline
        assert deadline is not None
        busy = source.main(AGENT, key_in_another_slot(key))
        frozen: list[Any] = []
        freezing = threading.Thread(
            target=lambda: frozen.append(source.slots.freeze(slot, deadline=50.0)), daemon=True
        )
        freezing.start()
        wait_until(lambda: slot in source.slots.frozen, "the freeze")
        wait_until(
            lambda: all(
                source.get(b.session_id).state is SessionState.SUSPENDED for b in branches.values()
            ),
            "the branches to park",
        )
        with pytest.raises(SlotFrozenError) as refused:  # no new input while it freezes
            source.send(main, "more")
        assert refused.value.slot == slot
        assert busy.send("other slots go on") is None
        assert freezing.is_alive()  # its worker still runs
        tree.gate.set()  # the worker finishes: its result is owed to the parked branch
        freezing.join(WAIT)
        assert frozen
        assert frozen[0].frozen, frozen
        assert set(frozen[0].parked) == {b.session_id for b in branches.values()}
        data = source.slots.export(slot)
        tree.main_got.clear()
        if target is None:
            with Store(tmp_path / "dst") as dst:
                dst.slots.import_(data)
        else:
            elsewhere = target.main(AGENT, key_in_another_slot(key))
            header = target.slots.import_(data)
            assert header.slot == slot
            with pytest.raises(SlotConflictError):  # once only: nothing written twice
                target.slots.import_(data)
            assert elsewhere.send("the destination's other slots go on") is None
        moved = source.slots.release(slot, "node-b")
        assert moved.owner == "node-b"
        assert slot_sessions(source, slot) == []  # forgotten here
        assert source.wait_idle(WAIT)  # its parked branches' threads were let go
        assert source.stats()["live_sessions"] == 1  # the other slot's Main
        assert slot not in source.slots.frozen
        with pytest.raises(SlotMovedError):
            source.get(main)
        assert busy.send("still here") is None
    except BaseException:
        if target is not None:
            target.shutdown(grace=0)
        raise
    finally:
        source.shutdown(grace=0)
    clock.advance(60.0)  # in transit: the lingering branch's TTL runs on meanwhile
    if target is None:
        target = node_on(tmp_path / "dst", tree, clock)
    try:
        assert target.get(main).kind is SessionKind.MAIN
        first = branches["tree"].session_id
        wait_until(lambda: target.get(first).state is SessionState.COMPLETED, "the branch's end")
        assert tree.collected == [["worker done"]]  # the owed result, delivered once
        wait_until(
            lambda: any(isinstance(m, SessionResult) for m in tree.main_got),
            "the branch's result at its Main",
        )
        results = [m for m in tree.main_got if isinstance(m, SessionResult)]
        assert [r.session_id for r in results] == [first]
        assert target.get(main).state is SessionState.ACTIVE
        lingering = target.get(branches["linger"].session_id)
        assert lingering.state is SessionState.ACTIVE  # resumed, not run out
        assert lingering.deadline == deadline  # the TTL is the same absolute deadline
        clock.advance(deadline - clock.time() - 1.0)  # a TTL timer fires into the Cortex's
        assert target.get(lingering.session_id).state is SessionState.ACTIVE  # mailbox first
        clock.advance(2.0)
        wait_until(
            lambda: target.get(lingering.session_id).state is SessionState.EXPIRED, "its TTL"
        )
        assert target.memory.get(f"tree:{main}", "seen") == "tree"
    finally:
        tree.stop.set()
        target.shutdown(grace=0)


def test_a_freeze_abandons_at_its_deadline_without_killing_anything(
    tmp_path: pathlib.Path, tree: Tree, clock: VirtualClock
) -> None:
    key = "telegram:dm:stays"
    slot = slot_for(AGENT, key)
    node = node_on(tmp_path / "src", tree, clock)
    try:
        main = node.main(AGENT, key).session_id
        assert node.send(main, "tree") is None
        wait_until(lambda: len(slot_sessions(node, slot)) == 3, "the tree")
        by_kind = {s.kind: s.session_id for s in slot_sessions(node, slot)}
        outcome: list[Any] = []
        freezing = threading.Thread(
            target=lambda: outcome.append(node.slots.freeze(slot, deadline=5.0)), daemon=True
        )
        freezing.start()
        branch = by_kind[SessionKind.BRANCH]
        wait_until(lambda: node.get(branch).state is SessionState.SUSPENDED, "the branch to park")
        assert node.store is not None
        node.store.flush()  # the Main's last snapshot, queued lazily, is durable
        clock.advance(5.0)
        freezing.join(WAIT)
        assert outcome, "the freeze did not return at its deadline"
        abandoned = outcome[0]
        assert not abandoned.frozen
        assert abandoned.busy == {str(by_kind[SessionKind.WORKER]): "a worker still running"}
        assert slot not in node.slots.frozen
        wait_until(lambda: node.get(branch).state is SessionState.ACTIVE, "the branch to resume")
        assert node.get(by_kind[SessionKind.WORKER]).state is SessionState.ACTIVE  # not killed
        assert node.send(main, "again") is None  # input is taken again
        with pytest.raises(RejectedInputError, match="is not frozen"):
            node.slots.release(slot, "node-b")
        tree.gate.set()
        wait_until(
            lambda: node.get(by_kind[SessionKind.WORKER]).state is SessionState.COMPLETED,
            "the worker's end",
        )
    finally:
        tree.stop.set()
        node.shutdown(grace=0)


def test_a_freeze_names_a_bad_deadline(
    tmp_path: pathlib.Path, tree: Tree, clock: VirtualClock
) -> None:
    node = node_on(tmp_path / "src", tree, clock)
    try:
        for deadline in (-1.0, float("nan"), float("inf"), "5"):
            with pytest.raises(RejectedInputError) as refused:
                node.slots.freeze(3, deadline=deadline)  # type: ignore[arg-type]
            assert refused.value.field == "deadline"
        assert node.slots.frozen == []
    finally:
        node.shutdown(grace=0)


def test_an_unfrozen_slot_takes_input_again_and_its_branches_resume(
    tmp_path: pathlib.Path, tree: Tree, clock: VirtualClock
) -> None:
    tree.gate.set()
    key = "telegram:dm:stays-too"
    slot = slot_for(AGENT, key)
    node = node_on(tmp_path / "src", tree, clock)
    try:
        main = node.main(AGENT, key).session_id
        assert node.send(main, "linger") is None
        wait_until(lambda: len(slot_sessions(node, slot)) == 2, "the tree")
        (branch,) = [
            s.session_id for s in slot_sessions(node, slot) if s.kind is SessionKind.BRANCH
        ]
        frozen = node.slots.freeze(slot, deadline=50.0)
        assert frozen.frozen
        assert frozen.parked == (branch,)
        assert node.get(branch).state is SessionState.SUSPENDED
        with pytest.raises(SlotFrozenError):
            node.main(AGENT, key)
        with pytest.raises(SlotFrozenError):  # only the unfreeze resumes what it parked
            node.resume(branch)
        again = node.slots.freeze(slot, deadline=50.0)  # frozen already: it stays so
        assert again.parked == (branch,)
        served = ServedNode(node)
        try:
            answer = served.http.post(f"/v1/sessions/{main}/messages", json={"message": "hi"})
        finally:
            served.close()
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["code"] == "slot_frozen"
        assert answer.json()["error"]["detail"]["slot"] == slot
        node.slots.unfreeze(slot)
        assert node.slots.frozen == []
        wait_until(lambda: node.get(branch).state is SessionState.ACTIVE, "the branch to resume")
        assert node.main(AGENT, key).session_id == main
        assert node.send(main, "again") is None
    finally:
        tree.stop.set()
        node.shutdown(grace=0)


def test_moving_a_slot_needs_a_store(make_node: Any, tree: Tree) -> None:
    node = make_node(tree.agent())
    with pytest.raises(NodeClosedError, match="needs a node with a store"):
        node.slots.freeze(3)
    with pytest.raises(NodeClosedError):
        node.slots.import_(b"")
