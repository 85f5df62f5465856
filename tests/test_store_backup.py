"""Backups an operator trusts: ``Store.backup`` while 64 producers write holds
every write acknowledged before it began; ``sessiontree store backup`` beside a
running node, restored in place; a restore from an export; ``store verify``
(clean, records that do not decode, the quarantine) and its exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from sessiontree.protocol import SessionInfo, SessionKind, SessionState, StoreError
from sessiontree.store import (
    ContextEntry,
    ContextRecord,
    QuarantineRecord,
    SessionRecord,
    Store,
    WriteBatch,
    encode_record,
    verify_store,
)
from sessiontree.supervision import Agent, Node, NodeConfig
from tests._running_node import ROOT, RunningNode

pytestmark = pytest.mark.timeout(180)

PRODUCERS = 64
WAIT = 30.0  # real seconds a bounded wait may take
EXIT_RECORDS_UNREADABLE = 65


def record(session_id: uuid.UUID, note: str = "") -> SessionRecord:
    info = SessionInfo(
        session_id=session_id,
        agent_id="assistant",
        parent_id=None,
        kind=SessionKind.MAIN,
        state=SessionState.ACTIVE,
        depth=0,
        created_at=1_700_000_000.0,
        ttl=None,
        deadline=None,
        key=f"internal:main:{session_id.hex}",
        skill="main",
    )
    context = ContextRecord(messages=[ContextEntry(role="user", content=note or "x" * 200)])
    return SessionRecord(info=info, context=context, updated_at=1_700_000_000.0)


def sessiontree(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def stored_ids(path: Path) -> set[uuid.UUID]:
    with Store(path, readonly=True) as store:
        return {r.info.session_id for r in store.sessions() if isinstance(r, SessionRecord)}


# -- a hot backup under load ----------------------------------------------------------------


def test_a_backup_while_64_producers_write_holds_every_write_acknowledged_before_it(
    tmp_path: Path,
) -> None:
    acked: list[list[uuid.UUID]] = [[] for _ in range(PRODUCERS)]
    ready = [threading.Event() for _ in range(PRODUCERS)]
    stop = threading.Event()
    errors: list[BaseException] = []

    with Store(tmp_path / "live") as store:

        def produce(i: int) -> None:
            try:
                while not stop.is_set():
                    session_id = uuid.uuid4()
                    store.write(WriteBatch().session(record(session_id, f"producer {i}")))
                    acked[i].append(session_id)  # acknowledged: the write call returned
                    if len(acked[i]) == 3:
                        ready[i].set()
            except BaseException as exc:
                errors.append(exc)
                ready[i].set()

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
        for thread in threads:
            thread.start()
        try:
            for event in ready:
                assert event.wait(WAIT)
            before = [list(ids) for ids in acked]  # every one acknowledged before the backup
            made = store.backup(tmp_path / "backup")
            during = sum(map(len, acked))
        finally:
            stop.set()
            for thread in threads:
                thread.join(WAIT)
        assert not errors
        after = sum(map(len, acked))
        assert sum(map(len, before)) >= 3 * PRODUCERS
        assert after > sum(map(len, before))  # the producers wrote on around the copy

    assert made.path == str((tmp_path / "backup").absolute())
    assert made.bytes == (tmp_path / "backup" / "data.mdb").stat().st_size
    in_backup = stored_ids(tmp_path / "backup")
    missing = [sid for ids in before for sid in ids if sid not in in_backup]
    assert missing == []
    assert len(in_backup) <= during
    with Store(tmp_path / "backup", readonly=True) as copy:
        found = verify_store(copy)
        assert found.clean, found.problems
        assert found.entries["sessions"] == len(in_backup)
    proc = sessiontree("store", "verify", "--store", str(tmp_path / "backup"))
    assert proc.returncode == 0, proc.stderr
    assert "clean" in proc.stdout
    # the backup is a store of its own: a node opens it for writing
    with Store(tmp_path / "backup") as reopened:
        reopened.write(WriteBatch().session(record(uuid.uuid4())))
        assert reopened.count("sessions") == len(in_backup) + 1


def test_a_backup_from_inside_a_running_embedded_node(tmp_path: Path) -> None:
    async def main(session: object) -> None:
        return None

    node = Node([Agent("a", {"main": main}, main_skill="main")], NodeConfig(), store=tmp_path / "s")
    try:
        mains = [node.main("a", f"internal:main:{n}").session_id for n in range(5)]
        assert node.store is not None
        made = node.store.backup(tmp_path / "backup", compact=True)
        assert made.compact
    finally:
        node.shutdown(grace=0)
    assert set(mains) <= stored_ids(tmp_path / "backup")


def test_the_backup_refuses_a_destination_that_is_not_empty(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        store.write(WriteBatch().session(record(uuid.uuid4())))
        (tmp_path / "taken").mkdir()
        (tmp_path / "taken" / "keep.txt").write_text("mine")
        with pytest.raises(StoreError, match="taken exists and is not an empty directory"):
            store.backup(tmp_path / "taken")
        (tmp_path / "empty").mkdir()
        store.backup(tmp_path / "empty")  # an empty directory is fine
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "s", "taken"]  # no leftovers
    proc = sessiontree("store", "backup", "--store", str(tmp_path / "s"), str(tmp_path / "taken"))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("Error: backup destination")


# -- the CLI beside a running node, and restoring -----------------------------------------------


def test_store_backup_beside_a_running_node_restores_in_place(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = RunningNode(store, "--grace", "2")
    try:
        mains = set()
        for n in range(4):
            made = node.http.post(
                "/v1/sessions", json={"agent_id": "assistant", "key": f"internal:main:{n}"}
            )
            assert made.status_code < 300, made.text
            mains.add(uuid.UUID(made.json()["info"]["session_id"]))
        proc = sessiontree("store", "backup", "--store", str(store), str(tmp_path / "backup"))
        assert proc.returncode == 0, proc.stderr
        assert f"to {tmp_path / 'backup'}" in proc.stdout
        assert node.http.get("/readyz").status_code == 200  # the node never noticed
    finally:
        assert node.stop() == 0
    # restore: the backup directory in place of the store directory
    shutil.rmtree(store)
    shutil.copytree(tmp_path / "backup", store)
    listed = sessiontree("sessions", "ls", "--store", str(store), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["items"]
    assert mains <= {uuid.UUID(row["session_id"]) for row in rows}
    assert sessiontree("store", "verify", "--store", str(store)).returncode == 0


def _modes(directory: Path) -> dict[str, int]:
    """The permission bits of ``directory`` ("." ) and of each file in it."""
    found = {".": directory.stat().st_mode & 0o777}
    found.update({p.name: p.stat().st_mode & 0o777 for p in directory.iterdir()})
    return found


def test_a_store_and_its_backups_are_their_owners_alone(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = RunningNode(store)
    try:
        made = node.http.post("/v1/sessions", json={"agent_id": "assistant"})
        assert made.status_code == 200, made.text
        for compact in (False, True):
            dest = tmp_path / f"backup-{compact}"
            flags = ["--compact"] if compact else []
            proc = sessiontree("store", "backup", "--store", str(store), str(dest), *flags)
            assert proc.returncode == 0, proc.stderr
            assert _modes(dest) == {".": 0o700, "data.mdb": 0o600, "sessiontree.marker": 0o600}
    finally:
        assert node.stop() == 0
    assert _modes(store) == {
        ".": 0o700,
        "data.mdb": 0o600,
        "lock.mdb": 0o600,
        "writer.lock": 0o600,
        "sessiontree.marker": 0o600,
        "sessiontree.closed": 0o600,  # the node stopped cleanly
    }


def test_a_compact_backup_reports_the_transaction_it_copied(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        for _ in range(5):
            store.write(WriteBatch().session(record(uuid.uuid4())))
        last = store._opened.env.info()["last_txnid"]
        assert last > 5
        made = store.backup(tmp_path / "compact", compact=True)
        plain = store.backup(tmp_path / "plain")
    assert (made.txnid, plain.txnid) == (last, last)  # the copy's own file says 1
    proc = sessiontree(
        "store", "backup", "--compact", "--store", str(tmp_path / "s"), str(tmp_path / "cli")
    )
    assert proc.returncode == 0, proc.stderr
    assert f"up to transaction {last}," in proc.stdout
    with Store(tmp_path / "compact", readonly=True) as copied:
        assert copied.count("sessions") == 5


def test_restoring_from_an_export_gives_back_the_same_store(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        batch = WriteBatch()
        for _ in range(50):
            batch.session(record(uuid.uuid4()))
        store.write(batch)
    out = tmp_path / "s.jsonl"
    assert (
        sessiontree("store", "export", "--store", str(tmp_path / "s"), "--out", str(out)).returncode
        == 0
    )
    proc = sessiontree("store", "import", "--store", str(tmp_path / "restored"), str(out))
    assert proc.returncode == 0, proc.stderr
    assert stored_ids(tmp_path / "restored") == stored_ids(tmp_path / "s")
    again = tmp_path / "again.jsonl"
    assert (
        sessiontree("export", "--store", str(tmp_path / "restored"), "--out", str(again)).returncode
        == 0
    )
    assert again.read_bytes() == out.read_bytes()
    assert sessiontree("store", "verify", "--store", str(tmp_path / "restored")).returncode == 0


# -- verify ----------------------------------------------------------------------------------


def test_verify_names_records_that_do_not_decode_and_exits_65(tmp_path: Path) -> None:
    bad = uuid.UUID(int=7)
    with Store(tmp_path / "s") as store:
        store.write(
            WriteBatch()
            .session(record(uuid.uuid4()))
            .raw("sessions", bad.bytes, b"\xc1 not msgpack")
            .raw("children", b"short", b"")
        )
    proc = sessiontree("store", "verify", "--store", str(tmp_path / "s"))
    assert proc.returncode == EXIT_RECORDS_UNREADABLE, proc.stderr
    assert f"unreadable sessions {bad.bytes.hex()}" in proc.stdout
    assert f"unreadable children {b'short'.hex()}" in proc.stdout
    assert proc.stderr.strip() == f"Error: 2 records of {(tmp_path / 's').resolve()} do not decode"
    as_json = sessiontree("store", "verify", "--store", str(tmp_path / "s"), "--json")
    assert as_json.returncode == EXIT_RECORDS_UNREADABLE
    found = json.loads(as_json.stdout)
    assert found["clean"] is False
    assert found["unreadable"] == {"sessions": 1, "children": 1}
    assert found["entries"]["sessions"] == 2


def test_verify_lists_the_quarantine_and_passes(tmp_path: Path) -> None:
    set_aside = QuarantineRecord(
        db="inbox", key=b"\x01" * 24, raw=b"\xc1", reason="does not decode", at=1_700_000_000.0
    )
    with Store(tmp_path / "s") as store:
        store.write(WriteBatch().session(record(uuid.uuid4())).quarantine(set_aside))
        found = verify_store(store)
    assert found.clean
    assert [(q.db, q.key) for q in found.quarantined] == [("inbox", b"\x01" * 24)]
    proc = sessiontree("store", "verify", "--store", str(tmp_path / "s"), "--json")
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert listed["clean"] is True
    assert listed["quarantined"] == [
        {"db": "inbox", "key": ("01" * 24), "reason": "does not decode", "at": 1_700_000_000.0}
    ]
    assert listed["entries"]["quarantine"] == 1


def test_verify_of_a_record_filed_under_another_key(tmp_path: Path) -> None:
    one = record(uuid.UUID(int=1))
    with Store(tmp_path / "s") as store:
        store.write(WriteBatch().raw("sessions", uuid.UUID(int=2).bytes, encode_record(one)))
        found = verify_store(store)
    assert not found.clean
    reason = found.problems[0].reason
    assert reason.startswith(f"sessions record {uuid.UUID(int=2).bytes.hex()} belongs under")
    assert f"its SessionRecord names {uuid.UUID(int=1).bytes.hex()}" in reason


def test_verify_runs_beside_the_writer_holding_the_store(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        store.write(WriteBatch().session(record(uuid.uuid4())))
        proc = sessiontree("store", "verify", "--store", str(tmp_path / "s"), "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["entries"]["sessions"] == 1
        store.write(WriteBatch().session(record(uuid.uuid4())))
