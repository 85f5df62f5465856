"""Shared memory: the key/value space siblings coordinate through.

``StoreMemory`` keeps it in the node's LMDB store (a write returns once
durable); ``InMemorySpace`` is the default of a node without a store. Each
write returns a memory id that can travel in a ``SessionResult.memory_ids``;
reading a memory id returns that write's value (``KeyError`` once a later
write to the same key replaced it).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Protocol

from sessiontree.actors import Clock
from sessiontree.protocol import RejectedInputError, new_session_id, slot_of
from sessiontree.store import MemoryRecord, Store, WriteBatch

__all__ = ["InMemorySpace", "MemorySpace", "StoreMemory"]

MAX_KEY_CHARS = 512


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS or "\x00" in key:
        msg = (
            f"memory key must be a non-empty string of at most {MAX_KEY_CHARS} characters "
            f"without NUL: {key!r}"
        )
        raise RejectedInputError(msg, field="key")


def _new_id(session_id: uuid.UUID) -> str:
    """A memory id; it carries the slot of the session that wrote it."""
    return f"mem-{new_session_id(slot_of(session_id))}"


class MemorySpace(Protocol):
    """Where shared memory lives, per agent."""

    def put(self, agent_id: str, session_id: uuid.UUID, key: str, value: Any) -> str:
        """Store ``value`` under ``key``; return the write's memory id."""
        ...

    async def aput(self, agent_id: str, session_id: uuid.UUID, key: str, value: Any) -> str:
        """``put`` without blocking an event loop."""
        ...

    def get(self, agent_id: str, key: str) -> Any:
        """The latest value under ``key``; ``KeyError`` when absent."""
        ...

    def by_id(self, memory_id: str) -> Any:
        """The value a memory id names; ``KeyError`` when unknown or overwritten."""
        ...


class InMemorySpace:
    """A dict per agent, guarded by a lock (lost with the process)."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], tuple[str, Any]] = {}
        self._ids: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def put(self, agent_id: str, session_id: uuid.UUID, key: str, value: Any) -> str:
        _check_key(key)
        memory_id = _new_id(session_id)
        with self._lock:
            self._values[(agent_id, key)] = (memory_id, value)
            self._ids[memory_id] = (agent_id, key)
        return memory_id

    async def aput(self, agent_id: str, session_id: uuid.UUID, key: str, value: Any) -> str:
        return self.put(agent_id, session_id, key, value)

    def get(self, agent_id: str, key: str) -> Any:
        with self._lock:
            return self._values[(agent_id, key)][1]

    def by_id(self, memory_id: str) -> Any:
        with self._lock:
            agent_id, key = self._ids[memory_id]
            current_id, value = self._values[(agent_id, key)]
        if current_id != memory_id:
            msg = f"memory id {memory_id} was overwritten by a later write"
            raise KeyError(msg)
        return value


class StoreMemory:
    """Shared memory in the node's store. ``put`` returns once the write is
    durable; it raises ``RejectedInputError`` (field ``key`` or ``value``) for
    a bad key or a value msgpack cannot hold, ``StoreFullError``/``StoreError``
    when the store refuses the write (nothing written)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def _batch(
        self, agent_id: str, session_id: uuid.UUID, key: str, value: Any
    ) -> tuple[str, WriteBatch]:
        _check_key(key)
        memory_id = _new_id(session_id)
        record = MemoryRecord(
            agent_id=agent_id,
            key=key,
            memory_id=memory_id,
            value=value,
            session_id=session_id,
            written_at=self.clock.time(),
        )
        return memory_id, WriteBatch().memory(record)

    def put(self, agent_id: str, session_id: uuid.UUID, key: str, value: Any) -> str:
        memory_id, batch = self._batch(agent_id, session_id, key, value)
        self.store.write(batch)
        return memory_id

    async def aput(self, agent_id: str, session_id: uuid.UUID, key: str, value: Any) -> str:
        memory_id, batch = self._batch(agent_id, session_id, key, value)
        await self.store.awrite(batch)
        return memory_id

    def get(self, agent_id: str, key: str) -> Any:
        record = self.store.memory(agent_id, key)
        if record is None:
            raise KeyError(key)
        return record.value

    def by_id(self, memory_id: str) -> Any:
        record = self.store.memory_by_id(memory_id)
        if record is None:
            msg = f"memory id {memory_id} is unknown or was overwritten by a later write"
            raise KeyError(msg)
        return record.value
