"""Fencing: a process still holding a store another process opened since writes
nothing more. Every writer's open bumps the store's ``incarnation``; each
commit checks it, so the stale holder's commit is refused (``StoreFencedError``),
and every later one, while the new holder's writes stand. Slot epochs persist
and fence the writes that name one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sessiontree.protocol import (
    ErrorCode,
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SessionState,
    StoreError,
    StoreFencedError,
    StoreLockedError,
    new_session_id,
)
from sessiontree.store import (
    SessionRecord,
    SlotRecord,
    Store,
    WriteBatch,
    export_jsonl,
    import_jsonl,
    read_slot_export,
)
from sessiontree.store._clean import CLOSED
from sessiontree.supervision import Agent, Node, NodeConfig
from tests._running_node import ROOT

pytestmark = pytest.mark.timeout(60)


def record(n: int) -> SessionRecord:
    info = SessionInfo(
        session_id=uuid.UUID(int=n),
        agent_id="assistant",
        parent_id=None,
        kind=SessionKind.MAIN,
        state=SessionState.ACTIVE,
        depth=0,
        created_at=1_700_000_000.0,
        ttl=None,
        deadline=None,
        key=f"internal:main:{n}",
        skill="main",
    )
    return SessionRecord(info=info, updated_at=1_700_000_000.0)


# The old holder: opens the store, writes session 1, says so, then waits for a
# line on stdin (it is SIGSTOPped meanwhile, as a partitioned process would be)
# and tries to write sessions 2 and 3 every way a caller can.
_OLD_HOLDER = textwrap.dedent(
    """
    import asyncio, json, sys, uuid
    from sessiontree.store import Store, WriteBatch
    from tests.test_store_fencing import record

    store = Store(sys.argv[1])
    store.write(WriteBatch().session(record(1)))
    print(json.dumps({"incarnation": store.incarnation}), flush=True)
    sys.stdin.readline()
    outcomes = []

    def attempt(how, call):
        try:
            call()
        except Exception as exc:
            outcomes.append({"how": how, "type": type(exc).__name__,
                             "code": getattr(exc, "code", None), "message": str(exc)})
        else:
            outcomes.append({"how": how, "type": None})

    attempt("write", lambda: store.write(WriteBatch().session(record(2))))
    attempt("submit", lambda: store.submit(WriteBatch().session(record(3))).result(10))
    attempt("awrite", lambda: asyncio.run(store.awrite(WriteBatch().session(record(3)))))
    print(json.dumps({"outcomes": outcomes, "refusing": store.refusing,
                      "fenced": store.fenced is not None}), flush=True)
    store.close()
    """
)


def _take_over(path: Path, old: subprocess.Popen[str]) -> dict[str, Any]:
    """Stop ``old`` once it holds the store, take the store over, let ``old``
    try its writes; what it was told."""
    try:
        assert old.stdout is not None
        assert old.stdin is not None
        opened = json.loads(old.stdout.readline() or "{}")
        assert opened.get("incarnation") == 1, old.stderr.read() if old.stderr else ""
        old.send_signal(signal.SIGSTOP)  # partitioned: it holds its handle, silent
        with pytest.raises(StoreLockedError):  # the guard holds while its lock does
            Store(path)
        # The lock was judged stale (its holder unreachable) and removed: a new
        # process takes the store over.
        (path / "writer.lock").unlink()
        with Store(path) as new:
            assert new.incarnation == 2
            new.write(WriteBatch().session(record(4)))
            old.send_signal(signal.SIGCONT)
            old.stdin.write("go\n")
            old.stdin.flush()
            told = json.loads(old.stdout.readline() or "{}")
            assert old.wait(timeout=30) == 0, old.stderr.read() if old.stderr else ""
            assert not (path / CLOSED).exists()  # a fenced close is not a clean one
            # nothing the stale holder tried landed; the new holder's writes stand
            assert new.session(uuid.UUID(int=2)) is None
            assert new.session(uuid.UUID(int=3)) is None
            assert new.session(uuid.UUID(int=1)) is not None
            assert new.session(uuid.UUID(int=4)) is not None
            new.write(WriteBatch().session(record(5)))  # and it goes on writing
            assert new.fenced is None
            assert not new.refusing
            return told
    finally:
        if old.poll() is None:
            old.send_signal(signal.SIGCONT)
            old.kill()
            old.wait(timeout=10)


def test_a_stale_holders_commits_are_refused_and_the_new_holders_stand(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with subprocess.Popen(
        [sys.executable, "-c", _OLD_HOLDER, str(path)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as old:
        told = _take_over(path, old)
    assert [o["how"] for o in told["outcomes"]] == ["write", "submit", "awrite"]
    for outcome in told["outcomes"]:
        assert outcome["type"] == "StoreFencedError", outcome
        assert outcome["code"] == ErrorCode.STORE_FENCED.value
        assert "opened by another process" in outcome["message"]
        assert "incarnation is 2, this process holds 1" in outcome["message"]
    assert told["refusing"] is True
    assert told["fenced"] is True
    with Store(path) as again:
        assert again.incarnation == 3
        kept = {r.info.session_id.int for r in again.sessions() if isinstance(r, SessionRecord)}
        assert kept == {1, 4, 5}


def _bump_incarnation_behind(store: Store) -> None:
    """What another process's open does to the store: its incarnation moves on
    (written through this handle's own writer, whose check runs before the put)."""
    assert store.meta is not None
    moved = msgspec.structs.replace(store.meta, incarnation=store.meta.incarnation + 1)
    store.write(WriteBatch().raw("meta", b"meta", msgspec.msgpack.encode(moved)))


def test_a_fenced_node_refuses_new_work_with_the_code_and_goes_on_answering(
    tmp_path: Path,
) -> None:
    def main_skill(session: Any) -> None:
        return None

    def work(session: Any) -> str:
        return "ok"

    agent = Agent("agent", {"main": main_skill, "work": work}, main_skill="main")
    store = Store(tmp_path / "store")
    node = Node([agent], NodeConfig(), store=store)
    try:
        main = node.main("agent")
        _bump_incarnation_behind(store)
        answer = main.spawn(kind="worker", skill="work", task="x")
        assert not answer.ok
        assert answer.error is not None
        assert answer.error.code is ErrorCode.STORE_FENCED
        assert store.refusing
        assert isinstance(store.fenced, StoreFencedError)
        assert node.get(main).state is SessionState.ACTIVE  # reads go on
        with pytest.raises(StoreFencedError):
            store.write(WriteBatch().session(record(9)))
    finally:
        node.shutdown(grace=0, timeout=5.0)
        store.close()
    with Store(tmp_path / "store") as reopened:
        assert reopened.session(uuid.UUID(int=9)) is None


def test_every_open_bumps_the_incarnation_and_a_read_only_open_does_not(tmp_path: Path) -> None:
    path = tmp_path / "store"
    for expected in (1, 2, 3):
        with Store(path) as store:
            assert store.incarnation == expected
            assert store.meta is not None
            assert store.meta.incarnation == expected
    with Store(path, readonly=True) as reader:
        assert reader.incarnation == 3
    with Store(path) as store:
        assert store.incarnation == 4


def test_a_slot_epoch_moves_persists_and_fences_the_writes_built_on_an_older_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Store(path) as store:
        assert store.slots.epoch(7) == 0
        store.write(WriteBatch().slot_epoch(7, 1, expected=0))
        assert store.slots.epoch(7) == 1
        # a write built on epoch 0 (the slot moved since) is refused, alone:
        # a batch committing in the same group lands
        stale = store.submit(WriteBatch().in_slot(7, 0).session(record(1)))
        current = store.submit(WriteBatch().in_slot(7, 1).session(record(2)))
        other = store.submit(WriteBatch().session(record(3)))
        with pytest.raises(StoreFencedError) as refused:
            stale.result(10)
        assert refused.value.slot == 7
        assert refused.value.to_info().detail["slot"] == 7
        assert "slot 7 is at epoch 1, the write was built for epoch 0" in str(refused.value)
        current.result(10)
        other.result(10)
        assert store.session(uuid.UUID(int=1)) is None
        assert store.session(uuid.UUID(int=2)) is not None
        # two moves built on one epoch: one lands, the other is fenced
        store.write(WriteBatch().slot_epoch(7, 2, expected=1))
        with pytest.raises(StoreFencedError):
            store.write(WriteBatch().slot_epoch(7, 2, expected=1))
        assert store.fenced is None  # a slot's fence refuses that batch, not the store
        assert not store.refusing
        store.write(WriteBatch().slot_epoch(16_383, 5, expected=0))
    with Store(path) as store:
        assert store.slots.epoch(7) == 2
        assert store.slots.epoch(16_383) == 5
        assert store.slots.epoch(8) == 0
        with pytest.raises(RejectedInputError) as refused_slot:
            store.slots.epoch(16_384)
        assert refused_slot.value.field == "slot"
        slots = [msgspec.msgpack.decode(raw, type=SlotRecord) for _, raw in store.scan("slots")]
        assert [(s.slot, s.epoch) for s in slots] == [(7, 2), (16_383, 5)]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda b: b.in_slot(16_384, 0), "slot"),
        (lambda b: b.in_slot(-1, 0), "slot"),
        (lambda b: b.in_slot(True, 0), "slot"),
        (lambda b: b.in_slot(3, -1), "epoch"),
        (lambda b: b.in_slot(3, 2**63), "epoch"),
        (lambda b: b.slot_epoch(3, 1, expected=1), "epoch"),
        (lambda b: b.slot_epoch(3, 0, expected=1), "epoch"),
    ],
)
def test_a_bad_slot_or_epoch_is_refused_naming_the_field(build: Any, field: str) -> None:
    batch = WriteBatch()
    with pytest.raises(RejectedInputError) as refused:
        build(batch)
    assert refused.value.field == field
    assert not batch  # nothing was added


def test_a_fenced_handle_stays_fenced_closes_and_the_store_reopens(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store(path) as store:
        _bump_incarnation_behind(store)
        for n in (1, 2):
            with pytest.raises(StoreFencedError):
                store.write(WriteBatch().session(record(n)))
        fenced = store.fenced
        assert isinstance(fenced, StoreError)
        assert fenced.to_info().detail["path"] == store.path
        store.flush()  # nothing to write: not refused
    with Store(path) as store:
        assert store.incarnation == 3  # the bump behind it counted: 2, then this open
        assert store.count("sessions") == 0


def test_an_import_keeps_the_stores_own_incarnation_and_slot_epochs(tmp_path: Path) -> None:
    exported = tmp_path / "export.jsonl"
    with Store(tmp_path / "source") as source:
        source.write(WriteBatch().session(record(1)).slot_epoch(5, 9, expected=0))
        export_jsonl(source, exported)
        source_meta = source.meta
    assert source_meta is not None
    for _ in range(2):
        Store(tmp_path / "target").close()
    with Store(tmp_path / "target") as target:
        assert target.incarnation == 3
        target.write(WriteBatch().slot_epoch(2, 4, expected=0))
        import_jsonl(target, exported)  # slot epochs do not make a store "not empty"
        assert target.meta is not None
        assert target.meta.node_id == source_meta.node_id  # the restore's identity
        assert target.incarnation == 3  # this handle still holds the store
        target.write(WriteBatch().session(record(2)))  # not fenced by its own import
        import_jsonl(target, exported, replace=True)
        assert (target.slots.epoch(2), target.slots.epoch(5)) == (4, 0)  # not exported, kept
        target.write(WriteBatch().session(record(3)))
        assert target.fenced is None


def test_moving_a_slot_moves_its_epoch_on_at_both_ends(tmp_path: Path) -> None:
    """The export carries the slot's epoch; the import sets it past both that
    one and the importer's; the release moves it on at the source: a write
    fenced on the old epoch fails at either end."""
    slot = 12
    sid = new_session_id(slot)
    with Store(tmp_path / "src") as src, Store(tmp_path / "dst") as dst:
        src.write(WriteBatch().raw("usage", sid.bytes, b"u").slot_epoch(slot, 4, expected=0))
        dst.write(WriteBatch().slot_epoch(slot, 6, expected=0))  # it held the slot once
        data = src.slots.export(slot)
        assert read_slot_export(data).header.epoch == 4
        dst.slots.import_(data)
        assert dst.slots.epoch(slot) == 7  # past 4 and past its own 6
        src.slots.release(slot, "dst")
        assert src.slots.epoch(slot) == 5
        for store, old in ((src, 4), (dst, 6)):
            with pytest.raises(StoreFencedError) as stale:
                store.write(WriteBatch().raw("cycles", sid.bytes, b"late").in_slot(slot, old))
            assert stale.value.to_info().detail["slot"] == slot
        assert dst.count("cycles") == 0
        assert src.count("cycles") == 0


def test_a_fenced_handle_neither_imports_nor_releases_a_slot(tmp_path: Path) -> None:
    slot = 13
    sid = new_session_id(slot)
    with Store(tmp_path / "src") as src:
        src.write(WriteBatch().raw("usage", sid.bytes, b"u"))
        data = src.slots.export(slot)
    with Store(tmp_path / "stale") as stale:
        _bump_incarnation_behind(stale)
        with pytest.raises(StoreFencedError):
            stale.slots.import_(data)
        assert stale.count("usage") == 0
        stale_src = tmp_path / "src"
    with Store(stale_src) as held:
        _bump_incarnation_behind(held)
        with pytest.raises(StoreFencedError):
            held.slots.release(slot, "elsewhere")
        assert held.slots.moved(slot) is None
    with Store(stale_src) as reopened:
        assert reopened.count("usage") == 1  # nothing was deleted
        assert reopened.slots.moved(slot) is None
