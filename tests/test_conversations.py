"""Conversation trees: every operation on both backends (memory, a real LMDB store)."""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

from sessiontree.actors import VirtualClock
from sessiontree.conversations import Conversation, Conversations, MemoryBackend
from sessiontree.protocol import (
    MAX_CONTENT_BYTES,
    ConversationError,
    ErrorCode,
    Message,
    RejectedInputError,
    Role,
    StoreError,
)
from sessiontree.store import Store, StoreIO
from sessiontree.supervision import StoreConversations
from tests.conftest import WAIT


@pytest.fixture(params=["memory", "lmdb"])
def conversations(
    request: pytest.FixtureRequest, tmp_path: Path, clock: VirtualClock
) -> Iterator[Conversations]:
    if request.param == "memory":
        yield Conversations(MemoryBackend(), clock)
        return
    with Store(tmp_path / "store", sync=False) as store:
        yield Conversations(StoreConversations(store), clock)


@pytest.fixture
def conv(conversations: Conversations) -> Conversation:
    return conversations.get(uuid.uuid4())


def say(conv: Conversation, *texts: str) -> list[Message]:
    """Append alternating user/assistant messages."""
    roles = (Role.USER, Role.ASSISTANT)
    return [conv.append(roles[i % 2], text) for i, text in enumerate(texts)]


def texts(messages: list[Message]) -> list[str]:
    return [m.content for m in messages]


# -- append and context ------------------------------------------------------------------


def test_append_hangs_each_message_under_the_active_leaf(conv: Conversation) -> None:
    first, second, third = say(conv, "a", "b", "c")
    assert first.parent_id is None
    assert second.parent_id == first.id
    assert third.parent_id == second.id
    assert [m.seq for m in (first, second, third)] == [0, 1, 2]
    assert [m.depth for m in (first, second, third)] == [1, 2, 3]
    assert conv.active_leaf == third.id
    assert len(conv) == 3


def test_context_is_the_active_path_oldest_first_at_most_limit(conv: Conversation) -> None:
    say(conv, *[f"m{i}" for i in range(10)])
    assert texts(conv.context(3)) == ["m7", "m8", "m9"]
    assert texts(conv.context(100)) == [f"m{i}" for i in range(10)]
    assert conv.context(0) == []


def test_an_empty_conversation_has_an_empty_context_and_one_branch(conv: Conversation) -> None:
    assert conv.context(10) == []
    (main,) = conv.branches()
    assert (main.number, main.name, main.current, main.message_count) == (1, "main", True, 0)


def test_context_never_shows_messages_of_other_branches(conv: Conversation) -> None:
    _, b, _ = say(conv, "a", "b", "c on main")
    conv.fork(b.id, "side")
    conv.append(Role.USER, "d on side")
    assert texts(conv.context(10)) == ["a", "b", "d on side"]
    conv.checkout("main")
    assert texts(conv.context(10)) == ["a", "b", "c on main"]


def test_append_keeps_tool_calls_usage_and_the_platform_id(conv: Conversation) -> None:
    message = conv.append(
        "assistant",
        {"text": "calling", "parts": [1, 2]},
        tool_calls=[{"name": "search", "args": {"q": "lmdb"}}],
        usage={"input_tokens": 12, "output_tokens": 3},
        platform_id="tg-77",
    )
    (stored,) = conv.context(1)
    assert stored == message
    assert conv.by_platform_id("tg-77") == message
    assert conv.by_platform_id("tg-78") is None


class Keys:
    """``keys`` for a handle: the ids a cycle's appends take, in order; ``rerun``
    starts the sequence again (as a rerun of the same cycle would), whose
    appends look for what they replace."""

    def __init__(self) -> None:
        self.ids = [uuid.uuid4() for _ in range(8)]
        self.next = 0
        self.again = False

    def __call__(self) -> tuple[uuid.UUID, bool]:
        self.next += 1
        return self.ids[self.next - 1], self.again

    def rerun(self) -> None:
        self.next = 0
        self.again = True


def test_a_keyed_append_written_again_replaces_its_message_where_it_stands(
    conversations: Conversations, clock: VirtualClock
) -> None:
    keys = Keys()
    sid = uuid.uuid4()
    plain = conversations.get(sid)
    first = conversations.get(sid, keys=keys)
    say(plain, "before")
    asked = first.append("user", "question")
    answer = first.append("assistant", "answer one", usage={"output_tokens": 2})
    assert (asked.id, answer.id) == (keys.ids[0], keys.ids[1])
    say(plain, "a child's result lands")  # written by someone else meanwhile
    clock.advance(5.0)

    keys.rerun()  # the cycle runs again: the same keys, in the same order
    again = conversations.get(sid, keys=keys)
    asked_again = again.append("user", "question")
    replaced = again.append("assistant", "answer two", platform_id="tg-9")
    assert asked_again.id == asked.id
    assert (replaced.id, replaced.parent_id, replaced.seq) == (answer.id, asked.id, answer.seq)
    assert replaced.content == "answer two"
    assert replaced.usage is None  # what the rerun wrote, all of it
    assert replaced.timestamp == answer.timestamp + 5.0
    assert texts(plain.context(10)) == [
        "before",
        "question",
        "answer two",
        "a child's result lands",
    ]
    assert len(plain) == 4
    assert plain.by_platform_id("tg-9") == replaced
    exported = [json.loads(line)["content"] for line in plain.transcript()]
    assert exported.count("question") == 1
    assert "answer one" not in exported

    extra = again.append("assistant", "a third, only in the rerun")
    assert extra.id == keys.ids[2]
    assert plain.context(1) == [extra]


def test_a_keyed_append_awaited_replaces_as_the_blocking_one_does(
    conversations: Conversations,
) -> None:
    keys = Keys()
    conv = conversations.get(uuid.uuid4(), keys=keys)

    async def run() -> list[Message]:
        first = await conv.aappend("assistant", "one", platform_id="a")
        keys.rerun()
        second = await conv.aappend("assistant", "two", platform_id="b")
        return [first, second]

    first, second = asyncio.run(run())
    assert first.id == second.id
    assert texts(conv.context(10)) == ["two"]
    assert conv.by_platform_id("b") == second
    assert conv.by_platform_id("a") is None  # the replaced message's old id is gone


def test_concurrent_appends_to_one_conversation_form_one_chain(conv: Conversation) -> None:
    def append_many(worker: int) -> None:
        for i in range(25):
            conv.append(Role.USER, f"{worker}-{i}")

    threads = [threading.Thread(target=append_many, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    path = conv.context(1000)
    assert len(path) == len(conv) == 200
    assert [m.seq for m in path] == list(range(200))
    assert all(m.parent_id == prev.id for prev, m in itertools.pairwise(path))


# -- fork, branches, checkout ------------------------------------------------------------


def test_fork_starts_a_named_current_branch_under_the_message(
    conv: Conversation, clock: VirtualClock
) -> None:
    _, b, c = say(conv, "help me fix the auth bug", "checking", "line 42")
    clock.advance(120.0)
    branch = conv.fork(b.id, "explore-oauth")
    assert (branch.number, branch.name, branch.current) == (2, "explore-oauth", True)
    assert branch.base_id == b.id
    assert branch.leaf_id == b.id  # no message of its own yet: its tip is the fork point
    d = conv.append(Role.USER, "try OAuth")
    assert d.parent_id == b.id
    assert d.branch_id == branch.id
    listed = {x.number: x for x in conv.branches()}
    assert listed[1].current is False
    assert listed[2].current is True
    assert listed[1].last_message == c
    assert listed[2].last_message == d
    assert (listed[1].message_count, listed[1].own_messages) == (3, 3)
    assert (listed[2].message_count, listed[2].own_messages) == (3, 1)
    assert listed[1].age_s == 120.0  # main last changed before the clock moved
    assert listed[2].age_s == 0.0


def test_fork_without_a_name_gets_a_numbered_one(conv: Conversation) -> None:
    (a,) = say(conv, "a")
    assert conv.fork(a.id).name == "branch-2"
    assert conv.fork(a.id).name == "branch-3"


def test_fork_from_a_message_that_does_not_exist_is_a_clear_error(conv: Conversation) -> None:
    say(conv, "a")
    missing = uuid.uuid4()
    with pytest.raises(ConversationError) as caught:
        conv.fork(missing, "x")
    assert caught.value.code is ErrorCode.UNKNOWN_MESSAGE
    assert caught.value.field == "from_message_id"
    assert str(missing) in str(caught.value)
    assert str(conv.session_id) in str(caught.value)
    assert [b.name for b in conv.branches()] == ["main"]  # nothing changed


def test_fork_from_a_message_of_another_session_is_refused(
    conversations: Conversations,
) -> None:
    mine, theirs = conversations.get(uuid.uuid4()), conversations.get(uuid.uuid4())
    (foreign,) = say(theirs, "not yours")
    with pytest.raises(ConversationError) as caught:
        mine.fork(foreign.id)
    assert caught.value.code is ErrorCode.UNKNOWN_MESSAGE
    with pytest.raises(ConversationError):
        mine.checkout(foreign.id)


def test_branch_names_are_unique_per_conversation(conversations: Conversations) -> None:
    conv = conversations.get(uuid.uuid4())
    (a,) = say(conv, "a")
    conv.fork(a.id, "idea")
    with pytest.raises(ConversationError) as caught:
        conv.fork(a.id, "idea")
    assert caught.value.code is ErrorCode.BRANCH_EXISTS
    assert caught.value.field == "name"
    other = conversations.get(uuid.uuid4())
    (b,) = say(other, "b")
    assert other.fork(b.id, "idea").name == "idea"  # another session: its own namespace


@pytest.mark.parametrize(
    "name",
    ["", "   ", "x" * 65, "tab\there", "42", str(uuid.uuid4()), "branch_1234abcd", 7, None],
)
def test_a_bad_branch_name_is_refused_naming_the_field(conv: Conversation, name: Any) -> None:
    (a,) = say(conv, "a")
    if name is None:  # None means "pick one": not bad
        assert conv.fork(a.id, name).name == "branch-2"
        return
    with pytest.raises(RejectedInputError) as caught:
        conv.fork(a.id, name)
    assert caught.value.field == "name"


def test_checkout_by_number_name_or_branch_tip(conv: Conversation) -> None:
    a, b = say(conv, "a", "b")
    side = conv.fork(a.id, "side")
    c = conv.append(Role.USER, "c")
    assert conv.checkout(1).name == "main"
    assert conv.active_leaf == b.id
    assert conv.checkout("side").number == side.number
    assert conv.active_leaf == c.id
    assert conv.checkout("1").name == "main"
    assert conv.checkout(c.id).name == "side"  # the tip of a branch: that branch
    assert conv.checkout(str(b.id)).name == "main"


def test_checkout_of_a_message_inside_a_branch_forks_there(conv: Conversation) -> None:
    a, _, _ = say(conv, "a", "b", "c")
    branch = conv.checkout(a.id)
    assert branch.name == "branch-2"
    assert branch.current
    d = conv.append(Role.USER, "d")
    assert d.parent_id == a.id
    assert texts(conv.context(10)) == ["a", "d"]
    assert texts(conv.checkout("main") and conv.context(10)) == ["a", "b", "c"]


@pytest.mark.parametrize("target", [99, "nope", "99"])
def test_checkout_of_an_unknown_branch_names_the_branches_there_are(
    conv: Conversation, target: Any
) -> None:
    say(conv, "a")
    with pytest.raises(ConversationError) as caught:
        conv.checkout(target)
    assert caught.value.code is ErrorCode.UNKNOWN_BRANCH
    assert caught.value.field == "target"
    assert "1 main" in str(caught.value)


@pytest.mark.parametrize("target", [True, 1.5, None, ["main"]])
def test_checkout_with_a_reference_of_the_wrong_type_is_refused(
    conv: Conversation, target: Any
) -> None:
    with pytest.raises(RejectedInputError) as caught:
        conv.checkout(target)
    assert caught.value.field == "target"


# -- merge -------------------------------------------------------------------------------


def test_merge_appends_the_branch_s_own_messages_and_keeps_both(conv: Conversation) -> None:
    a, b = say(conv, "fix the bug", "checking")
    conv.fork(a.id, "oauth")
    o1, o2 = say(conv, "try OAuth", "use Auth0")
    conv.checkout("main")
    merged = conv.merge("oauth")
    assert (merged.source_name, merged.into_name) == ("oauth", "main")
    assert texts(merged.messages) == ["try OAuth", "use Auth0"]
    assert [m.merged_from for m in merged.messages] == [o1.id, o2.id]
    assert merged.messages[0].parent_id == b.id
    assert texts(conv.context(10)) == ["fix the bug", "checking", "try OAuth", "use Auth0"]
    conv.checkout("oauth")  # the source branch is untouched
    assert texts(conv.context(10)) == ["fix the bug", "try OAuth", "use Auth0"]
    assert len(conv) == 6


def test_merging_the_current_branch_into_itself_is_refused(conv: Conversation) -> None:
    say(conv, "a")
    with pytest.raises(ConversationError) as caught:
        conv.merge(1)
    assert caught.value.code is ErrorCode.CURRENT_BRANCH
    assert caught.value.field == "source"


def test_merging_a_branch_with_no_messages_of_its_own_appends_nothing(
    conv: Conversation,
) -> None:
    (a,) = say(conv, "a")
    conv.fork(a.id, "empty")
    conv.checkout("main")
    assert conv.merge("empty").messages == []
    assert len(conv) == 1


# -- delete ------------------------------------------------------------------------------


def test_deleting_a_branch_takes_two_steps(conv: Conversation) -> None:
    (a,) = say(conv, "a")
    conv.fork(a.id, "doomed")
    say(conv, "x1", "x2", "x3", "x4")
    conv.checkout("main")
    plan = conv.delete_branch("doomed")
    assert (plan.number, plan.name, plan.count, plan.kept) == (2, "doomed", 4, 0)
    assert plan.preview == ["x1", "x2", "x3"]
    assert len(conv) == 5  # the plan deletes nothing
    done = conv.confirm_delete(plan.token)
    assert done == plan
    assert [b.name for b in conv.branches()] == ["main"]
    assert len(conv) == 1
    assert "x1" not in conv.export_tree("text")


def test_the_current_branch_cannot_be_deleted(conv: Conversation) -> None:
    say(conv, "a")
    with pytest.raises(ConversationError) as caught:
        conv.delete_branch("main")
    assert caught.value.code is ErrorCode.CURRENT_BRANCH


def test_delete_keeps_the_messages_another_branch_grows_from(conv: Conversation) -> None:
    (a,) = say(conv, "a")
    conv.fork(a.id, "x")
    _, x2, _ = say(conv, "x1", "x2", "x3")
    conv.fork(x2.id, "y")  # y grows from x2: x1 and x2 must stay
    conv.append(Role.USER, "y1")
    plan = conv.delete_branch("x")
    assert (plan.count, plan.kept, plan.preview) == (1, 2, ["x3"])
    conv.confirm_delete(plan.token)
    assert texts(conv.context(10)) == ["a", "x1", "x2", "y1"]
    assert [b.name for b in conv.branches()] == ["main", "y"]


def test_messages_kept_for_a_branch_go_with_the_last_branch_that_grew_from_them(
    conv: Conversation,
) -> None:
    """Deleting x keeps x1 (y grows from it); deleting y then takes x1 too, so a
    later delete of what x1 hung under leaves nothing hanging under a message
    that is gone (a case the conversation property found)."""
    a, b, _ = say(conv, "a", "b", "c")
    conv.fork(b.id, "x")
    (x1,) = say(conv, "x1")
    conv.fork(x1.id, "y")
    conv.append(Role.USER, "y1")
    conv.checkout("main")
    conv.confirm_delete(conv.delete_branch("x").token)
    plan = conv.delete_branch("y")
    assert (plan.count, plan.kept) == (2, 0)  # y1, and x1 that only y needed
    conv.confirm_delete(plan.token)
    conv.fork(a.id, "z")
    conv.confirm_delete(conv.delete_branch("main").token)
    assert len(conv) == 1
    assert texts(conv.context(10)) == ["a"]


def test_a_confirmation_for_a_branch_that_changed_since_is_refused(conv: Conversation) -> None:
    (a,) = say(conv, "a")
    conv.fork(a.id, "x")
    conv.append(Role.USER, "x1")
    conv.checkout("main")
    plan = conv.delete_branch("x")
    conv.checkout("x")
    conv.append(Role.USER, "x2 arrived after the plan")
    conv.checkout("main")
    with pytest.raises(ConversationError) as caught:
        conv.confirm_delete(plan.token)
    assert caught.value.code is ErrorCode.CONFIRMATION_MISMATCH
    assert len(conv) == 3


def test_a_confirmation_naming_another_branch_is_refused(conv: Conversation) -> None:
    (a,) = say(conv, "a")
    conv.fork(a.id, "x")
    conv.fork(a.id, "y")
    conv.checkout("main")
    plan = conv.delete_branch("x")
    with pytest.raises(ConversationError) as caught:
        conv.confirm_delete(plan.token, "y")
    assert (caught.value.code, caught.value.field) == (ErrorCode.CONFIRMATION_MISMATCH, "token")
    assert conv.confirm_delete(plan.token, "x").name == "x"
    assert [b.name for b in conv.branches()] == ["main", "y"]


@pytest.mark.parametrize("token", ["", "nonsense", "2-XYZ", 5, None])
def test_a_malformed_confirmation_token_is_refused(conv: Conversation, token: Any) -> None:
    with pytest.raises(RejectedInputError) as caught:
        conv.confirm_delete(token)
    assert caught.value.field == "token"


# -- exports -----------------------------------------------------------------------------


def test_the_json_export_is_nested_and_uses_the_specification_s_keys(conv: Conversation) -> None:
    a, _ = say(conv, "a", "b")
    conv.fork(a.id, "side")
    c = conv.append(Role.USER, "c")
    tree = json.loads(conv.export_tree("json"))
    assert tree["activeLeafId"] == str(c.id)
    assert tree["currentBranchId"] == c.branch_id
    (root,) = tree["root"]["children"]
    assert set(root) >= {"id", "parentId", "role", "content", "timestamp", "branchId", "children"}
    assert root["parentId"] is None
    assert root["timestamp"].endswith("Z")
    assert [child["content"] for child in root["children"]] == ["b", "c"]
    assert root["children"][1]["parentId"] == str(a.id)
    assert [br["name"] for br in tree["branches"]] == ["main", "side"]
    assert tree == conv.tree()


def test_the_text_export_draws_forks_and_marks_the_active_leaf(conv: Conversation) -> None:
    a, _ = say(conv, "root message", "on main")
    conv.fork(a.id, "side")
    conv.append(Role.USER, "on side")
    text = conv.export_tree("text")
    assert "├─ assistant: on main" in text
    assert "└─ user: on side  [2 side]  <- active" in text


def test_the_html_export_is_one_self_contained_page(conv: Conversation) -> None:
    say(conv, "a", "</script><script>alert(1)</script>")
    page = conv.export_tree("html")
    assert page.lstrip().lower().startswith("<!doctype html>")
    assert "<script src" not in page.lower()
    # nothing is fetched (an xmlns namespace URI is a name, not a request)
    assert not re.search(r"""(src|href|action)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert not re.search(r"url\(\s*[\"']?(https?:)?//|@import", page, re.I)
    assert "</script><script>alert(1)" not in page  # content cannot close the script


def test_an_unknown_export_format_is_refused(conv: Conversation) -> None:
    with pytest.raises(RejectedInputError) as caught:
        conv.export_tree("pdf")
    assert caught.value.field == "format"


def test_a_very_deep_conversation_exports_without_recursion(conv: Conversation) -> None:
    for i in range(3000):
        conv.append(Role.USER, f"m{i}")
    text = conv.export_tree("text")
    assert text.count("user: m") == 3000
    nested = conv.export_tree("json")
    assert nested.count('"children":[') == 3001  # the root and every message
    assert nested.count("[") == nested.count("]")
    assert len(conv.context(5000)) == 3000


def test_the_transcript_is_jsonl_in_the_order_written(conv: Conversation) -> None:
    (a,) = say(conv, "a")
    conv.fork(a.id, "x")
    conv.append(Role.USER, "b")
    lines = [json.loads(line) for line in conv.transcript()]
    assert [line["content"] for line in lines] == ["a", "b"]
    assert lines[1]["parentId"] == lines[0]["id"]
    assert set(lines[0]) == {"id", "parentId", "role", "content", "timestamp", "branchId"}


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "content", "fields", "field"),
    [
        ("robot", "hi", {}, "role"),
        (3, "hi", {}, "role"),
        ("user", object(), {}, "content"),
        ("user", {"when": threading.Event()}, {}, "content"),
        ("user", "x" * (MAX_CONTENT_BYTES + 1), {}, "content"),
        ("user", "hi", {"tool_calls": {"not": "a list"}}, "tool_calls"),
        ("user", "hi", {"usage": [1]}, "usage"),
        ("user", "hi", {"platform_id": ""}, "platform_id"),
        ("user", "hi", {"platform_id": 12}, "platform_id"),
        ("user", "lone \ud800 surrogate", {}, "content"),
        ("user", {"text": "\udfff"}, {}, "content"),
        ("user", "hi", {"platform_id": "p\ud800"}, "platform_id"),
    ],
)
def test_bad_appends_are_refused_naming_the_field_and_change_nothing(
    conv: Conversation, role: Any, content: Any, fields: dict[str, Any], field: str
) -> None:
    say(conv, "kept")
    with pytest.raises(RejectedInputError) as caught:
        conv.append(role, content, **fields)
    assert caught.value.field == field
    assert texts(conv.context(10)) == ["kept"]


@pytest.mark.parametrize("limit", [-1, 10_001, 1.5, "10", True])
def test_a_bad_context_limit_is_refused(conv: Conversation, limit: Any) -> None:
    with pytest.raises(RejectedInputError) as caught:
        conv.context(limit)
    assert caught.value.field == "limit"


def test_content_is_kept_as_its_json_form_on_every_backend(conv: Conversation) -> None:
    message = conv.append(Role.TOOL, {"rows": (1, 2), "tags": ["a"]})
    assert message.content == {"rows": [1, 2], "tags": ["a"]}
    assert conv.context(1)[0].content == {"rows": [1, 2], "tags": ["a"]}


def test_a_message_id_that_is_not_a_uuid_is_refused(conv: Conversation) -> None:
    with pytest.raises(RejectedInputError) as caught:
        conv.fork("msg_123")
    assert caught.value.field == "from_message_id"


# -- durability --------------------------------------------------------------------------


def test_a_conversation_survives_reopening_the_store(tmp_path: Path, clock: VirtualClock) -> None:
    sid = uuid.uuid4()
    with Store(tmp_path) as store:
        conv = Conversations(StoreConversations(store), clock).get(sid)
        a, _ = say(conv, "a", "b")
        conv.fork(a.id, "side")
        conv.append(Role.USER, "c", platform_id="tg-9")
        before = (conv.context(10), conv.branches(), conv.export_tree("json"))
    with Store(tmp_path) as store:
        conv = Conversations(StoreConversations(store), clock).get(sid)
        assert (conv.context(10), conv.branches(), conv.export_tree("json")) == before
        assert conv.by_platform_id("tg-9") is not None
        assert conv.current_branch.name == "side"
        assert conv.append(Role.ASSISTANT, "d").parent_id == before[0][-1].id


class FailingCommits(StoreIO):
    """Fails every commit while ``failing`` is set, like a full disk."""

    def __init__(self) -> None:
        self.failing = False

    def commit(self, txn: lmdb.Transaction) -> None:
        if self.failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().commit(txn)


def test_a_failed_write_changes_nothing_in_the_store_or_in_memory(
    tmp_path: Path, clock: VirtualClock
) -> None:
    io = FailingCommits()
    with Store(tmp_path, io=io) as store:
        conv = Conversations(StoreConversations(store), clock).get(uuid.uuid4())
        (a,) = say(conv, "a")
        io.failing = True
        with pytest.raises(StoreError):
            conv.append(Role.USER, "lost")
        with pytest.raises(StoreError):
            conv.fork(a.id, "lost")
        io.failing = False
        assert texts(conv.context(10)) == ["a"]
        assert [b.name for b in conv.branches()] == ["main"]
        assert len(conv) == 1
        assert conv.append(Role.USER, "b").parent_id == a.id


class GatedCommits(StoreIO):
    """Holds each commit until ``gate`` opens; fails the first one when ``fail_first``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.fail_first = False
        self.waiting = threading.Event()

    def commit(self, txn: lmdb.Transaction) -> None:
        self.waiting.set()
        assert self.gate.wait(30)
        if self.fail_first:
            self.fail_first = False
            raise OSError(errno.EIO, "Input/output error")
        super().commit(txn)


def wait_until(predicate: Any) -> None:
    """Bounded wait for a condition another thread makes true."""
    tick = threading.Event()
    for _ in range(2000):
        if predicate():
            return
        tick.wait(0.005)
    raise AssertionError("condition never held")


def test_appends_queued_on_a_failed_one_fail_too_and_nothing_dangles(
    tmp_path: Path, clock: VirtualClock
) -> None:
    io = GatedCommits()
    with Store(tmp_path, io=io) as store:
        conv = Conversations(StoreConversations(store), clock).get(uuid.uuid4())
        (kept,) = say(conv, "kept")
        io.gate.clear()
        io.waiting.clear()
        io.fail_first = True
        errors: list[BaseException] = []

        def append(text: str) -> None:
            try:
                conv.append(Role.USER, text)
            except StoreError as exc:
                errors.append(exc)

        first = threading.Thread(target=append, args=("fails",))
        first.start()
        assert io.waiting.wait(WAIT)  # the writer holds the first append's commit
        later = [threading.Thread(target=append, args=(f"on top {i}",)) for i in range(3)]
        for thread in later:
            thread.start()
        wait_until(lambda: conv._shared.inflight == 4)  # all four queued, in order
        io.gate.set()
        for thread in (first, *later):
            thread.join(WAIT)
        assert len(errors) == 4  # each was built on the one that failed
        assert texts(conv.context(10)) == ["kept"]
        assert len(conv) == 1
        assert [m.content for m in store.messages(conv.session_id)] == ["kept"]
        after = conv.append(Role.USER, "after")
        assert after.parent_id == kept.id


def test_a_refused_expectation_fails_only_its_own_batch_in_a_shared_commit(
    tmp_path: Path,
) -> None:
    io = GatedCommits()
    with Store(tmp_path, io=io) as store:
        io.gate.clear()
        blocker = store.submit(store.batch().raw("memory", b"first", b"1"))
        assert io.waiting.wait(WAIT)
        good = store.submit(store.batch().raw("memory", b"good", b"2"))
        bad = store.submit(
            store.batch().expect("memory", b"absent-key", b"x").raw("memory", b"bad", b"3")
        )
        also = store.submit(
            store.batch().expect("memory", b"nothing", None).raw("memory", b"ok", b"4")
        )
        io.gate.set()
        blocker.result(WAIT)
        good.result(WAIT)
        also.result(WAIT)
        with pytest.raises(StoreError, match="changed since"):
            bad.result(WAIT)
        assert dict(store.scan("memory")) == {b"first": b"1", b"good": b"2", b"ok": b"4"}


def test_concurrent_awaited_appends_form_one_chain(tmp_path: Path, clock: VirtualClock) -> None:
    with Store(tmp_path) as store:
        conv = Conversations(StoreConversations(store), clock).get(uuid.uuid4())

        async def main() -> None:
            async def producer(n: int) -> None:
                for i in range(10):
                    await conv.aappend(Role.USER, f"{n}-{i}")

            await asyncio.gather(*(producer(n) for n in range(16)))

        asyncio.run(main())
        path = conv.context(1000)
        assert len(path) == len(conv) == 160
        assert all(m.parent_id == prev.id for prev, m in itertools.pairwise(path))
        assert store.stats()["commits"] < 160  # awaited appends shared commits


def test_concurrent_first_use_of_a_conversation_makes_one_main_branch(
    conversations: Conversations,
) -> None:
    conv = conversations.get(uuid.uuid4())
    start = threading.Barrier(12)

    def first_use(i: int) -> None:
        start.wait(WAIT)
        if i % 3 == 0:
            conv.by_platform_id("p3")
        elif i % 3 == 1:
            list(conv.transcript())
        else:
            conv.context(3)
        conv.append(Role.USER, f"m{i}")

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert [b.name for b in conv.branches()] == ["main"]
    path = conv.context(100)
    assert len(path) == 12
    assert [m.depth for m in path] == list(range(1, 13))


class CountingPuts(StoreIO):
    """Counts the puts of every write transaction, by database."""

    def __init__(self) -> None:
        self.puts: list[str] = []

    def put(self, txn: lmdb.Transaction, db: Any, key: bytes, value: bytes) -> None:
        self.puts.append(key.hex())
        super().put(txn, db, key, value)


def test_an_append_writes_one_branch_however_many_there_are(
    tmp_path: Path, clock: VirtualClock
) -> None:
    io = CountingPuts()
    with Store(tmp_path, io=io, sync=False) as store:
        conv = Conversations(StoreConversations(store), clock).get(uuid.uuid4())
        (root,) = say(conv, "root")
        for i in range(60):
            conv.fork(root.id, f"idea {i}")
            conv.append(Role.USER, f"on idea {i}")
        io.puts.clear()
        conv.append(Role.USER, "one more")
        assert len(io.puts) == 3  # the message, its branch, the conversation's counters
        stored = store.conversation(conv.session_id)
        assert stored is not None
        assert len(stored.branches) == 61
        assert [b.number for b in stored.branches] == list(range(1, 62))
        assert stored.branches[-1].leaf_id == conv.active_leaf


def test_a_cancelled_awaited_append_still_lands_once_and_later_ones_chain_on_it(
    tmp_path: Path, clock: VirtualClock
) -> None:
    with Store(tmp_path) as store:
        conv = Conversations(StoreConversations(store), clock).get(uuid.uuid4())

        async def main() -> list[str]:
            await conv.aappend(Role.USER, "first")
            cancelled = asyncio.create_task(conv.aappend(Role.USER, "A"))
            await asyncio.sleep(0)  # queued on the writer, waiting
            cancelled.cancel()
            await asyncio.sleep(0)
            started = time.monotonic()
            seen = [m.content for m in conv.context(10)]  # a read never waits on the loop
            assert time.monotonic() - started < 1.0
            await conv.aappend(Role.USER, "C")
            return seen

        seen = asyncio.run(main())
        assert seen[0] == "first"
        stored = sorted(store.messages(conv.session_id), key=lambda m: m.seq)
        assert [(m.content, m.seq) for m in stored] == [("first", 0), ("A", 1), ("C", 2)]
        assert texts(conv.context(10)) == ["first", "A", "C"]
        state = store.conversation(conv.session_id)
        assert state is not None
        assert (state.messages, state.next_seq, state.branches[0].count) == (3, 3, 3)


def test_append_once_stores_a_platform_message_once_under_concurrency(
    conversations: Conversations,
) -> None:
    conv = conversations.get(uuid.uuid4())
    start = threading.Barrier(8)
    outcomes: list[tuple[uuid.UUID, bool]] = []

    def deliver() -> None:
        start.wait(WAIT)
        message, fresh = conv.append_once(Role.USER, "hi", platform_id="tg-1")
        outcomes.append((message.id, fresh))

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert sorted(fresh for _, fresh in outcomes) == [False] * 7 + [True]
    assert len({message_id for message_id, _ in outcomes}) == 1
    assert len(conv) == 1
