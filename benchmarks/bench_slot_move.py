"""Benchmark: moving one slot's records from a big store to another.

    python benchmarks/bench_slot_move.py [--quick] [--records N] [--slot-sessions N] [--dir DIR]

A store holds ``records`` session records (200,000; ``--quick`` 50,000)
spread over 1,024 slots, each a Main with an ended branch under it (its
record, the tree link, its result filed on the Main), and one slot holding
``slot-sessions`` more of them (10,000; ``--quick`` 2,000). That slot is
exported (one read transaction), imported into an empty store (one write
transaction onto absent keys) and released from the source (its entries
deleted, a tombstone written, one transaction).

Figures: ``export_s``, ``import_s``, ``release_s``, ``entries`` (the slot's
entries in every database), ``bytes`` (the export's size) and
``export_us_per_entry``. In the databases keyed by session id a slot's
reads and deletes touch its key range only; ``mains`` (and ``quarantine``)
are read whole, filtered by the Main each entry names, so that part grows
with the store's Mains.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import uuid

from _common import log, real_disk_dir

from sessiontree.protocol import (
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    Timings,
    new_session_id,
)
from sessiontree.store import SessionRecord, Store, WriteBatch

NOW = 1_700_000_000.0
CHUNK = 20_000  # operations per write while filling
SLOTS_USED = 1_024
HOT = 7  # the slot that moves


def tree(batch: WriteBatch, slot: int, n: int) -> None:
    """One Main of ``slot`` with an ended branch under it."""
    main = SessionInfo(
        session_id=new_session_id(slot),
        agent_id="agent",
        parent_id=None,
        kind=SessionKind.MAIN,
        state=SessionState.ACTIVE,
        depth=0,
        created_at=NOW,
        ttl=None,
        deadline=None,
        skill="main",
        key=f"user:{slot}:{n}",
    )
    batch.session(SessionRecord(info=main, updated_at=NOW))
    batch.main("agent", f"user:{slot}:{n}", main.session_id)
    done = SessionInfo(
        session_id=new_session_id(slot),
        agent_id="agent",
        parent_id=main.session_id,
        kind=SessionKind.BRANCH,
        state=SessionState.COMPLETED,
        depth=1,
        created_at=NOW,
        ttl=None,
        deadline=None,
        task="summarise the thread",
        skill="work",
    )
    result = SessionResult(
        session_id=done.session_id,
        status=SessionState.COMPLETED,
        parent_id=main.session_id,
        summary="done",
        timings=Timings(created_at=NOW, ended_at=NOW + 1.0),
    )
    batch.session(SessionRecord(info=done, result=result, updated_at=NOW))
    batch.link(main.session_id, done.session_id).file(main.session_id, result)


def fill(path: str, records: int, slot_sessions: int) -> None:
    with Store(path, sync=False) as store:
        batch = WriteBatch()
        for n in range(records // 2):
            tree(batch, n % SLOTS_USED, n)
            if len(batch.ops) >= CHUNK:
                store.write(batch, timeout=600.0)
                batch = WriteBatch()
        for n in range(slot_sessions // 2):
            tree(batch, HOT, records + n)
            if len(batch.ops) >= CHUNK:
                store.write(batch, timeout=600.0)
                batch = WriteBatch()
        if batch:
            store.write(batch, timeout=600.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50,000 records, 2,000 in the slot")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--slot-sessions", type=int, default=None)
    parser.add_argument("--dir", default=None, help="where the stores go (a real disk)")
    args = parser.parse_args(argv)
    records = args.records or (50_000 if args.quick else 200_000)
    slot_sessions = args.slot_sessions or (2_000 if args.quick else 10_000)
    where = real_disk_dir("slot_move", args.dir)
    if where is None:
        return 1
    base, fstype = where
    try:
        log(f"filling {records} records over {SLOTS_USED} slots, {slot_sessions} more in one")
        fill(f"{base}/src", records, slot_sessions)
        with Store(f"{base}/src") as source, Store(f"{base}/dst") as dest:
            began = time.perf_counter()
            data = source.slots.export(HOT)
            exported = time.perf_counter()
            header = dest.slots.import_(data)
            imported = time.perf_counter()
            moved = source.slots.release(HOT, str(uuid.uuid4()))
            released = time.perf_counter()
        entries = sum(header.counts.values())
        if moved.records != entries:
            raise RuntimeError(f"released {moved.records} entries, exported {entries}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = {
        "bench": "slot_move",
        "records": records,
        "slot_sessions": header.counts.get("sessions", 0),
        "entries": entries,
        "bytes": len(data),
        "export_s": round(exported - began, 4),
        "import_s": round(imported - exported, 4),
        "release_s": round(released - imported, 4),
        "export_us_per_entry": round((exported - began) / max(entries, 1) * 1e6, 2),
        "filesystem": fstype,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
