"""``store.slots``: a slot's epoch, and moving a slot to another store.

A slot (``sessiontree.protocol.SLOTS``) is a share of the trees: every id of
a Main's tree carries its slot. ``export`` reads one slot's entries in one
read transaction (``_slots`` says which entries of which database) with its
epoch; ``import_`` writes them into another store in one write transaction,
onto absent keys, and moves the slot's epoch past the exported one;
``release`` deletes them at the source with a tombstone naming the new owner
and moves the epoch on there too, so a writer still fenced on the old epoch
(``WriteBatch.in_slot``) fails. Both writes run on the writer thread, fenced
as every commit is (``Writer.transact_alone``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import lmdb

from sessiontree.protocol import (
    CorruptRecordError,
    RejectedInputError,
    SlotMovedError,
    StoreError,
    StoreFullError,
)
from sessiontree.store._keys import check_slot, slot_key
from sessiontree.store._reads import Reads
from sessiontree.store._records import MovedRecord, SlotRecord, decode_record, encode_record
from sessiontree.store._slots import (
    SlotHeader,
    decode_export,
    encode_export,
    import_entries,
    slot_entries,
)
from sessiontree.store._writer import Writer

__all__ = ["StoreSlots"]

log = logging.getLogger("sessiontree.store")


def _epoch_in(txn: lmdb.Transaction, dbs: dict[str, Any], slot: int) -> int:
    """``slot``'s epoch as ``txn`` sees it; ``CorruptRecordError`` for a record
    that does not decode (the move then writes nothing)."""
    key = slot_key(slot)
    raw = txn.get(key, db=dbs["slots"])
    return 0 if raw is None else decode_record(SlotRecord, bytes(raw), db="slots", key=key).epoch


def _set_epoch(txn: lmdb.Transaction, dbs: dict[str, Any], slot: int, epoch: int) -> None:
    txn.put(slot_key(slot), encode_record(SlotRecord(slot=slot, epoch=epoch)), db=dbs["slots"])


class StoreSlots:
    """A store's slots: their epochs, their tombstones, their moves (``store.slots``)."""

    def __init__(
        self,
        reads: Reads,
        dbs: dict[str, Any],
        writer: Callable[[], Writer],
        node_id: Callable[[], str],
    ) -> None:
        self._reads = reads
        self._dbs = dbs
        self._writer = writer  # the store's writer, or its error (closed, read-only)
        self._node_id = node_id
        self._moved: dict[int, MovedRecord] = {}  # the slots released, read at open

    def epoch(self, slot: int) -> int:
        """``slot``'s epoch (0 for a slot never moved); ``CorruptRecordError`` if
        its record is unreadable, ``RejectedInputError`` for a slot outside
        0..SLOTS-1. Fence a write on it with ``WriteBatch.in_slot``, move it
        with ``WriteBatch.slot_epoch``."""
        record = self._reads.get(SlotRecord, "slots", slot_key(slot))
        return 0 if record is None else record.epoch

    def export(self, slot: int) -> bytes:
        """Every entry of ``slot`` and its epoch, read in one transaction, as the
        bytes ``import_`` takes on another store (a header, the entries, a
        digest over the slot and its entries). Writes may go on meanwhile; the
        export holds the slot as of one commit. ``RejectedInputError`` naming
        ``slot`` for one outside 0..SLOTS-1, ``SlotMovedError`` for a slot this
        store released."""
        check_slot(slot)
        self.check_here(slot)
        dbs = self._dbs
        with self._reads.transaction() as txn:
            entries = list(slot_entries(txn, dbs, slot))
            epoch = _epoch_in(txn, dbs, slot)
        return encode_export(slot, self._node_id(), entries, epoch=epoch)

    def import_(self, data: bytes) -> SlotHeader:
        """Write a slot's export (``export`` of another store) into this one, in
        one transaction: each entry onto a key this store does not hold, the
        slot's tombstone here dropped (it moved away before and comes back),
        its epoch moved past both the exported one and this store's. Returns
        the export's header (its counts say what was written).
        ``RejectedInputError`` naming the field for bytes that are not a whole
        export or whose digest does not match; ``SlotConflictError`` naming
        the db and key of an entry already here; ``StoreFencedError`` on a
        stale handle; ``StoreFullError``/``StoreError`` when the commit fails.
        Nothing is written in any of those cases."""
        export = decode_export(data)
        slot = export.header.slot
        dbs = self._dbs

        def work(txn: lmdb.Transaction) -> None:
            import_entries(txn, dbs, export)
            _set_epoch(txn, dbs, slot, max(export.header.epoch, _epoch_in(txn, dbs, slot)) + 1)

        _committed(self._writer().transact_alone(work), f"import slot {slot}")
        self._moved.pop(slot, None)
        return export.header

    def release(self, slot: int, new_owner: str) -> MovedRecord:
        """Delete every entry of ``slot``, write its tombstone (``moved``: the new
        owner, when, how many entries) and move its epoch on, in one
        transaction; from then on the slot's sessions answer
        ``SlotMovedError`` naming ``new_owner``. Call it once the slot's export
        is imported by its new owner, with nothing of the slot running here
        (``node.slots.release`` sees to both). ``RejectedInputError`` naming
        ``slot`` or ``new_owner``; ``StoreFencedError`` on a stale handle; the
        store's error when the commit fails (nothing deleted)."""
        check_slot(slot)
        if not isinstance(new_owner, str) or not 0 < len(new_owner) <= 256:
            msg = f"new_owner must be a node's id (1 to 256 characters), not {new_owner!r}"
            raise RejectedInputError(msg, field="new_owner")
        dbs = self._dbs
        released: list[MovedRecord] = []

        def work(txn: lmdb.Transaction) -> None:
            doomed = list(slot_entries(txn, dbs, slot))
            for db, key, _value in doomed:
                txn.delete(key, db=dbs[db])
            tombstone = MovedRecord(slot=slot, owner=new_owner, at=time.time(), records=len(doomed))
            txn.put(slot_key(slot), encode_record(tombstone), db=dbs["moved"])
            _set_epoch(txn, dbs, slot, _epoch_in(txn, dbs, slot) + 1)
            released.append(tombstone)

        _committed(self._writer().transact_alone(work), f"release slot {slot}")
        self._moved[slot] = released[0]
        return released[0]

    def reload(self) -> None:
        """Read the tombstones of the slots this store released (at open, and
        after an import of a whole store wrote them). One that does not decode
        is logged and left out (``store verify`` names it)."""
        if "moved" not in self._dbs:  # a read-only open of an older store
            return
        moved = {}
        for record in self._reads.decoded(MovedRecord, "moved"):
            if isinstance(record, CorruptRecordError):
                log.error("unreadable slot tombstone: %s", record)
            else:
                moved[record.slot] = record
        self._moved = moved

    def moved(self, slot: int) -> MovedRecord | None:
        """The tombstone of ``slot`` if this store released it, else None."""
        return self._moved.get(slot)

    def check_here(self, slot: int | None, session_id: uuid.UUID | None = None) -> None:
        """``SlotMovedError`` (naming the slot, its new owner, and ``session_id``)
        if this store released ``slot``; nothing for None (an unslotted id)."""
        if slot is None or not self._moved:
            return
        moved = self._moved.get(slot)
        if moved is not None:
            what = f"session {session_id}" if session_id is not None else f"slot {slot}"
            msg = f"{what} moved to node {moved.owner} (slot {slot})"
            raise SlotMovedError(
                msg, slot=slot, owner=moved.owner, at=moved.at, session_id=session_id
            )


def _committed(future: Any, what: str) -> None:
    """Wait for a slot's write; its error as the store's (nothing was written)."""
    try:
        future.result()
    except lmdb.MapFullError as exc:
        msg = f"the store's map is too small to {what}; nothing was written"
        raise StoreFullError(msg) from exc
    except lmdb.Error as exc:
        msg = f"could not {what}: {exc!r}; nothing was written"
        raise StoreError(msg) from exc
