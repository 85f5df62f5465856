"""Conversations under random operations and injected commit failures (hypothesis).

After every step, what a fresh reader loads from the LMDB store equals what
the live conversation believes, and every stored chain is whole: each
message's parent is stored, depths count up from the root, seqs are unique,
each branch's tip and count are right, platform ids name stored messages.
"""

from __future__ import annotations

import errno
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import lmdb
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sessiontree.actors import VirtualClock
from sessiontree.conversations import Conversation, Conversations
from sessiontree.protocol import ConversationError, Role, StoreError
from sessiontree.store import Store, StoreIO
from sessiontree.supervision import StoreConversations


class Flaky(StoreIO):
    """Fails the next ``fail`` commits (as a full or broken disk would)."""

    def __init__(self) -> None:
        self.fail = 0
        self.lock = threading.Lock()

    def commit(self, txn: lmdb.Transaction) -> None:
        with self.lock:
            failing = self.fail > 0
            if failing:
                self.fail -= 1
        if failing:
            raise OSError(errno.EIO, "Input/output error")
        super().commit(txn)


def check_whole(store: Store, conv: Conversation) -> None:
    """The stored conversation is consistent, and it is what ``conv`` believes."""
    sid = conv.session_id
    fresh = Conversations(StoreConversations(store), VirtualClock()).get(sid)
    stored = {m.id: m for m in store.messages(sid)}
    assert len({m.seq for m in stored.values()}) == len(stored)
    for message in stored.values():
        if message.parent_id is None:
            assert message.depth == 1
        else:
            parent = stored.get(message.parent_id)
            assert parent is not None, f"message {message.id} hangs under a missing parent"
            assert message.depth == parent.depth + 1
        if message.platform_id is not None:
            assert store.platform_message(sid, message.platform_id) == message.id
    state = store.conversation(sid)
    if state is None:
        assert not stored
        return
    assert state.messages == len(stored)
    assert all(m.seq < state.next_seq for m in stored.values())
    for branch in state.branches:
        own = [m for m in stored.values() if m.branch_id == branch.id]
        if branch.leaf_id is not None:
            assert branch.leaf_id in stored
            assert stored[branch.leaf_id].depth == branch.depth
        tip = branch.tip
        assert tip is None or tip in stored
        walked = store.walk(sid, branch.leaf_id, 10_000, branch.id)
        assert len(walked) == branch.count <= len(own)
    assert [b.number for b in fresh.branches()] == [b.number for b in conv.branches()]
    assert [m.id for m in fresh.context(10_000)] == [m.id for m in conv.context(10_000)]
    assert len(fresh) == len(conv)


class ConversationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.io = Flaky()
        self.store = Store(Path(self.dir.name), io=self.io, sync=False)
        self.conv = Conversations(StoreConversations(self.store), VirtualClock()).get(uuid.uuid4())
        self.seen: list[uuid.UUID] = []
        self.platform = 0

    def teardown(self) -> None:
        self.store.close()
        self.dir.cleanup()

    def attempt(self, action: Any) -> Any:
        """Run ``action``; a failed commit or a refused conversation step is fine."""
        try:
            return action()
        except (StoreError, ConversationError):
            return None

    @rule(text=st.text(max_size=20), with_platform_id=st.booleans())
    def append(self, text: str, with_platform_id: bool) -> None:
        platform_id = None
        if with_platform_id:
            self.platform += 1
            platform_id = f"p{self.platform}"
        message = self.attempt(lambda: self.conv.append(Role.USER, text, platform_id=platform_id))
        if message is not None:
            self.seen.append(message.id)

    @rule(data=st.data())
    def append_once_again(self, data: st.DataObject) -> None:
        if self.platform:
            number = data.draw(st.integers(1, self.platform))
            self.attempt(
                lambda: self.conv.append_once(Role.USER, "again", platform_id=f"p{number}")
            )

    @precondition(lambda self: self.seen)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        base = data.draw(st.sampled_from(self.seen))
        self.attempt(lambda: self.conv.fork(base))

    @rule(data=st.data())
    def checkout(self, data: st.DataObject) -> None:
        numbers = [b.number for b in self.conv.branches()]
        self.attempt(lambda: self.conv.checkout(data.draw(st.sampled_from(numbers))))

    @rule(data=st.data())
    def merge(self, data: st.DataObject) -> None:
        numbers = [b.number for b in self.conv.branches()]
        self.attempt(lambda: self.conv.merge(data.draw(st.sampled_from(numbers))))

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        numbers = [b.number for b in self.conv.branches() if not b.current]
        if numbers:
            plan = self.attempt(
                lambda: self.conv.delete_branch(data.draw(st.sampled_from(numbers)))
            )
            if plan is not None:
                self.attempt(lambda: self.conv.confirm_delete(plan.token))
        self.seen = [m for m in self.seen if self.store.message(self.conv.session_id, m)]

    @rule(failures=st.integers(1, 3))
    def disk_fails(self, failures: int) -> None:
        self.io.fail = failures

    @invariant()
    def whole(self) -> None:
        check_whole(self.store, self.conv)  # every write of a step was waited on


ConversationMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
test_conversations_stay_whole_under_failures = ConversationMachine.TestCase


def test_concurrent_appends_with_failing_commits_leave_the_conversation_whole(
    tmp_path: Path,
) -> None:
    io = Flaky()
    with Store(tmp_path, io=io, sync=False) as store:
        conv = Conversations(StoreConversations(store), VirtualClock()).get(uuid.uuid4())
        failures: list[str] = []

        def append_many(worker: int) -> None:
            for i in range(30):
                try:
                    conv.append(Role.USER, f"{worker}-{i}")
                except StoreError:
                    failures.append(f"{worker}-{i}")

        for round_number in range(6):
            io.fail = round_number % 3  # some rounds lose a commit or two mid-flight
            threads = [threading.Thread(target=append_many, args=(w,)) for w in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            check_whole(store, conv)
        assert failures  # the failing rounds did fail some appends
        assert len(conv) == 6 * 4 * 30 - len(failures)
