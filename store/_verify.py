"""``verify_store``: does every record of a store decode, and under the right key?

The file itself is checked when the store opens (``_pages``: the meta
pages, the length, every B-tree page; open it with ``walk=True``, as
``store verify`` does, so the walk runs even for a file a clean close
left); this reads every entry of every
database through ``Store.scan`` (short read transactions, so it runs beside
a live node) and decodes it as its database's record type, the way recovery
and export read them. The quarantine is listed: values recovery already set
aside are known, not new damage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sessiontree.protocol import CorruptRecordError
from sessiontree.store._export_format import RECORD_DBS
from sessiontree.store._records import (
    MetaRecord,
    QuarantineRecord,
    StartsRecord,
    decode_record,
)
from sessiontree.store._store import Store

__all__ = ["Verified", "VerifyProblem", "verify_store"]

_PROBLEMS_KEPT = 100  # problems listed in full; the counts cover them all


@dataclass(frozen=True)
class VerifyProblem:
    """One entry that does not read: its database, its key (hex) and why."""

    db: str
    key: str
    reason: str


@dataclass
class Verified:
    """What ``verify_store`` found: entries and unreadable entries per database, the
    first ``_PROBLEMS_KEPT`` problems, the quarantined values, and databases
    whose entries this code has no record type for (counted, not decoded)."""

    path: str
    entries: dict[str, int] = field(default_factory=dict)
    unreadable: dict[str, int] = field(default_factory=dict)
    problems: list[VerifyProblem] = field(default_factory=list)
    quarantined: list[QuarantineRecord] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Every entry decoded (quarantined values are not counted against it)."""
        return not any(self.unreadable.values())

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (``store verify --json``)."""
        return {
            "path": self.path,
            "clean": self.clean,
            "entries": dict(self.entries),
            "unreadable": {db: n for db, n in self.unreadable.items() if n},
            "problems": [vars(p) for p in self.problems],
            "quarantined": [
                {"db": q.db, "key": q.key.hex(), "reason": q.reason, "at": q.at}
                for q in self.quarantined
            ],
            "unchecked": list(self.unchecked),
        }


def verify_store(store: Store) -> Verified:
    """Read and decode every entry of ``store``. Raises ``StoreError`` when the
    store is closed, ``StoreDamagedError`` when LMDB meets a damaged page; a
    record that does not decode is counted and listed, never raised."""
    found = Verified(store.path)
    for db in store.databases():
        entries = bad = 0
        for key, raw in store.scan(db):
            entries += 1
            reason = _check(db, key, raw, found)
            if reason is not None:
                bad += 1
                if len(found.problems) < _PROBLEMS_KEPT:
                    found.problems.append(VerifyProblem(db, key.hex(), reason))
        found.entries[db] = entries
        found.unreadable[db] = bad
    return found


def _check(db: str, key: bytes, raw: bytes, found: Verified) -> str | None:
    """Why the entry does not read, or None."""
    try:
        if db == "children":
            return None if len(key) == 32 and not raw else "not parent id + child id -> empty"
        if db == "mains":
            ok = b"\x00" in key and len(raw) == 16
            return None if ok else "not agent NUL key -> session id"
        if db == "platform_ids":
            ok = len(key) > 16 and len(raw) == 16
            return None if ok else "not session id + platform id -> message id"
        if db == "meta":
            decode_record(StartsRecord if key == b"starts" else MetaRecord, raw, db=db, key=key)
            return None
        spec = RECORD_DBS.get(db)
        if spec is None:
            if db not in found.unchecked:
                found.unchecked.append(db)
            return None
        record = decode_record(spec.kind, raw, db=db, key=key)
        if spec.key_of(spec.to_line(key, record, None)) != key:
            return f"its {spec.kind.__name__} belongs under another key"
        if isinstance(record, QuarantineRecord):
            found.quarantined.append(record)
    except CorruptRecordError as exc:
        return str(exc)
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
