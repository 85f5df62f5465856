"""The outside handles of sessions (``SessionRef``, ``Spawned``), and what a
session id and the arguments of an operation on one may be.

A session id reaches the node from users as a ``uuid.UUID``, as its
canonical string (read back from JSON or the CLI) or as a ``SessionRef``;
``as_session_id`` is the one place that turns any of them into the UUID the
Cortex keys its tree by, and refuses anything else with a
``RejectedInputError`` naming the argument.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from sessiontree.protocol import (
    MAX_REASON_CHARS,
    ErrorCode,
    ErrorInfo,
    RejectedInputError,
    SessionInfo,
    SessionResult,
    SessionState,
    SpawnSpec,
    Spending,
)
from sessiontree.supervision._faces import blocking

__all__ = [
    "SessionIdLike",
    "SessionOps",
    "SessionRef",
    "Spawned",
    "as_grace",
    "as_reason",
    "as_run_timeout",
    "as_session_id",
    "refused_result",
]

SessionIdLike: TypeAlias = "uuid.UUID | str | SessionRef"
"""What a public method takes for a session id: a UUID, its canonical string, or a ref."""

_NIL = uuid.UUID(int=0)
_CANONICAL_LENGTH = 36  # 8-4-4-4-12 hex digits


def _seconds(value: object, field: str) -> float | None:
    """None, or a finite number of seconds >= 0; ``RejectedInputError`` naming
    ``field`` for anything else (a bool is not a number)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    msg = f"{field} must be a finite number of seconds >= 0, not {value!r:.40}"
    raise RejectedInputError(msg, field=field)


def as_grace(value: object) -> float | None:
    """A cancel's grace: None (the node's) or a finite number of seconds >= 0;
    ``RejectedInputError`` naming ``grace`` for anything else."""
    return _seconds(value, "grace")


def as_reason(value: object) -> str | None:
    """A cancel's reason: None or a string of at most ``MAX_REASON_CHARS``
    characters; ``RejectedInputError`` naming ``reason`` for anything else."""
    if value is None:
        return None
    if not isinstance(value, str):
        msg = f"reason must be a string, not {type(value).__name__}"
        raise RejectedInputError(msg, field="reason")
    if len(value) > MAX_REASON_CHARS:
        msg = f"reason is {len(value)} characters, more than {MAX_REASON_CHARS}"
        raise RejectedInputError(msg, field="reason")
    return value


def as_run_timeout(value: object) -> float | None:
    """A run's timeout: None (none) or a finite number of seconds >= 0;
    ``RejectedInputError`` naming ``timeout`` for anything else."""
    return _seconds(value, "timeout")


def as_session_id(value: object, argument: str = "session_id") -> uuid.UUID:
    """``value`` as a session id: a ``uuid.UUID`` as it is, a ``SessionRef``'s id,
    or a UUID's canonical string (``str(uuid)``, either case) parsed.

    Raises ``RejectedInputError`` naming ``argument`` for anything else: another
    type, a string that is no UUID, or a UUID spelled another way (braces, a
    ``urn:`` prefix, no hyphens).
    """
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, SessionRef):
        return value.session_id
    if isinstance(value, str) and len(value) == _CANONICAL_LENGTH:
        try:
            parsed = uuid.UUID(value)
        except ValueError:
            pass
        else:
            if str(parsed) == value.lower():
                return parsed
    shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:77]}..."
    msg = f"{argument} {shown} is not a session id (a UUID or its canonical string)"
    raise RejectedInputError(msg, field=argument)


def refused_result(error: ErrorInfo | None) -> SessionResult:
    """The ``failed`` result ``run`` returns for a refused spawn (nil session id)."""
    return SessionResult(
        session_id=_NIL,
        status=SessionState.FAILED,
        error=error or ErrorInfo(code=ErrorCode.REJECTED_INPUT, message="spawn refused"),
    )


@dataclass(frozen=True)
class Spawned:
    """The answer to a spawn: the new session's ``ref``, or the ``error`` that refused it.

    ``existing`` is True when a repeated ``request_id`` returned the first session;
    ``clamped`` when the budget it asked for was narrowed to what its parent had
    left (``ref.info().budget`` is the one it got).
    """

    ref: SessionRef | None
    error: ErrorInfo | None
    existing: bool = False
    clamped: bool = False

    @property
    def ok(self) -> bool:
        """True when a session exists (new or, for a repeated request_id, the first)."""
        return self.ref is not None

    @property
    def session_id(self) -> uuid.UUID | None:
        """The session's id, or None when refused."""
        return self.ref.session_id if self.ref is not None else None


class SessionOps(Protocol):
    """What a ``SessionRef`` stands on: the node's awaitable operations on one
    session (``NodeCore``'s, which documents them). A protocol so
    that this module needs no node module (they build refs)."""

    async def aget(self, session_id: SessionIdLike, /) -> SessionInfo: ...

    async def await_result(
        self, session_id: SessionIdLike, timeout: float | None = None, /
    ) -> SessionResult | None: ...

    async def aresult(self, session_id: SessionIdLike, /) -> SessionResult | None: ...

    async def aresults(self, session_id: SessionIdLike, /) -> list[SessionResult]: ...

    async def aspending(self, session_id: SessionIdLike, /) -> Spending: ...

    async def acancel(
        self, session_id: SessionIdLike, grace: float | None = None, /, *, reason: str | None = None
    ) -> ErrorInfo | None: ...

    async def aterminate(
        self, session_id: SessionIdLike, /, *, reason: str | None = None
    ) -> ErrorInfo | None: ...

    async def asuspend(self, session_id: SessionIdLike, /) -> ErrorInfo | None: ...

    async def aresume(self, session_id: SessionIdLike, /) -> ErrorInfo | None: ...

    async def asend(
        self,
        session_id: SessionIdLike,
        message: Any,
        /,
        *,
        trace: str | None = None,
        request_id: str | None = None,
    ) -> ErrorInfo | None: ...

    async def aspawn(
        self, parent: SessionIdLike, spec: SpawnSpec | None = None, /, **fields: Any
    ) -> Spawned: ...

    async def aspawn_many(
        self, parent: SessionIdLike, specs: Iterable[SpawnSpec], /
    ) -> list[Spawned]: ...

    async def arun(
        self,
        parent: SessionIdLike,
        spec: SpawnSpec | None = None,
        /,
        timeout: float | None = None,
        **fields: Any,
    ) -> SessionResult: ...


class SessionRef:
    """The outside handle of one session. Each operation has an awaitable
    (``a``-prefixed) and a blocking face, as ``Node``'s have.

    Each method is the ``Node`` method of the same name for this session and
    fails as that one does: ``UnknownSessionError`` for a session the node does
    not hold, ``NodeClosedError`` once the node is closed (reads of state and
    results keep working while it shuts down), and refusals the Cortex decides
    (a cancel of an ended session, a suspend of a Worker…) come back as an
    ``ErrorInfo`` value.
    """

    __slots__ = ("_node", "session_id")

    def __init__(self, node: SessionOps, session_id: SessionIdLike) -> None:
        """A handle on ``session_id`` (not checked until used); ``RejectedInputError``
        if it is not a session id."""
        self._node = node
        self.session_id: uuid.UUID = as_session_id(session_id)

    def __repr__(self) -> str:
        return f"<SessionRef {self.session_id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionRef) and other.session_id == self.session_id

    def __hash__(self) -> int:
        return hash(self.session_id)

    @property
    def state(self) -> SessionState:
        """The current state (``UnknownSessionError`` if the node forgot the session)."""
        return self.info().state

    async def ainfo(self) -> SessionInfo:
        """Identity and current state; ``UnknownSessionError`` if the node forgot it."""
        return await self._node.aget(self.session_id)

    info = blocking(ainfo)

    async def await_result(self, timeout: float | None = None) -> SessionResult | None:
        """Wait until the session ends and return its result; None if ``timeout``
        (real seconds) passes first. See ``Node.wait``."""
        return await self._node.await_result(self.session_id, timeout)

    wait = blocking(await_result)

    async def aresult(self) -> SessionResult | None:
        """The result if the session has ended, else None (does not wait)."""
        return await self._node.aresult(self.session_id)

    result = blocking(aresult)

    async def aresults(self) -> list[SessionResult]:
        """The results this session received from its children."""
        return await self._node.aresults(self.session_id)

    results = blocking(aresults)

    async def aspending(self) -> Spending:
        """What this session and its subtree spent, its budget and what is left;
        see ``Node.spending``."""
        return await self._node.aspending(self.session_id)

    spending = blocking(aspending)

    async def acancel(
        self, grace: float | None = None, *, reason: str | None = None
    ) -> ErrorInfo | None:
        """Cancel this session and its subtree; see ``Node.cancel``."""
        return await self._node.acancel(self.session_id, grace, reason=reason)

    cancel = blocking(acancel)

    async def aterminate(self, *, reason: str | None = None) -> ErrorInfo | None:
        """End this session and its subtree at once; see ``Node.terminate``."""
        return await self._node.aterminate(self.session_id, reason=reason)

    terminate = blocking(aterminate)

    async def asuspend(self) -> ErrorInfo | None:
        """Suspend (branches only); see ``Node.suspend``."""
        return await self._node.asuspend(self.session_id)

    suspend = blocking(asuspend)

    async def aresume(self) -> ErrorInfo | None:
        """Resume (branches only); see ``Node.resume``."""
        return await self._node.aresume(self.session_id)

    resume = blocking(aresume)

    async def asend(
        self, message: Any, *, trace: str | None = None, request_id: str | None = None
    ) -> ErrorInfo | None:
        """Send an inbound message (mains only); see ``Node.send``."""
        return await self._node.asend(self.session_id, message, trace=trace, request_id=request_id)

    send = blocking(asend)

    async def aspawn(self, spec: SpawnSpec | None = None, /, **fields: Any) -> Spawned:
        """Spawn a child under this session; see ``Node.spawn``."""
        return await self._node.aspawn(self.session_id, spec, **fields)

    spawn = blocking(aspawn)

    async def aspawn_many(self, specs: Iterable[SpawnSpec]) -> list[Spawned]:
        """Spawn a batch of children under this session; see ``Node.spawn_many``."""
        return await self._node.aspawn_many(self.session_id, specs)

    spawn_many = blocking(aspawn_many)

    async def arun(
        self, spec: SpawnSpec | None = None, /, timeout: float | None = None, **fields: Any
    ) -> SessionResult:
        """Spawn a fresh child under this session and wait for its result
        (cancelled at ``timeout``); see ``Node.run``."""
        return await self._node.arun(self.session_id, spec, timeout=timeout, **fields)

    run = blocking(arun)
