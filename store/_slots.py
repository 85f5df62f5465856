"""One slot's records: which entries of which database belong to a slot, and
the export, import and release that move them between stores.

A slotted session id (``protocol.new_session_id(slot)``) carries its slot in
its top 14 bits, so in every database keyed by a session id (then a suffix)
one slot is one contiguous key range: a read starts at the slot's first
possible id and stops at the first key past it. In that range a version 4
(unslotted) id whose top bits happen to match is skipped: unslotted ids
belong to no slot, so a store made before slots cannot move its trees.
The other databases:

* ``mains`` (agent NUL key -> Main id) is read whole and filtered by the
  slot of the Main it names;
* ``memory`` moves only in tree scope (``NodeConfig.memory_scope="tree"``):
  its keys ``tree:<Main id>`` NUL key are a contiguous range too. Memory in
  agent scope is the agent's across all its trees, so it never moves (and
  neither do the ``memory_ids`` pointing at it): moving a slot between nodes
  needs tree scope;
* ``memory_ids`` (``mem-<slotted id>``) moves with the tree-scoped write it names;
* ``quarantine`` (db NUL key) is read whole: an entry moves when its key
  starts with an id of the slot;
* ``live`` moves with its sessions (its ``LIVE_INDEXED`` stamp never does);
* ``meta`` and ``moved`` never move.

The export is one read transaction; the import and the release are each one
write transaction on the store's writer thread (``store.slots``,
``_store_slots``), so a slot is never half there. The export's header
carries the slot's epoch; the import and the release move it on.

The export's format (msgpack, ``SlotExport``): a header (format, version,
slot, the source store's node id, when, entries per database) and the
entries as ``[db, key, value]`` in database order and key order, with a
blake2b digest over the slot, the counts and the entries (their msgpack
bytes), checked before anything is imported: the same records give the
same digest from whichever store exports them.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import lmdb
import msgspec

from sessiontree.protocol import (
    RejectedInputError,
    SlotConflictError,
    slot_of,
)
from sessiontree.store._env import DATABASES
from sessiontree.store._keys import check_slot, slot_key
from sessiontree.store._records import MemoryIdRecord

__all__ = [
    "SLOT_EXPORT_FORMAT",
    "SLOT_EXPORT_VERSION",
    "SlotExport",
    "SlotHeader",
    "decode_export",
    "encode_export",
    "import_entries",
    "read_slot_export",
    "slot_entries",
]

SLOT_EXPORT_FORMAT = "sessiontree-slot"
SLOT_EXPORT_VERSION = 1

_SHIFT = 128 - 14  # a slot is an id's top 14 bits (protocol._ids)
#: Databases keyed by a session id (then a suffix): one slot is one key range.
_BY_ID = (
    "sessions",
    "children",
    "conversations",
    "branches",
    "messages",
    "platform_ids",
    "outbox",
    "received",
    "inbox",
    "usage",
    "cycles",
    "wedged",
    "recordings",
    "calls",
    "live",
)
_NEVER = frozenset({"meta", "moved", "slots"})
_TREE = b"tree:"  # memory in tree scope: "tree:<Main id>" NUL key
_MEMORY_ID = b"mem-"
_UUID_CHARS = 36


class SlotHeader(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What an export says about itself. ``counts``: entries per database;
    ``epoch``: the slot's epoch where it was exported."""

    format: str
    version: int
    slot: int
    source: str  # the exporting store's node id
    at: float
    counts: dict[str, int]
    digest: bytes = b""
    epoch: int = 0  # the slot's epoch at the source (not in the digest: it moves on)


class SlotExport(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A slot's export: its header and its entries as (db, key, value), by
    database in ``DATABASES`` order, by key within each."""

    header: SlotHeader
    entries: list[tuple[str, bytes, bytes]]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(SlotExport)


# -- which entries are the slot's ----------------------------------------------------


def _first_id(slot: int) -> uuid.UUID:
    return uuid.UUID(int=slot << _SHIFT)


def _by_id(cursor: lmdb.Cursor, slot: int) -> Iterator[tuple[bytes, bytes]]:
    """The entries whose key starts with a slotted id of ``slot``."""
    if not cursor.set_range(_first_id(slot).bytes):
        return
    for raw_key, raw_value in cursor:
        key = bytes(raw_key)
        if len(key) < 16:  # ``live``'s one-byte stamp, or a key no session wrote
            continue
        owner = uuid.UUID(bytes=key[:16])
        if owner.int >> _SHIFT != slot:
            return
        if slot_of(owner) == slot:  # not an unslotted id with the same top bits
            yield key, bytes(raw_value)


def _by_text_id(cursor: lmdb.Cursor, prefix: bytes, slot: int) -> Iterator[tuple[bytes, bytes]]:
    """The entries whose key is ``prefix`` then a slotted id of ``slot`` as text
    (the canonical lower-case form sorts as the number does)."""
    if not cursor.set_range(prefix + str(_first_id(slot)).encode()):
        return
    for raw_key, raw_value in cursor:
        key = bytes(raw_key)
        if not key.startswith(prefix):
            return
        try:
            owner = uuid.UUID(key[len(prefix) : len(prefix) + _UUID_CHARS].decode())
        except (ValueError, UnicodeDecodeError):
            return  # past the ids (no id's text sorts after a malformed one here)
        if owner.int >> _SHIFT != slot:
            return
        if slot_of(owner) == slot:
            yield key, bytes(raw_value)


def _mains(cursor: lmdb.Cursor, slot: int) -> Iterator[tuple[bytes, bytes]]:
    for raw_key, raw_value in cursor:
        value = bytes(raw_value)
        if len(value) == 16 and slot_of(uuid.UUID(bytes=value)) == slot:
            yield bytes(raw_key), value


def _memory_ids(cursor: lmdb.Cursor, slot: int) -> Iterator[tuple[bytes, bytes]]:
    """The slot's memory ids that name a write in tree scope (one that moves)."""
    for key, value in _by_text_id(cursor, _MEMORY_ID, slot):
        try:
            where = msgspec.msgpack.decode(value, type=MemoryIdRecord)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # unreadable: it stays, for recovery's quarantine
        if where.agent_id.encode().startswith(_TREE):
            yield key, value


def _quarantine(cursor: lmdb.Cursor, slot: int) -> Iterator[tuple[bytes, bytes]]:
    for raw_key, raw_value in cursor:
        key, value = bytes(raw_key), bytes(raw_value)
        if _owner("quarantine", key, value) == slot:
            yield key, value


def _slot_of_text(text: bytes) -> int | None:
    try:
        return slot_of(uuid.UUID(text[:_UUID_CHARS].decode()))
    except (ValueError, UnicodeDecodeError):
        return None


def _owner(db: str, key: bytes, value: bytes) -> int | None:
    """The slot an entry of ``db`` belongs to (None: none, it never moves)."""
    if db in _BY_ID:
        return slot_of(uuid.UUID(bytes=key[:16])) if len(key) >= 16 else None
    if db == "mains":
        return slot_of(uuid.UUID(bytes=value)) if len(value) == 16 else None
    if db == "memory":
        return _slot_of_text(key[len(_TREE) :]) if key.startswith(_TREE) else None
    if db == "memory_ids":
        return _slot_of_text(key[len(_MEMORY_ID) :]) if key.startswith(_MEMORY_ID) else None
    if db == "quarantine":
        name, _, inner = key.partition(b"\x00")
        inner_db = name.decode(errors="replace")
        if inner_db in _BY_ID or inner_db == "memory":
            return _owner(inner_db, inner, b"")
    return None


_Select = Callable[[lmdb.Cursor, int], Iterator[tuple[bytes, bytes]]]
_SELECT: dict[str, _Select] = {
    **dict.fromkeys(_BY_ID, _by_id),
    "mains": _mains,
    "memory": lambda cursor, slot: _by_text_id(cursor, _TREE, slot),
    "memory_ids": _memory_ids,
    "quarantine": _quarantine,
}


def slot_entries(
    txn: lmdb.Transaction, dbs: dict[str, Any], slot: int
) -> Iterator[tuple[str, bytes, bytes]]:
    """Every entry of ``slot`` as (db, key, value), database by database in
    ``DATABASES`` order and by key within each, read in ``txn``."""
    for db in DATABASES:
        select = _SELECT.get(db)
        if select is None or db not in dbs:
            continue
        with txn.cursor(db=dbs[db]) as cursor:
            for key, value in select(cursor, slot):
                yield db, key, value


# -- the export's bytes -------------------------------------------------------------


def _digest(header: SlotHeader, entries: list[tuple[str, bytes, bytes]]) -> bytes:
    """Over the slot and its entries only (not who exported it, or when): the
    same records give the same digest from whichever store holds them."""
    fields = [header.format, header.version, header.slot, header.counts]
    hasher = hashlib.blake2b(digest_size=32)
    hasher.update(_ENCODER.encode(fields))
    hasher.update(_ENCODER.encode(entries))
    return hasher.digest()


def encode_export(
    slot: int, source: str, entries: list[tuple[str, bytes, bytes]], *, epoch: int = 0
) -> bytes:
    """The export of ``entries`` (``slot_entries``) at ``epoch`` as bytes, digest included."""
    counts: dict[str, int] = {}
    for db, _key, _value in entries:
        counts[db] = counts.get(db, 0) + 1
    header = SlotHeader(
        format=SLOT_EXPORT_FORMAT,
        version=SLOT_EXPORT_VERSION,
        slot=slot,
        source=source,
        at=time.time(),
        counts=counts,
        epoch=epoch,
    )
    header.digest = _digest(header, entries)
    return _ENCODER.encode(SlotExport(header=header, entries=entries))


def decode_export(data: bytes) -> SlotExport:
    """An export read back and checked: ``RejectedInputError`` naming the field
    for bytes that are not one (``data``), another format or version
    (``format``, ``version``), a digest that does not match what it holds
    (``digest``: damaged or altered), counts that do not add up
    (``counts``), or an entry outside its slot or in a database that never
    moves (``entries``)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        msg = f"a slot export is bytes, not {type(data).__name__}"
        raise RejectedInputError(msg, field="data")
    try:
        export = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"not a slot export: {exc}"
        raise RejectedInputError(msg, field="data", reason="malformed") from exc
    header = export.header
    if header.format != SLOT_EXPORT_FORMAT:
        msg = f"not a slot export: format {header.format[:64]!r}"
        raise RejectedInputError(msg, field="format", reason="malformed")
    if header.version != SLOT_EXPORT_VERSION:
        msg = f"slot export version {header.version}; this code reads {SLOT_EXPORT_VERSION}"
        raise RejectedInputError(msg, field="version")
    check_slot(header.slot)
    if _digest(header, export.entries) != header.digest:
        msg = (
            f"slot {header.slot}'s export does not match its digest (damaged or altered); "
            "nothing was imported"
        )
        raise RejectedInputError(msg, field="digest", reason="malformed")
    _check_entries(export)
    return export


def read_slot_export(data: bytes) -> SlotExport:
    """``store.slots.export``'s bytes read back and checked (``decode_export``:
    what it raises), for a look at what an import would write."""
    return decode_export(data)


def _check_entries(export: SlotExport) -> None:
    """Each entry in a database that moves, under a key of the export's slot,
    and the counts as the header says (a digest proves integrity, not that
    the exporter kept to its slot)."""
    slot = export.header.slot
    counts: dict[str, int] = {}
    for db, key, value in export.entries:
        counts[db] = counts.get(db, 0) + 1
        if db in _NEVER or db not in _SELECT:
            msg = f"slot export holds an entry of {db[:64]!r}, a database that never moves"
            raise RejectedInputError(msg, field="entries")
        if _owner(db, key, value) != slot:
            msg = f"slot export holds {db} key {key.hex()[:80]} outside slot {slot}"
            raise RejectedInputError(msg, field="entries")
    if counts != export.header.counts:
        msg = f"slot export's counts {export.header.counts} do not match its entries {counts}"
        raise RejectedInputError(msg, field="counts")


# -- the writes (on the writer thread, in one transaction each) ---------------------------


def import_entries(txn: lmdb.Transaction, dbs: dict[str, Any], export: SlotExport) -> None:
    """Write ``export``'s entries in ``txn``, each onto an absent key, and drop
    the slot's tombstone (a slot moving back). ``SlotConflictError`` naming
    the db and key of the first entry already present (the caller aborts the
    transaction: nothing written)."""
    slot = export.header.slot
    for db, key, value in export.entries:
        if not txn.put(key, value, db=dbs[db], overwrite=False):
            msg = (
                f"slot {slot} cannot be imported: {db} key {key.hex()[:80]} is already "
                "in this store; nothing was written"
            )
            raise SlotConflictError(msg, slot=slot, db=db, key=key)
    txn.delete(slot_key(slot), db=dbs["moved"])
