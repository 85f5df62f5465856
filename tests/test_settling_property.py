"""The books balance on random trees (issue 37): branches under random budgets
fan out workers that make one or two model calls each (hedged or not), with
random latencies at the stand-in, some branches cancelled, some wrapping up
at once; once everything has settled, for every session its own usage plus
its children's subtree usage is its subtree usage, nothing is left reserved
(exactly 0), and the root counts what the server served (exactly, where no
call was cut off; a call cut off counts its worst case, so never less).

A derandomised hypothesis search of a few examples; each runs a node on a
virtual clock against the chat stand-in on 127.0.0.1.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sessiontree.actors import AsyncSession, Cancelled, Session, VirtualClock
from sessiontree.protocol import Budget, SessionKind, SpawnSpec, Usage
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig, Price, Provider
from sessiontree.testing import StandinServer
from tests.conftest import WAIT

PRICES = {"m": Price(0.0000013, 0.0000071)}


def work(session: Session) -> str:
    """A worker: ``calls`` model calls, hedged after 1 clock second if ``hedge``."""
    options: dict[str, Any] = {"hedge_after": 1.0} if session.input["hedge"] else {}
    texts = []
    for i in range(session.input["calls"]):
        texts.append(session.complete(f"{session.task} {i}", **options).text or "")
    return "|".join(texts)


async def awork(session: AsyncSession) -> str:
    options: dict[str, Any] = {"hedge_after": 1.0} if session.input["hedge"] else {}
    texts = []
    for i in range(session.input["calls"]):
        texts.append((await session.complete(f"{session.task} {i}", **options)).text or "")
    return "|".join(texts)


def branch(session: Session) -> str:
    """Fans out its workers; cancelled, it returns at once or gathers in grace."""
    session.spawn_many(
        SpawnSpec(kind=SessionKind.WORKER, task=f"w{i}", skill=skill, input=worker)
        for i, (skill, worker) in enumerate(session.input["workers"])
    )
    try:
        session.collect(timeout=600)
    except Cancelled:
        if session.input["at_once"]:
            return "at once"
        session.collect(timeout=600)
    return "gathered"


async def idle(session: AsyncSession) -> None:
    return None


AGENT = Agent(
    "agent",
    {"main": idle, "work": work, "awork": awork, "branch": branch},
    main_skill="main",
    models={"small": "m", "large": "m"},
)

workers = st.lists(
    st.tuples(
        st.sampled_from(["work", "awork"]),
        st.fixed_dictionaries({"calls": st.integers(1, 2), "hedge": st.booleans()}),
    ),
    min_size=1,
    max_size=4,
)
branches = st.lists(
    st.fixed_dictionaries(
        {
            "workers": workers,
            "calls": st.one_of(st.none(), st.integers(0, 6)),
            "cancel": st.booleans(),
            "at_once": st.booleans(),
        }
    ),
    min_size=1,
    max_size=3,
)
latencies = st.lists(st.sampled_from([0.0, 0.002, 0.01, 0.03]), min_size=0, max_size=8)


@pytest.fixture(scope="module")
def server() -> Iterator[StandinServer]:
    with StandinServer(models=("m",)) as standin:
        yield standin


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.generate],
)
@given(tree=branches, slow=latencies)
def test_every_session_balances_once_everything_settled(
    server: StandinServer, tree: list[dict[str, Any]], slow: list[float]
) -> None:
    before = server.stats()
    for delay in slow:  # the next requests take this long to answer
        server.fail_next("slow", delay=delay)
    clock = VirtualClock()
    provider = Provider(base_url=server.url, retry_wait=0.01, prices=PRICES)
    node = Node([AGENT], NodeConfig(grace=30.0, providers=(provider,)), clock=clock)
    events: list[Event] = []
    seen = threading.Condition()

    def observe(event: Event) -> None:
        with seen:
            events.append(event)
            seen.notify_all()

    node.subscribe(observe)
    try:
        main = node.main("agent")
        refs = []
        for spec in tree:
            budget = None if spec["calls"] is None else Budget(calls=spec["calls"])
            spawned = main.spawn(
                kind="branch",
                skill="branch",
                budget=budget,
                input={"workers": spec["workers"], "at_once": spec["at_once"]},
            )
            assert spawned.ref is not None, spawned.error
            refs.append(spawned.ref)
        for spec, ref in zip(tree, refs, strict=True):
            if spec["cancel"]:
                ref.cancel()
        for _ in range(3):  # hedges fall due (the grace, 30 s, never ends: nothing is forced)
            assert node.wait_idle(WAIT)
            clock.advance(1.0)
        results = [ref.wait(WAIT) for ref in refs]
        assert all(r is not None for r in results)
        with seen:  # every session that ended with calls out hears them settle
            sessions = [e for e in events if e.kind is EventKind.SPAWNED and e.parent_id]
        for e in sessions:
            assert e.session_id is not None
            result = node.wait(e.session_id, WAIT)
            assert result is not None
            if not result.usage_settled:
                _wait_settled(seen, events, e.session_id)
        assert node.wait_idle(WAIT)

        ids = [main.session_id] + [e.session_id for e in sessions if e.session_id]
        accounts = {sid: node.spending(sid) for sid in ids}
        children: dict[uuid.UUID, list[uuid.UUID]] = {sid: [] for sid in ids}
        for e in sessions:
            assert e.parent_id is not None
            assert e.session_id is not None
            children[e.parent_id].append(e.session_id)
        for sid in ids:
            spent = accounts[sid]
            assert spent.reserved == Usage(), sid  # exactly: no float residue
            below = [accounts[c].subtree_usage for c in children[sid]]
            total = sum(below, spent.usage)
            assert _model(total) == _model(spent.subtree_usage), sid
        after = server.stats()
        root = accounts[main.session_id].subtree_usage
        received = after.requests_received - before.requests_received
        served = (after.prompt_tokens_served - before.prompt_tokens_served) + (
            after.completion_tokens_served - before.completion_tokens_served
        )
        cut = any(spec["cancel"] for spec in tree) or any(
            worker["hedge"] for spec in tree for _, worker in spec["workers"]
        )
        if not cut:  # every call ran to its reply: exactly what the server did
            assert root.calls == received
            assert root.tokens == served
        else:  # a call cut off counts its worst case, sent or not: never less
            assert root.calls >= received
            assert root.tokens >= served
    finally:
        node.shutdown(grace=0, timeout=WAIT)


def _model(usage: Usage) -> tuple[int, int, int, int]:
    """What model calls spent (the ``descendants`` count is kept only where a budget bounds it)."""
    return (usage.prompt_tokens, usage.completion_tokens, usage.cost_units, usage.calls)


def _wait_settled(seen: threading.Condition, events: list[Event], session_id: uuid.UUID) -> None:
    def found() -> bool:
        return any(e.kind is EventKind.USAGE_SETTLED and e.session_id == session_id for e in events)

    with seen:
        assert seen.wait_for(found, WAIT), f"{session_id} never settled"
