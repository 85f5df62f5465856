"""Reading a conversation tree: its bookkeeping with its branches, and walks.

These are the two conversation reads that need more than one entry in one
read transaction (``Store`` delegates to them; the single-entry reads stay
on ``Store``). Both run on the caller's thread and raise
``CorruptRecordError`` naming the entry when a record does not decode (or a
conversation names a current branch it does not have), ``StoreError`` when
the store is not usable.
"""

from __future__ import annotations

import uuid

import msgspec

from sessiontree.protocol import ConversationState, CorruptRecordError, Message
from sessiontree.store._keys import pair_key
from sessiontree.store._reads import Reads
from sessiontree.store._records import (
    BranchRecord,
    ConversationRecord,
    MessageRecord,
    decode_record,
)

__all__ = ["conversation_read", "walk"]


def conversation_read(
    reads: Reads, session_id: uuid.UUID
) -> tuple[ConversationState | None, bytes | None]:
    """A session's conversation bookkeeping with its branches (in number order)
    and the stored bytes of its bookkeeping record, read in one transaction
    (the bytes are what the next write may ``expect``); (None, None) when it
    has none."""
    header_db, branch_db = reads.db("conversations"), reads.db("branches")
    if header_db is None or branch_db is None:
        return None, None
    key = session_id.bytes
    with reads.transaction() as txn:
        raw = txn.get(key, db=header_db)
        if raw is None:
            return None, None
        raws = []
        with txn.cursor(db=branch_db) as cursor:
            found = cursor.set_range(key)
            while found and bytes(cursor.key()).startswith(key):
                raws.append((bytes(cursor.key()), bytes(cursor.value())))
                found = cursor.next()
    header = decode_record(ConversationRecord, bytes(raw), db="conversations", key=key)
    branches = [
        decode_record(BranchRecord, value, db="branches", key=k).branch for k, value in raws
    ]
    ids = {branch.id for branch in branches}
    if header.state.current not in ids or len(ids) < len(branches):
        # every operation starts from the current branch: a record that decodes
        # but names none (or two branches of one id) is as damaged as one that does not
        msg = (
            f"conversations record {key.hex()} names the current branch "
            f"{header.state.current!r}, and its branches are {sorted(b.id for b in branches)}"
        )
        raise CorruptRecordError(msg, db="conversations", key=key)
    return msgspec.structs.replace(header.state, branches=branches), bytes(raw)


def walk(
    reads: Reads,
    session_id: uuid.UUID,
    start: uuid.UUID | None,
    limit: int,
    branch_id: str | None = None,
) -> list[Message]:
    """From message ``start`` towards the root through parent ids, newest
    first, at most ``limit``, in one short read transaction (with
    ``branch_id``: stop at the first message not on that branch). A message
    that is missing ends the walk; one that does not decode raises
    ``CorruptRecordError``."""
    out: list[Message] = []
    handle = reads.db("messages")
    if handle is None or start is None or limit <= 0:
        return out
    current: uuid.UUID | None = start
    with reads.transaction() as txn:
        while current is not None and len(out) < limit:
            key = pair_key(session_id, current)
            raw = txn.get(key, db=handle)
            if raw is None:
                break
            message = decode_record(MessageRecord, bytes(raw), db="messages", key=key).message
            if branch_id is not None and message.branch_id != branch_id:
                break
            out.append(message)
            current = message.parent_id
    return out
