"""A damaged record is named, never fatal: whatever a flipped byte makes the
decoder raise (a bad UTF-8 byte, nesting past msgspec's limit, a type's own
checks), and a record that decodes but names another key or a branch its
conversation does not hold, is a ``CorruptRecordError`` naming the database
and key. A node start quarantines and counts what recovery reads (a result
filed on a session among them); later reads answer a typed 503 from the HTTP
API and exit 74 with one line from the CLI, in real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from sessiontree.protocol import (
    CorruptRecordError,
    ErrorCode,
    Recording,
    RecordingError,
    SessionResult,
    SessionState,
    Usage,
)
from sessiontree.store import (
    MemoryRecord,
    ReceivedRecord,
    RecordingRecord,
    Store,
    UsageRecord,
    decode_id,
    decode_record,
    encode_record,
    verify_store,
)
from sessiontree.store._env import MARKER
from sessiontree.supervision import Node, NodeConfig
from tests._damaged_store import IDS, build, flip_in_file, stored_entries
from tests._running_node import ROOT, RunningNode
from tests.node_agents import agents

pytestmark = pytest.mark.timeout(120)

EXIT_STORE_DAMAGED = 74
BAD_UTF8 = 0x9A  # a continuation byte where a character must start
MAIN = str(IDS.main)


def sessiontree(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def value_of(store: Path, db: str, key: bytes) -> bytes:
    return next(raw for d, k, raw in stored_entries(store) if d == db and k == key)


def spoil_text(store: Path, db: str, key: bytes, text: str) -> None:
    """Make the first character of ``text`` in the value under ``key`` a bad
    UTF-8 byte, in the file itself (the msgpack string stays well-formed)."""
    raw = value_of(store, db, key)
    at = raw.index(text.encode())
    flip_in_file(store, db, key, at, raw[at] ^ BAD_UTF8)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a failing command wrote on stderr (no signal, no traceback)."""
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- the one decode helper --------------------------------------------------------------------


def _memory(value: object) -> bytes:
    return encode_record(
        MemoryRecord(
            agent_id="a", key="k", memory_id="m", value=value, session_id=IDS.main, written_at=0.0
        )
    )


def _bad_utf8() -> bytes:
    raw = bytearray(_memory("abcde"))
    raw[raw.index(b"abcde")] = BAD_UTF8
    return bytes(raw)


def _too_deep() -> bytes:
    # a value nested past msgspec's limit (it raises RecursionError), then nil
    return _memory("x").replace(b"\xa1x", b"\x91" * 100_000 + b"\xc0")


@pytest.mark.parametrize(
    ("raw", "cause"),
    [
        pytest.param(_bad_utf8(), "UnicodeDecodeError", id="bad-utf8"),
        pytest.param(_too_deep(), "RecursionError", id="too-deep"),
        pytest.param(b"\xc1", "DecodeError", id="not-msgpack"),
        pytest.param(_memory("x")[:-3], "DecodeError", id="cut-short"),
    ],
)
def test_any_failure_of_the_bytes_is_a_corrupt_record_error(raw: bytes, cause: str) -> None:
    key = b"a\x00k"
    with pytest.raises(CorruptRecordError) as caught:
        decode_record(MemoryRecord, raw, db="memory", key=key)
    error = caught.value
    assert (error.db, error.key) == ("memory", key)
    assert str(error).startswith(f"memory record {key.hex()} does not decode as MemoryRecord: ")
    assert cause in str(error)
    assert error.to_info().code is ErrorCode.CORRUPT_RECORD
    assert error.to_info().detail == {"db": "memory", "key": key.hex()}


def test_the_issues_bytes_are_a_corrupt_record_error() -> None:
    class S(msgspec.Struct):
        v: int
        name: str

    with pytest.raises(CorruptRecordError, match="UnicodeDecodeError"):
        decode_record(S, b"\x82\xa1v\x01\xa4name\xa6ab\x9acde", db="x", key=b"k")


def test_a_record_that_names_another_key_is_corrupt() -> None:
    usage = encode_record(UsageRecord(session_id=IDS.main, own=Usage(), subtree=Usage()))
    assert decode_record(UsageRecord, usage, db="usage", key=IDS.main.bytes).session_id == IDS.main
    with pytest.raises(CorruptRecordError) as caught:
        decode_record(UsageRecord, usage, db="usage", key=IDS.done.bytes)
    assert f"belongs under another key: its UsageRecord names {IDS.main.bytes.hex()}" in str(
        caught.value
    )
    # a filed result belongs under its parent (the key's first half) and itself
    result = SessionResult(session_id=IDS.done, status=SessionState.COMPLETED)
    filed = encode_record(ReceivedRecord(result=result))
    pair = IDS.main.bytes + IDS.done.bytes
    assert decode_record(ReceivedRecord, filed, db="received", key=pair).result == result
    with pytest.raises(CorruptRecordError, match="belongs under another key"):
        decode_record(ReceivedRecord, filed, db="received", key=IDS.main.bytes + IDS.owed.bytes)


def test_a_stored_id_of_another_length_is_corrupt() -> None:
    assert decode_id(IDS.main.bytes, db="mains", key=b"k") == IDS.main
    with pytest.raises(CorruptRecordError, match="holds 15 bytes where a 16-byte id belongs"):
        decode_id(IDS.main.bytes[:15], db="mains", key=b"k")


def test_a_recording_with_a_bad_byte_is_a_recording_error(tmp_path: Path) -> None:
    build(tmp_path / "s")
    raw = value_of(tmp_path / "s", "recordings", IDS.done.bytes)
    data = bytearray(decode_record(RecordingRecord, raw, db="recordings", key=IDS.done.bytes).data)
    data[data.index(b"work")] = BAD_UTF8
    with pytest.raises(RecordingError) as caught:
        Recording.decode(bytes(data))
    assert caught.value.reason == "malformed"
    assert "UnicodeDecodeError" in str(caught.value)


# -- reads through the store --------------------------------------------------------------------


def test_a_conversation_naming_a_branch_it_lacks_is_corrupt(tmp_path: Path) -> None:
    store = tmp_path / "s"
    build(store)
    raw = value_of(store, "conversations", IDS.main.bytes)
    at = raw.index(b"branch_0000000a")  # the current branch's id: a valid, other string
    flip_in_file(store, "conversations", IDS.main.bytes, at, ord("b") ^ ord("r"))
    with Store(store, readonly=True) as opened, pytest.raises(CorruptRecordError) as caught:
        opened.conversation(IDS.main)
    assert caught.value.db == "conversations"
    assert "names the current branch 'rranch_0000000a'" in str(caught.value)


def test_reads_that_skipped_an_unreadable_record_raise(tmp_path: Path) -> None:
    store = tmp_path / "s"
    build(store)
    filed = IDS.main.bytes + IDS.done.bytes
    spoil_text(store, "received", filed, "completed ✓")
    spoil_text(store, "messages", IDS.main.bytes + IDS.answer.bytes, "hi ✓")
    spoil_text(store, "wedged", IDS.wedged.bytes, "poison")
    with Store(store, readonly=True) as opened:
        with pytest.raises(CorruptRecordError) as caught:
            opened.received(IDS.main)
        assert (caught.value.db, caught.value.key) == ("received", filed)
        with pytest.raises(CorruptRecordError, match="messages record"):
            list(opened.messages(IDS.main))
        with pytest.raises(CorruptRecordError, match="wedged record"):
            opened.wedged_list()
        found = verify_store(opened)
    assert found.unreadable == {
        **dict.fromkeys(found.entries, 0),
        "received": 1,
        "messages": 1,
        "wedged": 1,
    }


def test_a_corrupt_received_record_is_quarantined_and_counted_at_start(tmp_path: Path) -> None:
    store = tmp_path / "s"
    build(store)
    filed = IDS.main.bytes + IDS.done.bytes
    spoil_text(store, "received", filed, "completed ✓")
    spoil_text(store, "usage", IDS.parked.bytes, str(IDS.parked))  # and a usage record
    node = Node(agents(), NodeConfig(), store=str(store))
    try:
        assert node.recovery.figures["quarantined"] == 2
        assert node.store is not None
        set_aside = {(q.db, q.key) for q in node.store.quarantine_list()}
        assert {("received", filed), ("usage", IDS.parked.bytes)} <= set_aside
        assert node.stats()["store_quarantined"] == 2
        # the Main's results read without it (the owed one was delivered meanwhile)
        assert IDS.done not in {r.session_id for r in node.results(IDS.main)}
    finally:
        node.shutdown()


def test_a_meta_record_that_does_not_decode_is_written_again_from_the_marker(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    build(store)
    (store / MARKER).write_text('{"v":4,"node_id":"node-fuzz","created_at":1700000000.0}\n')
    spoil_text(store, "meta", b"meta", "node-fuzz")
    with Store(store, readonly=True) as opened:  # a read-only open still reads the rest
        assert opened.meta is None
        assert verify_store(opened).unreadable["meta"] == 1
        before = {(q.db, q.key) for q in opened.quarantine_list()}
    with Store(store) as opened:
        assert opened.meta is not None
        assert opened.meta.node_id == "node-fuzz"
        assert opened.quarantined == 1
        after = {(q.db, q.key): q for q in opened.quarantine_list()}
        assert set(after) == before | {("meta", b"meta")}
        assert "UnicodeDecodeError" in after["meta", b"meta"].reason
    with Store(store, readonly=True) as opened:
        assert verify_store(opened).clean


# -- in real subprocesses ---------------------------------------------------------------------


def test_a_node_starts_on_a_session_record_with_a_bad_byte_and_quarantines_it(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    build(store)
    spoil_text(store, "sessions", IDS.owed.bytes, "cancelled ✓")
    status = sessiontree("node", "status", "--store", str(store))
    assert status.returncode == 0, status.stderr
    assert "1 unreadable (sessiontree store verify)" in status.stdout
    shown = sessiontree("sessions", "show", str(IDS.owed), "--store", str(store))
    assert shown.returncode == EXIT_STORE_DAMAGED, shown.stderr
    line = one_line(shown)
    assert f"sessions record {IDS.owed.hex} does not decode as SessionRecord" in line
    assert "UnicodeDecodeError" in line
    assert "`sessiontree store verify` lists every one" in line

    node = RunningNode(store)
    try:
        recovery = node.http.get("/v1/node").json()["recovery"]
        assert recovery["quarantined"] == 1
        assert node.http.get(f"/v1/sessions/{IDS.owed}").status_code == 404
        assert node.http.get(f"/v1/sessions/{MAIN}").status_code == 200
    finally:
        assert node.stop() == 0
    assert "quarantined sessions record" in node.log()
    assert "Traceback" not in node.log()
    after = sessiontree("node", "status", "--store", str(store), "--json")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["unreadable"] == 0


def test_a_damaged_conversation_is_a_typed_503_and_exit_74(tmp_path: Path) -> None:
    store = tmp_path / "s"
    build(store)
    message = IDS.main.bytes + IDS.answer.bytes
    spoil_text(store, "messages", message, "hi ✓")
    read = sessiontree("conv", "context", "--session", MAIN, "--store", str(store))
    assert read.returncode == EXIT_STORE_DAMAGED, read.stderr
    assert f"messages record {message.hex()} does not decode" in one_line(read)

    node = RunningNode(store)
    try:
        for route in ("context", "tree", "tree.txt", "tree.html", "transcript"):
            answer = node.http.get(f"/v1/sessions/{MAIN}/conversation/{route}")
            assert answer.status_code == 503, (route, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "corrupt_record"
            assert error["detail"] == {"db": "messages", "key": message.hex()}
        assert node.http.get("/healthz").status_code == 200
    finally:
        assert node.stop() == 0
    assert "internal_error" not in node.log()
