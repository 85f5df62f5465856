"""Canonical export/import (JSONL) and retention, on real LMDB stores in tmp_path."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import sessiontree.store
from sessiontree.cli import main
from sessiontree.protocol import (
    Branch,
    ConversationState,
    ErrorCode,
    ErrorInfo,
    Message,
    RejectedInputError,
    Role,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    StoreError,
    Timings,
)
from sessiontree.store import (
    DATABASES,
    ContextEntry,
    ContextRecord,
    InboxRecord,
    MemoryRecord,
    QuarantineRecord,
    SessionRecord,
    Store,
    WriteBatch,
    export_jsonl,
    import_jsonl,
    prune,
)

T0 = 1_700_000_000.0  # every timestamp in these stores is fixed, so exports are comparable
AGENT = "researcher"
MAIN_KEY = "telegram:dm:42"
HOUR = 3600.0


def sid(n: int) -> uuid.UUID:
    """A fixed session id per number (readable in failures, stable across runs)."""
    return uuid.UUID(int=n)


def info(
    n: int,
    kind: SessionKind,
    state: SessionState,
    *,
    parent: int | None = None,
    depth: int = 1,
    key: str | None = None,
) -> SessionInfo:
    return SessionInfo(
        session_id=sid(n),
        agent_id=AGENT,
        parent_id=None if parent is None else sid(parent),
        kind=kind,
        state=state,
        depth=0 if kind is SessionKind.MAIN else depth,
        created_at=T0 + n,
        ttl=None if kind is SessionKind.MAIN else 1800.0,
        deadline=None if kind is SessionKind.MAIN else T0 + n + 1800.0,
        task=f"task {n}",
        context_summary=f"summary for {n}",
        model_tier="small" if kind is SessionKind.WORKER else None,
        skill="search",
        key=key,
        request_id=f"req-{n}",
        metadata={"n": n, "tags": ["a", "b"]},
    )


def result(
    n: int, state: SessionState, *, parent: int, ended: float | None, code: ErrorCode | None = None
) -> SessionResult:
    return SessionResult(
        session_id=sid(n),
        status=state,
        parent_id=sid(parent),
        kind=SessionKind.BRANCH,
        summary=f"result of {n}",
        artifacts={"score": 0.5, "items": [1, 2, 3], "nested": {"ok": True, "none": None}},
        memory_ids=(f"mem-{n}",),
        error=None if code is None else ErrorInfo(code=code, message="why", detail={"n": n}),
        timings=None
        if ended is None
        else Timings(created_at=T0, started_at=T0 + 1, ended_at=ended),
    )


def context(n: int) -> ContextRecord:
    return ContextRecord(
        system_prompt=f"You are session {n}.",
        messages=[
            ContextEntry(role="user", content="hello"),
            ContextEntry(role="assistant", content={"text": "hi", "parts": [1, 2.5]}, name="bot"),
        ],
        tool_results=[{"tool": "search", "hits": 3}],
    )


class Tree:
    """The ids of the populated store."""

    main = sid(1)
    completed = sid(2)
    suspended = sid(3)
    failed_worker = sid(4)
    pending_worker = sid(5)
    expired = sid(6)
    cancelled = sid(7)
    corrupt = sid(8)
    old_version = sid(9)


def populate(store: Store) -> Tree:
    """Every database of a store, every session kind and state, and the odd
    entries export must carry losslessly (bytes in a free-form value, a
    record of schema version 1, a value that does not decode)."""
    tree = Tree()
    batch = WriteBatch()
    main_info = info(1, SessionKind.MAIN, SessionState.ACTIVE, key=MAIN_KEY)
    batch.session(SessionRecord(info=main_info, context=context(1), updated_at=T0 + 50))
    batch.main(AGENT, MAIN_KEY, tree.main)
    completed = result(2, SessionState.COMPLETED, parent=1, ended=T0 + 100)
    batch.session(
        SessionRecord(
            info=info(2, SessionKind.BRANCH, SessionState.COMPLETED, parent=1),
            context=context(2),
            result=completed,
            updated_at=T0 + 100,
        )
    )
    batch.session(
        SessionRecord(
            info=info(3, SessionKind.BRANCH, SessionState.SUSPENDED, parent=1),
            context=context(3),
            updated_at=T0 + 60,
            resume=True,
        )
    )
    failed = result(4, SessionState.FAILED, parent=2, ended=T0 + 90, code=ErrorCode.CRASHED)
    batch.session(
        SessionRecord(
            info=info(4, SessionKind.WORKER, SessionState.FAILED, parent=2, depth=2),
            result=failed,
            updated_at=T0 + 90,
        )
    )
    batch.session(
        SessionRecord(
            info=info(5, SessionKind.WORKER, SessionState.PENDING, parent=3, depth=2),
            updated_at=T0 + 5,
        )
    )
    expired = result(6, SessionState.EXPIRED, parent=1, ended=None, code=ErrorCode.TTL_EXPIRED)
    batch.session(
        SessionRecord(
            info=info(6, SessionKind.BRANCH, SessionState.EXPIRED, parent=1),
            result=expired,
            updated_at=T0 + 1806,
        )
    )
    cancelled = result(7, SessionState.CANCELLED, parent=1, ended=T0 + 70, code=ErrorCode.CANCELLED)
    batch.session(
        SessionRecord(
            info=info(7, SessionKind.BRANCH, SessionState.CANCELLED, parent=1),
            result=cancelled,
            updated_at=T0 + 70,
        )
    )
    for parent, child in ((1, 2), (1, 3), (2, 4), (3, 5), (1, 6), (1, 7)):
        batch.link(sid(parent), sid(child))
    batch.file(tree.completed, failed)  # the branch took its worker's result
    batch.file(tree.main, completed)
    batch.owe(tree.main, cancelled)  # the Main has not taken this one yet
    for seq in (1, 2):
        batch.inbox(
            InboxRecord(
                session_id=tree.main,
                seq=seq,
                message={"from": "user", "text": f"message {seq}"},
                received_at=T0 + 200 + seq,
            )
        )
    batch.memory(
        MemoryRecord(
            agent_id=AGENT,
            key="facts",
            memory_id="mem-2",
            value={"facts": ["lmdb", "msgspec"], "confidence": 0.9},
            session_id=tree.completed,
            written_at=T0 + 99,
        )
    )
    batch.memory(
        MemoryRecord(
            agent_id=AGENT,
            key="blob",
            memory_id="mem-bytes",
            value={"raw": b"\x00\x01\xff", 7: "an integer map key"},  # JSON holds neither
            session_id=tree.completed,
            written_at=T0 + 98,
        )
    )
    batch.quarantine(
        QuarantineRecord(
            db="sessions",
            key=sid(99).bytes,
            raw=b"\xc1\xff not msgpack",
            reason="does not decode as SessionRecord",
            at=T0 + 300,
        )
    )
    # The Main's conversation: two messages (one with a chat platform's id) and a corrupt one.
    main_branch = "branch_0000000a"
    hello = Message(
        id=uuid.UUID(int=0x100),
        parent_id=None,
        role=Role.USER,
        content="hello",
        timestamp=T0,
        branch_id=main_branch,
        platform_id="tg-1",
    )
    answer = Message(
        id=uuid.UUID(int=0x101),
        parent_id=hello.id,
        role=Role.ASSISTANT,
        content={"text": "hi", "parts": [1, 2.5]},
        timestamp=T0 + 1,
        branch_id=main_branch,
        seq=1,
        depth=2,
    )
    batch.message(tree.main, hello).message(tree.main, answer)
    main = Branch(
        number=1,
        id=main_branch,
        name="main",
        base_id=None,
        leaf_id=answer.id,
        count=2,
        created_at=T0,
        updated_at=T0 + 1,
        depth=2,
    )
    batch.branch(tree.main, main)
    batch.conversation(
        ConversationState(
            session_id=tree.main,
            branches=[main],
            current=main_branch,
            next_seq=2,
            messages=2,
            created_at=T0,
            updated_at=T0 + 1,
        )
    )
    batch.raw("messages", tree.main.bytes + uuid.UUID(int=0x102).bytes, b"\xc1 not msgpack")
    # A value that does not decode, and a record written by schema version 1.
    batch.raw("sessions", tree.corrupt.bytes, b"\xc1 garbage")
    old = SessionRecord(
        info=info(9, SessionKind.BRANCH, SessionState.COMPLETED, parent=1),
        result=result(9, SessionState.COMPLETED, parent=1, ended=T0 + 80),
        updated_at=T0 + 80,
    )
    fields = msgspec.to_builtins(old)
    del fields["resume"]
    fields["v"] = 1
    batch.raw("sessions", tree.old_version.bytes, msgspec.msgpack.encode(fields))
    store.write(batch)
    return tree


def contents(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key and value of every database, as stored."""
    return {db: list(store.scan(db)) for db in DATABASES}


def lines_of(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines()]


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "source", sync=False) as store:
        populate(store)
        yield store


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "target", sync=False) as store:
        yield store


def export_bytes(store: Store) -> bytes:
    out = io.BytesIO()
    export_jsonl(store, out)
    return out.getvalue()


# -- the format -------------------------------------------------------------------------------


def test_the_store_package_exports_export_import_and_prune() -> None:
    for name in ("export_jsonl", "import_jsonl", "prune"):
        assert name in sessiontree.store.__all__


def test_export_writes_one_typed_json_object_a_line_with_meta_first_and_end_last(
    source: Store,
) -> None:
    lines = lines_of(export_bytes(source))
    types = [line["type"] for line in lines]
    assert types[0] == "meta"
    assert types[-1] == "end"
    assert set(types) == {
        "meta", "session", "link", "main", "conversation", "branch", "message", "platform_id",
        "memory", "memory_id", "outbox", "received", "inbox", "quarantine", "opaque", "end",
    }  # fmt: skip
    meta = lines[0]
    assert meta["format"] == "sessiontree-export"
    assert meta["schema"] == sessiontree.store.SCHEMA_VERSION
    assert source.meta is not None
    assert meta["record"]["node_id"] == source.meta.node_id
    assert lines[-1]["counts"]["session"] == types.count("session")


def test_export_is_human_readable(source: Store) -> None:
    lines = lines_of(export_bytes(source))
    sessions = {line["record"]["info"]["task"]: line for line in lines if line["type"] == "session"}
    completed = sessions["task 2"]["record"]
    assert completed["info"]["session_id"] == str(sid(2))
    assert completed["info"]["state"] == "completed"
    assert completed["result"]["timings"]["ended_at"] == T0 + 100
    assert completed["context"]["messages"][1]["content"] == {"text": "hi", "parts": [1, 2.5]}
    assert "raw" not in sessions["task 2"]  # JSON holds it exactly: no raw copy
    failed = sessions["task 4"]["record"]["result"]["error"]
    assert failed == {"code": "crashed", "message": "why", "detail": {"n": 4}}
    link = next(line for line in lines if line["type"] == "link")
    assert link == {"type": "link", "parent": str(sid(1)), "child": str(sid(2))}
    main_line = next(line for line in lines if line["type"] == "main")
    assert main_line == {
        "type": "main", "agent_id": AGENT, "key": MAIN_KEY, "session_id": str(sid(1)),
    }  # fmt: skip
    messages = [line["record"] for line in lines if line["type"] == "message"]
    contents = [m["message"]["content"] for m in messages]
    assert contents == ["hello", {"text": "hi", "parts": [1, 2.5]}]
    assert messages[1]["message"]["parent_id"] == str(uuid.UUID(int=0x100))
    conversation = next(line for line in lines if line["type"] == "conversation")
    assert conversation["record"]["state"]["current"] == "branch_0000000a"
    branch = next(line for line in lines if line["type"] == "branch")
    assert branch["record"]["branch"]["name"] == "main"
    platform = next(line for line in lines if line["type"] == "platform_id")
    assert platform == {
        "type": "platform_id", "session_id": str(sid(1)), "platform_id": "tg-1",
        "message_id": str(uuid.UUID(int=0x100)),
    }  # fmt: skip
    quarantine = next(line for line in lines if line["type"] == "quarantine")
    assert base64.b64decode(quarantine["record"]["raw"]) == b"\xc1\xff not msgpack"
    inbox = [line["record"]["seq"] for line in lines if line["type"] == "inbox"]
    assert inbox == [1, 2]


def test_what_json_cannot_hold_exactly_travels_as_raw_bytes(source: Store) -> None:
    lines = lines_of(export_bytes(source))
    by_type: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_type.setdefault(line["type"], []).append(line)
    blob = next(line for line in by_type["memory"] if line["record"]["key"] == "blob")
    assert "raw" in blob  # bytes and an integer key inside a free-form value
    old = next(line for line in by_type["session"] if line["record"]["info"]["task"] == "task 9")
    assert old["record"]["v"] == 1
    assert "raw" in old  # a schema-1 record is kept as written, not upgraded
    opaque = {line["db"]: line for line in by_type["opaque"]}
    assert base64.b64decode(opaque["sessions"]["value"]) == b"\xc1 garbage"
    assert "does not decode" in opaque["sessions"]["reason"]
    assert base64.b64decode(opaque["messages"]["value"]) == b"\xc1 not msgpack"
    assert all("raw" not in line for line in by_type["message"])  # JSON holds them exactly


# -- the round trip ---------------------------------------------------------------------------


def test_round_trip_is_lossless_to_the_byte(source: Store, target: Store, tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    counts = export_jsonl(source, path)
    assert import_jsonl(target, path) == counts
    assert contents(target) == contents(source)  # every key and value of every database
    assert target.meta == source.meta  # the restore keeps the store's identity
    again = tmp_path / "again.jsonl"
    export_jsonl(target, again)
    assert again.read_bytes() == path.read_bytes()


def test_two_exports_of_one_store_are_byte_identical(source: Store) -> None:
    assert export_bytes(source) == export_bytes(source)


def test_text_and_binary_streams_get_the_same_export(source: Store) -> None:
    text = io.StringIO()
    export_jsonl(source, text)
    assert text.getvalue().encode() == export_bytes(source)


def test_import_reads_a_text_stream(source: Store, target: Store) -> None:
    import_jsonl(target, io.StringIO(export_bytes(source).decode()))
    assert contents(target) == contents(source)


def test_export_to_a_path_replaces_the_file_whole(source: Store, tmp_path: Path) -> None:
    out = tmp_path / "out" / "store.jsonl"
    out.parent.mkdir()
    out.write_bytes(b"the previous export\n")
    export_jsonl(source, out)
    assert out.read_bytes() == export_bytes(source)
    assert [p.name for p in out.parent.iterdir()] == ["store.jsonl"]  # no temporary file left


def test_a_failed_export_leaves_the_previous_file_and_no_temporary(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out" / "store.jsonl"
    out.parent.mkdir()
    out.write_bytes(b"the previous export\n")
    store = Store(tmp_path / "closed", sync=False)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        export_jsonl(store, out)
    assert out.read_bytes() == b"the previous export\n"
    assert [p.name for p in out.parent.iterdir()] == ["store.jsonl"]


# -- strict import ----------------------------------------------------------------------------


def edit(data: bytes, kind: str, change: Any) -> tuple[bytes, int]:
    """``data`` with the first line of type ``kind`` changed; and its line number."""
    lines = data.splitlines()
    for index, raw in enumerate(lines):
        line = json.loads(raw)
        if line["type"] == kind:
            changed = change(line)
            lines[index] = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
            return b"\n".join(lines) + b"\n", index + 1
    raise AssertionError(kind)


def set_state(line: dict[str, Any]) -> dict[str, Any]:
    line["record"]["info"]["state"] = "sleeping"
    return line


def set_version(line: dict[str, Any]) -> dict[str, Any]:
    line["record"]["v"] = 99
    return line


def add_field(line: dict[str, Any]) -> dict[str, Any]:
    line["colour"] = "red"
    return line


def drop_child(line: dict[str, Any]) -> dict[str, Any]:
    del line["child"]
    return line


def bad_uuid(line: dict[str, Any]) -> dict[str, Any]:
    line["session_id"] = "not-a-uuid"
    return line


def string_seq(line: dict[str, Any]) -> dict[str, Any]:
    line["record"]["seq"] = "1"  # strict: no coercion
    return line


def edit_raw_record(line: dict[str, Any]) -> dict[str, Any]:
    line["record"]["value"]["confidence"] = 1.0
    return line


def future_schema(line: dict[str, Any]) -> dict[str, Any]:
    line["schema"] = 99
    return line


@pytest.mark.parametrize(
    ("kind", "change", "field", "says"),
    [
        ("session", set_state, "record.info.state", "Invalid enum value 'sleeping'"),
        ("session", set_version, "record.v", "schema version 99"),
        ("link", add_field, "colour", "unknown field"),
        ("link", drop_child, "child", "missing required field"),
        ("main", bad_uuid, "session_id", "Invalid UUID"),
        ("inbox", string_seq, "record.seq", "Expected `int`, got `str`"),
        ("meta", future_schema, "schema", "schema version 99"),
        ("outbox", lambda line: b'{"type": "outbox", ', None, "not JSON"),
        ("received", lambda line: {"type": "rumour"}, "type", "Invalid value 'rumour'"),
    ],
)
def test_a_bad_line_is_refused_by_number_and_field_and_nothing_is_imported(
    source: Store, target: Store, kind: str, change: Any, field: str | None, says: str
) -> None:
    data, number = edit(export_bytes(source), kind, change)
    meta_before = target.meta
    with pytest.raises(RejectedInputError, match=f"^line {number}\\b") as raised:
        import_jsonl(target, io.BytesIO(data))
    assert raised.value.field == field
    assert says in str(raised.value)
    emptied = [db for db in DATABASES if db not in ("meta", "live")]  # live: derived
    assert {db: target.count(db) for db in emptied} == dict.fromkeys(emptied, 0)
    assert list(target.scan("meta")) == [(b"meta", msgspec.msgpack.encode(meta_before))]


def test_a_raw_value_that_disagrees_with_its_edited_record_is_refused(
    source: Store, target: Store
) -> None:
    data = export_bytes(source)
    lines = data.splitlines()
    number = next(
        i for i, raw in enumerate(lines, 1) if b'"key":"facts"' in raw and b'"raw"' not in raw
    )
    blob = next(i for i, raw in enumerate(lines, 1) if b'"key":"blob"' in raw)
    line = json.loads(lines[blob - 1])
    line["record"]["written_at"] = 0.0
    lines[blob - 1] = json.dumps(line).encode()
    with pytest.raises(RejectedInputError, match=f"^line {blob} .*raw and record disagree"):
        import_jsonl(target, io.BytesIO(b"\n".join(lines) + b"\n"))
    assert number != blob
    assert target.count("memory") == 0


def test_a_truncated_export_is_refused(source: Store, target: Store) -> None:
    lines = export_bytes(source).splitlines(keepends=True)
    with pytest.raises(RejectedInputError, match="no end line"):
        import_jsonl(target, io.BytesIO(b"".join(lines[:-1])))
    with pytest.raises(RejectedInputError, match="truncated or edited"):
        import_jsonl(target, io.BytesIO(b"".join(lines[:3] + lines[4:])))
    with pytest.raises(RejectedInputError, match=r"^line 1 .*not meta"):
        import_jsonl(target, io.BytesIO(b"".join(lines[1:])))
    with pytest.raises(RejectedInputError, match="empty line"):
        import_jsonl(target, io.BytesIO(b"".join([*lines[:2], b"\n", *lines[2:]])))
    with pytest.raises(RejectedInputError, match="the file is empty"):
        import_jsonl(target, io.BytesIO(b""))
    assert target.count("sessions") == 0


def test_a_duplicate_entry_is_refused(source: Store, target: Store) -> None:
    lines = export_bytes(source).splitlines(keepends=True)
    doubled = [*lines[:2], lines[1], *lines[2:]]
    with pytest.raises(RejectedInputError, match=r"^line 3 .*a second entry"):
        import_jsonl(target, io.BytesIO(b"".join(doubled)))


def test_import_refuses_a_store_that_holds_data_unless_replacing(
    source: Store, tmp_path: Path
) -> None:
    data = export_bytes(source)
    with Store(tmp_path / "busy", sync=False) as busy:
        stray = info(500, SessionKind.BRANCH, SessionState.ACTIVE, parent=1)
        busy.write(WriteBatch().session(SessionRecord(info=stray)).link(sid(1), sid(500)))
        with pytest.raises(StoreError, match="not empty"):
            import_jsonl(busy, io.BytesIO(data))
        assert busy.session(sid(500)) is not None
        import_jsonl(busy, io.BytesIO(data), replace=True)
        assert contents(busy) == contents(source)  # the stray session and link are gone
        assert export_bytes(busy) == data


def test_import_needs_the_writer(source: Store, tmp_path: Path) -> None:
    data = export_bytes(source)
    Store(tmp_path / "ro", sync=False).close()
    with (
        Store(tmp_path / "ro", readonly=True) as readonly,
        pytest.raises(StoreError, match="read-only"),
    ):
        import_jsonl(readonly, io.BytesIO(data))


# -- the command line ------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, uuid
    from sessiontree.protocol import SessionInfo, SessionKind, SessionState
    from sessiontree.store import SessionRecord, Store, WriteBatch

    def record(n):
        return SessionRecord(info=SessionInfo(
            session_id=uuid.UUID(int=n), agent_id="a", parent_id=None, kind=SessionKind.MAIN,
            state=SessionState.ACTIVE, depth=0, created_at=1.0, ttl=None, deadline=None))

    with Store(sys.argv[1]) as store:
        store.write(WriteBatch().session(record(1)))
        print("ready", flush=True)
        sys.stdin.readline()
        store.write(WriteBatch().session(record(2)))
        print("ready", flush=True)
        sys.stdin.read()
    """
)


def test_cli_exports_a_store_a_node_in_another_process_holds_open(tmp_path: Path) -> None:
    path = tmp_path / "live"
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdin is not None
        assert writer.stdout is not None
        try:
            assert writer.stdout.readline() == "ready\n"
            runner = CliRunner()
            out = str(tmp_path / "1")
            first = runner.invoke(main, ["export", "--store", str(path), "--out", out])
            assert first.exit_code == 0, first.output
            assert "1 session" in first.stderr
            writer.stdin.write("go on\n")
            writer.stdin.flush()
            assert writer.stdout.readline() == "ready\n"
            second = runner.invoke(main, ["export", "--store", str(path)])  # to stdout
            assert second.exit_code == 0, second.output
            types = [line["type"] for line in lines_of(second.stdout_bytes)]
            assert types.count("session") == 2  # the writer's later commit is seen
            refused = runner.invoke(main, ["import", "--store", str(path), out])
            assert refused.exit_code == 1
            assert "held by another node" in refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
        finally:
            writer.stdin.close()
            assert writer.wait(timeout=30) == 0


def test_cli_round_trip_through_stdout_and_import(source: Store, tmp_path: Path) -> None:
    expected, source_contents = export_bytes(source), contents(source)
    source.close()  # the CLI opens the directory itself
    runner = CliRunner()
    exported = runner.invoke(main, ["export", "--store", str(tmp_path / "source")])
    assert exported.exit_code == 0, exported.output
    assert exported.stdout_bytes == expected  # stdout holds the export and nothing else
    assert exported.stderr.startswith("exported ")
    dump = tmp_path / "dump.jsonl"
    dump.write_bytes(exported.stdout_bytes)
    imported = runner.invoke(main, ["import", "--store", str(tmp_path / "restored"), str(dump)])
    assert imported.exit_code == 0, imported.output
    assert "imported " in imported.stdout
    with Store(tmp_path / "restored", readonly=True) as restored:
        assert contents(restored) == source_contents
    again = runner.invoke(
        main, ["import", "--store", str(tmp_path / "restored"), "-"], input=expected
    )
    assert again.exit_code == 1
    assert "not empty" in again.stderr
    replaced = runner.invoke(
        main, ["import", "--replace", "--store", str(tmp_path / "restored"), "-"], input=expected
    )
    assert replaced.exit_code == 0, replaced.output


def test_cli_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    usage = runner.invoke(main, ["export"])  # --store is required
    assert usage.exit_code == 2
    missing_file = runner.invoke(main, ["import", "--store", str(tmp_path / "s"), "nope.jsonl"])
    assert missing_file.exit_code == 2
    no_store = runner.invoke(main, ["export", "--store", str(tmp_path / "empty-dir")])
    assert no_store.exit_code == 1
    assert "no store at" in no_store.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "meta", "format": "sessiontree-export"}\n')
    refused = runner.invoke(main, ["import", "--store", str(tmp_path / "s"), str(bad)])
    assert refused.exit_code == 1
    assert refused.stderr.startswith("Error: line 1 (version): ")
    assert len(refused.stderr.strip().splitlines()) == 1
    Store(tmp_path / "ok", sync=False).close()
    unwritable = runner.invoke(
        main, ["export", "--store", str(tmp_path / "ok"), "--out", str(tmp_path / "no" / "x")]
    )
    assert unwritable.exit_code == 1
    assert "No such file or directory" in unwritable.stderr


# -- retention --------------------------------------------------------------------------------

NOW = T0 + 10 * HOUR


def session_at(
    n: int,
    state: SessionState,
    *,
    parent: int | None,
    ended: float | None = None,
    updated: float = 0.0,
    kind: SessionKind = SessionKind.BRANCH,
    key: str | None = None,
) -> SessionRecord:
    result_ = None
    if state.is_terminal:
        result_ = SessionResult(
            session_id=sid(n),
            status=state,
            parent_id=None if parent is None else sid(parent),
            timings=None if ended is None else Timings(created_at=T0, ended_at=ended),
        )
    return SessionRecord(
        info=info(n, kind, state, parent=parent, key=key), result=result_, updated_at=updated
    )


@pytest.fixture
def aged(tmp_path: Path) -> Iterator[Store]:
    """Sessions that ended long ago, recently, and not at all."""
    with Store(tmp_path / "aged", sync=False) as store:
        batch = WriteBatch()
        old_end, recent_end = NOW - 5 * HOUR, NOW - 10.0
        records = [
            # an old terminal Main with its key, children and inbox
            session_at(1, SessionState.COMPLETED, parent=None, ended=old_end,
                       kind=SessionKind.MAIN, key="old:dm:1"),
            session_at(2, SessionState.FAILED, parent=1, ended=old_end),  # old, result owed
            session_at(3, SessionState.EXPIRED, parent=1, updated=old_end),  # no timings
            session_at(4, SessionState.COMPLETED, parent=1, ended=recent_end),  # too recent
            session_at(5, SessionState.ACTIVE, parent=1),  # never pruned, however old
            # a live Main with an old terminal child
            session_at(10, SessionState.ACTIVE, parent=None, kind=SessionKind.MAIN,
                       key="live:dm:2"),
            session_at(11, SessionState.CANCELLED, parent=10, ended=old_end),
            session_at(12, SessionState.SUSPENDED, parent=10),
        ]  # fmt: skip
        for record in records:
            batch.session(record)
            if record.info.parent_id is not None:
                batch.link(record.info.parent_id, record.info.session_id)
        batch.main(AGENT, "old:dm:1", sid(1))
        batch.main(AGENT, "live:dm:2", sid(10))
        batch.main(AGENT, "other:dm:3", sid(1))  # a key it does not own stays
        assert records[1].result is not None
        assert records[6].result is not None
        batch.owe(sid(1), records[1].result)  # owed to a pruned parent: kept
        batch.file(sid(1), records[1].result)  # filed on a pruned parent: deleted with it
        batch.file(sid(10), records[6].result)  # filed on a live parent: kept
        batch.inbox(InboxRecord(session_id=sid(1), seq=1, message="hi", received_at=T0))
        batch.inbox(InboxRecord(session_id=sid(10), seq=1, message="hi", received_at=T0))
        store.write(batch)
        yield store


def test_prune_deletes_exactly_the_old_terminal_sessions(aged: Store) -> None:
    assert prune(aged, older_than=HOUR, now=NOW) == 4
    kept = sorted(r.info.session_id.int for r in aged.sessions() if isinstance(r, SessionRecord))
    assert kept == [4, 5, 10, 12]
    assert aged.children(sid(1)) == []  # its links as a parent
    assert aged.children(sid(10)) == [sid(12)]  # its link under a live parent
    assert aged.received(sid(1)) == []
    assert [r.session_id for r in aged.received(sid(10))] == [sid(11)]
    assert aged.inbox(sid(1)) == []
    assert len(aged.inbox(sid(10))) == 1
    assert aged.main_of(AGENT, "old:dm:1") is None
    assert aged.main_of(AGENT, "live:dm:2") == sid(10)
    assert aged.main_of(AGENT, "other:dm:3") == sid(1)
    owed = [r for r in aged.outbox() if not isinstance(r, Exception)]
    assert [r.result.session_id for r in owed] == [sid(2)]  # a result still owed is never lost


def test_prune_of_nothing_old_enough_deletes_nothing(aged: Store) -> None:
    before = contents(aged)
    assert prune(aged, older_than=24 * HOUR, now=NOW) == 0
    assert contents(aged) == before


def test_prune_commits_in_bounded_batches(aged: Store) -> None:
    commits = aged.stats()["commits"]
    assert prune(aged, older_than=HOUR, now=NOW, batch_size=3) == 4
    assert aged.stats()["commits"] == commits + 2


def test_prune_exports_first_when_asked(aged: Store, tmp_path: Path) -> None:
    out = tmp_path / "before-prune.jsonl"
    assert prune(aged, older_than=HOUR, now=NOW, export_to=out) == 4
    exported = {
        line["record"]["info"]["session_id"]
        for line in lines_of(out.read_bytes())
        if line["type"] == "session"
    }
    assert str(sid(2)) in exported
    assert aged.session(sid(2)) is None


def test_prune_refuses_nonsense_and_read_only_stores(aged: Store, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="older_than"):
        prune(aged, older_than=-1.0, now=NOW)
    with pytest.raises(ValueError, match="now"):
        prune(aged, older_than=HOUR, now=float("nan"))
    Store(tmp_path / "ro", sync=False).close()
    with Store(tmp_path / "ro", readonly=True) as readonly:
        assert prune(readonly, older_than=HOUR, now=NOW) == 0  # nothing to delete, nothing written
    aged.close()
    with (
        Store(tmp_path / "aged", readonly=True) as readonly,
        pytest.raises(StoreError, match="read-only"),
    ):
        prune(readonly, older_than=HOUR, now=NOW)
