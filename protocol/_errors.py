"""Error codes, the ``ErrorInfo`` Struct and the library's exception tree."""

from __future__ import annotations

import enum
import uuid
from typing import Any

import msgspec

__all__ = [
    "BackendUnavailableError",
    "ConversationError",
    "CorruptRecordError",
    "DeadlockError",
    "ErrorCode",
    "ErrorInfo",
    "EscalationError",
    "InvalidTransitionError",
    "NodeClosedError",
    "NonRetryableError",
    "NotAllowedError",
    "RejectedInputError",
    "SessionTreeError",
    "SlotConflictError",
    "SlotFrozenError",
    "SlotMovedError",
    "StoreDamagedError",
    "StoreError",
    "StoreFencedError",
    "StoreFullError",
    "StoreLockedError",
    "UnknownAgentError",
    "UnknownSessionError",
]


class ErrorCode(enum.StrEnum):
    """Why something was refused or why a session ended badly."""

    DEPTH_EXCEEDED = "depth_exceeded"
    CHILDREN_EXCEEDED = "children_exceeded"
    WORKER_CANNOT_SPAWN = "worker_cannot_spawn"
    PARENT_NOT_ACTIVE = "parent_not_active"
    SESSION_NOT_ACTIVE = "session_not_active"
    UNKNOWN_SESSION = "unknown_session"
    UNKNOWN_AGENT = "unknown_agent"
    UNKNOWN_SKILL = "unknown_skill"
    INVALID_TTL = "invalid_ttl"
    INVALID_TRANSITION = "invalid_transition"
    CAPACITY_EXCEEDED = "capacity_exceeded"
    CRASHED = "crashed"
    TTL_EXPIRED = "ttl_expired"
    CANCELLED = "cancelled"
    PARENT_TERMINATED = "parent_terminated"
    TERMINATED_BY_FORCE = "terminated_by_force"
    NODE_RESTARTED = "node_restarted"
    WEDGED = "wedged"
    NODE_CLOSED = "node_closed"
    REJECTED_INPUT = "rejected_input"
    NOT_FOUND = "not_found"
    NOT_ALLOWED = "not_allowed"
    STORE_FULL = "store_full"
    STORE_FAILED = "store_failed"
    STORE_LOCKED = "store_locked"
    STORE_DAMAGED = "store_damaged"
    STORE_FENCED = "store_fenced"
    CORRUPT_RECORD = "corrupt_record"
    UNKNOWN_MESSAGE = "unknown_message"
    UNKNOWN_BRANCH = "unknown_branch"
    BRANCH_EXISTS = "branch_exists"
    CURRENT_BRANCH = "current_branch"
    CONFIRMATION_MISMATCH = "confirmation_mismatch"
    UNKNOWN_COMMAND = "unknown_command"
    ESCALATED = "escalated"
    TIMED_OUT = "timed_out"
    INTERNAL_ERROR = "internal_error"
    UNKNOWN_BACKEND = "unknown_backend"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    NOT_SERIALISABLE = "not_serialisable"
    BUDGET_EXHAUSTED = "budget_exhausted"
    BUDGET_UNENFORCEABLE = "budget_unenforceable"
    MODEL_ERROR = "model_error"
    SLOT_MOVED = "slot_moved"
    SLOT_FROZEN = "slot_frozen"
    SLOT_CONFLICT = "slot_conflict"


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A structured error: a machine-readable ``code``, a sentence, and details."""

    code: ErrorCode
    message: str
    detail: dict[str, Any] = msgspec.field(default_factory=dict)


class SessionTreeError(Exception):
    """Root of every exception sessiontree raises (``Cancelled`` aside)."""

    code: ErrorCode = ErrorCode.REJECTED_INPUT

    def __init__(self, message: str, *, session_id: uuid.UUID | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id

    def to_info(self) -> ErrorInfo:
        """This error as an ``ErrorInfo`` (for returning instead of raising)."""
        detail: dict[str, Any] = {}
        if self.session_id is not None:
            detail["session_id"] = str(self.session_id)
        return ErrorInfo(code=self.code, message=str(self), detail=detail)


class InvalidTransitionError(SessionTreeError):
    """Raised when a state change is not in the transition table."""

    code = ErrorCode.INVALID_TRANSITION


class UnknownSessionError(SessionTreeError):
    """Raised when a session id names no session this node knows."""

    code = ErrorCode.UNKNOWN_SESSION


class RejectedInputError(SessionTreeError):
    """Raised when untrusted input is too large, malformed or of the wrong type.

    ``field`` names the offending field (a dotted path) where known;
    ``reason`` says which kind of mistake, from a small fixed set (``too_large``,
    ``too_deep``, ``malformed``, ``unknown_field``, ``invalid_field``) that
    metrics use as a label.
    """

    code = ErrorCode.REJECTED_INPUT

    def __init__(
        self, message: str, *, field: str | None = None, reason: str = "invalid_field"
    ) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason


class UnknownAgentError(RejectedInputError):
    """Raised when an agent id names no registered agent."""

    code = ErrorCode.UNKNOWN_AGENT


class NodeClosedError(SessionTreeError):
    """Raised when a node that is shutting down, stopped or failed is asked to work."""

    code = ErrorCode.NODE_CLOSED


class NotAllowedError(SessionTreeError):
    """Raised when a session asks for something its kind may not do."""

    code = ErrorCode.NOT_ALLOWED


class BackendUnavailableError(SessionTreeError):
    """Raised when an execution backend cannot run steps: its package is not
    installed, its pool could not start, or its cluster is gone."""

    code = ErrorCode.BACKEND_UNAVAILABLE


class DeadlockError(SessionTreeError):
    """Raised when an actor handler would block on an ask (to itself or in a cycle)."""

    code = ErrorCode.NOT_ALLOWED


class StoreError(SessionTreeError):
    """Raised when the store cannot do a write (nothing of it was acknowledged)."""

    code = ErrorCode.STORE_FAILED


class StoreFullError(StoreError):
    """Raised when a write does not fit the store's map; the whole transaction
    rolled back and earlier data is intact (grow the map with ``Store.grow``)."""

    code = ErrorCode.STORE_FULL


class StoreLockedError(StoreError):
    """Raised when a store directory is already held by another node or opened
    twice in one process."""

    code = ErrorCode.STORE_LOCKED


class StoreDamagedError(StoreError):
    """Raised when the store's file is damaged (truncated, a bad meta or data page,
    emptied); ``path`` names the file, ``problem`` says what is wrong."""

    code = ErrorCode.STORE_DAMAGED

    def __init__(self, message: str, *, path: str, problem: str) -> None:
        super().__init__(message)
        self.path = path
        self.problem = problem

    def to_info(self) -> ErrorInfo:
        info = super().to_info()
        info.detail.update(path=self.path, problem=self.problem)
        return info


class StoreFencedError(StoreError):
    """Raised when this process's handle on a store is stale: another process
    opened the store since (its ``incarnation`` moved on), or, with ``slot``
    set, a write named a slot epoch that has moved on. Nothing of the refused
    write was committed; a stale handle refuses every later write too."""

    code = ErrorCode.STORE_FENCED

    def __init__(self, message: str, *, path: str, slot: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.slot = slot

    def to_info(self) -> ErrorInfo:
        info = super().to_info()
        info.detail["path"] = self.path
        if self.slot is not None:
            info.detail["slot"] = self.slot
        return info


class CorruptRecordError(StoreError):
    """Raised when a stored value cannot be decoded or has an unknown schema
    version; ``db`` and ``key`` name it (recovery quarantines what it reads
    at start-up instead)."""

    code = ErrorCode.CORRUPT_RECORD

    def __init__(self, message: str, *, db: str, key: bytes) -> None:
        super().__init__(message)
        self.db = db
        self.key = key

    def to_info(self) -> ErrorInfo:
        info = super().to_info()
        info.detail.update(db=self.db, key=self.key.hex())
        return info


class ConversationError(SessionTreeError):
    """Raised when a conversation operation names a message or branch the
    conversation does not have, reuses a branch name, deletes the current
    branch, or confirms a deletion with a stale token; ``code`` says which and
    ``field`` names the argument."""

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode,
        field: str | None = None,
        session_id: uuid.UUID | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.code = code
        self.field = field

    def to_info(self) -> ErrorInfo:
        info = super().to_info()
        if self.field is not None:
            info.detail["field"] = self.field
        return info


class NonRetryableError(SessionTreeError):
    """Raised by a skill for a failure no retry can fix: its session ends
    ``crashed`` with ``detail["retryable"]`` False, and patterns never retry it."""

    code = ErrorCode.CRASHED


class EscalationError(SessionTreeError):
    """Raised by a pattern when its children needed more restarts than the
    retry policy's ``intensity`` within ``period`` (OTP): the parent's run ends
    ``failed`` with code ``escalated`` and every child's error in ``detail``."""

    code = ErrorCode.ESCALATED

    def __init__(self, message: str, *, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.errors = errors

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(code=self.code, message=str(self), detail={"children": self.errors})


class SlotMovedError(RejectedInputError):
    """Raised for a session (or a session key) of a slot this node's store
    released to another node: ``slot`` names it, ``owner`` the node it moved
    to (its id as the release named it), ``at`` when (epoch seconds). Ask the
    owner instead; nothing was done here."""

    code = ErrorCode.SLOT_MOVED

    def __init__(
        self,
        message: str,
        *,
        slot: int,
        owner: str,
        at: float,
        session_id: uuid.UUID | None = None,
    ) -> None:
        super().__init__(message, field="session_id" if session_id is not None else None)
        self.session_id = session_id
        self.slot = slot
        self.owner = owner
        self.at = at

    def to_info(self) -> ErrorInfo:
        info = super().to_info()
        info.detail.update(slot=self.slot, owner=self.owner, at=self.at)
        return info


class SlotFrozenError(RejectedInputError):
    """Raised for new input (a send, a spawn, a new Main) into a slot the node
    is freezing or has frozen to move it: ``slot`` names it. Nothing was done;
    retry once the slot moved (then its new owner answers) or was unfrozen."""

    code = ErrorCode.SLOT_FROZEN

    def __init__(self, message: str, *, slot: int, session_id: uuid.UUID | None = None) -> None:
        super().__init__(message, field="session_id" if session_id is not None else None)
        self.session_id = session_id
        self.slot = slot

    def to_info(self) -> ErrorInfo:
        info = super().to_info()
        info.detail["slot"] = self.slot
        return info


class SlotConflictError(StoreError):
    """Raised when a slot's import finds one of its keys already present in the
    store: ``db`` and ``key`` name the first one met; nothing was written."""

    code = ErrorCode.SLOT_CONFLICT

    def __init__(self, message: str, *, slot: int, db: str, key: bytes) -> None:
        super().__init__(message)
        self.slot = slot
        self.db = db
        self.key = key

    def to_info(self) -> ErrorInfo:
        info = super().to_info()
        info.detail.update(slot=self.slot, db=self.db, key=self.key.hex())
        return info
