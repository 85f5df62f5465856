"""``run(timeout=)`` owns its child: at the timeout (node clock) the child is
cancelled with the grace, code ``timed_out``, and the call returns the result
that ends it — never None, never a session left running behind the caller."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.protocol import ErrorCode, RejectedInputError, SessionKind, SessionState
from sessiontree.supervision import Agent
from tests.conftest import WAIT, settle

pytestmark = pytest.mark.timeout(60)

GRACE = 5.0


def idle_main(session: Any) -> None:
    return None


def quick(session: Any) -> str:
    return "ok"


def spawns_then_waits(session: Any) -> str:
    session.spawn(kind="worker", skill="wraps_up", task="below")
    session.sleep(10_000)
    return "finished"


@pytest.fixture
def started() -> threading.Semaphore:
    """Released once by every ``wraps_up`` run that has started."""
    return threading.Semaphore(0)


@pytest.fixture
def node(
    make_node: Any, release: threading.Event, caught: threading.Event, started: threading.Semaphore
) -> Any:
    def wraps_up(session: Any) -> str:
        """Works until cancelled, then hands back what it has."""
        started.release()
        try:
            session.sleep(10_000)
        except Cancelled:
            return f"partial ({session.cancel_reason})"
        return "finished"

    def stubborn(session: Any) -> str:
        """Ignores its cancellation until the test lets it go."""
        started.release()
        try:
            session.sleep(10_000)
        except Cancelled:
            caught.set()
            release.wait(WAIT)
        return "late"

    skills = {
        "main": idle_main,
        "wraps_up": wraps_up,
        "stubborn": stubborn,
        "quick": quick,
        "spawns_then_waits": spawns_then_waits,
    }
    return make_node(Agent("agent", skills, main_skill="main"), grace=GRACE)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run a blocking ``run`` on a helper thread (the test drives the clock)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def running(node: Any, kind: SessionKind = SessionKind.BRANCH) -> list[Any]:
    """The sessions of ``kind`` still active once the node is idle."""
    settle(node)
    return [s for s in node.sessions(kind=kind) if s.state is SessionState.ACTIVE]


def test_a_run_past_its_timeout_is_cancelled_and_returns_the_partial(
    node: Any, clock: VirtualClock, started: threading.Semaphore
) -> None:
    main = node.main("agent")
    thread, out = in_thread(lambda: node.run(main, kind="branch", skill="wraps_up", timeout=10))
    assert started.acquire(timeout=WAIT)
    (child,) = running(node)
    clock.advance(9.9)
    assert running(node) == [child]  # not yet
    clock.advance(0.1)
    thread.join(WAIT)
    (result,) = out
    assert result.session_id == child.session_id  # the caller can look it up
    assert result.status is SessionState.CANCELLED
    assert result.error.code is ErrorCode.TIMED_OUT
    assert "timed out" in result.error.message
    assert result.summary == "partial (timed_out)"
    assert node.get(child.session_id).state is SessionState.CANCELLED


def test_a_child_still_running_at_the_end_of_the_grace_is_forced(
    node: Any,
    clock: VirtualClock,
    release: threading.Event,
    caught: threading.Event,
    started: threading.Semaphore,
) -> None:
    main = node.main("agent")
    thread, out = in_thread(lambda: main.run(kind="branch", skill="stubborn", timeout=1))
    assert started.acquire(timeout=WAIT)
    (child,) = running(node)
    clock.advance(1.0)  # the timer posts the cancel to the Cortex now
    assert caught.wait(WAIT)  # cancelled: it ignores it, in its grace
    # answered after the cancel's turn, which armed the grace's deadline
    assert node.get(child.session_id).state is SessionState.ACTIVE
    assert not out
    clock.advance(GRACE)
    thread.join(WAIT)
    (result,) = out
    assert result.status is SessionState.CANCELLED
    assert result.error.code is ErrorCode.TERMINATED_BY_FORCE, result
    release.set()


def test_the_childs_subtree_goes_with_it(
    node: Any, clock: VirtualClock, started: threading.Semaphore
) -> None:
    main = node.main("agent")
    thread, out = in_thread(
        lambda: node.run(main, kind="branch", skill="spawns_then_waits", timeout=2)
    )
    assert started.acquire(timeout=WAIT)
    (worker,) = running(node, SessionKind.WORKER)
    clock.advance(2.0)
    thread.join(WAIT)
    assert out[0].error.code is ErrorCode.TIMED_OUT
    below = node.wait(worker.session_id, WAIT)
    assert below.error.code is ErrorCode.PARENT_TERMINATED
    assert below.summary == "partial (parent_terminated)"


def test_a_run_that_ends_in_time_is_not_touched_by_its_timeout(
    node: Any, clock: VirtualClock
) -> None:
    main = node.main("agent")
    result = main.run(kind="worker", skill="quick", timeout=5)
    assert result.ok
    assert result.summary == "ok"
    clock.advance(10.0)
    assert node.result(result.session_id) == result


def test_a_timeout_of_zero_cancels_at_once(
    node: Any, clock: VirtualClock, started: threading.Semaphore
) -> None:
    main = node.main("agent")
    thread, out = in_thread(lambda: node.run(main, kind="branch", skill="wraps_up", timeout=0))
    assert started.acquire(timeout=WAIT)
    settle(node)
    clock.advance(0.0)  # due now: the first look at the clock fires it
    thread.join(WAIT)
    assert out[0].error.code is ErrorCode.TIMED_OUT


def test_the_awaitable_twins_time_out_alike(
    node: Any, clock: VirtualClock, started: threading.Semaphore
) -> None:
    main = node.main("agent")

    async def both() -> list[Any]:
        return list(
            await asyncio.gather(
                node.arun(main, kind="branch", skill="wraps_up", timeout=3),
                main.arun(kind="branch", skill="wraps_up", timeout=3),
            )
        )

    thread, out = in_thread(lambda: asyncio.run(both()))
    assert started.acquire(timeout=WAIT)
    assert started.acquire(timeout=WAIT)
    assert len(running(node)) == 2
    clock.advance(3.0)
    thread.join(WAIT)
    (results,) = out
    assert [r.error.code for r in results] == [ErrorCode.TIMED_OUT] * 2
    assert [r.summary for r in results] == ["partial (timed_out)"] * 2


@pytest.mark.parametrize("timeout", [-1.0, math.inf, math.nan, "5", True])
def test_a_bad_timeout_is_refused_naming_it_and_spawns_nothing(node: Any, timeout: Any) -> None:
    main = node.main("agent")
    with pytest.raises(RejectedInputError, match="timeout") as raised:
        node.run(main, kind="worker", skill="quick", timeout=timeout)
    assert raised.value.field == "timeout"
    with pytest.raises(RejectedInputError, match="timeout"):
        main.run(kind="worker", skill="quick", timeout=timeout)
    with pytest.raises(RejectedInputError, match="timeout"):
        asyncio.run(main.arun(kind="worker", skill="quick", timeout=timeout))
    assert node.sessions(kind=SessionKind.WORKER) == []
