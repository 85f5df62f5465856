"""Quorum completion of a fan-out (issue 26): go on when k succeed or k agree,
stop the rest with grace and keep what they return — on the virtual clock."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.protocol import ErrorCode, GatherStatus, RejectedInputError, SessionState
from sessiontree.supervision import Agent, EventKind, Node
from sessiontree.supervision._patterns import fan_out
from sessiontree.supervision._retry import Restarts, Retry
from tests.test_patterns import finish

SLOW = 100.0  # clock seconds a slow child would take
WAIT = 30.0  # real seconds a stuck child blocks at most (released at teardown)


def answer(session: Any) -> str:
    """``answer X after S``: X, after S clock seconds; cancelled, it wraps up
    in its grace and returns a partial answer."""
    _, text, _, after = session.task.split()
    try:
        session.sleep(float(after))
    except Cancelled:
        return f"partial {text}"
    return text


def make(make_node: Any, lead: Any) -> Node:
    skills = {"main": lambda session: None, "answer": answer, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    return node


def run(node: Node, clock: VirtualClock) -> None:
    spawned = node.spawn(node.main("agent"), kind="branch", skill="lead", task="lead")
    assert spawned.ok, spawned.error
    result = finish(node, clock, spawned.ref)
    assert result.ok, result


def test_a_quorum_of_three_ends_the_wait_at_the_third_success(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    tasks = [f"answer fast{i} after {i + 1}" for i in range(3)]
    tasks += [f"answer slow{i} after {SLOW}" for i in range(2)]

    def lead(session: Any) -> str:
        started = session.clock.monotonic()
        seen["gathered"] = session.fan_out(tasks, skill="answer", quorum=3)
        seen["took"] = session.clock.monotonic() - started
        return "led"

    node = make(make_node, lead)
    cancels: list[uuid.UUID | None] = []
    node.subscribe(
        lambda e: cancels.append(e.session_id) if e.kind is EventKind.CANCEL_REQUESTED else None
    )
    run(node, clock)
    got = seen["gathered"]
    assert got.status is GatherStatus.COMPLETED
    assert got.ok
    assert got.quorum == 3
    assert [r.summary for r in got.counted] == ["fast0", "fast1", "fast2"]
    assert seen["took"] < SLOW  # the third success ended it, not the slow ones
    fast, slow = got.reports[:3], got.reports[3:]
    assert all(r.counted and not r.superseded for r in fast)
    assert len(cancels) == 2  # the slow ones were cancelled, nothing else
    for report in slow:
        assert report.superseded
        assert not report.counted
        assert report.result is not None
        assert report.result.status is SessionState.CANCELLED
        assert report.result.error is not None
        assert report.result.error.code is ErrorCode.CANCELLED  # wrapped up in grace
        assert report.result.summary == f"partial {report.spec.task.split()[1]}"
        assert report.diagnostic()["superseded"] is True


def test_tasks_not_yet_started_never_start_once_the_quorum_is_met(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    tasks = [f"answer t{i} after {i + 1}" for i in range(6)]

    def lead(session: Any) -> str:
        seen["gathered"] = session.fan_out(tasks, skill="answer", quorum=2)
        return "led"

    skills = {"main": lambda session: None, "answer": answer, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main", max_children=3), grace=5.0)
    run(node, clock)
    got = seen["gathered"]
    assert [r.summary for r in got.counted] == ["t0", "t1"]
    # t0 ended at 1 s and t3 took its place; t1 met the quorum at 2 s
    running, queued = got.reports[2:4], got.reports[4:]
    assert all(r.superseded and r.started and r.result is not None for r in running)
    assert all(r.superseded and not r.started and r.result is None for r in queued)
    assert not any(r.timed_out for r in got.reports)


def test_a_vote_ends_as_soon_as_the_majority_is_certain(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    # A at 1 s, A at 2 s, B at 3 s, A at 4 s, and one slow voter: after the third
    # A no answer can overtake it (3 > 1 + the 1 still open), though k = 5
    # (every voter agreeing) is not reached.
    tasks = ["answer A after 1", "answer A after 2", "answer B after 3", "answer A after 4"]
    tasks.append(f"answer B after {SLOW}")

    def lead(session: Any) -> str:
        started = session.clock.monotonic()
        seen["gathered"] = session.fan_out(tasks, skill="answer", quorum=5, aggregate="vote")
        seen["took"] = session.clock.monotonic() - started
        return "led"

    run(make(make_node, lead), clock)
    got = seen["gathered"]
    assert got.status is GatherStatus.COMPLETED
    assert 4.0 <= seen["took"] < SLOW
    assert [r.summary for r in got.counted] == ["A", "A", "A"]
    assert [r.counted for r in got.reports] == [True, True, False, True, False]
    assert got.reports[4].superseded
    assert got.aggregated is not None
    assert got.aggregated.summary == "A"


def test_k_agreeing_answers_end_a_vote(make_node: Any, clock: VirtualClock) -> None:
    seen: dict[str, Any] = {}
    tasks = ["answer A after 1", "answer B after 2", "answer A after 3"]
    tasks += [f"answer C after {SLOW}", f"answer C after {SLOW}"]

    def lead(session: Any) -> str:
        seen["gathered"] = session.fan_out(tasks, skill="answer", quorum=2, aggregate="vote")
        return "led"

    run(make(make_node, lead), clock)
    got = seen["gathered"]
    assert [r.summary for r in got.counted] == ["A", "A"]  # two agree: k = 2
    assert [r.superseded for r in got.reports] == [False, False, False, True, True]


def crash(session: Any) -> None:
    raise RuntimeError("no answer")


def test_a_quorum_out_of_reach_ends_at_once_failed_keeping_the_partials(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    # k = 3 of 5: once three have crashed at once only two could still succeed
    tasks: list[Any] = [{"task": f"x{i}", "skill": "crash"} for i in range(3)]
    tasks += [f"answer slow{i} after {SLOW}" for i in range(2)]

    def lead(session: Any) -> str:
        started = session.clock.monotonic()
        seen["gathered"] = session.fan_out(tasks, skill="answer", quorum=3, timeout=10 * SLOW)
        seen["took"] = session.clock.monotonic() - started
        return "led"

    skills = {"main": lambda session: None, "answer": answer, "crash": crash, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    cancels: list[uuid.UUID | None] = []
    node.subscribe(
        lambda e: cancels.append(e.session_id) if e.kind is EventKind.CANCEL_REQUESTED else None
    )
    run(node, clock)
    got = seen["gathered"]
    assert got.status is GatherStatus.FAILED
    assert not got.ok
    assert got.counted == []
    assert seen["took"] < 5.0  # neither the timeout nor the slow children were waited for
    assert len(cancels) == 2  # the slow ones, nothing else
    assert [r.superseded for r in got.reports] == [False, False, False, True, True]
    for report in got.reports[3:]:
        assert report.result is not None
        assert report.result.status is SessionState.CANCELLED
        assert report.result.summary == f"partial {report.spec.task.split()[1]}"
        assert not report.timed_out
    assert [d["code"] for d in got.diagnostics][:3] == ["crashed"] * 3


def test_a_quorum_missed_with_some_successes_is_failed_not_partial(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}

    def lead(session: Any) -> str:
        tasks = [
            "answer A after 1",
            {"task": "x", "skill": "crash"},
            "answer B after 2",
            {"task": "y", "skill": "crash"},
        ]
        seen["gathered"] = session.fan_out(tasks, skill="answer", quorum=3)
        return "led"

    skills = {"main": lambda session: None, "answer": answer, "crash": crash, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    run(node, clock)
    got = seen["gathered"]
    # two crashes leave two that could succeed: 3 is out of reach at once
    assert got.status is GatherStatus.FAILED
    assert [r.summary for r in got.results] == []
    assert [r.result.summary for r in got.reports if r.superseded] == ["partial A", "partial B"]


def test_a_child_that_never_ends_is_not_waited_for_past_the_grace(
    make_node: Any, clock: VirtualClock, release: threading.Event, caught: threading.Event
) -> None:
    seen: dict[str, Any] = {}

    def stubborn(session: Any) -> str:
        try:
            session.sleep(SLOW)
        except Cancelled:
            caught.set()
            release.wait(WAIT)  # ignores its cancel: only the grace's forced end stops it
        return "too late"

    def lead(session: Any) -> str:
        started = session.clock.monotonic()
        tasks = [{"task": "x", "skill": "crash"}, {"task": "y", "skill": "crash"}, "stubborn"]
        seen["gathered"] = session.fan_out(tasks, skill="stubborn", quorum=2)  # no timeout
        seen["took"] = session.clock.monotonic() - started
        return "led"

    skills = {"main": lambda session: None, "stubborn": stubborn, "crash": crash, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    lead_ref = node.spawn(node.main("agent"), kind="branch", skill="lead", task="lead").ref
    assert caught.wait(WAIT)  # the two crashes put the quorum out of reach: cancelled
    clock.advance(5.0)  # the node's grace, and not a second more
    assert lead_ref.wait(WAIT).ok
    got = seen["gathered"]
    assert got.status is GatherStatus.FAILED
    assert seen["took"] == 5.0
    forced = got.reports[2]
    assert forced.superseded
    assert forced.result is not None
    assert forced.result.error is not None
    assert forced.result.error.code is ErrorCode.TERMINATED_BY_FORCE


def test_a_task_with_a_retry_left_keeps_the_quorum_in_reach(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    tries: list[str] = []

    def flaky(session: Any) -> str:
        tries.append(session.task)
        if len(tries) == 1:
            raise RuntimeError("first try fails")
        return "second try"

    def lead(session: Any) -> str:
        tasks = [{"task": "f", "skill": "flaky"}, "answer A after 3"]
        retry = Retry(max_attempts=2, initial=1.0, jitter=0.0)
        seen["gathered"] = session.fan_out(tasks, skill="answer", quorum=2, retry=retry)
        return "led"

    skills = {"main": lambda session: None, "answer": answer, "flaky": flaky, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    run(node, clock)
    got = seen["gathered"]
    assert got.status is GatherStatus.COMPLETED  # the retry could still succeed, and did
    assert [r.summary for r in got.counted] == ["second try", "A"]


def test_an_async_fan_out_ends_at_once_when_its_quorum_is_out_of_reach(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    caught = threading.Semaphore(0)

    async def fail(session: Any) -> None:
        raise RuntimeError("no answer")

    async def stubborn(session: Any) -> str:
        try:
            await session.sleep(SLOW)
        except Cancelled:
            caught.release()
            await asyncio.Event().wait()  # ignores its cancel: only the forced end stops it
        return "never"

    async def lead(session: Any) -> str:
        started = session.clock.monotonic()
        tasks: list[Any] = [{"task": "x", "skill": "fail"}, {"task": "y", "skill": "fail"}]
        tasks += ["a", "b"]
        seen["gathered"] = await session.fan_out(tasks, skill="stubborn", quorum=3)
        seen["took"] = session.clock.monotonic() - started
        return "led"

    skills = {"main": lambda session: None, "fail": fail, "stubborn": stubborn, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    lead_ref = node.spawn(node.main("agent"), kind="branch", skill="lead", task="lead").ref
    assert caught.acquire(timeout=WAIT)  # both were cancelled before the clock moves
    assert caught.acquire(timeout=WAIT)
    clock.advance(5.0)
    assert lead_ref.wait(WAIT).ok
    got = seen["gathered"]
    assert got.status is GatherStatus.FAILED
    assert seen["took"] == 5.0
    for report in got.reports[2:]:
        assert report.superseded
        assert report.result is not None
        assert report.result.error is not None
        assert report.result.error.code is ErrorCode.TERMINATED_BY_FORCE


@pytest.mark.parametrize("quorum", [0, 4, -1, "2", 2.0, True])
def test_a_bad_quorum_is_refused_naming_it_before_anything_is_spawned(quorum: Any) -> None:
    pattern = fan_out(uuid.uuid4(), Restarts(), ["a", "b", "c"], quorum=quorum)
    with pytest.raises(RejectedInputError) as raised:
        next(pattern)
    assert raised.value.field == "quorum"


def test_collect_with_a_quorum_stops_the_slow_children_and_keeps_their_partials(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}

    def lead(session: Any) -> str:
        tasks = ["answer a after 2", "answer b after 1", f"answer c after {SLOW}"]
        for task in tasks:
            assert session.spawn(kind="worker", skill="answer", task=task).ok
        started = session.clock.monotonic()
        seen["entries"] = session.collect(quorum=2)
        seen["took"] = session.clock.monotonic() - started
        seen["left"] = session.collect()  # every result was taken
        return "led"

    run(make(make_node, lead), clock)
    entries = seen["entries"]
    assert [e.result.summary for e in entries] == ["b", "a", "partial c"]  # arrival order
    assert [(e.counted, e.superseded) for e in entries] == [
        (True, False),
        (True, False),
        (False, True),
    ]
    assert entries[2].result.status is SessionState.CANCELLED
    assert seen["took"] < SLOW
    assert seen["left"] == []


def test_an_async_collect_with_a_vote_quorum_ends_when_no_answer_can_overtake(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}

    async def vote(session: Any) -> str:
        words = session.task.split()
        await session.sleep(float(words[3]))
        return words[1]

    async def lead(session: Any) -> str:
        tasks = ["answer yes after 1", "answer yes after 2", f"answer no after {SLOW}"]
        for task in tasks:
            assert (await session.spawn(kind="worker", skill="vote", task=task)).ok
        seen["entries"] = await session.collect(quorum=3, aggregate="vote")
        return "led"

    skills = {"main": lambda session: None, "vote": vote, "lead": lead}
    run(make_node(Agent("agent", skills, default_skill="main"), grace=5.0), clock)
    entries = seen["entries"]
    # after two yes of three voters no answer can overtake yes (the one still
    # open could make no 1): certain, though k = 3 did not agree
    assert [e.result.summary for e in entries] == ["yes", "yes", ""]
    assert [e.counted for e in entries] == [True, True, False]
    assert [e.superseded for e in entries] == [False, False, True]
    assert entries[2].result.status is SessionState.CANCELLED  # no wrap-up: nothing kept


def test_collect_refuses_a_bad_quorum_naming_it(make_node: Any, clock: VirtualClock) -> None:
    seen: list[str | None] = []

    def lead(session: Any) -> str:
        assert session.spawn(kind="worker", skill="answer", task="answer a after 1").ok
        try:
            session.collect(quorum=2)  # one child
        except RejectedInputError as exc:
            seen.append(exc.field)
        session.collect()
        return "led"

    run(make(make_node, lead), clock)
    assert seen == ["quorum"]


def test_collect_with_a_quorum_out_of_reach_stops_the_rest_at_once(
    make_node: Any, clock: VirtualClock, release: threading.Event, caught: threading.Event
) -> None:
    seen: dict[str, Any] = {}

    def stubborn(session: Any) -> str:
        try:
            session.sleep(SLOW)
        except Cancelled:
            caught.set()
            release.wait(WAIT)
        return "too late"

    def lead(session: Any) -> str:
        assert session.spawn(kind="worker", skill="answer", task=f"answer a after {SLOW}").ok
        assert session.spawn(kind="worker", skill="stubborn", task="z").ok
        assert session.spawn(kind="worker", skill="crash", task="x").ok
        assert session.spawn(kind="worker", skill="crash", task="y").ok
        started = session.clock.monotonic()
        seen["entries"] = session.collect(quorum=3, timeout=10 * SLOW)
        seen["took"] = session.clock.monotonic() - started
        return "led"

    skills = {
        "main": lambda session: None,
        "answer": answer,
        "crash": crash,
        "stubborn": stubborn,
        "lead": lead,
    }
    node: Node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    wrapped = threading.Event()  # a's wrap-up ended it, within the grace
    node.subscribe(
        lambda e: (
            wrapped.set()
            if e.kind is EventKind.TRANSITION and e.skill == "answer" and e.state == "cancelled"
            else None
        )
    )
    lead_ref = node.spawn(node.main("agent"), kind="branch", skill="lead", task="lead").ref
    assert caught.wait(WAIT)
    assert wrapped.wait(WAIT)  # before the grace ends: its thread may wake later than z's
    clock.advance(5.0)
    assert lead_ref.wait(WAIT).ok
    entries = seen["entries"]
    assert seen["took"] == 5.0  # the grace, not the timeout nor the slow child
    assert not any(e.counted or e.timed_out for e in entries)
    crashed, stopped = entries[:2], entries[2:]
    assert all(e.result.error.code is ErrorCode.CRASHED for e in crashed)
    assert all(e.superseded for e in stopped)
    assert [e.result.summary for e in stopped] == ["partial a", ""]  # a's wrap-up kept
    assert stopped[1].result.error.code is ErrorCode.TERMINATED_BY_FORCE


def test_an_async_collect_with_a_quorum_out_of_reach_stops_the_rest(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}

    async def fail(session: Any) -> None:
        raise RuntimeError("no answer")

    async def slow(session: Any) -> str:
        try:
            await session.sleep(SLOW)
        except Cancelled:
            return "wrapped up"
        return "slow"

    async def lead(session: Any) -> str:
        for skill in ("fail", "slow", "fail"):
            assert (await session.spawn(kind="worker", skill=skill, task=skill)).ok
        started = session.clock.monotonic()
        seen["entries"] = await session.collect(quorum=2)
        seen["took"] = session.clock.monotonic() - started
        return "led"

    skills = {"main": lambda session: None, "fail": fail, "slow": slow, "lead": lead}
    run(make_node(Agent("agent", skills, default_skill="main"), grace=5.0), clock)
    entries = seen["entries"]
    assert seen["took"] < SLOW
    assert [e.superseded for e in entries] == [False, False, True]
    assert entries[2].result.status is SessionState.CANCELLED
    assert entries[2].result.summary == "wrapped up"
