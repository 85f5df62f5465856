"""Every transition as one event, fanned out to observers (store, metrics, logs)."""

from __future__ import annotations

import enum
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = ["Event", "EventBus", "EventKind"]

log = logging.getLogger("sessiontree.events")


class EventKind(enum.StrEnum):
    """What happened."""

    SPAWNED = "spawned"
    REJECTED = "rejected"
    TRANSITION = "transition"
    CANCEL_REQUESTED = "cancel_requested"
    SUSPEND_REQUESTED = "suspend_requested"
    RESULT_DELIVERED = "result_delivered"
    CYCLE_STARTED = "cycle_started"
    CYCLE_ENDED = "cycle_ended"
    PROGRESS = "progress"
    CHILD_UPDATE = "child_update"
    STUCK = "stuck"
    REFUSED = "refused"
    MEMORY_PRESSURE = "memory_pressure"
    MEMORY_RELIEVED = "memory_relieved"
    NODE_FAILED = "node_failed"
    RESTORED = "restored"
    STORE_ERROR = "store_error"
    DISCARDED = "discarded"
    PASSIVATED = "passivated"
    BUDGET_WARNING = "budget_warning"
    BUDGET_EXHAUSTED = "budget_exhausted"
    MODEL_CALL = "model_call"
    USAGE_SETTLED = "usage_settled"


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that happened to one session (or to the node, ``session_id`` None).

    ``session_kind``: the session's kind (``main``, ``branch``, ``worker``),
    ``agent_id`` its agent and ``skill`` the skill that runs it, so an observer
    that joined late can still place it.
    ``DISCARDED``: a new session whose record could not be written was taken
    out again, as if never created.
    ``PASSIVATED``: an idle Main was written out and its actor stopped; its next
    message brings it back (``RESTORED`` with ``data["reactivated"]``).
    ``MEMORY_PRESSURE``: memory use reached the high mark and this branch was
    asked to suspend (a ``SUSPEND_REQUESTED`` with ``data["reason"]`` follows);
    ``MEMORY_RELIEVED``: use fell below the low mark and this branch, which
    pressure had suspended, was resumed (``data["suspended_s"]``: for how
    long). Both carry the reading and the mark (``used``, ``high``/``low``).
    ``USAGE_SETTLED``: the last model call in flight in an ended session's
    subtree settled; ``data`` holds its final ``usage`` and ``subtree_usage``
    (its result, delivered earlier, said ``usage_settled=False``).
    On a traced node only: ``CYCLE_STARTED`` (a Main's cycle began; ``data``:
    ``cycle``, its span's ``trace``, ``parent_trace``, ``cut_off``) and
    ``MODEL_CALL`` (a model call ended; ``data``: model, tokens, timings and
    its span's ``trace``), and the ``trace`` of a Main's cycle in
    ``CYCLE_ENDED``'s data; ``SPAWNED``'s data also holds the span's
    ``trace``, ``trace_parent``, the ``ttl`` and the ``task``; a
    ``TRANSITION`` to an end state holds the subtree's ``usage`` (and whether
    it ``settled``) and the session's ``failure`` (its ``ErrorInfo``: for a
    crash, the exception's type, message and traceback in its detail), as
    does ``CYCLE_ENDED`` for a cycle that raised.
    """

    kind: EventKind
    at: float
    session_id: uuid.UUID | None = None
    parent_id: uuid.UUID | None = None
    session_kind: str | None = None
    agent_id: str | None = None
    skill: str | None = None
    state: str | None = None
    previous: str | None = None
    code: str | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class EventBus:
    """Observers called in order, on the Cortex thread, for every event.

    An observer that raises is logged and skipped; it never stops the Cortex.
    Observers must be quick: they run inside the Cortex's message handling.
    """

    def __init__(self) -> None:
        self._observers: list[Callable[[Event], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, observer: Callable[[Event], None]) -> Callable[[], None]:
        """Add an observer; returns a function that removes it."""
        with self._lock:
            self._observers = [*self._observers, observer]

        def unsubscribe() -> None:
            with self._lock:
                self._observers = [o for o in self._observers if o is not observer]

        return unsubscribe

    @property
    def observed(self) -> bool:
        """Whether anyone listens (an emitter may skip building an event if not)."""
        return bool(self._observers)

    def emit(self, event: Event) -> None:
        """Hand ``event`` to every observer."""
        for observer in self._observers:
            try:
                observer(event)
            except Exception:
                log.exception("event observer %r raised on %s", observer, event.kind)
