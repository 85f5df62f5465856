"""Benchmark: a fan-out of 8 sub-agents on sessiontree beside what a builder would otherwise pick.

    python benchmarks/bench_peers.py [--quick] [--dir DIR] [--stream]

The workload every agent platform runs: a parent fans out 8 sub-agents, each
awaits a "model call" (``asyncio.sleep(wait)``, so only orchestration
differs), the parent collects. Systems, each measured on a fresh instance
(a new node, a newly compiled graph) and alternated within one run
(A B C D … A B C D …):

* ``asyncio`` — bare ``asyncio.gather`` of 8 coroutines;
* ``langgraph`` — LangGraph 1.x ``Send`` map-reduce: a ``StateGraph`` whose
  ``plan`` node fans out 8 ``Send``s to a ``work`` node that sleeps and
  returns, the results reduced into an ``operator.add`` annotated list that
  a ``collect`` node reads;
* sessiontree in memory (``await Node.astart(..., store=None)``) and with
  its LMDB store (``store=DIR``, a fresh directory on a real disk, synced
  commits), each two ways: ``fan_out`` (the parent awaits
  ``session.fan_out(tasks)``) and ``spawn_many`` (the parent awaits
  ``session.spawn_many(specs)`` then ``session.collect()``). The embedding
  application (this script's own event loop, as an async web app's would
  be) starts the node on its loop with ``Node.astart``, so the Cortex, the
  Main's actor, the parent and the workers (async skills) all run there; a
  worker awaits ``asyncio.sleep(wait)``. It starts one tree with ``await
  main.arun(kind="branch", skill=PARENT, task=WAIT)`` on the agent's Main;
  the Branch's result then also runs the Main's (empty) message cycle,
  which is part of what a tree costs;
* ``thread/spawn_many``: the same in memory on a node made with ``Node()``,
  whose loop runs on a thread of its own (the application's calls then
  cross threads); reported beside the others, not in the summary keys;
* ``asyncio/same_gc`` and ``langgraph/same_gc``: the two baselines again,
  under the cyclic garbage collector's settings a running node sets. A node
  may change them for the whole process when it starts (``NodeConfig.gc_tuning``
  raises the thresholds) and put back what it found when it closes, so the
  baselines as-is run under the interpreter's defaults. The settings are read
  at the start of the run from a node started in memory (thresholds, on or
  off, whether it froze the heap with ``gc.freeze``: ``node_gc_*``), set
  when such a baseline's instance starts and put back when it closes.

Measurements (each with a fresh instance per system per round; the
``same_gc`` baselines alternate with the others):

1. CPU per sub-task with no wait: the process's CPU time (every thread:
   ``time.process_time``) over N sequential trees (and, for sessiontree,
   until the node is idle after the last) / (N * 8); the median over
   rounds. ``subtask_cpu_us_memory`` / ``_durable`` are sessiontree's best
   of (``fan_out``, ``spawn_many``); ``vs_langgraph_d0_*`` = LangGraph's CPU
   per sub-task ÷ ours (> 1: we are cheaper), ``vs_langgraph_d0_*_same_gc``
   the same with LangGraph under the node's collector settings.
   ``subtask_cpu_x_asyncio_memory`` / ``_durable`` = ours ÷ ``asyncio.gather``'s
   under the node's settings (how many times a bare coroutine's CPU a
   sub-task costs), ``..._as_is`` ÷ asyncio's as-is; the baselines
   themselves are ``asyncio_cpu_us_as_is`` / ``_same_gc`` and
   ``langgraph_cpu_us_as_is`` / ``_same_gc``.
2. Throughput with 1,000 trees started at once (``asyncio.gather`` of 1,000
   tree coroutines on the application's loop), 50 ms wait: sub-tasks/s from
   the start until the last tree's result, the median over rounds.
   ``vs_asyncio_t1000`` = sessiontree's best in memory ÷ bare asyncio,
   ``vs_asyncio_t1000_same_gc`` ÷ bare asyncio under the node's collector
   settings (as-is, the collector's share of asyncio's wall time there is
   large: ``t1000_gc_share_asyncio`` beside ``..._asyncio_same_gc``).
3. Added latency of one tree: the wall time of one tree with a 50 ms wait
   minus 50 ms, over many sequential trees; p50 and p99 per system.
   ``added_latency_p99_ms`` is sessiontree's best in memory;
   ``added_latency_p50_ms_over_asyncio`` = sessiontree's best p50 in memory
   minus bare asyncio's p50 (``..._same_gc``: minus asyncio's under the
   node's settings).
4. Store commits per tree (the two store systems, 50 ms wait): the LMDB
   writer's commits (``Store.stats()["commits"]``) over N trees run one at
   a time (``commits_per_tree_t1``), and over rounds of 100 trees started
   at once (``commits_per_tree_t100``), each counted after a warm-up from an
   idle node with the store flushed to an idle node with the store flushed
   (the flush's own empty commit not counted); the best of (``fan_out``,
   ``spawn_many``), each also reported.

The machine: ``fsync_ms`` (one synced write on the stores' disk) and
``idle_slowdown``, how many times as long the same small piece of Python
takes right after a 50 ms sleep as when run again at once (the median of
41). After each model wait a tree's path runs with caches gone cold, so
its added latency is about its CPU path (measurement 1's wall time x 8)
times this, on top of asyncio's own timer floor.

``--stream`` adds the same tree with each sub-task streaming a reply from
the local chat-completions stand-in (in a process of its own): 8 calls of
the ``openai`` SDK under ``asyncio.gather`` on the application's loop
against a parent whose 8 workers each await ``session.complete(PROMPT,
stream=True)`` (in memory and with the store); the two alternate, one tree
at a time; ``stream_added_latency_*`` is the session tree's p50 (p99) minus
the bare one's.

``--quick``: fewer trees and rounds (the 1,000 trees of measurement 2 and
the 100 at once of measurement 4 are kept). ``--systems`` and ``--only``
narrow a run, e.g. for a profiler: ``py-spy record -- python
benchmarks/bench_peers.py --only cpu --systems memory/spawn_many --trees
5000 --rounds 1``.

The peers come from the ``bench`` extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import operator
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Annotated, Any, TypedDict

from _common import fdatasync_ms, log, real_disk_dir
from _kernel_sketch import Handle, Kernel

from sessiontree.protocol import SessionKind, SpawnSpec
from sessiontree.store import Store
from sessiontree.supervision import Agent, Node, NodeConfig, Provider

try:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send
except ImportError as exc:  # pragma: no cover - the message is the point
    sys.exit(
        f"bench_peers needs LangGraph, from the 'bench' extra: pip install -e '.[bench]' ({exc})"
    )

FANOUT = 8
WAIT = 0.05
TREES_AT_ONCE = 1000
DAY = 24 * 3600.0
ASYNCIO, LANGGRAPH = "asyncio", "langgraph"
SAME_GC = "/same_gc"  # a baseline run under the node's collector settings
ST_SYSTEMS = (
    "memory/fan_out",
    "memory/spawn_many",
    "store/fan_out",
    "store/spawn_many",
    "thread/spawn_many",
)
SKETCH_SYSTEMS = ("sketch/memory", "sketch/store")  # benchmarks/_kernel_sketch.py
SYSTEMS = (
    ASYNCIO,
    ASYNCIO + SAME_GC,
    LANGGRAPH,
    LANGGRAPH + SAME_GC,
    *ST_SYSTEMS,
    *SKETCH_SYSTEMS,
)


def idle_slowdown(pause: float = WAIT, rounds: int = 41) -> float:
    """How many times as long the same Python work takes right after a
    ``pause`` s sleep as when run again at once (medians of ``rounds``)."""

    def timed() -> float:
        started = time.perf_counter()
        json.dumps({i: str(i) for i in range(300)})
        return time.perf_counter() - started

    after_sleep, again = [], []
    for _ in range(rounds):
        time.sleep(pause)
        after_sleep.append(timed())
        timed()  # the first run again may still touch a line the sleep evicted
        again.append(timed())
    return statistics.median(after_sleep) / statistics.median(again)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


# -- the systems --------------------------------------------------------------------------


class System:
    """One system under test: ``tree(wait)`` runs one parent with its 8
    sub-tasks to the end on the application's loop."""

    name = ""

    async def start(self) -> None:
        return None

    async def tree(self, wait: float) -> None:
        raise NotImplementedError

    async def settle(self) -> None:
        """Until the work a tree left behind (records, evictions) is done."""

    async def close(self) -> None:
        return None


async def _work(wait: float) -> str:
    await asyncio.sleep(wait)
    return "ok"


class Gather(System):
    name = ASYNCIO

    async def tree(self, wait: float) -> None:
        results = await asyncio.gather(*(_work(wait) for _ in range(FANOUT)))
        if len(results) != FANOUT:
            raise RuntimeError(f"asyncio: {len(results)} results")


class TreeState(TypedDict):
    wait: float
    results: Annotated[list[str], operator.add]
    done: int


class WorkState(TypedDict):
    wait: float


def build_graph() -> Any:
    """LangGraph's map-reduce: ``plan`` → 8 x ``Send("work")`` → ``collect``."""

    def plan(state: TreeState) -> dict[str, Any]:
        return {}

    def fan(state: TreeState) -> list[Send]:
        return [Send("work", {"wait": state["wait"]}) for _ in range(FANOUT)]

    async def work(state: WorkState) -> dict[str, Any]:
        await asyncio.sleep(state["wait"])
        return {"results": ["ok"]}

    def collect(state: TreeState) -> dict[str, Any]:
        return {"done": len(state["results"])}

    builder = StateGraph(TreeState)
    builder.add_node("plan", plan)
    builder.add_node("work", work)
    builder.add_node("collect", collect)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan, ["work"])
    builder.add_edge("work", "collect")
    builder.add_edge("collect", END)
    return builder.compile()


class LangGraph(System):
    name = LANGGRAPH

    async def start(self) -> None:
        self.graph = build_graph()

    async def tree(self, wait: float) -> None:
        out = await self.graph.ainvoke({"wait": wait, "results": [], "done": 0})
        if out["done"] != FANOUT:
            raise RuntimeError(f"langgraph: {out['done']} results")


def make_agent(url: str | None = None) -> Agent:
    """The Main's (empty) cycle, the two parents, the worker, and the
    streaming parent and worker of ``--stream``."""

    async def inbox(s: Any) -> None:
        return None

    async def by_fan_out(s: Any) -> str:
        gathered = await s.fan_out([s.task] * FANOUT, skill="work")
        return str(len(gathered.results))

    async def by_spawn_many(s: Any) -> str:
        spec = SpawnSpec(kind=SessionKind.WORKER, task=s.task, skill="work")
        await s.spawn_many([spec] * FANOUT)
        collected = await s.collect()
        return str(sum(1 for c in collected if c.result is not None and c.result.ok))

    async def work(s: Any) -> str:
        await asyncio.sleep(float(s.task))
        return "ok"

    async def stream_parent(s: Any) -> str:
        spec = SpawnSpec(kind=SessionKind.WORKER, task="stream", skill="streamer")
        await s.spawn_many([spec] * FANOUT)
        collected = await s.collect()
        return str(sum(1 for c in collected if c.result is not None and c.result.ok))

    async def streamer(s: Any) -> str:
        from bench_models import PROMPT, REPLY  # noqa: PLC0415 - only with --stream

        completion = await s.complete(PROMPT, stream=True, record=False)
        if completion.error is not None or completion.text != REPLY:
            raise RuntimeError(f"stream: {completion.error} {completion.text!r}")
        return "ok"

    skills = {
        "inbox": inbox,
        "fan_out": by_fan_out,
        "spawn_many": by_spawn_many,
        "work": work,
        "stream_parent": stream_parent,
        "streamer": streamer,
    }
    models = {"small": "bench-model", "large": "bench-model"} if url else {}
    return Agent("peers", skills, main_skill="inbox", max_children=2 * TREES_AT_ONCE, models=models)


@dataclass
class Sessiontree(System):
    """A fresh node: in memory, or with a store in a new directory under ``base``."""

    name: str
    base: str | None = None
    url: str | None = None
    skill: str = field(init=False)
    directory: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.skill = self.name.split("/", 1)[1]

    async def start(self) -> None:
        config = NodeConfig(
            max_running_skills=(FANOUT + 1) * TREES_AT_ONCE + 100,
            max_sessions=100_000,
            ask_timeout=600.0,
            providers=(Provider(base_url=self.url, timeout=600.0),) if self.url else (),
        )
        if self.name.startswith("store/"):
            assert self.base is not None
            self.directory = tempfile.mkdtemp(prefix="node-", dir=self.base)
        agents = [make_agent(self.url)]
        if self.name.startswith("thread/"):  # a loop thread of the node's own
            self.node = Node(agents, config, store=self.directory)
        else:  # on the application's loop, as an async application embeds it
            self.node = await Node.astart(agents, config, store=self.directory)
        self.main = await self.node.amain("peers")

    async def tree(self, wait: float) -> None:
        result = await self.main.arun(kind="branch", skill=self.skill, task=repr(wait))
        if result is None or not result.ok or result.summary != str(FANOUT):
            raise RuntimeError(f"{self.name}: {result}")

    async def settle(self) -> None:
        if not await self.node.await_idle(600.0):
            raise RuntimeError(f"{self.name}: the node did not settle")

    async def close(self) -> None:
        await self.node.ashutdown(grace=0)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


@dataclass(frozen=True)
class GcSettings:
    """The cyclic collector's settings: thresholds, on or off, and whether
    what was alive has been moved out of its reach (``gc.freeze``)."""

    thresholds: tuple[int, int, int]
    enabled: bool
    frozen: bool


async def node_gc_settings() -> GcSettings:
    """The collector settings a running node has set: a node is started in
    memory on this loop, the settings read while it runs, and it is shut
    down (which puts back what it found)."""
    frozen_before = gc.get_freeze_count()
    node = await Node.astart([make_agent()], NodeConfig())
    try:
        return GcSettings(gc.get_threshold(), gc.isenabled(), gc.get_freeze_count() > frozen_before)
    finally:
        await node.ashutdown(grace=0)


class SameGc(System):
    """A baseline under the node's collector settings: they are set when it
    starts (after its own set-up, as a node sets them last) and the ones
    found are put back when it closes, so the systems after it run as-is."""

    def __init__(self, inner: System, settings: GcSettings, name: str | None = None) -> None:
        self.inner = inner
        self.settings = settings
        self.name = inner.name + SAME_GC if name is None else name
        self._found = GcSettings(gc.get_threshold(), gc.isenabled(), gc.get_freeze_count() > 0)

    async def start(self) -> None:
        await self.inner.start()
        self._found = GcSettings(gc.get_threshold(), gc.isenabled(), gc.get_freeze_count() > 0)
        gc.set_threshold(*self.settings.thresholds)
        if not self.settings.enabled:
            gc.disable()
        if self.settings.frozen:
            gc.collect()
            gc.freeze()

    async def tree(self, wait: float) -> None:
        await self.inner.tree(wait)

    async def settle(self) -> None:
        await self.inner.settle()

    async def close(self) -> None:
        try:
            await self.inner.close()
        finally:
            if self.settings.frozen and not self._found.frozen:
                gc.unfreeze()
            gc.set_threshold(*self._found.thresholds)
            if self._found.enabled:
                gc.enable()


def sketch_skills() -> dict[str, Any]:
    """The bench's tree for the kernel sketch: the Main's empty cycle, a parent
    that fans out to 8 workers, a worker that waits."""

    async def inbox(h: Handle) -> None:
        return None

    async def parent(h: Handle) -> str:
        results = await h.fan_out([h.task] * FANOUT, "work")
        return str(sum(1 for r in results if r.ok))

    async def work(h: Handle) -> str:
        await asyncio.sleep(float(h.task))
        return "ok"

    return {"inbox": inbox, "parent": parent, "work": work}


@dataclass
class Sketch(System):
    """The kernel sketch (``_kernel_sketch.py``): in memory, or with a store in a
    new directory under ``base``; run under the node's collector settings."""

    name: str
    base: str | None = None
    store: Store | None = field(default=None, init=False)
    directory: str | None = field(default=None, init=False)

    async def start(self) -> None:
        if self.name.endswith("/store"):
            assert self.base is not None
            self.directory = tempfile.mkdtemp(prefix="sketch-", dir=self.base)
            self.store = Store(self.directory)
        self.kernel = Kernel(
            sketch_skills(),
            "inbox",
            store=self.store,
            max_children=2 * TREES_AT_ONCE,
            slots=(FANOUT + 1) * TREES_AT_ONCE + 100,
        )
        self.main = await self.kernel.main("peers")

    async def tree(self, wait: float) -> None:
        result = await self.kernel.run(self.main, SessionKind.BRANCH, "parent", repr(wait))
        if not result.ok or result.summary != str(FANOUT):
            raise RuntimeError(f"{self.name}: {result}")

    async def settle(self) -> None:
        while self.kernel.cycling:
            await asyncio.gather(*self.kernel.cycling.values())

    async def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def make_system(name: str, base: str | None, node_gc: GcSettings) -> System:
    if name in SKETCH_SYSTEMS:
        return SameGc(Sketch(name, base), node_gc, name=name)
    if name.endswith(SAME_GC):
        return SameGc(make_system(name.removesuffix(SAME_GC), base, node_gc), node_gc)
    if name == ASYNCIO:
        return Gather()
    if name == LANGGRAPH:
        return LangGraph()
    return Sessiontree(name, base)


Make = Callable[[str], System]


async def on_fresh(system: System, run: Callable[[System], Awaitable[Any]]) -> Any:
    """``run(system)`` on ``system`` (a fresh instance), closed after."""
    await system.start()
    try:
        gc.collect()
        return await run(system)
    finally:
        await system.close()


# -- the three measurements ---------------------------------------------------------------


class GcClock:
    """Wall seconds the cyclic garbage collector ran (any thread) while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


async def cpu_round(system: System, trees: int, warmup: int) -> tuple[float, float]:
    """CPU µs and wall µs per sub-task over ``trees`` sequential no-wait trees."""
    for _ in range(warmup):
        await system.tree(0.0)
    await system.settle()
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(trees):
        await system.tree(0.0)
    await system.settle()
    c1, t1 = time.process_time(), time.perf_counter()
    per = 1e6 / (trees * FANOUT)
    return (c1 - c0) * per, (t1 - t0) * per


async def throughput_round(system: System, trees: int, wait: float) -> tuple[float, float, float]:
    """Sub-tasks/s with ``trees`` trees started at once; CPU µs per sub-task;
    the share of the wall time the garbage collector ran."""
    await asyncio.gather(*(system.tree(wait) for _ in range(trees // 10)))  # warm-up
    await system.settle()
    gc.collect()
    with GcClock() as collector:
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(system.tree(wait) for _ in range(trees)))
        t1, c1 = time.perf_counter(), time.process_time()
    await system.settle()
    elapsed = t1 - t0
    return trees * FANOUT / elapsed, (c1 - c0) * 1e6 / (trees * FANOUT), collector.seconds / elapsed


async def latency_round(system: System, trees: int, wait: float) -> list[float]:
    """Added milliseconds of ``trees`` sequential trees (wall time - ``wait``)."""
    for _ in range(5):
        await system.tree(wait)
    gc.collect()
    samples = []
    for _ in range(trees):
        t0 = time.perf_counter()
        await system.tree(wait)
        samples.append((time.perf_counter() - t0 - wait) * 1000.0)
    return samples


async def measure_cpu(
    systems: list[str], make: Make, trees: int, rounds: int
) -> dict[str, dict[str, float]]:
    cpu: dict[str, list[float]] = {name: [] for name in systems}
    wall: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(rounds):
        for name in systems:
            c, w = await on_fresh(make(name), lambda s: cpu_round(s, trees, max(10, trees // 20)))
            cpu[name].append(c)
            wall[name].append(w)
            log(f"  cpu round {r + 1}/{rounds} {name}: {c:.1f} us cpu, {w:.1f} us wall / sub-task")
    return {
        name: {
            "cpu_us": statistics.median(cpu[name]),
            "cpu_us_min": min(cpu[name]),
            "wall_us": statistics.median(wall[name]),
        }
        for name in systems
    }


async def measure_throughput(
    systems: list[str], make: Make, trees: int, rounds: int
) -> dict[str, dict[str, float]]:
    rate: dict[str, list[float]] = {name: [] for name in systems}
    cpu: dict[str, list[float]] = {name: [] for name in systems}
    gcs: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(rounds):
        for name in systems:
            got, c, g = await on_fresh(make(name), lambda s: throughput_round(s, trees, WAIT))
            rate[name].append(got)
            cpu[name].append(c)
            gcs[name].append(g)
            log(
                f"  throughput round {r + 1}/{rounds} {name}: {got:,.0f} sub-tasks/s "
                f"({c:.1f} us cpu / sub-task, {g:.0%} of the wall time in gc)"
            )
    return {
        name: {
            "per_s": statistics.median(rate[name]),
            "cpu_us": statistics.median(cpu[name]),
            "gc_share": statistics.median(gcs[name]),
        }
        for name in systems
    }


async def measure_latency(
    systems: list[str], make: Make, trees: int, rounds: int
) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(rounds):
        for name in systems:
            got = await on_fresh(make(name), lambda s: latency_round(s, trees, WAIT))
            samples[name].extend(got)
            log(
                f"  latency round {r + 1}/{rounds} {name}: added p50 "
                f"{percentile(got, 50):.3f} ms, p99 {percentile(got, 99):.3f} ms"
            )
    return {
        name: {"p50_ms": percentile(s, 50), "p99_ms": percentile(s, 99), "n": len(s)}
        for name, s in samples.items()
    }


async def flushed_commits(system: System) -> int:
    """The commits of ``system``'s store once everything queued is committed
    (a flush with nothing queued commits nothing)."""
    if isinstance(system, SameGc):
        system = system.inner
    store = system.node.store if isinstance(system, Sessiontree) else None
    if isinstance(system, Sketch):
        store = system.store
    if store is None:
        raise RuntimeError(f"{system.name}: no store to count the commits of")
    await asyncio.to_thread(store.flush)
    return int(store.stats()["commits"])


async def commits_round(system: System, at_once: int, rounds: int, wait: float) -> float:
    """The store's commits per tree over ``rounds`` of ``at_once`` trees started
    together, counted until the node is idle after the last and the store flushed."""
    await asyncio.gather(*(system.tree(wait) for _ in range(at_once)))  # warm-up
    await system.settle()
    before = await flushed_commits(system)
    for _ in range(rounds):
        await asyncio.gather(*(system.tree(wait) for _ in range(at_once)))
    await system.settle()
    after = await flushed_commits(system)
    return (after - before) / (at_once * rounds)


async def measure_commits(
    systems: list[str], make: Make, t1_trees: int, t100_rounds: int
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in systems:
        if not (name.startswith("store/") or name == "sketch/store"):
            continue
        t1 = await on_fresh(make(name), lambda s: commits_round(s, 1, t1_trees, WAIT))
        t100 = await on_fresh(make(name), lambda s: commits_round(s, 100, t100_rounds, WAIT))
        out[name] = {"t1": t1, "t100": t100}
        log(f"  commits {name}: {t1:.3f} per tree one at a time, {t100:.3f} with 100 at once")
    return out


# -- the streamed variant -----------------------------------------------------------------


async def measure_stream(base: str | None, trees: int) -> dict[str, Any]:
    """Sequential trees of 8 streamed replies: bare SDK vs session, alternating."""
    from bench_models import REPLY, Standin, bare_call, bare_client  # noqa: PLC0415

    standin = Standin("process")
    out: dict[str, Any] = {}
    try:
        client = bare_client(standin.url)
        try:
            for where in ("memory", "store"):
                if where == "store" and base is None:
                    continue
                system = Sessiontree(f"{where}/stream_parent", base, url=standin.url)
                await system.start()
                bare: list[float] = []
                session: list[float] = []

                async def session_tree(system: Sessiontree = system) -> None:
                    await system.tree(0.0)

                async def bare_tree() -> None:
                    texts = await asyncio.gather(*(bare_call(client, True) for _ in range(FANOUT)))
                    if any(text != REPLY for text in texts):
                        raise RuntimeError("bare stream: unexpected reply")

                try:
                    for _ in range(5):
                        await bare_tree()
                        await system.tree(0.0)
                    gc.collect()
                    for i in range(trees):
                        runs = ((bare, bare_tree), (session, session_tree))
                        for samples, run in runs if i % 2 == 0 else runs[::-1]:
                            t0 = time.perf_counter()
                            await run()
                            samples.append((time.perf_counter() - t0) * 1000.0)
                finally:
                    await system.close()
                figures = {
                    "bare_p50_ms": percentile(bare, 50),
                    "bare_p99_ms": percentile(bare, 99),
                    "session_p50_ms": percentile(session, 50),
                    "session_p99_ms": percentile(session, 99),
                    "added_p50_ms": percentile(session, 50) - percentile(bare, 50),
                    "added_p99_ms": percentile(session, 99) - percentile(bare, 99),
                }
                log(
                    f"  stream {where} ({trees} trees each): bare tree p50 "
                    f"{figures['bare_p50_ms']:.2f} ms p99 {figures['bare_p99_ms']:.2f} ms; "
                    f"session tree p50 {figures['session_p50_ms']:.2f} ms p99 "
                    f"{figures['session_p99_ms']:.2f} ms"
                )
                out[where] = figures
        finally:
            await client.close()
    finally:
        standin.close()
    return out


# -- main ---------------------------------------------------------------------------------


def best(figures: dict[str, dict[str, float]], where: str, key: str, low: bool) -> float | None:
    """Sessiontree's best ``key`` of (fan_out, spawn_many) ``where`` (memory/store)."""
    values = [v[key] for name, v in figures.items() if name.startswith(where + "/")]
    if not values:
        return None
    return min(values) if low else max(values)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


async def run(args: argparse.Namespace, base: str | None) -> dict[str, Any]:
    systems = [s for s in args.systems.split(",") if s] if args.systems else list(SYSTEMS)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
    if base is None:
        systems = [s for s in systems if not s.startswith("store/")]
    only = set(args.only.split(",")) if args.only else {"cpu", "throughput", "latency", "commits"}
    quick = args.quick
    node_gc = await node_gc_settings()
    off = "" if node_gc.enabled else ", turns it off"
    frozen = ", freezes the heap" if node_gc.frozen else ""
    log(
        f"a node sets the collector's thresholds to {node_gc.thresholds}{off}{frozen} "
        f"(as found: {gc.get_threshold()}); the {SAME_GC[1:]} baselines run so"
    )
    out: dict[str, Any] = {"node_gc": node_gc}

    def make(name: str) -> System:
        return make_system(name, base, node_gc)

    if "cpu" in only:
        trees = args.trees or (150 if quick else 500)
        rounds = args.rounds or (3 if quick else 5)
        log(f"1. CPU per sub-task, no wait: {trees} sequential trees x {rounds} rounds")
        out["cpu"] = await measure_cpu(systems, make, trees, rounds)
        out["cpu_trees"] = trees
    if "throughput" in only:
        rounds = args.rounds or (1 if quick else 3)
        log(f"2. throughput: {TREES_AT_ONCE} trees at once, {WAIT:.3f} s wait, {rounds} rounds")
        out["throughput"] = await measure_throughput(systems, make, TREES_AT_ONCE, rounds)
    if "latency" in only:
        trees = args.latency_trees or (60 if quick else 200)
        rounds = args.rounds or (2 if quick else 5)
        log(f"3. added latency: {trees} sequential trees x {rounds} rounds, {WAIT:.3f} s wait")
        out["latency"] = await measure_latency(systems, make, trees, rounds)
    if "commits" in only:
        t1_trees = args.commit_trees or (40 if quick else 200)
        t100_rounds = 3 if quick else 10
        log(
            f"4. store commits per tree: {t1_trees} trees one at a time, then "
            f"{t100_rounds} rounds of 100 at once, {WAIT:.3f} s wait"
        )
        out["commits"] = await measure_commits(systems, make, t1_trees, t100_rounds)
    if args.stream:
        trees = 100 if quick else 400
        log(f"streamed: {trees} sequential trees of {FANOUT} streamed replies, each way")
        out["stream"] = await measure_stream(base, trees)
    return out


def key(name: str) -> str:
    """A system's name as a part of a JSON key: ``memory/fan_out`` → ``memory_fan_out``."""
    return name.replace("/", "_")


def summarise(got: dict[str, Any]) -> dict[str, Any]:
    cpu = got.get("cpu", {})
    thr = got.get("throughput", {})
    lat = got.get("latency", {})
    mem_cpu = best(cpu, "memory", "cpu_us", low=True)
    dur_cpu = best(cpu, "store", "cpu_us", low=True)
    lg_cpu = cpu.get(LANGGRAPH, {}).get("cpu_us")
    lg_cpu_gc = cpu.get(LANGGRAPH + SAME_GC, {}).get("cpu_us")
    aio_cpu = cpu.get(ASYNCIO, {}).get("cpu_us")
    aio_cpu_gc = cpu.get(ASYNCIO + SAME_GC, {}).get("cpu_us")
    mem_thr = best(thr, "memory", "per_s", low=False)
    mem_p50 = best(lat, "memory", "p50_ms", low=True)
    commits = got.get("commits", {})
    node_gc: GcSettings | None = got.get("node_gc")
    summary: dict[str, Any] = {
        "bench": "peers",
        "subtask_cpu_us_memory": None if mem_cpu is None else round(mem_cpu, 1),
        "subtask_cpu_us_durable": None if dur_cpu is None else round(dur_cpu, 1),
        "vs_langgraph_d0_memory": ratio(lg_cpu, mem_cpu),
        "vs_langgraph_d0_durable": ratio(lg_cpu, dur_cpu),
        "vs_asyncio_t1000": ratio(mem_thr, thr.get(ASYNCIO, {}).get("per_s")),
        "subtask_cpu_x_asyncio_memory": ratio(mem_cpu, aio_cpu_gc),
        "subtask_cpu_x_asyncio_durable": ratio(dur_cpu, aio_cpu_gc),
        "subtask_cpu_x_asyncio_memory_as_is": ratio(mem_cpu, aio_cpu),
        "subtask_cpu_x_asyncio_durable_as_is": ratio(dur_cpu, aio_cpu),
        "asyncio_cpu_us_as_is": rounded(aio_cpu, 2),
        "asyncio_cpu_us_same_gc": rounded(aio_cpu_gc, 2),
        "langgraph_cpu_us_as_is": rounded(lg_cpu, 1),
        "langgraph_cpu_us_same_gc": rounded(lg_cpu_gc, 1),
        "vs_langgraph_d0_memory_same_gc": ratio(lg_cpu_gc, mem_cpu),
        "vs_langgraph_d0_durable_same_gc": ratio(lg_cpu_gc, dur_cpu),
        "vs_asyncio_t1000_same_gc": ratio(mem_thr, thr.get(ASYNCIO + SAME_GC, {}).get("per_s")),
        "commits_per_tree_t1": rounded(best(commits, "store", "t1", low=True), 3),
        "commits_per_tree_t100": rounded(best(commits, "store", "t100", low=True), 3),
        "added_latency_p50_ms_over_asyncio": difference(
            mem_p50, lat.get(ASYNCIO, {}).get("p50_ms")
        ),
        "added_latency_p50_ms_over_asyncio_same_gc": difference(
            mem_p50, lat.get(ASYNCIO + SAME_GC, {}).get("p50_ms")
        ),
        "node_gc_thresholds": None if node_gc is None else list(node_gc.thresholds),
        "node_gc_enabled": None if node_gc is None else node_gc.enabled,
        "node_gc_frozen": None if node_gc is None else node_gc.frozen,
        "added_latency_p99_ms": (
            None if (v := best(lat, "memory", "p99_ms", low=True)) is None else round(v, 3)
        ),
        "added_latency_p99_ms_durable": (
            None if (v := best(lat, "store", "p99_ms", low=True)) is None else round(v, 3)
        ),
        "langgraph": version("langgraph"),
        "python": ".".join(map(str, sys.version_info[:3])),
        "sessiontree": version("sessiontree"),
        "fanout": FANOUT,
        "wait_ms": WAIT * 1000,
        "trees_at_once": TREES_AT_ONCE,
        "cpu_trees": got.get("cpu_trees"),
    }
    for name, v in cpu.items():
        summary[f"subtask_cpu_us_{key(name)}"] = round(v["cpu_us"], 1)
        summary[f"subtask_wall_us_{key(name)}"] = round(v["wall_us"], 1)
    for name, v in thr.items():
        summary[f"t1000_subtasks_per_s_{key(name)}"] = round(v["per_s"], 1)
        summary[f"t1000_cpu_us_{key(name)}"] = round(v["cpu_us"], 1)
        summary[f"t1000_gc_share_{key(name)}"] = round(v["gc_share"], 3)
    for name, v in lat.items():
        summary[f"added_latency_p50_ms_{key(name)}"] = round(v["p50_ms"], 3)
        summary[f"added_latency_p99_ms_{key(name)}"] = round(v["p99_ms"], 3)
    for name, v in commits.items():
        summary[f"commits_per_tree_t1_{key(name)}"] = round(v["t1"], 3)
        summary[f"commits_per_tree_t100_{key(name)}"] = round(v["t100"], 3)
    summary["vs_langgraph_t1000"] = ratio(mem_thr, thr.get(LANGGRAPH, {}).get("per_s"))
    for where, v in got.get("stream", {}).items():
        for figure, value in v.items():
            summary[f"stream_{where}_{figure}"] = round(value, 3)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trees and rounds")
    parser.add_argument("--dir", help="where the LMDB stores go (a real disk; default: tmp)")
    parser.add_argument("--stream", action="store_true", help="also the streamed variant")
    parser.add_argument("--systems", help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    parser.add_argument(
        "--only", help="comma-separated subset of cpu, throughput, latency, commits"
    )
    parser.add_argument("--trees", type=int, help="sequential trees per CPU round (500; quick 150)")
    parser.add_argument("--latency-trees", type=int, help="trees per latency round (200; quick 60)")
    parser.add_argument("--commit-trees", type=int, help="trees one at a time (200; quick 40)")
    parser.add_argument("--rounds", type=int, help="rounds of every measurement")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    log(
        f"bench_peers: langgraph {version('langgraph')}, python {sys.version.split()[0]}, "
        f"pid {os.getpid()}, {os.cpu_count()} cpus"
    )
    slowdown = idle_slowdown()
    log(f"the same Python work takes {slowdown:.2f}x as long right after a {WAIT:.3f} s sleep")
    disk = real_disk_dir("bench-peers", args.dir)
    base, fstype = disk if disk is not None else (None, None)
    fsync = None
    try:
        if base is not None:
            fsync = fdatasync_ms(base)
            log(f"stores in {base} ({fstype}; fdatasync {fsync:.3f} ms)")
        got = asyncio.run(run(args, base))
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
    summary = summarise(got)
    summary.update(
        {
            "store_filesystem": fstype,
            "fsync_ms": None if fsync is None else round(fsync, 3),
            "idle_slowdown": round(slowdown, 2),
            "quick": args.quick,
            "cpus": os.cpu_count(),
            "loadavg_1m_before": round(load_before, 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
            "wall_s": round(time.perf_counter() - started, 1),
        }
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
