"""A shutdown's edges: skills that wrap up while the node closes, parked skills
let go, sessions cancelled before the shutdown, and malformed spawn specs.

Each of these was found by seeded random trees driven through the public API
(issue 21); a restart is a graceful ``shutdown()`` and a new ``Node`` on the
same LMDB directory.
"""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Callable
from typing import Any

import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.protocol import (
    ErrorCode,
    RejectedInputError,
    SessionState,
    SpawnSpec,
)
from sessiontree.store import Store
from sessiontree.supervision import Agent, Event, Node
from tests.conftest import WAIT, settle


def quiet_main(session: Any) -> None:
    return None


def wraps_up(session: Any) -> str:
    """A worker that returns a partial result when cancelled (the README's wrap-up)."""
    try:
        session.sleep(10_000)
    except Cancelled:
        return "partial"
    return "finished"


def collects_then_wraps_up(session: Any) -> str:
    """A branch waiting in ``collect`` on its worker, wrapping up on ``Cancelled``."""
    if session.resumed:
        return "resumed"
    try:
        session.spawn(kind="worker", skill="wraps_up")
        session.collect(timeout=10_000)
    except Cancelled:
        return "wrapped up"
    return "collected"


def sleeps_then_wraps_up(session: Any) -> str:
    """A branch in a ``sleep`` loop, wrapping up on ``Cancelled``."""
    if session.resumed:
        return "resumed"
    try:
        while True:
            session.sleep(1.0)
    except Cancelled:
        return "wrapped up"


def final_states(node: Node) -> dict[Any, SessionState]:
    return {info.session_id: info.state for info in node.final_sessions}


def assert_serves(node: Node, main: Any) -> None:
    """The node still takes work: a new child spawns and ends."""
    result = node.run(main, kind="worker", skill="done", timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.COMPLETED


def done(session: Any) -> str:
    return "done"


SKILLS = {
    "main": quiet_main,
    "wraps_up": wraps_up,
    "collects": collects_then_wraps_up,
    "sleeps": sleeps_then_wraps_up,
    "done": done,
}


# -- 1. A wrap-up during shutdown(grace=0) ----------------------------------------------


@pytest.mark.parametrize("skill", ["collects", "sleeps"])
def test_a_branch_wrapping_up_during_a_grace_zero_shutdown_never_fails_the_node(
    open_node: Callable[..., Node], tmp_path: pathlib.Path, skill: str
) -> None:
    agent = Agent("agent", SKILLS)
    for attempt in range(5):  # it failed the Cortex 5 times of 5
        store = tmp_path / f"store-{attempt}"
        node = open_node(store, agent)
        main = node.main("agent")
        branch = main.spawn(kind="branch", skill=skill).ref
        worker = main.spawn(kind="worker", skill="wraps_up").ref  # any worker still running
        settle(node)
        node.shutdown(grace=0, timeout=WAIT)
        assert node.failure is None
        final = final_states(node)
        # parked in time (resumes after a restart) or fenced (node_restarted after it)
        assert final[branch.session_id] in (SessionState.SUSPENDED, SessionState.ACTIVE)
        assert final[worker.session_id] is SessionState.CANCELLED

        node = open_node(store, agent)
        result = node.wait(branch.session_id, WAIT)
        assert result is not None
        if final[branch.session_id] is SessionState.SUSPENDED:
            assert result.status is SessionState.COMPLETED
            assert result.summary == "resumed"
        else:
            assert result.status is SessionState.FAILED
            assert result.error is not None
            assert result.error.code is ErrorCode.NODE_RESTARTED
        settle(node)
        heard = [r.session_id for r in node.results(main)]
        assert heard.count(branch.session_id) == 1
        assert heard.count(worker.session_id) == 1
        assert_serves(node, main)
        node.shutdown(grace=0, timeout=WAIT)
        assert node.failure is None


# -- 2. Parked skills are let go: no thread left behind ------------------------------------


def parks(started: threading.Event, threads: list[threading.Thread], runs: list[bool]) -> Any:
    def skill(session: Any) -> str:
        runs.append(session.resumed)
        if session.resumed:
            return "resumed"
        threads.append(threading.current_thread())
        started.set()
        try:
            session.sleep(10_000)  # parks here when suspended
        except Cancelled as exc:
            return f"let go ({exc.code})"  # refused: the session keeps its state
        return "slept"

    return skill


def new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads started since ``before`` that are still alive after a bounded join each."""
    left = [t for t in threading.enumerate() if t not in before]
    for thread in left:
        thread.join(WAIT)
    return [t for t in left if t.is_alive()]


@pytest.mark.parametrize("how", ["parked_by_shutdown", "suspended_before"])
def test_a_parked_sync_branch_leaves_no_thread_behind_and_still_resumes(
    open_node: Callable[..., Node], tmp_path: pathlib.Path, how: str
) -> None:
    started, threads, runs = threading.Event(), [], []
    agent = Agent("agent", {"main": quiet_main, "parks": parks(started, threads, runs)})
    store = tmp_path / "store"
    before = set(threading.enumerate())
    node = open_node(store, agent, grace=5.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="parks").ref
    assert started.wait(WAIT)
    if how == "suspended_before":
        assert branch.suspend() is None
    settle(node)
    node.shutdown(timeout=WAIT)
    assert node.failure is None
    assert final_states(node)[branch.session_id] is SessionState.SUSPENDED
    (thread,) = threads
    thread.join(WAIT)
    assert not thread.is_alive()  # it was let go of its checkpoint
    assert new_threads(before) == []
    with Store(store) as opened:  # what the release left: the parked state, untouched
        record = opened.session(branch.session_id)
        assert record is not None
        assert record.info.state is SessionState.SUSPENDED
        assert record.result is None
        assert record.resume is (how == "parked_by_shutdown")

    node = open_node(store, agent, grace=5.0)
    if how == "suspended_before":
        settle(node)
        assert node.get(branch.session_id).state is SessionState.SUSPENDED
        assert node.resume(branch.session_id) is None
    result = node.wait(branch.session_id, WAIT)
    assert result is not None
    assert result.status is SessionState.COMPLETED
    assert result.summary == "resumed"
    assert runs == [False, True]
    settle(node)
    assert [r.session_id for r in node.results(main)] == [branch.session_id]


def test_a_parked_async_branch_is_let_go_at_shutdown(
    open_node: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    caught: list[ErrorCode] = []

    async def parks_async(session: Any) -> str:
        if session.resumed:
            return "resumed"
        try:
            await session.sleep(10_000)
        except Cancelled as exc:
            caught.append(exc.code)
            return "let go"
        return "slept"

    agent = Agent("agent", {"main": quiet_main, "parks": parks_async})
    store = tmp_path / "store"
    node = open_node(store, agent, grace=5.0)
    branch = node.main("agent").spawn(kind="branch", skill="parks").ref
    settle(node)
    node.shutdown(timeout=WAIT)
    assert node.failure is None
    assert caught == [ErrorCode.NODE_CLOSED]  # its wrap-up ran; its result was refused
    assert final_states(node)[branch.session_id] is SessionState.SUSPENDED
    node = open_node(store, agent, grace=5.0)
    assert node.wait(branch.session_id, WAIT).summary == "resumed"


def test_a_mains_cycle_blocked_at_a_checkpoint_is_let_go_and_runs_again_after_restart(
    open_node: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    cycles: list[tuple[Any, bool]] = []
    threads: list[threading.Thread] = []
    caught: list[ErrorCode] = []

    def waits(session: Any) -> None:
        cycles.append((session.message, session.resumed))
        if session.message != "go":
            return
        threads.append(threading.current_thread())
        try:
            session.sleep(10_000)  # waits (on its children, say) at a checkpoint
        except Cancelled as exc:
            caught.append(exc.code)
            raise

    agent = Agent("agent", {"main": waits})
    store = tmp_path / "store"
    node = open_node(store, agent)
    main = node.main("agent")
    assert main.send("go") is None
    settle(node)
    node.shutdown(timeout=WAIT)
    assert node.failure is None
    assert caught == [ErrorCode.NODE_CLOSED]
    threads[0].join(WAIT)
    assert not threads[0].is_alive()

    node = open_node(store, agent)
    assert node.main("agent").session_id == main.session_id
    settle(node)
    assert cycles == [("go", False), ("go", True)]  # not consumed: it runs again
    node.shutdown(timeout=WAIT)
    assert caught == [ErrorCode.NODE_CLOSED] * 2
    threads[1].join(WAIT)
    assert not threads[1].is_alive()


def test_a_skill_busy_outside_a_checkpoint_at_shutdown_is_let_go_at_its_next_one(
    open_node: Callable[..., Node], tmp_path: pathlib.Path, release: threading.Event
) -> None:
    """Found by the tree machine: a Main's cycle woken by a timer just as the
    shutdown let the held skills go was not held then, and blocked for good at
    its next checkpoint."""
    busy = threading.Event()
    threads: list[threading.Thread] = []
    caught: list[ErrorCode] = []

    def busy_main(session: Any) -> None:
        if session.message != "go" or session.resumed:
            return
        threads.append(threading.current_thread())
        busy.set()
        release.wait(WAIT)  # "in a model call": no checkpoint while the node closes
        try:
            session.sleep(10_000)
        except Cancelled as exc:
            caught.append(exc.code)
            raise

    node = open_node(tmp_path / "store", Agent("agent", {"main": busy_main}))
    assert node.main("agent").send("go") is None
    assert busy.wait(WAIT)
    node.shutdown(grace=0, timeout=WAIT)
    release.set()
    threads[0].join(WAIT)
    assert not threads[0].is_alive()
    assert caught == [ErrorCode.NODE_CLOSED]


# -- 3. A session cancelled before the shutdown, still in its grace --------------------------


def cancelled_branch(caught: threading.Event, gate: threading.Event) -> Any:
    def skill(session: Any) -> str:
        try:
            session.sleep(10_000)
        except Cancelled:
            caught.set()
            gate.wait(WAIT)  # its wrap-up takes a while
            return "partial"
        return "slept"

    return skill


def test_a_branch_cancelled_before_the_shutdown_wraps_up_within_its_grace(
    open_node: Callable[..., Node], tmp_path: pathlib.Path, caught: threading.Event
) -> None:
    gate = threading.Event()
    agent = Agent("agent", {"main": quiet_main, "slow": cancelled_branch(caught, gate)})
    store = tmp_path / "store"
    node = open_node(store, agent, grace=30.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="slow").ref
    settle(node)
    assert branch.cancel() is None
    assert caught.wait(WAIT)
    closed = threading.Event()
    stopper = threading.Thread(
        target=lambda: (node.shutdown(grace=10.0, timeout=WAIT), closed.set())
    )
    stopper.start()
    try:
        assert not closed.wait(0.2)  # it waits for the branch's wrap-up
    finally:
        gate.set()
    assert closed.wait(WAIT)
    stopper.join(WAIT)
    assert node.failure is None
    assert final_states(node)[branch.session_id] is SessionState.CANCELLED

    node = open_node(store, agent)
    stored = node.result(branch.session_id)
    assert stored is not None
    assert stored.status is SessionState.CANCELLED
    assert stored.error is not None
    assert stored.error.code is ErrorCode.CANCELLED  # not failed/node_restarted
    assert stored.summary == "partial"
    settle(node)
    heard = [r for r in node.results(main) if r.session_id == branch.session_id]
    assert [r.summary for r in heard] == ["partial"]


@pytest.mark.parametrize("shutdown_grace", [0.0, 5.0])
def test_a_cancelled_branch_still_wrapping_up_at_the_shutdown_deadline_is_forced(
    open_node: Callable[..., Node],
    tmp_path: pathlib.Path,
    clock: VirtualClock,
    caught: threading.Event,
    release: threading.Event,
    shutdown_grace: float,
) -> None:
    skills = {"main": quiet_main, "slow": cancelled_branch(caught, release), "wraps_up": wraps_up}
    agent = Agent("agent", skills)
    store = tmp_path / "store"
    node = open_node(store, agent, grace=30.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="slow").ref
    worker = main.spawn(kind="worker", skill="wraps_up").ref
    settle(node)
    assert branch.cancel() is None
    assert caught.wait(WAIT)
    begun, closed = threading.Event(), threading.Event()

    def note_begun(event: Event) -> None:
        # the worker ends in a later turn of the Cortex than the one that armed
        # the shutdown's grace timer
        if event.session_id == worker.session_id and event.state == "cancelled":
            begun.set()

    node.subscribe(note_begun)
    stopper = threading.Thread(
        target=lambda: (node.shutdown(grace=shutdown_grace, timeout=WAIT), closed.set())
    )
    stopper.start()
    assert begun.wait(WAIT)
    if shutdown_grace:
        assert not closed.wait(0.2)  # it waits for the branch within its grace
        clock.advance(shutdown_grace)  # before the branch's own deadline (30 s)
    assert closed.wait(WAIT)
    stopper.join(WAIT)
    assert node.failure is None
    assert final_states(node)[branch.session_id] is SessionState.CANCELLED

    release.set()
    node = open_node(store, agent)
    stored = node.result(branch.session_id)
    assert stored is not None
    assert stored.status is SessionState.CANCELLED
    assert stored.error is not None
    assert stored.error.code is ErrorCode.TERMINATED_BY_FORCE
    settle(node)
    heard = [r.session_id for r in node.results(main)]
    assert sorted(heard) == sorted([branch.session_id, worker.session_id])


# -- 4. Malformed spawn specs are typed refusals, never a Cortex failure -------------------


def test_every_way_in_refuses_a_malformed_spec_and_the_node_goes_on(
    open_node: Callable[..., Node],
) -> None:
    loose = SpawnSpec(kind="worker", skill="done")  # type: ignore[arg-type]
    bad = SpawnSpec(kind="worker", skill="done", ttl="soon")  # type: ignore[arg-type]
    answers: dict[str, Any] = {}

    def tries(session: Any) -> str:
        for name, call in (
            ("spawn", lambda: session.spawn(bad)),
            ("spawn_many", lambda: session.spawn_many([bad])),
            ("fan_out", lambda: session.fan_out([bad])),
        ):
            try:
                call()
            except RejectedInputError as exc:
                answers[name] = exc.field
        many = session.spawn_many([loose, loose])
        fanned = session.fan_out([loose])
        collected = session.collect(timeout=WAIT)
        answers["loose"] = (len(many), len(fanned.reports), len(collected))
        return "tried"

    agent = Agent("agent", {"main": quiet_main, "done": done, "tries": tries})
    node = open_node(None, agent)
    main = node.main("agent")
    for name, call in (
        ("node.spawn", lambda: node.spawn(main, bad)),
        ("node.spawn_many", lambda: node.spawn_many(main, [bad])),
        ("node.run", lambda: node.run(main, bad, timeout=WAIT)),
        ("ref.spawn", lambda: main.spawn(bad)),
        ("node.patterns.fan_out", lambda: node.patterns.fan_out(main, [bad])),
    ):
        with pytest.raises(RejectedInputError) as refused:
            call()
        answers[name] = refused.value.field
    for spawned in node.spawn_many(main, [loose]):
        assert spawned.ref is not None
    result = node.run(main, kind="branch", skill="tries", timeout=WAIT)
    assert result is not None
    assert result.summary == "tried"
    assert answers == {
        "node.spawn": "ttl",
        "node.spawn_many": "specs[0].ttl",
        "node.run": "ttl",
        "ref.spawn": "ttl",
        "node.patterns.fan_out": "ttl",
        "spawn": "ttl",
        "spawn_many": "specs[0].ttl",
        "fan_out": "ttl",
        "loose": (2, 1, 2),
    }
    settle(node)
    assert node.failure is None
    assert_serves(node, main)


# -- 5. Found by the tree machine -----------------------------------------------------------


def test_cancel_suspend_and_resume_answer_for_a_session_that_ended_before_a_restart(
    open_node: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    """A session ended before a restart is read from the store (``get``,
    ``result``); cancel, suspend and resume answered ``UnknownSessionError`` for
    it, where the same session still indexed gets ``invalid_transition``."""
    agent = Agent("agent", SKILLS)
    store = tmp_path / "store"
    node = open_node(store, agent)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="done").ref
    assert node.wait(branch.session_id, WAIT) is not None
    node.shutdown(timeout=WAIT)

    node = open_node(store, agent)
    assert node.get(branch.session_id).state is SessionState.COMPLETED
    for answer in (
        node.cancel(branch.session_id),
        node.suspend(branch.session_id),
        node.resume(branch.session_id),
    ):
        assert answer is not None
        assert answer.code is ErrorCode.INVALID_TRANSITION
        assert "completed" in answer.message
    assert_serves(node, main)
