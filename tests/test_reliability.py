"""The faults and bad input the runtime must survive: a skill that hangs,
crashes, floods or ignores its cancel; a caller that sends garbage."""

from __future__ import annotations

import gc
import threading
import tracemalloc
import uuid
from typing import Any

import pykka
import pytest

from sessiontree.actors import AskTimeoutError, Cancelled, VirtualClock
from sessiontree.actors.runtime import Deliver, post
from sessiontree.protocol import (
    CancelCmd,
    DeadlockError,
    ErrorCode,
    NodeClosedError,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SessionState,
    UnknownSessionError,
)
from sessiontree.supervision import Agent, Node, NodeConfig
from sessiontree.supervision import _queries as queries
from sessiontree.supervision._requests import GetActorRef
from tests.conftest import WAIT, settle


def chatty_main(session: Any) -> None:
    session.checkpoint()
    if session.message == "explode":
        raise RuntimeError("bad message")


def waits(session: Any) -> str:
    session.sleep(10_000)
    return "done"


def quick(session: Any) -> str:
    return "ok"


def crashes(session: Any) -> str:
    raise ValueError("boom")


def spawner(session: Any) -> str:
    for _ in range(200):
        spawned = session.spawn(kind="worker", skill="waits")
        if not spawned.ok:
            return spawned.error.code.value
    return "all spawned"


SKILLS = {
    "main": chatty_main,
    "waits": waits,
    "quick": quick,
    "crashes": crashes,
    "spawner": spawner,
}


@pytest.fixture
def node(make_node: Any) -> Node:
    return make_node(Agent("agent", SKILLS, main_skill="main"), grace=5.0)


def session_actors() -> list[Any]:
    return [r for r in pykka.ActorRegistry.get_all() if "SessionActorLogic" in str(r)]


# 1. A session crashes in start-up
def test_session_that_cannot_start_fails_and_its_parent_hears_once(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = node.main("agent")
    settle(node)

    def no_threads(work: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(node._parts.executor, "submit", no_threads)
    ref = main.spawn(kind="branch", skill="quick").ref
    result = ref.wait(WAIT)
    assert result.status is SessionState.FAILED
    assert result.error.code is ErrorCode.CRASHED
    assert "can't start new thread" in result.error.message
    settle(node)
    assert [r.session_id for r in main.results()] == [ref.session_id]
    assert session_actors() == []  # never in pykka's registry, and its own actor stopped
    with pytest.raises(UnknownSessionError):
        node.inspect(ref, lambda core: core.state)


# 2. A session crashes while handling a message
def test_crash_fails_only_that_session_and_siblings_keep_running(node: Node) -> None:
    main = node.main("agent")
    sibling = main.spawn(kind="branch", skill="waits").ref
    crashed = main.spawn(kind="branch", skill="crashes").ref
    assert crashed.wait(WAIT).error.code is ErrorCode.CRASHED
    settle(node)
    assert sibling.state is SessionState.ACTIVE
    assert [r.session_id for r in main.results()] == [crashed.session_id]


def test_a_main_whose_cycle_crashes_stays_active_and_takes_the_next_message(
    node: Node,
) -> None:
    events: list[Any] = []
    node.subscribe(events.append)
    main = node.main("agent")
    assert main.send("explode") is None
    assert main.send("hello") is None
    settle(node)
    assert main.state is SessionState.ACTIVE
    cycles = [e for e in events if e.kind == "cycle_ended"]
    assert [(e.data["cycle"], e.code) for e in cycles] == [(1, "crashed"), (2, None)]
    assert node.stats()["main_cycles_failed"] == 1


# 3. An exception answered on the ask path
def test_exception_on_the_ask_path_reaches_the_caller_and_the_session_lives(node: Node) -> None:
    ref = node.main("agent").spawn(kind="branch", skill="waits").ref
    settle(node)

    def bad_probe(core: Any) -> None:
        raise KeyError("no such field")

    with pytest.raises(KeyError, match="no such field"):
        node.inspect(ref, bad_probe)
    assert node.inspect(ref, lambda core: core.state) is SessionState.ACTIVE
    assert ref.state is SessionState.ACTIVE


# 4. KeyboardInterrupt / SystemExit inside an actor
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_interrupt_inside_an_actor_shuts_the_node_down_in_order(
    make_node: Any, exc: type[BaseException]
) -> None:
    node = make_node(Agent("agent", SKILLS, main_skill="main"), grace=5.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="waits").ref
    worker = main.spawn(kind="worker", skill="waits").ref
    settle(node)

    def interrupt(core: Any) -> None:
        raise exc

    with pytest.raises(NodeClosedError, match="inside the runtime"):
        node.inspect(branch, interrupt)  # a branch holds no actor: on the Cortex's turn
    assert node.wait_closed(WAIT)
    assert isinstance(node.fatal_error, exc)
    final = {s.session_id: s.state for s in node.final_sessions}
    assert final[main.session_id] is SessionState.ACTIVE  # mains are kept
    assert final[branch.session_id] is SessionState.SUSPENDED  # resumes after restart
    assert final[worker.session_id] is SessionState.CANCELLED
    with pytest.raises(NodeClosedError):
        node.main("agent")


def test_keyboard_interrupt_raised_by_a_skill_fails_it_and_stops_the_node(
    make_node: Any,
) -> None:
    def interrupted(session: Any) -> None:
        raise KeyboardInterrupt

    node = make_node(Agent("agent", {"main": chatty_main, "bad": interrupted}), grace=1.0)
    ref = node.main("agent").spawn(kind="worker", skill="bad").ref
    result = ref.wait(WAIT)
    assert result.status is SessionState.FAILED
    assert result.error.detail["type"] == "builtins.KeyboardInterrupt"
    assert node.wait_closed(WAIT)
    assert isinstance(node.fatal_error, KeyboardInterrupt)


# 7. a node's shutdown waits, up to the grace, for every subtree it cancels
def test_shutdown_waits_for_workers_up_to_the_grace_then_forces(
    make_node: Any, clock: VirtualClock
) -> None:
    release = threading.Event()

    def stubborn(session: Any) -> str:
        try:
            session.sleep(10_000)
        except Cancelled:
            release.wait(WAIT)
        return "late"

    def tidy(session: Any) -> str:
        try:
            session.sleep(10_000)
        except Cancelled:
            return "tidied"
        return "never"

    agent = Agent("agent", {"main": chatty_main, "stubborn": stubborn, "tidy": tidy})
    node = make_node(agent, grace=10.0)
    main = node.main("agent")
    stubborn_ref = main.spawn(kind="worker", skill="stubborn").ref
    tidy_ref = main.spawn(kind="worker", skill="tidy").ref
    settle(node)
    done = threading.Event()
    stopper = threading.Thread(target=lambda: (node.shutdown(timeout=WAIT), done.set()))
    stopper.start()
    assert tidy_ref.wait(WAIT).error.code is ErrorCode.CANCELLED
    assert not done.wait(0.2)  # still waiting for the stubborn worker's grace
    clock.advance(10.0)
    assert done.wait(WAIT)
    stopper.join(WAIT)
    final = {s.session_id: s for s in node.final_sessions}
    assert final[stubborn_ref.session_id].state is SessionState.CANCELLED
    assert final[main.session_id].state is SessionState.ACTIVE
    release.set()


# 8. Cancel a parent while a child is spawning
def test_cancelling_a_parent_in_the_middle_of_spawning_never_hangs(node: Node) -> None:
    main = node.main("agent")
    parent = main.spawn(kind="branch", skill="spawner").ref
    parent.cancel()
    result = parent.wait(WAIT)
    assert result.status is SessionState.CANCELLED
    settle(node)
    assert all(s.state.is_terminal or s.kind is SessionKind.MAIN for s in node.sessions())


# 9. Parent completes or fails → children cancelled with grace, then forced
def test_failed_parent_cancels_its_children(make_node: Any, clock: VirtualClock) -> None:
    def spawn_then_crash(session: Any) -> None:
        session.spawn(kind="worker", skill="waits")
        raise RuntimeError("parent broke")

    agent = Agent("agent", {**SKILLS, "spawn_then_crash": spawn_then_crash}, main_skill="main")
    node = make_node(agent, grace=5.0)
    parent = node.main("agent").spawn(kind="branch", skill="spawn_then_crash").ref
    assert parent.wait(WAIT).error.code is ErrorCode.CRASHED
    settle(node)
    (child,) = node.tree(parent)["children"]
    result = node.wait(child["info"].session_id, WAIT)
    assert result.error.code is ErrorCode.PARENT_TERMINATED


# 10. Messages sent to a stopping subtree get a clear error
def test_messages_to_an_ended_or_stopping_session_get_a_clear_error(node: Node) -> None:
    main = node.main("agent", "telegram:dm:42")
    branch = main.spawn(kind="branch", skill="waits").ref
    assert branch.send("hi").code is ErrorCode.NOT_ALLOWED
    main.cancel()
    error = main.send("anyone there?")
    assert error.code is ErrorCode.SESSION_NOT_ACTIVE
    assert str(main.session_id) in error.message
    assert branch.spawn(kind="worker").error.code is ErrorCode.PARENT_NOT_ACTIVE


def test_a_new_main_replaces_an_ended_one_for_the_same_key(node: Node) -> None:
    first = node.main("agent", "telegram:dm:42")
    assert node.main("agent", "telegram:dm:42") == first
    first.cancel()
    settle(node)
    assert node.main("agent", "telegram:dm:42") != first


# 11. Concurrent stop and ask under stress
def test_concurrent_calls_during_shutdown_end_with_an_answer_or_a_clear_error(
    make_node: Any,
) -> None:
    node = make_node(Agent("agent", SKILLS, main_skill="main"), grace=0.0, ask_timeout=5.0)
    main = node.main("agent")
    outcomes: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(9)

    def hammer() -> None:
        start.wait(WAIT)
        for _ in range(50):
            try:
                node.spawn(main, kind="worker", skill="quick")
                node.get(main)
                kind = "ok"
            except (NodeClosedError, AskTimeoutError, UnknownSessionError) as exc:
                kind = type(exc).__name__
            with lock:
                outcomes.append(kind)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    start.wait(WAIT)
    node.shutdown(timeout=WAIT)
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert len(outcomes) == 8 * 50
    assert "AskTimeoutError" not in outcomes


# 12. Blocking ask to self, or an ask cycle
def test_blocking_ask_from_inside_an_actor_is_an_error_not_a_deadlock(node: Node) -> None:
    ref = node.main("agent").spawn(kind="branch", skill="waits").ref
    settle(node)
    with pytest.raises(DeadlockError):
        node.inspect(ref, lambda core: node.get(ref))
    with pytest.raises(DeadlockError):
        node.inspect(ref, lambda core: node.inspect(ref, lambda c: 1))
    assert ref.state is SessionState.ACTIVE


# 13. 10,000 spawn-and-finish cycles → memory bounded
def test_ten_thousand_spawn_and_finish_cycles_keep_memory_bounded(make_node: Any) -> None:
    node = make_node(
        Agent("agent", SKILLS, main_skill="main"), retain_terminal=200, max_retained_results=50
    )
    main = node.main("agent")

    def cycles(n: int) -> None:
        for _ in range(n):
            result = node.run(main, kind="worker", skill="quick", timeout=WAIT)
            assert result.ok

    tracemalloc.start()  # before the warm-up, so evicted warm-up records count as freed
    try:
        cycles(1_000)
        settle(node)
        gc.collect()  # garbage in reference cycles (pykka's actor <-> ref) is not a leak
        before = tracemalloc.take_snapshot()
        cycles(9_000)
        settle(node)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert growth < 200_000, f"memory grew by {growth} bytes over 9,000 cycles"
    stats = node.stats()
    assert stats["indexed_sessions"] <= 201 + 1
    assert len(main.results()) == 50


# 16. TTL immune to wall-clock jumps
def test_ttl_runs_on_the_monotonic_clock(node: Node, clock: VirtualClock) -> None:
    ref = node.main("agent").spawn(kind="branch", skill="waits", ttl=100.0).ref
    settle(node)
    clock.jump_wall(+86_400.0)  # NTP moves the wall clock a day ahead
    settle(node)
    assert ref.state is SessionState.ACTIVE
    clock.jump_wall(-2 * 86_400.0)
    clock.advance(100.0)
    assert ref.wait(WAIT).error.code is ErrorCode.TTL_EXPIRED


# 18. The Cortex itself dies → the node fails loudly
def test_a_broken_cortex_fails_the_node_loudly(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    main = node.main("agent")
    waiting = main.spawn(kind="branch", skill="waits").ref
    settle(node)

    def broken(tree: Any) -> None:
        raise RuntimeError("index corrupted")

    monkeypatch.setattr(queries, "stats", broken)
    with pytest.raises(NodeClosedError, match="index corrupted"):
        node.stats()
    assert isinstance(node.failure, RuntimeError)
    with pytest.raises(NodeClosedError, match="index corrupted"):
        node.main("agent")
    with pytest.raises(NodeClosedError):
        waiting.wait(WAIT)


# 29. Unknown message type → rejected, counted, the actor survives
def test_unknown_messages_are_counted_and_actors_survive(node: Node) -> None:
    main = node.main("agent")
    ref = main.spawn(kind="branch", skill="waits").ref
    settle(node)
    actor = node._call(GetActorRef(main.session_id))  # a branch holds no actor
    post(actor, {"type": "mystery"}, node.activity)
    post(node._cortex, object(), node.activity)
    settle(node)
    assert node.stats()["rejected_messages"] == 2
    assert node.inspect(ref, lambda core: core.state) is SessionState.ACTIVE
    assert ref.state is SessionState.ACTIVE


def test_a_control_command_posted_raw_to_the_cortex_is_refused_not_fatal(node: Node) -> None:
    """Commands reach the Cortex as ``Control`` requests; one posted bare (here
    for a session that does not exist) is refused and counted, and the node goes on."""
    post(node._cortex, CancelCmd(session_id=uuid.uuid4()), node.activity)
    settle(node)
    assert node.failure is None
    assert node.stats()["rejected_messages"] == 1
    assert node.main("agent").state is SessionState.ACTIVE


def test_a_result_for_a_stranger_is_just_filed(node: Node) -> None:
    """A Deliver never crashes a Main's actor, even for a child it never had."""
    main = node.main("agent")
    ref = main.spawn(kind="branch", skill="waits").ref
    settle(node)
    actor = node._call(GetActorRef(main.session_id))
    stray = SessionResult(session_id=uuid.uuid4(), status=SessionState.COMPLETED)
    post(actor, Deliver(stray), node.activity)
    settle(node)
    assert main.state is SessionState.ACTIVE
    assert ref.state is SessionState.ACTIVE


# 31. Wrong types, missing fields → rejected, not coerced
def test_control_commands_are_decoded_strictly(node: Node) -> None:
    main = node.main("agent")
    spawn = f'{{"type":"spawn","parent_id":"{main.session_id}","spec":{{"kind":"worker",'
    answer = node.control((spawn + '"skill":"quick"}}').encode())
    assert answer.error is None
    for bad, field in [
        (b'{"type":"cancel"}', None),
        (b'{"type":"cancel","session_id":42}', "session_id"),
        (b'{"type":"launch","session_id":"x"}', None),
        (
            f'{{"type":"spawn","parent_id":"{main.session_id}","spec":{{"kind":"worker","ttl":"5"}}}}'.encode(),
            "spec.ttl",
        ),
        (b"not json", None),
    ]:
        with pytest.raises(RejectedInputError) as caught:
            node.control(bad)
        if field is not None:
            assert caught.value.field == field
    assert node.get(main).state is SessionState.ACTIVE


def test_node_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="grace"):
        NodeConfig(grace=-1)
    with pytest.raises(ValueError, match="max_sessions"):
        NodeConfig(max_sessions=0)
    with pytest.raises(ValueError, match=r"NodeConfig\.actor_type was removed"):
        NodeConfig(actor_type="greenlet")
