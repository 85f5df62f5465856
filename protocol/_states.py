"""Session kinds, lifecycle states and the one table of legal transitions."""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["TERMINAL_STATES", "TRANSITIONS", "SessionKind", "SessionState", "is_legal_transition"]


class SessionKind(enum.StrEnum):
    """What a session is: the root ``main``, a ``branch`` sub-task, or a ``worker`` leaf."""

    MAIN = "main"
    BRANCH = "branch"
    WORKER = "worker"


class SessionState(enum.StrEnum):
    """Where a session is in its lifecycle."""

    PENDING = "pending"
    ACTIVE = "active"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """True for the four end states; a terminal session never changes again."""
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[SessionState] = frozenset(
    {SessionState.COMPLETED, SessionState.FAILED, SessionState.EXPIRED, SessionState.CANCELLED}
)

_ENDINGS = frozenset({SessionState.FAILED, SessionState.EXPIRED, SessionState.CANCELLED})

#: The legal moves, written down once: ``Pending → Active ⇄ Suspended → end``.
#: A pending session never ran, so it cannot complete; a suspended one is parked
#: at a checkpoint, so it cannot complete either before it is resumed.
TRANSITIONS: Mapping[SessionState, frozenset[SessionState]] = {
    SessionState.PENDING: frozenset({SessionState.ACTIVE}) | _ENDINGS,
    SessionState.ACTIVE: frozenset({SessionState.SUSPENDED, SessionState.COMPLETED}) | _ENDINGS,
    SessionState.SUSPENDED: frozenset({SessionState.ACTIVE}) | _ENDINGS,
    SessionState.COMPLETED: frozenset(),
    SessionState.FAILED: frozenset(),
    SessionState.EXPIRED: frozenset(),
    SessionState.CANCELLED: frozenset(),
}


def is_legal_transition(current: SessionState, new: SessionState) -> bool:
    """Whether ``current → new`` is in :data:`TRANSITIONS`."""
    return new in TRANSITIONS[current]
