"""Model calls through sessions (issue 20), against a real chat-completions
stand-in on 127.0.0.1 that the ``openai`` SDK talks to over sockets.

Budgets and grace run on the test's virtual clock; only the HTTP calls take
real time (milliseconds, and bounded retry waits)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sessiontree.actors import AsyncSession, Cancelled, Session
from sessiontree.actors.runtime import Activity, ModelCall
from sessiontree.protocol import (
    Budget,
    Completion,
    ErrorCode,
    ErrorInfo,
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnSpec,
    Usage,
)
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig, Price, Provider
from sessiontree.supervision._ledger import Reserved, Settle
from sessiontree.supervision._model_calls import ModelCalls
from sessiontree.supervision._models import Models
from sessiontree.supervision._requests import Call
from sessiontree.testing import Reply, StandinServer, ToolCall
from tests.conftest import WAIT, settle

END_STATES = {"completed", "failed", "cancelled"}
MODELS = {"small": "m-small", "large": "m-large"}
PRICES = {"m-small": Price(0.001, 0.002), "m-large": Price(0.01, 0.02)}


@pytest.fixture
def server() -> Iterator[StandinServer]:
    with StandinServer() as standin:
        yield standin


def provider(server: StandinServer, **fields: Any) -> Provider:
    """The stand-in as a provider, with retry waits short enough for a test."""
    settings: dict[str, Any] = {"retry_wait": 0.01, "retry_wait_max": 0.05, "prices": PRICES}
    settings.update(fields)
    return Provider(base_url=server.url, **settings)


# -- skills ---------------------------------------------------------------------


def ask(session: Session) -> str:
    completion = session.complete(session.task)
    return completion.text if completion.ok else f"error:{completion.error.code}"  # type: ignore[union-attr]


async def aask(session: AsyncSession) -> str:
    completion = await session.complete(session.task)
    return completion.text if completion.ok else f"error:{completion.error.code}"  # type: ignore[union-attr]


def fan(session: Session) -> str:
    """A branch: eight workers launched at once, each one call; on cancellation, it
    gathers what its workers return within the grace (the partial results)."""
    session.spawn_many(
        SpawnSpec(kind=SessionKind.WORKER, task=f"q {i}", skill="aask" if i % 2 else "ask")
        for i in range(8)
    )
    try:
        found = session.collect(timeout=60)
    except Cancelled:
        found = session.collect(timeout=60)  # the wrap-up, within the grace
    return "|".join(sorted(c.result.summary for c in found if c.result))


def lead(session: Session) -> None:
    return None


def agent(**skills: Callable[..., Any]) -> Agent:
    base: dict[str, Callable[..., Any]] = {"lead": lead, "ask": ask, "aask": aask, "fan": fan}
    base.update(skills)
    return Agent("agent", base, main_skill="lead", models=MODELS)


@pytest.fixture
def node(make_node: Callable[..., Node], server: StandinServer) -> Node:
    return make_node(agent(), grace=30.0, providers=(provider(server),))


def run(node: Node, skill: str, task: str = "hello there", **fields: Any) -> SessionResult:
    result = node.main("agent").run(kind="worker", skill=skill, task=task, timeout=WAIT, **fields)
    assert result is not None, "the session did not end in time"
    return result


# -- one call -------------------------------------------------------------------


@pytest.mark.parametrize("skill", ["ask", "aask"])
def test_a_call_reaches_the_provider_and_its_usage_is_counted_exactly(
    node: Node, server: StandinServer, skill: str
) -> None:
    result = run(node, skill, task="what is a supervisor")
    assert result.ok, result.error
    assert result.summary == "echo what is a supervisor"
    stats = server.stats()
    assert stats.completions_served == 1
    assert result.usage.prompt_tokens == stats.prompt_tokens_served
    assert result.usage.completion_tokens == stats.completion_tokens_served
    assert result.usage.calls == 1
    # workers get the cheapest tier, so the small model at its price
    assert server.requests[-1]["model"] == "m-small"
    price = PRICES["m-small"]
    expected = stats.prompt_tokens_served * price.prompt
    expected += stats.completion_tokens_served * price.completion
    assert result.usage.cost == pytest.approx(expected)


def test_the_context_is_sent_and_the_exchange_recorded(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    seen: list[list[dict[str, Any]]] = []

    def twice(session: Session) -> str:
        session.context.system_prompt = "You are terse."
        first = session.complete("first question")
        second = session.complete("second question")
        seen.append([m.as_chat() for m in session.conversation.context()])
        return f"{first.text} / {second.text}"

    node = make_node(agent(twice=twice), providers=(provider(server),))
    result = node.main("agent").run(
        kind="branch", skill="twice", context_summary="Earlier: nothing.", timeout=WAIT
    )
    assert result is not None
    assert result.ok, result
    sent = server.requests[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "You are terse.\n\nEarlier: nothing."}
    assert [m["content"] for m in sent[1:]] == [
        "first question",
        "echo first question",
        "second question",
    ]
    assert seen[0][-1] == {"role": "assistant", "content": "echo second question"}
    assert server.requests[-1]["model"] == "m-large"  # a root branch: the best tier


def test_a_tool_calling_loop_records_calls_and_results_as_chat_messages(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

    def tooling(session: Session) -> str:
        reply = session.complete("add 2 and 3", tools=tools, tool_choice="auto", temperature=0)
        for call in reply.tool_calls:
            session.add_tool_result(call["id"], {"sum": 5})
        return session.complete(tools=tools).text or ""

    server.script(Reply("", (ToolCall("add", {"a": 2, "b": 3}),)), "the sum is 5")
    node = make_node(agent(tooling=tooling), providers=(provider(server),))
    result = node.main("agent").run(kind="branch", skill="tooling", timeout=WAIT)
    assert result is not None
    assert result.ok, result
    assert result.summary == "the sum is 5"
    first, second = server.requests[-2:]
    assert first["tool_choice"] == "auto"
    assert first["temperature"] == 0
    assistant, tool = second["messages"][-2:]
    call = assistant["tool_calls"][0]
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
    assert tool == {"role": "tool", "content": '{"sum":5}', "tool_call_id": call["id"]}


@pytest.mark.parametrize("skill", ["sync", "async"])
def test_streamed_text_reaches_progress_as_it_arrives(
    make_node: Callable[..., Node], server: StandinServer, skill: str
) -> None:
    def stream(session: Session) -> str:
        return session.complete("one two three", stream=True).text or ""

    async def astream(session: AsyncSession) -> str:
        return (await session.complete("one two three", stream=True)).text or ""

    chosen = stream if skill == "sync" else astream
    node = make_node(agent(stream=chosen), providers=(provider(server),))
    deltas: list[str] = []
    node.subscribe(
        lambda e: deltas.append(e.data["delta"]) if e.kind is EventKind.PROGRESS else None
    )
    result = run(node, "stream")
    assert result.ok
    assert result.summary == "echo one two three"
    settle(node)
    assert "".join(deltas) == "echo one two three"
    assert len(deltas) > 1  # in pieces, as they arrived
    assert result.usage.tokens == server.stats().prompt_tokens_served + 4  # usage came too


# -- faults ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "options"),
    [
        ("rate_limit", {"retry_after": 0}),
        ("server_error", {}),
        ("drop", {}),
        ("drop_mid_reply", {}),
    ],
)
def test_transient_faults_are_retried(
    node: Node, server: StandinServer, fault: str, options: dict[str, Any]
) -> None:
    server.fail_next(fault, times=2, **options)
    result = run(node, "ask")
    assert result.ok
    assert result.summary == "echo hello there"
    assert server.stats().requests_received == 3
    assert result.usage.calls == 1  # one call, however many attempts


def test_a_timeout_is_retried_within_bounds_then_a_model_error(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    node = make_node(agent(), providers=(provider(server, timeout=0.2, max_retries=1),))
    server.fail_next("slow", times=5, delay=2.0)
    result = run(node, "ask")
    assert result.summary == "error:model_error"
    assert server.stats().requests_received == 2  # the call and one retry
    assert result.usage.calls == 1
    assert result.usage.tokens == 0


@pytest.mark.parametrize(
    ("fault", "field"), [("invalid_json", "body"), ("missing_choices", "choices")]
)
def test_an_unreadable_reply_is_a_model_error_naming_the_field(
    make_node: Callable[..., Node], server: StandinServer, fault: str, field: str
) -> None:
    completions: list[Completion] = []

    def keep(session: Session) -> None:
        completions.append(session.complete("hi"))

    node = make_node(agent(keep=keep), providers=(provider(server),))
    server.fail_next(fault)
    assert run(node, "keep").ok
    (completion,) = completions
    assert completion.error is not None
    assert completion.error.code is ErrorCode.MODEL_ERROR
    assert completion.error.detail["field"] == field
    assert server.stats().requests_received == 1  # not retried: the provider answered


def test_a_reply_without_usage_keeps_its_text_and_counts_its_worst_case(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    completions: list[Completion] = []

    def keep(session: Session) -> None:
        completions.append(session.complete("hi", max_tokens=50))

    node = make_node(agent(keep=keep), providers=(provider(server),))
    server.fail_next("no_usage")
    result = run(node, "keep")
    (completion,) = completions
    assert completion.text == "echo hi"
    assert completion.error is not None
    assert completion.error.detail["field"] == "usage"
    assert result.usage.completion_tokens == 50  # the reservation's worst case
    assert result.usage.prompt_tokens > 0


def test_a_provider_refusal_is_a_model_error_with_its_status(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    completions: list[Completion] = []

    def keep(session: Session) -> None:
        # the SDK's own passthrough, as a skill may use it: a body the provider refuses
        completions.append(session.complete("x", extra_body={"max_tokens": "lots"}))

    node = make_node(agent(keep=keep), providers=(provider(server),))
    assert run(node, "keep").ok
    (completion,) = completions
    assert completion.error is not None
    assert completion.error.code is ErrorCode.MODEL_ERROR
    assert completion.error.detail["status"] == 400


def test_an_option_the_sdk_does_not_take_is_a_model_error_naming_options(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    completions: list[Completion] = []

    def keep(session: Session) -> None:
        completions.append(session.complete("x", temprature=0.2))

    node = make_node(agent(keep=keep), providers=(provider(server),))
    assert run(node, "keep").ok
    (completion,) = completions
    assert completion.error is not None
    assert completion.error.detail["field"] == "options"
    assert server.stats().requests_received == 0


def test_an_unreachable_endpoint_is_a_model_error_not_a_hang(
    make_node: Callable[..., Node],
) -> None:
    with StandinServer() as gone:
        url = gone.url
    dead = Provider(base_url=url, max_retries=1, retry_wait=0.01, connect_timeout=1.0)
    node = make_node(agent(), providers=(dead,))
    result = run(node, "ask")
    assert result.summary == "error:model_error"


# -- cancellation and suspension -----------------------------------------------------


@pytest.mark.parametrize("skill", ["ask", "aask"])
def test_cancelling_a_call_closes_its_request_and_still_counts_it(
    node: Node, server: StandinServer, skill: str
) -> None:
    server.fail_next("slow", delay=30.0)
    spawned = node.main("agent").spawn(kind="worker", skill=skill, task="slow one")
    assert spawned.ref is not None
    assert server.wait_for_requests(1, WAIT)
    spawned.ref.cancel()
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert result.status is SessionState.CANCELLED
    assert server.wait_for_disconnects(1, WAIT)  # the request was closed
    assert server.stats().completions_served == 0


def test_a_worker_may_not_write_but_bad_arguments_are_typed_errors(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    errors: list[RejectedInputError] = []

    def bad(session: Session) -> None:
        for call in (
            lambda: session.complete(42),  # type: ignore[arg-type]
            lambda: session.complete("x", max_tokens=-1),
            lambda: session.complete("x", model=""),
            lambda: session.complete("x", n=2),
            lambda: session.complete(messages="not a list"),  # type: ignore[arg-type]
            lambda: session.complete(messages=[{"content": "no role"}]),
            lambda: session.complete("x", tools=object()),
            lambda: session.add_tool_result("", "x"),
        ):
            try:
                call()
            except RejectedInputError as exc:
                errors.append(exc)

    node = make_node(agent(bad=bad), providers=(provider(server),))
    assert run(node, "bad").ok
    fields = [e.field for e in errors]
    assert fields == [
        "prompt",
        "max_tokens",
        "model",
        "n",
        "messages",
        "messages[0]",
        "tools",
        "tool_call_id",
    ]
    assert server.stats().requests_received == 0  # nothing was sent


# -- budgets --------------------------------------------------------------------------


def test_a_fan_out_of_eight_under_five_calls_sends_exactly_five(
    node: Node, server: StandinServer
) -> None:
    events: list[Event] = []
    node.subscribe(events.append)
    result = node.main("agent").run(
        kind="branch", skill="fan", budget=Budget(calls=5), timeout=WAIT
    )
    assert result is not None
    assert result.status is SessionState.CANCELLED
    assert result.error is not None
    assert result.error.code is ErrorCode.BUDGET_EXHAUSTED
    stats = server.stats()
    assert stats.requests_received == 5  # the other three were refused before sending
    answers = result.summary.split("|")
    assert sum(a.startswith("echo q ") for a in answers) == 5  # partial results kept
    # the other three were refused, or cancelled before they asked (a checkpoint)
    assert len(answers) == 8
    assert {a for a in answers if not a.startswith("echo q ")} <= {"error:budget_exhausted", ""}
    assert result.subtree_usage.calls == 5
    assert (
        result.subtree_usage.tokens == stats.prompt_tokens_served + stats.completion_tokens_served
    )
    assert result.subtree_usage.descendants == 8
    ended = [e for e in events if e.kind is EventKind.TRANSITION and e.state in END_STATES]
    assert len(ended) == 9  # the branch and its eight workers: cancelled, never crashed
    assert {(e.state, e.code) for e in ended} == {("cancelled", "budget_exhausted")}


def test_max_tokens_is_capped_to_what_the_token_budget_leaves(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    completions: list[Completion] = []

    def keep(session: Session) -> None:
        completions.append(session.complete("one two three", max_tokens=1000))

    node = make_node(agent(keep=keep), providers=(provider(server),))
    server.script("a b c d e f g h i j k l m n o p q r s t u v w x y z")
    run(node, "keep", budget=Budget(tokens=200))
    (completion,) = completions
    assert completion.max_tokens is not None
    assert completion.max_tokens < 200
    assert server.requests[-1]["max_tokens"] == completion.max_tokens


def test_the_soft_threshold_warns_once(node: Node, server: StandinServer) -> None:
    events: list[Event] = []
    node.subscribe(events.append)
    result = node.main("agent").run(
        kind="branch", skill="fan", budget=Budget(calls=9, soft=0.5), timeout=WAIT
    )
    assert result is not None
    assert result.ok
    warnings = [e for e in events if e.kind is EventKind.BUDGET_WARNING]
    assert len(warnings) == 1
    assert warnings[0].data["dimension"] in {"calls", "descendants"}


def test_a_cost_budget_on_a_model_without_a_price_is_refused_at_spawn(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    node = make_node(agent(), providers=(provider(server, prices={}),))
    spawned = node.main("agent").spawn(kind="worker", skill="ask", budget=Budget(cost=1.0))
    assert spawned.error is not None
    assert spawned.error.code is ErrorCode.BUDGET_UNENFORCEABLE
    assert spawned.error.detail["field"] == "budget.cost"


def test_runaway_recursion_is_stopped_by_the_descendants_budget(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    def recurse(session: Session) -> str:
        session.complete(f"depth {session.depth}")
        child = session.spawn(kind="branch", skill="recurse")
        if not child.ok:
            return f"stopped: {child.error.code}"  # type: ignore[union-attr]
        try:
            found = session.collect(timeout=60)
        except Cancelled:  # the subtree's budget ran out: the wrap-up gathers what came back
            found = session.collect(timeout=60)
        return found[0].result.summary if found[0].result else ""

    node = make_node(agent(recurse=recurse), providers=(provider(server),))
    result = node.main("agent").run(
        kind="branch", skill="recurse", budget=Budget(descendants=1), timeout=WAIT
    )
    assert result is not None
    assert result.summary == "stopped: budget_exhausted"
    assert server.stats().requests_received == 2  # the root and its one descendant


# -- configuration ---------------------------------------------------------------------


def test_a_tier_without_a_model_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"models\['large'\]"):
        Agent("a", {"s": lead}, models={"small": "m"})
    with pytest.raises(ValueError, match=r"models\['huge'\] is not one of its model_tiers"):
        Agent("a", {"s": lead}, models={"small": "m", "large": "m", "huge": "m"})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"base_url": "ftp://x"}, "base_url"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"prices": {"m": 1.0}}, "prices"),
        ({"api_key": "k", "api_key_file": "f"}, "api_key"),
        ({"name": ""}, "name"),
    ],
)
def test_a_bad_provider_is_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    settings: dict[str, Any] = {"base_url": "http://127.0.0.1:9/v1"}
    settings.update(fields)
    with pytest.raises(ValueError, match=named):
        Provider(**settings)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_bad_price_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=r"Price\.prompt"):
        Price(bad, 0.0)


def test_an_agent_naming_an_unknown_provider_is_refused_at_start(server: StandinServer) -> None:
    lost = Agent("a", {"s": lead}, models={"small": "m", "large": "m"}, provider="elsewhere")
    with pytest.raises(ValueError, match="provider 'elsewhere' is not configured"):
        Node([lost], providers_config(server))
    with pytest.raises(ValueError, match="the node has no provider"):
        Node([Agent("a", {"s": lead}, models={"small": "m", "large": "m"})])


def providers_config(server: StandinServer) -> NodeConfig:
    return NodeConfig(providers=(provider(server),))


def test_the_key_is_read_from_its_file_at_start(
    make_node: Callable[..., Node], server: StandinServer, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    key.write_text("sk-test-123\n")
    node = make_node(agent(), providers=(provider(server, api_key_file=str(key)),))
    key.unlink()  # read once, at start: the session path never reads it
    assert run(node, "ask").ok
    assert server.requests  # the stand-in does not check keys; the SDK sent one
    with pytest.raises(ValueError, match="api_key_file"):
        Provider(base_url=server.url, api_key_file=str(key)).key()


def test_a_call_without_a_provider_is_a_model_error(make_node: Callable[..., Node]) -> None:
    node = make_node(Agent("agent", {"lead": lead, "ask": ask}, main_skill="lead"))
    result = run(node, "ask")
    assert result.summary == "error:model_error"


def test_usage_record_survives_in_the_store(
    server: StandinServer, tmp_path: Path, clock: Any
) -> None:
    store = tmp_path / "store"
    with Node([agent()], providers_config(server), store=store, clock=clock) as node:
        result = node.main("agent").run(kind="branch", skill="fan", timeout=WAIT)
        assert result is not None
        assert result.ok
        main_id = node.main("agent").session_id
    with Node([agent()], providers_config(server), store=store, clock=clock) as node:
        assert node.store is not None
        record = node.store.usage(main_id)
        assert record is not None
        stats = server.stats()
        assert record.subtree.tokens == stats.prompt_tokens_served + stats.completion_tokens_served
        assert record.subtree.calls == 8
        assert record.own == Usage()


def test_a_call_cancelled_while_it_reserves_releases_a_late_grant() -> None:
    """Cancelled while the Cortex answers its reservation, a call holds nothing:
    a grant that arrives after the cancellation is settled unused."""
    the_agent = agent()
    models = Models((Provider(base_url="http://127.0.0.1:9/v1"),), [the_agent])
    loop = asyncio.new_event_loop()
    answer: asyncio.Future[Reserved | ErrorInfo] = loop.create_future()
    told: list[object] = []

    async def ask(request: Any) -> Any:
        return await answer

    calls = ModelCalls(
        models, {"agent": the_agent}, ask, told.append, Activity(), lambda: loop, durable=True
    )
    info = SessionInfo(
        session_id=uuid.uuid4(),
        agent_id="agent",
        parent_id=None,
        kind=SessionKind.WORKER,
        state=SessionState.ACTIVE,
        depth=1,
        created_at=0.0,
        ttl=None,
        deadline=None,
        model_tier="small",
    )
    core = SimpleNamespace(info=info, session_id=info.session_id)
    call = ModelCall(({"role": "user", "content": "hi"},), max_tokens=5)
    task = loop.create_task(calls.complete(core, call))  # type: ignore[arg-type]
    loop.run_until_complete(asyncio.sleep(0))  # it asked, and waits for the answer
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(task)
    assert told == []
    granted = Reserved(Usage(prompt_tokens=9, completion_tokens=5, calls=1), 5, (info.session_id,))
    answer.set_result(granted)
    loop.run_until_complete(asyncio.sleep(0))
    assert told == [Call(Settle(granted, Usage()))]
    loop.run_until_complete(models.close())
    loop.close()
