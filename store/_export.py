"""Canonical export and import: a store as human-readable JSONL, and back.

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
as it is. An
entry that does not decode at all, or whose key does not match its record,
becomes an ``opaque`` line. Export, import into an empty store and export
again therefore gives the same bytes, header included (import carries the
file's ``MetaRecord`` over: a restore is the same store).

**Beside a live node.** Export reads through ``Store.scan``: short read
transactions, so it never pins old pages for its whole run; the price is
that it is not one point-in-time snapshot — each entry is whole, but
entries of different databases may be a few commits apart. Export a
stopped node's store for an exact snapshot.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, TypeAlias

import msgspec

from sessiontree.protocol import CorruptRecordError, RejectedInputError, StoreError
from sessiontree.store._batch import WriteBatch
from sessiontree.store._env import DATABASES
from sessiontree.store._keys import (
    branch_key,
    inbox_key,
    main_key,
    memory_key,
    pair_key,
    platform_key,
    quarantine_key,
)
from sessiontree.store._records import (
    SCHEMA_VERSION,
    BranchRecord,
    ConversationRecord,
    InboxRecord,
    MemoryIdRecord,
    MemoryRecord,
    MessageRecord,
    MetaRecord,
    OutboxRecord,
    QuarantineRecord,
    ReceivedRecord,
    SessionRecord,
    decode_record,
    encode_record,
)
from sessiontree.store._store import Store

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "LINE_TYPES", "export_jsonl", "import_jsonl"]

EXPORT_FORMAT = "sessiontree-export"
"""The ``format`` of the header line."""
EXPORT_VERSION = 2
"""The version of this line format (not the records' schema version); 2 made
``message`` a record line and added ``conversation``, ``branch`` and ``platform_id``."""

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
    "opaque",
    "end",
)

MAX_LINE_BYTES = 256 << 20  # one line of an import; a store's values are never this large
_BATCH_BYTES = 256 << 20  # an import up to this size commits in one transaction
_MAX_KEY = 511  # LMDB's default maximum key size
_WRITE_TIMEOUT = 600.0  # seconds one import transaction may take before the import gives up

# -- the lines ------------------------------------------------------------------------------


class _Line(
    msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True, kw_only=True
):
    """One line of an export (decoded strictly: unknown fields are refused)."""


class MetaLine(_Line, tag="meta"):
    format: str
    version: int
    schema: int
    record: MetaRecord | None
    raw: bytes | None = None


class SessionLine(_Line, tag="session"):
    record: SessionRecord
    raw: bytes | None = None


class LinkLine(_Line, tag="link"):
    parent: uuid.UUID
    child: uuid.UUID


class MainLine(_Line, tag="main"):
    agent_id: str
    key: str
    session_id: uuid.UUID


class ConversationLine(_Line, tag="conversation"):
    record: ConversationRecord
    raw: bytes | None = None


class BranchLine(_Line, tag="branch"):
    record: BranchRecord
    raw: bytes | None = None


class MessageLine(_Line, tag="message"):
    record: MessageRecord
    raw: bytes | None = None


class PlatformIdLine(_Line, tag="platform_id"):
    session_id: uuid.UUID
    platform_id: str
    message_id: uuid.UUID


class MemoryLine(_Line, tag="memory"):
    record: MemoryRecord
    raw: bytes | None = None


class MemoryIdLine(_Line, tag="memory_id"):
    memory_id: str
    record: MemoryIdRecord
    raw: bytes | None = None


class OutboxLine(_Line, tag="outbox"):
    record: OutboxRecord
    raw: bytes | None = None


class ReceivedLine(_Line, tag="received"):
    parent: uuid.UUID
    record: ReceivedRecord
    raw: bytes | None = None


class InboxLine(_Line, tag="inbox"):
    record: InboxRecord
    raw: bytes | None = None


class QuarantineLine(_Line, tag="quarantine"):
    record: QuarantineRecord
    raw: bytes | None = None


class OpaqueLine(_Line, tag="opaque"):
    db: str
    key: bytes
    value: bytes
    reason: str


class EndLine(_Line, tag="end"):
    counts: dict[str, int]


AnyLine: TypeAlias = (
    MetaLine
    | SessionLine
    | LinkLine
    | MainLine
    | ConversationLine
    | BranchLine
    | MessageLine
    | PlatformIdLine
    | MemoryLine
    | MemoryIdLine
    | OutboxLine
    | ReceivedLine
    | InboxLine
    | QuarantineLine
    | OpaqueLine
    | EndLine
)
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
)

_ENCODER = msgspec.json.Encoder()
_LINE_DECODER: msgspec.json.Decoder[AnyLine] = msgspec.json.Decoder(AnyLine)
_RECORD_COUNTS = LINE_TYPES[1:-1]  # the trailer counts these (header and trailer aside)


@dataclass(frozen=True)
class _RecordDb:
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


def _inbox_key(line: InboxLine) -> bytes:
    return inbox_key(line.record.session_id, line.record.seq)


def _quarantine_key(line: QuarantineLine) -> bytes:
    return quarantine_key(line.record.db, line.record.key)


def _parent_of(key: bytes) -> uuid.UUID:
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


_RECORD_DBS: dict[str, _RecordDb] = {
    "sessions": _RecordDb(
        SessionRecord, lambda _k, r, raw: SessionLine(record=r, raw=raw), _session_key
    ),
    "conversations": _RecordDb(
        ConversationRecord,
        lambda _k, r, raw: ConversationLine(record=r, raw=raw),
        _conversation_key,
    ),
    "branches": _RecordDb(
        BranchRecord, lambda _k, r, raw: BranchLine(record=r, raw=raw), _branch_key
    ),
    "messages": _RecordDb(
        MessageRecord, lambda _k, r, raw: MessageLine(record=r, raw=raw), _message_key
    ),
    "memory": _RecordDb(
        MemoryRecord, lambda _k, r, raw: MemoryLine(record=r, raw=raw), _memory_key
    ),
    "memory_ids": _RecordDb(
        MemoryIdRecord,
        lambda k, r, raw: MemoryIdLine(memory_id=k.decode(), record=r, raw=raw),
        _memory_id_key,
    ),
    "outbox": _RecordDb(
        OutboxRecord, lambda _k, r, raw: OutboxLine(record=r, raw=raw), _outbox_key
    ),
    "received": _RecordDb(
        ReceivedRecord,
        lambda k, r, raw: ReceivedLine(parent=_parent_of(k), record=r, raw=raw),
        _received_key,
    ),
    "inbox": _RecordDb(InboxRecord, lambda _k, r, raw: InboxLine(record=r, raw=raw), _inbox_key),
    "quarantine": _RecordDb(
        QuarantineRecord,
        lambda _k, r, raw: QuarantineLine(record=r, raw=raw),
        _quarantine_key,
    ),
}
_LINE_DB: dict[type[_Line], str] = {
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
}


def _tag(line: _Line) -> str:
    return str(type(line).__struct_config__.tag)


# -- export ---------------------------------------------------------------------------------


def export_jsonl(store: Store, out: str | os.PathLike[str] | IO[str] | IO[bytes]) -> dict[str, int]:
    """Write ``store`` as canonical JSONL to ``out``; return lines written per type.

    ``out`` is a path or an open stream (text or binary). A path is written
    to a temporary file beside it (mode 0600), fsync'd and renamed over
    ``out``, so a reader sees the old file or the whole new one, never half
    of it; on any failure the temporary file is removed and ``out`` is left
    as it was. Works on a read-only ``Store`` (beside a running node).

    Raises ``OSError`` when the file cannot be written and ``StoreError``
    when the store is closed. Unreadable entries never stop an export: they
    become ``opaque`` lines.
    """
    if isinstance(out, str | os.PathLike):
        return _export_to_path(store, Path(out))
    if isinstance(out, io.TextIOBase):
        text = out
        return _write_lines(store, lambda data: text.write(data.decode()))
    binary: IO[Any] = out
    return _write_lines(store, binary.write)


def _export_to_path(store: Store, path: Path) -> dict[str, int]:
    directory = path.parent
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            counts = _write_lines(store, handle.write)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(directory)
    return counts


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (best effort: some file systems refuse a directory fsync)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_lines(store: Store, write: Callable[[bytes], object]) -> dict[str, int]:
    counts = dict.fromkeys(LINE_TYPES, 0)
    for line in _lines(store):
        write(_ENCODER.encode(line) + b"\n")
        counts[_tag(line)] += 1
    return {name: n for name, n in counts.items() if n}


def _lines(store: Store) -> Iterator[_Line]:
    counts = dict.fromkeys(_RECORD_COUNTS, 0)
    meta_raw = next((raw for key, raw in store.scan("meta", b"meta") if key == b"meta"), None)
    header, meta_opaque = _header(meta_raw)
    yield header
    for db in DATABASES:
        for key, raw in store.scan(db):
            if db == "meta" and key == b"meta":
                if meta_opaque is None:
                    continue
                line: _Line = meta_opaque
            else:
                line = _render(db, key, raw)
            counts[_tag(line)] += 1
            yield line
    yield EndLine(counts=counts)


def _header(raw: bytes | None) -> tuple[MetaLine, OpaqueLine | None]:
    line = MetaLine(
        format=EXPORT_FORMAT, version=EXPORT_VERSION, schema=SCHEMA_VERSION, record=None
    )
    if raw is None:
        return line, None
    try:
        record = decode_record(MetaRecord, raw, db="meta", key=b"meta")
        exact = _exact(MetaRecord, record, raw)
    except (CorruptRecordError, _NotRenderableError, RecursionError) as exc:
        return line, OpaqueLine(db="meta", key=b"meta", value=raw, reason=str(exc))
    line.record = record
    line.raw = None if exact else raw
    return line, None


class _NotRenderableError(Exception):
    """An entry JSON cannot carry (it becomes an ``opaque`` line)."""


def _exact(kind: type[msgspec.Struct], record: msgspec.Struct, raw: bytes) -> bool:
    """Whether ``record`` rendered as JSON imports back to exactly ``raw``;
    ``_NotRenderableError`` when it does not even import back."""
    try:
        back = msgspec.json.decode(_ENCODER.encode(record), type=kind)
    except (msgspec.DecodeError, msgspec.EncodeError, TypeError, RecursionError) as exc:
        msg = f"{kind.__name__} does not survive JSON: {exc}"
        raise _NotRenderableError(msg) from exc
    return encode_record(back) == raw


def _render(db: str, key: bytes, raw: bytes) -> _Line:
    try:
        if db == "children":
            return _render_link(key, raw)
        if db == "mains":
            return _render_main(key, raw)
        if db == "platform_ids":
            return _render_platform_id(key, raw)
        spec = _RECORD_DBS.get(db)
        if spec is None:
            msg = f"no line type for database {db!r}"
            raise _NotRenderableError(msg)
        record = decode_record(spec.kind, raw, db=db, key=key)
        exact = _exact(spec.kind, record, raw)
        line = spec.to_line(key, record, None if exact else raw)
        if spec.key_of(line) != key:
            msg = f"key {key.hex()} does not match its record"
            raise _NotRenderableError(msg)
    except (
        CorruptRecordError,
        _NotRenderableError,
        ValueError,
        OverflowError,
        RecursionError,
    ) as exc:
        return OpaqueLine(db=db, key=key, value=raw, reason=str(exc))
    return line


def _render_link(key: bytes, raw: bytes) -> LinkLine:
    if raw:
        msg = f"a tree link with a value of {len(raw)} bytes"
        raise _NotRenderableError(msg)
    return LinkLine(parent=_parent_of(key), child=uuid.UUID(bytes=key[16:]))


def _render_main(key: bytes, raw: bytes) -> MainLine:
    agent_id, sep, name = key.decode().partition("\x00")
    if not sep or len(raw) != 16:
        msg = "a mains entry that is not agent NUL key -> session id"
        raise _NotRenderableError(msg)
    return MainLine(agent_id=agent_id, key=name, session_id=uuid.UUID(bytes=raw))


def _render_platform_id(key: bytes, raw: bytes) -> PlatformIdLine:
    if len(key) <= 16 or len(raw) != 16:
        msg = "a platform_ids entry that is not session id + platform id -> message id"
        raise _NotRenderableError(msg)
    return PlatformIdLine(
        session_id=uuid.UUID(bytes=key[:16]),
        platform_id=key[16:].decode(),
        message_id=uuid.UUID(bytes=raw),
    )


# -- import ---------------------------------------------------------------------------------


def import_jsonl(
    store: Store,
    source: str | os.PathLike[str] | IO[str] | IO[bytes],
    *,
    replace: bool = False,
) -> dict[str, int]:
    """Restore an export into ``store`` (open for writing); return lines read per type.

    ``source`` is a path or an open stream (text or binary). The whole file
    is decoded and checked first — strictly: each line against its type,
    unknown fields and unknown schema versions refused, the header first and
    the trailer's counts last — and only then written, in one transaction
    when under 256 MiB of values. The file's ``MetaRecord`` replaces the
    store's (``store.meta`` follows), so a restore keeps its identity.

    The store must hold nothing but its ``meta`` record; with
    ``replace=True`` everything in it is deleted in the same transaction as
    the first writes (never beside a running node on that store).

    Raises ``RejectedInputError`` naming the line number and the field
    (``.field``) for a bad line, a truncated file or a file of a newer
    format; nothing is written then. ``StoreError`` when the store is
    read-only, not empty (without ``replace``) or cannot commit
    (``StoreFullError`` when the map is full): a one-transaction import
    wrote nothing; a larger one says how much it committed. ``OSError``
    when ``source`` cannot be read; ``TimeoutError`` when one transaction
    takes over ten minutes (it may still commit).
    """
    if store.readonly:
        msg = f"store {store.path} is open read-only; import needs the writer"
        raise StoreError(msg)
    if not replace:
        held = {db: n for db in DATABASES if db != "meta" and (n := store.count(db))}
        if held:
            listing = ", ".join(f"{n} {db}" for db, n in held.items())
            msg = (
                f"store {store.path} is not empty ({listing}); import into a new store "
                "or pass replace=True"
            )
            raise StoreError(msg)
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as handle:
            plan = _plan(handle)
    else:
        plan = _plan(source)
    _commit(store, plan, replace=replace)
    if plan.meta is not None:
        store.meta = plan.meta
    return plan.counts


@dataclass
class _Plan:
    puts: list[tuple[str, bytes, bytes]]
    counts: dict[str, int]
    meta: MetaRecord | None


def _plan(source: Iterable[str | bytes]) -> _Plan:
    """Decode and check every line; the puts to make, or ``RejectedInputError``."""
    puts: list[tuple[str, bytes, bytes]] = []
    seen: set[tuple[str, bytes]] = set()
    counts = dict.fromkeys(LINE_TYPES, 0)
    meta: MetaRecord | None = None
    ended = False
    number = 0
    for number, text in enumerate(source, start=1):
        data = text.encode() if isinstance(text, str) else bytes(text)
        line = _decode_line(number, data)
        tag = _tag(line)
        if ended:
            _reject(number, "a line after the end line (two exports in one file?)", "type")
        if number == 1 and not isinstance(line, MetaLine):
            _reject(number, f"starts with a {tag} line, not meta: not a sessiontree export", "type")
        if isinstance(line, EndLine):
            _check_end(number, line, counts)
            counts[tag] += 1
            ended = True
            continue
        if isinstance(line, MetaLine):
            if number != 1:
                _reject(number, "a second meta line", "type")
            meta = _check_meta(number, line)
            entry = None if line.record is None else ("meta", b"meta", _record_bytes(number, line))
        else:
            entry = _entry(number, line)
        counts[tag] += 1
        if entry is None:
            continue
        db, key, _ = entry
        if not 0 < len(key) <= _MAX_KEY:
            _reject(number, f"a key of {len(key)} bytes (LMDB takes 1..{_MAX_KEY})", "key")
        if (db, key) in seen:
            _reject(number, f"a second entry for {db} key {key.hex()}", "type")
        seen.add((db, key))
        puts.append(entry)
    if number == 0:
        _reject(1, "the file is empty", None)
    if not ended:
        _reject(number, "no end line: the file is truncated", None)
    return _Plan(puts, {name: n for name, n in counts.items() if n}, meta)


def _reject(number: int, problem: str, field: str | None) -> NoReturn:
    where = f" ({field})" if field else ""
    msg = f"line {number}{where}: {problem}"
    raise RejectedInputError(msg, field=field)


_PATH = re.compile(r" - at `\$\.?(.*)`$")
_NAMED = re.compile(r"field `([^`]+)`")


def _field_of(exc: msgspec.ValidationError) -> str | None:
    """The dotted path msgspec names in ``exc`` (``record.info.state``), if any."""
    text = str(exc)
    path = _PATH.search(text)
    parts = [path.group(1)] if path is not None and path.group(1) else []
    named = _NAMED.search(text)
    if named is not None:
        parts.append(named.group(1))
    return ".".join(parts) or None


def _decode_line(number: int, data: bytes) -> AnyLine:
    if len(data) > MAX_LINE_BYTES:
        _reject(number, f"{len(data)} bytes, over the cap of {MAX_LINE_BYTES}", None)
    if not data.strip():
        _reject(number, "an empty line", None)
    try:
        return _LINE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        field = _field_of(exc)
        where = f" ({field})" if field else ""
        msg = f"line {number}{where}: {exc}"
        raise RejectedInputError(msg, field=field) from exc
    except msgspec.DecodeError as exc:
        msg = f"line {number}: not JSON: {exc}"
        raise RejectedInputError(msg) from exc
    except RecursionError as exc:
        msg = f"line {number}: nested too deeply"
        raise RejectedInputError(msg) from exc


def _check_meta(number: int, line: MetaLine) -> MetaRecord | None:
    if line.format != EXPORT_FORMAT:
        _reject(number, f"format {line.format!r}, not {EXPORT_FORMAT!r}", "format")
    if line.version != EXPORT_VERSION:
        _reject(number, f"export format version {line.version}; this code reads 1", "version")
    if not 1 <= line.schema <= SCHEMA_VERSION:
        _reject(
            number, f"schema version {line.schema}; this code reads 1..{SCHEMA_VERSION}", "schema"
        )
    if line.raw is not None and line.record is None:
        _reject(number, "raw without a record", "raw")
    return line.record


def _check_end(number: int, line: EndLine, counts: dict[str, int]) -> None:
    expected = {name: counts[name] for name in _RECORD_COUNTS}
    if line.counts != expected:
        _reject(
            number,
            f"the end line counts {line.counts}, the file holds {expected} (truncated or edited?)",
            "counts",
        )


def _entry(number: int, line: AnyLine) -> tuple[str, bytes, bytes]:
    """The (db, key, value) a line puts; ``RejectedInputError`` when it cannot."""
    if isinstance(line, LinkLine):
        return "children", pair_key(line.parent, line.child), b""
    if isinstance(line, MainLine):
        return "mains", main_key(line.agent_id, line.key), line.session_id.bytes
    if isinstance(line, PlatformIdLine):
        if not line.platform_id:
            _reject(number, "an empty platform id", "platform_id")
        key = platform_key(line.session_id, line.platform_id)
        return "platform_ids", key, line.message_id.bytes
    if isinstance(line, OpaqueLine):
        if line.db not in DATABASES:
            _reject(number, f"unknown database {line.db!r}", "db")
        return line.db, line.key, line.value
    assert not isinstance(line, MetaLine | EndLine)
    spec = _RECORD_DBS[_LINE_DB[type(line)]]
    value = _record_bytes(number, line)
    try:
        key = spec.key_of(line)
    except (ValueError, OverflowError) as exc:  # an inbox seq outside 0..2**64-1
        _reject(number, f"no key for this record: {exc}", "record")
    return _LINE_DB[type(line)], key, value


def _record_bytes(number: int, line: MetaLine | RecordLine) -> bytes:
    """The stored bytes of a record line: its ``raw`` once checked against the
    readable record, else the record encoded."""
    record = line.record
    assert record is not None
    version = getattr(record, "v", None)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        problem = f"schema version {version!r}; this code reads 1..{SCHEMA_VERSION}"
        _reject(number, problem, "record.v")
    if line.raw is None:
        return encode_record(record)
    db = "meta" if isinstance(line, MetaLine) else _LINE_DB[type(line)]
    try:
        stored = decode_record(type(record), line.raw, db=db, key=b"")
    except CorruptRecordError as exc:
        _reject(number, f"raw does not decode: {exc}", "raw")
    except RecursionError:
        _reject(number, "raw is nested too deeply", "raw")
    if _ENCODER.encode(stored) != _ENCODER.encode(record):
        _reject(number, "raw and record disagree (was the record edited?)", "record")
    return line.raw


def _commit(store: Store, plan: _Plan, *, replace: bool) -> None:
    batches = [WriteBatch()]
    if replace:
        for db in DATABASES:
            if db != "meta":
                batches[0]._delete(db, b"", prefix=True)
    for db, key, value in plan.puts:
        if batches[-1].size >= _BATCH_BYTES:
            batches.append(WriteBatch())
        batches[-1].raw(db, key, value)
    for done, batch in enumerate(batches):
        try:
            store.write(batch, timeout=_WRITE_TIMEOUT)
        except StoreError as exc:
            if done == 0:
                raise
            msg = (
                f"import stopped after {done} of {len(batches)} transactions: {exc}; the "
                "store holds part of the file — import it again with replace=True"
            )
            raise StoreError(msg) from exc
