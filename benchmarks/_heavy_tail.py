"""bench_paper's heavy-tail variant: a fan-out's makespan with hedged children.

A lead Branch fans out 8 workers whose latencies are drawn from a lognormal
distribution (median 1 s, sigma 1: about one child in twenty takes over 5 s,
one in a thousand over 20 s), seeded by (trial, task, run) so that a task's
first run takes the same time with and without hedging (paired trials) and
a duplicate draws a latency of its own. All of it on a ``VirtualClock``,
advanced from timer to timer: no real waiting, the same figures on every
machine. Hedged: ``fan_out(hedge=Hedge(after=P95))``, a duplicate of a child
still running at the distribution's 95th percentile (what a builder who
knows their model's latency profile would set). ``hedged_p99_ratio`` is the
99th percentile of the hedged makespans over that of the plain ones.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
from typing import Any

from sessiontree.actors import VirtualClock
from sessiontree.protocol import SessionKind
from sessiontree.supervision import Agent, Hedge, Node, NodeConfig

__all__ = ["P95", "heavy_tail"]

FANOUT = 8
MEDIAN, SIGMA = 1.0, 1.0
P95 = MEDIAN * math.exp(1.6449 * SIGMA)


def latency(seed: int, trial: int, task: int, run: int) -> float:
    """A run's latency: lognormal, the same for the same (trial, task, run)."""
    return random.Random(f"{seed}:{trial}:{task}:{run}").lognormvariate(math.log(MEDIAN), SIGMA)


def make_agent(seed: int) -> Agent:
    runs: dict[tuple[int, bool, int], int] = {}
    lock = threading.Lock()

    async def work(session: Any) -> str:
        trial, hedged, task = session.input["trial"], session.input["hedged"], session.input["task"]
        with lock:
            n = runs[trial, hedged, task] = runs.get((trial, hedged, task), 0) + 1
        await session.sleep(latency(seed, trial, task, n))
        return "ok"

    async def lead(session: Any) -> dict[str, Any]:
        trial, hedged = session.input["trial"], session.input["hedged"]
        tasks = [
            {"task": f"t{j}", "input": {"trial": trial, "hedged": hedged, "task": j}}
            for j in range(FANOUT)
        ]
        started = session.clock.monotonic()
        got = await session.fan_out(tasks, skill="work", hedge=Hedge(after=P95) if hedged else None)
        duplicates = sum(1 for r in got.reports for a in r.attempts if a.hedge)
        return {
            "took": session.clock.monotonic() - started,
            "ok": got.ok,
            "duplicates": duplicates,
        }

    async def idle(session: Any) -> None:
        return None

    skills = {"main": idle, "lead": lead, "work": work}
    return Agent("tail", skills, main_skill="main", max_children=2 * FANOUT)


def _run_one(node: Node, clock: VirtualClock, main: Any, trial: int, hedged: bool) -> Any:
    spawned = main.spawn(
        kind=SessionKind.BRANCH, skill="lead", input={"trial": trial, "hedged": hedged}
    )
    if spawned.ref is None:
        raise RuntimeError(f"the lead was refused: {spawned.error}")
    for _ in range(100_000):  # bounded: each step fires at least one timer
        if not node.wait_idle(60.0):
            raise RuntimeError("the node did not settle")
        result = spawned.ref.result()
        if result is not None:
            if not result.ok or not result.artifacts["ok"]:
                raise RuntimeError(f"trial {trial}: {result}")
            return result.artifacts
        due = clock.next_timer
        if due is None:
            raise RuntimeError("nothing left to wait for, and the lead has not ended")
        clock.advance(max(0.0, due - clock.monotonic()))
    raise RuntimeError("the trial never ended")


def percentile(values: list[float], q: float) -> float:
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, max(0, math.ceil(q / 100 * len(ranked)) - 1))]


def heavy_tail(trials: int, seed: int) -> dict[str, Any]:
    """Makespans of ``trials`` paired fan-outs, plain then hedged."""
    clock = VirtualClock()
    node = Node([make_agent(seed)], NodeConfig(grace=1.0, check_interval=3600.0), clock=clock)
    plain: list[float] = []
    hedged: list[float] = []
    duplicates = 0
    try:
        main = node.main("tail")
        for trial in range(trials):
            plain.append(_run_one(node, clock, main, trial, False)["took"])
            got = _run_one(node, clock, main, trial, True)
            hedged.append(got["took"])
            duplicates += got["duplicates"]
    finally:
        node.shutdown(grace=0)
    return {
        "trials": trials,
        "fanout": FANOUT,
        "latency": {"distribution": "lognormal", "median_s": MEDIAN, "sigma": SIGMA},
        "hedge_after_s": round(P95, 3),
        "makespan_p50_s": round(statistics.median(plain), 3),
        "makespan_p99_s": round(percentile(plain, 99), 3),
        "hedged_makespan_p50_s": round(statistics.median(hedged), 3),
        "hedged_makespan_p99_s": round(percentile(hedged, 99), 3),
        "hedged_p99_ratio": round(percentile(hedged, 99) / percentile(plain, 99), 4),
        "duplicates_per_fanout": round(duplicates / trials, 3),
    }
