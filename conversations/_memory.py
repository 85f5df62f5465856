"""``MemoryBackend``: conversations in dicts, for a node without a store."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Iterator, Sequence

import msgspec

from sessiontree.protocol import ConversationState, Message

__all__ = ["MemoryBackend"]


class MemoryBackend:
    """Conversations in dicts (a node without a store); lost with the process."""

    def __init__(self) -> None:
        self._states: dict[uuid.UUID, ConversationState] = {}
        self._messages: dict[uuid.UUID, dict[uuid.UUID, Message]] = {}
        self._platform: dict[uuid.UUID, dict[str, uuid.UUID]] = {}
        self._lock = threading.Lock()

    def load(self, session_id: uuid.UUID) -> ConversationState | None:
        with self._lock:
            state = self._states.get(session_id)
            return None if state is None else msgspec.structs.replace(state)

    def message(self, session_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        with self._lock:
            return self._messages.get(session_id, {}).get(message_id)

    def walk(
        self, session_id: uuid.UUID, start: uuid.UUID | None, limit: int, branch_id: str | None
    ) -> list[Message]:
        out: list[Message] = []
        with self._lock:
            messages = self._messages.get(session_id, {})
            current = start
            while current is not None and len(out) < limit:
                found = messages.get(current)
                if found is None or (branch_id is not None and found.branch_id != branch_id):
                    break
                out.append(found)
                current = found.parent_id
        return out

    def messages(self, session_id: uuid.UUID) -> Iterator[Message]:
        with self._lock:
            snapshot = list(self._messages.get(session_id, {}).values())
        return iter(snapshot)

    def by_platform_id(self, session_id: uuid.UUID, platform_id: str) -> uuid.UUID | None:
        with self._lock:
            return self._platform.get(session_id, {}).get(platform_id)

    def submit(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> concurrent.futures.Future[None]:
        self._apply(state, put, delete)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        return done

    def submit_awaitable(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> asyncio.Future[None]:
        self._apply(state, put, delete)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def _apply(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> None:
        sid = state.session_id
        with self._lock:
            self._states[sid] = msgspec.structs.replace(state)
            messages = self._messages.setdefault(sid, {})
            platform = self._platform.setdefault(sid, {})
            for message in delete:
                messages.pop(message.id, None)
                if message.platform_id is not None:
                    platform.pop(message.platform_id, None)
            for message in put:
                messages[message.id] = message
                if message.platform_id is not None:
                    platform[message.platform_id] = message.id
