"""Coordination patterns: collecting, fan-out, retries, escalation, timeouts, pipelines,
map-reduce, continuation and aggregation — on the virtual clock."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import msgspec
import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.protocol import (
    AggregateStrategy,
    ErrorCode,
    GatherStatus,
    NonRetryableError,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.supervision import (
    Agent,
    EventKind,
    Node,
    Retry,
    aggregate,
    extractive_summary,
    normalise_answer,
    parse_continuation,
)
from sessiontree.supervision._requests import Call, Cancel
from tests.conftest import WAIT, settle


def idle_main(session: Any) -> None:
    return None


class Work:
    """Child skills whose behaviour a test scripts by task text."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []  # (skill, task, context)
        self.lock = threading.Lock()
        self.failures: dict[str, int] = {}  # task -> times left to crash

    def record(self, skill: str, session: Any) -> None:
        with self.lock:
            self.calls.append((skill, session.task, session.context_summary))

    def fails(self, task: str) -> bool:
        with self.lock:
            left = self.failures.get(task, 0)
            if left:
                self.failures[task] = left - 1
            return left > 0

    def skills(self) -> dict[str, Any]:
        def work(session: Any) -> Any:
            self.record("work", session)
            task = session.task
            if task.startswith("sleep"):
                session.sleep(float(task.split()[1]))
            if task.startswith("never"):
                raise NonRetryableError("the input cannot be parsed")
            if self.fails(task) or task.startswith("crash"):
                raise ValueError(f"model refused {task}")
            return f"done {task}"

        def sturdy(session: Any) -> Any:
            self.record("sturdy", session)
            return f"sturdy {session.task}"

        async def work_async(session: Any) -> Any:
            await session.checkpoint()
            return f"async {session.task}"

        return {"work": work, "sturdy": sturdy, "work_async": work_async}


def make(make_node: Any, work: Work, lead: Any = None, **agent: Any) -> Node:
    skills: dict[str, Any] = {"main": idle_main, **work.skills()}
    if lead is not None:
        skills["lead"] = lead
    node: Node = make_node(Agent("agent", skills, default_skill="main", **agent), grace=5.0)
    return node


def finish(node: Node, clock: VirtualClock, ref: Any, step: float = 1.0) -> SessionResult:
    """Let the tree run, advancing the virtual clock, until ``ref`` ends (bounded)."""
    for _ in range(500):
        settle(node)
        result = ref.result()
        if result is not None:
            return result  # type: ignore[no-any-return]
        clock.advance(step)
    raise AssertionError("the session never ended")


def run_lead(node: Node, clock: VirtualClock, step: float = 1.0) -> SessionResult:
    spawned = node.spawn(node.main("agent"), kind="branch", skill="lead", task="lead")
    assert spawned.ok, spawned.error
    return finish(node, clock, spawned.ref, step)


# -- collecting ----------------------------------------------------------------------------


def test_collect_from_children_yields_in_completion_order_then_timed_out_entries(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}

    def lead(session: Any) -> str:
        ids = {t: session.spawn(kind="worker", skill="work", task=t).session_id
               for t in ("sleep 3", "sleep 1", "sleep 50")}  # fmt: skip
        entries = list(session.collect_from_children(timeout=10))
        seen["order"] = [next(t for t, i in ids.items() if i == e.session_id) for e in entries]
        seen["timed_out"] = [e.timed_out for e in entries]
        seen["slow"] = ids["sleep 50"]
        return "collected"

    node = make(make_node, Work(), lead)
    assert run_lead(node, clock).ok
    assert seen["order"] == ["sleep 1", "sleep 3", "sleep 50"]
    assert seen["timed_out"] == [False, False, True]
    # the slow child kept running past the timeout; its parent ending then cancelled it
    assert node.result(seen["slow"]).error.code is ErrorCode.PARENT_TERMINATED  # type: ignore[union-attr]


def test_next_result_takes_the_first_child_to_end(make_node: Any, clock: VirtualClock) -> None:
    seen: list[str] = []

    def lead(session: Any) -> None:
        slow = session.spawn(kind="worker", skill="work", task="sleep 5").session_id
        fast = session.spawn(kind="worker", skill="work", task="sleep 2").session_id
        first = session.next_result(timeout=30)
        seen.append("fast" if first.session_id == fast else "slow")
        assert session.next_result([slow], timeout=1) is None  # not yet
        second = session.next_result(timeout=30)
        seen.append("slow" if second.session_id == slow else "?")
        assert session.next_result(timeout=30) is None  # nothing left to wait for

    node = make(make_node, Work(), lead)
    assert run_lead(node, clock).ok
    assert seen == ["fast", "slow"]


def test_send_to_parent_reaches_the_parent_s_updates(make_node: Any, clock: VirtualClock) -> None:
    got: list[Any] = []

    def reporter(session: Any) -> str:
        session.send_to_parent({"pct": 50})
        session.send_to_parent({"pct": 100})
        return "reported"

    def lead(session: Any) -> None:
        child = session.spawn(kind="worker", skill="reporter").session_id
        session.wait(child, timeout=10)
        got.extend(session.updates())
        got.append(session.updates())  # taken: empty now

    node = make_node(Agent("agent", {"main": idle_main, "lead": lead, "reporter": reporter}))
    assert run_lead(node, clock).ok
    child_ids = {child for child, _ in got[:2]}
    assert len(child_ids) == 1
    assert [message for _, message in got[:2]] == [{"pct": 50}, {"pct": 100}]
    assert got[2] == []


def test_send_to_parent_refuses_what_is_not_json(make_node: Any, clock: VirtualClock) -> None:
    def reporter(session: Any) -> str:
        try:
            session.send_to_parent({"lock": threading.Lock()})
        except RejectedInputError as exc:
            return f"refused {exc.field}"
        return "sent"

    def lead(session: Any) -> str:
        child = session.spawn(kind="worker", skill="reporter").session_id
        return session.wait(child, timeout=10).summary  # type: ignore[no-any-return]

    node = make_node(Agent("agent", {"main": idle_main, "lead": lead, "reporter": reporter}))
    assert run_lead(node, clock).summary == "refused message"


def test_a_parent_may_cancel_only_its_own_children(make_node: Any, clock: VirtualClock) -> None:
    def lead(session: Any) -> str:
        child = session.spawn(kind="worker", skill="work", task="sleep 100").session_id
        assert session.cancel_child(child) is None
        result = session.wait(child, timeout=60)
        try:
            session.cancel_child(uuid.uuid4())
        except Exception as exc:  # the NotAllowedError under test
            return f"{result.error.code.value} / {type(exc).__name__}"
        return "no error"

    node = make(make_node, Work(), lead)
    assert run_lead(node, clock).summary == "cancelled / NotAllowedError"


def test_broadcast_is_a_shared_memory_write_siblings_read(
    make_node: Any, clock: VirtualClock
) -> None:
    def writer(session: Any) -> Any:
        memory_id = session.broadcast("plan", {"step": 2})
        return {"memory_id": memory_id}

    def reader(session: Any) -> Any:
        return {"plan": session.memory_get("plan")}

    def lead(session: Any) -> Any:
        first = session.spawn(kind="branch", skill="writer").session_id
        written = session.wait(first, timeout=10)
        second = session.spawn(kind="branch", skill="reader").session_id
        read = session.wait(second, timeout=10)
        return {"read": read.artifacts["plan"], "id": written.artifacts["memory_id"]}

    skills = {"main": idle_main, "lead": lead, "writer": writer, "reader": reader}
    node = make_node(Agent("agent", skills))
    result = run_lead(node, clock)
    assert result.artifacts["read"] == {"step": 2}
    assert node.memory.by_id(result.artifacts["id"]) == {"step": 2}


# -- fan-out ---------------------------------------------------------------------------------


def test_fan_out_runs_every_task_and_queues_past_the_children_limit(
    make_node: Any, clock: VirtualClock
) -> None:
    live: dict[uuid.UUID, int] = {}
    peak = [0]
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        live[session.session_id] = 0
        result = session.fan_out([f"sleep {1 + i % 3}" for i in range(11)], skill="work")
        gathered.append(result)
        return result.to_outcome()

    node = make(make_node, Work(), lead, max_children=3)

    def watch(event: Any) -> None:
        if event.parent_id in live and event.kind is EventKind.SPAWNED:
            live[event.parent_id] += 1
            peak[0] = max(peak[0], live[event.parent_id])
        if (
            event.parent_id in live
            and event.kind is EventKind.TRANSITION
            and event.state in ("completed", "failed", "cancelled", "expired")
        ):
            live[event.parent_id] -= 1

    node.subscribe(watch)
    result = run_lead(node, clock)
    assert result.ok
    (got,) = gathered
    assert got.status is GatherStatus.COMPLETED
    assert len(got.results) == 11  # none rejected: they queued
    assert peak[0] == 3
    assert [r.spec.task for r in got.reports] == [f"sleep {1 + i % 3}" for i in range(11)]


def test_partial_failure_goes_on_with_what_arrived(make_node: Any, clock: VirtualClock) -> None:
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        result = session.fan_out(["a", "crash b", "c"], skill="work", aggregate="concat")
        gathered.append(result)
        return result.to_outcome()

    node = make(make_node, Work(), lead)
    result = run_lead(node, clock)
    (got,) = gathered
    assert got.status is GatherStatus.PARTIAL
    assert result.summary == "done a\n\ndone c"
    assert got.aggregated.missing == [1]
    (diagnostic,) = got.diagnostics
    assert diagnostic["task"] == "crash b"
    assert diagnostic["code"] == "crashed"
    assert diagnostic["attempts"] == 1  # retrying is opt-in: no implicit retry


def test_all_failed_reports_every_child_s_error(make_node: Any, clock: VirtualClock) -> None:
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        gathered.append(session.fan_out(["crash a", "crash b"], skill="work"))

    node = make(make_node, Work(), lead)
    run_lead(node, clock)
    (got,) = gathered
    assert got.status is GatherStatus.FAILED
    assert [(d["task"], d["code"], d["attempts"]) for d in got.diagnostics] == [
        ("crash a", "crashed", 1),
        ("crash b", "crashed", 1),
    ]
    assert "model refused crash a" in got.diagnostics[0]["message"]


def test_a_refused_spawn_is_reported_not_raised(make_node: Any, clock: VirtualClock) -> None:
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        gathered.append(
            session.fan_out(["a", {"task": "b", "skill": "no-such-skill"}], skill="work")
        )

    node = make(make_node, Work(), lead)
    run_lead(node, clock)
    (got,) = gathered
    assert got.status is GatherStatus.PARTIAL
    assert got.reports[1].attempts[0].session_id is None
    assert got.reports[1].error.code is ErrorCode.UNKNOWN_SKILL


# -- retries ---------------------------------------------------------------------------------


def test_a_crashed_child_is_retried_with_exponential_backoff_in_fresh_sessions(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    work.failures["flaky"] = 3
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        retry = Retry(max_attempts=4, initial=2.0, multiplier=3.0, max_backoff=100.0)
        gathered.append(session.fan_out(["flaky"], skill="work", retry=retry))

    node = make(make_node, work, lead)
    run_lead(node, clock, step=0.5)
    (got,) = gathered
    (report,) = got.reports
    assert report.ok
    assert [a.backoff_s for a in report.attempts] == [0.0, 2.0, 6.0, 18.0]
    assert [a.ok for a in report.attempts] == [False, False, False, True]
    ids = [a.session_id for a in report.attempts]
    assert len(set(ids)) == 4  # a retry is a fresh session, never a reused one
    assert all(a.result.error.code is ErrorCode.CRASHED for a in report.attempts[:3])


def test_backoff_waits_on_the_clock(make_node: Any, clock: VirtualClock) -> None:
    work = Work()
    work.failures["flaky"] = 1

    def lead(session: Any) -> Any:
        return session.fan_out(
            ["flaky"], skill="work", retry=Retry(max_attempts=2, initial=30.0)
        ).to_outcome()

    node = make(make_node, work, lead)
    ref = node.spawn(node.main("agent"), kind="branch", skill="lead").ref
    settle(node)
    clock.advance(29.0)
    settle(node)
    assert len(work.calls) == 1  # still waiting out the 30 s backoff
    clock.advance(1.0)
    assert finish(node, clock, ref).summary == "done flaky"
    assert len(work.calls) == 2


def test_jitter_stays_in_its_bounds_and_a_seed_repeats_it() -> None:
    first = Retry(max_attempts=5, initial=1.0, jitter=0.5, seed=7)
    second = Retry(max_attempts=5, initial=1.0, jitter=0.5, seed=7)
    waits = [first.backoff(n) for n in range(2, 6)]
    assert waits == [second.backoff(n) for n in range(2, 6)]
    for base, wait in zip([1.0, 2.0, 4.0, 8.0], waits, strict=True):
        assert base <= wait <= base + 0.5
    assert Retry(initial=10, max_backoff=15).backoff(5) == 15.0


def test_later_attempts_run_the_fallback_skill(make_node: Any, clock: VirtualClock) -> None:
    work = Work()
    work.failures["hard"] = 1
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        retry = Retry(max_attempts=2, initial=1.0, fallback_skill="sturdy")
        gathered.append(session.fan_out(["hard"], skill="work", retry=retry))

    node = make(make_node, work, lead)
    run_lead(node, clock)
    (report,) = gathered[0].reports
    assert [a.skill for a in report.attempts] == ["work", "sturdy"]
    assert report.result.summary == "sturdy hard"


def test_errors_marked_non_retryable_are_never_retried(make_node: Any, clock: VirtualClock) -> None:
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        gathered.append(session.fan_out(["never parse"], skill="work", retry=Retry(max_attempts=5)))

    node = make(make_node, Work(), lead)
    run_lead(node, clock)
    (report,) = gathered[0].reports
    assert len(report.attempts) == 1
    assert report.result.error.detail["retryable"] is False


def test_retry_on_limits_which_codes_are_retried(make_node: Any, clock: VirtualClock) -> None:
    work = Work()
    work.failures["x"] = 1
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        retry = Retry(max_attempts=3, retry_on=frozenset({ErrorCode.TTL_EXPIRED}))
        gathered.append(session.fan_out(["x"], skill="work", retry=retry))

    node = make(make_node, work, lead)
    run_lead(node, clock)
    assert len(gathered[0].reports[0].attempts) == 1  # crashed is not in retry_on


def test_restarts_past_the_intensity_escalate_to_the_parent(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    for task in ("a", "b", "c"):
        work.failures[task] = 10

    def lead(session: Any) -> Any:
        retry = Retry(max_attempts=10, initial=1.0, intensity=3, period=60.0)
        return session.fan_out(["a", "b", "c"], skill="work", retry=retry).to_outcome()

    node = make(make_node, work, lead)
    result = run_lead(node, clock)
    assert result.status is SessionState.FAILED
    assert result.error.code is ErrorCode.ESCALATED
    children = result.error.detail["children"]
    assert {c["task"] for c in children} == {"a", "b", "c"}
    assert all(c["code"] == "crashed" for c in children)
    assert len(work.calls) == 3 + 3  # three first attempts, three restarts; the fourth escalates


def test_the_same_restarts_spread_beyond_the_period_do_not_escalate(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    work.failures["a"] = 4
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        # four restarts, 40 s apart, in a 60 s period that allows two
        retry = Retry(max_attempts=5, initial=40.0, multiplier=1.0, intensity=2, period=60.0)
        gathered.append(session.fan_out(["a"], skill="work", retry=retry))

    node = make(make_node, work, lead)
    result = run_lead(node, clock, step=5.0)
    assert result.ok
    assert gathered[0].reports[0].ok
    assert len(gathered[0].reports[0].attempts) == 5


# -- timeouts --------------------------------------------------------------------------------


@pytest.mark.parametrize("on_timeout", ["continue", "cancel"])
def test_a_timeout_is_reported_and_the_parent_decides(
    make_node: Any, clock: VirtualClock, on_timeout: str
) -> None:
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        got = session.fan_out(
            ["sleep 1", "sleep 200"], skill="work", timeout=10, on_timeout=on_timeout
        )
        gathered.append(got)
        slow = got.reports[1].attempts[0].session_id
        gathered.append(session.wait(slow, timeout=1000))
        return "decided"

    node = make(make_node, Work(), lead)
    assert run_lead(node, clock, step=5.0).ok
    got, slow_result = gathered
    assert got.status is GatherStatus.PARTIAL
    assert got.reports[1].timed_out
    assert got.reports[1].error.code is ErrorCode.TIMED_OUT
    if on_timeout == "continue":
        assert slow_result.ok  # it kept running and finished
    else:
        assert slow_result.error.code is ErrorCode.CANCELLED


# -- pipeline and map-reduce ---------------------------------------------------------------


def test_a_pipeline_feeds_each_stage_the_previous_results_as_explicit_context(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        got = session.pipeline(["gather", ["check one", "check two"], "write"], skill="work")
        gathered.append(got)
        return got.to_outcome()

    node = make(make_node, work, lead)
    result = run_lead(node, clock)
    assert result.summary == "done write"
    contexts = {task: context for _, task, context in work.calls}
    assert contexts["gather"] == ""
    assert "[1] done gather" in contexts["check one"]
    assert "[1] done check one" in contexts["write"]
    assert "[2] done check two" in contexts["write"]
    assert [r.stage for r in gathered[0].reports] == [0, 1, 1, 2]


def test_a_pipeline_stops_at_a_stage_with_no_good_result(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        gathered.append(session.pipeline(["a", "crash b", "c"], skill="work"))

    node = make(make_node, work, lead)
    run_lead(node, clock)
    assert gathered[0].status is GatherStatus.FAILED
    assert [task for _, task, _ in work.calls] == ["a", "crash b"]


def test_map_reduce_maps_batches_in_parallel_then_reduces_their_results(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        got = session.map_reduce(list(range(7)), "count", "total", batch_size=3, skill="work")
        gathered.append(got)
        return got.to_outcome()

    node = make(make_node, work, lead)
    assert run_lead(node, clock).summary == "done total"
    maps = [context for _, task, context in work.calls if task == "count"]
    assert sorted(maps) == ["[0, 1, 2]", "[3, 4, 5]", "[6]"]
    reduce_context = next(context for _, task, context in work.calls if task == "total")
    assert reduce_context.count("done count") == 3
    assert gathered[0].status is GatherStatus.COMPLETED
    assert [r.stage for r in gathered[0].reports] == [0, 0, 0, 1]


def test_map_reduce_builds_map_tasks_with_a_callable_and_survives_a_failed_map(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        got = session.map_reduce(
            ["a", "b", "c"],
            lambda batch: "crash" if batch == ["b"] else f"map {batch[0]}",
            "sum",
            skill="work",
        )
        gathered.append(got)

    node = make(make_node, work, lead)
    run_lead(node, clock)
    got = gathered[0]
    assert got.status is GatherStatus.PARTIAL
    assert got.aggregated.summary == "done sum"


# -- continuation ----------------------------------------------------------------------------


def test_a_continuation_starts_a_fresh_session_seeded_only_from_token_and_context(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    node = make(make_node, work)
    main = node.main("agent")
    first = node.patterns.fan_out(main, ["draft the plan"], skill="work")
    token = first.reports[0].continuation
    assert token is not None
    assert parse_continuation(token).summary == "done draft the plan"
    later = node.patterns.continue_run(main, token, "the user wants it shorter")
    (report,) = later.reports
    assert report.ok
    assert report.attempts[0].session_id != first.reports[0].attempts[0].session_id
    _, task, context = work.calls[-1]
    assert task == "draft the plan"
    assert context.startswith("the user wants it shorter")
    assert "concluded: done draft the plan" in context


@pytest.mark.parametrize("token", ["", "not base64!", "AAAA", 17])
def test_a_bad_continuation_token_is_refused(make_node: Any, token: Any) -> None:
    node = make(make_node, Work())
    with pytest.raises(RejectedInputError) as caught:
        node.patterns.continue_run(node.main("agent"), token, "context")
    assert caught.value.field == "token"


# -- async parents and the node ---------------------------------------------------------------


def test_an_async_parent_fans_out_without_holding_a_thread(
    make_node: Any, clock: VirtualClock
) -> None:
    async def lead(session: Any) -> Any:
        got = await session.fan_out(["x", "y", "z"], skill="work_async")
        seen = [entry async for entry in session.collect_from_children(timeout=1)]
        return {"summaries": [r.summary for r in got.results], "left": len(seen)}

    node = make(make_node, Work(), lead)
    result = run_lead(node, clock)
    assert result.artifacts == {"summaries": ["async x", "async y", "async z"], "left": 0}


def test_a_node_fans_out_for_a_parent_from_outside(make_node: Any, clock: VirtualClock) -> None:
    node = make(make_node, Work(), max_children=2)
    got = node.patterns.fan_out(node.main("agent"), ["a", "b", "c", "d", "e"], skill="work")
    assert got.status is GatherStatus.COMPLETED
    assert [r.summary for r in got.results] == ["done a", "done b", "done c", "done d", "done e"]


def test_a_node_side_timeout_runs_on_the_clock(make_node: Any, clock: VirtualClock) -> None:
    node = make(make_node, Work())
    main = node.main("agent")
    settle(node)
    base = clock.pending_timers  # the node's periodic check
    answer: list[Any] = []
    runner = threading.Thread(
        target=lambda: answer.append(
            node.patterns.fan_out(main, ["sleep 100"], skill="work", timeout=20)
        )
    )
    runner.start()
    # advance only once the child has its TTL and sleeps, and the driver waits
    # with its timeout: three more timers (two were not enough: the child's
    # TTL and sleep could be counted before the driver armed its timeout)
    tick = threading.Event()
    for _ in range(2000):
        if clock.pending_timers >= base + 3:
            break
        tick.wait(0.005)
    settle(node)
    clock.advance(20.0)
    runner.join(WAIT)
    assert answer[0].reports[0].timed_out


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda n, m: n.patterns.fan_out(m, [42]), "tasks[0]"),
        (lambda n, m: n.patterns.fan_out(m, ["a"], retry=3), "retry"),
        (lambda n, m: n.patterns.fan_out(m, ["a"], on_timeout="panic"), "on_timeout"),
        (lambda n, m: n.patterns.fan_out(m, ["a"], colour="red"), "options"),
        (lambda n, m: n.patterns.fan_out(m, [{"kind": "robot"}]), "kind"),
        (lambda n, m: n.patterns.map_reduce(m, [1], "a", "b", batch_size=0), "batch_size"),
        (lambda n, m: n.patterns.map_reduce(m, [object()], "a", "b"), "items"),
        (lambda n, m: n.patterns.pipeline(m, [[]]), "stages[0]"),
        (lambda n, m: n.patterns.continue_run(m, "x", 5), "token"),
    ],
)
def test_bad_pattern_arguments_are_refused_naming_the_field(
    make_node: Any, call: Any, field: str
) -> None:
    node = make(make_node, Work())
    with pytest.raises(RejectedInputError) as caught:
        call(node, node.main("agent"))
    assert caught.value.field == field


@pytest.mark.parametrize(
    "fields",
    [{"max_attempts": 0}, {"initial": -1}, {"multiplier": 0.5}, {"period": float("nan")},
     {"intensity": -1}],
)  # fmt: skip
def test_a_bad_retry_policy_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        Retry(**fields)


def test_a_cancelled_parent_cancels_what_its_pattern_runs(
    make_node: Any, clock: VirtualClock
) -> None:
    caught: list[str] = []

    def lead(session: Any) -> Any:
        try:
            session.fan_out(["sleep 1000", "sleep 1000"], skill="work")
        except Cancelled:
            caught.append("cancelled")
            raise

    node = make(make_node, Work(), lead)
    ref = node.spawn(node.main("agent"), kind="branch", skill="lead").ref
    settle(node)
    ref.cancel()
    result = finish(node, clock, ref)
    assert result.status is SessionState.CANCELLED
    assert caught == ["cancelled"]
    children = node.tree(ref)["children"]
    assert all(c["result"].error.code is ErrorCode.PARENT_TERMINATED for c in children)


# -- aggregation -----------------------------------------------------------------------------


def result(
    summary: str = "", artifacts: dict[str, Any] | None = None, ok: bool = True
) -> SessionResult:
    return SessionResult(
        session_id=uuid.uuid4(),
        status=SessionState.COMPLETED if ok else SessionState.FAILED,
        kind=SessionKind.WORKER,
        summary=summary,
        artifacts=artifacts or {},
    )


def test_concat_joins_the_summaries_in_order_and_lists_what_is_missing() -> None:
    results = [result("one"), result(ok=False), result("three", {"n": 3})]
    got = aggregate(results, "concat")
    assert got.summary == "one\n\nthree"
    assert got.missing == [1]
    assert got.contributors == [results[0].session_id, results[2].session_id]
    assert got.artifacts == {str(results[2].session_id): {"n": 3}}


def test_summarize_is_extractive_by_default_and_pluggable() -> None:
    results = [
        result("Actors isolate state. They talk by messages."),
        result("actors isolate state!"),
    ]
    assert aggregate(results, AggregateStrategy.SUMMARIZE).summary == "Actors isolate state."
    llm = aggregate(results, "summarize", summarizer=lambda texts: f"{len(texts)} answers")
    assert llm.summary == "2 answers"
    assert extractive_summary(["A. B.", "C."]) == "A. C."


def test_vote_takes_the_majority_of_normalised_answers() -> None:
    got = aggregate([result("Paris."), result(" paris"), result("Lyon")], "vote")
    assert got.answer == "paris"
    assert got.summary == "Paris."
    assert got.votes == {"paris": 2, "lyon": 1}
    assert got.tie == []
    assert normalise_answer("  Café,  Crème! ") == "cafe creme"


def test_a_tied_vote_is_reported_not_hidden() -> None:
    got = aggregate([result("yes"), result("no"), result("YES"), result("No.")], "vote")
    assert got.answer is None
    assert got.tie == ["no", "yes"]
    assert got.summary == "tie: no | yes"


def test_merge_combines_artifacts_and_lists_conflicts() -> None:
    a = result("a", {"title": "T", "meta": {"pages": 3, "lang": "en"}, "tags": ["x"]})
    b = result("b", {"title": "T", "meta": {"pages": 4}, "author": "Ada"})
    got = aggregate([a, b], "merge")
    assert got.artifacts == {"title": "T", "meta": {"lang": "en"}, "tags": ["x"], "author": "Ada"}
    assert got.conflicts == {"/meta/pages": {str(a.session_id): 3, str(b.session_id): 4}}
    assert a.artifacts["meta"] == {"pages": 3, "lang": "en"}  # inputs untouched


def test_merge_keeps_a_dotted_key_apart_from_a_nested_one() -> None:
    flat, nested, flat2, nested2 = (
        result("", {"a.b": 1}),
        result("", {"a": {"b": 1}}),
        result("", {"a.b": 2}),
        result("", {"a": {"b": 5}}),
    )
    got = aggregate([flat, nested, flat2, nested2], "merge")
    assert got.artifacts == {"a": {}}
    assert got.conflicts == {
        "/a.b": {str(flat.session_id): 1, str(flat2.session_id): 2},
        "/a/b": {str(nested.session_id): 1, str(nested2.session_id): 5},
    }


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(RejectedInputError) as caught:
        aggregate([result("x")], "average")
    assert caught.value.field == "strategy"


def test_gathered_and_aggregated_travel_as_msgspec_structs() -> None:
    got = aggregate([result("x")], "vote")
    assert msgspec.json.decode(msgspec.json.encode(got), type=type(got)) == got


def test_cancelling_a_parent_during_a_retry_backoff_ends_it_without_waiting(
    make_node: Any, clock: VirtualClock
) -> None:
    work = Work()
    work.failures["flaky"] = 5

    def lead(session: Any) -> Any:
        return session.fan_out(
            ["flaky"], skill="work", retry=Retry(max_attempts=5, initial=3600.0)
        ).to_outcome()

    node = make(make_node, work, lead)
    ref = node.spawn(node.main("agent"), kind="branch", skill="lead").ref
    settle(node)
    assert len(work.calls) == 1  # the first attempt failed; an hour's backoff begins
    ref.cancel()
    result = ref.wait(WAIT)  # no clock advance needed: the backoff is a checkpoint
    assert result is not None
    assert result.status is SessionState.CANCELLED
    assert len(work.calls) == 1


def test_the_node_s_patterns_have_awaitable_twins(make_node: Any, clock: VirtualClock) -> None:
    node = make(make_node, Work())
    main = node.main("agent")

    async def everything() -> list[GatherStatus]:
        fanned = await node.patterns.afan_out(main, ["a", "b"], skill="work")
        piped = await node.patterns.apipeline(main, ["a", "b"], skill="work")
        reduced = await node.patterns.amap_reduce(main, [1, 2], "m", "r", skill="work")
        token = fanned.reports[0].continuation
        assert token is not None
        continued = await node.patterns.acontinue_run(main, token, "more")
        return [g.status for g in (fanned, piped, reduced, continued)]

    assert asyncio.run(everything()) == [GatherStatus.COMPLETED] * 4


def test_a_capacity_refusal_with_no_child_of_the_pattern_running_is_final(
    make_node: Any, clock: VirtualClock
) -> None:
    gathered: list[Any] = []

    def lead(session: Any) -> Any:
        # the node's only step thread is this skill's own: no sync child can ever start
        gathered.append(session.fan_out(["a", "b"], skill="work"))
        return "returned"

    node = make_node(
        Agent("agent", {"main": idle_main, "lead": lead, **Work().skills()}), max_step_threads=1
    )
    assert run_lead(node, clock).summary == "returned"
    (got,) = gathered
    assert got.status is GatherStatus.FAILED
    assert [r.error.code for r in got.reports] == [ErrorCode.CAPACITY_EXCEEDED] * 2


def test_a_fire_and_forget_call_the_cortex_refuses_is_counted_not_fatal(
    make_node: Any, clock: VirtualClock
) -> None:
    node = make(make_node, Work())
    node._tell(Call(Cancel(uuid.uuid4())))  # as a pattern cancels a child long evicted
    settle(node)
    assert node.stats()["rejected_messages"] == 1
    assert not node.closed
    assert node.patterns.fan_out(node.main("agent"), ["a"], skill="work").ok
