"""How entries are keyed: the LMDB key of each kind of record, in one place.

Writes (``WriteBatch``), reads (``Store``) and the export/import derive keys
here, so a record is found where it was put. Keys sort as LMDB compares
bytes: a session's entries share its 16-byte id as a prefix, which is what
prefix scans and prefix deletes rely on. None of these functions fail for
well-typed arguments; ``inbox_key`` raises ``OverflowError`` for a ``seq``
outside 0..2**64-1 and ``branch_key`` for a ``number`` outside 0..2**32-1;
``slot_key`` raises ``RejectedInputError`` for a slot outside 0..SLOTS-1.
"""

from __future__ import annotations

import uuid

from sessiontree.protocol import SLOTS, RejectedInputError

__all__ = [
    "branch_key",
    "check_slot",
    "inbox_key",
    "main_key",
    "memory_key",
    "pair_key",
    "platform_key",
    "quarantine_key",
    "slot_key",
]


def pair_key(first: uuid.UUID, second: uuid.UUID) -> bytes:
    return first.bytes + second.bytes


def inbox_key(session_id: uuid.UUID, seq: int) -> bytes:
    return session_id.bytes + seq.to_bytes(8, "big")


def memory_key(agent_id: str, key: str) -> bytes:
    return f"{agent_id}\x00{key}".encode()


def branch_key(session_id: uuid.UUID, number: int) -> bytes:
    return session_id.bytes + number.to_bytes(4, "big")


def platform_key(session_id: uuid.UUID, platform_id: str) -> bytes:
    return session_id.bytes + platform_id.encode()


def main_key(agent_id: str, key: str) -> bytes:
    return f"{agent_id}\x00{key}".encode()


def quarantine_key(db: str, key: bytes) -> bytes:
    return db.encode() + b"\x00" + key


def check_slot(slot: object) -> int:
    """``slot`` if it is an int in 0..SLOTS-1; ``RejectedInputError`` naming it else."""
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < SLOTS:
        msg = f"slot must be an integer in 0..{SLOTS - 1}, not {slot!r}"
        raise RejectedInputError(msg, field="slot")
    return slot


def slot_key(slot: int) -> bytes:
    """The key of a slot's entry (its epoch in ``slots``, its tombstone in
    ``moved``): big-endian, so slots sort in number order."""
    return check_slot(slot).to_bytes(2, "big")
