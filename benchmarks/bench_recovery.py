"""Benchmark: how long a node takes to come back on a store of many ended sessions.

    python benchmarks/bench_recovery.py [--quick] [--records N] [--live-share F] [--dir DIR]

A store is filled as a node's years of work leave it: ``records`` session
records (1,000,000; ``--quick`` 100,000), of which a ``live`` share (10 %)
are Mains still open, each under its session key (they come back dormant),
the rest ended branches with their results filed on a Main. The store is
closed, then a ``Node`` is started on it (cold: a new process would read the
file from the page cache the same way) and asked one question.

Figures: ``start_s`` (the ``Node`` constructor: opening the store,
recovery, the Cortex up), ``first_answer_s`` (from the start until
``node.get`` of one Main answered), ``start_s_per_live_session_us``
(``start_s`` per live session, in microseconds). A start that reads only
what is live stays flat as ended sessions pile up; one that reads every
record grows with them.

``unclean_start_s``: the same start after a run that did not close the
store cleanly (a kill -9 or a power loss leaves no record of a clean close,
see ``store/_clean.py``), so the open walks every page of the file first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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
)
from sessiontree.store import SessionRecord, Store, WriteBatch
from sessiontree.supervision import Agent, Node, NodeConfig

NOW = 1_700_000_000.0
CHUNK = 20_000  # records per write while filling


def info(
    kind: SessionKind, parent: uuid.UUID | None, state: SessionState, **fields: str
) -> SessionInfo:
    return SessionInfo(
        session_id=uuid.uuid4(),
        agent_id="agent",
        parent_id=parent,
        kind=kind,
        state=state,
        depth=0 if parent is None else 1,
        created_at=NOW,
        ttl=None,
        deadline=None,
        **fields,
    )


def fill(path: str, records: int, live_share: float) -> list[uuid.UUID]:
    """Write the store; return the Mains' ids."""
    live = max(1, int(records * live_share))
    mains: list[uuid.UUID] = []
    with Store(path, sync=False) as store:
        batch = WriteBatch()
        for n in range(records):
            if n < live:
                key = f"user:{n}"
                main = info(SessionKind.MAIN, None, SessionState.ACTIVE, skill="main", key=key)
                mains.append(main.session_id)
                batch.session(SessionRecord(info=main, updated_at=NOW))
                batch.main("agent", key, main.session_id)
            else:
                parent = mains[n % live]
                done = info(
                    SessionKind.BRANCH,
                    parent,
                    SessionState.COMPLETED,
                    task="summarise the thread",
                    skill="work",
                )
                result = SessionResult(
                    session_id=done.session_id,
                    status=SessionState.COMPLETED,
                    parent_id=parent,
                    summary="done",
                    timings=Timings(created_at=NOW, ended_at=NOW + 1.0),
                )
                batch.session(SessionRecord(info=done, result=result, updated_at=NOW))
                batch.link(parent, done.session_id).file(parent, result)
            if len(batch.ops) >= CHUNK:
                store.write(batch, timeout=600.0)
                batch = WriteBatch()
        if batch:
            store.write(batch, timeout=600.0)
    return mains


def start(path: str, main: uuid.UUID) -> tuple[float, float, int]:
    """Start a node on ``path``; (start s, first answer s, live sessions it saw)."""

    def main_skill(session: object) -> None:
        return None

    def work(session: object) -> str:
        return "ok"

    agent = Agent("agent", {"main": main_skill, "work": work}, main_skill="main")
    began = time.perf_counter()
    node = Node([agent], NodeConfig(), store=path)
    started = time.perf_counter()
    try:
        info = node.get(main)
        answered = time.perf_counter()
        if info.session_id != main:
            raise RuntimeError(f"asked for {main}, got {info.session_id}")
        return started - began, answered - began, int(node.recovery.figures["mains"])
    finally:
        node.shutdown(grace=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 records")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--live-share", type=float, default=0.10)
    parser.add_argument("--dir", default=None, help="where the store goes (a real disk)")
    args = parser.parse_args(argv)
    records = args.records or (100_000 if args.quick else 1_000_000)
    where = real_disk_dir("recovery", args.dir)
    if where is None:
        return 1
    base, fstype = where
    path = f"{base}/store"
    try:
        log(f"filling {records} records ({args.live_share:.0%} live) on {fstype}")
        filled = time.perf_counter()
        mains = fill(path, records, args.live_share)
        log(f"  filled in {time.perf_counter() - filled:.1f} s; starting a node on it")
        first_start_s, _, _ = start(path, mains[len(mains) // 2])
        # the second start is the steady one (a store from before the index is
        # indexed once, at the first)
        start_s, first_s, live = start(path, mains[len(mains) // 3])
        with contextlib.suppress(FileNotFoundError):  # what a killed run leaves
            os.unlink(os.path.join(path, "sessiontree.closed"))
        unclean_start_s, _, _ = start(path, mains[len(mains) // 4])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = {
        "bench": "recovery",
        "records": records,
        "live": live,
        "start_s": round(start_s, 3),
        "first_answer_s": round(first_s, 3),
        "start_s_per_live_session_us": round(start_s / max(live, 1) * 1e6, 2),
        "first_start_s": round(first_start_s, 3),
        "unclean_start_s": round(unclean_start_s, 3),
        "filesystem": fstype,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
