"""Retention: prune terminal sessions that ended long enough ago.

Off unless called: the node calls ``prune`` on its configured schedule (and
only when retention is configured), exporting first when an export path is
configured.
"""

from __future__ import annotations

import math
import os
from typing import IO

from sessiontree.protocol import CorruptRecordError
from sessiontree.store._batch import WriteBatch
from sessiontree.store._export import export_jsonl
from sessiontree.store._records import SessionRecord
from sessiontree.store._store import Store

__all__ = ["ended_at", "prune"]

PRUNE_BATCH = 256  # sessions deleted per transaction


def ended_at(record: SessionRecord) -> float:
    """When a session ended: its result's ``timings.ended_at``, else the record's
    ``updated_at``, else (neither known, ``updated_at`` still 0) its ``created_at``."""
    result = record.result
    if result is not None and result.timings is not None and result.timings.ended_at is not None:
        return result.timings.ended_at
    if record.updated_at > 0:
        return record.updated_at
    return record.info.created_at


def prune(
    store: Store,
    older_than: float,
    now: float,
    *,
    export_to: str | os.PathLike[str] | IO[str] | IO[bytes] | None = None,
    batch_size: int = PRUNE_BATCH,
) -> int:
    """Delete terminal sessions that ended before ``now - older_than``; return how many.

    For each: its record, its links to its children and its link under its
    parent, the results filed on it (``received``), its inbox, its
    conversation (messages, branches, platform ids), and its ``mains`` entry
    when that still points at it. Kept: every non-terminal session, every
    outbox entry (a result still owed to a parent — recovery delivers it
    without the child's record), the results it delivered that are filed on
    its parent, and shared memory. Children younger than the cutoff stay,
    with a ``parent_id`` that names a pruned session.

    With ``export_to`` the whole store is exported there first (see
    ``export_jsonl``); if that fails nothing is pruned. Deletes commit in
    transactions of at most ``batch_size`` sessions, so a failure part way
    leaves whole sessions pruned or kept, never half of one.

    The ``mains`` check is read before the delete commits: run ``prune``
    where no Main is registered concurrently (from the Cortex, or on a store
    no node runs on), or a Main registered for the same key in between could
    lose its entry. Unreadable session records are skipped (recovery
    quarantines them).

    Raises ``ValueError`` for a negative or non-finite ``older_than`` or a
    non-finite ``now``; ``StoreError`` when the store is read-only, closed or
    cannot commit (what earlier transactions deleted stays deleted);
    ``OSError`` when the export cannot be written.
    """
    if not math.isfinite(older_than) or older_than < 0:
        msg = f"older_than must be a finite number of seconds >= 0, not {older_than!r}"
        raise ValueError(msg)
    if not math.isfinite(now):
        msg = f"now must be a finite epoch time, not {now!r}"
        raise ValueError(msg)
    if batch_size < 1:
        msg = f"batch_size must be at least 1, not {batch_size!r}"
        raise ValueError(msg)
    if export_to is not None:
        export_jsonl(store, export_to)
    cutoff = now - older_than
    pruned = 0
    batch, in_batch = WriteBatch(), 0
    for record in store.sessions():
        if isinstance(record, CorruptRecordError):
            continue
        info = record.info
        if not info.state.is_terminal or ended_at(record) >= cutoff:
            continue
        _forget(store, batch, record)
        in_batch += 1
        if in_batch >= batch_size:
            store.write(batch)
            pruned += in_batch
            batch, in_batch = WriteBatch(), 0
    if in_batch:
        store.write(batch)
        pruned += in_batch
    return pruned


def _forget(store: Store, batch: WriteBatch, record: SessionRecord) -> None:
    info = record.info
    batch.forget_session(info.session_id)
    if info.parent_id is not None:
        batch.unlink(info.parent_id, info.session_id)
    if info.key is not None:  # checked at commit: a newer Main may hold the key by then
        batch.forget_main(info.agent_id, info.key, info.session_id)
