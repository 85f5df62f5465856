"""A small store holding every kind of record, the same bytes on every run, and
ways to damage one record in the file (for the damage and fuzz tests).

``build`` writes a tree a node started on it brings back and works on: a Main
with its conversation (two messages, one with a chat platform's id), an
acknowledged message whose cycle was cut off, a result still owed to it and
one filed on it; a completed branch (recorded), a suspended one with a running
worker; shared memory, usage, held-back work, a quarantined value and the
node's starts. Ids and times are fixed, so a flip at a given offset damages
the same field every run.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from sessiontree.protocol import (
    Branch,
    ConversationState,
    ErrorCode,
    ErrorInfo,
    Message,
    Recording,
    Role,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnSpec,
    TapedSession,
    Timings,
    Usage,
)
from sessiontree.store import (
    CallRecord,
    ContextEntry,
    ContextRecord,
    CycleRecord,
    InboxRecord,
    MemoryRecord,
    MetaRecord,
    QuarantineRecord,
    RecordingRecord,
    SessionRecord,
    StartsRecord,
    Store,
    UsageRecord,
    WedgedRecord,
    WriteBatch,
    _pages,  # the page walk finds a value in the file
)

__all__ = [
    "AGENT",
    "MAIN_KEY",
    "T0",
    "Ids",
    "build",
    "flip_in_file",
    "stored_entries",
    "value_offset",
]

T0 = 1_700_000_000.0
AGENT = "assistant"  # tests.node_agents' agent: skills chat (its Main's) and work
MAIN_KEY = "internal:main:main"


def _id(n: int) -> uuid.UUID:
    return uuid.UUID(int=(0xD0 << 120) | n)


class Ids:
    """The sessions and messages ``build`` writes."""

    main = _id(1)
    done = _id(2)  # a completed branch, recorded; its result filed on the Main
    parked = _id(3)  # a branch suspended explicitly (it stays suspended)
    worker = _id(4)  # running under the parked branch (ended by recovery)
    owed = _id(5)  # a cancelled branch whose result the Main has not taken
    hello = _id(0x100)
    answer = _id(0x101)
    wedged = _id(0x200)


IDS = Ids


def _info(
    n: uuid.UUID,
    kind: SessionKind,
    state: SessionState,
    *,
    parent: uuid.UUID | None = None,
    depth: int = 1,
    skill: str = "work",
) -> SessionInfo:
    return SessionInfo(
        session_id=n,
        agent_id=AGENT,
        parent_id=parent,
        kind=kind,
        state=state,
        depth=depth,
        created_at=T0 + depth,
        ttl=None if kind is SessionKind.MAIN else 86_400.0 * 365 * 50,
        deadline=None if kind is SessionKind.MAIN else T0 + 86_400.0 * 365 * 50,
        task="0" if kind is not SessionKind.MAIN else "",
        context_summary="résumé ✓" if kind is SessionKind.BRANCH else "",
        skill=skill,
        key=MAIN_KEY if kind is SessionKind.MAIN else None,
        metadata={"team": "ops", "n": 3},
        conversation=IDS.main,
    )


def _result(
    n: uuid.UUID, state: SessionState, *, parent: uuid.UUID, code: ErrorCode | None = None
) -> SessionResult:
    return SessionResult(
        session_id=n,
        status=state,
        parent_id=parent,
        summary=f"{state.value} ✓",
        artifacts={"found": [1, 2.5, "x"], "ok": True},
        memory_ids=("mem-1",),
        error=None if code is None else ErrorInfo(code=code, message=f"{code.value} here"),
        timings=Timings(created_at=T0, started_at=T0 + 1, ended_at=T0 + 2),
        usage=Usage(prompt_tokens=10, completion_tokens=5, cost=0.25, calls=1),
        subtree_usage=Usage(prompt_tokens=10, completion_tokens=5, cost=0.25, calls=1),
        conversation=IDS.main,
    )


def _recording() -> bytes:
    spec = SpawnSpec(kind=SessionKind.BRANCH, task="0", skill="work", record=True)
    recording = Recording(
        recording_id=IDS.done,
        agent_id=AGENT,
        depth=1,
        spec=spec,
        started_at=T0,
        grace=5.0,
        complete=True,
        sessions=[
            TapedSession(
                path="0",
                session_id=IDS.done,
                kind="branch",
                skill="work",
                result=_result(IDS.done, SessionState.COMPLETED, parent=IDS.main),
            )
        ],
    )
    return recording.encode()


def build(path: Path) -> type[Ids]:
    """Write the tree into a new store at ``path`` (closed on return)."""
    ids = IDS
    main = _info(ids.main, SessionKind.MAIN, SessionState.ACTIVE, depth=0, skill="chat")
    context = ContextRecord(
        system_prompt="be brief",
        messages=[
            ContextEntry(role="user", content="hello"),
            ContextEntry(role="assistant", content="hi"),
        ],
    )
    done = _result(ids.done, SessionState.COMPLETED, parent=ids.main)
    owed = _result(ids.owed, SessionState.CANCELLED, parent=ids.main, code=ErrorCode.CANCELLED)
    branch = Branch(
        number=1,
        id="branch_0000000a",
        name="main",
        base_id=None,
        leaf_id=ids.answer,
        count=2,
        created_at=T0,
        updated_at=T0 + 1,
        depth=2,
    )
    hello = Message(
        id=ids.hello,
        parent_id=None,
        role=Role.USER,
        content="hello",
        timestamp=T0,
        branch_id=branch.id,
        platform_id="tg-1",
    )
    answer = Message(
        id=ids.answer,
        parent_id=ids.hello,
        role=Role.ASSISTANT,
        content={"text": "hi ✓", "parts": [1, 2.5]},
        timestamp=T0 + 1,
        branch_id=branch.id,
        seq=1,
        depth=2,
        usage={"prompt_tokens": 3},
    )
    batch = WriteBatch()
    batch.session(SessionRecord(info=main, context=context, updated_at=T0 + 5))
    batch.main(AGENT, MAIN_KEY, ids.main)
    batch.session(
        SessionRecord(
            info=_info(ids.done, SessionKind.BRANCH, SessionState.COMPLETED, parent=ids.main),
            context=context,
            result=done,
            updated_at=T0 + 2,
        )
    )
    batch.session(
        SessionRecord(
            info=_info(ids.parked, SessionKind.BRANCH, SessionState.SUSPENDED, parent=ids.main),
            context=context,
            updated_at=T0 + 3,
        )
    )
    batch.session(
        SessionRecord(
            info=_info(
                ids.worker, SessionKind.WORKER, SessionState.ACTIVE, parent=ids.parked, depth=2
            ),
            updated_at=T0 + 3,
        )
    )
    batch.session(
        SessionRecord(
            info=_info(ids.owed, SessionKind.BRANCH, SessionState.CANCELLED, parent=ids.main),
            result=owed,
            updated_at=T0 + 4,
        )
    )
    for parent, child in (
        (ids.main, ids.done),
        (ids.main, ids.parked),
        (ids.parked, ids.worker),
        (ids.main, ids.owed),
    ):
        batch.link(parent, child)
    batch.file(ids.main, done)
    batch.owe(ids.main, owed)
    batch.inbox(InboxRecord(session_id=ids.main, seq=1, message="again ✓", received_at=T0 + 6))
    batch.cycle(CycleRecord(session_id=ids.main, seq=1, attempt=1, started_at=T0 + 7))
    batch.wedged(
        WedgedRecord(
            wedged_id=ids.wedged,
            kind="message",
            session_id=ids.main,
            agent_id=AGENT,
            attempts=3,
            reason="wedged: crashed 3 times",
            at=T0 + 8,
            seq=0,
            message={"text": "poison"},
            received_at=T0,
        )
    )
    batch.memory(
        MemoryRecord(
            agent_id=AGENT,
            key="facts",
            memory_id="mem-1",
            value={"facts": ["lmdb", "msgspec"], "confidence": 0.9},
            session_id=ids.done,
            written_at=T0 + 2,
        )
    )
    own = Usage(prompt_tokens=10, completion_tokens=5, cost=0.25, calls=1, descendants=4)
    batch.usage(UsageRecord(session_id=ids.main, own=own, subtree=own))
    batch.usage(UsageRecord(session_id=ids.parked, own=Usage(), subtree=Usage(descendants=1)))
    batch.call(  # a model call the worker had in flight when its node stopped
        CallRecord(
            session_id=ids.worker,
            call_id=_id(0xCA11),
            chain=(ids.worker, ids.parked, ids.main),
            ask=Usage(prompt_tokens=40, completion_tokens=16, calls=1),
            reserved_at=T0 + 3,
        )
    )
    batch.quarantine(
        QuarantineRecord(
            db="sessions", key=_id(0x999).bytes, raw=b"\xc1 not msgpack", reason="old damage", at=T0
        )
    )
    batch.recording(
        RecordingRecord(
            recording_id=ids.done, agent_id=AGENT, started_at=T0, complete=True, data=_recording()
        )
    )
    batch.message(ids.main, hello).message(ids.main, answer).branch(ids.main, branch)
    batch.conversation(
        ConversationState(
            session_id=ids.main,
            branches=[branch],
            current=branch.id,
            next_seq=2,
            messages=2,
            next_number=2,
            created_at=T0,
            updated_at=T0 + 1,
        )
    )
    batch.starts(StartsRecord(running=False, started_at=T0, crashes=[T0 - 10]))
    with Store(path, sync=False) as store:
        # the meta record, fixed too (the store wrote a fresh one on open)
        batch._put("meta", b"meta", MetaRecord(node_id="node-fuzz", created_at=T0))
        store.write(batch)
    return ids


def stored_entries(path: Path) -> list[tuple[str, bytes, bytes]]:
    """Every (database, key, value) of the store at ``path``, in database order."""
    with Store(path, readonly=True) as store:
        return [(db, key, raw) for db in store.databases() for key, raw in store.scan(db)]


def value_offset(path: Path, db: str, key: bytes) -> int:
    """Where the value under ``key`` in database ``db`` lies in ``path``'s
    ``data.mdb``: its node on a leaf page, or its overflow run (found by
    walking the B-trees as the store's page check does)."""
    data = str(path / "data.mdb")
    meta = _pages.read_meta(data)
    found: list[int] = []

    class Finder(_pages._Walk):
        def leaf(
            self, name: str, pgno: int, page: bytes, offsets: tuple[int, ...], **kw: bool
        ) -> None:
            if name == db:
                for offset in offsets:
                    _, _, flags, ksize = _pages._NODE.unpack_from(page, offset)
                    at = offset + _pages._NODE.size
                    if page[at : at + ksize] != key:
                        continue
                    if flags & _pages.F_BIGDATA:
                        (first,) = _pages._PGNO.unpack_from(page, at + ksize)
                        found.append(first * meta.page_size + _pages.PAGE_HEADER)
                    else:
                        found.append(pgno * meta.page_size + at + ksize)
            super().leaf(name, pgno, page, offsets, **kw)

    fd = os.open(data, os.O_RDONLY)
    try:
        Finder(fd, data, meta).run()
    finally:
        os.close(fd)
    assert len(found) == 1, f"{db} {key.hex()}: found at {found}"
    return found[0]


def flip_in_file(path: Path, db: str, key: bytes, offset: int, mask: int) -> None:
    """XOR ``mask`` into byte ``offset`` of the value under ``key`` in ``db``,
    in ``path``'s ``data.mdb`` itself (as a bad disk would: LMDB's pages and
    the value's length stay as they are)."""
    at = value_offset(path, db, key) + offset
    fd = os.open(path / "data.mdb", os.O_RDWR)
    try:
        (byte,) = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([byte ^ mask]), at)
        os.fsync(fd)
    finally:
        os.close(fd)
