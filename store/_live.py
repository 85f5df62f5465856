"""The index of live sessions (the ``live`` database): built once for a store
written without it, or after a build that does not keep it ran on the store.

Every session write keeps the index in its own transaction (``WriteBatch``),
and every node start stamps it with the start's time (``WriteBatch.starts``):
a later start than the stamp is a start by a build that wrote records but
not the index, so it is built again.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from typing import Protocol

from sessiontree.protocol import CorruptRecordError
from sessiontree.store._batch import WriteBatch
from sessiontree.store._env import LIVE_INDEXED
from sessiontree.store._records import SessionRecord, StartsRecord, decode_record

__all__ = ["index_live", "stamp_of"]

log = logging.getLogger("sessiontree.store")


class Store(Protocol):
    """What the index is built with (``sessiontree.store.Store``)."""

    path: str

    def scan(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]: ...

    def starts(self) -> StartsRecord | None: ...

    def write(self, batch: WriteBatch, timeout: float | None = 60.0) -> None: ...


def index_live(store: Store) -> None:
    """Build ``store``'s index of live sessions unless it is kept and current. A
    record that does not decode is indexed: recovery reads it and quarantines
    it. Raises what ``Store.write`` raises."""
    stamp = stamp_of(store)
    starts = _starts(store)
    if stamp is not None and not _started_since(starts, stamp):
        return
    batch = WriteBatch()
    batch.raw_delete_all("live")  # built whole
    records = live = 0
    for key, raw in store.scan("sessions"):
        records += 1
        try:
            alive = not decode_record(
                SessionRecord, raw, db="sessions", key=key
            ).info.state.is_terminal
        except CorruptRecordError:
            alive = True
        if alive:
            batch.raw("live", key, b"")
            live += 1
    started_at = starts.started_at if starts is not None else 0.0
    batch.raw("live", LIVE_INDEXED, struct.pack("<d", started_at))
    store.write(batch)
    if records:
        log.info(
            "store %s: indexed its %d live sessions of %d records, once (start-up "
            "reads only those from now on)",
            store.path,
            live,
            records,
        )


def stamp_of(store: Store) -> bytes | None:
    """The index's stamp (None: the index was never built in this store)."""
    return next((v for k, v in store.scan("live", LIVE_INDEXED) if k == LIVE_INDEXED), None)


def _starts(store: Store) -> StartsRecord | None:
    try:
        return store.starts()
    except CorruptRecordError:  # recovery quarantines it
        return None


def _started_since(starts: StartsRecord | None, stamp: bytes) -> bool:
    """Whether a node started after the index was last stamped: a build that
    does not keep it ran since, and it may be stale."""
    stamped = struct.unpack("<d", stamp)[0] if len(stamp) == 8 else 0.0
    return starts is not None and starts.started_at > stamped
