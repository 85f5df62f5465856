"""Benchmark: conversation trees — ``context(limit)`` on a big branched tree, and durable appends.

    python benchmarks/bench_conversation.py [--quick] [--dir DIR]

What it measures (the keys of the last stdout line, one JSON object):

* ``context_load_ms``: the median latency of ``Conversation.context(100)``
  on one conversation of ``messages`` (100,000) messages with branches, in a
  synced LMDB store (p99 beside it). The tree is built through the real
  ``Conversation`` API (append, fork, merge) on a ``MemoryBackend``: a fork
  every 1,000 messages from a random earlier message at depth >= 100, the
  new branch then gets the next 1,000 appends; every tenth fork first merges
  an earlier branch into the current one. The messages and bookkeeping are
  then bulk-loaded into the store in large batches (100,000 one-fsync
  appends would take minutes), the store is closed and reopened with
  ``sync`` asserted, and ``context(100)`` is read through
  ``StoreConversations`` from the active leaf (the tip of the last branch,
  deep in the tree).
* ``baseline_context_load_ms``: the specification's reference algorithm
  (``SessionLogger.loadContext``), reimplemented here: the same messages as
  a JSONL file, one ``to_spec()`` object a line in append order; from the
  active leaf, each parent lookup (``findMessage``) rereads the whole file
  (``readAllMessages``: read, split lines, parse every line) and scans for
  the id. One ``load_context(100)`` call is 100 full rereads. It is timed
  between rounds of the store's ``context(100)`` calls (side by side in one
  run), and both must return the same 100 message ids in the same order.
  ``speedup`` = baseline ÷ ``context_load_ms``.
* ``durable_appends_per_s``: ``concurrent_conversations`` (64) conversations,
  each appended to sequentially by its own producer (``append`` returns once
  the message is durably committed; the store's group commit lets concurrent
  appends share fsyncs), counted over a timed window after a warm-up on a
  fresh synced store. Two kinds of producers, alternating: 64 threads calling
  ``append``, and 64 coroutines on one event loop awaiting ``aappend`` (which
  runs ``append`` in the loop's default executor). The better kind is the
  headline (``producers_kind``); both are reported, with the commits the
  writer made in the window (``commits``: appends per commit shows the
  sharing). ``single_conversation_appends_per_s``: one conversation, one
  thread, sequential appends (one fsync'd commit each).
* ``append_ratio_to_store``: durable appends per second from 64 sessions
  writing on their own context branches of one Main's conversation (64
  threads calling ``SessionBranch.write``, or 64 coroutines awaiting
  ``awrite``: the better kind), as a ratio to the store's own group-commit
  rate in the same run (64 threads, each submitting one message record of
  the same sizes per batch and waiting for it): ``linked_appends_per_s`` ÷
  ``store_group_commit_per_s``. ``unlinked_append_ratio_to_store`` is the
  same ratio for ``durable_appends_per_s`` (64 conversations).
* ``linked_spawn_ratio``: spawns per second of workers whose contexts are
  linked (each writes one message on its context branch and its result
  lands on the Main's branch as a durable message) as a ratio to workers
  that never use their context (so nothing is linked), counted from the
  first ``spawn_many`` (500 a batch) until every worker ended and the store
  flushed; each round on a fresh node and synced store, alternated
  (``linked_spawns_per_s``, ``unlinked_spawns_per_s``: the medians).
* Extras: ``context_load_ms_1k_messages`` (``context(100)`` on a linear
  1,000-message conversation in the same store: the size should not
  matter) and ``big_conversation_appends_per_s`` (one thread's sequential
  durable appends on the big conversation, after the context rounds: the
  bookkeeping record rewritten by every append holds all its branches).

Stores live in a temporary directory on the real disk (``/tmp`` unless
``--dir``; refused on tmpfs), removed afterwards. ``fdatasync_ms`` is the raw
disk's median pwrite+fdatasync latency there, for context.

``--quick`` cuts the conversation to 5,000 messages (fork every 250; the
JSON says ``"quick_sizes": true``), the context rounds, the append windows
(one of 0.75 s per mode; full: three of 2 s) and the spawn rounds (two of
2,000 workers; full: four of 10,000); it keeps 64 conversations.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

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

from sessiontree.actors import AsyncSession, RealClock
from sessiontree.conversations import Conversation, Conversations, MemoryBackend, SessionBranch
from sessiontree.protocol import Message, Role, SpawnSpec
from sessiontree.store import Store
from sessiontree.supervision import Agent, Node, NodeConfig, StoreConversations

CONTEXT_LIMIT = 100
CONVERSATIONS = 64
LOAD_BATCH = 5_000  # messages per WriteBatch when bulk-loading the big conversation
MERGE_EVERY = 10  # every tenth fork merges an earlier branch first

_WORDS = (
    "the",
    "branch",
    "tree",
    "message",
    "context",
    "fork",
    "merge",
    "session",
    "agent",
    "store",
    "commit",
    "durable",
    "append",
    "parent",
    "leaf",
    "root",
    "model",
    "tool",
    "answer",
    "question",
    "summary",
    "ticket",
    "search",
    "result",
    "plan",
    "step",
    "check",
    "review",
    "draft",
    "reply",
    "user",
    "assistant",
    "system",
)


def conversations_on(store: Store) -> Conversations:
    return Conversations(StoreConversations(store), RealClock())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def text(rng: random.Random, i: int, lo: int = 40, hi: int = 400) -> str:
    """A message body of ``lo``..``hi`` characters."""
    size = rng.randint(lo, hi)
    words = [f"#{i}"]
    length = len(words[0])
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


# -- the big conversation ----------------------------------------------------------------


def build_tree(messages: int, fork_every: int, seed: int) -> tuple[Conversation, dict[str, Any]]:
    """``messages`` messages through the real API on a ``MemoryBackend``: linear
    runs of ``fork_every`` appends, each new run on a branch forked from a
    random earlier message at depth >= ``CONTEXT_LIMIT``; every
    ``MERGE_EVERY``-th fork first merges a random earlier branch into the
    current one (while the budget allows). Ends on the last branch."""
    rng = random.Random(seed)
    conv = Conversations(MemoryBackend(), RealClock()).get(uuid.uuid4())
    deep: list[uuid.UUID] = []  # messages at depth >= CONTEXT_LIMIT (fork points)
    figures = {"forks": 0, "merges": 0, "merged_messages": 0}
    run = 0  # messages on the current run
    roles = ("user", "assistant")
    i = 0
    while len(conv) < messages:
        if run >= fork_every and deep:
            figures["forks"] += 1
            if figures["forks"] % MERGE_EVERY == 0:
                current = conv.current_branch.number
                others = [b for b in conv.branches() if b.number != current]
                source = rng.choice(others)
                if len(conv) + source.own_messages + fork_every <= messages:
                    merged = conv.merge(source.number)
                    figures["merges"] += 1
                    figures["merged_messages"] += len(merged.messages)
                    deep.extend(m.id for m in merged.messages if m.depth >= CONTEXT_LIMIT)
            conv.fork(rng.choice(deep))
            run = 0
            continue
        message = conv.append(roles[i % 2], text(rng, i))
        i += 1
        run += 1
        if message.depth >= CONTEXT_LIMIT:
            deep.append(message.id)
    figures["branches"] = len(conv.branches())
    figures["messages"] = len(conv)
    return conv, figures


def load_into_store(store: Store, conv: Conversation) -> None:
    """The conversation's messages and bookkeeping into ``store``, in large batches."""
    backend = conv._shared.backend
    sid = conv.session_id
    state = backend.load(sid)
    assert state is not None
    pending = []
    batch = store.batch()
    for n, message in enumerate(backend.messages(sid), 1):
        batch.message(sid, message)
        if n % LOAD_BATCH == 0:
            pending.append(store.submit(batch))
            batch = store.batch()
    for branch in state.branches:
        batch.branch(sid, branch)
    batch.conversation(state)  # last: the bookkeeping names messages already written
    pending.append(store.submit(batch))
    for future in pending:
        future.result(300.0)


# -- the specification's reference algorithm (the baseline) ------------------------------


class SpecSessionLogger:
    """``SessionLogger.loadContext`` of the specification, in Python: every parent
    lookup rereads and parses the whole JSONL file, then scans it for the id."""

    def __init__(self, path: str, current_leaf_id: str | None) -> None:
        self.session_path = path
        self.current_leaf_id = current_leaf_id

    def read_all_messages(self) -> list[dict[str, Any]]:
        with open(self.session_path, encoding="utf-8") as fh:
            content = fh.read()
        return [json.loads(line) for line in content.strip().split("\n")]

    def find_message(self, message_id: str) -> dict[str, Any] | None:
        messages = self.read_all_messages()
        return next((m for m in messages if m["id"] == message_id), None)

    def load_context(self, limit: int = 100) -> list[dict[str, Any]]:
        context: list[dict[str, Any]] = []
        current_id = self.current_leaf_id
        while current_id and len(context) < limit:
            message = self.find_message(current_id)
            if message is None:
                break
            context.insert(0, message)
            current_id = message.get("parentId") or None
        return context


# -- context(100) ------------------------------------------------------------------------


def time_context(conv: Conversation, calls: int) -> tuple[list[float], list[uuid.UUID]]:
    """``calls`` timed ``context(CONTEXT_LIMIT)`` calls (ms each) and the last one's ids."""
    times = []
    clock = time.perf_counter
    result: list[Any] = []
    for _ in range(calls):
        t0 = clock()
        result = conv.context(CONTEXT_LIMIT)
        times.append((clock() - t0) * 1000.0)
    return times, [m.id for m in result]


def context_bench(
    base: str,
    messages: int,
    fork_every: int,
    rounds: int,
    calls: int,
    baseline_runs: int,
    seed: int,
    append_s: float,
) -> dict[str, Any]:
    log(f"context: building {messages:,} messages (fork every {fork_every:,}) in memory")
    t0 = time.perf_counter()
    conv, tree = build_tree(messages, fork_every, seed)
    build_s = time.perf_counter() - t0
    leaf = conv.active_leaf
    assert leaf is not None
    leaf_depth = conv.message(leaf).depth
    expected = [m.id for m in conv.context(CONTEXT_LIMIT)]
    log(f"context: built in {build_s:.1f} s: {tree}, active leaf at depth {leaf_depth:,}")
    if len(expected) != CONTEXT_LIMIT:
        msg = f"context({CONTEXT_LIMIT}) of the built tree has {len(expected)} messages"
        raise AssertionError(msg)

    jsonl = os.path.join(base, "session.jsonl")
    with open(jsonl, "w", encoding="utf-8") as fh:
        fh.writelines(conv.transcript())
    jsonl_bytes = os.path.getsize(jsonl)
    spec = SpecSessionLogger(jsonl, str(leaf))

    path = tempfile.mkdtemp(prefix="big-", dir=base)
    t0 = time.perf_counter()
    with open_synced(path) as store:
        load_into_store(store, conv)
        stored = store.count("messages")
    load_s = time.perf_counter() - t0
    if stored != messages:
        msg = f"loaded {stored} messages, wanted {messages}"
        raise AssertionError(msg)
    log(f"context: loaded into the store in {load_s:.1f} s; JSONL {jsonl_bytes / 2**20:.1f} MiB")
    sid = conv.session_id
    del conv  # the memory copy: from here on only the store and the file

    store = open_synced(path)
    try:
        big = conversations_on(store).get(sid)
        if _sids_of(store) != [sid] or big.active_leaf != leaf or len(big) != messages:
            msg = "the reopened conversation is not the one built"
            raise AssertionError(msg)
        ours: list[float] = []
        baseline: list[float] = []
        gc.collect()
        _, ids = time_context(big, 50)  # warm-up
        if ids != expected:
            raise AssertionError("the store's context(100) is not the built tree's")
        for r in range(rounds):
            times, ids = time_context(big, calls)
            assert ids == expected
            ours.extend(times)
            log(
                f"  round {r + 1}/{rounds}: context({CONTEXT_LIMIT}) median "
                f"{statistics.median(times):.4f} ms, p99 {percentile(times, 0.99):.4f} ms"
            )
            if r < baseline_runs:
                t0 = time.perf_counter()
                spec_context = spec.load_context(CONTEXT_LIMIT)
                baseline.append((time.perf_counter() - t0) * 1000.0)
                spec_ids = [uuid.UUID(m["id"]) for m in spec_context]
                if spec_ids != expected:
                    raise AssertionError("the baseline's loadContext(100) differs from ours")
                log(
                    f"  round {r + 1}/{rounds}: baseline loadContext({CONTEXT_LIMIT}) "
                    f"{baseline[-1]:.0f} ms ({CONTEXT_LIMIT} rereads of {messages:,} lines)"
                )
        small_ms = small_context(store, seed)
        big_rate = timed_appends(big, append_s)
        log(
            f"  sequential durable appends on the {messages:,}-message conversation "
            f"({tree['branches']} branches): {big_rate:.0f}/s"
        )
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)
        os.unlink(jsonl)
    median_ms = statistics.median(ours)
    baseline_ms = statistics.median(baseline)
    return {
        "context_load_ms": round(median_ms, 4),
        "baseline_context_load_ms": round(baseline_ms, 1),
        "speedup": round(baseline_ms / median_ms, 1),
        "context_load_p99_ms": round(percentile(ours, 0.99), 4),
        "context_load_calls": len(ours),
        "baseline_runs": len(baseline),
        "context_load_ms_1k_messages": round(small_ms, 4),
        "big_conversation_appends_per_s": round(big_rate, 1),
        "active_leaf_depth": leaf_depth,
        "tree": tree,
        "tree_build_s": round(build_s, 1),
        "store_load_s": round(load_s, 1),
        "jsonl_bytes": jsonl_bytes,
    }


def _sids_of(store: Store) -> list[uuid.UUID]:
    """The conversations a store holds."""
    return [uuid.UUID(bytes=key) for key, _ in store.scan("conversations")]


def timed_appends(conv: Conversation, seconds: float) -> float:
    """Sequential durable appends per second on ``conv`` for about ``seconds``."""
    texts = bodies(64, 11)
    clock = time.perf_counter
    n, t0 = 0, clock()
    end = t0 + seconds
    while clock() < end:
        conv.append("user" if n % 2 == 0 else "assistant", texts[n % 64])
        n += 1
    return n / (clock() - t0)


def small_context(store: Store, seed: int) -> float:
    """Median ``context(100)`` on a linear 1,000-message conversation in the same
    store (loaded the same way): the size of the conversation should not matter."""
    rng = random.Random(seed + 1)
    conv = Conversations(MemoryBackend(), RealClock()).get(uuid.uuid4())
    for i in range(1_000):
        conv.append(("user", "assistant")[i % 2], text(rng, i))
    load_into_store(store, conv)
    small = conversations_on(store).get(conv.session_id)
    time_context(small, 50)
    times, ids = time_context(small, 1_000)
    assert ids == [m.id for m in conv.context(CONTEXT_LIMIT)]
    log(
        f"  1,000-message conversation: context({CONTEXT_LIMIT}) median "
        f"{statistics.median(times):.4f} ms"
    )
    return statistics.median(times)


# -- durable appends ------------------------------------------------------------------------


def bodies(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [text(rng, i, 100, 300) for i in range(n)]


def _turns() -> list[tuple[str, str]]:
    """A conversation's turns: (role, text), user and assistant in turn."""
    return [(("user", "assistant")[n % 2], text) for n, text in enumerate(bodies(64, 7))]


def run_threads(store: Store, producers: int, warmup: float, window: float) -> dict[str, Any]:
    """``producers`` threads, each appending sequentially to its own conversation."""
    convs, turns = conversations_on(store), _turns()

    def step_for(conv: Conversation) -> Callable[[], object]:
        cycle = itertools.cycle(turns)
        return lambda: conv.append(*next(cycle))

    steps = [step_for(convs.get(uuid.uuid4())) for _ in range(producers)]
    return thread_window(store, steps, warmup, window, "append")


def run_async(store: Store, producers: int, warmup: float, window: float) -> dict[str, Any]:
    """``producers`` coroutines on one loop, each awaiting ``aappend`` on its own conversation."""
    convs, turns = conversations_on(store), _turns()

    def step_for(conv: Conversation) -> Callable[[], Awaitable[object]]:
        cycle = itertools.cycle(turns)
        return lambda: conv.aappend(*next(cycle))

    steps = [step_for(convs.get(uuid.uuid4())) for _ in range(producers)]
    return async_window(store, steps, warmup, window, "append")


RUNNERS = {"threads": run_threads, "async": run_async}


def appends_bench(base: str, reps: int, warmup: float, window: float) -> dict[str, Any]:
    """Each producer kind (64 conversations) and the single conversation, once per
    repetition, alternating the order, each on a fresh synced store."""
    modes = [("threads", CONVERSATIONS), ("async", CONVERSATIONS), ("threads", 1)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {mode: [] for mode in modes}
    for rep in range(reps):
        order = modes if rep % 2 == 0 else modes[::-1]
        for kind, producers in order:
            figures = on_fresh_store(
                base,
                f"appends-{kind}-{producers}-",
                functools.partial(RUNNERS[kind], producers=producers, warmup=warmup, window=window),
            )
            runs[(kind, producers)].append(figures)
            per_commit = figures["appends_per_commit"] or 0.0
            log(
                f"  rep {rep + 1}/{reps} {kind:7s} x {producers:2d} conversations: "
                f"{figures['appends_per_s']:8.0f} appends/s, {figures['commits']:6d} commits, "
                f"{per_commit:5.1f} appends per commit"
            )
    return {
        f"{kind}_{producers}": sorted(rs, key=lambda r: r["appends_per_s"])[(len(rs) - 1) // 2]
        for (kind, producers), rs in runs.items()
    } | {
        "all": {f"{k}_{p}": [round(r["appends_per_s"]) for r in rs] for (k, p), rs in runs.items()}
    }


# -- linked contexts ----------------------------------------------------------------------


def _linked_steps(store: Store, producers: int) -> list[SessionBranch]:
    """``producers`` sessions' context branches of one Main's conversation, forked
    at its first message (what 64 Branch sessions of one tree write on)."""
    shared = conversations_on(store).shared(uuid.uuid4())
    start = Conversation(shared).append("user", "the task")
    return [
        SessionBranch(shared, owner=uuid.uuid4(), name=f"branch:s-{i}", fork_at=start.id)
        for i in range(producers)
    ]


def _entries() -> list[tuple[Role, str, None, None, None]]:
    return [(Role(role), body, None, None, None) for role, body in _turns()]


def run_linked_threads(
    store: Store, producers: int, warmup: float, window: float
) -> dict[str, Any]:
    """``producers`` threads, each appending to its own session branch of one conversation."""
    entries = _entries()

    def step_for(view: SessionBranch) -> Callable[[], object]:
        cycle = itertools.cycle(entries)
        return lambda: view.write([next(cycle)])

    steps = [step_for(view) for view in _linked_steps(store, producers)]
    return thread_window(store, steps, warmup, window, "append")


def run_linked_async(store: Store, producers: int, warmup: float, window: float) -> dict[str, Any]:
    """``producers`` coroutines on one loop, each awaiting ``awrite`` on its own branch."""
    entries = _entries()

    def step_for(view: SessionBranch) -> Callable[[], Awaitable[object]]:
        cycle = itertools.cycle(entries)
        return lambda: view.awrite([next(cycle)])

    steps = [step_for(view) for view in _linked_steps(store, producers)]
    return async_window(store, steps, warmup, window, "append")


def run_store_records(store: Store, producers: int, warmup: float, window: float) -> dict[str, Any]:
    """The store's own group-commit rate: ``producers`` threads, each writing one
    message record of the appends' sizes per batch and waiting for it."""
    turns = _turns()

    def step_for(sid: uuid.UUID) -> Callable[[], object]:
        records = itertools.cycle(
            Message(
                id=uuid.uuid4(),
                parent_id=uuid.uuid4(),
                role=Role(role),
                content=body,
                timestamp=time.time(),
                branch_id=f"session_{uuid.uuid4().hex}",
            )
            for role, body in turns
        )
        return lambda: store.submit(store.batch().message(sid, next(records))).result(60.0)

    steps = [step_for(uuid.uuid4()) for _ in range(producers)]
    return thread_window(store, steps, warmup, window, "record")


def linked_appends_bench(base: str, reps: int, warmup: float, window: float) -> dict[str, Any]:
    """Linked appends (64 sessions' branches of one conversation, threads and
    coroutines) beside the store's own group-commit rate for one-record
    writes of the same sizes, alternated, each on a fresh synced store."""
    runners = {
        "linked_threads": run_linked_threads,
        "linked_async": run_linked_async,
        "store_records": run_store_records,
    }
    runs: dict[str, list[float]] = {name: [] for name in runners}
    for rep in range(reps):
        order = list(runners) if rep % 2 == 0 else list(runners)[::-1]
        for name in order:
            run = functools.partial(
                runners[name], producers=CONVERSATIONS, warmup=warmup, window=window
            )
            figures = on_fresh_store(base, f"{name}-", run)
            rate = figures.get("appends_per_s", figures.get("records_per_s", 0.0))
            runs[name].append(rate)
            log(f"  rep {rep + 1}/{reps} {name:14s} x {CONVERSATIONS}: {rate:8.0f}/s")
    median = {name: statistics.median(rates) for name, rates in runs.items()}
    linked = max(median["linked_threads"], median["linked_async"])
    return {
        "linked_appends_per_s": round(linked, 1),
        "linked_appends_per_s_threads": round(median["linked_threads"], 1),
        "linked_appends_per_s_async": round(median["linked_async"], 1),
        "store_group_commit_per_s": round(median["store_records"], 1),
        "append_ratio_to_store": round(linked / median["store_records"], 3),
    }


async def plain(session: AsyncSession) -> str:
    """The same sub-agent, its context never used (so nothing is linked)."""
    return f"done {session.task}"


async def noting(session: AsyncSession) -> str:
    await session.add_message("assistant", f"found {session.task}")
    return f"done {session.task}"


def spawn_round(base: str, skill: str, children: int, batch: int) -> float:
    """Spawns per second of ``children`` workers of one Main (``batch`` a
    ``spawn_many``) on a fresh synced store, until all ended and every write
    (their result messages too) is durable."""
    path = tempfile.mkdtemp(prefix=f"spawns-{skill}-", dir=base)
    agent = Agent(
        "bench",
        {"main": plain, "plain": plain, "noting": noting},
        main_skill="main",
        max_children=children,
    )
    store = open_synced(path)
    node = Node([agent], NodeConfig(max_sessions=children * 2), store=store)
    try:
        main = node.main("bench")
        node.conversation(main.session_id).append("user", "split this up")
        specs = [SpawnSpec(kind="worker", skill=skill, task=str(i)) for i in range(children)]
        gc.collect()
        t0 = time.perf_counter()
        for i in range(0, children, batch):
            for spawned in node.spawn_many(main, specs[i : i + batch]):
                if spawned.error is not None:
                    raise AssertionError(f"a spawn was refused: {spawned.error}")
        if not node.wait_idle(300.0):
            raise AssertionError("the tree did not settle")
        store.flush()
        elapsed = time.perf_counter() - t0
        landed = sum(1 for m in store.messages(main.session_id) if m.session_id is not None)
        wanted = children if skill == "noting" else 0
        if landed != wanted:
            raise AssertionError(f"{landed} results landed on the Main's branch, wanted {wanted}")
    finally:
        node.shutdown(grace=0, timeout=30.0)
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    return children / elapsed


def linked_spawn_bench(base: str, reps: int, children: int, batch: int) -> dict[str, Any]:
    """``linked_spawn_ratio``: workers that write on their context branch (their
    results landing on the Main's branch) against workers that never use their
    context, alternated, each round on a fresh node and store."""
    rates: dict[str, list[float]] = {"noting": [], "plain": []}
    for rep in range(reps):
        for skill in ("noting", "plain") if rep % 2 == 0 else ("plain", "noting"):
            rate = spawn_round(base, skill, children, batch)
            rates[skill].append(rate)
            log(f"  rep {rep + 1}/{reps} {skill:6s}: {children:,} workers at {rate:8.0f} spawns/s")
    linked, unlinked = statistics.median(rates["noting"]), statistics.median(rates["plain"])
    return {
        "linked_spawns_per_s": round(linked, 1),
        "unlinked_spawns_per_s": round(unlinked, 1),
        "linked_spawn_ratio": round(linked / unlinked, 3),
    }


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 messages, short windows")
    parser.add_argument("--dir", default=None, help="where the temporary stores go (real disk)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the tree's shape")
    args = parser.parse_args(argv)
    if args.quick:
        messages, fork_every, rounds, calls, baseline_runs = 5_000, 250, 3, 300, 3
        reps, warmup, window = 1, 0.25, 0.75
        spawned, spawn_reps = 2_000, 2
    else:
        messages, fork_every, rounds, calls, baseline_runs = 100_000, 1_000, 4, 500, 1
        reps, warmup, window = 3, 0.5, 2.0
        spawned, spawn_reps = 10_000, 4
    started = time.perf_counter()
    where = real_disk_dir("bench_conversation", args.dir)
    if where is None:
        return 2
    base, fstype = where
    log(
        f"bench_conversation: {'quick' if args.quick else 'full'} run, pid {os.getpid()}, "
        f"{os.cpu_count()} cpus, stores under {base} ({fstype})"
    )
    try:
        disk_ms = fdatasync_ms(base)
        log(f"raw disk: pwrite+fdatasync {disk_ms:.3f} ms (median)")
        ctx = context_bench(
            base, messages, fork_every, rounds, calls, baseline_runs, args.seed, window
        )
        log(f"durable appends: {reps} x {window} s per mode (after {warmup} s warm-up)")
        app = appends_bench(base, reps, warmup, window)
        log(f"linked appends: {CONVERSATIONS} sessions' branches of one conversation")
        linked = linked_appends_bench(base, reps, warmup, window)
        log(f"linked spawns: {spawned:,} workers a round")
        spawns = linked_spawn_bench(base, spawn_reps, spawned, 500)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    threads, coros, single = app["threads_64"], app["async_64"], app["threads_1"]
    head, kind = (
        (threads, "threads")
        if threads["appends_per_s"] >= coros["appends_per_s"]
        else (coros, "async")
    )
    summary: dict[str, Any] = {
        "bench": "conversation",
        "messages": messages,
        "context_limit": CONTEXT_LIMIT,
        "context_load_ms": ctx["context_load_ms"],
        "baseline_context_load_ms": ctx["baseline_context_load_ms"],
        "speedup": ctx["speedup"],
        "concurrent_conversations": CONVERSATIONS,
        "durable_appends_per_s": round(head["appends_per_s"], 1),
        "single_conversation_appends_per_s": round(single["appends_per_s"], 1),
        "sync": bool(SYNC_CHECKS) and all(SYNC_CHECKS),  # asserted on every store
        "producers_kind": kind,
        "commits": head["commits"],
        "appends": head["appends"],
        "appends_per_commit": round(head["appends_per_commit"] or 0.0, 1),
        "durable_appends_per_s_threads": round(threads["appends_per_s"], 1),
        "durable_appends_per_s_async": round(coros["appends_per_s"], 1),
        "commits_threads": threads["commits"],
        "commits_async": coros["commits"],
        "single_conversation_commits": single["commits"],
        "appends_per_s_all": app["all"],
        "append_window_s": window,
        "append_repetitions": reps,
        "fdatasync_ms": round(disk_ms, 3),
        "store_fs": fstype,
        "quick": args.quick,
        "quick_sizes": args.quick,
        "cpus": os.cpu_count(),
    }
    summary.update(linked)
    summary.update(spawns)
    summary["unlinked_append_ratio_to_store"] = round(
        head["appends_per_s"] / linked["store_group_commit_per_s"], 3
    )
    summary.update({k: v for k, v in ctx.items() if k not in summary})
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
