"""Benchmark: the paper's Tables 6.1 and 6.2 with simulated sub-agents.

    python benchmarks/bench_paper.py [--quick]

The four task types of the paper, with the paper's own sequential times
(scaled 1 min -> 100 ms, each latency multiplied by a seeded factor uniform
in [0.8, 1.2]):

=================  ==============================  ===================  ========
task               parallel sub-tasks              then                 in all
=================  ==============================  ===================  ========
Research           5 sources x 2.2 min             1.5 min synthesis    12.5 min
Code Review        4 checks x 2.0 min              0.3 min aggregation   8.3 min
Data Processing    10 chunks x 2.3 min (map)       2.1 min reduce       25.1 min
Document Analysis  6 sections x 2.3 min            1.4 min synthesis    15.2 min
=================  ==============================  ===================  ========

A simulated sub-agent of latency ``L`` spends 10 % of ``L`` on CPU work that
releases the GIL — ``hashlib.sha256`` over a shared 1 MiB buffer fed
repeatedly, the byte count from a rate calibrated once at start, so the CPU
part is work, never a sleep — and waits the rest (a model call). It does so
in ``--rounds`` turns (default 10), each a wait and then the hashing of its
share (processing the answer), every wait running to the turn's deadline on
the agent's own schedule (``start + k x L / rounds``), so the agent takes
``L`` whenever its CPU parts get a core in time. Why turns and deadlines:
this machine may have 2 cores for 8 concurrent children; one 10 % CPU block
per agent makes 8 agents that start together queue for the cores, and that
hardware queueing — which the plain thread-pool control below suffers just
as much — would be charged to the runtime (``--rounds 1`` gives the single
block: a wait of 0.9 ``L``, then the hashing). How late the sub-agents were
against their latency is reported (``overrun_ms_*``).

What it measures, per task type (the keys of the last stdout line, one JSON
object):

* ``sequential_s`` — a plain loop calling the same sub-agent function for
  every sub-task and then the synthesis (no runtime, no thread): wall time.
* ``parallel_s`` — the same through sessiontree: ``main.run`` of a lead
  Branch under the agent's Main, the lead running the sub-tasks as Worker
  children (at most 8 at once: ``Agent.max_children`` = 8; the rest queue)
  and then the synthesis as one more Worker child — ``session.pipeline`` for
  Research, Code Review and Document Analysis (stage 1: the sub-tasks in
  parallel, stage 2: the synthesis, seeded with their results) and
  ``session.map_reduce`` (batch size 1) for Data Processing. Wall time of
  ``main.run`` (spawn of the lead, the whole tree, the result back).
* ``speedup`` = sequential / parallel; ``ideal_speedup`` = the sum of the
  latencies / the critical path: the sub-task latencies list-scheduled in
  task order on at most 8 slots, plus the synthesis latency;
  ``ratio_to_ideal`` = speedup / ideal speedup.

Medians over the repetitions; the plain loop and the sessiontree runs
alternate within every repetition (loop, then a fresh node with sync
skills, then a fresh node with async skills, then the thread-pool control),
so a noisy machine hits them all. One unmeasured warm-up run of each first.

Two flavours of skill run the same simulated sub-agents, and both are
reported (``variants``); the headline ``tasks`` / ``compute_ratio`` are the
flavour with the lower compute overhead (``variant`` names it):

* ``sync`` — plain functions on the node's step threads: the very function
  the loop calls (waits with ``time.sleep``, hashes on its own thread).
* ``async`` — ``async def`` skills on the node's event loop: each wait is
  ``await session.sleep(...)`` on the node's clock (no thread held), each
  hashing share runs in a thread pool (``loop.run_in_executor``; hashing on
  the loop thread would stall every other session). Each turn thus costs
  two cross-thread wake-ups the sync flavour does not pay.

Over the whole run:

* ``compute_ratio`` — process CPU seconds (``time.process_time``: every
  thread of the process) of the sessiontree runs / those of the plain loop,
  summed over all repetitions. The sessiontree side is measured around each
  ``main.run`` only: the node is built, and its Main created, before the
  window opens, and shut down after it closes; the same ratio with node
  start-up and shutdown included is ``compute_ratio_with_node_lifecycle``.
  ``overhead_pct`` = (compute_ratio - 1) x 100. Hashing the same bytes costs
  a few % more or less CPU from run to run and with concurrency (caches,
  clock speed), enough to hide or double the runtime's share, so the thread
  CPU of every hashing call is counted too and
  ``hash_normalised_compute_ratio`` charges hashing at the plain loop's
  cost: (loop CPU + the extra non-hashing CPU) / loop CPU. For attribution,
  ``threadpool_*`` is the same sub-agents run from a plain
  ``ThreadPoolExecutor(8)`` in the same order (no runtime).
* ``peak_memory_ratio`` — peak RSS of a fresh subprocess while it runs the
  four sessiontree tasks once / that of a fresh subprocess while it runs the
  plain loop once. Both import the same modules (this script, hence
  sessiontree) and allocate the same hash buffer first, and the kernel's
  high-water mark (VmHWM) is reset right before the part (``ru_maxrss``
  alone would report the start-up peak, higher than either part), so the
  ratio is what running the tree adds to the same process, not the cost of
  importing the library. ``peak_rss_added_bytes`` is that addition; each
  subprocess also reports the ``tracemalloc`` peak of a second pass of its
  part (Python allocations only, traced after the RSS was read).

The heavy-tail variant (``benchmarks/_heavy_tail.py``): paired fan-outs of
8 workers with lognormal latencies (median 1 s, sigma 1, seeded) on a
virtual clock, plain and with ``fan_out(hedge=Hedge(after=p95))``;
``hedged_p99_ratio`` = the hedged makespans' 99th percentile / the plain
ones' (``heavy_tail`` holds the figures; 500 pairs with ``--quick``, 2,000
in full).

``recording_cpu_ratio`` — the four tasks run with ``record=True`` (every
sub-agent's spawns, takes and ends on tapes, the recording kept in memory)
against the same tasks unrecorded, on the headline variant, alternated
``max(reps, 3)`` times: recorded CPU / unrecorded CPU inside the run
windows. ``recording_runtime_cpu_ratio`` is the same with the hashing
(the sub-agents' own work) taken out of both: what recording adds to the
runtime's own share.

``--quick``: one repetition at 1 min -> 20 ms (``"quick_sizes": true``): a
fixed few ms of spawn round trips weigh five times more against the
shorter critical paths there, so the ratios to the ideal are lower than in
the full run; ``--quick --scale 0.1`` keeps the target sizes. The full run
is five repetitions at 1 min -> 100 ms (about 1.5 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from _common import log
from _heavy_tail import heavy_tail

from sessiontree.supervision import Agent, Node, NodeConfig

SEED = 20240601
MAX_CHILDREN = 8
CPU_SHARE = 0.10  # of every sub-agent's latency, spent hashing
CHUNK = 1 << 20  # bytes per hashlib update (the GIL is released while it hashes)
BUF = bytes(random.Random(SEED).getrandbits(8) for _ in range(4096)) * (CHUNK // 4096)
VIEW = memoryview(BUF)
RUN_TIMEOUT = 300.0
ROUNDS = 10  # turns per sub-agent (--rounds)


@dataclass(frozen=True)
class TaskType:
    name: str
    unit: str  # what one parallel sub-task is called
    final: str  # what the last step is called
    subtasks: int
    sub_min: float  # paper minutes per sub-task
    final_min: float  # paper minutes of the last step
    pattern: str  # "pipeline" or "map_reduce"


TASK_TYPES = (
    TaskType("Research", "source", "synthesis", 5, 2.2, 1.5, "pipeline"),
    TaskType("Code Review", "check", "aggregation", 4, 2.0, 0.3, "pipeline"),
    TaskType("Data Processing", "chunk", "reduce", 10, 2.3, 2.1, "map_reduce"),
    TaskType("Document Analysis", "section", "synthesis", 6, 2.3, 1.4, "pipeline"),
)


@dataclass(frozen=True)
class Plan:
    """One task type with its seeded latencies (seconds)."""

    kind: TaskType
    sub: tuple[float, ...]
    final: float

    @property
    def total(self) -> float:
        return sum(self.sub) + self.final

    def critical_path(self, slots: int = MAX_CHILDREN) -> float:
        return list_schedule(self.sub, slots) + self.final

    def sub_tasks(self) -> list[str]:
        return [f"{self.kind.unit} {i + 1} | {lat:.6f}" for i, lat in enumerate(self.sub)]

    def final_task(self) -> str:
        return f"{self.kind.final} | {self.final:.6f}"


def make_plans(scale: float, seed: int = SEED) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for kind in TASK_TYPES:
        sub = tuple(kind.sub_min * scale * rng.uniform(0.8, 1.2) for _ in range(kind.subtasks))
        final = kind.final_min * scale * rng.uniform(0.8, 1.2)
        plans.append(Plan(kind, sub, final))
    return plans


def list_schedule(latencies: Sequence[float], slots: int) -> float:
    """Makespan of greedy list scheduling in task order on ``slots`` slots."""
    free = [0.0] * min(slots, max(1, len(latencies)))
    for lat in latencies:
        i = min(range(len(free)), key=free.__getitem__)
        free[i] += lat
    return max(free) if latencies else 0.0


# -- the simulated sub-agent ----------------------------------------------------------


class Burner:
    """CPU work that releases the GIL: sha256 over ``nbytes`` of a shared buffer."""

    def __init__(self, rate: float) -> None:
        self.rate = rate  # bytes hashed per CPU second, calibrated
        self.lock = threading.Lock()
        self.overrun: list[float] = []  # seconds a sub-agent took past its latency
        self.hash_cpu = 0.0  # thread CPU seconds spent hashing (always counted)
        self.record = False

    @staticmethod
    def calibrate(nbytes: int = 64 * CHUNK, rounds: int = 5) -> float:
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            burn(nbytes)
            best = min(best, time.perf_counter() - t0)
        return nbytes / best

    def nbytes(self, latency: float) -> int:
        return int(self.rate * CPU_SHARE * latency)

    def note(self, latency: float, took: float) -> None:
        if not self.record:
            return
        with self.lock:
            self.overrun.append(took - latency)

    def hash(self, h: Any, nbytes: int) -> None:
        """``burn_into``, its thread CPU time added to ``hash_cpu``."""
        t0 = time.thread_time()
        burn_into(h, nbytes)
        spent = time.thread_time() - t0
        with self.lock:
            self.hash_cpu += spent

    def take_hash_cpu(self) -> float:
        with self.lock:
            spent, self.hash_cpu = self.hash_cpu, 0.0
        return spent


def burn_into(h: Any, nbytes: int) -> None:
    full, rem = divmod(nbytes, CHUNK)
    for _ in range(full):
        h.update(BUF)
    if rem:
        h.update(VIEW[:rem])


def burn(nbytes: int) -> str:
    h = hashlib.sha256()
    burn_into(h, nbytes)
    return h.hexdigest()


BURNER = Burner(rate=1.0)  # replaced at start-up by a calibrated one


def subagent_work(latency: float) -> str:
    """The sub-agent as a plain function: ``ROUNDS`` turns, each a wait (a model
    call) and then hashing (processing its answer), 10 % of ``latency`` hashing in all."""
    start = time.perf_counter()
    rounds = ROUNDS
    turn, cpu = latency / rounds, CPU_SHARE * latency / rounds
    nbytes = BURNER.nbytes(latency) // rounds
    h = hashlib.sha256()
    for k in range(rounds):
        rest = start + k * turn + (turn - cpu) - time.perf_counter()
        if rest > 0:
            time.sleep(rest)
        BURNER.hash(h, nbytes)
    BURNER.note(latency, time.perf_counter() - start)
    return h.hexdigest()[:16]


def latency_of(task: str) -> float:
    return float(task.rsplit("|", 1)[1])


# -- sessiontree skills --------------------------------------------------------------------

PLANS_BY_NAME: dict[str, Plan] = {}
CPU_POOL: ThreadPoolExecutor | None = None  # the async skills' hashing threads


def sub_sync(session: Any) -> str:
    return subagent_work(latency_of(session.task))


async def sub_async(session: Any) -> str:
    """``subagent_work`` as an async skill: the waits on the node's clock, the hashing
    in a thread pool (on the loop thread it would stall every other session)."""
    latency = latency_of(session.task)
    start = time.perf_counter()
    rounds = ROUNDS
    turn, cpu = latency / rounds, CPU_SHARE * latency / rounds
    nbytes = BURNER.nbytes(latency) // rounds
    loop = asyncio.get_running_loop()
    h = hashlib.sha256()
    for k in range(rounds):
        rest = start + k * turn + (turn - cpu) - time.perf_counter()
        if rest > 0:
            await session.sleep(rest)
        await loop.run_in_executor(CPU_POOL, BURNER.hash, h, nbytes)
    BURNER.note(latency, time.perf_counter() - start)
    return h.hexdigest()[:16]


def _lead_args(plan: Plan, skill: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """The pattern a lead runs for ``plan``: name, positional args, options."""
    if plan.kind.pattern == "map_reduce":
        items = [{"chunk": i + 1, "latency": round(lat, 6)} for i, lat in enumerate(plan.sub)]

        def map_task(batch: list[dict[str, Any]]) -> str:
            return f"map chunk {batch[0]['chunk']} | {batch[0]['latency']:.6f}"

        args = (items, map_task, plan.final_task())
        return "map_reduce", args, {"batch_size": 1, "skill": skill, "kind": "worker"}
    stages: list[Any] = [plan.sub_tasks(), plan.final_task()]
    return "pipeline", (stages,), {"skill": skill, "kind": "worker"}


def _checked(gathered: Any, plan: Plan) -> Any:
    if not gathered.ok:
        msg = f"{plan.kind.name}: {gathered.status} {gathered.diagnostics}"
        raise RuntimeError(msg)
    return gathered.to_outcome()


def lead_sync(session: Any) -> Any:
    plan = PLANS_BY_NAME[session.task]
    name, args, options = _lead_args(plan, "sub")
    return _checked(getattr(session, name)(*args, **options), plan)


async def lead_async(session: Any) -> Any:
    plan = PLANS_BY_NAME[session.task]
    name, args, options = _lead_args(plan, "sub")
    return _checked(await getattr(session, name)(*args, **options), plan)


def make_agent(variant: str) -> Agent:
    if variant == "sync":
        skills: dict[str, Callable[[Any], Any]] = {"lead": lead_sync, "sub": sub_sync}
    else:
        skills = {"lead": lead_async, "sub": sub_async}
    return Agent("paper", {"main": lambda s: None, **skills}, max_children=MAX_CHILDREN)


# -- the ways of running a task --------------------------------------------------------


@dataclass
class Measure:
    wall: list[float]  # seconds, one per repetition


def run_sequential(plans: Sequence[Plan], out: dict[str, Measure]) -> float:
    """The plain loop; returns its process CPU seconds."""
    cpu_total = 0.0
    for plan in plans:
        c0, t0 = time.process_time(), time.perf_counter()
        for lat in plan.sub:
            subagent_work(lat)
        subagent_work(plan.final)
        t1, c1 = time.perf_counter(), time.process_time()
        out[plan.kind.name].wall.append(t1 - t0)
        cpu_total += c1 - c0
    return cpu_total


def run_node(
    plans: Sequence[Plan], variant: str, out: dict[str, Measure], *, record: bool = False
) -> tuple[float, float]:
    """All task types on one fresh node (``record``: each task's tree recorded);
    (CPU inside the run windows, CPU with node lifecycle)."""
    cpu_runs = 0.0
    life0 = time.process_time()
    with Node([make_agent(variant)], NodeConfig()) as node:
        main = node.main("paper")
        for plan in plans:
            c0, t0 = time.process_time(), time.perf_counter()
            result = main.run(
                kind="branch",
                skill="lead",
                task=plan.kind.name,
                record=record,
                timeout=RUN_TIMEOUT,
            )
            t1, c1 = time.perf_counter(), time.process_time()
            if result is None or not result.ok:
                msg = f"{variant} {plan.kind.name}: {result}"
                raise RuntimeError(msg)
            out[plan.kind.name].wall.append(t1 - t0)
            cpu_runs += c1 - c0
    return cpu_runs, time.process_time() - life0


def run_threadpool(
    plans: Sequence[Plan], pool: ThreadPoolExecutor, out: dict[str, Measure]
) -> float:
    """The sub-agents from a plain 8-thread pool (no runtime), then the final step."""
    cpu_total = 0.0
    for plan in plans:
        c0, t0 = time.process_time(), time.perf_counter()
        list(pool.map(subagent_work, plan.sub))
        subagent_work(plan.final)
        t1, c1 = time.perf_counter(), time.process_time()
        out[plan.kind.name].wall.append(t1 - t0)
        cpu_total += c1 - c0
    return cpu_total


# -- peak memory: one fresh subprocess per part ------------------------------------------


def _status_kib(field: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def memory_part(part: str, scale: float, rate: float, rounds: int) -> dict[str, Any]:
    """Run one part once in this fresh process: its peak RSS, then a traced pass.

    The high-water mark is reset right before the part (imports and start-up
    peak higher than a small part would, and ``ru_maxrss`` never goes down),
    so ``peak_rss_bytes`` is the process's peak RSS while the part ran:
    interpreter, modules and buffer included, the same in both processes.
    """
    global BURNER, CPU_POOL, ROUNDS  # noqa: PLW0603 - this process does nothing else
    BURNER, ROUNDS = Burner(rate), rounds
    CPU_POOL = ThreadPoolExecutor(max_workers=MAX_CHILDREN, thread_name_prefix="cpu")
    plans = make_plans(scale)
    PLANS_BY_NAME.update({p.kind.name: p for p in plans})
    sink = {p.kind.name: Measure([]) for p in plans}

    def once() -> None:
        if part == "sequential":
            run_sequential(plans, sink)
        else:
            run_node(plans, part, sink)

    reset = _reset_peak_rss()
    rss_before = _status_kib("VmRSS") * 1024
    once()
    if reset:
        rss_peak = _status_kib("VmHWM") * 1024
    else:  # no reset: the whole process's peak, start-up included
        rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    once()
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    CPU_POOL.shutdown()
    return {
        "part": part,
        "hwm_reset": reset,
        "rss_before_bytes": rss_before,
        "peak_rss_bytes": rss_peak,
        "tracemalloc_peak_bytes": traced_peak,
    }


def measure_memory(part: str, scale: float, rate: float) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-part", part]
    cmd += ["--scale", repr(scale), "--rate", repr(rate), "--rounds", str(ROUNDS)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


# -- main ------------------------------------------------------------------------------


def measure_recording(plans: Sequence[Plan], variant: str, rounds: int) -> dict[str, Any]:
    """The tasks on ``variant`` recorded and not, alternated ``rounds`` times."""
    assert BURNER is not None
    cpu = {"plain": 0.0, "recorded": 0.0}
    hashing = dict.fromkeys(cpu, 0.0)
    for _ in range(rounds):
        for part in ("plain", "recorded"):
            sink = {p.kind.name: Measure([]) for p in plans}
            BURNER.take_hash_cpu()
            runs, _life = run_node(plans, variant, sink, record=part == "recorded")
            cpu[part] += runs
            hashing[part] += BURNER.take_hash_cpu()
    own = {part: cpu[part] - hashing[part] for part in cpu}
    return {
        "recording_cpu_ratio": round(cpu["recorded"] / cpu["plain"], 4),
        "recording_runtime_cpu_ratio": round(own["recorded"] / own["plain"], 4),
        "rounds": rounds,
        "cpu_s": {part: round(value, 4) for part, value in cpu.items()},
        "runtime_cpu_s": {part: round(value, 4) for part, value in own.items()},
    }


def overrun_ms(values: list[float]) -> dict[str, float]:
    """How long sub-agents took past their latency (timer and scheduling slack, CPU queueing)."""
    ms = [v * 1e3 for v in values] or [0.0]
    return {
        "overrun_ms_median": round(statistics.median(ms), 3),
        "overrun_ms_max": round(max(ms), 3),
    }


def summarise(
    plans: Sequence[Plan], seq: dict[str, Measure], par: dict[str, Measure]
) -> list[dict[str, Any]]:
    rows = []
    for plan in plans:
        name = plan.kind.name
        s = statistics.median(seq[name].wall)
        p = statistics.median(par[name].wall)
        ideal = plan.total / plan.critical_path()
        rows.append(
            {
                "task": name,
                "subtasks": plan.kind.subtasks,
                "sequential_s": round(s, 4),
                "parallel_s": round(p, 4),
                "speedup": round(s / p, 3),
                "ideal_speedup": round(ideal, 3),
                "ratio_to_ideal": round(s / p / ideal, 4),
                "latency_sum_s": round(plan.total, 4),
                "critical_path_s": round(plan.critical_path(), 4),
                "parallel_min_s": round(min(par[name].wall), 4),
                "parallel_max_s": round(max(par[name].wall), 4),
            }
        )
    return rows


def main() -> None:
    global BURNER, CPU_POOL, ROUNDS  # noqa: PLW0603 - set once at start-up
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repetition at 1 min -> 20 ms")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 5, quick 1)")
    parser.add_argument("--scale", type=float, default=None, help="seconds per paper minute")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns per sub-agent")
    parser.add_argument(
        "--memory-part", choices=("sequential", "sync", "async"), help=argparse.SUPPRESS
    )
    parser.add_argument("--rate", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    scale = args.scale if args.scale is not None else (0.020 if args.quick else 0.100)

    if args.memory_part:
        print(
            json.dumps(
                memory_part(args.memory_part, scale, args.rate or Burner.calibrate(), args.rounds)
            )
        )
        return

    ROUNDS = args.rounds
    reps = args.reps if args.reps is not None else (1 if args.quick else 5)
    started = time.perf_counter()
    rate = Burner.calibrate()
    BURNER = Burner(rate)
    log(f"sha256 calibrated at {rate / 1e9:.2f} GB/s (1 MiB updates); {os.cpu_count()} CPUs")
    CPU_POOL = ThreadPoolExecutor(max_workers=MAX_CHILDREN, thread_name_prefix="cpu")
    control_pool = ThreadPoolExecutor(max_workers=MAX_CHILDREN, thread_name_prefix="control")
    plans = make_plans(scale)
    PLANS_BY_NAME.update({p.kind.name: p for p in plans})
    for plan in plans:
        log(
            f"{plan.kind.name:18s} {plan.kind.subtasks:2d} x "
            f"~{plan.kind.sub_min * scale * 1e3:.0f} ms "
            f"+ {plan.final * 1e3:.0f} ms: latency sum {plan.total:.3f} s, "
            f"critical path {plan.critical_path():.3f} s, ideal speedup "
            f"{plan.total / plan.critical_path():.2f}"
        )

    # Warm-up (imports, thread pools, first node), not measured.
    warm = {p.kind.name: Measure([]) for p in plans}
    run_node(plans[:1], "sync", warm)
    run_node(plans[:1], "async", warm)
    run_threadpool(plans[:1], control_pool, warm)

    names = [p.kind.name for p in plans]
    seq = {n: Measure([]) for n in names}
    par = {v: {n: Measure([]) for n in names} for v in ("sync", "async")}
    pool = {n: Measure([]) for n in names}
    cpu = {"sequential": 0.0, "sync": 0.0, "async": 0.0, "threadpool": 0.0}
    cpu_life = {"sync": 0.0, "async": 0.0}
    hashing = dict.fromkeys(cpu, 0.0)  # of which hashing (thread CPU around each hash)
    overrun: dict[str, list[float]] = {v: [] for v in ("sequential", "sync", "async", "threadpool")}

    for rep in range(reps):
        t_rep = time.perf_counter()
        BURNER.overrun, BURNER.record = overrun["sequential"], True
        BURNER.take_hash_cpu()
        cpu["sequential"] += run_sequential(plans, seq)
        hashing["sequential"] += BURNER.take_hash_cpu()
        for variant in ("sync", "async"):
            BURNER.overrun, BURNER.record = overrun[variant], True
            runs, life = run_node(plans, variant, par[variant])
            BURNER.record = False
            cpu[variant] += runs
            cpu_life[variant] += life
            hashing[variant] += BURNER.take_hash_cpu()
        BURNER.overrun, BURNER.record = overrun["threadpool"], True
        cpu["threadpool"] += run_threadpool(plans, control_pool, pool)
        hashing["threadpool"] += BURNER.take_hash_cpu()
        BURNER.record = False
        log(
            f"rep {rep + 1}/{reps} in {time.perf_counter() - t_rep:.1f} s: cpu seq "
            f"{cpu['sequential']:.3f} s, sync {cpu['sync']:.3f} s, async {cpu['async']:.3f} s, "
            f"threadpool {cpu['threadpool']:.3f} s (cumulative)"
        )

    def normalised(part: str) -> float:
        """The compute ratio with hashing counted at the plain loop's cost: hashing the
        same bytes costs a few % less or more CPU from run to run and with concurrency
        (caches, clock speed), which the plain ratio mixes into the runtime's share."""
        extra = (cpu[part] - hashing[part]) - (cpu["sequential"] - hashing["sequential"])
        return (cpu["sequential"] + extra) / cpu["sequential"]

    variants: dict[str, Any] = {}
    for variant in ("sync", "async"):
        rows = summarise(plans, seq, par[variant])
        ratio = cpu[variant] / cpu["sequential"]
        variants[variant] = {
            "tasks": rows,
            "min_ratio_to_ideal": min(r["ratio_to_ideal"] for r in rows),
            "compute_ratio": round(ratio, 4),
            "overhead_pct": round((ratio - 1) * 100, 2),
            "compute_ratio_with_node_lifecycle": round(cpu_life[variant] / cpu["sequential"], 4),
            "cpu_s": round(cpu[variant], 4),
            "hash_cpu_s": round(hashing[variant], 4),
            "hash_normalised_compute_ratio": round(normalised(variant), 4),
            "hash_normalised_overhead_pct": round((normalised(variant) - 1) * 100, 2),
            **overrun_ms(overrun[variant]),
        }
        log(
            f"\n{variant} skills: compute ratio {ratio:.4f} (hash-normalised "
            f"{normalised(variant):.4f}; CPU {cpu[variant]:.3f} s, of it hashing "
            f"{hashing[variant]:.3f} s; plain loop {cpu['sequential']:.3f} s, of it hashing "
            f"{hashing['sequential']:.3f} s)"
        )
        log(
            f"{'task':18s} {'n':>3s} {'seq s':>8s} {'par s':>8s} {'speedup':>8s} "
            f"{'ideal':>7s} {'ratio':>7s}"
        )
        for r in rows:
            log(
                f"{r['task']:18s} {r['subtasks']:3d} {r['sequential_s']:8.3f} "
                f"{r['parallel_s']:8.3f} "
                f"{r['speedup']:8.2f} {r['ideal_speedup']:7.2f} {r['ratio_to_ideal']:7.3f}"
            )
    pool_rows = summarise(plans, seq, pool)
    CPU_POOL.shutdown()
    control_pool.shutdown()

    log("\npeak memory: one fresh subprocess per part ...")
    mem = {part: measure_memory(part, scale, rate) for part in ("sequential", "sync", "async")}
    for part, m in mem.items():
        log(
            f"  {part:10s} peak RSS {m['peak_rss_bytes'] / 2**20:7.1f} MiB "
            f"(after imports {m['rss_before_bytes'] / 2**20:.1f} MiB), "
            f"tracemalloc peak {m['tracemalloc_peak_bytes'] / 1024:.0f} KiB"
        )

    log("heavy tail: paired fan-outs of 8 on a virtual clock, plain and hedged")
    tail = heavy_tail(500 if args.quick else 2000, SEED)
    log(
        f"  makespan p99 {tail['makespan_p99_s']} s plain, {tail['hedged_makespan_p99_s']} s "
        f"hedged ({tail['duplicates_per_fanout']} duplicates a fan-out)"
    )
    best = min(("sync", "async"), key=lambda v: cpu[v])
    chosen = variants[best]
    log(f"recording: {best} tasks recorded and not, alternated")
    recording = measure_recording(plans, best, max(reps, 3))
    log(
        f"  CPU recorded / unrecorded {recording['recording_cpu_ratio']}, "
        f"runtime's share alone {recording['recording_runtime_cpu_ratio']}"
    )
    seq_rss = mem["sequential"]["peak_rss_bytes"]
    elapsed = time.perf_counter() - started
    log(f"\nheadline variant: {best} (lower compute overhead); {elapsed:.1f} s in all")
    avg_speedup = statistics.mean(r["speedup"] for r in chosen["tasks"])
    out = {
        "bench": "paper",
        "tasks": chosen["tasks"],
        "min_ratio_to_ideal": chosen["min_ratio_to_ideal"],
        "compute_ratio": chosen["compute_ratio"],
        "overhead_pct": chosen["overhead_pct"],
        "peak_memory_ratio": round(mem[best]["peak_rss_bytes"] / seq_rss, 4),
        "hedged_p99_ratio": tail["hedged_p99_ratio"],
        "recording_cpu_ratio": recording["recording_cpu_ratio"],
        "recording": recording,
        "heavy_tail": tail,
        "variant": best,
        "average_speedup": round(avg_speedup, 3),
        "compute_ratio_with_node_lifecycle": chosen["compute_ratio_with_node_lifecycle"],
        "variants": variants,
        "hash_normalised_compute_ratio": chosen["hash_normalised_compute_ratio"],
        "hash_normalised_overhead_pct": chosen["hash_normalised_overhead_pct"],
        "threadpool_compute_ratio": round(cpu["threadpool"] / cpu["sequential"], 4),
        "threadpool_hash_normalised_compute_ratio": round(normalised("threadpool"), 4),
        "threadpool_min_ratio_to_ideal": min(r["ratio_to_ideal"] for r in pool_rows),
        "threadpool_overrun_ms_max": overrun_ms(overrun["threadpool"])["overrun_ms_max"],
        "sequential_overrun_ms_max": overrun_ms(overrun["sequential"])["overrun_ms_max"],
        "sequential_cpu_s": round(cpu["sequential"], 4),
        "sequential_hash_cpu_s": round(hashing["sequential"], 4),
        "peak_rss_bytes": {part: m["peak_rss_bytes"] for part, m in mem.items()},
        "peak_rss_added_bytes": {
            part: m["peak_rss_bytes"] - m["rss_before_bytes"] for part, m in mem.items()
        },
        "peak_memory_ratio_sync": round(mem["sync"]["peak_rss_bytes"] / seq_rss, 4),
        "peak_memory_ratio_async": round(mem["async"]["peak_rss_bytes"] / seq_rss, 4),
        "tracemalloc_peak_bytes": {part: m["tracemalloc_peak_bytes"] for part, m in mem.items()},
        "scale_s_per_min": scale,
        "cpu_share": CPU_SHARE,
        "rounds": ROUNDS,
        "hash_rate_bytes_per_s": round(rate),
        "cpus": os.cpu_count(),
        "reps": reps,
        "seed": SEED,
        "quick_sizes": bool(args.quick),
        "elapsed_s": round(elapsed, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
