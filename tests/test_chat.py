"""Chat commands: parsed, answered with structured replies, never an exception."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiontree.actors import VirtualClock
from sessiontree.conversations import Conversation, Conversations, MemoryBackend
from sessiontree.protocol import ChatReply, ErrorCode, Role
from sessiontree.supervision import chat_command


@pytest.fixture
def conv(clock: VirtualClock) -> Conversation:
    conv = Conversations(MemoryBackend(), clock).get(uuid.uuid4())
    conv.append(Role.USER, "Help me fix the auth bug", platform_id="p1")
    conv.append(Role.ASSISTANT, "The issue is in login.ts line 42", platform_id="p2")
    conv.append(Role.USER, "Can we try OAuth instead?", platform_id="p3")
    conv.append(Role.ASSISTANT, "Sure, I'll implement that", platform_id="p4")
    return conv


def run(conv: Conversation, text: str, reply_to: str | None = None) -> ChatReply:
    reply = chat_command(conv, text, reply_to=reply_to)
    assert isinstance(reply, ChatReply)
    return reply


def test_fork_as_a_reply_branches_from_the_replied_message(conv: Conversation) -> None:
    reply = run(conv, "/fork explore-oauth", reply_to="p3")
    assert reply.ok, reply
    assert reply.text.startswith("🌿 New branch created: explore-oauth")
    assert "Can we try OAuth instead?" in reply.text
    assert reply.data["branch"]["name"] == "explore-oauth"
    assert conv.current_branch.name == "explore-oauth"
    assert conv.context(10)[-1].content == "Can we try OAuth instead?"


def test_fork_with_a_bot_suffix_and_no_name_gets_a_numbered_branch(conv: Conversation) -> None:
    reply = run(conv, "/fork@sessiontree_bot", reply_to="p1")
    assert reply.ok
    assert reply.data["branch"]["name"] == "branch-2"


def test_fork_that_is_not_a_reply_says_how_to_fork(conv: Conversation) -> None:
    reply = run(conv, "/fork idea")
    assert not reply.ok
    assert reply.error is not None
    assert "reply to the message" in reply.text
    assert [b.name for b in conv.branches()] == ["main"]


def test_fork_replying_to_a_message_never_stored_is_refused(conv: Conversation) -> None:
    reply = run(conv, "/fork", reply_to="p-unknown")
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code is ErrorCode.UNKNOWN_MESSAGE


def test_branches_lists_every_branch_numbered_with_the_current_marked(
    conv: Conversation,
) -> None:
    run(conv, "/fork explore-oauth", reply_to="p3")
    conv.append(Role.USER, "Try Auth0")
    reply = run(conv, "/branches")
    assert reply.ok
    assert "1. main\n" in reply.text
    assert "2. explore-oauth (current)" in reply.text
    assert 'Last message: "Try Auth0"' in reply.text
    assert [b["number"] for b in reply.data["branches"]] == [1, 2]
    assert [b["current"] for b in reply.data["branches"]] == [False, True]


def test_checkout_switches_branch_by_number_or_name(conv: Conversation) -> None:
    run(conv, "/fork side", reply_to="p1")
    reply = run(conv, "/checkout 1")
    assert reply.ok
    assert reply.text.startswith("🌿 Switched to branch: main")
    assert run(conv, "/checkout side").data["branch"]["name"] == "side"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("/checkout", ErrorCode.REJECTED_INPUT),
        ("/checkout 9", ErrorCode.UNKNOWN_BRANCH),
        ("/merge", ErrorCode.REJECTED_INPUT),
        ("/merge 1", ErrorCode.CURRENT_BRANCH),
        ("/merge 7", ErrorCode.UNKNOWN_BRANCH),
        ("/tree pdf", ErrorCode.REJECTED_INPUT),
        ("/delete-branch", ErrorCode.REJECTED_INPUT),
        ("/delete-branch 1", ErrorCode.CURRENT_BRANCH),
        ("/confirm-delete-branch", ErrorCode.REJECTED_INPUT),
        ("/confirm-delete-branch two", ErrorCode.REJECTED_INPUT),
        ("/branches please", ErrorCode.REJECTED_INPUT),
        ("/frobnicate", ErrorCode.UNKNOWN_COMMAND),
        ("/checkout ²", ErrorCode.UNKNOWN_BRANCH),
        ("/merge " + "9" * 5000, ErrorCode.UNKNOWN_BRANCH),
        ("/confirm-delete-branch ²", ErrorCode.REJECTED_INPUT),
        ("/", ErrorCode.UNKNOWN_COMMAND),
    ],
)
def test_bad_arguments_and_unknown_commands_get_a_helpful_reply(
    conv: Conversation, text: str, code: ErrorCode
) -> None:
    reply = run(conv, text)
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code is code
    assert reply.text.startswith("⚠️")
    if code is ErrorCode.UNKNOWN_COMMAND and text != "/":
        assert "/branches" in reply.text  # lists what there is
    if code is ErrorCode.REJECTED_INPUT:
        assert "usage: /" in reply.text


@pytest.mark.parametrize("fmt", ["json", "html", "text"])
def test_tree_exports_in_each_format(conv: Conversation, fmt: str) -> None:
    reply = run(conv, f"/tree {fmt}")
    assert reply.ok
    assert reply.data["format"] == fmt
    content = reply.data["content"]
    if fmt == "json":
        assert json.loads(content)["root"]["children"][0]["content"] == "Help me fix the auth bug"
    elif fmt == "html":
        assert "<svg" in content
    else:
        assert reply.text == content
        assert "user: Help me fix the auth bug" in content


def test_merge_reports_the_messages_it_copied(conv: Conversation) -> None:
    run(conv, "/fork oauth", reply_to="p3")
    conv.append(Role.USER, "Try OAuth instead")
    conv.append(Role.ASSISTANT, "Test with Auth0")
    run(conv, "/checkout 1")
    reply = run(conv, "/merge 2")
    assert reply.ok
    assert reply.text.startswith("🌿 Merged branch: oauth")
    assert '- "Try OAuth instead" ✓' in reply.text
    assert "Current branch: main (updated)" in reply.text
    assert len(reply.data["message_ids"]) == 2


def test_delete_branch_asks_first_and_deletes_on_confirmation(conv: Conversation) -> None:
    run(conv, "/fork ui-redesign", reply_to="p1")
    for i in range(8):
        conv.append(Role.USER, f"colour {i}")
    run(conv, "/checkout 1")
    ask = run(conv, "/delete-branch 2")
    assert ask.ok
    assert 'delete branch "ui-redesign"?' in ask.text
    assert "This will delete 8 messages" in ask.text
    assert "/confirm-delete-branch 2" in ask.text
    assert len(conv.branches()) == 2
    done = run(conv, "/confirm-delete-branch 2")
    assert done.ok
    assert done.text.startswith('🗑️ Branch "ui-redesign" deleted')
    assert [b.name for b in conv.branches()] == ["main"]
    again = run(conv, "/confirm-delete-branch 2")
    assert not again.ok  # the confirmation is used up


def test_confirming_without_asking_first_is_refused(conv: Conversation) -> None:
    run(conv, "/fork side", reply_to="p1")
    run(conv, "/checkout 1")
    reply = run(conv, "/confirm-delete-branch 2")
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code is ErrorCode.CONFIRMATION_MISMATCH
    assert "/delete-branch 2" in reply.text
    assert len(conv.branches()) == 2


def test_confirming_after_the_branch_changed_is_refused(conv: Conversation) -> None:
    run(conv, "/fork side", reply_to="p1")
    run(conv, "/checkout 1")
    run(conv, "/delete-branch 2")
    run(conv, "/checkout 2")
    conv.append(Role.USER, "new work on side")
    run(conv, "/checkout 1")
    reply = run(conv, "/confirm-delete-branch 2")
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code is ErrorCode.CONFIRMATION_MISMATCH
    assert len(conv.branches()) == 2


def test_help_lists_every_command(conv: Conversation) -> None:
    reply = run(conv, "/help")
    assert reply.ok
    for command in ("/fork", "/branches", "/checkout", "/tree", "/merge", "/delete-branch"):
        assert command in reply.text


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=80).map(lambda t: "/" + t),
        st.sampled_from(
            ["/fork", "/checkout", "/merge", "/tree", "/delete-branch", "/confirm-delete-branch"]
        ).flatmap(lambda c: st.text(max_size=40).map(lambda a: f"{c} {a}")),
        st.text(max_size=40),
    ),
    reply_to=st.one_of(st.none(), st.sampled_from(["p1", "p2", "zz"]), st.text(max_size=300)),
)
def test_no_text_makes_a_command_raise(text: str, reply_to: str | None) -> None:
    conv = Conversations(MemoryBackend(), VirtualClock()).get(uuid.uuid4())
    conv.append(Role.USER, "hello", platform_id="p1")
    conv.append(Role.USER, "again", platform_id="p2")
    reply = chat_command(conv, text, reply_to=reply_to)
    assert isinstance(reply, ChatReply)
    assert reply.ok == (reply.error is None)
    assert reply.text
