"""Conversations on the node's LMDB store: the ``ConversationBackend`` the
actors' ``Conversation`` runs on when the node has a store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

from sessiontree.protocol import ConversationState, Message
from sessiontree.store import Store

__all__ = ["StoreConversations"]


class StoreConversations:
    """Conversation bookkeeping and messages in the store's ``conversations``,
    ``messages`` and ``platform_ids`` databases. Reads are short read
    transactions on the caller's thread; ``commit`` is one durable write
    through the store's writer (group commit), ``StoreError``/``StoreFullError``
    when nothing of it was written."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def load(self, session_id: uuid.UUID) -> ConversationState | None:
        return self.store.conversation(session_id)

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

    def commit(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> None:
        batch = self.store.batch()
        for message in delete:  # first: a message re-put with a new platform id stays
            batch.drop_message(state.session_id, message)
        for message in put:
            batch.message(state.session_id, message)
        batch.conversation(state)
        self.store.write(batch)
