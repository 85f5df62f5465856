"""The export's file format: canonical JSONL, its line types and their keys.

One JSON object a line, each with a ``"type"``. The first line is the
header (``meta``: the format, its version, the schema version of the code
that wrote it and the store's ``MetaRecord``), the last the trailer
(``end``: how many lines of each type came before it, so a truncated file
is refused). Between them, one line per stored entry, database by database
in ``DATABASES`` order and by key within each:

==============  ============  ==========================================================
database        line type     fields besides ``type``
==============  ============  ==========================================================
sessions        session       ``record`` (a ``SessionRecord``)
children        link          ``parent``, ``child``
mains           main          ``agent_id``, ``key``, ``session_id``
conversations   conversation  ``record`` (a ``ConversationRecord``)
branches        branch        ``record`` (a ``BranchRecord``)
messages        message       ``record`` (a ``MessageRecord``)
platform_ids    platform_id   ``session_id``, ``platform_id``, ``message_id``
memory          memory        ``record`` (a ``MemoryRecord``)
memory_ids      memory_id     ``memory_id``, ``record`` (a ``MemoryIdRecord``)
outbox          outbox        ``record`` (an ``OutboxRecord``)
received        received      ``parent``, ``record`` (a ``ReceivedRecord``)
inbox           inbox         ``record`` (an ``InboxRecord``)
quarantine      quarantine    ``record`` (a ``QuarantineRecord``)
usage           usage         ``record`` (a ``UsageRecord``)
cycles          cycle         ``record`` (a ``CycleRecord``)
wedged          wedged        ``record`` (a ``WedgedRecord``)
recording       recordings    ``record`` (a ``RecordingRecord``)
calls           call          ``record`` (a ``CallRecord``)
moved           moved         ``record`` (a ``MovedRecord``: a slot's tombstone)
any             opaque        ``db``, ``key``, ``value`` (base64), ``reason``
==============  ============  ==========================================================

Ids are UUID strings, timestamps float seconds, enums their values, bytes
base64; records are their msgspec fields in declaration order. Where a line
carries a record, the entry's key is derived from it (and from ``parent`` /
``memory_id``), so it is not repeated.

**Lossless.** Export checks every entry: the line must import back to the
very bytes the store holds. Where JSON cannot hold a value exactly (bytes
or non-string map keys inside a free-form value, a NaN, a record written
by an older schema version, a message that is not plain msgpack), the line
also carries ``raw``: the stored value in base64, which import writes
as it is. An entry that does not decode at all, or whose key does not
match its record, becomes an ``opaque`` line. Export, import into an empty store and export
again therefore gives the same bytes, header included (import carries the
file's ``MetaRecord`` over: a restore is the same store). The node's own
run history (the ``starts`` entry of ``meta``, for its restart intensity) is
not exported: a restore starts afresh.

Writing a file is ``_export``'s, reading one back ``_import``'s; this module
holds what both must agree on. Nothing here does I/O or fails at import.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgspec

from sessiontree.store._keys import (
    branch_key,
    inbox_key,
    memory_key,
    pair_key,
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
    MetaRecord,
    MovedRecord,
    OutboxRecord,
    QuarantineRecord,
    ReceivedRecord,
    RecordingRecord,
    SessionRecord,
    UsageRecord,
    WedgedRecord,
)

__all__ = [
    "ENCODER",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "LINE_DB",
    "LINE_TYPES",
    "RECORD_COUNTS",
    "RECORD_DBS",
    "AnyLine",
    "BranchLine",
    "CallLine",
    "ConversationLine",
    "CycleLine",
    "EndLine",
    "InboxLine",
    "Line",
    "LinkLine",
    "MainLine",
    "MemoryIdLine",
    "MemoryLine",
    "MessageLine",
    "MetaLine",
    "MovedLine",
    "OpaqueLine",
    "OutboxLine",
    "PlatformIdLine",
    "QuarantineLine",
    "ReceivedLine",
    "RecordDb",
    "RecordLine",
    "RecordingLine",
    "SessionLine",
    "UsageLine",
    "WedgedLine",
    "parent_of",
    "tag_of",
]

EXPORT_FORMAT = "sessiontree-export"
"""The ``format`` of the header line."""
EXPORT_VERSION = 7
"""The version of this line format (not the records' schema version); 2 made
``message`` a record line and added ``conversation``, ``branch`` and
``platform_id``; 3 added ``usage``; 5 added ``recording``; 6 added ``call``;
7 added ``moved``."""

#: Line types in the order their databases are exported (``meta`` first, ``end`` last).
LINE_TYPES = (
    "meta",
    "session",
    "link",
    "main",
    "conversation",
    "branch",
    "message",
    "platform_id",
    "memory",
    "memory_id",
    "outbox",
    "received",
    "inbox",
    "quarantine",
    "usage",
    "cycle",
    "wedged",
    "recording",
    "call",
    "moved",
    "opaque",
    "end",
)

# -- the lines ------------------------------------------------------------------------------


class Line(
    msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True, kw_only=True
):
    """One line of an export (decoded strictly: unknown fields are refused)."""


class MetaLine(Line, tag="meta"):
    format: str
    version: int
    schema: int
    record: MetaRecord | None
    raw: bytes | None = None


class SessionLine(Line, tag="session"):
    record: SessionRecord
    raw: bytes | None = None


class LinkLine(Line, tag="link"):
    parent: uuid.UUID
    child: uuid.UUID


class MainLine(Line, tag="main"):
    agent_id: str
    key: str
    session_id: uuid.UUID


class ConversationLine(Line, tag="conversation"):
    record: ConversationRecord
    raw: bytes | None = None


class BranchLine(Line, tag="branch"):
    record: BranchRecord
    raw: bytes | None = None


class MessageLine(Line, tag="message"):
    record: MessageRecord
    raw: bytes | None = None


class PlatformIdLine(Line, tag="platform_id"):
    session_id: uuid.UUID
    platform_id: str
    message_id: uuid.UUID


class MemoryLine(Line, tag="memory"):
    record: MemoryRecord
    raw: bytes | None = None


class MemoryIdLine(Line, tag="memory_id"):
    memory_id: str
    record: MemoryIdRecord
    raw: bytes | None = None


class OutboxLine(Line, tag="outbox"):
    record: OutboxRecord
    raw: bytes | None = None


class ReceivedLine(Line, tag="received"):
    parent: uuid.UUID
    record: ReceivedRecord
    raw: bytes | None = None


class InboxLine(Line, tag="inbox"):
    record: InboxRecord
    raw: bytes | None = None


class UsageLine(Line, tag="usage"):
    record: UsageRecord
    raw: bytes | None = None


class CallLine(Line, tag="call"):
    record: CallRecord
    raw: bytes | None = None


class MovedLine(Line, tag="moved"):
    record: MovedRecord
    raw: bytes | None = None


class CycleLine(Line, tag="cycle"):
    record: CycleRecord
    raw: bytes | None = None


class WedgedLine(Line, tag="wedged"):
    record: WedgedRecord
    raw: bytes | None = None


class RecordingLine(Line, tag="recording"):
    record: RecordingRecord
    raw: bytes | None = None


class QuarantineLine(Line, tag="quarantine"):
    record: QuarantineRecord
    raw: bytes | None = None


class OpaqueLine(Line, tag="opaque"):
    db: str
    key: bytes
    value: bytes
    reason: str


class EndLine(Line, tag="end"):
    counts: dict[str, int]


RecordLine: TypeAlias = (
    SessionLine
    | ConversationLine
    | BranchLine
    | MessageLine
    | MemoryLine
    | MemoryIdLine
    | OutboxLine
    | ReceivedLine
    | InboxLine
    | QuarantineLine
    | UsageLine
    | CallLine
    | MovedLine
    | CycleLine
    | WedgedLine
    | RecordingLine
)
AnyLine: TypeAlias = (
    MetaLine | LinkLine | MainLine | PlatformIdLine | RecordLine | OpaqueLine | EndLine
)

ENCODER = msgspec.json.Encoder()
"""Encodes lines (and checks records survive JSON: see ``_export``)."""
RECORD_COUNTS = LINE_TYPES[1:-1]  # the trailer counts these (header and trailer aside)


@dataclass(frozen=True)
class RecordDb:
    """How the entries of one record database become lines and back."""

    kind: type[msgspec.Struct]
    to_line: Callable[[bytes, Any, bytes | None], RecordLine]  # (key, record, raw) -> line
    key_of: Callable[[Any], bytes]  # line -> the key it is stored under


def _session_key(line: SessionLine) -> bytes:
    return line.record.info.session_id.bytes


def _memory_key(line: MemoryLine) -> bytes:
    return memory_key(line.record.agent_id, line.record.key)


def _memory_id_key(line: MemoryIdLine) -> bytes:
    return line.memory_id.encode()


def _outbox_key(line: OutboxLine) -> bytes:
    return line.record.result.session_id.bytes


def _received_key(line: ReceivedLine) -> bytes:
    return pair_key(line.parent, line.record.result.session_id)


def _usage_key(line: UsageLine) -> bytes:
    return line.record.session_id.bytes


def _call_key(line: CallLine) -> bytes:
    return pair_key(line.record.session_id, line.record.call_id)


def _moved_key(line: MovedLine) -> bytes:
    return slot_key(line.record.slot)


def _cycle_key(line: CycleLine) -> bytes:
    return line.record.session_id.bytes


def _wedged_key(line: WedgedLine) -> bytes:
    return line.record.wedged_id.bytes


def _recording_key(line: RecordingLine) -> bytes:
    return line.record.recording_id.bytes


def _inbox_key(line: InboxLine) -> bytes:
    return inbox_key(line.record.session_id, line.record.seq)


def _quarantine_key(line: QuarantineLine) -> bytes:
    return quarantine_key(line.record.db, line.record.key)


def parent_of(key: bytes) -> uuid.UUID:
    """The first id of a 32-byte pair key; ``ValueError`` for any other length."""
    if len(key) != 32:
        msg = f"a key of {len(key)} bytes, not 32"
        raise ValueError(msg)
    return uuid.UUID(bytes=key[:16])


def _conversation_key(line: ConversationLine) -> bytes:
    return line.record.state.session_id.bytes


def _branch_key(line: BranchLine) -> bytes:
    return branch_key(line.record.session_id, line.record.branch.number)


def _message_key(line: MessageLine) -> bytes:
    return pair_key(line.record.session_id, line.record.message.id)


RECORD_DBS: dict[str, RecordDb] = {
    "sessions": RecordDb(
        SessionRecord, lambda _k, r, raw: SessionLine(record=r, raw=raw), _session_key
    ),
    "conversations": RecordDb(
        ConversationRecord,
        lambda _k, r, raw: ConversationLine(record=r, raw=raw),
        _conversation_key,
    ),
    "branches": RecordDb(
        BranchRecord, lambda _k, r, raw: BranchLine(record=r, raw=raw), _branch_key
    ),
    "messages": RecordDb(
        MessageRecord, lambda _k, r, raw: MessageLine(record=r, raw=raw), _message_key
    ),
    "memory": RecordDb(MemoryRecord, lambda _k, r, raw: MemoryLine(record=r, raw=raw), _memory_key),
    "memory_ids": RecordDb(
        MemoryIdRecord,
        lambda k, r, raw: MemoryIdLine(memory_id=k.decode(), record=r, raw=raw),
        _memory_id_key,
    ),
    "outbox": RecordDb(OutboxRecord, lambda _k, r, raw: OutboxLine(record=r, raw=raw), _outbox_key),
    "received": RecordDb(
        ReceivedRecord,
        lambda k, r, raw: ReceivedLine(parent=parent_of(k), record=r, raw=raw),
        _received_key,
    ),
    "inbox": RecordDb(InboxRecord, lambda _k, r, raw: InboxLine(record=r, raw=raw), _inbox_key),
    "quarantine": RecordDb(
        QuarantineRecord,
        lambda _k, r, raw: QuarantineLine(record=r, raw=raw),
        _quarantine_key,
    ),
    "usage": RecordDb(UsageRecord, lambda _k, r, raw: UsageLine(record=r, raw=raw), _usage_key),
    "cycles": RecordDb(CycleRecord, lambda _k, r, raw: CycleLine(record=r, raw=raw), _cycle_key),
    "wedged": RecordDb(WedgedRecord, lambda _k, r, raw: WedgedLine(record=r, raw=raw), _wedged_key),
    "recordings": RecordDb(
        RecordingRecord, lambda _k, r, raw: RecordingLine(record=r, raw=raw), _recording_key
    ),
    "calls": RecordDb(CallRecord, lambda _k, r, raw: CallLine(record=r, raw=raw), _call_key),
    "moved": RecordDb(MovedRecord, lambda _k, r, raw: MovedLine(record=r, raw=raw), _moved_key),
}
LINE_DB: dict[type[Line], str] = {
    SessionLine: "sessions",
    ConversationLine: "conversations",
    BranchLine: "branches",
    MessageLine: "messages",
    MemoryLine: "memory",
    MemoryIdLine: "memory_ids",
    OutboxLine: "outbox",
    ReceivedLine: "received",
    InboxLine: "inbox",
    QuarantineLine: "quarantine",
    UsageLine: "usage",
    CycleLine: "cycles",
    WedgedLine: "wedged",
    RecordingLine: "recordings",
    CallLine: "calls",
    MovedLine: "moved",
}


def tag_of(line: Line) -> str:
    """A line's ``type`` (its tag)."""
    return str(type(line).__struct_config__.tag)
