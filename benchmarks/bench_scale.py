"""Benchmark: many sessions on one small node (the scale issue).

    python benchmarks/bench_scale.py [--quick] [--dir DIR]

What it measures (the keys of the last stdout line, one JSON object):

* On a fresh node with an LMDB store, ``compare_sessions`` (10,000) resident
  sessions (these keys were ``*_pooled`` while the node had other actor types
  to compare with):
  - ``spawn_per_s`` — one ``Node.spawn_many`` of that many async workers
    under one Main (the agent allows that many children), from the call
    until every one is answered (records durable) and the node has settled
    (every skill started and waiting at a checkpoint);
  - ``msgs_per_s`` — messages told round robin to the actors of that many
    Mains (one per session key; a Main is the session that holds a mailbox
    actor), ``Inspect`` probes that count, through the node's own ``post``,
    from the first tell until the last has been handled.
* On one node with a store:
  - ``dormant`` idle Mains created, then passivated (``passivate_after``
    1 s); then 20 full trees (1 Main + 8 + 64 + 512 Branches + 4,096
    Workers = 4,681 each, 93,620 in all), every skill in flight and waiting;
    ``live_sessions`` = resident + passivated, ``resident_sessions`` those
    held in memory, ``rss_bytes`` the process's resident memory then;
  - ``reactivate_p99_ms`` — a message sent to a passivated Main until its
    message cycle has begun (its skill's first line), over many Mains;
  - ``cascade_cancel_s`` — ``cancel`` of the 20 tree Mains until every one
    of the ``cascade_cancel_sessions`` is terminal (counted from events).

Every node runs with ``gc_tuning`` (the collector thresholds a node holding
many sessions wants; ``sessiontree node start`` turns it on too), and every
phase starts on a collected heap.

``--quick``: 2,000 resident sessions, 2 trees, 2,000 passivated Mains,
100 reactivations (full: 10,000, 20 trees, 10,000 Mains, 1,000).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

from _common import log

from sessiontree.actors.runtime import Inspect, post
from sessiontree.protocol import SessionKind, SpawnSpec
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig
from sessiontree.supervision._requests import GetActorRef

FANOUT = 8
TREE = 1 + 8 + 64 + 512 + 4096
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# -- skills ------------------------------------------------------------------------------

started: dict[uuid.UUID, float] = {}
started_event: dict[uuid.UUID, threading.Event] = {}


async def resident(session: Any) -> None:
    """Stays in flight at a checkpoint until cancelled."""
    await session.sleep(24 * 3600.0)


async def branch(session: Any) -> None:
    """Spawns its level of the tree in one batch, then waits for it."""
    depth = session.info.depth
    kind = SessionKind.BRANCH if depth < 3 else SessionKind.WORKER
    skill = "branch" if depth < 3 else "resident"
    await session.spawn_many([SpawnSpec(kind=kind, skill=skill)] * FANOUT)
    await session.collect(timeout=24 * 3600.0)


def main_cycle(session: Any) -> None:
    """A Main's message cycle: notes when it began (the reactivation probe)."""
    sid = session.info.session_id
    started[sid] = time.perf_counter()
    event = started_event.get(sid)
    if event is not None:
        event.set()


def agent(max_children: int) -> Agent:
    skills = {"main": main_cycle, "resident": resident, "branch": branch}
    return Agent("bench", skills, main_skill="main", max_children=max_children)


def make_node(store_dir: str, n: int, **config: Any) -> Node:
    settings: dict[str, Any] = {
        "max_sessions": 4 * n + 1000,
        "max_running_skills": 4 * n + 1000,
        "ask_timeout": 600.0,
        "gc_tuning": True,
        **config,
    }
    return Node([agent(max(n, FANOUT))], NodeConfig(**settings), store=store_dir)


# -- resident sessions ---------------------------------------------------------------------


def compare(n: int, messages: int, workdir: str) -> dict[str, float]:
    gc.collect()  # each phase starts on a collected heap: not the garbage of the last
    store_dir = tempfile.mkdtemp(prefix="compare-", dir=workdir)
    node = make_node(store_dir, n, passivate_after=None)
    try:
        main = node.main("bench")
        specs = [SpawnSpec(kind=SessionKind.WORKER, skill="resident")] * n
        t0 = time.perf_counter()
        spawned = node.spawn_many(main, specs)
        assert all(s.ok for s in spawned), next(s.error for s in spawned if not s.ok)
        assert node.wait_idle(600), "spawned sessions did not settle"
        spawn_s = time.perf_counter() - t0
        log(f"  {n} spawned in {spawn_s:.2f} s ({n / spawn_s:,.0f}/s)")

        async def open_mains() -> list[Any]:
            keys = [f"internal:channel:m{i}" for i in range(n)]
            return await asyncio.gather(*(node.amain("bench", k) for k in keys))

        mains = asyncio.run(open_mains())
        assert node.wait_idle(600), "the Mains did not settle"
        refs = [node._call(GetActorRef(m.session_id)) for m in mains]
        assert all(ref is not None for ref in refs), "a Main holds no actor"
        counted = itertools.count(1)
        done = threading.Event()

        def probe(core: Any) -> None:
            if next(counted) == messages:
                done.set()

        message = Inspect(probe)
        activity = node.activity
        t0 = time.perf_counter()
        for i in range(messages):
            post(refs[i % n], message, activity)
        assert done.wait(600), "messages were not all handled"
        msgs_s = time.perf_counter() - t0
        log(f"  {messages} messages in {msgs_s:.2f} s ({messages / msgs_s:,.0f}/s)")
        return {"spawn_per_s": n / spawn_s, "msgs_per_s": messages / msgs_s}
    finally:
        t0 = time.perf_counter()
        node.shutdown(grace=0, timeout=600)
        log(f"  shutdown {time.perf_counter() - t0:.2f} s")
        shutil.rmtree(store_dir, ignore_errors=True)


# -- at scale ----------------------------------------------------------------------------


def scale(trees: int, dormant: int, reactivations: int, workdir: str) -> dict[str, Any]:
    gc.collect()
    store_dir = tempfile.mkdtemp(prefix="scale-", dir=workdir)
    n = trees * TREE + dormant
    node = make_node(store_dir, n, passivate_after=1.0, check_interval=0.25)
    figures: dict[str, Any] = {}
    try:
        # idle Mains, created concurrently (their records share commits), then passivated
        t0 = time.perf_counter()

        async def create() -> list[Any]:
            refs: list[Any] = []
            for start in range(0, dormant, 1000):
                keys = [f"telegram:dm:{i}" for i in range(start, min(dormant, start + 1000))]
                refs += await asyncio.gather(*(node.amain("bench", k) for k in keys))
            return refs

        idle_mains = asyncio.run(create())
        figures["mains_per_s"] = round(dormant / (time.perf_counter() - t0), 1)
        deadline = time.monotonic() + 600
        while node.stats().get("dormant_sessions", 0) < dormant and time.monotonic() < deadline:
            time.sleep(0.2)
        stats = node.stats()
        assert stats.get("dormant_sessions", 0) == dormant, stats
        log(f"  {dormant} Mains created ({figures['mains_per_s']:,.0f}/s) and passivated")

        # the trees, every skill in flight
        t0 = time.perf_counter()
        tree_mains = [node.main("bench", f"internal:channel:tree{i}") for i in range(trees)]
        for main in tree_mains:
            answers = node.spawn_many(
                main, [SpawnSpec(kind=SessionKind.BRANCH, skill="branch")] * 8
            )
            assert all(a.ok for a in answers)
        want = trees * TREE
        while node.stats()["live_sessions"] < want and time.perf_counter() - t0 < 600:
            time.sleep(0.05)
        assert node.wait_idle(600), "the trees did not settle"
        build_s = time.perf_counter() - t0
        stats = node.stats()
        figures["tree_spawn_per_s"] = round(want / build_s, 1)
        figures["resident_sessions"] = stats["live_sessions"]
        figures["dormant_sessions"] = stats["dormant_sessions"]
        figures["live_sessions"] = stats["live_sessions"] + stats["dormant_sessions"]
        figures["rss_bytes"] = rss_bytes()
        log(
            f"  {trees} trees ({want} sessions) in {build_s:.2f} s ({want / build_s:,.0f}/s); "
            f"live {figures['live_sessions']}, resident {figures['resident_sessions']}, "
            f"rss {figures['rss_bytes'] / 2**20:,.0f} MiB"
        )

        # reactivation of passivated Mains on their next message
        latencies = []
        for ref in random.sample(idle_mains, reactivations):
            sid = ref.session_id
            event = started_event[sid] = threading.Event()
            t0 = time.perf_counter()
            assert node.send(sid, "wake up") is None
            assert event.wait(60), "a reactivated Main did not run its cycle"
            latencies.append((started[sid] - t0) * 1000)
        latencies.sort()
        figures["reactivate_p50_ms"] = round(statistics.median(latencies), 3)
        figures["reactivate_p99_ms"] = round(latencies[int(len(latencies) * 0.99) - 1], 3)
        figures["reactivate_max_ms"] = round(latencies[-1], 3)
        figures["reactivations"] = len(latencies)
        log(
            f"  reactivation p50 {figures['reactivate_p50_ms']} ms, "
            f"p99 {figures['reactivate_p99_ms']} ms"
        )

        # cascade cancel of every tree
        ended = itertools.count(1)
        all_ended = threading.Event()

        def watch(event: Event) -> None:
            ending = event.kind is EventKind.TRANSITION and event.state in TERMINAL
            if ending and next(ended) == want:
                all_ended.set()

        node.subscribe(watch)
        t0 = time.perf_counter()
        for main in tree_mains:
            assert main.cancel() is None
        assert all_ended.wait(600), "the cascade did not end every session"
        figures["cascade_cancel_s"] = round(time.perf_counter() - t0, 4)
        figures["cascade_cancel_sessions"] = want
        log(f"  cascade cancel of {want} sessions: {figures['cascade_cancel_s']} s")
        return figures
    finally:
        node.shutdown(grace=0, timeout=600)
        shutil.rmtree(store_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--dir", default=None, help="where the stores go (a real disk)")
    args = parser.parse_args()
    n = 2_000 if args.quick else 10_000
    trees = 2 if args.quick else 20
    dormant = 2_000 if args.quick else 10_000
    reactivations = 100 if args.quick else 1_000
    workdir = tempfile.mkdtemp(prefix="bench-scale-", dir=args.dir)
    started_at = time.perf_counter()
    try:
        log(f"{n} resident sessions")
        resident_figures = compare(n, 20 * n, workdir)
        log(f"at scale: {trees} trees, {dormant} passivated Mains")
        figures = scale(trees, dormant, reactivations, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = {
        "bench": "scale",
        "compare_sessions": n,
        "spawn_per_s": round(resident_figures["spawn_per_s"], 1),
        "msgs_per_s": round(resident_figures["msgs_per_s"], 1),
        **figures,
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "wall_s": round(time.perf_counter() - started_at, 1),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
