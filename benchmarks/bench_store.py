"""Benchmark: the LMDB store — durable snapshots per second, and recovery.

    python benchmarks/bench_store.py [--quick] [--dir DIR]

What it measures (the keys of the last stdout line, one JSON object):

* Durable snapshot writes per second: ``producers`` (64) producers each
  write a ~1 KiB ``SessionRecord`` (a Main's snapshot: identity, state and a
  small context, re-encoded for every write) and wait for its
  acknowledgment — the batch durably committed — before writing the next.
  Two kinds of producers: 64 threads calling ``Store.write`` (blocks), and
  64 coroutines on one event loop awaiting ``Store.awrite``. Each kind runs
  against a ``Store(group_commit=False)`` (one transaction and one synced
  commit per write: the naive baseline) and a ``Store()`` (group commit),
  side by side in one run, in alternating order over the repetitions, each
  on a fresh store. Rates count the acknowledgments in a timed window after
  a warm-up; commits are the writer's count over the same window.
  ``sync`` is asserted on every store (LMDB's ``sync`` and ``metasync``
  flags: every commit fsyncs before it returns) and the JSON says ``true``
  only then.
* Headline ``group_commit_snapshots_per_s``: the coroutine producers (the
  runtime's scaling path for skills is ``async``; Main snapshots come from
  one supervisor thread, not from 64 blocked threads). The thread figure
  is reported beside it (``..._threads``); ``naive_commits_per_s`` and
  ``group_commit_ratio`` use the same producer kind as the headline; the
  other kind's figures carry their own suffix.
* ``recovery_s``: a store of ``recovery_sessions`` (100,000) session records
  written directly with ``WriteBatch`` — 20,000 active Mains (small context,
  ``mains`` key set), 71,700 terminal branches and workers (results filed on
  their parents, 200 still owed in the outbox), 8,000 branches and workers
  in flight at the "crash", 300 suspended branches — and what recovery
  classifies: the 1,000 busy Mains hold 2 acknowledged messages each, the
  first cut off by the crash (100 for the third time: held back as wedged,
  900 replayed as attempt 2), and 200 of the suspended branches were parked
  by a shutdown (160 run again, 20 cut off at three reruns end wedged, 20 past
  their TTL end expired) — closed, then timed from ``Store(path)`` through
  ``Node([agent], store=store)`` (recovery runs in the constructor: Mains
  stay dormant, in-flight sessions fail with ``node_restarted``, suspended
  branches are loaded, each replay classified) until
  ``node.wait_idle()`` returns (Mains woken by the results owed to them and
  the messages replayed have run their cycles and written their snapshots;
  parked branches have run again). The page cache is warm (the
  store was just written). If the runtime has no store support yet, the
  script says so and reports ``recovery_s: null``.

* ``backup_ratio_to_mdb_copy``: a store of ``BACKUP_SESSIONS`` (100,000)
  1 KiB snapshots (about 200 MiB) is copied by the ``mdb_copy`` binary (a
  subprocess, as an operator runs it) and by ``Store.backup`` on a
  read-only ``Store`` (the library call ``sessiontree store backup`` makes;
  it also fsyncs the copy and renames it into place), alternating, each
  into a fresh directory on the same disk; the ratio is mdb_copy's median
  time over ours (≥ 1: ours is as fast). Both copy without compaction. The
  page cache is warm (the store was just written); the read-only open
  (which walks every page of the file first) is reported apart as
  ``backup_open_s``. Null with ``backup_error`` when ``mdb_copy`` is not
  installed (Debian: ``lmdb-utils``).

Stores live in a temporary directory on the real disk (``/tmp`` unless
``--dir``; refused on tmpfs), removed afterwards. ``fdatasync_ms`` is the
raw disk's median pwrite+fdatasync latency there, for context: the naive
rate is bounded by it.

``--quick`` keeps the sizes (64 producers, 1 KiB records, 100,000
sessions, the 100,000-snapshot backup store) and cuts the repetitions: one
window of 1.5 s per mode (full: three of 4 s), five copies each way for the
backup (full: nine).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from _common import (
    SYNC_CHECKS,
    async_window,
    fdatasync_ms,
    log,
    on_fresh_store,
    open_synced,
    real_disk_dir,
    thread_window,
)

from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.store import (
    ContextEntry,
    ContextRecord,
    CycleRecord,
    InboxRecord,
    SessionRecord,
    Store,
    WriteBatch,
    encode_record,
)

PRODUCERS = 64
RECORD_BYTES = 1024  # target size of one encoded snapshot
AGENT = "bench"

# The recovery store's mix (sums to RECOVERY_SESSIONS).
RECOVERY_MAINS = 20_000
BUSY_MAINS = 1_000  # each with 2 in-flight branches of 3 in-flight workers: 8,000 in flight
INFLIGHT_BRANCHES, INFLIGHT_WORKERS = 2, 3
SUSPENDED = 300
# What recovery classifies (no extra sessions): each busy Main has INBOX acknowledged
# messages, the first cut off by the crash (WEDGED_MAINS of them for the third time:
# held back as wedged); of the suspended branches, PARKED a shutdown parked (they run
# again; PARKED_WEDGED of them were cut off at three reruns, PARKED_STALE are past
# their TTL) and the rest were suspended by a caller.
INBOX, WEDGED_MAINS = 2, 100
PARKED, PARKED_WEDGED, PARKED_STALE = 200, 20, 20
TERMINAL_BRANCHES, WORKERS_PER_TERMINAL = 14_340, 4  # 14,340 x 5 = 71,700 terminal
OWED = 200  # terminal branches whose result is still in the outbox
RECOVERY_SESSIONS = (
    RECOVERY_MAINS
    + BUSY_MAINS * INFLIGHT_BRANCHES * (1 + INFLIGHT_WORKERS)
    + SUSPENDED
    + TERMINAL_BRANCHES * (1 + WORKERS_PER_TERMINAL)
)
assert RECOVERY_SESSIONS == 100_000
BACKUP_SESSIONS = 100_000  # 1 KiB snapshots in the store the backup copies


# -- snapshots ------------------------------------------------------------------------


def snapshot_record(target: int = RECORD_BYTES) -> SessionRecord:
    """A Main's snapshot whose msgpack encoding is ``target`` bytes or just over."""
    info = SessionInfo(
        session_id=uuid.uuid4(),
        agent_id=AGENT,
        parent_id=None,
        kind=SessionKind.MAIN,
        state=SessionState.ACTIVE,
        depth=0,
        created_at=time.time(),
        ttl=None,
        deadline=None,
        key=f"internal:main:{uuid.uuid4().hex}",
        skill="main",
        model_tier="large",
    )

    def make(n: int) -> SessionRecord:
        context = ContextRecord(
            system_prompt="You are the bench agent's Main.",
            messages=[
                ContextEntry(role="user", content="u" * n),
                ContextEntry(role="assistant", content="a" * (n // 2)),
                ContextEntry(role="tool", content="t" * (n - n // 2), name="search"),
            ],
        )
        return SessionRecord(info=info, context=context, updated_at=time.time())

    n = 0
    while len(encode_record(make(n))) < target:
        n += 1
    return make(n)


def for_producer(template: SessionRecord) -> SessionRecord:
    """The template with a session id of its own (same size)."""
    info = msgspec.structs.replace(template.info, session_id=uuid.uuid4())
    return msgspec.structs.replace(template, info=info)


def run_threads(
    store: Store, template: SessionRecord, warmup: float, window: float
) -> dict[str, Any]:
    """``PRODUCERS`` threads, each: write its snapshot, wait for the ack, again."""
    replace, now = msgspec.structs.replace, time.time

    def step_for(record: SessionRecord) -> Callable[[], None]:
        return lambda: store.write(WriteBatch().session(replace(record, updated_at=now())))

    steps = [step_for(for_producer(template)) for _ in range(PRODUCERS)]
    return thread_window(store, steps, warmup, window, "snapshot")


def run_async(
    store: Store, template: SessionRecord, warmup: float, window: float
) -> dict[str, Any]:
    """``PRODUCERS`` coroutines on one loop, each: awrite its snapshot, again."""
    replace, now = msgspec.structs.replace, time.time

    def step_for(record: SessionRecord) -> Callable[[], Awaitable[None]]:
        return lambda: store.awrite(WriteBatch().session(replace(record, updated_at=now())))

    steps = [step_for(for_producer(template)) for _ in range(PRODUCERS)]
    return async_window(store, steps, warmup, window, "snapshot")


RUNNERS: dict[str, Callable[[Store, SessionRecord, float, float], dict[str, Any]]] = {
    "threads": run_threads,
    "async": run_async,
}


def throughput(base: str, reps: int, warmup: float, window: float) -> dict[str, Any]:
    """Every (producer kind, naive | group) mode once per repetition, alternating
    the order, each on a fresh synced store."""
    template = snapshot_record()
    modes = [(kind, group) for kind in RUNNERS for group in (False, True)]
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {mode: [] for mode in modes}
    for rep in range(reps):
        order = modes if rep % 2 == 0 else modes[::-1]
        for kind, group in order:
            figures = on_fresh_store(
                base,
                f"{kind}-{'group' if group else 'naive'}-",
                functools.partial(RUNNERS[kind], template=template, warmup=warmup, window=window),
                group_commit=group,
            )
            runs[(kind, group)].append(figures)
            per_commit = figures["snapshots_per_commit"] or 0.0
            log(
                f"  rep {rep + 1}/{reps} {kind:7s} {'group' if group else 'naive'}: "
                f"{figures['snapshots_per_s']:9.0f} snapshots/s, "
                f"{figures['commits_per_s']:7.0f} commits/s, "
                f"{per_commit:5.1f} per commit"
            )
    return {"record_bytes": len(encode_record(template)), "runs": runs}


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repetition with the median rate (the lower middle of an even count)."""
    ordered = sorted(runs, key=lambda r: r["snapshots_per_s"])
    return ordered[(len(ordered) - 1) // 2]


# -- recovery ------------------------------------------------------------------------------


def _info(
    kind: SessionKind,
    state: SessionState,
    depth: int,
    parent: uuid.UUID | None,
    t: float,
    **kw: Any,
) -> SessionInfo:
    return SessionInfo(
        session_id=uuid.uuid4(),
        agent_id=AGENT,
        parent_id=parent,
        kind=kind,
        state=state,
        depth=depth,
        created_at=t,
        **{"ttl": None, "deadline": None, **kw},
    )


def build_recovery_store(path: str) -> dict[str, int]:
    """Write the 100,000-session store (see the module docstring) and close it."""
    t = time.time() - 3600.0
    small = ContextRecord(
        system_prompt="You are the bench agent's Main.",
        messages=[
            ContextEntry(role="user", content="summarise the open tickets"),
            ContextEntry(role="assistant", content="three branches are on it"),
        ],
    )
    counts: dict[str, int] = dict.fromkeys(("mains", "inflight", "suspended", "terminal"), 0)
    replays = dict.fromkeys(("inbox", "cut_off", "parked"), 0)
    pending: list[WriteBatch] = []

    with open_synced(path) as store:
        batch = WriteBatch()

        def flush(force: bool = False) -> WriteBatch:
            nonlocal batch
            if force or len(batch.ops) >= 8_000:
                pending.append(batch)
                batch = WriteBatch()
            if len(pending) >= 8 or (force and pending):
                for future in [store.submit(b) for b in pending]:
                    future.result(120.0)
                pending.clear()
            return batch

        def child(
            parent: SessionInfo, kind: SessionKind, state: SessionState, **kw: Any
        ) -> SessionInfo:
            info = _info(kind, state, parent.depth + 1, parent.session_id, t, **kw)
            batch.link(parent.session_id, info.session_id)
            return info

        def terminal(parent: SessionInfo, kind: SessionKind, n: int, *, owed: bool) -> SessionInfo:
            failed = n % 10 == 0
            state = SessionState.FAILED if failed else SessionState.COMPLETED
            info = child(parent, kind, state, task=f"sub-task {n}", skill="work")
            result = SessionResult(
                session_id=info.session_id,
                status=state,
                parent_id=parent.session_id,
                kind=kind,
                summary="" if failed else f"found what sub-task {n} asked for",
                error=ErrorInfo(code=ErrorCode.CRASHED, message="the skill raised")
                if failed
                else None,
            )
            batch.session(SessionRecord(info=info, result=result, updated_at=t + 60.0))
            if owed:
                batch.owe(parent.session_id, result)
            else:
                batch.file(parent.session_id, result)
            counts["terminal"] += 1
            return info

        mains = []
        for i in range(RECOVERY_MAINS):
            key = f"internal:main:{i}"
            info = _info(SessionKind.MAIN, SessionState.ACTIVE, 0, None, t, key=key, skill="main")
            batch.session(SessionRecord(info=info, context=small, updated_at=t))
            batch.main(AGENT, key, info.session_id)
            mains.append(info)
            counts["mains"] += 1
            flush()
        for i in range(BUSY_MAINS):  # in flight at the crash
            main_id = mains[i].session_id
            for seq in range(INBOX):
                batch.inbox(
                    InboxRecord(session_id=main_id, seq=seq, message=f"m{seq}", received_at=t + 1.0)
                )
                replays["inbox"] += 1
            attempt = 3 if i < WEDGED_MAINS else 1
            batch.cycle(CycleRecord(session_id=main_id, seq=0, attempt=attempt, started_at=t))
            replays["cut_off"] += 1
            for _ in range(INFLIGHT_BRANCHES):
                branch = child(mains[i], SessionKind.BRANCH, SessionState.ACTIVE, skill="work")
                batch.session(SessionRecord(info=branch, context=small, updated_at=t))
                for _ in range(INFLIGHT_WORKERS):
                    worker = child(branch, SessionKind.WORKER, SessionState.ACTIVE, skill="work")
                    batch.session(SessionRecord(info=worker, updated_at=t))
                counts["inflight"] += 1 + INFLIGHT_WORKERS
            flush()
        for i in range(SUSPENDED):
            parent = mains[BUSY_MAINS + i]
            stale = PARKED - PARKED_STALE <= i < PARKED
            timing = {"ttl": 60.0, "deadline": t + 60.0} if stale else {}
            branch = child(
                parent, SessionKind.BRANCH, SessionState.SUSPENDED, skill="work", **timing
            )
            parked = i < PARKED
            attempts = 3 if i < PARKED_WEDGED else 0
            batch.session(
                SessionRecord(
                    info=branch, context=small, updated_at=t, resume=parked, attempts=attempts
                )
            )
            replays["parked"] += parked
            counts["suspended"] += 1
            flush()
        for n in range(TERMINAL_BRANCHES):
            parent = mains[(BUSY_MAINS + SUSPENDED + n) % RECOVERY_MAINS]
            branch = terminal(parent, SessionKind.BRANCH, n, owed=n < OWED)
            for w in range(WORKERS_PER_TERMINAL):
                terminal(branch, SessionKind.WORKER, n * WORKERS_PER_TERMINAL + w, owed=False)
            flush()
        flush(force=True)
        stored = store.count("sessions")
    if stored != RECOVERY_SESSIONS or sum(counts.values()) != RECOVERY_SESSIONS:
        msg = f"built {stored} sessions ({counts}), wanted {RECOVERY_SESSIONS}"
        raise AssertionError(msg)
    return {**counts, **replays}


def recovery(base: str) -> dict[str, Any]:
    """Build the store, then time open + recovery + idle. ``recovery_s`` None
    (with ``recovery_error``) when the runtime cannot recover from a store."""
    try:
        from sessiontree.supervision import Agent, Node, NodeConfig  # noqa: PLC0415
    except ImportError as exc:
        log(f"recovery: the runtime cannot be imported ({exc}); recovery_s is null")
        return {"recovery_s": None, "recovery_error": repr(exc)}

    async def main_skill(session: Any) -> None:
        return None  # one cycle per message or child result: nothing to do

    async def work(session: Any) -> str:
        return "done"

    agent = Agent(AGENT, {"main": main_skill, "work": work}, main_skill="main")
    path = tempfile.mkdtemp(prefix="recovery-", dir=base)
    try:
        log(f"recovery: building a store of {RECOVERY_SESSIONS:,} sessions")
        t_build = time.perf_counter()
        counts = build_recovery_store(path)
        build_s = time.perf_counter() - t_build
        size = sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        log(f"recovery: built in {build_s:.1f} s ({size / 2**20:.0f} MiB), {counts}")
        gc.collect()
        node = None
        store = None
        try:
            t0 = time.perf_counter()
            store = Store(path)
            t_open = time.perf_counter()
            try:
                node = Node([agent], NodeConfig(), store=store)
            except TypeError as exc:  # a runtime without store support
                log(f"recovery: Node does not take a store yet ({exc}); recovery_s is null")
                return {"recovery_s": None, "recovery_error": repr(exc)}
            t_node = time.perf_counter()
            idle = node.wait_idle(timeout=300.0)
            t1 = time.perf_counter()
            figures = dict(node.recovery.figures)
        finally:
            if node is not None:
                t_stop = time.perf_counter()
                node.shutdown()
                log(f"recovery: node shut down in {time.perf_counter() - t_stop:.1f} s")
            if store is not None:
                store.close()
        if not idle:
            log("recovery: the node did not become idle within 300 s")
        log(
            f"recovery: open {t_open - t0:.3f} s, Node() {t_node - t_open:.3f} s, "
            f"idle after {t1 - t_node:.3f} s: {t1 - t0:.3f} s in all; {figures}"
        )
        return {
            "recovery_s": round(t1 - t0, 3) if idle else None,
            "recovery_open_s": round(t_open - t0, 4),
            "recovery_node_init_s": round(t_node - t_open, 3),
            "recovery_until_idle_s": round(t1 - t_node, 3),
            "recovery_idle": idle,
            "recovery_mix": counts,
            "recovery_figures": figures,
            "recovery_store_bytes": size,
            "recovery_build_s": round(build_s, 1),
            "recovery_page_cache": "warm",
        }
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- backup ------------------------------------------------------------------------------


def backup_ratio(base: str, reps: int) -> dict[str, Any]:
    """``mdb_copy`` against ``Store.backup`` on one store, alternating (see the
    module docstring). ``backup_ratio_to_mdb_copy`` None when there is no
    ``mdb_copy``."""
    mdb_copy = shutil.which("mdb_copy")
    if mdb_copy is None:
        log("backup: no mdb_copy binary (Debian: lmdb-utils); backup_ratio_to_mdb_copy is null")
        return {"backup_ratio_to_mdb_copy": None, "backup_error": "mdb_copy is not installed"}
    path = tempfile.mkdtemp(prefix="backup-src-", dir=base)
    try:
        template = snapshot_record()
        with open_synced(path) as store:
            for start in range(0, BACKUP_SESSIONS, 5_000):
                batch = WriteBatch()
                for _ in range(min(5_000, BACKUP_SESSIONS - start)):
                    batch.session(for_producer(template))
                store.write(batch, timeout=120.0)
        size = os.path.getsize(os.path.join(path, "data.mdb"))
        log(f"backup: a store of {BACKUP_SESSIONS:,} snapshots, {size / 2**20:.0f} MiB")
        t0 = time.perf_counter()
        store = Store(path, readonly=True)
        open_s = time.perf_counter() - t0
        ours: list[float] = []
        theirs: list[float] = []
        try:
            for rep in range(reps):
                for who in ("mdb_copy", "ours") if rep % 2 == 0 else ("ours", "mdb_copy"):
                    dest = tempfile.mkdtemp(prefix=f"backup-{who}-", dir=base)
                    try:
                        t0 = time.perf_counter()
                        if who == "ours":
                            store.backup(dest)
                        else:
                            subprocess.run([mdb_copy, path, dest], check=True)
                        took = time.perf_counter() - t0
                    finally:
                        shutil.rmtree(dest, ignore_errors=True)
                    (ours if who == "ours" else theirs).append(took)
                    log(f"  rep {rep + 1}/{reps} {who:8s}: {took:.3f} s")
        finally:
            store.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    ratio = theirs_s / ours_s
    log(
        f"backup: mdb_copy {theirs_s:.3f} s, Store.backup {ours_s:.3f} s (median of {reps}): "
        f"ratio {ratio:.2f}; read-only open {open_s:.3f} s"
    )
    return {
        "backup_ratio_to_mdb_copy": round(ratio, 2),
        "backup_s": round(ours_s, 3),
        "backup_mdb_copy_s": round(theirs_s, 3),
        "backup_store_bytes": size,
        "backup_sessions": BACKUP_SESSIONS,
        "backup_open_s": round(open_s, 3),
        "backup_repetitions": reps,
        "backup_all_s": {
            "ours": [round(t, 3) for t in ours],
            "mdb_copy": [round(t, 3) for t in theirs],
        },
    }


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short window per mode")
    parser.add_argument("--dir", default=None, help="where the temporary stores go (real disk)")
    args = parser.parse_args(argv)
    reps, warmup, window = (1, 0.5, 1.5) if args.quick else (3, 1.0, 4.0)
    started = time.perf_counter()
    where = real_disk_dir("bench_store", args.dir)
    if where is None:
        return 2
    base, fstype = where
    log(
        f"bench_store: {'quick' if args.quick else 'full'} run, pid {os.getpid()}, "
        f"{os.cpu_count()} cpus, stores under {base} ({fstype})"
    )
    try:
        disk_ms = fdatasync_ms(base)
        log(f"raw disk: pwrite+fdatasync {disk_ms:.3f} ms (median)")
        log(
            f"durable snapshots: {PRODUCERS} producers, {reps} x {window} s per mode "
            f"(after {warmup} s warm-up)"
        )
        tp = throughput(base, reps, warmup, window)
        rec = recovery(base)
        backup = backup_ratio(base, 5 if args.quick else 9)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    runs = tp["runs"]
    best = {key: median_run(value) for key, value in runs.items()}

    def rate(kind: str, group: bool) -> float:
        return round(float(best[(kind, group)]["snapshots_per_s"]), 1)

    def commits_rate(kind: str, group: bool) -> float:
        return round(float(best[(kind, group)]["commits_per_s"]), 1)

    headline = "async"
    other = "threads"
    group_head = best[(headline, True)]
    summary: dict[str, Any] = {
        "bench": "store",
        "record_bytes": tp["record_bytes"],
        "producers": PRODUCERS,
        "sync": bool(SYNC_CHECKS) and all(SYNC_CHECKS),  # asserted on every store
        "naive_commits_per_s": commits_rate(headline, False),
        "group_commit_snapshots_per_s": rate(headline, True),
        "group_commit_commits": group_head["commits"],
        "group_commit_ratio": round(rate(headline, True) / rate(headline, False), 2),
        "recovery_sessions": RECOVERY_SESSIONS,
        "recovery_s": rec["recovery_s"],
        "headline_producers": f"{PRODUCERS} asyncio coroutines awaiting Store.awrite",
        "group_commit_snapshots": group_head["snapshots"],
        "group_commit_window_s": round(group_head["window_s"], 3),
        "group_commit_commits_per_s": commits_rate(headline, True),
        "group_commit_snapshots_per_commit": round(group_head["snapshots_per_commit"], 1),
        f"group_commit_snapshots_per_s_{headline}": rate(headline, True),
        f"group_commit_snapshots_per_s_{other}": rate(other, True),
        f"group_commit_commits_per_s_{other}": commits_rate(other, True),
        f"group_commit_commits_{other}": best[(other, True)]["commits"],
        f"group_commit_snapshots_per_commit_{other}": round(
            best[(other, True)]["snapshots_per_commit"], 1
        ),
        f"naive_commits_per_s_{headline}": commits_rate(headline, False),
        f"naive_commits_per_s_{other}": commits_rate(other, False),
        f"group_commit_ratio_{headline}": round(rate(headline, True) / rate(headline, False), 2),
        f"group_commit_ratio_{other}": round(rate(other, True) / rate(other, False), 2),
        "snapshots_per_s_all": {
            f"{kind}_{'group' if group else 'naive'}": [round(r["snapshots_per_s"]) for r in rs]
            for (kind, group), rs in runs.items()
        },
        "commits_all": {
            f"{kind}_{'group' if group else 'naive'}": [r["commits"] for r in rs]
            for (kind, group), rs in runs.items()
        },
        "fdatasync_ms": round(disk_ms, 3),
        "store_fs": fstype,
        "quick": args.quick,
        "repetitions": reps,
        "window_s": window,
        "cpus": os.cpu_count(),
        "wall_s": 0.0,
    }
    summary.update({k: v for k, v in rec.items() if k != "recovery_s"})
    summary.update(backup)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
