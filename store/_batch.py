"""``WriteBatch``: the writes that commit together, built on the caller's thread.

A batch is a list of operations on named databases (put, delete,
delete-if-unchanged, delete-by-prefix, and ``expect`` preconditions), with
each record encoded as it is added, so the writer thread (``_writer``) only
copies bytes into its transaction. Building a batch never touches LMDB: a
value msgpack cannot hold raises ``RejectedInputError`` at once, before
anything is queued, and leaves the batch as it was.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

import msgspec

from sessiontree.protocol import (
    Branch,
    ConversationState,
    Message,
    RejectedInputError,
    SessionResult,
)
from sessiontree.store._env import LIVE_INDEXED
from sessiontree.store._keys import (
    branch_key,
    inbox_key,
    main_key,
    memory_key,
    pair_key,
    platform_key,
    quarantine_key,
    slot_key,
)
from sessiontree.store._records import (
    BranchRecord,
    CallRecord,
    ConversationRecord,
    CycleRecord,
    InboxRecord,
    MemoryIdRecord,
    MemoryRecord,
    MessageRecord,
    OutboxRecord,
    QuarantineRecord,
    ReceivedRecord,
    RecordingRecord,
    SessionRecord,
    SlotRecord,
    StartsRecord,
    UsageRecord,
    WedgedRecord,
    encode_record,
)

__all__ = ["Op", "WriteBatch"]

_STAMP = struct.Struct("<d")  # the live index's stamp: the start that last kept it

# (put | delete | delete_if | delete_prefix | expect | expect_absent | epoch, db, key, value)
Op = tuple[str, str, bytes, bytes]


def _encoded(record: msgspec.Struct) -> bytes:
    """``record``'s stored bytes; ``RejectedInputError`` naming its type if msgpack
    cannot hold a value in it."""
    try:
        return encode_record(record)
    except (TypeError, msgspec.EncodeError) as exc:
        msg = f"cannot store a {type(record).__name__}: {exc}"
        raise RejectedInputError(msg, field="value") from exc


@dataclass
class WriteBatch:
    """Writes that commit together or not at all. Values are encoded as they
    are added (on the caller's thread); a value msgpack cannot hold raises
    ``RejectedInputError`` there, before anything is queued."""

    ops: list[Op] = field(default_factory=list)
    size: int = 0

    def _put(self, db: str, key: bytes, record: msgspec.Struct) -> None:
        value = _encoded(record)
        self.ops.append(("put", db, key, value))
        self.size += len(key) + len(value)

    def expect(self, db: str, key: bytes, value: bytes | None) -> WriteBatch:
        """Commit this batch only if ``key`` holds ``value`` (None: is absent) when
        the writer reaches it; otherwise the batch fails, alone, with ``StoreError``
        (a write built on an earlier write that failed must not land)."""
        if value is None:
            self.ops.append(("expect_absent", db, key, b""))
        else:
            self.ops.append(("expect", db, key, value))
        return self

    def _delete(self, db: str, key: bytes, *, prefix: bool = False) -> None:
        self.ops.append(("delete_prefix" if prefix else "delete", db, key, b""))

    def __bool__(self) -> bool:
        return bool(self.ops)

    def extend(self, other: WriteBatch) -> WriteBatch:
        """Add ``other``'s writes after these (they then commit together)."""
        self.ops.extend(other.ops)
        self.size += other.size
        return self

    # -- sessions and the tree ------------------------------------------------

    def session(self, record: SessionRecord) -> WriteBatch:
        """Write (or overwrite) a session's record, and keep it in (or take it
        out of) the index of live sessions, in the same transaction."""
        key = record.info.session_id.bytes
        self._put("sessions", key, record)
        self._live(key, not record.info.state.is_terminal)
        return self

    def _live(self, key: bytes, live: bool) -> None:
        if live:
            self.ops.append(("put", "live", key, b""))
            self.size += len(key)
        else:
            self.ops.append(("delete", "live", key, b""))

    def link(self, parent_id: uuid.UUID, child_id: uuid.UUID) -> WriteBatch:
        """Add ``child_id`` under ``parent_id`` in the tree index."""
        self.ops.append(("put", "children", pair_key(parent_id, child_id), b""))
        return self

    def main(self, agent_id: str, key: str, session_id: uuid.UUID) -> WriteBatch:
        """Point (agent, session key) at its Main."""
        self.ops.append(("put", "mains", main_key(agent_id, key), session_id.bytes))
        return self

    def forget_main(self, agent_id: str, key: str, session_id: uuid.UUID) -> WriteBatch:
        """Drop (agent, session key) -> Main, unless by commit time it names another
        Main (a newer one took the key meanwhile)."""
        self.ops.append(("delete_if", "mains", main_key(agent_id, key), session_id.bytes))
        return self

    def forget_session(self, session_id: uuid.UUID) -> WriteBatch:
        """Delete a session's record, its links to children and its filed results."""
        self._delete("sessions", session_id.bytes)
        self._delete("live", session_id.bytes)
        self._delete("children", session_id.bytes, prefix=True)
        self._delete("received", session_id.bytes, prefix=True)
        self._delete("inbox", session_id.bytes, prefix=True)
        self._delete("conversations", session_id.bytes)
        self._delete("branches", session_id.bytes, prefix=True)
        self._delete("messages", session_id.bytes, prefix=True)
        self._delete("platform_ids", session_id.bytes, prefix=True)
        self._delete("usage", session_id.bytes)
        return self

    def unlink(self, parent_id: uuid.UUID, child_id: uuid.UUID) -> WriteBatch:
        self._delete("children", pair_key(parent_id, child_id))
        return self

    def ended(
        self, record: SessionRecord, parent_id: uuid.UUID, *, parent_ended: bool
    ) -> WriteBatch:
        """A terminal session's record (``session``) and the result it owes its
        parent: filed on the parent's record if ``parent_ended`` (``file``), else
        in the outbox (``owe``). Both are encoded before either is added, so
        ``RejectedInputError`` leaves the batch as it was. (One call for the
        writes of most endings: a cascade makes tens of thousands.)"""
        result = record.result
        if result is None:
            msg = f"session {record.info.session_id}: an ending's record carries its result"
            raise RejectedInputError(msg, field="result")
        child = record.info.session_id.bytes
        value = _encoded(record)
        if parent_ended:
            db, key = "received", parent_id.bytes + child
            owed = _encoded(ReceivedRecord(result=result))
        else:
            db, key = "outbox", child
            owed = _encoded(OutboxRecord(parent_id=parent_id, result=result))
        ops = self.ops
        ops.append(("put", "sessions", child, value))
        self.size += len(child) + len(value) + len(key) + len(owed)
        self._live(child, not record.info.state.is_terminal)
        ops.append(("put", db, key, owed))
        return self

    # -- results ------------------------------------------------------------------

    def owe(self, parent_id: uuid.UUID, result: SessionResult) -> WriteBatch:
        """Put a result owed to ``parent_id`` in the outbox."""
        self._put(
            "outbox", result.session_id.bytes, OutboxRecord(parent_id=parent_id, result=result)
        )
        return self

    def receipt(self, child_id: uuid.UUID) -> WriteBatch:
        """The parent has recorded the child's result: drop it from the outbox."""
        self._delete("outbox", child_id.bytes)
        return self

    def file(self, parent_id: uuid.UUID, result: SessionResult) -> WriteBatch:
        """File a child's result on its parent's record."""
        self._put("received", pair_key(parent_id, result.session_id), ReceivedRecord(result=result))
        return self

    # -- a Main's inbound messages ---------------------------------------------

    def inbox(self, record: InboxRecord) -> WriteBatch:
        self._put("inbox", inbox_key(record.session_id, record.seq), record)
        return self

    def consumed(self, session_id: uuid.UUID, seq: int) -> WriteBatch:
        self._delete("inbox", inbox_key(session_id, seq))
        return self

    def clear_inbox(self, session_id: uuid.UUID) -> WriteBatch:
        self._delete("inbox", session_id.bytes, prefix=True)
        self._delete("cycles", session_id.bytes)
        return self

    def cycle(self, record: CycleRecord) -> WriteBatch:
        """A Main starts a message cycle (attempt ``record.attempt``)."""
        self._put("cycles", record.session_id.bytes, record)
        return self

    def cycle_done(self, session_id: uuid.UUID) -> WriteBatch:
        """A Main's cycle is snapshotted: no cycle of it is in flight."""
        self._delete("cycles", session_id.bytes)
        return self

    def no_cycles(self) -> WriteBatch:
        """Drop every Main's cycle mark (a clean stop: no crash cut one off)."""
        self._delete("cycles", b"", prefix=True)
        return self

    # -- what recovery held back, the node's starts ---------------------------------

    def wedged(self, record: WedgedRecord) -> WriteBatch:
        self._put("wedged", record.wedged_id.bytes, record)
        return self

    def unwedge(self, wedged_id: uuid.UUID) -> WriteBatch:
        self._delete("wedged", wedged_id.bytes)
        return self

    def recording(self, record: RecordingRecord) -> WriteBatch:
        self._put("recordings", record.recording_id.bytes, record)
        return self

    def starts(self, record: StartsRecord) -> WriteBatch:
        """The node's starts; the index of live sessions is stamped with this
        start (a start by a build that does not keep it shows as a later one)."""
        self._put("meta", b"starts", record)
        self.ops.append(("put", "live", LIVE_INDEXED, _STAMP.pack(record.started_at)))
        return self

    # -- slots -----------------------------------------------------------------------

    def in_slot(self, slot: int, epoch: int) -> WriteBatch:
        """Commit this batch only while ``slot`` is at ``epoch`` (what
        ``Store.slot_epoch`` read); otherwise it fails, alone, with
        ``StoreFencedError`` naming the slot (the slot changed hands since).
        ``RejectedInputError`` for a slot outside 0..SLOTS-1 or a negative epoch."""
        key = slot_key(slot)
        self.ops.append(("epoch", "slots", key, _epoch(epoch).to_bytes(8, "big")))
        return self

    def slot_epoch(self, slot: int, epoch: int, *, expected: int) -> WriteBatch:
        """Move ``slot`` from epoch ``expected`` to ``epoch`` in this batch: it
        commits only while the slot is still at ``expected`` (``in_slot``), so of
        two batches built on one epoch one moves it and the other is fenced.
        ``RejectedInputError`` when ``epoch`` is not above ``expected``."""
        if _epoch(epoch) <= expected:
            msg = f"slot {slot}: epoch {epoch} is not above {expected} (epochs only grow)"
            raise RejectedInputError(msg, field="epoch")
        self.in_slot(slot, expected)
        self._put("slots", slot_key(slot), SlotRecord(slot=slot, epoch=epoch))
        return self

    # -- conversations ---------------------------------------------------------------

    def conversation(self, state: ConversationState) -> WriteBatch:
        """Write a conversation's bookkeeping (its branches go separately: ``branch``)."""
        header = msgspec.structs.replace(state, branches=[])
        self._put("conversations", state.session_id.bytes, ConversationRecord(state=header))
        return self

    def branch(self, session_id: uuid.UUID, branch: Branch) -> WriteBatch:
        """Write one branch of a conversation."""
        record = BranchRecord(session_id=session_id, branch=branch)
        self._put("branches", branch_key(session_id, branch.number), record)
        return self

    def drop_branch(self, session_id: uuid.UUID, number: int) -> WriteBatch:
        """Delete one branch of a conversation (its messages go with ``drop_message``)."""
        self._delete("branches", branch_key(session_id, number))
        return self

    def message(self, session_id: uuid.UUID, message: Message) -> WriteBatch:
        """Write (or overwrite) one conversation message, and its platform id's entry."""
        record = MessageRecord(session_id=session_id, message=message)
        self._put("messages", pair_key(session_id, message.id), record)
        if message.platform_id is not None:
            key = platform_key(session_id, message.platform_id)
            self.ops.append(("put", "platform_ids", key, message.id.bytes))
        return self

    def drop_message(self, session_id: uuid.UUID, message: Message) -> WriteBatch:
        """Delete one conversation message, and its platform id's entry if it still names it."""
        self._delete("messages", pair_key(session_id, message.id))
        if message.platform_id is not None:
            key = platform_key(session_id, message.platform_id)
            self.ops.append(("delete_if", "platform_ids", key, message.id.bytes))
        return self

    # -- shared memory, quarantine, raw ---------------------------------------------

    def call(self, record: CallRecord) -> WriteBatch:
        """A model call in flight, reserved (see ``CallRecord``)."""
        self._put("calls", pair_key(record.session_id, record.call_id), record)
        return self

    def call_done(self, session_id: uuid.UUID, call_id: uuid.UUID) -> WriteBatch:
        """A call settled (or never sent): its record goes."""
        self._delete("calls", pair_key(session_id, call_id))
        return self

    def usage(self, record: UsageRecord) -> WriteBatch:
        """Write (or overwrite) what a session and its subtree have spent."""
        self._put("usage", record.session_id.bytes, record)
        return self

    def memory(self, record: MemoryRecord) -> WriteBatch:
        self._put("memory", memory_key(record.agent_id, record.key), record)
        self._put(
            "memory_ids",
            record.memory_id.encode(),
            MemoryIdRecord(agent_id=record.agent_id, key=record.key),
        )
        return self

    def quarantine(self, record: QuarantineRecord, *, if_unchanged: bool = False) -> WriteBatch:
        """Move an unreadable value aside (and delete it where it was; with
        ``if_unchanged``, only while it still holds ``record.raw``: a value
        written since, queued before this, stays)."""
        self._put("quarantine", quarantine_key(record.db, record.key), record)
        if if_unchanged:
            self.ops.append(("delete_if", record.db, record.key, record.raw))
            return self
        self._delete(record.db, record.key)
        if record.db == "sessions":
            self._delete("live", record.key)
        return self

    def raw_delete_all(self, db: str) -> WriteBatch:
        """Delete every entry of ``db`` (a derived index built again)."""
        self._delete(db, b"", prefix=True)
        return self

    def raw_delete(self, db: str, key: bytes) -> WriteBatch:
        """Delete one entry as it is keyed (a stale index entry, tests)."""
        self._delete(db, key)
        return self

    def raw(self, db: str, key: bytes, value: bytes) -> WriteBatch:
        """Put bytes as they are (import, tests); the caller vouches for them."""
        self.ops.append(("put", db, key, value))
        self.size += len(key) + len(value)
        return self


def _epoch(epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 2**63:
        msg = f"epoch {epoch!r} is not a whole number in 0..2**63-1"
        raise RejectedInputError(msg, field="epoch")
    return epoch
