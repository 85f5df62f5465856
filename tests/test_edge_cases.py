"""Edge cases found in review: each once failed the node, hung, or leaked."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.protocol import (
    ErrorCode,
    Outcome,
    RejectedInputError,
    SessionKind,
    SessionState,
)
from sessiontree.supervision import Agent, EventKind, Node, NodeConfig
from sessiontree.supervision import _tree as tree_module
from tests.conftest import WAIT, settle


def idle_main(session: Any) -> None:
    return None


def quick(session: Any) -> str:
    return "ok"


def waits(session: Any) -> str:
    session.sleep(10_000)
    return "done"


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(artifacts=[("not", "a mapping")]),  # type: ignore[arg-type]
        Outcome(memory_ids=7),  # type: ignore[arg-type]
        Outcome(summary=3),  # type: ignore[arg-type]
    ],
)
def test_a_skill_returning_a_malformed_outcome_crashes_only_itself(
    make_node: Any, outcome: Outcome
) -> None:
    node = make_node(Agent("agent", {"main": idle_main, "bad": lambda s: outcome}))
    result = node.run(node.main("agent"), kind="worker", skill="bad", timeout=WAIT)
    assert result.error.code is ErrorCode.CRASHED
    assert result.error.detail["type"] == "builtins.TypeError"
    assert node.failure is None
    assert node.main("agent").state is SessionState.ACTIVE


def test_an_abandoned_async_wait_leaves_nothing_behind_and_never_fails_the_node(
    make_node: Any,
) -> None:
    node = make_node(Agent("agent", {"main": idle_main, "waits": waits}))
    ref = node.main("agent").spawn(kind="branch", skill="waits").ref

    async def give_up() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ref.await_result(), timeout=0.05)

    asyncio.run(give_up())  # that loop is closed from here on
    settle(node)
    assert node.stats()["result_waiters"] == 0
    ref.cancel()
    assert ref.wait(WAIT).status is SessionState.CANCELLED
    assert node.failure is None


def test_a_sync_main_cycle_never_takes_the_thread_its_child_needs(make_node: Any) -> None:
    heard: list[Any] = []

    def lead(session: Any) -> None:
        if session.message == "go":
            child = session.spawn(kind="worker", skill="quick")
            heard.append(session.wait(child.session_id).summary)

    node = make_node(
        Agent("agent", {"lead": lead, "quick": quick}, main_skill="lead"), max_step_threads=1
    )
    node.main("agent").send("go")
    settle(node)
    assert heard == ["ok"]


def test_evicting_an_ended_main_keeps_the_key_of_its_successor(make_node: Any) -> None:
    node = make_node(Agent("agent", {"main": idle_main, "quick": quick}), retain_terminal=1)
    first = node.main("agent", "telegram:dm:1")
    first.cancel()
    second = node.main("agent", "telegram:dm:1")
    assert second != first
    node.run(second, kind="worker", skill="quick", timeout=WAIT)  # evicts the first main
    node.run(second, kind="worker", skill="quick", timeout=WAIT)
    assert node.main("agent", "telegram:dm:1") == second


def test_a_session_ended_before_its_run_began_never_runs(make_node: Any) -> None:
    ran: list[str] = []

    def work(session: Any) -> str:
        ran.append(session.task)
        return "ok"

    node = make_node(Agent("agent", {"main": idle_main, "work": work}), grace=0.0)
    main = node.main("agent")
    refs = []
    for i in range(30):
        ref = main.spawn(kind="branch", skill="work", task=str(i)).ref
        ref.cancel()
        refs.append(ref)
    settle(node)
    for ref in refs:
        result = ref.wait(WAIT)
        if ref.info().task not in ran:  # it never ran: nothing was held for it
            assert result.error.code is ErrorCode.TERMINATED_BY_FORCE
    stats = node.stats()
    assert (stats["slots_in_use"], stats["zombies"], stats["sync_threads"]) == (0, 0, 0)


def test_the_shutdown_grace_applies_to_workers_and_their_parents_hear(
    make_node: Any, clock: VirtualClock
) -> None:
    release = threading.Event()

    def stubborn(session: Any) -> str:
        try:
            session.sleep(10_000)
        finally:
            release.wait(WAIT)
        return "late"

    node = make_node(Agent("agent", {"main": idle_main, "stubborn": stubborn}), grace=600.0)
    main = node.main("agent")
    worker = main.spawn(kind="worker", skill="stubborn").ref
    settle(node)
    stopper = threading.Thread(target=lambda: node.shutdown(grace=2.0, timeout=WAIT))
    stopper.start()
    assert worker.wait(0.2) is None
    clock.advance(2.0)  # the shutdown's grace, not the node's 600 s
    stopper.join(WAIT)
    final = {s.session_id: s.state for s in node.final_sessions}
    assert final[worker.session_id] is SessionState.CANCELLED
    release.set()


def test_nothing_pending_starts_while_the_node_shuts_down(make_node: Any) -> None:
    started: list[str] = []
    go = threading.Event()

    def work(session: Any) -> str:
        started.append(session.task)
        go.wait(WAIT)  # holds the only compute slot, no checkpoint
        session.checkpoint()  # parks here when the shutdown asks
        return "done"

    node = make_node(Agent("agent", {"main": idle_main, "work": work}), max_running_skills=1)
    main = node.main("agent")
    first = main.spawn(kind="branch", skill="work", task="A").ref
    second = main.spawn(kind="branch", skill="work", task="B").ref
    asked = threading.Event()
    node.subscribe(lambda e: e.kind is EventKind.SUSPEND_REQUESTED and asked.set())
    stopper = threading.Thread(target=lambda: node.shutdown(grace=5.0, timeout=WAIT))
    stopper.start()
    assert asked.wait(WAIT)  # the shutdown asked A to park; now let it reach a checkpoint
    go.set()
    stopper.join(WAIT)
    final = {s.session_id: s.state for s in node.final_sessions}
    assert started == ["A"]
    assert final[first.session_id] is SessionState.SUSPENDED
    assert final[second.session_id] is SessionState.PENDING


def test_a_second_collect_waits_only_for_children_not_yet_taken(make_node: Any) -> None:
    def twice(session: Any) -> dict[str, Any]:
        session.spawn(kind="worker", skill="quick")
        first = session.collect()
        session.spawn(kind="worker", skill="quick")
        second = session.collect()
        return {"first": len(first), "second": len(second), "ok": second[0].result.ok}

    node = make_node(Agent("agent", {"main": idle_main, "twice": twice, "quick": quick}))
    result = node.run(node.main("agent"), kind="branch", skill="twice", timeout=WAIT)
    assert result.artifacts == {"first": 1, "second": 1, "ok": True}


def test_zombies_are_evicted_once_their_thread_returns(make_node: Any) -> None:
    release, started = threading.Event(), threading.Event()

    def hang(session: Any) -> str:
        started.set()
        release.wait(WAIT)  # no checkpoint: forced termination abandons this thread
        return "late"

    agent = Agent("agent", {"main": idle_main, "hang": hang, "quick": quick})
    node = make_node(agent, grace=0.0, retain_terminal=1)
    main = node.main("agent")
    zombie = main.spawn(kind="worker", skill="hang").ref
    assert started.wait(WAIT)
    zombie.cancel()
    assert node.stats()["zombies"] == 1
    for _ in range(3):
        node.run(main, kind="worker", skill="quick", timeout=WAIT)
    release.set()
    settle(node)
    for _ in range(3):
        node.run(main, kind="worker", skill="quick", timeout=WAIT)
    assert node.stats()["indexed_sessions"] == 2  # the main and the last ended worker


def test_a_skill_spawning_after_shutdown_is_let_go_with_node_closed(clock: VirtualClock) -> None:
    # A shutdown lets every running skill go: its next checkpoint (this spawn)
    # raises Cancelled(node_closed), so its thread ends (issue 21).
    entered, go, answered = threading.Event(), threading.Event(), threading.Event()
    answers: list[Any] = []

    def lead(session: Any) -> None:
        entered.set()
        go.wait(WAIT)
        try:
            session.spawn(kind="worker", skill="quick")
        except Cancelled as exc:
            answers.append(exc.code)
            raise
        finally:
            answered.set()

    node = Node([Agent("agent", {"lead": lead, "quick": quick}, main_skill="lead")], clock=clock)
    node.main("agent").send("hi")
    assert entered.wait(WAIT)
    node.shutdown(grace=0, timeout=1.0)  # the cycle is still running: it is left behind
    go.set()
    assert answered.wait(WAIT)
    assert answers == [ErrorCode.NODE_CLOSED]


def test_nonsense_periodic_checks_and_agent_ttls_are_refused() -> None:
    with pytest.raises(ValueError, match="check_interval"):
        NodeConfig(check_interval=0.0)
    with pytest.raises(ValueError, match="ttls"):
        Agent("agent", {"main": idle_main}, ttls={SessionKind.MAIN: -1.0})


def test_rejected_control_input_is_counted(make_node: Any) -> None:
    node = make_node(Agent("agent", {"main": idle_main}))
    for bad in (b"{", b'{"type":"nope"}', b"[]"):
        with pytest.raises(RejectedInputError):
            node.control(bad)
    assert node.stats()["rejected_input"] == 3


def test_a_child_runs_without_an_actor_of_its_own(
    make_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(Agent("agent", {"main": idle_main, "quick": quick}))
    main = node.main("agent")

    def no_actor(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a branch or worker never gets a mailbox actor")

    monkeypatch.setattr(tree_module, "start_actor", no_actor)
    for kind in ("worker", "branch"):
        result = node.run(main, kind=kind, skill="quick", timeout=WAIT)
        assert result is not None
        assert result.ok, result
    assert node.failure is None


def test_a_run_that_times_out_ends_its_session_and_the_node_goes_on_serving(
    make_node: Any, clock: VirtualClock
) -> None:
    node = make_node(Agent("agent", {"main": idle_main, "waits": waits, "quick": quick}))
    main = node.main("agent")
    spawned = threading.Event()
    node.subscribe(lambda event: spawned.set() if event.kind is EventKind.SPAWNED else None)
    out: list[Any] = []
    runner = threading.Thread(
        target=lambda: out.append(node.run(main, kind="worker", skill="waits", timeout=0.05))
    )
    runner.start()
    assert spawned.wait(WAIT)  # the run reached the Cortex
    (running,) = node.sessions(kind=SessionKind.WORKER)  # after that turn: its timer armed
    assert running.state is SessionState.ACTIVE
    clock.advance(0.05)
    runner.join(WAIT)
    (timed_out,) = out
    assert timed_out.error.code is ErrorCode.TIMED_OUT
    assert timed_out.session_id == running.session_id
    assert node.get(running.session_id).state is SessionState.CANCELLED  # nothing left behind
    result = node.run(main, kind="worker", skill="quick", timeout=WAIT)
    assert result is not None
    assert result.summary == "ok"
    assert node.failure is None


def test_a_refused_run_is_a_failed_result_with_the_nil_id(make_node: Any) -> None:
    node = make_node(Agent("agent", {"main": idle_main, "waits": waits}))
    worker = node.main("agent").spawn(kind="worker", skill="waits").ref
    result = node.run(worker, kind="worker", skill="waits", timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.FAILED
    assert result.error.code is ErrorCode.WORKER_CANNOT_SPAWN
    assert result.session_id.int == 0

    async def awaited() -> Any:
        return await node.arun(worker, kind="worker", skill="waits", timeout=WAIT)

    assert asyncio.run(awaited()).error.code is ErrorCode.WORKER_CANNOT_SPAWN


def test_a_bad_memory_key_is_refused_by_name(make_node: Any) -> None:
    def writes(session: Any) -> str:
        session.memory_put("", 1)
        return "wrote"

    node = make_node(Agent("agent", {"main": idle_main, "writes": writes}))
    result = node.run(node.main("agent"), kind="branch", skill="writes", timeout=WAIT)
    assert result.error.code is ErrorCode.CRASHED
    assert "memory key" in result.error.message
    assert result.error.detail["type"].endswith("RejectedInputError")


def test_resume_then_suspend_of_a_parked_branch_leaves_it_suspended(make_node: Any) -> None:
    node = make_node(Agent("agent", {"main": idle_main, "waits": waits}))
    ref = node.main("agent").spawn(kind="branch", skill="waits").ref
    settle(node)
    for _ in range(20):
        assert ref.suspend() is None
        settle(node)
        assert ref.state is SessionState.SUSPENDED
        assert ref.resume() is None
        assert ref.suspend() is None  # before the parked skill saw the resume, or after
        settle(node)
        assert ref.state is SessionState.SUSPENDED
        assert node.inspect(ref, lambda core: core.parked) is True
        assert ref.resume() is None
        settle(node)
        assert ref.state is SessionState.ACTIVE


def test_waiting_callers_are_told_when_the_node_stops_without_the_session_ending(
    make_node: Any,
) -> None:
    node = make_node(Agent("agent", {"main": idle_main, "waits": waits}))
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="waits").ref
    settle(node)
    errors: list[BaseException] = []

    def wait_forever(ref: Any) -> None:
        try:
            ref.wait()
        except Exception as exc:
            errors.append(exc)

    waiters = [threading.Thread(target=wait_forever, args=(r,)) for r in (main, branch)]
    for thread in waiters:
        thread.start()
    settle(node)
    node.shutdown(grace=1.0, timeout=WAIT)
    for thread in waiters:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert [type(e).__name__ for e in errors] == ["NodeClosedError", "NodeClosedError"]
