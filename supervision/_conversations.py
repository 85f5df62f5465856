"""Conversations on the node's LMDB store: the ``ConversationBackend`` that
``sessiontree.conversations`` runs on when the node has a store."""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Iterator, Sequence

from sessiontree.protocol import Branch, ConversationState, Message
from sessiontree.store import Store, WriteBatch

__all__ = ["StoreConversations"]


class StoreConversations:
    """Conversation bookkeeping and messages in the store's ``conversations``,
    ``messages`` and ``platform_ids`` databases.

    Reads are short read transactions on the caller's thread. A write is one
    batch on the store's writer (group commit) that lands only if the stored
    bookkeeping is still the one it was built on; so when a write fails
    (``StoreError``, ``StoreFullError``), every write queued after it for the
    same conversation fails too, and no message can hang under one that was
    never written.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        # The bookkeeping bytes each conversation's next write expects (its last
        # queued). Writes of one conversation come in order under its lock, so
        # single dict operations (atomic) are all this needs.
        self._expected: dict[uuid.UUID, bytes | None] = {}
        # The branches each conversation's last queued write left (by number), so
        # a write puts only the branches that changed (new objects): an append
        # writes one branch, whatever their number.
        self._branches: dict[uuid.UUID, dict[int, Branch]] = {}

    def load(self, session_id: uuid.UUID) -> ConversationState | None:
        state, raw = self.store.conversation_read(session_id)
        self._expected[session_id] = raw  # read with the state: what the next write expects
        self._branches[session_id] = {} if state is None else {b.number: b for b in state.branches}
        return state

    def message(self, session_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        return self.store.message(session_id, message_id)

    def walk(
        self, session_id: uuid.UUID, start: uuid.UUID | None, limit: int, branch_id: str | None
    ) -> list[Message]:
        return self.store.walk(session_id, start, limit, branch_id)

    def messages(self, session_id: uuid.UUID) -> Iterator[Message]:
        return self.store.messages(session_id)

    def by_platform_id(self, session_id: uuid.UUID, platform_id: str) -> uuid.UUID | None:
        return self.store.platform_message(session_id, platform_id)

    def submit(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> concurrent.futures.Future[None]:
        return self.store.submit(self._batch(state, put, delete))

    def submit_awaitable(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> asyncio.Future[None]:
        return self.store.submit_awaitable(self._batch(state, put, delete))

    def _batch(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> WriteBatch:
        """One conversation's write (called in its order, under its lock)."""
        sid = state.session_id
        if sid not in self._expected:  # a write before any load: learn what is stored
            self.load(sid)
        batch = self.store.batch().expect("conversations", sid.bytes, self._expected[sid])
        for message in delete:  # first: a message re-put with a new platform id stays
            batch.drop_message(sid, message)
        for message in put:
            batch.message(sid, message)
        before = self._branches[sid]
        after = {branch.number: branch for branch in state.branches}
        for branch in state.branches:
            if before.get(branch.number) is not branch:
                batch.branch(sid, branch)
        for number in before.keys() - after.keys():
            batch.drop_branch(sid, number)
        self._branches[sid] = after
        batch.conversation(state)
        self._expected[sid] = batch.ops[-1][3]  # the bookkeeping's encoded bytes, just added
        return batch
