"""The store's meta record: its node id, when it was made, its incarnation.

A writer's open bumps the incarnation (``open_meta``) with a precondition on
the record as read, so of two opens racing past a removed lock only one
wins; the writer then commits only while the incarnation is its own
(fencing, ``_writer``). A meta record that does not decode is quarantined
and written again from the copy the committed marker keeps.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

import msgspec

from sessiontree.protocol import CorruptRecordError, StoreError, StoreFencedError
from sessiontree.store._batch import WriteBatch
from sessiontree.store._env import mark_committed, read_marker
from sessiontree.store._reads import Reads
from sessiontree.store._records import MetaRecord, QuarantineRecord

__all__ = ["open_meta", "read_meta"]

log = logging.getLogger("sessiontree.store")


def read_meta(reads: Reads) -> MetaRecord | None:
    """The meta record, None before the first open wrote it;
    ``CorruptRecordError`` when it does not decode."""
    return reads.get(MetaRecord, "meta", b"meta")


def open_meta(
    reads: Reads, write: Callable[[WriteBatch], None], path: str
) -> tuple[MetaRecord, int]:
    """The meta record with its incarnation bumped, written (created for a new
    store, or written again from the marker's copy when it does not decode),
    and how many records that quarantined (0 or 1). ``StoreFencedError``
    when another process bumped it at the same moment; ``StoreError`` when
    the write fails."""
    rewritten = 0
    try:
        meta = read_meta(reads)
    except CorruptRecordError as exc:
        meta, rewritten = _replace_meta(reads, write, path, exc), 1
    if meta is None:
        meta = MetaRecord(node_id=str(uuid.uuid4()), created_at=time.time())
    before = reads.get_raw("meta", b"meta")
    opened = msgspec.structs.replace(meta, incarnation=meta.incarnation + 1)
    batch = WriteBatch().expect("meta", b"meta", before)
    batch._put("meta", b"meta", opened)
    try:
        write(batch)
    except StoreError as exc:
        if reads.get_raw("meta", b"meta") == before:
            raise
        msg = f"store {path} was opened by another process at the same moment"
        raise StoreFencedError(msg, path=path) from exc
    # From here on an empty or missing data.mdb is damage, not a fresh store.
    mark_committed(path, msgspec.json.encode(opened).decode() + "\n")
    return opened, rewritten


def _replace_meta(
    reads: Reads, write: Callable[[WriteBatch], None], path: str, error: CorruptRecordError
) -> MetaRecord:
    """The meta record does not decode: quarantine it and write it again from
    the copy in the marker (the same node id), or afresh without one."""
    raw = reads.get_raw("meta", b"meta") or b""
    try:
        meta = msgspec.json.decode(read_marker(path), type=MetaRecord)
    except (OSError, ValueError, msgspec.DecodeError):
        meta = MetaRecord(node_id=str(uuid.uuid4()), created_at=time.time())
    log.error("quarantined meta record: %s; written again for node %s", error, meta.node_id)
    set_aside = QuarantineRecord(db="meta", key=b"meta", raw=raw, reason=str(error), at=time.time())
    batch = WriteBatch().quarantine(set_aside)
    batch._put("meta", b"meta", meta)
    write(batch)
    return meta
