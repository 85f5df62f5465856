"""Benchmark: model calls through a session vs the openai SDK called directly.

    python benchmarks/bench_models.py [--quick] [--dir DIR] [--standin process|thread]

What it measures (the keys of the last stdout line, one JSON object). Both
sides talk to the same local chat-completions stand-in
(``sessiontree.testing.StandinServer``) over real sockets; by default it
runs in a process of its own, so it does not share the benchmark's GIL (its
CPU share during each throughput round is reported: well under one core
means it is not what limits either side).

* ``added_latency_p50_ms`` / ``_p99_ms`` — one async worker session calls
  ``await session.complete(PROMPT, record=False)`` and, on the same event
  loop (the node's), a bare ``openai.AsyncOpenAI`` (same base URL,
  ``max_retries=0``) sends the same messages; the two alternate (A B, B A,
  A B, ...), each timed around the ``await`` with ``time.perf_counter``.
  The added latency at p50 (p99) is the session's p50 (p99) minus the bare
  SDK's. Not streamed; ``stream_added_latency_*`` is the same with
  ``stream=True`` on both sides (every chunk's text then also goes to the
  session's progress as an event).
* ``concurrent_sessions`` async worker sessions (1,000) each stream one
  reply: they are spawned in one ``spawn_many``, wait at a gate, and once
  all wait the gate opens; the round lasts until the last reply is in the
  skill's hands. The bare SDK round is ``asyncio.gather`` of as many
  streamed calls on the node's event loop. ``throughput_ratio`` = session
  calls/s ÷ bare calls/s, the median over pairs of rounds (each pair one
  round of each side, which goes first alternating).
  ``end_to_end_throughput_ratio`` counts the sessions' spawn (until every
  skill waits at the gate) and their endings (until the node is idle) too.
  The client side is CPU-bound (the SDK's own work per streamed chunk), so
  ``cpu_throughput_ratio`` (bare ÷ session CPU per call, the process's CPU
  over the same pairs of rounds, median) says the same more steadily on a
  shared machine.
* The same figures on a node with an LMDB store (``store_*`` keys), where
  every call's usage is committed (fsync'd, shared commits) before the reply
  reaches the skill; ``fsync_ms`` is the disk's fdatasync latency.
* ``cpu_us_per_call_*`` — the process's CPU time (every thread) during the
  throughput rounds per call: what one call costs on each path (the
  session side includes its spawn and its ending).

The machine's load average before and after is reported: other processes
on a small machine move every wall-clock figure (quote ratios from one run).

``--quick``: 200 concurrent sessions (``"quick_sizes": true``), 400 + 200
latency pairs, 5 rounds each way (full: 1,000 sessions, 2,000 + 1,000
pairs, 7 rounds each way).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import openai
from _common import fdatasync_ms, log, real_disk_dir

from sessiontree.protocol import SessionKind, SessionState, SpawnSpec
from sessiontree.supervision import Agent, Node, NodeConfig, Provider
from sessiontree.testing import StandinServer

MODEL = "bench-model"
#: 15 words: the stand-in echoes them ("echo " + prompt), so a reply is 16
#: words, and streamed (a word a chunk) 16 text chunks among 19 events.
PROMPT = "the quick brown fox jumps over the lazy dog while seven small birds sing along"
REPLY = "echo " + PROMPT
MESSAGES = ({"role": "user", "content": PROMPT},)
DAY = 24 * 3600.0
#: Both clients wait this long for anything (connecting included): on a loaded
#: machine a round of 1,000 connections must not time out on either side.
TIMEOUT = 600.0

T = TypeVar("T")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


# -- the stand-in, in a process of its own or on a thread ---------------------------------


def _serve_standin(conn: Connection, words_per_chunk: int) -> None:
    """A stand-in process: serve until told to stop, then report its stats."""
    with StandinServer(words_per_chunk=words_per_chunk, max_recorded=1) as server:
        conn.send(server.url)
        conn.recv()
        stats = server.stats()
    conn.send({"completions": stats.completions_served, "requests": stats.requests_received})


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (every thread)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Standin:
    """The stand-in server where the benchmark wants it; ``cpu()`` is its CPU
    time so far (None on a thread: it shares this process then)."""

    def __init__(self, where: str, words_per_chunk: int = 1) -> None:
        self.where = where
        self.process: Any = None
        self.server: StandinServer | None = None
        if where == "thread":
            self.server = StandinServer(words_per_chunk=words_per_chunk, max_recorded=1).start()
            self.url = self.server.url
            return
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve_standin, args=(child, words_per_chunk), name="standin", daemon=True
        )
        self.process.start()
        if not self.conn.poll(30.0):
            raise RuntimeError("the stand-in process did not start")
        self.url = self.conn.recv()

    def cpu(self) -> float | None:
        return None if self.process is None else _cpu_seconds(self.process.pid)

    def close(self) -> dict[str, int]:
        if self.server is not None:
            stats = self.server.stats()
            self.server.close()
            return {"completions": stats.completions_served, "requests": stats.requests_received}
        self.conn.send("stop")
        figures: dict[str, int] = self.conn.recv() if self.conn.poll(30.0) else {}
        self.process.join(30.0)
        return figures


# -- the skills and what they share with the benchmark --------------------------------------


@dataclass
class Shared:
    """Between the benchmark thread and the skills (on the node's event loop)."""

    url: str = ""
    samples: int = 0
    stream: bool = False
    #: latency pairs: (session seconds, bare seconds)
    pairs: list[tuple[float, float]] = field(default_factory=list)
    # one throughput round
    expected: int = 0
    gate: asyncio.Event | None = None
    ready: int = 0
    all_ready: threading.Event = field(default_factory=threading.Event)
    finished: int = 0
    finished_at: float = 0.0
    all_finished: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def new_round(self, n: int) -> None:
        self.expected, self.ready, self.finished = n, 0, 0
        self.gate = asyncio.Event()  # made on the node's loop (bound there on first wait)
        self.all_ready.clear()
        self.all_finished.clear()


def bare_client(url: str) -> openai.AsyncOpenAI:
    timeout = openai.Timeout(TIMEOUT, connect=TIMEOUT)
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=timeout)


async def bare_call(client: openai.AsyncOpenAI, stream: bool) -> str:
    """One call as an application makes it without sessiontree; the reply's text."""
    create: Any = client.chat.completions.create
    if not stream:
        completion = await create(model=MODEL, messages=list(MESSAGES))
        return str(completion.choices[0].message.content)
    stream_ = await create(
        model=MODEL, messages=list(MESSAGES), stream=True, stream_options={"include_usage": True}
    )
    text: list[str] = []
    async with stream_:
        async for chunk in stream_:
            for choice in chunk.choices:
                if choice.delta.content:
                    text.append(choice.delta.content)
    return "".join(text)


def make_agent(shared: Shared, max_children: int) -> Agent:
    async def main(s: Any) -> None:
        return None  # the Main's message cycles: nothing to do

    async def holder(s: Any) -> None:
        await s.sleep(DAY)  # a parent that never claims its workers' results

    async def latency(s: Any) -> None:
        """``shared.samples`` pairs: the session's call and the bare SDK's,
        alternating which goes first."""
        client = bare_client(shared.url)
        perf = time.perf_counter
        try:
            for i in range(shared.samples):
                timed: dict[str, float] = {}
                for side in ("session", "bare") if i % 2 == 0 else ("bare", "session"):
                    if side == "session":
                        t0 = perf()
                        completion = await s.complete(PROMPT, stream=shared.stream, record=False)
                        timed[side] = perf() - t0
                        text = completion.text
                        if completion.error is not None:
                            shared.errors.append(str(completion.error))
                    else:
                        t0 = perf()
                        text = await bare_call(client, shared.stream)
                        timed[side] = perf() - t0
                    if text != REPLY:
                        shared.errors.append(f"{side}: unexpected reply {text!r}")
                shared.pairs.append((timed["session"], timed["bare"]))
        finally:
            await client.close()

    async def streamer(s: Any) -> None:
        """Wait at the gate, then stream one reply."""
        shared.ready += 1
        if shared.ready == shared.expected:
            shared.all_ready.set()
        assert shared.gate is not None
        await shared.gate.wait()
        completion = await s.complete(PROMPT, stream=True, record=False)
        if completion.error is not None or completion.text != REPLY:
            shared.errors.append(f"stream: {completion.error} {completion.text!r}")
        shared.finished += 1
        if shared.finished == shared.expected:
            shared.finished_at = time.perf_counter()
            shared.all_finished.set()

    skills = {"main": main, "holder": holder, "latency": latency, "streamer": streamer}
    return Agent(
        "bench",
        skills,
        main_skill="main",
        models={"small": MODEL, "large": MODEL},
        max_children=max_children,
    )


# -- one node's figures -----------------------------------------------------------------


class Bench:
    """A node (in memory or with a store) beside a bare client on its loop."""

    def __init__(self, url: str, n: int, store: str | None) -> None:
        self.shared = Shared(url=url)
        config = NodeConfig(
            providers=(Provider(base_url=url, timeout=TIMEOUT, connect_timeout=TIMEOUT),),
            max_sessions=10 * n + 1000,
            max_running_skills=2 * n + 100,
            ask_timeout=600.0,
        )
        self.node = Node([make_agent(self.shared, 20 * n)], config, store=store)
        self.main = self.node.main("bench")
        spawned = self.node.spawn(self.main, kind="branch", task="holder", skill="holder", ttl=DAY)
        if spawned.ref is None:
            raise RuntimeError(f"holder refused: {spawned.error}")
        self.holder = spawned.ref
        self.loop = self.node._parts.event_loop().loop
        self.client = self.on_loop(self._client)

    async def _client(self) -> openai.AsyncOpenAI:
        return bare_client(self.shared.url)

    def on_loop(self, make: Callable[[], Awaitable[T]], timeout: float = 600.0) -> T:
        """Run a coroutine on the node's event loop and wait for it."""
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            make(),  # type: ignore[arg-type]
            self.loop,
        )
        return future.result(timeout)

    def close(self) -> None:
        try:
            self.on_loop(self.client.close)
        finally:
            self.node.shutdown(grace=0)

    def check(self) -> None:
        if self.shared.errors:
            raise RuntimeError(f"{len(self.shared.errors)} bad calls: {self.shared.errors[:3]}")

    # -- latency ------------------------------------------------------------------------

    def latency(self, samples: int, stream: bool) -> list[tuple[float, float]]:
        shared = self.shared
        shared.samples, shared.stream, shared.pairs = samples, stream, []
        gc.collect()
        result = self.node.run(
            self.holder, kind="worker", task="latency", skill="latency", ttl=DAY, timeout=600.0
        )
        if result is None or result.status is not SessionState.COMPLETED:
            raise RuntimeError(f"the latency session did not complete: {result}")
        self.check()
        return shared.pairs

    # -- throughput -----------------------------------------------------------------------

    def bare_round(self, n: int) -> float:
        client = self.client

        async def round_() -> float:
            t0 = time.perf_counter()
            texts = await asyncio.gather(*(bare_call(client, True) for _ in range(n)))
            elapsed = time.perf_counter() - t0
            if any(text != REPLY for text in texts):
                self.shared.errors.append("bare stream: unexpected reply")
            return elapsed

        gc.collect()
        elapsed = self.on_loop(round_)
        self.check()
        return elapsed

    def session_round(self, n: int) -> tuple[float, float, float]:
        """Seconds from the gate until the last reply; the spawn until every
        skill waits; from the last reply until the node is idle."""
        shared = self.shared

        async def new_round() -> None:
            shared.new_round(n)

        self.on_loop(new_round)
        gc.collect()
        spec = SpawnSpec(kind=SessionKind.WORKER, task="stream", skill="streamer", ttl=DAY)
        t_spawn = time.perf_counter()
        spawned = self.node.spawn_many(self.holder, [spec] * n)
        refused = [s.error for s in spawned if not s.ok]
        if refused:
            raise RuntimeError(f"{len(refused)} spawns refused: {refused[0]}")
        if not shared.all_ready.wait(600.0):
            raise RuntimeError(f"only {shared.ready} of {n} sessions reached the gate")
        assert shared.gate is not None
        t0 = time.perf_counter()
        self.loop.call_soon_threadsafe(shared.gate.set)
        if not shared.all_finished.wait(600.0):
            raise RuntimeError(f"only {shared.finished} of {n} replies arrived")
        calls_s = shared.finished_at - t0
        if not self.node.wait_idle(600.0):
            raise RuntimeError("the node did not settle after a round")
        wind_down = time.perf_counter() - shared.finished_at
        self.check()
        return calls_s, t0 - t_spawn, wind_down


def latency_figures(pairs: list[tuple[float, float]]) -> dict[str, float]:
    session = [p[0] * 1000.0 for p in pairs]
    bare = [p[1] * 1000.0 for p in pairs]
    return {
        "p50": percentile(session, 50) - percentile(bare, 50),
        "p99": percentile(session, 99) - percentile(bare, 99),
        "pair_median": statistics.median(s - b for s, b in pairs) * 1000.0,
        "session_p50": percentile(session, 50),
        "session_p99": percentile(session, 99),
        "bare_p50": percentile(bare, 50),
        "bare_p99": percentile(bare, 99),
    }


@dataclass
class Side:
    """One side's throughput rounds: wall seconds of the calls, the process's
    CPU seconds, the stand-in's CPU share (of one core) over each round."""

    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    standin_share: list[float] = field(default_factory=list)


def timed_round(standin: Standin, side: Side, run: Callable[[], float]) -> None:
    """``run()`` one round (it returns the seconds its calls took)."""
    s0, c0, t0 = standin.cpu(), time.process_time(), time.perf_counter()
    side.seconds.append(run())
    c1, s1, t1 = time.process_time(), standin.cpu(), time.perf_counter()
    side.cpu.append(c1 - c0)
    if s0 is not None and s1 is not None:
        side.standin_share.append((s1 - s0) / (t1 - t0))


def measure(
    name: str, standin: Standin, n: int, samples: int, rounds: int, store: str | None
) -> dict[str, Any]:
    """Every figure on one node (``store``: its directory, or in memory)."""
    bench = Bench(standin.url, n, store)
    try:
        commits0 = bench.node.stats().get("store_commits", 0)
        bench.latency(max(20, samples // 10), stream=False)  # warm-up: connections, code paths
        lat = latency_figures(bench.latency(samples, stream=False))
        log(
            f"  {name} latency ({samples} pairs): session p50 {lat['session_p50']:.3f} ms "
            f"p99 {lat['session_p99']:.3f} ms; bare p50 {lat['bare_p50']:.3f} ms "
            f"p99 {lat['bare_p99']:.3f} ms; added p50 {lat['p50']:.3f} ms, "
            f"p99 {lat['p99']:.3f} ms (pair median {lat['pair_median']:.3f} ms)"
        )
        stream_samples = max(20, samples // 2)
        slat = latency_figures(bench.latency(stream_samples, stream=True))
        log(
            f"  {name} streamed latency ({stream_samples} pairs): session p50 "
            f"{slat['session_p50']:.3f} ms, bare p50 {slat['bare_p50']:.3f} ms; added p50 "
            f"{slat['p50']:.3f} ms, p99 {slat['p99']:.3f} ms"
        )
        commits1 = bench.node.stats().get("store_commits", 0)

        bench.bare_round(n)  # warm-up of both paths at full width
        bench.session_round(n)
        bare, session = Side(), Side()
        spawn_s: list[float] = []
        down_s: list[float] = []
        commits: list[int] = []

        def session_round() -> float:
            k0 = bench.node.stats().get("store_commits", 0)
            calls, spawn, down = bench.session_round(n)
            commits.append(bench.node.stats().get("store_commits", 0) - k0)
            spawn_s.append(spawn)
            down_s.append(down)
            return calls

        for r in range(rounds):  # pairs of rounds, each side first every other time
            first, second = (bare, session) if r % 2 == 0 else (session, bare)
            for side in (first, second):
                run = (lambda: bench.bare_round(n)) if side is bare else session_round
                timed_round(standin, side, run)
            log(
                f"  {name} round {r + 1}/{rounds}: bare {n / bare.seconds[-1]:,.0f} calls/s, "
                f"session {n / session.seconds[-1]:,.0f} calls/s "
                f"(ratio {bare.seconds[-1] / session.seconds[-1]:.3f}); "
                f"spawn {spawn_s[-1]:.3f} s, wind-down {down_s[-1]:.3f} s; cpu/call bare "
                f"{bare.cpu[-1] / n * 1e6:.0f} us, session {session.cpu[-1] / n * 1e6:.0f} us"
                + (f"; {commits[-1]} commits" if store else "")
            )
        ratios = [b / c for b, c in zip(bare.seconds, session.seconds, strict=True)]
        end_to_end = [
            b / (c + s + d)
            for b, c, s, d in zip(bare.seconds, session.seconds, spawn_s, down_s, strict=True)
        ]
        cpu_ratios = [b / c for b, c in zip(bare.cpu, session.cpu, strict=True)]
        cpu_bare, cpu_session = statistics.median(bare.cpu), statistics.median(session.cpu)
        shares = bare.standin_share + session.standin_share
        return {
            "added_latency_p50_ms": round(lat["p50"], 4),
            "added_latency_p99_ms": round(lat["p99"], 4),
            "throughput_ratio": round(statistics.median(ratios), 4),
            "added_latency_pair_median_ms": round(lat["pair_median"], 4),
            "session_latency_p50_ms": round(lat["session_p50"], 4),
            "session_latency_p99_ms": round(lat["session_p99"], 4),
            "bare_latency_p50_ms": round(lat["bare_p50"], 4),
            "bare_latency_p99_ms": round(lat["bare_p99"], 4),
            "stream_added_latency_p50_ms": round(slat["p50"], 4),
            "stream_added_latency_p99_ms": round(slat["p99"], 4),
            "stream_session_latency_p50_ms": round(slat["session_p50"], 4),
            "stream_bare_latency_p50_ms": round(slat["bare_p50"], 4),
            "throughput_ratio_all": [round(r, 4) for r in ratios],
            "end_to_end_throughput_ratio": round(statistics.median(end_to_end), 4),
            "cpu_throughput_ratio": round(statistics.median(cpu_ratios), 4),
            "session_calls_per_s": round(n / statistics.median(session.seconds), 1),
            "bare_calls_per_s": round(n / statistics.median(bare.seconds), 1),
            "spawn_until_gate_s": round(statistics.median(spawn_s), 4),
            "wind_down_s": round(statistics.median(down_s), 4),
            "cpu_us_per_call_session": round(cpu_session / n * 1e6, 1),
            "cpu_us_per_call_bare": round(cpu_bare / n * 1e6, 1),
            "standin_cpu_share_max": round(max(shares), 3) if shares else None,
            "latency_commits": commits1 - commits0,
            "commits_per_round": int(statistics.median(commits)),
        }
    finally:
        bench.close()


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sessions and samples")
    parser.add_argument("--sessions", type=int, help="concurrent sessions (1,000; quick 200)")
    parser.add_argument("--samples", type=int, help="latency pairs (2,000; quick 400)")
    parser.add_argument("--rounds", type=int, help="throughput rounds each way (7; quick 5)")
    parser.add_argument("--dir", help="where the LMDB store goes (a real disk; default: tmp)")
    parser.add_argument(
        "--standin",
        choices=("process", "thread"),
        default="process",
        help="run the stand-in in a process of its own (default) or on a thread here",
    )
    parser.add_argument("--no-store", action="store_true", help="skip the node with a store")
    args = parser.parse_args(argv)
    n = args.sessions or (200 if args.quick else 1000)
    samples = args.samples or (400 if args.quick else 2000)
    rounds = args.rounds or (5 if args.quick else 7)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    log(
        f"bench_models: {n} concurrent sessions, {samples} latency pairs, {rounds} rounds, "
        f"stand-in on a {args.standin}; pid {os.getpid()}, {os.cpu_count()} cpus"
    )
    standin = Standin(args.standin)
    try:
        log("in-memory node")
        memory = measure("memory", standin, n, samples, rounds, store=None)
        stored: dict[str, Any] = {}
        store_fs = fsync = None
        disk = None if args.no_store else real_disk_dir("bench-models", args.dir)
        if disk is not None:
            base, store_fs = disk
            try:
                fsync = fdatasync_ms(base)
                log(f"node with an LMDB store in {base} ({store_fs}; fdatasync {fsync:.3f} ms)")
                stored = measure("store", standin, n, samples, rounds, store=base)
            finally:
                shutil.rmtree(base, ignore_errors=True)
    finally:
        served = standin.close()
    summary: dict[str, Any] = {
        "bench": "models",
        "added_latency_p50_ms": memory.pop("added_latency_p50_ms"),
        "added_latency_p99_ms": memory.pop("added_latency_p99_ms"),
        "concurrent_sessions": n,
        "throughput_ratio": memory.pop("throughput_ratio"),
    }
    memory.pop("latency_commits")
    memory.pop("commits_per_round")
    summary.update(memory)
    summary.update({f"store_{key}": value for key, value in stored.items()})
    summary.update(
        {
            "latency_samples": samples,
            "stream_latency_samples": max(20, samples // 2),
            "rounds": rounds,
            "reply_words": len(REPLY.split()),
            "standin": args.standin,
            "standin_completions": served.get("completions"),
            "store_filesystem": store_fs,
            "fsync_ms": None if fsync is None else round(fsync, 3),
            "quick": args.quick,
            "quick_sizes": n < 1000,
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
