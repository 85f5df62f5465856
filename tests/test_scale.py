"""Many sessions on one node: what they cost in threads and timers."""

from __future__ import annotations

import asyncio
import functools
import gc
import pickle
import threading
import uuid
from typing import Any

import pytest

from sessiontree.actors import Cancelled, RealClock, VirtualClock
from sessiontree.actors.runtime import SessionCond
from sessiontree.protocol import ErrorCode, SessionKind, SessionState, SpawnSpec
from sessiontree.supervision import Agent, Node, NodeConfig
from tests.conftest import WAIT, settle

SESSIONS = 1_000


async def waits(session: Any) -> None:
    await session.sleep(3_600.0)


AGENT = Agent(
    "agent",
    {"main": lambda session: None, "waits": waits},
    main_skill="main",
    max_children=SESSIONS,
)


def spawn_all(node: Node) -> list[Any]:
    main = node.main("agent")
    specs = [SpawnSpec(kind=SessionKind.WORKER, skill="waits", ttl=600.0)] * SESSIONS
    answers = node.spawn_many(main, specs)
    assert all(a.ok for a in answers)
    settle(node)
    return answers


def settled_main(make_node: Any, clock: VirtualClock) -> tuple[Node, Any, int]:
    """A node with its Main settled, and the timers then pending on ``clock``."""
    node = make_node(AGENT, grace=0.0)
    main = node.main("agent")
    settle(node)
    return node, main, clock.pending_timers


def test_sessions_hold_no_thread_of_their_own(make_node: Any) -> None:
    before = threading.active_count()
    node = make_node(AGENT)
    spawn_all(node)  # a Branch or Worker holds no actor
    # the event loop serving every actor, its watchdog, the step threads: not one per session
    assert threading.active_count() - before < 10
    for i in range(200):  # a Main's actor is served on the loop too
        node.main("agent", f"internal:channel:c{i}")
    settle(node)
    assert threading.active_count() - before < 10


def test_ttls_of_every_session_share_one_timer_heap_and_thread() -> None:
    clock = RealClock()
    before = threading.active_count()
    with Node([AGENT], NodeConfig(grace=0.0), clock=clock) as node:
        spawn_all(node)  # one batch: its children share one timer
        main = node.main("agent", "internal:channel:other")
        for _ in range(10):  # a spawn of its own has a timer of its own
            assert node.spawn(main, SpawnSpec(kind=SessionKind.WORKER, skill="waits")).ok
        live = [t for _, _, t in clock._heap._heap if not t.cancelled]
        assert 11 <= len(live) <= 14  # the batch, the ten, the periodic check (and Mains')
        assert clock._thread is not None
        assert clock._thread.name == "sessiontree-timers"
        assert threading.active_count() - before < 10
    clock.close()


def test_a_batch_shares_one_ttl_timer_until_its_last_child_ends(
    make_node: Any, clock: VirtualClock
) -> None:
    node = make_node(AGENT, grace=0.0)
    pending = clock.pending_timers
    answers = spawn_all(node)
    assert clock.pending_timers == pending + SESSIONS + 1  # their sleeps, and one TTL
    for answer in answers[:-1]:
        assert node.cancel(answer.ref) is None
    settle(node)
    assert all(node.get(a.ref).state is SessionState.CANCELLED for a in answers[:-1])
    # one child still lives: its TTL (the batch's timer) still runs, and ends it alone
    clock.advance(600.0)
    result = node.wait(answers[-1].ref, timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.EXPIRED
    assert all(node.get(a.ref).state is SessionState.CANCELLED for a in answers[:-1])


def test_a_batch_ttl_timer_is_cancelled_when_every_child_ended(
    make_node: Any, clock: VirtualClock
) -> None:
    node, main, pending = settled_main(make_node, clock)
    answers = node.spawn_many(main, [SpawnSpec(kind=SessionKind.WORKER, skill="waits")] * 50)
    settle(node)
    assert all(node.cancel(a.ref) is None for a in answers)
    settle(node)
    heap = clock._heap._heap
    assert sum(not t.cancelled for _, _, t in heap) <= pending  # the batch's timer is gone


def test_specs_alike_but_for_their_work_share_one_admission_and_timer(
    make_node: Any, clock: VirtualClock
) -> None:
    node, main, pending = settled_main(make_node, clock)
    specs = [
        SpawnSpec(
            kind=SessionKind.WORKER,
            skill="waits",
            ttl=600.0,
            task=f"task {i}",
            context_summary=f"summary {i}",
            metadata={"i": i},
            input={"n": i},
        )
        for i in range(20)
    ]
    specs.append(SpawnSpec(kind=SessionKind.WORKER, skill="waits", ttl=60.0, task="other"))
    answers = node.spawn_many(main, specs)
    settle(node)
    assert clock.pending_timers == pending + len(specs) + 2  # their sleeps; two TTLs
    infos = [node.get(a.ref) for a in answers]
    for i, info in enumerate(infos[:-1]):
        assert (info.task, info.context_summary, info.metadata) == (
            f"task {i}",
            f"summary {i}",
            {"i": i},
        )
        assert node.inspect(answers[i].ref, lambda core: core.info.input) == {"n": i}
    assert (infos[-1].task, infos[-1].ttl) == ("other", 60.0)


def test_children_of_a_batch_share_their_creation_instant(make_node: Any) -> None:
    node = make_node(AGENT, grace=0.0)
    answers = spawn_all(node)
    infos = [node.get(a.ref) for a in answers]
    assert len({i.session_id for i in infos}) == SESSIONS
    assert {(i.created_at, i.deadline) for i in infos} == {
        (infos[0].created_at, infos[0].created_at + 600.0)
    }


def test_ttls_fire_for_every_session_from_the_one_heap(make_node: Any, clock: VirtualClock) -> None:
    node = make_node(AGENT, grace=0.0)
    answers = spawn_all(node)
    clock.advance(600.0)
    for answer in answers[:: SESSIONS // 20]:
        result = node.wait(answer.ref, timeout=WAIT)
        assert result is not None
        assert result.status is SessionState.EXPIRED


# -- what a session leaves for the garbage collector ---------------------------


def test_ended_sessions_leave_no_cyclic_garbage(make_node: Any, clock: VirtualClock) -> None:
    # Freed with their last reference, not by the cyclic collector: a node
    # ending thousands of sessions must not leave them all for a collection.
    node = make_node(AGENT, grace=0.0, retain_terminal=1)
    main = node.main("agent")
    ended = 200
    gc.collect()
    gc.disable()
    try:
        specs = [SpawnSpec(kind=SessionKind.WORKER, skill="waits")] * ended
        answers = node.spawn_many(main, specs)
        assert all(a.ok for a in answers)
        settle(node)
        for answer in answers:
            assert node.cancel(answer.ref) is None
        settle(node)
        clock.advance(1.0)
        settle(node)
        assert node.stats()["live_sessions"] == 1  # the Main
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert unreachable < ended // 4, f"{unreachable} objects in cycles after {ended} endings"


def test_a_tuned_node_raises_the_collector_thresholds_until_the_last_one_closes(
    clock: VirtualClock,
) -> None:
    found = gc.get_threshold()
    tuned = (50_000, 20, 20)  # as NodeConfig.gc_tuning says
    first = Node([AGENT], NodeConfig(), clock=clock)  # tuned by default
    second = Node([AGENT], NodeConfig(gc_tuning=True), clock=clock)
    plain = Node([AGENT], NodeConfig(gc_tuning=False), clock=clock)
    try:
        assert gc.get_threshold() == tuned
        first.shutdown(grace=0, timeout=WAIT)
        first.shutdown(grace=0, timeout=WAIT)  # idempotent: still one holder left
        assert gc.get_threshold() == tuned
    finally:
        second.shutdown(grace=0, timeout=WAIT)
        plain.shutdown(grace=0, timeout=WAIT)
    assert gc.get_threshold() == found


def test_a_node_leaves_the_collector_alone_when_asked(make_node: Any) -> None:
    found = gc.get_threshold()
    make_node(AGENT, gc_tuning=False)
    assert gc.get_threshold() == found


def test_gc_tuning_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match=r"NodeConfig\.gc_tuning must be True or False"):
        NodeConfig(gc_tuning="yes")  # type: ignore[arg-type]


# -- the session's lock ---------------------------------------------------------


def test_session_cond_wakes_every_waiting_thread() -> None:
    cond = SessionCond()
    flag = [False]
    inside: list[int] = []
    woke: list[int] = []
    both_in = threading.Event()

    def waiter(i: int) -> None:
        with cond:
            inside.append(i)
            if len(inside) == 2:
                both_in.set()  # the lock is free again only once this one waits too
            while not flag[0]:
                cond.wait()
            woke.append(i)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    assert both_in.wait(WAIT)
    with cond:
        flag[0] = True
        cond.notify_all()
    for thread in threads:
        thread.join(WAIT)
    assert sorted(woke) == [0, 1]


def test_session_cond_is_reentrant_and_refuses_a_wait_without_the_lock() -> None:
    cond = SessionCond()
    with cond, cond:  # re-entrant, like the RLock of threading.Condition()
        cond.notify_all()  # nobody waits: nothing happens
    with pytest.raises(RuntimeError, match="un-acquired lock"):
        cond.wait()


# -- the timeouts of async waits ------------------------------------------------


def test_loop_timers_fire_in_order_from_one_loop_timer() -> None:
    clock = RealClock()
    loop = asyncio.new_event_loop()
    fired: list[str] = []
    handles: dict[str, Any] = {}

    async def run() -> None:
        start = loop.time()
        for name, delay in (("c", 0.15), ("a", 0.05), ("b", 0.10), ("d", 0.08)):
            handles[name] = clock.call_later_on(loop, delay, functools.partial(fired.append, name))
        timers = clock._on_loops[loop]
        assert timers._timer_when == pytest.approx(start + 0.05, abs=0.01)  # moved for "a"
        handles["d"].cancel()  # a wait that ended first: its timer never fires
        handles["d"].cancel()  # twice is nothing
        timers.fire_due(loop, now=start + 0.07)
        await asyncio.sleep(0)  # the due callbacks run (in the order they were due)
        assert fired == ["a"]
        timers.fire_due(loop, now=start + 1.0)
        await asyncio.sleep(0)

    try:
        loop.run_until_complete(run())
        assert fired == ["a", "b", "c"]
        handles["a"].cancel()  # after it fired: nothing
        assert not any(not handle.cancelled() for handle in loop._scheduled)  # type: ignore[attr-defined]
    finally:
        loop.close()


def test_cancelled_loop_timers_are_dropped_from_the_heap() -> None:
    clock = RealClock()
    loop = asyncio.new_event_loop()
    fired: list[int] = []

    async def run() -> None:
        handles = [
            clock.call_later_on(loop, 3_600.0, functools.partial(fired.append, i))
            for i in range(300)
        ]
        timers = clock._on_loops[loop]
        for handle in handles[:200]:
            handle.cancel()
        assert len(timers._heap) < 200  # rebuilt once half of it was dead
        for handle in handles[200:]:
            handle.cancel()
        assert timers._heap == []

    try:
        loop.run_until_complete(run())
        assert not any(not handle.cancelled() for handle in loop._scheduled)  # type: ignore[attr-defined]
        assert fired == []
    finally:
        loop.close()


async def naps(session: Any) -> str:
    await session.sleep(0.05)
    return "rested"


def test_async_sleeps_on_a_real_clock_end_and_cancel() -> None:
    agent = Agent("agent", {"main": lambda session: None, "naps": naps, "waits": waits})
    with Node([agent], NodeConfig(grace=0.0), clock=RealClock()) as node:
        main = node.main("agent")
        napping = [main.spawn(kind=SessionKind.WORKER, skill="naps").ref for _ in range(3)]
        waiting = main.spawn(kind=SessionKind.WORKER, skill="waits").ref
        for ref in napping:
            assert ref.wait(WAIT).summary == "rested"
        settle(node)
        waiting.cancel()
        result = waiting.wait(WAIT)
        assert result.status is SessionState.CANCELLED


def test_cancelled_carries_its_code_and_session_and_pickles() -> None:
    session_id = uuid.uuid4()
    exc = Cancelled(ErrorCode.PARENT_TERMINATED, session_id)
    assert exc.code is ErrorCode.PARENT_TERMINATED
    assert exc.session_id == session_id
    assert str(exc) == f"session {session_id} cancelled ({ErrorCode.PARENT_TERMINATED})"
    back = pickle.loads(pickle.dumps(exc))
    assert (back.code, back.session_id) == (exc.code, session_id)
