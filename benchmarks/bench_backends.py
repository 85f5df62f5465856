"""Benchmark: a CPU-bound fan-out on each execution backend (the backends issue).

    python benchmarks/bench_backends.py [--quick]

What it measures (the keys of the last stdout line, one JSON object):

* ``inline_s``, ``process_s``, ``ray_s`` — one Main spawns ``steps`` (16)
  workers in one ``spawn_many``, each running ``burn``: pure-Python integer
  arithmetic calibrated at start (in this process) to take about 0.25 s alone.
  Timed from the spawn until the last worker's result is in. Each node's pool
  is up before the clock starts (``wait_ready``); the start-up is reported
  apart (``process_pool_start_s``, ``ray_init_s``, ``ray_pool_start_s``). The
  three nodes live side by side and their fan-outs alternate, round after
  round; each figure is the best of ``repetitions`` rounds (all are listed in
  ``*_runs_s``).
* ``speedup_process`` = ``inline_s`` ÷ ``process_s``, ``speedup_ray`` =
  ``inline_s`` ÷ ``ray_s`` (inline runs every step on this process's threads,
  one GIL: about ``steps`` x 0.25 s; two workers on two cores: about half).
* ``per_step_overhead_ms_ray`` — ``trivial_steps`` (50) steps that return at
  once, spawned and waited for one after another, on ray and on inline: the
  difference of their means, in ms (the process backend's is listed too).

The skills are module-level functions of this script: the process backend's
workers (``spawn`` start method) re-import it as ``__mp_main__`` and find
``__main__.burn`` there; Ray's cloudpickle sends them by value. Everything
else runs under the ``__main__`` guard.

``--quick``: two rounds and 20 trivial steps (full: three rounds, 50); the
fan-out's size is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from _common import log

from sessiontree.protocol import SessionKind, SessionState, SpawnSpec
from sessiontree.supervision import Agent, Node, NodeConfig

STEPS = 16
STEP_S = 0.25
WAIT_S = 120.0  # real seconds any one result may take before the benchmark fails
BACKEND_NAMES = ("inline", "process", "ray")
REMOTE = ("process", "ray")


# -- skills (module level: importable by reference in a worker process) --------------------


def spin(turns: int) -> int:
    """Pure-Python integer work: ``turns`` loop turns."""
    total = 0
    for i in range(turns):
        total += i * i % 7
    return total


def burn(session: Any) -> dict[str, Any]:
    """A CPU-bound step: ``session.task`` is the number of loop turns. Answers
    where it ran and how long it took (wall and this thread's CPU seconds)."""
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    spin(int(session.task))
    wall1 = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    return {"pid": os.getpid(), "t0": wall0, "t1": wall1, "cpu_s": time.thread_time() - cpu0}


def noop(session: Any) -> None:
    """A step that returns at once."""
    return


def main_skill(session: Any) -> None:
    """The Main's message cycle: nothing to do (it only parents the workers)."""
    return


# -- helpers ----------------------------------------------------------------------------------


def calibrate() -> tuple[int, float]:
    """Loop turns for one ``STEP_S`` step in this process, and what one such step took."""
    turns = 200_000
    for repeats in (5, 2):  # a short probe, then once more at the full size
        turns = int(turns * STEP_S / min(_timed(spin, turns) for _ in range(repeats)))
    return turns, min(_timed(spin, turns) for _ in range(2))


def _timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def make_node(backend: str) -> Node:
    agent = Agent(
        "bench",
        {"main": main_skill, "burn": burn, "noop": noop},
        main_skill="main",
        max_children=STEPS,
    )
    config: dict[str, Any] = {"backend": backend, "passivate_after": None}
    if backend == "process":
        config["process_workers"] = 2
    elif backend == "ray":
        config["ray_actors"] = 2
    return Node([agent], NodeConfig(**config))


def wait_pool(node: Node, backend: str) -> float:
    """Block until ``node``'s pool is up; the seconds that took (0 for inline)."""
    t0 = time.perf_counter()
    pool: Any = node.backends.get(backend)
    if pool is not None and not pool.wait_ready(60.0):
        msg = f"the {backend} pool did not start within 60 s ({pool.unavailable})"
        raise RuntimeError(msg)
    return time.perf_counter() - t0


def _ended(ref: Any, backend: str) -> Any:
    result = ref.wait(WAIT_S)
    if result is None:
        msg = f"{backend}: session {ref.session_id} did not end within {WAIT_S} s"
        raise RuntimeError(msg)
    if result.status is not SessionState.COMPLETED:
        msg = f"{backend}: session {ref.session_id} ended {result.status}: {result.error}"
        raise RuntimeError(msg)
    return result


def fan_out(node: Node, main: Any, backend: str, skill: str, task: str, n: int) -> dict[str, Any]:
    """Spawn ``n`` workers under ``main`` in one batch and wait for all of them."""
    specs = [SpawnSpec(kind=SessionKind.WORKER, skill=skill, task=task)] * n
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    spawned = node.spawn_many(main, specs)
    failed = [s.error for s in spawned if not s.ok]
    if failed:
        msg = f"{backend}: {len(failed)} spawns refused, first: {failed[0]}"
        raise RuntimeError(msg)
    results = [_ended(s.ref, backend) for s in spawned]
    elapsed = time.perf_counter() - t0
    node_cpu = time.process_time() - cpu0
    steps = [r.artifacts for r in results if r.artifacts]
    busy: dict[int, float] = {}
    for a in steps:
        busy[a["pid"]] = busy.get(a["pid"], 0.0) + a["t1"] - a["t0"]
    return {
        "s": elapsed,
        "node_cpu_s": node_cpu,  # this process's CPU over the fan-out (all its threads)
        "step_cpu_s": sum(a["cpu_s"] for a in steps),
        # the busiest worker's summed step time (inline: one process, every
        # step's wall time overlaps the others', so this is meaningless there)
        "busiest_s": max(busy.values(), default=0.0),
        "pids": len(busy),
        "per_pid": sorted(sum(1 for a in steps if a["pid"] == pid) for pid in busy),
    }


def one_by_one(node: Node, main: Any, backend: str, n: int) -> float:
    """Mean seconds of ``n`` trivial steps, each spawned once the one before ended."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        spawned = node.spawn(main, kind=SessionKind.WORKER, skill="noop")
        if not spawned.ok:
            msg = f"{backend}: a trivial step was refused: {spawned.error}"
            raise RuntimeError(msg)
        _ended(spawned.ref, backend)
        times.append(time.perf_counter() - t0)
    return statistics.mean(times)


def start_ray() -> tuple[Any, float]:
    """Ray on the main thread, quiet and self-contained; the seconds ``ray.init`` took."""
    for name, value in (
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("RAY_AUTH_MODE", "disabled"),
        ("RAY_IGNORE_UNHANDLED_ERRORS", "1"),
    ):
        os.environ.setdefault(name, value)
    import ray  # noqa: PLC0415 - heavy and only for this run (never in a spawned worker)

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two rounds, fewer trivial steps")
    args = parser.parse_args()
    repetitions = 2 if args.quick else 3
    trivial = 20 if args.quick else 50
    started_at = time.perf_counter()

    turns, step_s = calibrate()
    log(f"calibrated: {turns:,} turns = {step_s:.3f} s per step in this process")

    ray, ray_init_s = start_ray()
    log(f"ray.init: {ray_init_s:.2f} s")
    nodes: dict[str, Node] = {}
    start_s: dict[str, float] = {}
    try:
        for backend in BACKEND_NAMES:
            t0 = time.perf_counter()
            nodes[backend] = make_node(backend)
            wait_pool(nodes[backend], backend)
            start_s[backend] = time.perf_counter() - t0
            log(f"{backend}: node and pool up in {start_s[backend]:.2f} s")
        mains = {b: node.main("bench") for b, node in nodes.items()}

        # warm-up (untimed): every worker has run a step and loaded the skills
        for backend, node in nodes.items():
            fan_out(node, mains[backend], backend, "noop", "", 4)
            fan_out(node, mains[backend], backend, "burn", "1000", 4)

        one = fan_out(nodes["inline"], mains["inline"], "inline", "burn", str(turns), 1)
        log(f"inline: one step through the node {one['s']:.3f} s")

        # trivial steps one after another, on each backend in turn
        per_step: dict[str, float] = {}
        for backend in BACKEND_NAMES:
            per_step[backend] = one_by_one(nodes[backend], mains[backend], backend, trivial)
            log(f"{backend}: {trivial} trivial steps, {per_step[backend] * 1000:.2f} ms each")

        # the fan-outs, alternating backends round after round
        runs: dict[str, list[dict[str, Any]]] = {b: [] for b in BACKEND_NAMES}
        for round_ in range(repetitions):
            order = BACKEND_NAMES[round_ % 3 :] + BACKEND_NAMES[: round_ % 3]
            for backend in order:
                run = fan_out(nodes[backend], mains[backend], backend, "burn", str(turns), STEPS)
                runs[backend].append(run)
                spread = (
                    ""
                    if backend == "inline"
                    else f", steps per worker {run['per_pid']}, busiest {run['busiest_s']:.3f} s"
                )
                log(
                    f"round {round_ + 1}/{repetitions} {backend}: {STEPS} steps in "
                    f"{run['s']:.3f} s (node CPU {run['node_cpu_s']:.2f} s, steps' CPU "
                    f"{run['step_cpu_s']:.2f} s{spread})"
                )
    finally:
        for backend, node in nodes.items():
            t0 = time.perf_counter()
            node.shutdown(grace=0, timeout=30.0)
            log(f"{backend}: shutdown {time.perf_counter() - t0:.2f} s")
        ray.shutdown()

    best = {b: min(runs[b], key=lambda r: r["s"]) for b in BACKEND_NAMES}
    inline_s, process_s, ray_s = (best[b]["s"] for b in BACKEND_NAMES)
    out: dict[str, Any] = {
        "bench": "backends",
        "inline_s": round(inline_s, 3),
        "process_s": round(process_s, 3),
        "ray_s": round(ray_s, 3),
        "speedup_process": round(inline_s / process_s, 2),
        "speedup_ray": round(inline_s / ray_s, 2),
        "per_step_overhead_ms_ray": round((per_step["ray"] - per_step["inline"]) * 1000, 2),
        "per_step_overhead_ms_process": round((per_step["process"] - per_step["inline"]) * 1000, 2),
        "trivial_step_ms": {b: round(per_step[b] * 1000, 3) for b in BACKEND_NAMES},
        "trivial_steps": trivial,
        "steps": STEPS,
        "workers": 2,
        "step_turns": turns,
        "step_s_inline_one": round(step_s, 4),
        "step_s_node_one": round(one["s"], 4),
        "ideal_s": round(STEPS * step_s / 2, 3),
        "repetitions": repetitions,
        **{f"{b}_runs_s": [round(r["s"], 3) for r in runs[b]] for b in BACKEND_NAMES},
        **{f"{b}_node_cpu_s": round(best[b]["node_cpu_s"], 3) for b in BACKEND_NAMES},
        **{f"{b}_step_cpu_s": round(best[b]["step_cpu_s"], 3) for b in BACKEND_NAMES},
        # wall time of the best remote fan-out not spent computing on its busiest
        # worker: dispatch, result delivery and the uneven split of 16 steps
        **{f"{b}_not_busy_s": round(best[b]["s"] - best[b]["busiest_s"], 3) for b in REMOTE},
        "process_pool_start_s": round(start_s["process"], 3),
        "ray_init_s": round(ray_init_s, 3),
        "ray_pool_start_s": round(start_s["ray"], 3),
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "wall_s": round(time.perf_counter() - started_at, 1),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
