"""The backend protocol: what the node and an execution backend exchange.

A session on the ``process`` or ``ray`` backend runs its skill in a pooled
worker (a process, a Ray actor). What crosses is a :class:`StepJob` (the
pickled skill and the session's ``SessionInfo``) one way, and events
(progress, messages to the parent, model calls: :data:`StepEvent`) and one
:class:`StepEnd` the other. A model call is the one exchange that goes both
ways: the step waits for the node's answer, which its backend carries back
with :meth:`RemoteRun.answer`. A backend is an :class:`ExecutionBackend`;
what it hands back for a queued job is a :class:`RemoteRun`.

This module depends on ``sessiontree.protocol`` only, so the session runtime
(``SessionCore`` keeps the backend a session runs on) can name a backend
without importing any backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sessiontree.protocol import Completion, ErrorCode, ErrorInfo, Outcome, SessionInfo

__all__ = [
    "CALL_EVENTS",
    "ExecutionBackend",
    "RemoteRun",
    "StepEnd",
    "StepEvent",
    "StepJob",
]

StepEvent = tuple[str, Any]
"""What a step reports before it ends: ``("progress", (note, data))``,
``("send", message)``, ``("complete", (call_id, call))`` (a model call the
step waits on, encoded by ``encode_call``; the node answers it with
``RemoteRun.answer``) or ``("abandon", call_id)`` (the step stopped waiting:
the node closes that call)."""

CALL_EVENTS = frozenset({"complete", "abandon"})
"""The events the node must get while the step runs (it waits on their answer);
a backend may carry the others back with the step's end."""


@dataclass(frozen=True, slots=True)
class StepJob:
    """One run of a skill in a worker: ``skill`` as the backend serialised it."""

    job_id: int
    skill: bytes
    info: SessionInfo
    is_async: bool
    backend: str
    cancel: ErrorCode | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class StepEnd:
    """How a remote step ended (mirrors ``RunEnd``); ``worker`` names where it ran.
    ``events`` carries what the step reported when the backend returns them
    with the end instead of as they happen."""

    outcome: Outcome | None = None
    error: ErrorInfo | None = None
    cancelled: bool = False
    events: tuple[StepEvent, ...] = ()
    worker: dict[str, Any] = field(default_factory=dict)


class RemoteRun(Protocol):
    """A step handed to a backend; ``future`` resolves on the node's loop."""

    future: asyncio.Future[StepEnd]

    def cancel(self, code: ErrorCode) -> None:
        """Ask the step to stop (its next ``checkpoint()`` raises ``Cancelled``)."""

    def kill(self) -> None:
        """Stop the step now: its worker is killed and replaced."""

    def answer(self, call_id: int, completion: Completion) -> None:
        """Hand the step the reply to its model call ``call_id`` (called on the
        node's loop; dropped when the step has ended or its worker is gone)."""


class ExecutionBackend(Protocol):
    """Where steps run outside the node's own threads (``process``, ``ray``)."""

    name: str

    @property
    def unavailable(self) -> str | None:
        """Why no step can run here any more (its pool failed, its cluster is
        gone), or None while it works."""

    def start(self) -> None:
        """Start the pool (in the background; idempotent). Raises
        ``BackendUnavailableError`` when the backend cannot work at all."""

    def serialise(self, skill: Callable[..., Any]) -> bytes:
        """The skill as its workers load it; ``TypeError`` naming what could not
        be serialised."""

    def submit(
        self, job: StepJob, loop: asyncio.AbstractEventLoop, on_event: Callable[[StepEvent], None]
    ) -> RemoteRun:
        """Queue ``job`` for the next free worker (called on ``loop``); ``on_event``
        runs on ``loop`` for each event the step reports: the :data:`CALL_EVENTS`
        while it runs (the step waits on their answer), the others at the
        latest with its end."""

    def close(self) -> None:
        """Stop every worker (a running step is killed)."""
