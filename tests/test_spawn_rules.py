"""Spawn validation: limits, the order of checks, TTLs, capacity, request ids."""

from __future__ import annotations

import math
import threading
import uuid
from typing import Any

import pytest

from sessiontree.protocol import (
    ErrorCode,
    RejectedInputError,
    SessionKind,
    SessionState,
    SpawnSpec,
)
from sessiontree.supervision import Agent, Node, NodeConfig, check_spawn
from sessiontree.supervision._rules import Capacity, ParentView
from tests.conftest import WAIT, settle


def idle_main(session: Any) -> None:
    return None


def waits(session: Any) -> str:
    session.sleep(10_000)
    return "done"


async def waits_async(session: Any) -> str:
    await session.sleep(10_000)
    return "done"


def quick(session: Any) -> str:
    return "ok"


AGENT = Agent(
    "agent",
    {"main": idle_main, "waits": waits, "waits_async": waits_async, "quick": quick},
    default_skill="waits",
    main_skill="main",
    model_tiers=("cheap", "mid", "best"),
)


@pytest.fixture
def node(make_node: Any) -> Any:
    return make_node(AGENT, grace=0.0)


def chain(node: Any, depth: int) -> Any:
    """A Main with branches down to ``depth``; returns the deepest ref."""
    ref = node.main("agent")
    for _ in range(depth):
        spawned = ref.spawn(kind="branch")
        assert spawned.ok, spawned.error
        ref = spawned.ref
    return ref


def test_branches_reach_depth_three_and_no_further(node: Any) -> None:
    deepest = chain(node, 3)
    assert deepest.info().depth == 3
    refused = deepest.spawn(kind="branch")
    assert refused.error.code is ErrorCode.DEPTH_EXCEEDED
    assert "depth 4" in refused.error.message
    assert refused.error.detail == {"depth": 4, "limit": 3}


def test_workers_reach_depth_four_and_never_spawn(node: Any) -> None:
    worker = chain(node, 3).spawn(kind="worker")
    assert worker.ok
    assert worker.ref.info().depth == 4
    for kind in ("worker", "branch"):
        refused = worker.ref.spawn(kind=kind)
        assert refused.error.code is ErrorCode.WORKER_CANNOT_SPAWN
        assert str(worker.session_id) in refused.error.message


def test_a_main_is_never_spawned(node: Any) -> None:
    refused = node.main("agent").spawn(kind="main")
    assert refused.error.code is ErrorCode.DEPTH_EXCEEDED


def test_unknown_parent_is_unknown_session(node: Any) -> None:
    refused = node.spawn(uuid.uuid4(), kind="branch")
    assert refused.error.code is ErrorCode.UNKNOWN_SESSION
    assert not refused.ok


def test_terminal_parent_is_parent_not_active_and_nothing_is_created(node: Any) -> None:
    main = node.main("agent")
    done = main.spawn(kind="branch", skill="quick").ref
    assert done.wait(WAIT).status is SessionState.COMPLETED
    before = node.stats()["live_sessions"]
    refused = done.spawn(kind="worker")
    assert refused.error.code is ErrorCode.PARENT_NOT_ACTIVE
    assert "completed" in refused.error.message
    assert node.stats()["live_sessions"] == before


def test_terminal_worker_parent_reports_the_earlier_check(node: Any) -> None:
    worker = node.main("agent").spawn(kind="worker", skill="quick").ref
    worker.wait(WAIT)
    assert worker.spawn(kind="worker").error.code is ErrorCode.PARENT_NOT_ACTIVE


def test_ninth_live_child_is_refused_until_one_ends(node: Any) -> None:
    main = node.main("agent")
    children = [main.spawn(kind="branch") for _ in range(8)]
    assert all(c.ok for c in children)
    refused = main.spawn(kind="branch")
    assert refused.error.code is ErrorCode.CHILDREN_EXCEEDED
    assert "8" in refused.error.message
    children[0].ref.cancel()
    children[0].ref.wait(WAIT)
    assert main.spawn(kind="branch").ok


def test_max_children_is_per_agent(make_node: Any) -> None:
    agent = Agent("small", {"main": idle_main, "waits": waits}, max_children=2)
    node = make_node(agent)
    main = node.main("small")
    assert main.spawn(kind="branch", skill="waits").ok
    assert main.spawn(kind="branch", skill="waits").ok
    assert main.spawn(kind="branch", skill="waits").error.code is ErrorCode.CHILDREN_EXCEEDED


@pytest.mark.parametrize("ttl", [0.0, -1.0, math.nan, math.inf, -math.inf, 8 * 24 * 3600.0])
def test_bad_ttls_are_invalid_ttl(node: Any, ttl: float) -> None:
    refused = node.main("agent").spawn(kind="branch", ttl=ttl)
    assert refused.error.code is ErrorCode.INVALID_TTL
    assert "ttl" in refused.error.message


def test_ttl_of_the_wrong_type_is_rejected_not_coerced(node: Any) -> None:
    with pytest.raises(RejectedInputError) as caught:
        node.main("agent").spawn(kind="branch", ttl="5")
    assert caught.value.field == "ttl"


def test_unknown_field_and_unknown_kind_are_rejected(node: Any) -> None:
    main = node.main("agent")
    with pytest.raises(RejectedInputError):
        main.spawn(kind="branch", colour="red")
    with pytest.raises(RejectedInputError) as caught:
        main.spawn(kind="robot")
    assert caught.value.field == "kind"


def test_default_ttls_are_thirty_minutes_for_branches_and_five_for_workers(node: Any) -> None:
    main = node.main("agent")
    assert main.info().ttl is None
    assert main.spawn(kind="branch").ref.info().ttl == 1800.0
    worker = main.spawn(kind="worker").ref.info()
    assert worker.ttl == 300.0
    assert worker.deadline == worker.created_at + 300.0


def test_unknown_skill_is_refused_by_name(node: Any) -> None:
    refused = node.main("agent").spawn(kind="branch", skill="nope")
    assert refused.error.code is ErrorCode.UNKNOWN_SKILL
    assert "nope" in refused.error.message


def test_children_inherit_agent_and_tiers_follow_the_rules(node: Any) -> None:
    main = node.main("agent")
    assert main.info().model_tier == "best"
    branch = main.spawn(kind="branch").ref
    assert branch.info().model_tier == "best"
    assert branch.info().agent_id == "agent"
    assert branch.spawn(kind="worker").ref.info().model_tier == "cheap"
    mid = branch.spawn(kind="branch", model_tier="mid").ref
    assert mid.info().model_tier == "mid"
    assert mid.spawn(kind="branch").ref.info().model_tier == "mid"


def test_repeated_request_id_returns_the_first_session(node: Any) -> None:
    main = node.main("agent")
    first = main.spawn(kind="branch", request_id="req-1")
    again = main.spawn(kind="branch", request_id="req-1")
    assert again.existing
    assert again.session_id == first.session_id
    assert len(node.tree(main)["children"]) == 1
    other = main.spawn(kind="branch", request_id="req-2")
    assert other.session_id != first.session_id


def test_run_makes_a_fresh_session_every_time(node: Any) -> None:
    main = node.main("agent")
    first = node.run(main, kind="worker", skill="quick", timeout=WAIT)
    second = node.run(main, kind="worker", skill="quick", timeout=WAIT)
    assert first.ok
    assert second.ok
    assert first.session_id != second.session_id


def test_run_returns_a_refusal_as_a_failed_result(node: Any) -> None:
    result = node.run(uuid.uuid4(), kind="worker")
    assert result.status is SessionState.FAILED
    assert result.error.code is ErrorCode.UNKNOWN_SESSION


def test_past_max_sessions_spawns_are_capacity_exceeded(make_node: Any) -> None:
    node = make_node(AGENT, max_sessions=3)
    main = node.main("agent")
    assert main.spawn(kind="branch").ok
    assert main.spawn(kind="branch").ok
    refused = main.spawn(kind="branch")
    assert refused.error.code is ErrorCode.CAPACITY_EXCEEDED
    assert refused.error.detail["limit"] == "max_sessions"


def test_past_the_step_thread_cap_sync_spawns_are_refused_but_async_ones_run(
    make_node: Any,
) -> None:
    before = threading.active_count()  # other tests' daemon threads may still be winding down
    node = make_node(AGENT, max_step_threads=2)
    main = node.main("agent")
    assert main.spawn(kind="branch", skill="waits").ok
    assert main.spawn(kind="branch", skill="waits").ok
    refused = main.spawn(kind="branch", skill="waits")
    assert refused.error.code is ErrorCode.CAPACITY_EXCEEDED
    assert refused.error.detail["limit"] == "max_step_threads"
    assert main.spawn(kind="branch", skill="waits_async").ok
    settle(node)
    # two step threads, the loop, the Cortex, a timer and the session pool: not one per session
    assert threading.active_count() - before < 12, sorted(t.name for t in threading.enumerate())


def test_sessions_beyond_the_compute_slots_wait_as_pending(make_node: Any) -> None:
    gate = threading.Event()

    def busy(session: Any) -> str:
        gate.wait(WAIT)  # holds its compute slot: no checkpoint
        return "busy done"

    agent = Agent("agent", {"main": idle_main, "busy": busy, "quick": quick})
    node = make_node(agent, max_running_skills=1)
    main = node.main("agent")
    first = main.spawn(kind="branch", skill="busy").ref
    second = main.spawn(kind="branch", skill="quick").ref
    assert second.state is SessionState.PENDING
    gate.set()
    assert first.wait(WAIT).ok
    assert second.wait(WAIT).ok


def view(**overrides: Any) -> ParentView:
    fields: dict[str, Any] = {
        "session_id": "p",
        "kind": SessionKind.BRANCH,
        "state": SessionState.ACTIVE,
        "depth": 2,
        "live_children": 0,
        "cancelling": False,
    }
    return ParentView(**{**fields, **overrides})


def test_check_order_is_the_documented_one() -> None:
    """Each step fixes the previous failure; the next check is then the answer."""
    config = NodeConfig(max_sessions=1, max_zombies=1, max_step_threads=1)
    full = Capacity(live_sessions=5, zombies=5, sync_threads=5, needs_thread=True)
    bad = SpawnSpec(kind=SessionKind.BRANCH, ttl=-1.0, skill="nope")
    worker = {"kind": SessionKind.WORKER, "depth": 4, "live_children": 99}
    steps = [
        (None, bad),
        (view(**worker, state=SessionState.FAILED), bad),
        (view(**worker), bad),
        (view(depth=3, live_children=99), bad),
        (view(live_children=99), bad),
        (view(), bad),
        (view(), SpawnSpec(kind=SessionKind.BRANCH, skill="nope")),
        (view(), SpawnSpec(kind=SessionKind.BRANCH, skill="waits")),
    ]
    order = [
        check_spawn(parent, spec, AGENT if parent else None, config, full).code
        for parent, spec in steps
    ]
    assert order == [
        ErrorCode.UNKNOWN_SESSION,
        ErrorCode.PARENT_NOT_ACTIVE,
        ErrorCode.WORKER_CANNOT_SPAWN,
        ErrorCode.DEPTH_EXCEEDED,
        ErrorCode.CHILDREN_EXCEEDED,
        ErrorCode.INVALID_TTL,
        ErrorCode.UNKNOWN_SKILL,
        ErrorCode.CAPACITY_EXCEEDED,
    ]


# -- batched spawns ---------------------------------------------------------------------


def test_spawn_many_answers_each_spec_in_order_and_a_refusal_does_not_stop_the_rest(
    node: Any,
) -> None:
    main = node.main("agent")
    specs = [SpawnSpec(kind=SessionKind.WORKER, skill="quick", task=f"t{i}") for i in range(10)]
    specs[3] = SpawnSpec(kind=SessionKind.WORKER, skill="quick", ttl=-1.0)  # invalid_ttl
    answers = main.spawn_many(specs)
    assert [a.ok for a in answers] == [True, True, True, False, True, True, True, True, True, False]
    assert answers[3].error is not None
    assert answers[3].error.code is ErrorCode.INVALID_TTL
    # the agent allows 8 live children: the tenth is refused, the ninth still fits
    assert answers[9].error is not None
    assert answers[9].error.code is ErrorCode.CHILDREN_EXCEEDED
    tasks = [node.get(a.ref).task for a in answers if a.ref is not None]
    assert tasks == [f"t{i}" for i in (0, 1, 2, 4, 5, 6, 7, 8)]
    assert all(node.wait(a.ref, timeout=WAIT).ok for a in answers if a.ref is not None)


def test_spawn_many_of_one_repeated_spec_answers_as_spawning_one_by_one(make_node: Any) -> None:
    # A repeated spec is validated in full once; its later children must still
    # meet every limit a spawn changes, and get the very refusal spawn gives.
    batched = make_node(AGENT, grace=0.0, max_sessions=7)
    single = make_node(AGENT, grace=0.0, max_sessions=7)
    spec = SpawnSpec(kind=SessionKind.WORKER, skill="waits_async")
    answers = batched.main("agent").spawn_many([spec] * 9)
    one_main = single.main("agent")
    one_by_one = [one_main.spawn(spec) for _ in range(9)]
    assert [a.ok for a in answers] == [a.ok for a in one_by_one] == [True] * 6 + [False] * 3
    for got, want in zip(answers[6:], one_by_one[6:], strict=True):
        assert got.error is not None
        assert want.error is not None
        assert (got.error.code, got.error.detail) == (want.error.code, want.error.detail)
        assert got.error.code is ErrorCode.CAPACITY_EXCEEDED  # 1 main + 6 workers = 7
    assert batched.stats()["rejected_capacity_exceeded"] == 3
    assert len(batched.sessions(kind=SessionKind.WORKER)) == 6


def test_spawn_many_of_a_repeated_spec_stops_at_the_children_limit(node: Any) -> None:
    spec = SpawnSpec(kind=SessionKind.WORKER, skill="waits_async")
    answers = node.main("agent").spawn_many([spec] * 10)
    assert [a.ok for a in answers] == [True] * 8 + [False] * 2
    for refused in answers[8:]:
        assert refused.error is not None
        assert refused.error.code is ErrorCode.CHILDREN_EXCEEDED
        assert "already has 8 live children" in refused.error.message


def test_spawn_many_of_a_repeated_sync_spec_stops_at_the_step_threads(make_node: Any) -> None:
    node = make_node(AGENT, grace=0.0, max_step_threads=3)
    spec = SpawnSpec(kind=SessionKind.WORKER, skill="waits")
    answers = node.main("agent").spawn_many([spec] * 5)
    assert [a.ok for a in answers] == [True] * 3 + [False] * 2
    for refused in answers[3:]:
        assert refused.error is not None
        assert refused.error.code is ErrorCode.CAPACITY_EXCEEDED
        assert refused.error.detail == {"limit": "max_step_threads"}


def test_spawn_many_of_a_repeated_spec_with_a_request_id_makes_one_child(node: Any) -> None:
    spec = SpawnSpec(kind=SessionKind.WORKER, skill="waits_async", request_id="r1")
    first, again, third = node.main("agent").spawn_many([spec] * 3)
    assert first.ok
    assert not first.existing
    assert again.session_id == third.session_id == first.session_id
    assert again.existing
    assert third.existing
    assert len(node.sessions(kind=SessionKind.WORKER)) == 1


def test_spawn_many_refuses_an_item_that_is_not_a_spawn_spec_naming_it(node: Any) -> None:
    main = node.main("agent")
    with pytest.raises(RejectedInputError) as caught:
        node.spawn_many(main, [SpawnSpec(kind=SessionKind.WORKER), {"kind": "worker"}])
    assert caught.value.field == "specs[1]"
    settle(node)
    assert node.get(main).state is SessionState.ACTIVE
    assert node.sessions(kind=SessionKind.WORKER) == []  # nothing of the batch was spawned


def test_spawn_many_of_nothing_answers_an_empty_list(node: Any) -> None:
    assert node.spawn_many(node.main("agent"), []) == []


def test_a_skill_spawns_a_batch_and_collects_every_child(make_node: Any) -> None:
    async def fan(session: Any) -> str:
        specs = [SpawnSpec(kind=SessionKind.WORKER, skill="quick") for _ in range(5)]
        answers = await session.spawn_many(specs)
        collected = await session.collect(timeout=100.0)
        assert {c.session_id for c in collected} == {a.session_id for a in answers}
        return ",".join(c.result.summary for c in collected if c.result is not None)

    def fan_sync(session: Any) -> str:
        answers = session.spawn_many([SpawnSpec(kind=SessionKind.WORKER, skill="quick")] * 3)
        assert session.children == tuple(a.session_id for a in answers)
        return str(len(session.collect(timeout=100.0)))

    agent = Agent("agent", {**AGENT.skills, "fan": fan, "fan_sync": fan_sync}, main_skill="main")
    node = make_node(agent, grace=0.0)
    main = node.main("agent")
    assert node.run(main, kind="branch", skill="fan", timeout=WAIT).summary == "ok,ok,ok,ok,ok"
    assert node.run(main, kind="branch", skill="fan_sync", timeout=WAIT).summary == "3"


def test_spawn_many_with_a_store_makes_every_child_durable(clock: Any, tmp_path: Any) -> None:
    with Node([AGENT], NodeConfig(grace=0.0), clock=clock, store=tmp_path / "store") as node:
        main = node.main("agent")
        answers = main.spawn_many([SpawnSpec(kind=SessionKind.BRANCH, skill="waits")] * 4)
        assert all(a.ok for a in answers)
        store = node.store
        assert store is not None
        for answer in answers:  # answered only once durable
            assert answer.ref is not None
            assert store.session(answer.ref.session_id) is not None
