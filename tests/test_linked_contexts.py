"""One context (issue 25): a spawned session's context is a branch of its root
Main's conversation, its result lands on its parent's branch, and continuing
it forks from the tip of its branch.

Model calls go to the chat-completions stand-in on 127.0.0.1 through the
``openai`` SDK; what each child's model saw is read from the requests the
server received. The node runs on the test's virtual clock."""

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

from sessiontree.actors import AsyncSession, Compaction, Session, VirtualClock
from sessiontree.actors._compaction import SUMMARY_REQUEST
from sessiontree.conversations import Conversations, MemoryBackend, SessionBranch
from sessiontree.conversations._session_branch import Entry
from sessiontree.protocol import (
    ChatMessage,
    ContextScope,
    ConversationError,
    ErrorCode,
    Inbound,
    Message,
    NotAllowedError,
    RejectedInputError,
    Role,
    Routed,
    SessionResult,
    SessionState,
    SpawnSpec,
)
from sessiontree.supervision import Agent, Node, Provider
from sessiontree.supervision._continuation import continuation_token, parse_continuation
from sessiontree.testing import Reply, StandinServer, ToolCall
from tests import context_crash_node
from tests._processes import line_then_kill_9
from tests.conftest import WAIT, settle

MODELS = {"small": "m-small", "large": "m-large"}


@pytest.fixture
def server() -> Iterator[StandinServer]:
    with StandinServer() as standin:
        yield standin


def research(session: Session) -> str:
    """Two model calls on the session's own context branch."""
    session.complete(session.task)
    return session.complete("and then?").text or ""


async def aresearch(session: AsyncSession) -> str:
    await session.complete(session.task)
    return (await session.complete("and then?")).text or ""


def notes(session: Session) -> str:
    session.add_message("assistant", f"notes on {session.task}")
    return f"noted {session.task}"


def silent(session: Session) -> str:
    return "nothing said"


def lead(session: Session) -> None:
    return None


def make_agent(**skills: Callable[..., Any]) -> Agent:
    base: dict[str, Callable[..., Any]] = {
        "lead": lead,
        "research": research,
        "aresearch": aresearch,
        "notes": notes,
        "silent": silent,
    }
    base.update(skills)
    return Agent("agent", base, main_skill="lead", models=MODELS)


def standin(server: StandinServer) -> Provider:
    return Provider(base_url=server.url, retry_wait=0.01, retry_wait_max=0.05)


def sent_for(server: StandinServer, task: str) -> list[list[dict[str, Any]]]:
    """The messages of every request whose conversation carries ``task`` as a prompt."""
    return [
        r["messages"]
        for r in server.requests
        if any(m.get("role") == "user" and m.get("content") == task for m in r["messages"])
    ]


def ended(node: Node, child: uuid.UUID) -> SessionResult:
    result = node.wait(child, WAIT)
    assert result is not None, f"session {child} did not end"
    return result


def lands(node: Node, main: uuid.UUID, children: set[uuid.UUID]) -> list[Message]:
    """The result messages of ``children`` on the Main's branch, once written."""
    settle(node)
    conversation = node.conversation(main)
    return [m for m in conversation.context(100) if m.session_id in children]


# -- the fork-spawn-continue scenario -------------------------------------------------------


@pytest.mark.parametrize("skill", ["research", "aresearch"])
def test_two_children_forked_from_one_message_each_write_on_their_own_branch(
    make_node: Callable[..., Node], server: StandinServer, skill: str
) -> None:
    node = make_node(make_agent(), providers=(standin(server),))
    main = node.main("agent")
    conversation = node.conversation(main.session_id)
    question = conversation.append("user", "Plan a trip to Lisbon")
    conversation.append("assistant", "I will split it up.")

    own = main.spawn(
        kind="branch",
        skill=skill,
        task="find flights",
        context_summary="Flights only.",
        fork_at=question.id,
    ).ref
    path = main.spawn(
        kind="branch", skill=skill, task="find hotels", fork_at=question.id, context="path"
    ).ref
    assert own is not None
    assert path is not None
    for child in (own, path):
        assert ended(node, child.session_id).ok

    # each wrote on its own branch, forked at the message, named after it
    by_session = {b.session_id: b for b in conversation.branches() if b.session_id}
    assert set(by_session) == {own.session_id, path.session_id}
    for child in (own, path):
        branch = by_session[child.session_id]
        assert branch.base_id == question.id
        assert branch.own_messages == 4  # two prompts, two replies
        assert not branch.current  # the people's current branch did not move

    # the default context holds no message of the parent ...
    (first_own, second_own) = sent_for(server, "find flights")
    assert first_own == [
        {"role": "system", "content": "Flights only."},
        {"role": "user", "content": "find flights"},
    ]
    assert [m["content"] for m in second_own] == [
        "Flights only.",
        "find flights",
        "echo find flights",
        "and then?",
    ]
    # ... with context="path" it holds exactly the path up to the fork point
    (first_path, _) = sent_for(server, "find hotels")
    assert first_path == [
        {"role": "user", "content": "Plan a trip to Lisbon"},
        {"role": "user", "content": "find hotels"},
    ]

    # both results landed on the Main's branch, linking to their branches
    landed = lands(node, main.session_id, {own.session_id, path.session_id})
    assert {m.session_id: m.link for m in landed} == {
        own.session_id: by_session[own.session_id].id,
        path.session_id: by_session[path.session_id].id,
    }
    assert all(m.content.endswith("echo and then?") for m in landed)
    assert conversation.current_branch.name == "main"


def test_a_child_forks_at_its_parents_tip_by_default(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    node = make_node(make_agent(), providers=(standin(server),))
    main = node.main("agent")
    conversation = node.conversation(main.session_id)
    conversation.append("user", "first")
    tip = conversation.append("user", "second")
    child = main.spawn(kind="branch", skill="notes", task="x").ref
    assert child is not None
    assert child.info().fork_at == tip.id
    assert ended(node, child.session_id).ok
    (branch,) = [b for b in conversation.branches() if b.session_id == child.session_id]
    assert branch.base_id == tip.id


def test_a_grandchild_forks_at_its_branch_parents_tip(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    seen: dict[str, Any] = {}

    def parent(session: Session) -> str:
        session.add_message("assistant", "my own step")
        tip = session.conversation.active_leaf
        (spawned,) = session.spawn_many([SpawnSpec(kind="worker", skill="notes", task="leaf")])
        seen["tip"] = tip
        seen["child"] = spawned.ref.session_id if spawned.ref else None
        (_found,) = session.collect(timeout=60)
        seen["context"] = [m.content for m in session.conversation.context()]
        return "parent done"

    node = make_node(make_agent(parent=parent), providers=(standin(server),))
    main = node.main("agent")
    ref = main.spawn(kind="branch", skill="parent").ref
    assert ref is not None
    assert ended(node, ref.session_id).ok
    assert node.get(seen["child"]).fork_at == seen["tip"]
    # the worker's result landed on its parent's branch (no link: a worker's
    # branch lived in memory only); the parent's own context shows it
    assert seen["context"][0] == "my own step"
    assert seen["context"][1] == "[worker notes completed] noted leaf"
    settle(node)
    landed = [m for m in node.conversation(main.session_id).context(100) if m.session_id]
    assert [(m.session_id, m.link) for m in landed] == [
        (ref.session_id, f"session_{ref.session_id.hex}")
    ]


def test_a_child_that_never_used_its_context_writes_nothing(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    node = make_node(make_agent(), providers=(standin(server),))
    main = node.main("agent")
    conversation = node.conversation(main.session_id)
    conversation.append("user", "hello")
    before = len(conversation)
    for kind in ("branch", "worker"):
        result = main.run(kind=kind, skill="silent", timeout=WAIT)
        assert result is not None
        assert result.ok
    settle(node)
    assert len(conversation) == before
    assert [b.name for b in conversation.branches()] == ["main"]


# -- persistence by kind --------------------------------------------------------------------


def test_a_workers_branch_lives_in_memory_and_only_its_result_is_stored(
    open_node: Callable[..., Node], tmp_path: pathlib.Path, server: StandinServer
) -> None:
    seen: list[list[str]] = []

    def worker(session: Session) -> str:
        session.complete("what is 2+2")
        session.add_message("assistant", "checked twice")
        seen.append([m.content for m in session.conversation.context()])
        return "four"

    node = open_node(tmp_path / "store", make_agent(worker=worker), providers=(standin(server),))
    main = node.main("agent")
    result = main.run(kind="worker", skill="worker", timeout=WAIT)
    assert result is not None
    assert result.ok
    assert seen == [["what is 2+2", "echo what is 2+2", "checked twice"]]
    settle(node)
    assert node.store is not None
    node.store.flush()
    messages = list(node.store.messages(main.session_id))
    assert [(m.content, m.session_id, m.link) for m in messages] == [
        ("[worker worker completed] four", result.session_id, None)
    ]


def test_continuing_a_branch_after_a_kill_9_sees_its_whole_branch(
    tmp_path: pathlib.Path, server: StandinServer
) -> None:
    store = tmp_path / "store"
    # the leaf is durable when printed
    leaf = uuid.UUID(line_then_kill_9("tests.context_crash_node", str(store), server.url))

    node = Node(
        [context_crash_node.make_agent()], context_crash_node.config(server.url), store=store
    )
    try:
        again = node.main("agent").run(
            kind="branch",
            skill="research",
            task="refine it",
            fork_at=leaf,
            context=ContextScope.BRANCH,
            timeout=WAIT,
        )
    finally:
        node.shutdown(grace=0, timeout=5.0)
    assert again is not None
    assert again.ok, again
    (sent, _) = sent_for(server, "refine it")
    assert [m["content"] for m in sent] == [
        "draft",
        "echo draft",
        "and then?",
        "echo and then?",
        "refine it",
    ]


# -- bad input ------------------------------------------------------------------------------


def test_a_fork_point_from_another_conversation_is_refused_and_nothing_spawned(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    node = make_node(make_agent(), providers=(standin(server),))
    here = node.main("agent", "internal:main:here")
    there = node.main("agent", "internal:main:there")
    foreign = node.conversation(there.session_id).append("user", "elsewhere")
    before = len(node.sessions())
    with pytest.raises(ConversationError) as caught:
        here.spawn(kind="branch", skill="notes", fork_at=foreign.id)
    assert caught.value.field == "fork_at"
    assert caught.value.code is ErrorCode.UNKNOWN_MESSAGE
    assert str(here.session_id) in str(caught.value)
    assert len(node.sessions()) == before


def test_a_fork_point_on_a_deleted_branch_is_refused_inside_a_skill(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    caught: list[BaseException] = []

    def spawner(session: Session) -> str:
        try:
            session.spawn(SpawnSpec(kind="worker", skill="notes", fork_at=session.input["at"]))
        except ConversationError as exc:
            caught.append(exc)
        return f"{len(session.children)} children"

    node = make_node(make_agent(spawner=spawner), providers=(standin(server),))
    main = node.main("agent")
    conversation = node.conversation(main.session_id)
    root = conversation.append("user", "root")
    side = conversation.fork(root.id, "side")
    gone = conversation.append("user", "on the side")
    conversation.checkout("main")
    plan = conversation.delete_branch(side.number)
    conversation.confirm_delete(plan.token)
    result = main.run(kind="branch", skill="spawner", input={"at": str(gone.id)}, timeout=WAIT)
    assert result is not None
    assert result.summary == "0 children"
    (error,) = caught
    assert isinstance(error, ConversationError)
    assert error.field == "fork_at"


def test_a_bad_context_scope_is_refused_naming_the_field(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    node = make_node(make_agent(), providers=(standin(server),))
    main = node.main("agent")
    with pytest.raises(RejectedInputError) as caught:
        main.spawn(kind="branch", skill="notes", context="everything")
    assert caught.value.field == "context"
    with pytest.raises(RejectedInputError) as caught:
        main.spawn(kind="branch", skill="notes", fork_at="not-a-message")
    assert caught.value.field == "fork_at"


def test_a_sub_agent_may_not_rearrange_the_tree(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    refused: list[str] = []

    def meddler(session: Session) -> str:
        tip = session.add_message("assistant", "mine") or session.conversation.active_leaf
        for attempt in (
            lambda: session.conversation.fork(tip),
            lambda: session.conversation.checkout("main"),
            lambda: session.conversation.merge("main"),
            lambda: session.conversation.append("user", "x", platform_id="p1"),
        ):
            try:
                attempt()
            except (NotAllowedError, RejectedInputError) as exc:
                refused.append(type(exc).__name__)
        return "tried"

    node = make_node(make_agent(meddler=meddler), providers=(standin(server),))
    result = node.main("agent").run(kind="branch", skill="meddler", timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.COMPLETED
    assert refused == ["NotAllowedError"] * 3 + ["RejectedInputError"]


def test_a_continuation_token_forks_at_the_tip_of_the_old_branch(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    tokens: list[str] = []

    def planner(session: Session) -> str:
        (report,) = session.fan_out(
            [SpawnSpec(kind="branch", skill="research", task="draft")]
        ).reports
        assert report.continuation is not None
        tokens.append(report.continuation)
        (again,) = session.continue_run(report.continuation, "go on").reports
        assert again.result is not None
        return again.result.summary

    node = make_node(make_agent(planner=planner), providers=(standin(server),))
    result = node.main("agent").run(kind="branch", skill="planner", timeout=WAIT)
    assert result is not None
    assert result.ok, result
    body = parse_continuation(tokens[0])
    assert (body.v, body.conversation) == (2, node.main("agent").session_id)
    continued = server.requests[-2]["messages"]  # the continuation's first call
    assert [m["content"] for m in continued[1:]] == [
        "draft",
        "echo draft",
        "and then?",
        "echo and then?",
        "draft",
    ]
    assert continued[0]["content"].startswith("go on")


def test_continuing_with_a_forged_or_stale_token_is_refused_and_nothing_spawned(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    errors: list[BaseException] = []

    def continuer(session: Session) -> str:
        try:
            session.continue_run(session.input["token"], "go on")
        except (ConversationError, RejectedInputError) as exc:
            errors.append(exc)
        return f"{len(session.children)} children"

    node = make_node(make_agent(continuer=continuer), providers=(standin(server),))
    main = node.main("agent")
    first = main.run(kind="branch", skill="research", task="draft", timeout=WAIT)
    assert first is not None
    assert first.context_leaf is not None
    spec = SpawnSpec(kind="branch", skill="research", task="draft")
    stale = continuation_token(spec, first)
    forged = continuation_token(spec, msgspec.structs.replace(first, context_leaf=uuid.uuid4()))
    settle(node)
    conversation = node.conversation(main.session_id)
    (old,) = [b for b in conversation.branches() if b.session_id == first.session_id]
    conversation.confirm_delete(conversation.delete_branch(old.number).token)

    for token in ("not a token", forged, stale):
        ran = main.run(kind="branch", skill="continuer", input={"token": token}, timeout=WAIT)
        assert ran is not None
        assert ran.summary == "0 children"
    bad_text, bad_message, gone = errors
    assert isinstance(bad_text, RejectedInputError)
    assert bad_text.field == "token"
    for error in (bad_message, gone):
        assert isinstance(error, ConversationError)
        assert (error.field, error.code) == ("fork_at", ErrorCode.UNKNOWN_MESSAGE)


# -- chat: sub-agents' branches in /branches, and continuing one by checking it out --------


def test_a_chat_lists_sub_agents_and_a_message_on_ones_branch_continues_it(
    make_node: Callable[..., Node],
) -> None:
    cycles: list[str] = []

    def reply(session: Session) -> None:
        chat = ChatMessage.of(session.message)
        if chat is None:  # a child's result: it landed on the branch already
            return
        cycles.append(chat.inbound.text)
        session.spawn(SpawnSpec(kind="branch", skill="scribe", task=chat.inbound.text))

    def scribe(session: Session) -> str:
        seen = [m.content for m in session.conversation.context()]
        session.add_message("assistant", f"drafted {session.task}")
        return f"saw {seen}"

    node = make_node(Agent("bot", {"reply": reply, "scribe": scribe}, main_skill="reply"))

    def say(text: str) -> Routed:
        routed = node.route(
            Inbound(provider="telegram", chat_type="dm", chat_id="7", sender_id="7", text=text)
        )
        settle(node)
        return routed

    first = say("plan a week in Lisbon")
    listed = say("/branches").reply
    assert listed is not None
    assert "🤖 branch scribe, completed" in listed.text
    (sub,) = [b for b in listed.data["branches"] if "session" in b]
    assert sub["session"] == {"kind": "branch", "skill": "scribe", "state": "completed"}
    checked = say(f"/checkout {sub['number']}").reply
    assert checked is not None
    assert "continues its work" in checked.text

    routed = say("add a day in Sintra")
    assert routed.continued is not None
    assert routed.error is None
    assert cycles == ["plan a week in Lisbon"]  # the Main was not handed the message
    again = ended(node, routed.continued)
    assert again.summary == "saw ['drafted plan a week in Lisbon', 'add a day in Sintra']"
    conversation = node.conversation(first.session_id)
    assert [m.content for m in conversation.context(100)][-3:] == [
        "drafted plan a week in Lisbon",
        "add a day in Sintra",
        "[branch scribe completed] saw ['drafted plan a week in Lisbon', 'add a day in Sintra']",
    ]


# -- compaction -----------------------------------------------------------------------------


def _words(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "").split()) for m in messages)


LONG = " ".join(["detail"] * 40)


def steps(session: Session) -> str:
    """Five model calls on one context, each prompt 42 words long."""
    for i in range(5):
        session.complete(f"step {i}: {LONG}")
    return "stepped"


async def asteps(session: AsyncSession) -> str:
    for i in range(5):
        await session.complete(f"step {i}: {LONG}")
    return "stepped"


@pytest.mark.parametrize("skill", ["steps", "asteps"])
def test_a_long_context_is_compacted_and_the_originals_stay_in_the_tree(
    make_node: Callable[..., Node], server: StandinServer, skill: str
) -> None:
    agent = dataclasses.replace(
        make_agent(steps=steps, asteps=asteps), compaction=Compaction(at_tokens=100, keep=2)
    )
    node = make_node(agent, providers=(standin(server),))
    main = node.main("agent")
    result = main.run(kind="branch", skill=skill, timeout=WAIT)
    assert result is not None
    assert result.ok, result
    summaries = [r for r in server.requests if r["messages"][-1]["content"] == SUMMARY_REQUEST]
    calls = [r["messages"] for r in server.requests if r not in summaries]
    assert len(calls) == 5
    assert len(summaries) == 3  # the second call sent 130 tokens, and each after over 100
    assert result.usage is not None
    assert result.usage.calls == 8  # each summary is a model call, budgeted like any
    # the call after the first summary is shorter than the whole context would be
    first_summary = summaries[0]["messages"][:-1]
    assert [m["content"] for m in first_summary] == [f"step 0: {LONG}", f"echo step 0: {LONG}"]
    third = calls[2]
    assert third[0]["content"].startswith("Summary of the earlier conversation: echo")
    uncompacted = first_summary + third[1:]
    assert _words(third) < _words(uncompacted)
    assert [m["content"] for m in third[1:]] == [
        f"step 1: {LONG}",
        f"echo step 1: {LONG}",
        f"step 2: {LONG}",
    ]
    # the summaries are messages of the tree; every original is still exported
    settle(node)
    conversation = node.conversation(main.session_id)
    lines = [json.loads(line) for line in conversation.transcript()]
    assert sum(1 for line in lines if "compacts" in line) == 3
    for i in range(5):
        assert any(line["content"] == f"step {i}: {LONG}" for line in lines)


def test_a_compactor_of_the_agents_own_makes_no_model_call(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    seen: list[int] = []

    def count(messages: list[dict[str, Any]]) -> str:
        seen.append(len(messages))
        return f"{len(messages)} messages so far"

    def worker(session: Session) -> str:
        for i in range(3):
            session.complete(f"step {i}: " + "detail " * 10)
        return " / ".join(m.content for m in session.conversation.context())

    rule = Compaction(at_tokens=40, keep=1, summarise=count)
    agent = dataclasses.replace(make_agent(worker=worker), compaction=rule)
    node = make_node(agent, providers=(standin(server),))
    result = node.main("agent").run(kind="worker", skill="worker", timeout=WAIT)
    assert result is not None
    assert result.ok, result
    assert len(server.requests) == 3  # no summary call
    assert seen == [3]  # once, before the third call: all but the last message
    assert result.summary.startswith("Summary of the earlier conversation: 3 messages so far / ")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"at_tokens": 0}, "at_tokens"),
        ({"at_tokens": 10, "keep": -1}, "keep"),
        ({"at_tokens": True}, "at_tokens"),
        ({"at_tokens": 5, "summarise": "no"}, "summarise"),
    ],
)
def test_a_bad_compaction_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"Compaction.{field}"):
        Compaction(**fields)


def test_an_agent_refuses_a_compaction_that_is_not_one() -> None:
    with pytest.raises(TypeError, match="compaction must be a Compaction"):
        Agent("agent", {"lead": lead}, compaction={"at_tokens": 10})  # type: ignore[arg-type]


def test_a_childs_result_never_splits_a_tool_call_from_its_answer(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    tools = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]

    def tooling(session: Session) -> str:
        (call,) = session.complete("look it up", tools=tools).tool_calls
        session.spawn(SpawnSpec(kind="worker", skill="notes", task="the lookup"))
        session.collect(timeout=60)  # the worker used its context: its result arrives
        session.add_tool_result(call["id"], {"found": "it"})
        return session.complete(tools=tools).text or ""

    server.script(Reply("", (ToolCall("look", {"q": "x"}),)), "found it")
    node = make_node(make_agent(tooling=tooling), providers=(standin(server),))
    result = node.main("agent").run(kind="branch", skill="tooling", timeout=WAIT)
    assert result is not None
    assert result.ok, result
    sent = server.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "system"]
    assert sent[3]["content"] == "[worker notes completed] noted the lookup"


def test_compaction_keeps_the_newest_messages_in_order_round_after_round() -> None:
    shared = Conversations(MemoryBackend(), VirtualClock()).shared(uuid.uuid4())
    view = SessionBranch(shared, owner=uuid.uuid4(), name="branch:s", fork_at=None)

    def said() -> list[str]:
        return [m.content for m in view.messages()]

    def entry(role: Role, text: str, **extra: Any) -> Entry:
        return (role, text, extra.get("calls"), None, extra.get("call_id"))

    view.write([entry(Role.USER, f"m{i}") for i in range(6)])
    view.compact("S1", view.compactable(4))  # m0 and m1
    assert said() == ["Summary of the earlier conversation: S1", "m2", "m3", "m4", "m5"]
    assert view.compactable(4) == []  # only the summary would go
    view.write([entry(Role.USER, "u"), entry(Role.ASSISTANT, "a")])
    view.compact("S2", view.compactable(4))  # S1, m2, m3: S2 stands for them
    assert said() == ["Summary of the earlier conversation: S2", "m4", "m5", "u", "a"]
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    view.write(
        [
            entry(Role.ASSISTANT, "calling", calls=call),
            entry(Role.TOOL, "answer", call_id="c1"),
            entry(Role.USER, "next"),
        ]
    )
    old = view.compactable(2)  # "answer" would be kept without its call: it goes too
    assert [m.content for m in old][-2:] == ["calling", "answer"]
    view.compact("S3", old)
    assert said() == ["Summary of the earlier conversation: S3", "next"]
    assert len(list(shared.backend.messages(shared.session_id))) == 14  # originals all stay


def test_a_message_on_a_sub_agents_branch_is_refused_while_it_runs(
    make_node: Callable[..., Node],
) -> None:
    wrote, release = threading.Event(), threading.Event()

    def slow(session: Session) -> str:
        session.add_message("assistant", "working on it")
        wrote.set()
        release.wait(WAIT)
        return "finished"

    def reply(session: Session) -> None:
        if ChatMessage.of(session.message) is not None:
            session.spawn(SpawnSpec(kind="branch", skill="slow"))

    node = make_node(Agent("bot", {"reply": reply, "slow": slow}, main_skill="reply"))

    def say(text: str) -> Routed:
        inbound = Inbound(
            provider="telegram", chat_type="dm", chat_id="9", sender_id="9", text=text
        )
        return node.route(inbound)

    first = say("start")
    conversation = node.conversation(first.session_id)
    try:
        assert wrote.wait(WAIT)
        (sub,) = [b for b in conversation.branches() if b.session_id is not None]
        assert sub.own_messages == 1
        conversation.checkout(sub.number)
        refused = say("are you done?")
        assert refused.error is not None
        assert refused.error.code is ErrorCode.INVALID_TRANSITION
        assert refused.continued is None
        assert str(sub.session_id) in refused.error.message
        (again,) = [b for b in conversation.branches() if b.session_id is not None]
        assert again.own_messages == 1  # nothing appended
    finally:
        release.set()


def test_a_branch_holding_only_its_childrens_results_is_linked_from_its_parent(
    make_node: Callable[..., Node], server: StandinServer
) -> None:
    def delegate(session: Session) -> str:
        session.conversation.context()  # it uses its context, and writes nothing itself
        session.spawn(SpawnSpec(kind="worker", skill="notes", task="the detail"))
        session.collect(timeout=60)
        return "delegated"

    node = make_node(make_agent(delegate=delegate), providers=(standin(server),))
    main = node.main("agent")
    result = main.run(kind="branch", skill="delegate", timeout=WAIT)
    assert result is not None
    assert result.ok, result
    settle(node)
    conversation = node.conversation(main.session_id)
    (landed,) = [m for m in conversation.context(10) if m.session_id == result.session_id]
    assert landed.link == f"session_{result.session_id.hex}"
    (branch,) = [b for b in conversation.branches() if b.session_id == result.session_id]
    assert branch.last_message is not None
    assert branch.last_message.content == "[worker notes completed] noted the detail"
