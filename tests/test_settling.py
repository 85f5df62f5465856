"""Usage settles wherever it lands, exactly once (issue 37): a model call
that ends after its session, or an ancestor, has ended is counted in that
session's own figures and in every ancestor's subtree, live and in the store;
the result that reached the parent says whether its figures were final, and
a ``usage_settled`` event carries the final ones.

Against the chat stand-in on 127.0.0.1 (held while a test needs calls in
flight) and the virtual clock; the kill -9 case runs a real node process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sessiontree.actors import AsyncSession, Cancelled, Session, VirtualClock
from sessiontree.protocol import (
    Budget,
    ErrorCode,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnSpec,
    Spending,
    Usage,
)
from sessiontree.store import Store
from sessiontree.supervision import (
    Agent,
    Event,
    EventKind,
    Hedge,
    Node,
    Price,
    Provider,
    Tracing,
)
from sessiontree.testing import StandinServer
from tests.conftest import WAIT
from tests.settle_crash_node import AGENT_ID, BRANCH_CALLS, WORKERS, make_agent, node_config
from tests.test_hedging import Latencies
from tests.test_patterns import finish
from tests.test_persistence import FailingIO

ROOT = Path(__file__).resolve().parent.parent
PRICES = {"m": Price(0.0000013, 0.0000071)}  # per token: costs a float sum would not keep


@pytest.fixture
def server() -> Iterator[StandinServer]:
    with StandinServer(models=("m",)) as standin:
        yield standin


def provider(server: StandinServer) -> Provider:
    return Provider(base_url=server.url, retry_wait=0.01, retry_wait_max=0.05, prices=PRICES)


# -- skills ---------------------------------------------------------------------------


def ask(session: Session) -> str:
    return session.complete(session.task).text or ""


async def aask(session: AsyncSession) -> str:
    return (await session.complete(session.task)).text or ""


def quick(session: Session) -> str:
    """A branch that fans out eight callers and, cancelled, returns at once."""
    session.spawn_many(
        SpawnSpec(kind=SessionKind.WORKER, task=f"q {i}", skill="ask") for i in range(8)
    )
    try:
        session.collect(timeout=60)
    except Cancelled:
        return "wrapped up at once"
    return "all in"


async def aquick(session: AsyncSession) -> str:
    await session.spawn_many(
        SpawnSpec(kind=SessionKind.WORKER, task=f"q {i}", skill="aask") for i in range(8)
    )
    try:
        await session.collect(timeout=60)
    except Cancelled:
        return "wrapped up at once"
    return "all in"


def hedged(session: Session) -> str:
    return session.complete("hi there", hedge_after=5.0).text or ""


async def ahedged(session: AsyncSession) -> str:
    return (await session.complete("hi there", hedge_after=5.0)).text or ""


async def idle(session: AsyncSession) -> None:
    return None


SKILLS: dict[str, Callable[..., Any]] = {
    "main": idle,
    "ask": ask,
    "aask": aask,
    "quick": quick,
    "aquick": aquick,
    "hedged": hedged,
    "ahedged": ahedged,
}


@pytest.fixture
def node(make_node: Callable[..., Node], server: StandinServer) -> Node:
    agent = Agent("agent", SKILLS, main_skill="main", models={"small": "m", "large": "m"})
    return make_node(agent, grace=30.0, providers=(provider(server),))


class Watch:
    """The node's events, and a wait for one session's ``usage_settled``."""

    def __init__(self, node: Node) -> None:
        self.events: list[Event] = []
        self.cond = threading.Condition()
        node.subscribe(self._seen)

    def _seen(self, event: Event) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def settled(self, session_id: uuid.UUID) -> Event:
        def found() -> Event | None:
            return next(
                (
                    e
                    for e in self.events
                    if e.kind is EventKind.USAGE_SETTLED and e.session_id == session_id
                ),
                None,
            )

        with self.cond:
            assert self.cond.wait_for(found, WAIT), f"no usage_settled for {session_id}"
            event = found()
        assert event is not None
        return event

    def children(self, parent_id: uuid.UUID) -> list[uuid.UUID]:
        with self.cond:
            return [
                e.session_id
                for e in self.events
                if e.kind is EventKind.SPAWNED and e.parent_id == parent_id and e.session_id
            ]


def final(node: Node, watch: Watch, result: SessionResult) -> Spending:
    """The session's accounts once every call in its subtree settled."""
    if not result.usage_settled:
        event = watch.settled(result.session_id)
        spending = node.spending(result.session_id)
        assert event.data == {
            "usage": msgspec.structs.asdict(spending.usage),
            "subtree_usage": msgspec.structs.asdict(spending.subtree_usage),
        }
    return node.spending(result.session_id)


# -- a session that ends before its descendants' calls land -----------------------------


@pytest.mark.parametrize("skill", ["quick", "aquick"])
def test_a_branch_that_returns_at_once_counts_the_calls_that_land_after_it(
    node: Node, server: StandinServer, skill: str
) -> None:
    watch = Watch(node)
    server.hold()  # the five calls the budget lets through stay in flight
    spawned = node.main("agent").spawn(kind="branch", skill=skill, budget=Budget(calls=5))
    assert spawned.ref is not None, spawned.error
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert result.status is SessionState.CANCELLED
    assert result.error is not None
    assert result.error.code is ErrorCode.BUDGET_EXHAUSTED
    assert result.summary == "wrapped up at once"
    assert server.wait_for_requests(5, WAIT)
    assert not result.usage_settled  # it ended with its workers' calls in flight
    assert result.subtree_usage is not None
    assert result.subtree_usage.calls == 0

    server.release()
    spending = final(node, watch, result)
    stats = server.stats()
    workers = watch.children(result.session_id)
    assert len(workers) == 8
    own = [node.spending(w).usage for w in workers]
    assert spending.subtree_usage.calls == 5 == sum(u.calls for u in own) == stats.requests_received
    assert stats.completions_served == 5
    served = stats.prompt_tokens_served + stats.completion_tokens_served
    assert spending.subtree_usage.tokens == served == sum(u.tokens for u in own)
    assert spending.subtree_usage.cost_units == sum(u.cost_units for u in own)
    assert spending.budget_left is not None
    assert spending.budget_left.calls == 0
    assert spending.budget_exhausted == "calls"
    assert spending.reserved == Usage()  # exactly: no float residue
    main = node.spending(node.main("agent").session_id)
    assert main.subtree_usage.calls == 5
    assert main.subtree_usage.cost_units == spending.subtree_usage.cost_units
    assert main.reserved == Usage()


@pytest.mark.parametrize("skill", ["ask", "aask"])
def test_a_worker_cancelled_mid_call_counts_its_call(
    node: Node, server: StandinServer, skill: str
) -> None:
    watch = Watch(node)
    server.fail_next("slow", delay=30.0)
    spawned = node.main("agent").spawn(kind="worker", skill=skill, task="slow one")
    assert spawned.ref is not None
    assert server.wait_for_requests(1, WAIT)
    spawned.ref.cancel()
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert result.status is SessionState.CANCELLED
    spending = final(node, watch, result)
    assert server.wait_for_disconnects(1, WAIT)  # the request was closed
    # what it generated before the close is unknown: counted at what it reserved
    assert spending.usage.calls == 1
    assert spending.usage.prompt_tokens > 0
    assert spending.subtree_usage == spending.usage
    assert spending.reserved == Usage()
    main = node.spending(node.main("agent").session_id)
    assert main.subtree_usage.calls == 1
    assert main.subtree_usage.tokens == spending.usage.tokens
    assert main.reserved == Usage()


# -- hedging ---------------------------------------------------------------------------


@pytest.mark.parametrize("skill", ["hedged", "ahedged"])
def test_a_hedged_call_counts_both_requests_in_its_own_usage_every_time(
    node: Node, server: StandinServer, clock: VirtualClock, skill: str
) -> None:
    for run in range(25):
        server.fail_next("slow", delay=30.0)  # the first request hangs; the duplicate wins
        spawned = node.main("agent").spawn(kind="worker", skill=skill, task=f"x {run}")
        assert spawned.ref is not None
        assert server.wait_for_requests(2 * run + 1, WAIT)
        clock.advance(5.0)  # the hedge's delay: the duplicate goes out
        result = spawned.ref.wait(WAIT)
        assert result is not None
        assert result.ok, result
        assert result.summary == "echo hi there"
        assert result.usage is not None
        assert result.usage.calls == 2, run  # the loser settled before the reply returned
        assert result.usage_settled
        assert node.spending(result.session_id).reserved == Usage()
    assert server.wait_for_disconnects(25, WAIT)
    assert server.stats().requests_received == 50
    main = node.spending(node.main("agent").session_id)
    assert main.subtree_usage.calls == 50
    assert main.reserved == Usage()


def test_a_hedged_call_the_budget_cannot_fit_sends_no_duplicate_and_stops_nothing(
    node: Node, server: StandinServer, clock: VirtualClock
) -> None:
    server.hold()
    spawned = node.main("agent").spawn(
        kind="worker", skill="ahedged", task="x", budget=Budget(calls=1)
    )
    assert spawned.ref is not None
    assert server.wait_for_requests(1, WAIT)
    clock.advance(5.0)  # the duplicate falls due; the budget has no room for it
    assert node.wait_idle(WAIT)
    server.release()
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert result.status is SessionState.COMPLETED, result
    assert result.summary == "echo hi there"
    assert server.stats().requests_received == 1
    spending = node.spending(result.session_id)
    assert spending.usage.calls == 1
    assert spending.budget_exhausted is None
    assert spending.reserved == Usage()


def test_a_hedged_fan_out_the_budget_cannot_duplicate_completes_without_the_hedge(
    make_node: Callable[..., Node], clock: VirtualClock
) -> None:
    seen: dict[str, Any] = {}

    def lead(session: Any) -> str:
        seen["gathered"] = session.fan_out(["a", "tail first 100"], skill="run", hedge=Hedge(3.0))
        return "led"

    skills = {"main": lambda session: None, "run": Latencies().run, "lead": lead}
    node = make_node(Agent("agent", skills, default_skill="main"), grace=5.0)
    spawned = node.spawn(
        node.main("agent"), kind="branch", skill="lead", budget=Budget(descendants=2)
    )
    assert spawned.ok, spawned.error
    result = finish(node, clock, spawned.ref, step=0.5)
    assert result.status is SessionState.COMPLETED, result
    assert result.summary == "led"
    tail = seen["gathered"].reports[1]
    assert [a.hedge for a in tail.attempts] == [False]  # the duplicate was not started
    assert tail.ok
    assert node.spending(result.session_id).budget_exhausted is None


# -- across a kill -9 ------------------------------------------------------------------


def test_calls_in_flight_at_a_kill_9_are_counted_once_after_the_restart(
    tmp_path: Path, server: StandinServer
) -> None:
    store, ack = tmp_path / "store", tmp_path / "ack.json"
    server.hold()  # the branch's calls are in flight when the node dies
    errors = tmp_path / "node.stderr"
    command = [sys.executable, "-m", "tests.settle_crash_node", str(store), server.url, str(ack)]
    with errors.open("wb") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + 60.0
            while not ack.exists() or not ack.read_text().endswith("\n"):
                assert process.poll() is None, errors.read_text()
                assert time.monotonic() < deadline, errors.read_text()
                time.sleep(0.005)  # another process: a short real pause between looks
            assert server.wait_for_requests(BRANCH_CALLS, WAIT)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(WAIT)
    assert process.returncode == -signal.SIGKILL
    server.release()  # too late: nobody reads the replies
    branch_id = uuid.UUID(json.loads(ack.read_text())["branch"])
    with Store(store, readonly=True) as view:
        lost = view.calls()
    assert len(lost) == BRANCH_CALLS
    workers = {call.session_id for call in lost}

    with Node([make_agent()], node_config(server.url), store=store) as node:
        spending = node.spending(branch_id)
        main = node.spending(node.main(AGENT_ID).session_id)
    requests = server.stats().requests_received
    assert spending.subtree_usage.calls == BRANCH_CALLS == requests
    assert main.subtree_usage.calls == BRANCH_CALLS
    asks = sum((call.ask for call in lost), Usage())
    assert spending.subtree_usage.tokens == asks.tokens  # each at its worst case, once
    with Store(store, readonly=True) as view:
        assert view.calls() == []
        own = [view.usage(w) for w in workers]
    assert sum(u.own.calls for u in own if u is not None) == BRANCH_CALLS
    assert WORKERS > BRANCH_CALLS


# -- the span --------------------------------------------------------------------------


def test_the_span_of_a_branch_that_ended_first_carries_the_settled_usage(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: PLC0415
        InMemorySpanExporter,  # the otlp extra, as tests/test_traces.py needs it
    )

    exporter = InMemorySpanExporter()
    agent = Agent("agent", SKILLS, main_skill="main", models={"small": "m", "large": "m"})
    node = make_node(
        agent,
        grace=30.0,
        providers=(provider(server),),
        tracing=Tracing(exporter=exporter, schedule_delay=0.05),
    )
    watch = Watch(node)
    server.hold()
    spawned = node.main("agent").spawn(kind="branch", skill="aquick", budget=Budget(calls=5))
    assert spawned.ref is not None
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert not result.usage_settled
    server.release()
    spending = final(node, watch, result)
    node.shutdown(timeout=WAIT)  # writes and exports every span
    (span,) = [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("sessiontree.session.id") == str(result.session_id)
    ]
    attributes = span.attributes or {}
    assert attributes["sessiontree.usage.calls"] == spending.subtree_usage.calls == 5
    assert attributes["sessiontree.usage.cost"] == spending.subtree_usage.cost
    assert "sessiontree.usage.settled" not in attributes
    assert result.timings is not None
    assert result.timings.ended_at is not None
    assert span.end_time == int(result.timings.ended_at * 1e9)  # ended when the branch did


# -- a call the store will not put on record ----------------------------------------


@pytest.fixture
def failing(tmp_path: Path) -> Iterator[tuple[FailingIO, Store]]:
    """A store whose commits fail on demand (``FailingIO.fail_next``); each
    test shuts its node down before the store closes."""
    io = FailingIO()
    store = Store(tmp_path / "store", io=io)
    yield io, store
    store.close()


def on_store(
    open_node: Callable[..., Node],
    store: Store,
    server: StandinServer,
    **skills: Callable[..., Any],
) -> Node:
    agent = Agent(
        "agent", {**SKILLS, **skills}, main_skill="main", models={"small": "m", "large": "m"}
    )
    return open_node(store, agent, grace=30.0, providers=(provider(server),))


async def after_a_nap(session: AsyncSession) -> str:
    """Sleeps one clock second, then calls: what the call answered."""
    await session.sleep(1.0)
    completion = await session.complete(session.task)
    return completion.text if completion.error is None else completion.error.code.value


def test_a_call_whose_record_the_store_refuses_is_never_sent_and_reserves_nothing(
    open_node: Callable[..., Node],
    server: StandinServer,
    clock: VirtualClock,
    failing: tuple[FailingIO, Store],
) -> None:
    io, store = failing
    node = on_store(open_node, store, server, nap=after_a_nap)
    main = node.main("agent")
    spawned = main.spawn(kind="worker", skill="nap", task="on record", budget=Budget(calls=1))
    assert spawned.ref is not None
    assert node.wait_idle(WAIT)  # asleep: nothing more to write until it wakes
    io.fail_next(1)  # the next commit: its call's record
    clock.advance(1.0)
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert result.ok, result
    assert result.summary == "store_failed"
    assert server.stats().requests_received == 0  # never sent
    spending = node.spending(result.session_id)
    assert spending.usage.calls == 0
    assert spending.reserved == Usage()
    assert spending.budget_left is not None
    assert spending.budget_left.calls == 1  # the refused call took nothing
    assert node.spending(main.session_id).reserved == Usage()
    assert store.calls() == []
    assert not node.closed
    node.shutdown(timeout=WAIT)


def test_the_settled_figures_reach_the_event_stream(node: Node, server: StandinServer) -> None:
    from tests._served import ServedNode  # noqa: PLC0415 - a real HTTP server, this test only
    from tests.test_events_stream import ring  # noqa: PLC0415

    watch = Watch(node)
    with ServedNode(node) as served:
        server.hold()
        spawned = node.main("agent").spawn(kind="branch", skill="quick", budget=Budget(calls=5))
        assert spawned.ref is not None
        result = spawned.ref.wait(WAIT)
        assert result is not None
        assert not result.usage_settled
        server.release()
        spending = final(node, watch, result)
        settled = [m.json() for m in ring(served) if m.event == "usage_settled"]
    mine = [m for m in settled if m["session_id"] == str(result.session_id)]
    assert len(mine) == 1  # once
    assert mine[0]["data"]["subtree_usage"]["calls"] == spending.subtree_usage.calls == 5


def test_the_soft_warning_comes_before_the_hard_limit_while_calls_are_out(
    node: Node, server: StandinServer
) -> None:
    watch = Watch(node)
    server.hold()  # no call settles before the limit is reached: reservations alone
    spawned = node.main("agent").spawn(kind="branch", skill="quick", budget=Budget(calls=5))
    assert spawned.ref is not None
    result = spawned.ref.wait(WAIT)
    assert result is not None
    server.release()
    final(node, watch, result)
    kinds = [
        e.kind
        for e in watch.events
        if e.session_id == result.session_id
        and e.kind in (EventKind.BUDGET_WARNING, EventKind.BUDGET_EXHAUSTED)
    ]
    assert kinds == [EventKind.BUDGET_WARNING, EventKind.BUDGET_EXHAUSTED]


async def twice(session: AsyncSession) -> str:
    """Two model calls, one after the other: what each answered."""
    answers = []
    for i in range(2):
        completion = await session.complete(f"{session.task} {i}")
        answers.append(completion.text if completion.error is None else completion.error.code)
    return "|".join(answers)


def test_a_settle_the_store_refused_is_written_again_with_the_next(
    open_node: Callable[..., Node], server: StandinServer, failing: tuple[FailingIO, Store]
) -> None:
    io, store = failing
    node = on_store(open_node, store, server, twice=twice)
    server.hold()
    spawned = node.main("agent").spawn(kind="worker", skill="twice", task="q")
    assert spawned.ref is not None
    assert server.wait_for_requests(1, WAIT)  # its first call is out, on record
    io.fail_next(1)  # the next commit: that call's settle
    server.release()
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert result.summary == "store_failed|echo q 1"  # the reply came; its write did not
    store.flush()
    # the second settle wrote the first's usage again and dropped its record:
    # nothing a restart would count a second time
    assert store.calls() == []
    record = store.usage(result.session_id)
    assert record is not None
    assert record.own.calls == 2 == server.stats().requests_received
    node.shutdown(timeout=WAIT)


def test_a_usage_record_with_a_cost_that_is_not_a_number_is_corrupt() -> None:
    from sessiontree.protocol import CorruptRecordError  # noqa: PLC0415
    from sessiontree.store import UsageRecord, decode_record  # noqa: PLC0415

    sid = uuid.UUID(int=7)
    for bad in (float("nan"), float("inf"), -0.5):
        raw = msgspec.msgpack.encode(
            {"v": 4, "session_id": str(sid), "own": {"cost": bad}, "subtree": {}}
        )
        with pytest.raises(CorruptRecordError):
            decode_record(UsageRecord, raw, db="usage", key=sid.bytes)
    negative = msgspec.msgpack.encode(
        {"v": 4, "session_id": str(sid), "own": {"calls": -1}, "subtree": {}}
    )
    with pytest.raises(CorruptRecordError):
        decode_record(UsageRecord, negative, db="usage", key=sid.bytes)
