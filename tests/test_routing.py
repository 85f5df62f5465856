"""Per-sender session keys and ``Node.route``: inbound chat messages reach the right Main."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiontree.actors import VirtualClock
from sessiontree.protocol import (
    MAX_TEXT_CHARS,
    ChatMessage,
    Inbound,
    NotAllowedError,
    RejectedInputError,
    SessionKey,
    UnknownSessionError,
    decode_inbound,
    session_key_for,
)
from sessiontree.supervision import Agent, Node, NodeConfig
from tests.conftest import WAIT, settle


def inbound(**fields: Any) -> Inbound:
    """An Inbound built in Python: the constructor checks no constraints, so
    ``session_key_for`` must (decoding checks them too, see below)."""
    base: dict[str, Any] = {
        "provider": "telegram",
        "chat_type": "dm",
        "chat_id": "42",
        "sender_id": "42",
        "text": "hello",
        "account": "bot7",
    }
    return Inbound(**{**base, **fields})


# -- session keys ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "telegram:dm:42",
        "whatsapp:dm:+1234567890",
        "discord:channel:987654",
        "internal:main:main",
        "telegram:dm:bot7/42",
        "slack:thread:C1.1700000000.123",
        "mail:dm:ada@example.org",
    ],
)
def test_the_specification_s_keys_parse_and_format_back(text: str) -> None:
    key = SessionKey.parse(text)
    assert str(key) == text
    assert SessionKey.parse(str(key)) == key


@given(
    provider=st.from_regex(r"[a-z][a-z0-9_-]{0,31}", fullmatch=True),
    scope=st.sampled_from(["main", "dm", "group", "channel", "thread"]),
    identifier=st.from_regex(r"[A-Za-z0-9._+@/-]{1,256}", fullmatch=True),
)
def test_every_key_of_the_grammar_round_trips(provider: str, scope: str, identifier: str) -> None:
    key = SessionKey(provider, scope, identifier)
    assert SessionKey.parse(str(key)) == key


@pytest.mark.parametrize(
    ("text", "field", "why"),
    [
        ("Telegram:dm:42", "provider", "lower-case letter"),
        ("9gag:dm:42", "provider", "lower-case letter"),
        ("p" * 33 + ":dm:42", "provider", "at most 31"),
        ("telegram:private:42", "scope", "one of main, dm, group, channel, thread"),
        ("telegram:dm:", "identifier", "is empty"),
        ("telegram:dm:has space", "identifier", "' '"),
        ("telegram:dm:a:b", "identifier", "':'"),
        ("telegram:dm:" + "9" * 257, "identifier", "257 characters"),
        ("telegram-dm-42", "key", "provider:scope:identifier"),
        ("", "key", "provider:scope:identifier"),
    ],
)
def test_a_bad_key_names_the_wrong_part_and_why(text: str, field: str, why: str) -> None:
    with pytest.raises(RejectedInputError) as caught:
        SessionKey.parse(text)
    assert caught.value.field == field
    assert why in str(caught.value)


def test_dm_scope_main_puts_every_direct_message_in_the_main_session() -> None:
    for sender in ("1", "2"):
        assert str(session_key_for(inbound(sender_id=sender), "main")) == "internal:main:main"


def test_dm_scope_per_channel_peer_gives_each_sender_on_each_provider_a_session() -> None:
    keys = {
        str(session_key_for(inbound(provider=p, sender_id=s), "per-channel-peer"))
        for p in ("telegram", "whatsapp")
        for s in ("1", "2")
    }
    assert keys == {"telegram:dm:1", "telegram:dm:2", "whatsapp:dm:1", "whatsapp:dm:2"}


def test_dm_scope_per_account_channel_peer_joins_account_and_peer() -> None:
    key = session_key_for(inbound(account="bot7", sender_id="42"), "per-account-channel-peer")
    assert str(key) == "telegram:dm:bot7/42"
    other = session_key_for(inbound(account="bot8", sender_id="42"), "per-account-channel-peer")
    assert key != other


@pytest.mark.parametrize("scope", ["main", "per-channel-peer", "per-account-channel-peer"])
@pytest.mark.parametrize("chat_type", ["group", "channel", "thread"])
def test_groups_channels_and_threads_always_get_their_own_session(
    scope: str, chat_type: str
) -> None:
    message = inbound(chat_type=chat_type, chat_id="-100987", sender_id="5")
    assert str(session_key_for(message, scope)) == f"telegram:{chat_type}:-100987"


@pytest.mark.parametrize(
    ("fields", "scope", "field"),
    [
        ({"sender_id": "a b"}, "per-channel-peer", "sender_id"),
        ({"sender_id": "x/y"}, "per-channel-peer", "sender_id"),
        ({"account": ""}, "per-account-channel-peer", "account"),
        ({"account": "a:b"}, "per-account-channel-peer", "account"),
        ({"chat_type": "group", "chat_id": "g 1"}, "main", "chat_id"),
        ({"provider": "Tele"}, "per-channel-peer", "provider"),
        ({}, "everyone", "dm_scope"),
    ],
)
def test_an_inbound_message_that_cannot_make_a_key_names_its_field(
    fields: dict[str, Any], scope: str, field: str
) -> None:
    with pytest.raises(RejectedInputError) as caught:
        session_key_for(inbound(**fields), scope)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"sender_id": "a b"}, "sender_id"),
        ({"sender_id": "x/y"}, "sender_id"),
        ({"sender_id": "x" * 192}, "sender_id"),
        ({"account": "a:b"}, "account"),
        ({"chat_id": "g 1"}, "chat_id"),
        ({"provider": "Tele"}, "provider"),
    ],
)
def test_decoding_an_inbound_message_checks_the_key_grammar(
    fields: dict[str, Any], field: str
) -> None:
    base = msgspec.to_builtins(inbound())
    with pytest.raises(RejectedInputError) as caught:
        decode_inbound(msgspec.json.encode({**base, **fields}))
    assert caught.value.field == field


def test_an_agent_refuses_an_unknown_dm_scope() -> None:
    with pytest.raises(ValueError, match="dm_scope"):
        Agent("a", {"s": lambda s: None}, dm_scope="per-user")


# -- routing -----------------------------------------------------------------------------


class Chatbot:
    """A Main skill that answers each chat message in its conversation."""

    def __init__(self) -> None:
        self.seen: list[tuple[uuid.UUID, str, list[str]]] = []
        self.lock = threading.Lock()

    def __call__(self, session: Any) -> None:
        chat = ChatMessage.of(session.message)
        if chat is None:
            return
        context = [m.content for m in session.conversation.context(50)]
        with self.lock:
            self.seen.append((session.session_id, chat.inbound.text, context))
        session.conversation.append("assistant", f"echo: {chat.inbound.text}")


def chat_node(make_node: Any, bot: Chatbot, scope: str = "per-channel-peer") -> Node:
    node: Node = make_node(Agent("assistant", {"chat": bot}, dm_scope=scope))
    return node


def test_route_appends_the_message_and_runs_one_cycle_of_the_sender_s_main(
    make_node: Any,
) -> None:
    bot = Chatbot()
    node = chat_node(make_node, bot)
    routed = node.route(inbound(text="hi there", message_id="m1"))
    assert routed.key == "telegram:dm:42"
    assert routed.reply is None
    assert routed.error is None
    settle(node)
    assert node.get(routed.session_id).key == "telegram:dm:42"
    ((sid, text, context),) = bot.seen
    assert (sid, text, context) == (routed.session_id, "hi there", ["hi there"])
    conversation = node.conversation(routed.session_id)
    assert [m.content for m in conversation.context(10)] == ["hi there", "echo: hi there"]
    assert conversation.by_platform_id("m1").id == routed.message_id  # type: ignore[union-attr]


def test_different_senders_get_different_sessions_and_never_see_each_other(
    make_node: Any,
) -> None:
    bot = Chatbot()
    node = chat_node(make_node, bot)
    first = node.route(inbound(sender_id="1", text="from one"))
    settle(node)
    second = node.route(inbound(sender_id="2", text="from two"))
    settle(node)
    assert first.session_id != second.session_id
    assert bot.seen[1][2] == ["from two"]


def test_concurrent_first_messages_of_one_sender_make_exactly_one_main(make_node: Any) -> None:
    bot = Chatbot()
    node = chat_node(make_node, bot)
    start = threading.Barrier(16)
    routed: list[Any] = []

    def send(i: int) -> None:
        start.wait(WAIT)
        routed.append(node.route(inbound(text=f"m{i}", message_id=f"p{i}")))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    settle(node)
    assert len({r.session_id for r in routed}) == 1
    mains = [s for s in node.sessions() if s.key == "telegram:dm:42"]
    assert len(mains) == 1
    conversation = node.conversation(routed[0].session_id)
    user_texts = {m.content for m in conversation.context(100) if m.role == "user"}
    assert user_texts == {f"m{i}" for i in range(16)}, conversation.export_tree("text")
    assert len(bot.seen) == 16


def test_a_retried_platform_message_is_not_appended_twice(make_node: Any) -> None:
    bot = Chatbot()
    node = chat_node(make_node, bot)
    first = node.route(inbound(text="once", message_id="tg-5"))
    again = node.route(inbound(text="once", message_id="tg-5"))
    settle(node)
    assert again.duplicate
    assert again.message_id == first.message_id
    assert len(bot.seen) == 1
    assert len(node.conversation(first.session_id)) == 2  # the message and its answer


def test_concurrent_retries_of_one_platform_message_are_handed_over_once(
    make_node: Any,
) -> None:
    bot = Chatbot()
    node = chat_node(make_node, bot)
    start = threading.Barrier(8)
    routed: list[Any] = []

    def deliver() -> None:
        start.wait(WAIT)
        routed.append(node.route(inbound(text="once", message_id="tg-9")))

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    settle(node)
    assert sorted(r.duplicate for r in routed) == [False] + [True] * 7
    assert len({r.message_id for r in routed}) == 1
    assert len(bot.seen) == 1


def test_a_chat_command_is_answered_and_not_handed_to_the_session(make_node: Any) -> None:
    bot = Chatbot()
    node = chat_node(make_node, bot)
    node.route(inbound(text="first", message_id="p1"))
    settle(node)
    routed = node.route(inbound(text="/fork idea", reply_to="p1", message_id="p2"))
    assert routed.reply is not None
    assert routed.reply.ok
    assert routed.message_id is None
    settle(node)
    assert len(bot.seen) == 1
    listed = node.route(inbound(text="/branches"))
    assert listed.reply is not None
    assert "2. idea (current)" in listed.reply.text
    node.route(inbound(text="on the idea branch"))
    settle(node)
    assert bot.seen[-1][2] == ["first", "on the idea branch"]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b'{"provider":"telegram","chat_type":"dm","chat_id":"1","sender_id":"1"}', "text"),
        (
            b'{"provider":"telegram","chat_type":"dm","chat_id":"1","sender_id":7,"text":"x"}',
            "sender_id",
        ),
        (
            b'{"provider":"telegram","chat_type":"fax","chat_id":"1","sender_id":"1","text":"x"}',
            "chat_type",
        ),
        (
            b'{"provider":"telegram","chat_type":"dm","chat_id":"1","sender_id":"1","text":"x",'
            b'"admin":true}',
            None,
        ),
        ({"provider": "telegram", "chat_type": "dm", "chat_id": "", "sender_id": "1"}, "chat_id"),
        (b"not json", None),
        (b"[" * 100 + b"]" * 100, None),
        (42, "inbound"),
        (
            {
                "provider": "t",
                "chat_type": "dm",
                "chat_id": "1",
                "sender_id": "1",
                "text": "bad \ud800",
            },
            "text",
        ),
        (
            {
                "provider": "t",
                "chat_type": "dm",
                "chat_id": "1",
                "sender_id": "1",
                "text": "x",
                "message_id": "\udfff",
            },
            "message_id",
        ),
    ],
)
def test_bad_inbound_messages_are_refused_naming_the_field_and_counted(
    make_node: Any, payload: Any, field: str | None
) -> None:
    node = chat_node(make_node, Chatbot())
    with pytest.raises(RejectedInputError) as caught:
        node.route(payload)
    if field is not None:
        assert caught.value.field == field
    assert node.stats()["rejected_input"] == 1
    assert node.route(inbound(text="still serving")).error is None


def test_an_oversized_inbound_payload_is_refused_before_decoding(make_node: Any) -> None:
    node = chat_node(make_node, Chatbot())
    fields = {"provider": "t", "chat_type": "dm", "chat_id": "1", "sender_id": "1"}
    huge = json.dumps({**fields, "text": "x" * (5 * MAX_TEXT_CHARS)}).encode()
    with pytest.raises(RejectedInputError, match="over the cap"):
        node.route(huge)


def test_route_needs_the_agent_when_the_node_has_several(make_node: Any) -> None:
    node = make_node(Agent("a", {"s": lambda s: None}), Agent("b", {"s": lambda s: None}))
    with pytest.raises(RejectedInputError) as caught:
        node.route(inbound())
    assert caught.value.field == "agent_id"
    with pytest.raises(RejectedInputError) as caught:
        node.route(inbound(), "c")
    assert caught.value.field == "agent_id"
    assert node.route(inbound(), "b").agent_id == "b"


def test_conversation_of_an_unknown_session_is_refused(make_node: Any) -> None:
    node = chat_node(make_node, Chatbot())
    with pytest.raises(UnknownSessionError):
        node.conversation(uuid.uuid4())


def test_a_workers_context_branch_lives_in_its_memory_only(make_node: Any) -> None:
    outcome: dict[str, str] = {}

    def worker(session: Any) -> str:
        outcome["before"] = repr(session.conversation.context(5))
        session.conversation.append("assistant", "a worker keeps no memory")
        outcome["after"] = repr([m.content for m in session.conversation.context(5)])
        return "done"

    node = make_node(Agent("agent", {"main": lambda s: None, "worker": worker}))
    main = node.main("agent")
    result = main.run(kind="worker", skill="worker", timeout=WAIT)
    assert result is not None
    assert result.ok
    assert outcome == {"before": "[]", "after": "['a worker keeps no memory']"}
    # only its result reached the Main's conversation; its own branch is gone
    conversation = node.conversation(main.session_id)
    assert [m.content for m in conversation.context(5)] == ["[worker worker completed] done"]
    assert [b.name for b in conversation.branches()] == ["main"]


def test_an_async_branch_writes_its_context_branch_with_the_awaitable_twins(
    make_node: Any,
) -> None:
    refused: list[str] = []

    async def branch(session: Any) -> str:
        first = await session.conversation.aappend("user", "question")
        await session.conversation.aappend("assistant", "answer")
        try:
            await session.conversation.afork(first.id, "again")
        except NotAllowedError as exc:  # its context is one linear branch
            refused.append(str(exc))
        await session.conversation.aappend("assistant", "another answer")
        return " | ".join(m.content for m in session.conversation.context(5))

    node = make_node(Agent("agent", {"main": lambda s: None, "branch": branch}))
    result = node.main("agent").run(kind="branch", skill="branch", timeout=WAIT)
    assert result is not None
    assert result.summary == "question | answer | another answer"
    (said,) = refused
    assert str(result.session_id) in said


# -- across a restart --------------------------------------------------------------------


def test_keys_sessions_and_conversations_survive_a_restart(
    tmp_path: Path, clock: VirtualClock
) -> None:
    bot = Chatbot()
    agent = Agent("assistant", {"chat": bot}, dm_scope="per-account-channel-peer")
    with Node([agent], NodeConfig(), clock=clock, store=tmp_path) as node:
        first = node.route(inbound(text="before the restart", message_id="a1"))
        assert node.wait_idle(WAIT)
        node.route(inbound(text="/fork later", reply_to="a1"))
    with Node([agent], NodeConfig(), clock=clock, store=tmp_path) as node:
        again = node.route(inbound(text="after the restart", message_id="a2"))
        assert node.wait_idle(WAIT)
        assert again.session_id == first.session_id
        assert again.key == "telegram:dm:bot7/42"
        assert bot.seen[-1][2] == ["before the restart", "after the restart"]
        conversation = node.conversation(again.session_id)
        assert conversation.current_branch.name == "later"
        transcript = [json.loads(line) for line in conversation.transcript()]
        assert [line["content"] for line in transcript] == [
            "before the restart",
            "echo: before the restart",
            "after the restart",
            "echo: after the restart",
        ]
        assert node.route(inbound(text="dup", message_id="a1")).duplicate
