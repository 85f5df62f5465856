"""Hedged children (issue 26): a duplicate for a child in the slow tail, the
first success kept, the other cancelled with grace — on the virtual clock."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from sessiontree.actors import VirtualClock
from sessiontree.protocol import GatherStatus, RejectedInputError
from sessiontree.supervision import Agent, EventKind, Hedge, Node, Provider
from sessiontree.supervision._patterns import fan_out
from sessiontree.supervision._retry import Restarts
from sessiontree.testing import StandinServer
from tests.conftest import WAIT
from tests.test_patterns import finish

SLOW = 100.0  # clock seconds a child in the tail would take


class Latencies:
    """``run`` skill: a task's first run takes what its text says after ``first``
    (or 1 s), every later run of it (a duplicate) 1 s; ``crash`` in the text
    crashes the first run."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.lock = threading.Lock()

    def run(self, session: Any) -> str:
        with self.lock:
            n = self.runs[session.task] = self.runs.get(session.task, 0) + 1
        words = session.task.split()
        first = float(words[words.index("first") + 1]) if "first" in words else 1.0
        session.sleep(first if n == 1 else 1.0)
        if n == 1 and "crash" in words:
            raise RuntimeError("the first run fails")
        return f"{session.task} #{n}"


def lead_of(seen: dict[str, Any], tasks: list[str], **options: Any) -> Any:
    def lead(session: Any) -> str:
        started = session.clock.monotonic()
        seen["gathered"] = session.fan_out(tasks, skill="run", **options)
        seen["took"] = session.clock.monotonic() - started
        return "led"

    return lead


def run(make_node: Any, clock: VirtualClock, lead: Any, **agent: Any) -> Node:
    skills = {"main": lambda session: None, "run": Latencies().run, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main", **agent), grace=5.0)
    spawned = node.spawn(node.main("agent"), kind="branch", skill="lead", task="lead")
    assert spawned.ok, spawned.error
    result = finish(node, clock, spawned.ref, step=0.5)
    assert result.ok, result
    return node


def test_a_child_past_the_delay_gets_a_duplicate_and_the_first_success_wins(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    tasks = ["a", "b", "c", f"tail first {SLOW}"]
    cancels: list[uuid.UUID | None] = []
    lead = lead_of(seen, tasks, hedge=Hedge(after=3.0))
    skills = {"main": lambda session: None, "run": Latencies().run, "lead": lead}
    node: Node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    node.subscribe(
        lambda e: cancels.append(e.session_id) if e.kind is EventKind.CANCEL_REQUESTED else None
    )
    spawned = node.spawn(node.main("agent"), kind="branch", skill="lead", task="lead")
    assert spawned.ok
    assert finish(node, clock, spawned.ref, step=0.5).ok
    got = seen["gathered"]
    assert got.status is GatherStatus.COMPLETED
    assert seen["took"] < 6.0  # the duplicate at 3 s took 1 s; the first would take 100
    tail = got.reports[3]
    assert tail.result is not None
    assert tail.result.summary == f"tail first {SLOW} #2"  # the duplicate's
    first, duplicate = tail.attempts
    assert (first.hedge, first.superseded, first.result) == (False, True, None)
    assert (duplicate.hedge, duplicate.superseded) == (True, False)
    assert duplicate.ok
    assert cancels == [first.session_id]  # the slower one, with the node's grace
    assert [len(r.attempts) for r in got.reports[:3]] == [1, 1, 1]  # none past the delay


def test_the_delay_can_follow_a_percentile_of_the_run_times_so_far(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    tasks = [f"t{i}" for i in range(5)] + [f"tail first {SLOW}"]
    # no fixed delay: nothing is hedged until 5 children succeeded (at 1 s);
    # then the median run time (1 s) is the delay, already past for the tail
    lead = lead_of(seen, tasks, hedge=Hedge(percentile=50, min_samples=5))
    run(make_node, clock, lead)
    got = seen["gathered"]
    assert [a.hedge for a in got.reports[5].attempts] == [False, True]
    assert seen["took"] < 4.0


def test_a_first_child_that_fails_waits_for_its_duplicate_and_costs_no_retry(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    # the first run takes 5 s and crashes; its duplicate starts at 2 s and succeeds at 3 s
    lead = lead_of(seen, ["crash first 5"], hedge=Hedge(after=2.0))
    run(make_node, clock, lead)
    (report,) = seen["gathered"].reports
    assert report.ok
    assert [(a.hedge, a.ok) for a in report.attempts] == [(False, False), (True, True)]
    assert report.attempts[0].superseded  # cancelled once the duplicate won


def test_a_duplicate_counts_against_the_children_limit(make_node: Any, clock: VirtualClock) -> None:
    seen: dict[str, Any] = {}
    lead = lead_of(seen, ["a", "b", f"tail first {SLOW}"], hedge=Hedge(after=3.0))
    run(make_node, clock, lead, max_children=3)  # a and b end at 1 s: room at 3 s
    assert [a.hedge for a in seen["gathered"].reports[2].attempts] == [False, True]

    seen.clear()
    lead = lead_of(seen, [f"tail first {SLOW}"], hedge=Hedge(after=3.0))
    skills = {"main": lambda session: None, "run": Latencies().run, "lead": lead}

    def full(session: Any) -> str:  # a sibling holds the other place all along
        session.spawn(kind="worker", skill="run", task=f"holder first {2 * SLOW}")
        return lead(session)

    skills["full"] = full
    node: Node = make_node(Agent("agent", skills, default_skill="main", max_children=2), grace=5.0)
    spawned = node.spawn(node.main("agent"), kind="branch", skill="full", task="lead")
    assert spawned.ok
    finish(node, clock, spawned.ref, step=5.0)
    (tail,) = seen["gathered"].reports
    assert [a.hedge for a in tail.attempts] == [False]  # the limit refused the duplicate
    assert seen["took"] >= SLOW  # so it waited for the tail


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({}, "hedge"),
        ({"after": -1.0}, "hedge.after"),
        ({"after": float("nan")}, "hedge.after"),
        ({"percentile": 0}, "hedge.percentile"),
        ({"percentile": 100}, "hedge.percentile"),
        ({"percentile": 90, "min_samples": 0}, "hedge.min_samples"),
        # a bool is not a number (``hedge_after=True`` is refused too)
        ({"after": True}, "hedge.after"),
        ({"after": "1"}, "hedge.after"),
        ({"after": float("inf")}, "hedge.after"),
        ({"percentile": True}, "hedge.percentile"),
        ({"percentile": float("nan")}, "hedge.percentile"),
        ({"percentile": 90, "min_samples": True}, "hedge.min_samples"),
    ],
)
def test_a_bad_hedge_is_refused_naming_its_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(RejectedInputError) as raised:
        Hedge(**fields)
    assert raised.value.field == named


def test_a_hedge_given_as_a_mapping_of_its_fields_hedges_the_same(
    make_node: Any, clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}
    run(make_node, clock, lead_of(seen, ["a", f"tail first {SLOW}"], hedge={"after": 3.0}))
    tail = seen["gathered"].reports[1]
    assert [a.hedge for a in tail.attempts] == [False, True]
    assert tail.result.summary == f"tail first {SLOW} #2"


@pytest.mark.parametrize(
    ("hedge", "named"),
    [
        ({"after": True}, "hedge.after"),
        ({"after": float("nan")}, "hedge.after"),
        ({"percentile": 50, "min_samples": 1.5}, "hedge.min_samples"),
        ({"after": 1.0, "later": 2.0}, "hedge.later"),
        ({}, "hedge"),
    ],
)
def test_a_bad_hedge_mapping_is_refused_naming_the_field_as_a_hedge_is(
    hedge: dict[str, Any], named: str
) -> None:
    pattern = fan_out(uuid.uuid4(), Restarts(), ["a"], hedge=hedge)
    with pytest.raises(RejectedInputError) as raised:
        next(pattern)
    assert raised.value.field == named


def test_a_hedge_that_is_not_a_hedge_is_refused_before_anything_runs() -> None:
    pattern = fan_out(uuid.uuid4(), Restarts(), ["a"], hedge=3.0)
    with pytest.raises(RejectedInputError) as raised:
        next(pattern)
    assert raised.value.field == "hedge"


# -- hedged model calls ----------------------------------------------------------------


def hedging_agent(completions: list[Any]) -> Agent:
    async def hedged(session: Any) -> None:
        completions.append(await session.complete("hi there", hedge_after=5.0))

    async def idle(session: Any) -> None:
        return None

    return Agent(
        "agent",
        {"main": idle, "hedged": hedged},
        main_skill="main",
        models={"small": "m", "large": "m"},
    )


def test_a_hedged_call_sends_a_duplicate_after_its_delay_and_keeps_the_first_reply(
    make_node: Any, clock: VirtualClock
) -> None:
    completions: list[Any] = []
    with StandinServer(models=("m",)) as server:
        node = make_node(hedging_agent(completions), providers=(Provider(base_url=server.url),))
        server.fail_next("slow", delay=30.0)  # the first request hangs
        spawned = node.main("agent").spawn(kind="worker", skill="hedged", task="x")
        assert spawned.ref is not None
        assert server.wait_for_requests(1, WAIT)
        clock.advance(5.0)  # the hedge's delay: the duplicate goes out
        result = spawned.ref.wait(WAIT)
        assert server.wait_for_disconnects(1, WAIT)  # the slow request was closed
        stats = server.stats()
    assert result is not None
    assert result.ok, result
    (completion,) = completions
    assert completion.error is None
    assert completion.text == "echo hi there"
    assert stats.requests_received == 2
    assert stats.completions_served == 1
    assert result.usage.calls == 2  # both requests count against the budgets


def test_a_call_that_answers_within_the_delay_sends_no_duplicate(
    make_node: Any, clock: VirtualClock
) -> None:
    completions: list[Any] = []
    with StandinServer(models=("m",)) as server:
        node = make_node(hedging_agent(completions), providers=(Provider(base_url=server.url),))
        result = node.main("agent").run(kind="worker", skill="hedged", task="x", timeout=WAIT)
        clock.advance(10.0)  # past the delay: its timer was cancelled, nothing is sent
        assert node.wait_idle(WAIT)
        requests = server.stats().requests_received
    assert result is not None
    assert result.ok
    assert requests == 1
    assert result.usage.calls == 1


@pytest.mark.parametrize(
    "options",
    [
        {"hedge_after": -1.0},
        {"hedge_after": "soon"},
        {"hedge_after": True},
        {"hedge_after": 1.0, "stream": True},
    ],
)
def test_a_bad_hedged_call_is_refused_naming_hedge_after(
    make_node: Any, options: dict[str, Any]
) -> None:
    fields: list[str | None] = []

    async def bad(session: Any) -> None:
        try:
            await session.complete("x", **options)
        except RejectedInputError as exc:
            fields.append(exc.field)

    async def idle(session: Any) -> None:
        return None

    agent = Agent(
        "agent", {"main": idle, "bad": bad}, main_skill="main", models={"small": "m", "large": "m"}
    )
    node = make_node(agent, providers=(Provider(base_url="http://127.0.0.1:9/v1"),))
    assert node.main("agent").run(kind="worker", skill="bad", task="x", timeout=WAIT) is not None
    assert fields == ["hedge_after"]
