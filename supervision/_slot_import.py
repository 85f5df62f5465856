"""Recovery of one imported slot on a running node (``node.slots.import_``).

The slot's records were just written into the store (``store.slots.import_``);
this runs recovery (``_recovery``) over them alone, as a start would over
the whole store: Mains dormant, suspended Branches back (those a freeze or
a shutdown parked run again), results owed delivered once, anything else
still live ended ``node_restarted``, calls left in flight counted at their
worst case. What recovery reads comes from the import's entries (the store
holds the same bytes now), so the rest of the store is never scanned; the
node's start history is not touched (an import is not a start).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any, cast

from sessiontree.store import SlotExport, Store, UsageRecord, WriteBatch
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._recovery import Recovered, _Recovery

__all__ = ["recover_slot"]


class _SlotView:
    """What recovery reads of a store, limited to one import's entries; its
    writes go to the store."""

    def __init__(self, store: Store, export: SlotExport) -> None:
        self._store = store
        self._entries: dict[str, list[tuple[bytes, bytes]]] = {}
        for db, key, value in export.entries:  # in key order within each db
            self._entries.setdefault(db, []).append((key, value))
        self.path = store.path

    def scan(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        entries = self._entries.get(db, [])
        at = bisect.bisect_left(entries, (prefix, b""))
        for key, value in entries[at:]:
            if not key.startswith(prefix):
                return
            yield key, value

    def live_records(self) -> Iterator[tuple[bytes, bytes | None]]:
        sessions = dict(self._entries.get("sessions", []))
        for key, _ in self._entries.get("live", []):
            yield key, sessions.get(key)

    def count(self, db: str) -> int:
        return len(self._entries.get(db, []))

    def usage(self, session_id: Any) -> UsageRecord | None:
        return self._store.usage(session_id)

    def write(self, batch: WriteBatch, timeout: float | None = 60.0) -> None:
        self._store.write(batch, timeout)

    @property
    def quarantined(self) -> int:
        return self._store.quarantined

    @quarantined.setter
    def quarantined(self, value: int) -> None:
        self._store.quarantined = value


class _SlotRecovery(_Recovery):
    def restart_intensity(self) -> None:
        """An import is not a start: the node's starts stay as they are."""


def recover_slot(
    store: Store, export: SlotExport, agents: dict[str, Agent], now: float, config: NodeConfig
) -> Recovered:
    """Recovery's plan for the slot ``export`` just imported into ``store``,
    its endings written. Raises ``StoreError`` if those writes fail; an
    unreadable record is quarantined, never fatal."""
    view = cast("Store", _SlotView(store, export))
    return _SlotRecovery(view, agents, now, config).run()
