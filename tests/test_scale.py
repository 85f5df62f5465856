"""Many sessions on one node: what they cost in threads and timers."""

from __future__ import annotations

import threading
from typing import Any

from sessiontree.actors import RealClock, VirtualClock
from sessiontree.protocol import SessionKind, SessionState, SpawnSpec
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


def test_pooled_sessions_share_a_few_threads(make_node: Any) -> None:
    before = threading.active_count()
    node = make_node(AGENT, actor_type="pooled", dispatcher_threads=2)
    spawn_all(node)
    # the session pool, its watchdog, the Cortex, the event loop: not one per session
    assert threading.active_count() - before < 10


def test_threading_sessions_hold_a_thread_each(make_node: Any) -> None:
    before = threading.active_count()
    node = make_node(AGENT, actor_type="threading")
    spawn_all(node)
    assert threading.active_count() - before >= SESSIONS


def test_ttls_of_every_session_share_one_timer_heap_and_thread() -> None:
    clock = RealClock()
    before = threading.active_count()
    with Node([AGENT], NodeConfig(grace=0.0, actor_type="pooled"), clock=clock) as node:
        spawn_all(node)
        # one heap entry per session's TTL (and the periodic check), one thread for all
        assert len(clock._heap) >= SESSIONS
        assert clock._thread is not None
        assert clock._thread.name == "sessiontree-timers"
        assert threading.active_count() - before < 10
    clock.close()


def test_ttls_fire_for_every_session_from_the_one_heap(make_node: Any, clock: VirtualClock) -> None:
    node = make_node(AGENT, grace=0.0)
    answers = spawn_all(node)
    clock.advance(600.0)
    for answer in answers[:: SESSIONS // 20]:
        result = node.wait(answer.ref, timeout=WAIT)
        assert result is not None
        assert result.status is SessionState.EXPIRED
