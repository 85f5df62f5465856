"""What the store keeps: msgspec Structs encoded as msgpack, each with its schema version.

Evolution rules (msgspec's): a new version only adds fields with defaults, a
type never changes, unknown fields are skipped on decode (a record written by
newer code still reads), and a record whose ``v`` is above
``SCHEMA_VERSION`` is refused as unknown (recovery quarantines it).

Versions: 1 — the first layout; 2 — ``SessionRecord.resume`` (default False);
3 — conversation trees (``ConversationRecord``, ``MessageRecord``); 4 — model
calls: ``UsageRecord``, and ``ContextEntry.tool_calls``/``tool_call_id``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from sessiontree.protocol import (
    Branch,
    ConversationState,
    CorruptRecordError,
    Message,
    SessionInfo,
    SessionResult,
    Usage,
)
from sessiontree.store._keys import (
    branch_key,
    inbox_key,
    memory_key,
    pair_key,
    quarantine_key,
)

__all__ = [
    "SCHEMA_VERSION",
    "BranchRecord",
    "CallRecord",
    "ContextEntry",
    "ContextRecord",
    "ConversationRecord",
    "CycleRecord",
    "InboxRecord",
    "MemoryIdRecord",
    "MemoryRecord",
    "MessageRecord",
    "MetaRecord",
    "MovedRecord",
    "OutboxRecord",
    "QuarantineRecord",
    "ReceivedRecord",
    "RecordingRecord",
    "SessionRecord",
    "SlotRecord",
    "StartsRecord",
    "UsageRecord",
    "WedgedRecord",
    "decode_id",
    "decode_record",
    "encode_record",
]

SCHEMA_VERSION = 4


class ContextEntry(msgspec.Struct, kw_only=True):
    """One message of a session's working context."""

    role: str
    content: Any
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ContextRecord(msgspec.Struct, kw_only=True):
    """A session's working context: its messages, tool results and system prompt."""

    system_prompt: str = ""
    messages: list[ContextEntry] = msgspec.field(default_factory=list)
    tool_results: list[dict[str, Any]] = msgspec.field(default_factory=list)


class SessionRecord(msgspec.Struct, kw_only=True):
    """One session as stored. ``info.state`` is its state at the write.

    Mains carry their context (written after every message cycle), branches
    theirs on suspend and completion, workers none (only identity and state).
    ``resume``: a branch parked by a shutdown, to run again by itself after
    a restart (an explicitly suspended one waits for ``resume``).
    """

    v: int = SCHEMA_VERSION
    info: SessionInfo
    context: ContextRecord | None = None
    result: SessionResult | None = None
    updated_at: float = 0.0
    resume: bool = False
    attempts: int = 0
    """Runs of a parked branch started since it was parked (counted before each
    runs): a crash leaves the count, a clean park resets it."""
    pressured: bool = False
    """A branch memory pressure suspended: resumed once memory is free again,
    also after a restart."""


class OutboxRecord(msgspec.Struct, kw_only=True):
    """A result owed to ``parent_id``: written with the child's terminal state,
    removed in the transaction that records the parent's receipt."""

    v: int = SCHEMA_VERSION
    parent_id: uuid.UUID
    result: SessionResult


class ReceivedRecord(msgspec.Struct, kw_only=True):
    """A child result filed on its parent's record (received, or owed to a parent
    that had already ended)."""

    v: int = SCHEMA_VERSION
    result: SessionResult


class InboxRecord(msgspec.Struct, kw_only=True):
    """An inbound message a Main acknowledged and has not yet run a cycle for.
    ``id``: the message's identity (given at acceptance; None in records
    written before it was kept), which its cycle's conversation appends are
    keyed by. ``request_id``: the sender's idempotency key, if it gave one (a
    repeat while this record lasts is answered as the first was)."""

    v: int = SCHEMA_VERSION
    session_id: uuid.UUID
    seq: int
    message: Any
    received_at: float
    id: uuid.UUID | None = None
    request_id: str | None = None


class CycleRecord(msgspec.Struct, kw_only=True):
    """The message cycle a Main started and has not yet snapshotted: what it runs
    for (an inbox ``seq``, or a child's result ``child_id``) and which attempt.
    Queued before anything the cycle writes; durable before a replayed
    cycle runs, or once the skill reads its attempt, so a crash is counted."""

    v: int = SCHEMA_VERSION
    session_id: uuid.UUID
    seq: int | None = None
    child_id: uuid.UUID | None = None
    attempt: int = 1
    started_at: float = 0.0
    trace: str | None = None  # the cycle's span on a traced node (a rerun links to it)


class WedgedRecord(msgspec.Struct, kw_only=True):
    """Work recovery held back because runs of it kept ending in a crash (or that
    was too old to replay): a Main's inbound ``message`` or child ``result``, or
    a parked ``branch``. Never run again on its own; requeued or dropped by the
    operator. ``session_id``: the Main, or the branch."""

    v: int = SCHEMA_VERSION
    wedged_id: uuid.UUID
    kind: str  # "message" | "result" | "branch"
    session_id: uuid.UUID
    agent_id: str
    attempts: int
    reason: str
    at: float
    seq: int | None = None
    message: Any = None
    received_at: float | None = None
    result: SessionResult | None = None
    message_id: uuid.UUID | None = None  # a message's InboxRecord.id (kept on a requeue)


class RecordingRecord(msgspec.Struct, kw_only=True):
    """A recorded subtree's run (``sessiontree.protocol.Recording``, as its
    file's bytes in ``data``, so a recording of another format is told apart
    from a damaged record), under its root's id; ``complete`` once every
    session of it ended."""

    v: int = SCHEMA_VERSION
    recording_id: uuid.UUID
    agent_id: str
    started_at: float
    complete: bool
    data: bytes


class StartsRecord(msgspec.Struct, kw_only=True):
    """The node's recent starts, for its restart intensity: ``running`` from a
    start until a clean shutdown (still set at the next start: that run
    crashed); ``crashes``: when the runs that crashed had started."""

    v: int = SCHEMA_VERSION
    running: bool = False
    started_at: float = 0.0
    crashes: list[float] = msgspec.field(default_factory=list)


class ConversationRecord(msgspec.Struct, kw_only=True):
    """A session's conversation bookkeeping: counters, the current branch, pending
    deletions. Its branches are ``BranchRecord``s of their own (``state.branches``
    is stored empty), so an append rewrites one branch, not all of them."""

    v: int = SCHEMA_VERSION
    state: ConversationState


class BranchRecord(msgspec.Struct, kw_only=True):
    """One branch of a session's conversation."""

    v: int = SCHEMA_VERSION
    session_id: uuid.UUID
    branch: Branch


class MessageRecord(msgspec.Struct, kw_only=True):
    """One message of a session's conversation tree."""

    v: int = SCHEMA_VERSION
    session_id: uuid.UUID
    message: Message


class MemoryRecord(msgspec.Struct, kw_only=True):
    """The latest value under one shared-memory key of an agent."""

    v: int = SCHEMA_VERSION
    agent_id: str
    key: str
    memory_id: str
    value: Any
    session_id: uuid.UUID
    written_at: float


class MemoryIdRecord(msgspec.Struct, kw_only=True):
    """Where a memory id points (the value itself lives in ``MemoryRecord``)."""

    v: int = SCHEMA_VERSION
    agent_id: str
    key: str


class UsageRecord(msgspec.Struct, kw_only=True):
    """What a session and its subtree have spent, as of the last model call
    settled or child spawned under it: accounting, not a snapshot (a
    Worker's, too). Written before the call's reply reaches the skill."""

    v: int = SCHEMA_VERSION
    session_id: uuid.UUID
    own: Usage
    subtree: Usage


class CallRecord(msgspec.Struct, kw_only=True):
    """A model call in flight: the worst case it reserved (``ask``) against its
    session and every ancestor (``chain``, the session first). Written, and
    durable, before the request leaves the node; deleted in the commit that
    counts what it used. One still here when a node starts was lost with the
    node that sent it, and is counted at ``ask``: what the provider charged
    is unknown, and it cannot have been more."""

    v: int = SCHEMA_VERSION
    session_id: uuid.UUID
    call_id: uuid.UUID
    chain: tuple[uuid.UUID, ...]
    ask: Usage
    reserved_at: float

    def __post_init__(self) -> None:
        if not self.chain or self.chain[0] != self.session_id:
            msg = "a call's chain starts with its own session"
            raise ValueError(msg)


class MetaRecord(msgspec.Struct, kw_only=True):
    """The store's identity: the schema version it was written with and its node;
    ``incarnation``: bumped at every writer's open (0 in a store no writer of
    this code opened), so a process holding an older one is fenced (see
    ``StoreFencedError``)."""

    v: int = SCHEMA_VERSION
    node_id: str
    created_at: float
    incarnation: int = 0


class SlotRecord(msgspec.Struct, kw_only=True):
    """One slot's epoch (the ``slots`` database): bumped when the slot changes
    hands, so a write that names an older epoch is fenced. A slot without a
    record is at epoch 0."""

    v: int = SCHEMA_VERSION
    slot: int
    epoch: int


class MovedRecord(msgspec.Struct, kw_only=True):
    """A slot's tombstone (``moved``, keyed by the slot's two bytes): the store
    released the slot's records to ``owner`` (a node id, as the release named
    it) at ``at``, ``records`` of them; every session of the slot answers
    ``slot_moved`` here from then on."""

    v: int = SCHEMA_VERSION
    slot: int
    owner: str
    at: float
    records: int


class QuarantineRecord(msgspec.Struct, kw_only=True):
    """A stored value recovery could not read, kept aside with the reason."""

    v: int = SCHEMA_VERSION
    db: str
    key: bytes
    raw: bytes
    reason: str
    at: float


R = TypeVar("R", bound=msgspec.Struct)

#: The key each kind of record is stored under, from its fields (and, for a
#: result filed on a parent, the parent id leading its key).
_KEY_OF: dict[type[Any], Callable[[Any, bytes], bytes]] = {
    SessionRecord: lambda r, _k: r.info.session_id.bytes,
    OutboxRecord: lambda r, _k: r.result.session_id.bytes,
    ReceivedRecord: lambda r, k: k[:16] + r.result.session_id.bytes,
    InboxRecord: lambda r, _k: inbox_key(r.session_id, r.seq),
    CycleRecord: lambda r, _k: r.session_id.bytes,
    WedgedRecord: lambda r, _k: r.wedged_id.bytes,
    RecordingRecord: lambda r, _k: r.recording_id.bytes,
    ConversationRecord: lambda r, _k: r.state.session_id.bytes,
    BranchRecord: lambda r, _k: branch_key(r.session_id, r.branch.number),
    MessageRecord: lambda r, _k: pair_key(r.session_id, r.message.id),
    MemoryRecord: lambda r, _k: memory_key(r.agent_id, r.key),
    UsageRecord: lambda r, _k: r.session_id.bytes,
    CallRecord: lambda r, _k: pair_key(r.session_id, r.call_id),
    QuarantineRecord: lambda r, _k: quarantine_key(r.db, r.key),
    MovedRecord: lambda r, _k: r.slot.to_bytes(2, "big"),
}

_ENCODER = msgspec.msgpack.Encoder()
_DECODERS: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def encode_record(record: msgspec.Struct) -> bytes:
    """msgpack bytes of ``record``; ``TypeError``/``msgspec.EncodeError`` for a
    value msgpack cannot hold."""
    return _ENCODER.encode(record)


def decode_record(kind: type[R], raw: bytes, *, db: str, key: bytes) -> R:
    """Decode one stored value; ``CorruptRecordError`` naming ``db`` and ``key``
    when it does not decode, carries an unknown schema version, or belongs
    under another key than ``key`` (its id fields say so).

    Any failure of the bytes is that error, not only ``msgspec.DecodeError``:
    msgspec raises ``UnicodeDecodeError`` for a string with a bad byte and
    ``RecursionError`` for nesting past its limit, and a type's own checks
    raise ``ValueError``/``TypeError``/``OverflowError``. Only ``MemoryError``
    passes through (it says nothing about the bytes)."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.msgpack.Decoder(kind)
    try:
        record: R = decoder.decode(raw)
    except MemoryError:
        raise
    except Exception as exc:  # whatever the bytes make the decoder raise
        raise _corrupt(db, key, f"does not decode as {kind.__name__}", exc) from exc
    version = getattr(record, "v", None)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        why = f"has schema version {version!r}; this code reads 1..{SCHEMA_VERSION}"
        raise _corrupt(db, key, why)
    key_of = _KEY_OF.get(kind)
    if key_of is not None:
        try:
            belongs = key_of(record, key)
        except (ValueError, OverflowError) as exc:  # a seq or number no key holds
            raise _corrupt(db, key, "names no key", exc) from exc
        if belongs != key:
            # a flip that left the bytes decodable but changed an id: the record
            # would be taken for another's (and written back under that key)
            why = f"belongs under another key: its {kind.__name__} names {belongs.hex()}"
            raise _corrupt(db, key, why)
    return record


def decode_id(raw: bytes, *, db: str, key: bytes) -> uuid.UUID:
    """A session or message id stored as its 16 bytes (``mains``, ``platform_ids``);
    ``CorruptRecordError`` naming ``db`` and ``key`` for any other length."""
    if len(raw) != 16:
        raise _corrupt(db, key, f"holds {len(raw)} bytes where a 16-byte id belongs")
    return uuid.UUID(bytes=raw)


def _corrupt(db: str, key: bytes, why: str, exc: BaseException | None = None) -> CorruptRecordError:
    """The one error every unreadable stored value becomes."""
    cause = "" if exc is None else f": {type(exc).__name__}: {exc}"
    return CorruptRecordError(f"{db} record {key.hex()} {why}{cause}", db=db, key=key)
