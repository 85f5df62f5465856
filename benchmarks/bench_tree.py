"""Benchmark: a full session tree on one node.

    python benchmarks/bench_tree.py [--quick]

What it measures (the keys of the last stdout line, one JSON object):

* ``spawn_per_s`` — a full tree, 1 Main + 8 + 64 + 512 Branches (depth 1-3)
  + 4096 Workers (depth 4) = 4681 sessions, every skill in flight and waiting
  at a checkpoint: sessions / real time from ``node.main`` until the tree has
  settled (every session ``active`` and ``node.wait_idle`` returned).
* ``cascade_cancel_s`` — ``node.cancel(main)`` on that settled tree until the
  last of the 4681 sessions is terminal (counted from ``transition`` events;
  the grace is long, so every session wraps up cooperatively at its
  checkpoint — the count of ``terminated_by_force`` endings is reported too).
* ``crash_to_parent_p50_ms`` / ``_p99_ms`` — with a second full tree resident
  and otherwise idle, 200 times one worker is woken by the benchmark and
  raises; the latency runs from ``time.perf_counter()`` right before the
  ``raise`` in the worker to ``time.perf_counter()`` right after the parent's
  ``wait`` returns that worker's ``failed`` result.
* ``linear_scaling_ratio`` — t(10,000 spawn-and-finish cycles) /
  (10 x t(1,000)), sequential ``node.run`` of a worker whose async skill
  returns at once (under a Branch that never claims them), each timed on a
  fresh node after a 200-cycle warm-up (so the 10,000 run crosses
  ``retain_terminal`` and exercises eviction); medians over the repetitions.
  Full garbage collections during the 10,000 run are reported on stderr.
* ``traced_spawn_ratio`` — spawns per second building the tree on a traced
  node (``NodeConfig.tracing``: every session a span, exported through the
  batch processor over OTLP/HTTP to a receiver on 127.0.0.1 that takes
  every export) ÷ the same on a node that is not traced; the two alternate
  on fresh nodes (two builds of each with ``--quick``, three in full),
  medians.
* ``metered_spawn_ratio`` — the same with ``NodeMetrics`` watching the node
  (what a standalone node always has: every event of every session is
  counted by kind, state, agent and skill) ÷ without; ``metered_cancel_ratio``
  the cascade cancel's time with them ÷ without (every ending observed).
  Alternated on fresh nodes like the traced builds (three of each with
  ``--quick``, five in full), medians.

All skills are ``async def`` (one event-loop thread for all of them; each
session is still one actor). Nothing here busy-waits: workers block in
``session.wait`` on a child that never exists (a checkpoint: cancellation
wakes them), crash workers additionally race an asyncio future the benchmark
completes.

``--quick`` keeps the 4681-session tree and the 200 crashes and cuts the
repetitions: one tree of each kind, three t(1,000) and one t(10,000) (full:
three of each tree, five t(1,000), three t(10,000)).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import http.server
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from _common import log

from sessiontree.protocol import SessionState
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig, NodeMetrics, Tracing

FANOUT = 8
WORKER_DEPTH = 4
TREE_SESSIONS = sum(FANOUT**d for d in range(WORKER_DEPTH + 1))  # 4681
CRASHES = 200
TERMINAL = frozenset(s.value for s in SessionState if s.is_terminal)
#: A child id nobody ever has: ``session.wait(NEVER)`` blocks at a checkpoint
#: until cancellation (or suspension) interrupts it.
NEVER = uuid.UUID(int=1)


def rss_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


class GcWatch:
    """Full (generation 2) garbage collections while the block runs: count and longest pause."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._t = 0.0

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._t) * 1000.0)

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._cb)

    def summary(self) -> str:
        if not self.pauses:
            return "no full gc"
        return (
            f"{len(self.pauses)} full gc, {sum(self.pauses):.0f} ms in all, "
            f"longest {max(self.pauses):.0f} ms"
        )


class CrashError(RuntimeError):
    """What a crash worker raises."""


# -- the tree's skills and the state the benchmark shares with them -------------


@dataclass
class TreeState:
    """Shared between the benchmark thread and the skills (which run on the node's loop)."""

    loop: asyncio.AbstractEventLoop | None = None
    #: crash worker id -> (its parent id, the future that makes it crash)
    triggers: dict[uuid.UUID, tuple[uuid.UUID, asyncio.Future[None]]] = field(default_factory=dict)
    crash_at: dict[uuid.UUID, float] = field(default_factory=dict)
    received_at: dict[uuid.UUID, float] = field(default_factory=dict)
    #: child id -> set by the parent right after it got that child's result
    receipts: dict[uuid.UUID, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def make_agent(state: TreeState) -> Agent:
    async def main_skill(s: Any) -> None:
        # A Main runs once per message; child results arrive as messages too
        # and are ignored here (the build cycle waits for them itself).
        if s.message != "build":
            return
        state.loop = asyncio.get_running_loop()
        await spawn_and_wait(s, "branch", "branch")

    async def branch(s: Any) -> None:
        if s.depth < WORKER_DEPTH - 1:
            await spawn_and_wait(s, "branch", "branch")
        else:
            # Workers: the first child of every depth-3 branch can be made to crash.
            await spawn_and_wait(s, "worker", "worker", first_skill="crash_worker")

    async def spawn_and_wait(s: Any, kind: str, skill: str, first_skill: str | None = None) -> None:
        kids: list[uuid.UUID] = []
        for i in range(FANOUT):
            name = first_skill if (i == 0 and first_skill) else skill
            spawned = await s.spawn(kind=kind, task=f"{kind} {i}", skill=name)
            if spawned.session_id is None:
                msg = f"spawn refused at depth {s.depth}: {spawned.error}"
                raise RuntimeError(msg)
            kids.append(spawned.session_id)
        # Wait for the children one by one (in spawn order): a crash of child 0
        # reaches this skill while it waits for exactly that child.
        for kid in kids:
            result = await s.wait(kid)
            now = time.perf_counter()
            if result is not None and result.status is SessionState.FAILED:
                state.received_at[kid] = now
                with state.lock:
                    receipt = state.receipts.get(kid)
                if receipt is not None:
                    receipt.set()

    async def worker(s: Any) -> None:
        while True:  # only ever left by Cancelled raised at the checkpoint
            await s.wait(NEVER)

    async def crash_worker(s: Any) -> None:
        loop = asyncio.get_running_loop()
        trigger: asyncio.Future[None] = loop.create_future()
        assert s.info.parent_id is not None
        state.triggers[s.session_id] = (s.info.parent_id, trigger)
        # Race the benchmark's trigger against a checkpointed wait, so a cancel
        # still ends this worker cooperatively.
        waiting = asyncio.ensure_future(s.wait(NEVER))
        # retrieved when it ends however this skill ends (a forced end cancels
        # this task, not that one, which then raises Cancelled on its own)
        waiting.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.wait({trigger, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if not trigger.done():
            waiting.result()  # raises Cancelled
            return
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        state.crash_at[s.session_id] = time.perf_counter()
        raise CrashError("worker crashed on purpose")

    return Agent(
        "bench",
        {
            "main": main_skill,
            "branch": branch,
            "worker": worker,
            "crash_worker": crash_worker,
        },
        main_skill="main",
        max_children=FANOUT,
    )


class Watcher:
    """An event observer (runs on the Cortex thread): live count, activations,
    terminal codes, and a threading.Event for each milestone."""

    def __init__(self) -> None:
        self.live = 0
        self.active = 0
        self.spawned = 0
        self.codes: Counter[str] = Counter()
        self.target_active = -1
        self.all_active = threading.Event()
        self.active_at = 0.0
        self.watch_empty = False
        self.empty = threading.Event()
        self.empty_at = 0.0

    def __call__(self, ev: Event) -> None:
        if ev.kind is EventKind.SPAWNED:
            self.live += 1
            self.spawned += 1
            if ev.state == "active":  # a Main starts active
                self._activated()
        elif ev.kind is EventKind.TRANSITION:
            if ev.state == "active" and ev.previous == "pending":
                self._activated()
            elif ev.state in TERMINAL:
                self.live -= 1
                self.codes[ev.code or ev.state] += 1
                if self.watch_empty and self.live == 0:
                    self.empty_at = time.perf_counter()
                    self.empty.set()

    def _activated(self) -> None:
        self.active += 1
        if self.active == self.target_active:
            self.active_at = time.perf_counter()
            self.all_active.set()

    def expect_active(self, n: int) -> None:
        self.active = 0
        self.all_active.clear()
        self.target_active = n

    def expect_empty(self) -> None:
        self.codes.clear()
        self.empty.clear()
        self.watch_empty = True


def node_config() -> NodeConfig:
    return NodeConfig(
        grace=60.0,  # long: every session must wrap up cooperatively
        max_sessions=100_000,
        max_running_skills=20_000,
        ask_timeout=120.0,
    )


def build_tree(node: Node, watcher: Watcher, timeout: float = 300.0) -> tuple[Any, float]:
    """Build the 4681-session tree; returns (main ref, seconds until settled)."""
    watcher.expect_active(TREE_SESSIONS)
    gc.collect()
    t0 = time.perf_counter()
    main = node.main("bench", key=f"internal:main:{uuid.uuid4().hex}")
    err = main.send("build")
    if err is not None:
        raise RuntimeError(f"main refused the build message: {err}")
    if not watcher.all_active.wait(timeout):
        raise RuntimeError(
            f"tree did not come up: {watcher.active}/{TREE_SESSIONS} active; {node.stats()}"
        )
    if not node.wait_idle(timeout):
        raise RuntimeError("tree never settled (wait_idle timed out)")
    t1 = time.perf_counter()
    stats = node.stats()
    if stats["live_sessions"] != TREE_SESSIONS:
        raise RuntimeError(f"expected {TREE_SESSIONS} live sessions, got {stats}")
    log(
        f"  tree built: {TREE_SESSIONS} sessions in {t1 - t0:.3f} s "
        f"(all active after {watcher.active_at - t0:.3f} s) -> {TREE_SESSIONS / (t1 - t0):,.0f}/s; "
        f"threads={threading.active_count()} rss={rss_bytes() / 2**20:.0f} MiB"
    )
    return main, t1 - t0


def cascade_cancel(
    node: Node, watcher: Watcher, main: Any, timeout: float = 120.0
) -> dict[str, Any]:
    """Cancel the Main; seconds until every live session of the node is terminal."""
    live = node.stats()["live_sessions"]
    watcher.expect_empty()
    gc.collect()
    with GcWatch() as gcw:
        t0 = time.perf_counter()
        err = node.cancel(main)
        if err is not None:
            raise RuntimeError(f"cancel refused: {err}")
        t_accepted = time.perf_counter()
        if not watcher.empty.wait(timeout):
            raise RuntimeError(f"cascade cancel not done after {timeout} s: {watcher.live} live")
    elapsed = watcher.empty_at - t0
    codes = dict(watcher.codes)
    watcher.watch_empty = False
    node.wait_idle(30.0)
    log(
        f"  cascade cancel: {live} sessions terminal in {elapsed:.3f} s "
        f"(cancel call returned after {t_accepted - t0:.3f} s; {gcw.summary()}); endings {codes}"
    )
    return {"sessions": live, "seconds": elapsed, "call_s": t_accepted - t0, "codes": codes}


def crash_rounds(node: Node, state: TreeState, n: int) -> list[float]:
    """Make ``n`` crash workers (each under a different parent) crash, one at a time."""
    assert state.loop is not None
    chosen = list(state.triggers.items())[:n]
    if len(chosen) < n:
        raise RuntimeError(f"only {len(chosen)} crash workers are waiting")
    latencies: list[float] = []
    for child, (_parent, trigger) in chosen:
        receipt = threading.Event()
        with state.lock:
            state.receipts[child] = receipt
        node.wait_idle(10.0)
        state.loop.call_soon_threadsafe(trigger.set_result, None)
        if not receipt.wait(10.0):
            raise RuntimeError(f"the parent never got crash worker {child}'s result")
        latencies.append((state.received_at[child] - state.crash_at[child]) * 1000.0)
    node.wait_idle(10.0)
    return latencies


# -- linear scaling ------------------------------------------------------------------


def scaling_agent() -> Agent:
    async def main_skill(s: Any) -> None:
        return None

    async def holder(s: Any) -> None:
        while True:
            await s.wait(NEVER)

    async def noop(s: Any) -> str:
        return "ok"

    return Agent("scale", {"main": main_skill, "holder": holder, "noop": noop}, main_skill="main")


def timed_cycles(node: Node, parent: Any, n: int) -> float:
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(n):
        result = node.run(parent, kind="worker", task="noop", skill="noop", timeout=30.0)
        if result is None or result.status is not SessionState.COMPLETED:
            raise RuntimeError(f"a spawn-and-finish cycle failed: {result}")
    return time.perf_counter() - t0


def scaling_node() -> tuple[Node, Any]:
    node = Node([scaling_agent()], node_config())
    main = node.main("scale")
    holder = node.spawn(main, kind="branch", task="holder", skill="holder")
    if holder.ref is None:
        node.shutdown(grace=0)
        raise RuntimeError(f"holder refused: {holder.error}")
    timed_cycles(node, holder.ref, 200)  # warm-up
    return node, holder.ref


def linear_scaling(small_reps: int, big_reps: int) -> dict[str, Any]:
    """t(1,000) and t(10,000) each from a fresh node (after a 200-cycle warm-up),
    alternating; after each 10,000 run one more t(1,000) on the same node (does a
    history of 10,200 cycles make a cycle dearer?)."""
    t1k: list[float] = []
    t10k: list[float] = []
    t1k_after: list[float] = []
    for rep in range(max(small_reps, big_reps)):
        if rep < small_reps:
            node, holder = scaling_node()
            try:
                with GcWatch() as gcw:
                    t1k.append(timed_cycles(node, holder, 1_000))
            finally:
                node.shutdown(grace=0)
            log(
                f"  t(1,000) = {t1k[-1]:.3f} s ({1000 / t1k[-1]:,.0f} cycles/s; "
                f"{gcw.summary()}); threads={threading.active_count()}"
            )
        if rep < big_reps:
            node, holder = scaling_node()
            try:
                with GcWatch() as gcw:
                    t10k.append(timed_cycles(node, holder, 10_000))
                t1k_after.append(timed_cycles(node, holder, 1_000))
                stats = node.stats()
            finally:
                node.shutdown(grace=0)
            log(
                f"  t(10,000) = {t10k[-1]:.3f} s ({10_000 / t10k[-1]:,.0f} cycles/s; "
                f"{gcw.summary()}), then t(1,000) = {t1k_after[-1]:.3f} s; "
                f"indexed_sessions={stats['indexed_sessions']}"
            )
    t_small = statistics.median(t1k)
    t_big = statistics.median(t10k)
    return {
        "t_1000_s": t_small,
        "t_10000_s": t_big,
        "t_1000_after_s": statistics.median(t1k_after),
        "t_1000_all": t1k,
        "t_10000_all": t10k,
        "ratio": t_big / (10 * t_small),
        "cycles_per_s": 10_000 / t_big,
    }


# -- main ------------------------------------------------------------------------------


def run_tree_reps(reps: int) -> dict[str, Any]:
    spawn_s: list[float] = []
    cancel_s: list[float] = []
    cancel_call_s: list[float] = []
    crash_ms: list[float] = []
    crash_tree_cancel_s: list[float] = []
    forced = 0
    peak_rss = 0
    peak_threads = 0
    for rep in range(reps):
        log(f"tree rep {rep + 1}/{reps}")
        state = TreeState()
        watcher = Watcher()
        node = Node([make_agent(state)], node_config())
        node.subscribe(watcher)
        try:
            # Tree A: spawn rate, then cascade cancel of all 4681 sessions.
            main, built = build_tree(node, watcher)
            spawn_s.append(built)
            peak_rss = max(peak_rss, rss_bytes())
            peak_threads = max(peak_threads, threading.active_count())
            out = cascade_cancel(node, watcher, main)
            if out["sessions"] != TREE_SESSIONS:
                raise RuntimeError(f"cancelled {out['sessions']} sessions, not {TREE_SESSIONS}")
            cancel_s.append(out["seconds"])
            cancel_call_s.append(out["call_s"])
            forced += out["codes"].get("terminated_by_force", 0)

            # Tree B: resident and idle; 200 worker crashes, then tear it down.
            state.triggers.clear()
            main, built = build_tree(node, watcher)
            spawn_s.append(built)
            with GcWatch() as gcw:
                lat = crash_rounds(node, state, CRASHES)
            crash_ms += lat
            log(
                f"  crash-to-parent over {len(lat)} crashes: p50 {percentile(lat, 50):.3f} ms, "
                f"p99 {percentile(lat, 99):.3f} ms, max {max(lat):.3f} ms ({gcw.summary()})"
            )
            out = cascade_cancel(node, watcher, main)
            crash_tree_cancel_s.append(out["seconds"])
            forced += out["codes"].get("terminated_by_force", 0)
        finally:
            t0 = time.perf_counter()
            node.shutdown(grace=0)
            log(f"  node shutdown took {time.perf_counter() - t0:.3f} s")
    return {
        "spawn_s": spawn_s,
        "cancel_s": cancel_s,
        "cancel_call_s": cancel_call_s,
        "crash_ms": crash_ms,
        "crash_tree_cancel_s": crash_tree_cancel_s,
        "forced": forced,
        "peak_rss": peak_rss,
        "peak_threads": peak_threads,
    }


class _Receiver(http.server.BaseHTTPRequestHandler):
    """A loopback OTLP/HTTP traces endpoint that takes every export (and keeps nothing)."""

    received = 0  # bytes, for the log

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


def traced_builds(reps: int) -> dict[str, Any]:
    """Tree builds on a node traced to a loopback OTLP receiver and on one that
    is not, alternated (untraced, traced, ...): spawns per second of each."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    rates: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for rep in range(reps):
            for mode in ("off", "on"):
                config = node_config()
                if mode == "on":
                    config = dataclasses.replace(config, tracing=Tracing(endpoint=endpoint))
                state, watcher = TreeState(), Watcher()
                node = Node([make_agent(state)], config)
                node.subscribe(watcher)
                try:
                    main, built = build_tree(node, watcher)
                    rates[mode].append(TREE_SESSIONS / built)
                    cascade_cancel(node, watcher, main)
                finally:
                    node.shutdown(grace=0)
                log(f"  traced rep {rep + 1}/{reps} tracing {mode}: {rates[mode][-1]:,.0f}/s")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    log(f"  the receiver took {_Receiver.received / 2**20:.1f} MiB of spans")
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {"ratio": on / off, "off": off, "on": on}


def metered_builds(reps: int) -> dict[str, Any]:
    """Tree builds and cascade cancels on a node ``NodeMetrics`` watches and on
    one it does not, alternated (unmetered, metered, ...): spawns per second
    and cancel seconds of each; the metered node is scraped once at the end."""
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cancels: dict[str, list[float]] = {"off": [], "on": []}
    for rep in range(reps):
        for mode in ("off", "on"):
            state, watcher = TreeState(), Watcher()
            node = Node([make_agent(state)], node_config())
            metrics = NodeMetrics(node) if mode == "on" else None
            node.subscribe(watcher)
            try:
                main, built = build_tree(node, watcher)
                rates[mode].append(TREE_SESSIONS / built)
                cancels[mode].append(cascade_cancel(node, watcher, main)["seconds"])
                if metrics is not None:
                    scraped = metrics.exposition()
                    if b"sessiontree_sessions_spawned_total" not in scraped:
                        raise RuntimeError("the metered node's scrape lacks its spawns")
            finally:
                if metrics is not None:
                    metrics.close()
                node.shutdown(grace=0)
            log(
                f"  metered rep {rep + 1}/{reps} metrics {mode}: {rates[mode][-1]:,.0f}/s, "
                f"cancel {cancels[mode][-1]:.3f} s"
            )
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    cancel_off, cancel_on = statistics.median(cancels["off"]), statistics.median(cancels["on"])
    return {
        "ratio": on / off,
        "off": off,
        "on": on,
        "cancel_ratio": cancel_on / cancel_off,
        "cancel_off_s": cancel_off,
        "cancel_on_s": cancel_on,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (about a minute)")
    args = parser.parse_args(argv)
    tree_reps = 1 if args.quick else 3
    small_reps, big_reps = (3, 1) if args.quick else (5, 3)
    started = time.perf_counter()
    log(
        f"bench_tree: {TREE_SESSIONS}-session tree, {'quick' if args.quick else 'full'} run, "
        f"pid {os.getpid()}, {os.cpu_count()} cpus"
    )

    tree = run_tree_reps(tree_reps)
    log("linear scaling (sequential node.run of a no-op worker)")
    scaling = linear_scaling(small_reps, big_reps)
    log("tracing: tree builds exported to a loopback OTLP receiver, and without")
    traced = traced_builds(2 if args.quick else 3)
    log("metrics: tree builds and cancels watched by NodeMetrics, and without")
    metered = metered_builds(3 if args.quick else 5)

    spawn_rates = [TREE_SESSIONS / s for s in tree["spawn_s"]]
    crash = tree["crash_ms"]
    summary = {
        "bench": "tree",
        "sessions": TREE_SESSIONS,
        "spawn_per_s": round(statistics.median(spawn_rates), 1),
        "cascade_cancel_s": round(statistics.median(tree["cancel_s"]), 4),
        "crash_to_parent_p50_ms": round(percentile(crash, 50), 3),
        "crash_to_parent_p99_ms": round(percentile(crash, 99), 3),
        "linear_scaling_ratio": round(scaling["ratio"], 3),
        "traced_spawn_ratio": round(traced["ratio"], 3),
        "metered_spawn_ratio": round(metered["ratio"], 3),
        "metered_cancel_ratio": round(metered["cancel_ratio"], 3),
        "quick": args.quick,
        "tree_builds": len(tree["spawn_s"]),
        "spawn_per_s_all": [round(r, 1) for r in spawn_rates],
        "tree_build_s": round(statistics.median(tree["spawn_s"]), 3),
        "cascade_cancel_s_all": [round(s, 4) for s in tree["cancel_s"]],
        "cascade_cancel_call_s": round(statistics.median(tree["cancel_call_s"]), 4),
        "cascade_cancel_after_crashes_s": round(statistics.median(tree["crash_tree_cancel_s"]), 4),
        "terminated_by_force": tree["forced"],
        "crash_samples": len(crash),
        "crash_to_parent_max_ms": round(max(crash), 3),
        "t_1000_cycles_s": round(scaling["t_1000_s"], 4),
        "t_10000_cycles_s": round(scaling["t_10000_s"], 4),
        "t_1000_cycles_after_11200_s": round(scaling["t_1000_after_s"], 4),
        "t_1000_cycles_all_s": [round(t, 4) for t in scaling["t_1000_all"]],
        "t_10000_cycles_all_s": [round(t, 4) for t in scaling["t_10000_all"]],
        "cycles_per_s": round(scaling["cycles_per_s"], 1),
        "spawn_per_s_traced": round(traced["on"], 1),
        "spawn_per_s_untraced": round(traced["off"], 1),
        "spawn_per_s_metered": round(metered["on"], 1),
        "spawn_per_s_unmetered": round(metered["off"], 1),
        "cascade_cancel_metered_s": round(metered["cancel_on_s"], 4),
        "cascade_cancel_unmetered_s": round(metered["cancel_off_s"], 4),
        "peak_rss_bytes": tree["peak_rss"],
        "peak_threads": tree["peak_threads"],
        "cpus": os.cpu_count(),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
