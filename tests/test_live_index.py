"""The index of live sessions: kept by the writer with the records, built once
for an older store, and all a start-up reads of the sessions."""

from __future__ import annotations

import io
import logging
import pathlib
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from sessiontree.protocol import SessionInfo, SessionKind, SessionResult, SessionState
from sessiontree.store import (
    LIVE_INDEXED,
    SessionRecord,
    StartsRecord,
    Store,
    WriteBatch,
    encode_record,
    export_jsonl,
    import_jsonl,
)
from sessiontree.supervision import Agent, Node, NodeConfig, _recovery

pytestmark = pytest.mark.timeout(60)

NOW = 1_700_000_000.0


def info(state: SessionState, kind: SessionKind = SessionKind.BRANCH) -> SessionInfo:
    return SessionInfo(
        session_id=uuid.uuid4(),
        agent_id="agent",
        parent_id=None if kind is SessionKind.MAIN else uuid.uuid4(),
        kind=kind,
        state=state,
        depth=0 if kind is SessionKind.MAIN else 1,
        created_at=NOW,
        ttl=None,
        deadline=None,
        skill="main" if kind is SessionKind.MAIN else "work",
    )


def ended(record_info: SessionInfo) -> SessionRecord:
    result = SessionResult(session_id=record_info.session_id, status=record_info.state)
    return SessionRecord(info=record_info, result=result)


def live_keys(store: Store) -> set[bytes]:
    return {key for key, _ in store.scan("live") if key != LIVE_INDEXED}


def test_every_session_write_keeps_the_index_in_the_same_batch(tmp_path: pathlib.Path) -> None:
    active = info(SessionState.ACTIVE)
    with Store(tmp_path / "s") as store:
        store.write(WriteBatch().session(SessionRecord(info=active)))
        assert live_keys(store) == {active.session_id.bytes}
        done = msgspec.structs.replace(active, state=SessionState.COMPLETED)
        store.write(WriteBatch().ended(ended(done), uuid.uuid4(), parent_ended=False))
        assert live_keys(store) == set()
        again = info(SessionState.SUSPENDED)
        store.write(WriteBatch().session(SessionRecord(info=again)))
        store.write(WriteBatch().forget_session(again.session_id))
        assert live_keys(store) == set()


def test_a_store_written_before_the_index_is_indexed_once_at_open(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    live = [info(SessionState.ACTIVE), info(SessionState.SUSPENDED)]
    done = [info(SessionState.COMPLETED), info(SessionState.FAILED), info(SessionState.EXPIRED)]
    with Store(tmp_path / "s") as store:  # as an older version wrote it: records only
        batch = WriteBatch().raw_delete("live", LIVE_INDEXED)
        for record_info in live:
            batch.raw(
                "sessions",
                record_info.session_id.bytes,
                encode_record(SessionRecord(info=record_info)),
            )
        for record_info in done:
            batch.raw("sessions", record_info.session_id.bytes, encode_record(ended(record_info)))
        store.write(batch)
    with caplog.at_level(logging.INFO, logger="sessiontree.store"), Store(tmp_path / "s") as store:
        assert live_keys(store) == {i.session_id.bytes for i in live}
    said = [r.getMessage() for r in caplog.records if "indexed" in r.getMessage()]
    assert len(said) == 1
    assert "2 live sessions of 5 records" in said[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sessiontree.store"), Store(tmp_path / "s"):
        pass
    assert not [r for r in caplog.records if "indexed" in r.getMessage()]  # once


def test_a_start_up_decodes_only_the_live_sessions(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of many ended sessions and a few live ones: recovery decodes the
    live ones, whatever the number of ended ones."""
    main = info(SessionState.ACTIVE, SessionKind.MAIN)
    running = [info(SessionState.ACTIVE) for _ in range(3)]
    with Store(tmp_path / "s") as store:
        batch = WriteBatch().session(SessionRecord(info=main))
        for record_info in running:
            batch.session(SessionRecord(info=record_info))
        for _ in range(500):
            batch.session(ended(info(SessionState.COMPLETED)))
        store.write(batch)
    decoded: list[Any] = []
    real: Callable[..., Any] = _recovery.decode_record

    def counting(kind: Any, raw: bytes, *, db: str, key: bytes) -> Any:
        if db == "sessions":
            decoded.append(key)
        return real(kind, raw, db=db, key=key)

    monkeypatch.setattr(_recovery, "decode_record", counting)

    def work(session: Any) -> str:
        return "ok"

    def main_skill(session: Any) -> None:
        return None

    agent = Agent("agent", {"main": main_skill, "work": work}, main_skill="main")
    node = Node([agent], NodeConfig(), store=str(tmp_path / "s"))
    try:
        assert len(decoded) == 4  # the Main and the three running branches
        assert node.recovery.figures["failed"] == 3  # they were running: ended, node_restarted
        assert node.recovery.figures["terminal"] == 500
        assert node.store is not None
        assert live_keys(node.store) == {main.session_id.bytes}
    finally:
        node.shutdown()


def test_an_import_writes_the_index_of_what_it_brings(tmp_path: pathlib.Path) -> None:
    active, done = info(SessionState.ACTIVE), info(SessionState.COMPLETED)
    out = io.BytesIO()
    with Store(tmp_path / "a") as source:
        source.write(WriteBatch().session(SessionRecord(info=active)).session(ended(done)))
        export_jsonl(source, out)
    with Store(tmp_path / "b") as target:
        import_jsonl(target, io.BytesIO(out.getvalue()))
        assert live_keys(target) == {active.session_id.bytes}
        import_jsonl(target, io.BytesIO(out.getvalue()), replace=True)
        assert live_keys(target) == {active.session_id.bytes}
        assert target.count("live") == 2  # and the mark that the index is kept


def test_a_spawn_with_a_request_id_sets_aside_an_unreadable_ended_sibling(
    tmp_path: pathlib.Path,
) -> None:
    """After a restart, a spawn with a ``request_id`` reads the parent's ended
    children (their ids' requests); one that does not decode is quarantined
    then, never a failure of the node."""

    def work(session: Any) -> str:
        return "w"

    def agent() -> Agent:
        return Agent("agent", {"main": lambda session: None, "work": work})

    path = tmp_path / "s"
    node = Node([agent()], NodeConfig(), store=str(path))
    main = node.main("agent")
    child = main.spawn(kind="worker", skill="work", request_id="a").ref
    assert child is not None
    assert child.wait(10.0) is not None
    node.shutdown()
    with Store(path) as store:
        store.write(WriteBatch().raw("sessions", child.session_id.bytes, b"\xff\x00not a record"))
    node = Node([agent()], NodeConfig(), store=str(path))
    try:
        spawned = node.main("agent").spawn(kind="worker", skill="work", request_id="b")
        assert spawned.ok, spawned.error
        assert node.failure is None
        assert node.stats()["store_quarantined"] == 1
    finally:
        node.shutdown(grace=0)


def test_a_run_from_outside_writes_a_worker_under_a_running_branch(
    tmp_path: pathlib.Path,
) -> None:
    """Only a skill's own spawn of a worker under its running Branch goes
    unwritten: a ``run`` from outside is acknowledged, and written."""

    def holds(session: Any) -> str:
        session.sleep(1000.0)
        return "held"

    def work(session: Any) -> str:
        return "w"

    agent = Agent("agent", {"main": lambda session: None, "holds": holds, "work": work})
    node = Node([agent], NodeConfig(), store=str(tmp_path / "s"))
    try:
        branch = node.main("agent").spawn(kind="branch", skill="holds").ref
        assert branch is not None
        result = branch.run(kind="worker", skill="work")
        assert result is not None
        assert result.ok
        assert node.store is not None
        node.store.flush()
        record = node.store.session(result.session_id)
        assert record is not None
        assert record.info.state is SessionState.COMPLETED
    finally:
        node.shutdown(grace=0)


def test_a_start_by_a_build_that_does_not_keep_the_index_has_it_rebuilt(
    tmp_path: pathlib.Path,
) -> None:
    """A store opened by an older build (which writes records, not the index)
    after this one: the next open sees a start later than the index's stamp
    and builds the index again, so no live session is missed."""
    path = tmp_path / "s"
    with Store(path) as store:
        store.write(WriteBatch().starts(StartsRecord(running=False, started_at=NOW)))
    missed = info(SessionState.ACTIVE)
    with Store(path) as store:  # what an older build leaves: a record, a later start
        batch = WriteBatch().raw(
            "sessions", missed.session_id.bytes, encode_record(SessionRecord(info=missed))
        )
        batch.raw("meta", b"starts", encode_record(StartsRecord(started_at=NOW + 60.0)))
        store.write(batch)
    with Store(path) as store:
        assert live_keys(store) == {missed.session_id.bytes}
