"""The execution backends of one node, by name, started when first needed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from sessiontree.actors.backends._protocol import ExecutionBackend
from sessiontree.protocol import BackendUnavailableError

__all__ = ["BACKENDS", "Backends"]

BACKENDS = ("inline", "process", "ray")
"""Where a session's skill can run: this process's threads and loop, a pool of
worker processes on this machine, or Ray actors on a Ray cluster."""


class Backends:
    """A node's backends: ``inline`` always; the others made by ``factories`` on
    first use (or by ``start`` for the node's default) and pooled from then on.

    ``serialised`` keeps each skill's bytes per backend, so a fan-out of one
    skill pickles it once.
    """

    def __init__(self, factories: Mapping[str, Callable[[], ExecutionBackend]]) -> None:
        self._factories = dict(factories)
        self._made: dict[str, ExecutionBackend] = {}
        # by the skill's id (a callable need not be hashable), holding the skill
        # so the id cannot be reused while the entry lives
        self._bytes: dict[tuple[str, int], tuple[Callable[..., Any], bytes]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, name: str) -> ExecutionBackend | None:
        """The backend called ``name`` (None for ``inline``), started if it was not.

        Raises ``KeyError`` for a name that is not a backend, and
        ``BackendUnavailableError`` when it cannot work (its package is
        missing, it failed to start, the node is closing).
        """
        if name == "inline":
            return None
        with self._lock:
            if self._closed:
                msg = f"the {name} backend is closed with its node"
                raise BackendUnavailableError(msg)
            backend = self._made.get(name)
            if backend is not None:
                if backend.unavailable is not None:
                    raise BackendUnavailableError(f"the {name} backend: {backend.unavailable}")
                return backend
            factory = self._factories.get(name)
            if factory is None:
                raise KeyError(name)
            backend = factory()
            backend.start()  # a failure is raised, and tried again by the next spawn
            self._made[name] = backend
            return backend

    def serialised(self, backend: ExecutionBackend, skill: Callable[..., Any]) -> bytes:
        """``backend.serialise(skill)``, once per skill (``TypeError`` when it cannot be)."""
        key = (backend.name, id(skill))
        known = self._bytes.get(key)
        if known is not None and known[0] is skill:
            return known[1]
        data = backend.serialise(skill)
        self._bytes[key] = (skill, data)
        return data

    def close(self) -> None:
        """Close every started backend (steps still running are killed)."""
        with self._lock:
            self._closed = True
            made, self._made = self._made, {}
        for backend in made.values():
            backend.close()
