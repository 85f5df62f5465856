"""What a conversation needs from outside: where its messages live, and the time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Iterator, Sequence
from typing import Protocol

from sessiontree.protocol import ConversationState, Message

__all__ = ["ConversationBackend", "TimeSource"]


class TimeSource(Protocol):
    """The clock conversations stamp messages and branches with (a node's clock)."""

    def time(self) -> float:
        """Seconds since the epoch."""
        ...


class ConversationBackend(Protocol):
    """Where conversations live. Reads run on the caller's thread; ``commit``
    is durable when it returns and raises ``StoreError`` (nothing written)."""

    def load(self, session_id: uuid.UUID) -> ConversationState | None:
        """The conversation's bookkeeping, or None if it has none yet."""
        ...

    def message(self, session_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        """One message of this conversation, or None."""
        ...

    def walk(
        self, session_id: uuid.UUID, start: uuid.UUID | None, limit: int, branch_id: str | None
    ) -> list[Message]:
        """From ``start`` towards the root through parent ids, newest first, at
        most ``limit`` messages; with ``branch_id``, stop at the first message
        not on that branch."""
        ...

    def messages(self, session_id: uuid.UUID) -> Iterator[Message]:
        """Every message of the conversation, in no particular order."""
        ...

    def by_platform_id(self, session_id: uuid.UUID, platform_id: str) -> uuid.UUID | None:
        """Our message id for a chat platform's message id, or None."""
        ...

    def submit(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> concurrent.futures.Future[None]:
        """Queue a write of ``state`` that puts and deletes messages (and their
        platform ids); the future resolves once it is durable, or fails with
        ``StoreError`` — then nothing of it was written, and every write of this
        conversation queued after it fails too (it was built on this one)."""
        ...

    def submit_awaitable(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> asyncio.Future[None]:
        """``submit`` from a coroutine on a running event loop (queued at once)."""
        ...
