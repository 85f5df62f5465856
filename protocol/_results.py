"""What a session hands back: ``SessionResult``, ``Outcome`` and ``Collected``."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from sessiontree.protocol._errors import ErrorInfo
from sessiontree.protocol._states import SessionKind, SessionState
from sessiontree.protocol._usage import Usage

__all__ = ["Collected", "Outcome", "SessionResult", "Timings"]


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """When a session was created, first ran and ended (epoch seconds)."""

    created_at: float
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def run_s(self) -> float | None:
        """Seconds from first run to end, or ``None`` if it never ran."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


class SessionResult(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The one result a terminal session delivers to its parent.

    ``status`` is the terminal state; ``error`` is ``None`` only for
    ``completed``. A cancelled session that wrapped up in grace carries what it
    returned as a partial ``summary``/``artifacts``. ``usage`` is what its own
    model calls spent, ``subtree_usage`` that and every descendant's, each
    counted once (``None``: nothing), as of its end: a model call still in
    flight in its subtree then (a child cancelled mid-call, the losing request
    of a hedge) is counted when it settles, in the session's accounts
    (``Node.spending``, the stored usage) and not here; ``usage_settled`` says
    whether these figures were final, and a ``usage_settled`` event carries
    the final ones once the last call landed. ``context_leaf`` is the last message of
    a Branch's context branch in ``conversation`` (``None``: it wrote none, or
    it is a worker, whose branch is not kept): continuing its work forks there.
    """

    session_id: uuid.UUID
    status: SessionState
    parent_id: uuid.UUID | None = None
    kind: SessionKind = SessionKind.BRANCH
    summary: str = ""
    artifacts: dict[str, Any] = msgspec.field(default_factory=dict)
    memory_ids: tuple[str, ...] = ()
    error: ErrorInfo | None = None
    timings: Timings | None = None
    usage: Usage | None = None
    subtree_usage: Usage | None = None
    context_leaf: uuid.UUID | None = None
    conversation: uuid.UUID | None = None
    usage_settled: bool = True

    @property
    def ok(self) -> bool:
        """True when the session completed."""
        return self.status is SessionState.COMPLETED


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a skill may return for full control over its result."""

    summary: str = ""
    artifacts: dict[str, Any] = msgspec.field(default_factory=dict)
    memory_ids: tuple[str, ...] = ()


class Collected(msgspec.Struct, frozen=True, kw_only=True):
    """One child's entry when collecting: its result, or ``timed_out``. With a
    quorum: ``counted``, its result is one of those that met it;
    ``superseded``, it was cancelled once the quorum was met or could no
    longer be met (its result, if it ended in its grace, is partial)."""

    session_id: uuid.UUID
    result: SessionResult | None
    timed_out: bool = False
    counted: bool = False
    superseded: bool = False
