"""Usage and budgets where a user looks: ``Node.spending``, the HTTP API's
session and tree (over a real server on 127.0.0.1, checked against the API's
own OpenAPI schema), and ``sessiontree sessions show|tree`` on a node and on
its store. Model calls go to the chat-completions stand-in over real sockets."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import schemathesis
from click.testing import CliRunner

from sessiontree.actors import AsyncSession, VirtualClock
from sessiontree.cli import main as cli_main
from sessiontree.cli._words import money
from sessiontree.protocol import (
    Budget,
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    Spending,
    Usage,
)
from sessiontree.store import SessionRecord, UsageRecord
from sessiontree.supervision import (
    Agent,
    EventKind,
    Node,
    NodeConfig,
    Price,
    Provider,
    stored_spending,
)
from sessiontree.supervision._requests import GetActorRef
from sessiontree.testing import StandinServer
from tests._served import ServedNode
from tests.conftest import WAIT, settle

pytestmark = pytest.mark.timeout(120)

PRICE = Price(0.001, 0.002)


# -- skills ------------------------------------------------------------------------------


async def idle(session: AsyncSession) -> None:
    return None


async def asks(session: AsyncSession) -> str:
    """Two model calls of its own, then a worker (asking for far more than is
    left: it is clamped) that makes one, and its result."""
    first = await session.complete("one two three")
    second = await session.complete("four five")
    spawned = await session.spawn(kind="worker", skill="asks_once", budget={"tokens": 10**6})
    assert spawned.session_id is not None, spawned.error
    done = await session.wait(spawned.session_id)
    assert done is not None
    return f"{first.text} | {second.text} | {done.summary}"


async def asks_once(session: AsyncSession) -> str:
    reply = await session.complete("six")
    return reply.text


async def asks_until_refused(session: AsyncSession) -> str:
    while True:
        reply = await session.complete("more please")
        if reply.error is not None:
            return f"refused: {reply.error.code}"


async def asks_each_cycle(session: AsyncSession) -> None:
    await session.complete("a message cycle")


def agent() -> Agent:
    skills = {
        "idle": idle,
        "asks": asks,
        "asks_once": asks_once,
        "asks_until_refused": asks_until_refused,
    }
    return Agent("agent", skills, main_skill="idle", models={"small": "m", "large": "m"})


def config(standin: StandinServer) -> NodeConfig:
    provider = Provider(base_url=standin.url, prices={"m": PRICE}, max_retries=0)
    return NodeConfig(providers=(provider,), grace=5.0)


def tokens(usage: dict[str, Any]) -> int:
    return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture
def standin() -> Iterator[StandinServer]:
    with StandinServer() as server:
        yield server


@pytest.fixture
def node(standin: StandinServer, make_node: Callable[..., Node]) -> Node:
    return make_node(agent(), providers=config(standin).providers, grace=5.0)


@pytest.fixture
def served(node: Node) -> Iterator[ServedNode]:
    with ServedNode(node) as server:
        yield server


@pytest.fixture
def schema(served: ServedNode) -> Any:
    return schemathesis.openapi.from_url(f"{served.url}/schema/openapi.json")


def validated(schema: Any, served: ServedNode, template: str, path: str) -> Any:
    """``GET path``, checked against the operation ``template`` of the API's schema."""
    answer = served.http.get(path)
    assert answer.status_code == 200, answer.text
    schema[template]["GET"].validate_response(answer)
    return answer.json()


def run_branch(node: Node, skill: str, budget: Budget) -> tuple[str, SessionResult]:
    spawned = node.main("agent").spawn(kind="branch", skill=skill, budget=budget)
    assert spawned.ref is not None, spawned.error
    result = spawned.ref.wait(WAIT)
    assert result is not None
    settle(node)
    return str(spawned.ref.session_id), result


# -- the HTTP API ------------------------------------------------------------------------


def test_a_session_and_its_tree_show_usage_and_what_the_budget_left(
    node: Node, served: ServedNode, standin: StandinServer, schema: Any
) -> None:
    branch, result = run_branch(node, "asks", Budget(tokens=1000, calls=5))
    assert result.status is SessionState.COMPLETED, result.error
    served_tokens = standin.tokens_served
    assert standin.completions_served == 3

    view = validated(schema, served, "/v1/sessions/{session_id}", f"/v1/sessions/{branch}")
    assert view["usage"]["calls"] == 2
    assert view["subtree_usage"]["calls"] == 3
    assert tokens(view["subtree_usage"]) == served_tokens
    assert view["subtree_usage"]["cost"] == pytest.approx(
        view["subtree_usage"]["prompt_tokens"] * PRICE.prompt
        + view["subtree_usage"]["completion_tokens"] * PRICE.completion
    )
    assert (view["usage"], view["subtree_usage"]) == (
        view["result"]["usage"],
        view["result"]["subtree_usage"],
    )
    assert view["budget"] == {
        "tokens": 1000,
        "cost": None,
        "calls": 5,
        "descendants": None,
        "soft": 0.8,
    }
    assert view["budget_left"] == {**view["budget"], "tokens": 1000 - served_tokens, "calls": 2}
    assert view["budget_exhausted"] is None
    assert view["budget_clamped"] is False
    assert view["reserved"]["calls"] == 0

    main = str(node.main("agent").session_id)
    tree = validated(schema, served, "/v1/sessions/{session_id}/tree", f"/v1/sessions/{main}/tree")
    assert tree["budget"] is None
    assert tree["budget_left"] is None
    assert tokens(tree["subtree_usage"]) == served_tokens
    assert tree["usage"]["calls"] == 0
    (shown,) = tree["children"]
    assert {k: v for k, v in shown.items() if k != "children"} == view
    (worker,) = shown["children"]
    assert worker["budget_clamped"] is True  # it asked for 10**6 tokens
    assert worker["budget"]["tokens"] < 1000
    assert worker["budget"]["calls"] == 3  # what the branch had left when it spawned
    assert worker["usage"]["calls"] == worker["subtree_usage"]["calls"] == 1
    assert tokens(view["usage"]) + tokens(worker["subtree_usage"]) == served_tokens

    spending = node.spending(branch)
    assert spending == Spending(
        usage=result.usage or Usage(),
        subtree_usage=result.subtree_usage or Usage(),
        budget=Budget(tokens=1000, calls=5),
        budget_left=Budget(tokens=1000 - served_tokens, calls=2),
    )
    assert node.ref(branch).spending() == spending


def test_an_exhausted_budget_names_its_dimension(
    node: Node, served: ServedNode, standin: StandinServer, schema: Any
) -> None:
    branch, result = run_branch(node, "asks_until_refused", Budget(calls=1))
    assert result.status is SessionState.CANCELLED
    assert result.error is not None
    assert result.error.code is ErrorCode.BUDGET_EXHAUSTED
    assert result.summary == "refused: budget_exhausted"
    assert standin.requests_received == 1  # the second call was refused before it was sent

    view = validated(schema, served, "/v1/sessions/{session_id}", f"/v1/sessions/{branch}")
    assert view["budget_exhausted"] == "calls"
    assert view["budget_left"]["calls"] == 0
    assert view["usage"]["calls"] == 1
    assert tokens(view["usage"]) == standin.tokens_served


def test_a_session_that_spent_nothing_shows_zeros_and_no_budget(
    node: Node, served: ServedNode, schema: Any
) -> None:
    main = str(node.main("agent").session_id)
    view = validated(schema, served, "/v1/sessions/{session_id}", f"/v1/sessions/{main}")
    assert view["usage"] == view["subtree_usage"] == msgspec.to_builtins(Usage())
    assert view["budget"] is None
    assert view["budget_left"] is None
    assert view["budget_exhausted"] is None


# -- the CLI, on a node and on its store, and across a restart ------------------------------


def cli(*args: str) -> Any:
    return CliRunner().invoke(cli_main, list(args), catch_exceptions=False)


ACCOUNTS = ("usage", "subtree_usage", "budget", "budget_left", "budget_exhausted")


def test_sessions_show_and_tree_print_usage_on_a_node_its_store_and_after_a_restart(
    standin: StandinServer, clock: VirtualClock, tmp_path: pathlib.Path
) -> None:
    store = tmp_path / "db"
    node = Node([agent()], config(standin), clock=clock, store=store)
    try:
        with ServedNode(node) as served:
            branch, result = run_branch(node, "asks", Budget(tokens=1000, calls=5))
            assert result.status is SessionState.COMPLETED, result.error
            main = str(node.main("agent").session_id)
            at = ["--node", served.url]
            before_view = json.loads(cli("sessions", "show", *at, branch, "--json").output)
            before_tree = json.loads(cli("sessions", "tree", *at, main, "--json").output)
            shown = cli("sessions", "show", *at, branch)
            assert shown.exit_code == 0, shown.output
            own = before_view["usage"]
            left = 1000 - standin.tokens_served
            lines = shown.output.splitlines()
            assert (
                f"  Own           {tokens(own)} tokens ({own['prompt_tokens']} prompt, "
                f"{own['completion_tokens']} completion), 2 calls, cost {money(own['cost'])}"
            ) in lines
            assert f"  Budget        1000 tokens, 5 calls; left: {left} tokens, 2 calls" in lines
            assert sum(line.startswith("  Budget") for line in lines) == 1
            drawn = cli("sessions", "tree", *at, main).output.splitlines()
            assert drawn[0].startswith("main   active")
            assert f"({standin.tokens_served} tok, 3 calls, cost " in drawn[0]
            assert f"; left {left} tokens, 2 calls)" in drawn[1]
            assert drawn[2].startswith("    `-- worker completed")
            assert " tok, 1 call, cost " in drawn[2]
    finally:
        node.shutdown(grace=0, timeout=5.0)

    stored_view = json.loads(
        cli("sessions", "show", "--store", str(store), branch, "--json").output
    )
    assert {k: stored_view[k] for k in ACCOUNTS} == {k: before_view[k] for k in ACCOUNTS}
    stored_tree = json.loads(cli("sessions", "tree", "--store", str(store), main, "--json").output)
    assert stored_tree["subtree_usage"] == before_tree["subtree_usage"]  # the main's usage record
    assert (
        stored_tree["children"][0]["subtree_usage"] == before_tree["children"][0]["subtree_usage"]
    )
    stored_lines = cli("sessions", "show", "--store", str(store), branch).output.splitlines()
    left = 1000 - standin.tokens_served
    assert f"  Budget        1000 tokens, 5 calls; left: {left} tokens, 2 calls" in stored_lines

    again = Node([agent()], config(standin), clock=clock, store=store)
    try:
        with ServedNode(again) as served:
            after = served.get(f"/v1/sessions/{branch}")
            assert {k: after[k] for k in ACCOUNTS} == {k: before_view[k] for k in ACCOUNTS}
            tree = served.get(f"/v1/sessions/{main}/tree")
            assert tree["subtree_usage"] == before_tree["subtree_usage"]
    finally:
        again.shutdown(grace=0, timeout=5.0)


def cycles_ended(node: Node) -> threading.Semaphore:
    """Released once per message cycle a Main of ``node`` ends."""
    ended = threading.Semaphore(0)
    node.subscribe(lambda event: event.kind is EventKind.CYCLE_ENDED and ended.release())
    return ended


def test_a_mains_budget_left_is_per_cycle_while_it_runs_rests_and_comes_back(
    standin: StandinServer, clock: VirtualClock, tmp_path: pathlib.Path
) -> None:
    cycles = Agent(
        "agent",
        {"asks_each_cycle": asks_each_cycle},
        models={"small": "m", "large": "m"},
        budget=Budget(calls=4),
    )
    settings = dataclasses.replace(config(standin), passivate_after=60.0, check_interval=5.0)
    node = Node([cycles], settings, clock=clock, store=tmp_path / "db")
    try:
        ended = cycles_ended(node)
        main = node.main("agent")
        for message in ("one", "two"):
            assert main.send(message) is None
            assert ended.acquire(timeout=WAIT)  # its model call settled with the cycle
        settle(node)
        after_two = main.spending()
        assert after_two.usage.calls == after_two.subtree_usage.calls == 2
        assert after_two.budget == Budget(calls=4)
        assert after_two.budget_left == Budget(calls=4)  # each cycle counts afresh
        for _ in range(14):  # idle past passivate_after, tick by tick
            clock.advance(5.0)
            settle(node)
        assert node._call(GetActorRef(main.session_id)) is None  # passivated
        assert main.spending() == after_two  # read at rest, without waking it
        assert node._call(GetActorRef(main.session_id)) is None
    finally:
        node.shutdown(grace=0, timeout=5.0)

    again = Node([cycles], settings, clock=clock, store=tmp_path / "db")
    try:
        ended = cycles_ended(again)
        dormant = again.ref(main.session_id).spending()  # from the store: not woken
        assert dormant.subtree_usage == after_two.subtree_usage
        assert dormant.budget_left == Budget(calls=4)
        assert again.ref(main.session_id).send("three") is None
        assert ended.acquire(timeout=WAIT)
        assert again.ref(main.session_id).spending().subtree_usage.calls == 3
    finally:
        again.shutdown(grace=0, timeout=5.0)
    assert standin.completions_served == 3


# -- what the store alone can say -----------------------------------------------------------


def record(kind: SessionKind, budget: Budget | None, result: SessionResult | None) -> SessionRecord:
    info = SessionInfo(
        session_id=SID,
        agent_id="agent",
        parent_id=None if kind is SessionKind.MAIN else PARENT,
        kind=kind,
        state=SessionState.ACTIVE if result is None else result.status,
        depth=0 if kind is SessionKind.MAIN else 1,
        created_at=0.0,
        ttl=None,
        deadline=None,
        budget=budget,
    )
    return SessionRecord(info=info, result=result, updated_at=0.0)


SID = uuid.UUID(int=1)
PARENT = uuid.UUID(int=2)
SPENT = Usage(prompt_tokens=60, completion_tokens=40, cost=0.14, calls=2)


def test_the_store_alone_reports_a_mains_budget_from_a_fresh_cycle() -> None:
    main = record(SessionKind.MAIN, Budget(calls=3), None)
    spending = stored_spending(main, UsageRecord(session_id=SID, own=SPENT, subtree=SPENT + SPENT))
    assert spending.usage == SPENT
    assert spending.subtree_usage == SPENT + SPENT
    assert spending.budget_left == Budget(calls=3)  # as it counts when it comes back
    assert stored_spending(main, None).subtree_usage == Usage()


def test_the_store_alone_names_the_dimension_an_ended_session_used_up() -> None:
    def ended(code: ErrorCode) -> SessionResult:
        return SessionResult(
            session_id=SID,
            status=SessionState.CANCELLED,
            error=ErrorInfo(code=code, message="ended"),
            usage=SPENT,
            subtree_usage=SPENT,
        )

    used_up = stored_spending(
        record(SessionKind.BRANCH, Budget(tokens=500, calls=2), ended(ErrorCode.BUDGET_EXHAUSTED)),
        None,
    )
    assert used_up.budget_exhausted == "calls"
    assert used_up.budget_left == Budget(tokens=400, calls=0)
    by_an_ancestor = stored_spending(
        record(SessionKind.BRANCH, Budget(calls=9), ended(ErrorCode.BUDGET_EXHAUSTED)), None
    )
    assert by_an_ancestor.budget_exhausted is None
    cancelled = stored_spending(
        record(SessionKind.BRANCH, Budget(calls=2), ended(ErrorCode.CANCELLED)), None
    )
    assert cancelled.budget_exhausted is None
    unbounded = stored_spending(record(SessionKind.WORKER, None, ended(ErrorCode.CANCELLED)), None)
    assert unbounded == Spending(usage=SPENT, subtree_usage=SPENT)
