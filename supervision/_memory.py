"""Shared memory: the key/value space siblings coordinate through.

This in-process space is the default; the persistence issue backs the same
interface with LMDB. Each write returns a memory id that can travel in a
``SessionResult.memory_ids``.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Protocol

from sessiontree.protocol import RejectedInputError

__all__ = ["InMemorySpace", "MemorySpace"]


class MemorySpace(Protocol):
    """Where shared memory lives, per agent."""

    def put(self, agent_id: str, session_id: uuid.UUID, key: str, value: Any) -> str:
        """Store ``value`` under ``key``; return the write's memory id."""
        ...

    def get(self, agent_id: str, key: str) -> Any:
        """The latest value under ``key``; ``KeyError`` when absent."""
        ...

    def by_id(self, memory_id: str) -> Any:
        """The value a memory id names; ``KeyError`` when unknown."""
        ...


class InMemorySpace:
    """A dict per agent, guarded by a lock."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], tuple[str, Any]] = {}
        self._ids: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def put(self, agent_id: str, session_id: uuid.UUID, key: str, value: Any) -> str:
        if not isinstance(key, str) or not key or len(key) > 512:
            msg = f"memory key must be a non-empty string of at most 512 characters: {key!r}"
            raise RejectedInputError(msg, field="key")
        memory_id = f"mem-{uuid.uuid4()}"
        with self._lock:
            self._values[(agent_id, key)] = (memory_id, value)
            self._ids[memory_id] = (agent_id, key)
        return memory_id

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
