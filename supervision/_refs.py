"""The outside handles of sessions (``SessionRef``, ``Spawned``), the node's
operations on one session that they stand on (``NodeSessions``), and what a
session id may be.

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
from typing import Any, TypeAlias

import msgspec

from sessiontree.actors import AskTimeoutError
from sessiontree.actors.runtime import Reply
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
    check_message,
    check_request_id,
    make_spec,
    parse_traceparent,
    spawn_batch,
)
from sessiontree.supervision._entry import SpawnAnswer
from sessiontree.supervision._node_base import NodeBase
from sessiontree.supervision._requests import (
    AwaitResult,
    Call,
    Cancel,
    ForgetWaiter,
    GetInfo,
    GetResult,
    GetResults,
    GetSpending,
    OpenMain,
    Resume,
    Run,
    Send,
    Spawn,
    SpawnMany,
    Suspend,
)
from sessiontree.supervision._trace_context import caller_traceparent

__all__ = [
    "NodeSessions",
    "SessionIdLike",
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
_FOREVER = 1e9  # real seconds: a wait bounded only by the session's end
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


def _ran(answer: SessionResult | ErrorInfo) -> SessionResult:
    """A ``Run``'s answer as ``run`` returns it: a refusal as a failed result."""
    return refused_result(answer) if isinstance(answer, ErrorInfo) else answer


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


class SessionRef:
    """The outside handle of one session. Blocking methods have ``a``-prefixed twins.

    Each method is the ``Node`` method of the same name for this session and
    fails as that one does: ``UnknownSessionError`` for a session the node does
    not hold, ``NodeClosedError`` once the node is closed (reads of state and
    results keep working while it shuts down), and refusals the Cortex decides
    (a cancel of an ended session, a suspend of a Worker…) come back as an
    ``ErrorInfo`` value.
    """

    __slots__ = ("_node", "session_id")

    def __init__(self, node: NodeSessions, session_id: SessionIdLike) -> None:
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

    def info(self) -> SessionInfo:
        """Identity and current state; ``UnknownSessionError`` if the node forgot it."""
        return self._node.get(self.session_id)

    @property
    def state(self) -> SessionState:
        """The current state (``UnknownSessionError`` if the node forgot the session)."""
        return self.info().state

    def wait(self, timeout: float | None = None) -> SessionResult | None:
        """Block until the session ends and return its result; None if ``timeout``
        (real seconds) passes first. See ``Node.wait``."""
        return self._node.wait(self.session_id, timeout)

    def result(self) -> SessionResult | None:
        """The result if the session has ended, else None (does not wait)."""
        return self._node.result(self.session_id)

    def results(self) -> list[SessionResult]:
        """The results this session received from its children."""
        return self._node.results(self.session_id)

    def spending(self) -> Spending:
        """What this session and its subtree spent, its budget and what is left;
        see ``Node.spending``."""
        return self._node.spending(self.session_id)

    def cancel(self, grace: float | None = None, *, reason: str | None = None) -> ErrorInfo | None:
        """Cancel this session and its subtree; see ``Node.cancel``."""
        return self._node.cancel(self.session_id, grace, reason=reason)

    def terminate(self, *, reason: str | None = None) -> ErrorInfo | None:
        """End this session and its subtree at once; see ``Node.terminate``."""
        return self._node.terminate(self.session_id, reason=reason)

    def suspend(self) -> ErrorInfo | None:
        """Suspend (branches only); see ``Node.suspend``."""
        return self._node.suspend(self.session_id)

    def resume(self) -> ErrorInfo | None:
        """Resume (branches only); see ``Node.resume``."""
        return self._node.resume(self.session_id)

    def send(
        self, message: Any, *, trace: str | None = None, request_id: str | None = None
    ) -> ErrorInfo | None:
        """Send an inbound message (mains only); see ``Node.send``."""
        return self._node.send(self.session_id, message, trace=trace, request_id=request_id)

    def spawn(self, spec: SpawnSpec | None = None, /, **fields: Any) -> Spawned:
        """Spawn a child under this session; see ``Node.spawn``."""
        return self._node.spawn(self.session_id, spec, **fields)

    def spawn_many(self, specs: Iterable[SpawnSpec]) -> list[Spawned]:
        """Spawn a batch of children under this session; see ``Node.spawn_many``."""
        return self._node.spawn_many(self.session_id, specs)

    def run(
        self, spec: SpawnSpec | None = None, /, timeout: float | None = None, **fields: Any
    ) -> SessionResult:
        """Spawn a fresh child under this session and wait for its result
        (cancelled at ``timeout``); see ``Node.run``."""
        return self._node.run(self.session_id, spec, timeout=timeout, **fields)

    # -- awaitable twins ----------------------------------------------------------

    async def ainfo(self) -> SessionInfo:
        """Awaitable ``info``."""
        return await self._node.aget(self.session_id)

    async def await_result(self, timeout: float | None = None) -> SessionResult | None:
        """Awaitable ``wait``."""
        return await self._node.await_result(self.session_id, timeout)

    async def aresult(self) -> SessionResult | None:
        """Awaitable ``result``."""
        return await self._node.aresult(self.session_id)

    async def aresults(self) -> list[SessionResult]:
        """Awaitable ``results``."""
        return await self._node.aresults(self.session_id)

    async def aspending(self) -> Spending:
        """Awaitable ``spending``."""
        return await self._node.aspending(self.session_id)

    async def acancel(
        self, grace: float | None = None, *, reason: str | None = None
    ) -> ErrorInfo | None:
        """Awaitable ``cancel``."""
        return await self._node.acancel(self.session_id, grace, reason=reason)

    async def aterminate(self, *, reason: str | None = None) -> ErrorInfo | None:
        """Awaitable ``terminate``."""
        return await self._node.aterminate(self.session_id, reason=reason)

    async def asuspend(self) -> ErrorInfo | None:
        """Awaitable ``suspend``."""
        return await self._node.asuspend(self.session_id)

    async def aresume(self) -> ErrorInfo | None:
        """Awaitable ``resume``."""
        return await self._node.aresume(self.session_id)

    async def asend(
        self, message: Any, *, trace: str | None = None, request_id: str | None = None
    ) -> ErrorInfo | None:
        """Awaitable ``send``."""
        return await self._node.asend(self.session_id, message, trace=trace, request_id=request_id)

    async def aspawn(self, spec: SpawnSpec | None = None, /, **fields: Any) -> Spawned:
        """Awaitable ``spawn``."""
        return await self._node.aspawn(self.session_id, spec, **fields)

    async def aspawn_many(self, specs: Iterable[SpawnSpec]) -> list[Spawned]:
        """Awaitable ``spawn_many``."""
        return await self._node.aspawn_many(self.session_id, specs)

    async def arun(
        self, spec: SpawnSpec | None = None, /, timeout: float | None = None, **fields: Any
    ) -> SessionResult:
        """Awaitable ``run``."""
        return await self._node.arun(self.session_id, spec, timeout=timeout, **fields)


class NodeSessions(NodeBase):
    """What a ``Node`` does with one session: open a Main, spawn, run, read,
    cancel, suspend, resume, send, wait; each with its awaitable twin.

    ``SessionRef`` is a handle on these for one session. Every method takes a
    session id as ``as_session_id`` does and fails as ``Node``'s docstring says.
    """

    def _spawned(self, answer: SpawnAnswer) -> Spawned:
        ref = SessionRef(self, answer.session_id) if answer.session_id else None
        return Spawned(ref, answer.error, answer.existing, answer.clamped)

    def _all_spawned(self, answers: list[SpawnAnswer]) -> list[Spawned]:
        return [self._spawned(answer) for answer in answers]

    def _traced(self, spec: SpawnSpec) -> SpawnSpec:
        """``spec`` continuing the caller's span, on a traced node (see ``SpawnSpec.trace``)."""
        if self.config.tracing is None or spec.trace is not None:
            return spec
        trace = caller_traceparent()
        return spec if trace is None else msgspec.structs.replace(spec, trace=trace)

    def _traced_batch(self, specs: Iterable[SpawnSpec]) -> tuple[SpawnSpec, ...]:
        batch = spawn_batch(specs)
        if self.config.tracing is None:
            return batch
        return tuple(self._traced(spec) for spec in batch)

    def _forked(self, parent: uuid.UUID, specs: tuple[SpawnSpec, ...]) -> tuple[SpawnSpec, ...]:
        """``specs`` with their fork points: each one named is checked against
        ``parent``'s conversation (``ConversationError`` naming ``fork_at``:
        nothing is spawned); see ``Contexts.outside_fork_points`` for the rest."""
        if any(spec.fork_at is not None for spec in specs):
            self._check_forks(self.get(parent), specs)
        return self._parts.contexts.outside_fork_points(parent, specs)

    async def _aforked(
        self, parent: uuid.UUID, specs: tuple[SpawnSpec, ...]
    ) -> tuple[SpawnSpec, ...]:
        if any(spec.fork_at is not None for spec in specs):
            self._check_forks(await self._acall(GetInfo(parent), check=False), specs)
        return self._parts.contexts.outside_fork_points(parent, specs)

    def _check_forks(self, info: SessionInfo, specs: tuple[SpawnSpec, ...]) -> None:
        for spec in specs:
            if spec.fork_at is not None:
                self._parts.contexts.fork_point(info, spec)

    def _send_request(
        self, session_id: SessionIdLike, message: Any, trace: str | None, request_id: str | None
    ) -> Send:
        check_message(message)
        check_request_id(request_id)
        if self.config.tracing is not None:
            trace = caller_traceparent() if trace is None else parse_traceparent(trace)
        else:
            trace = None
        return Send(as_session_id(session_id), message, trace=trace, request_id=request_id)

    def _send_run(
        self,
        parent: SessionIdLike,
        spec: SpawnSpec | None,
        timeout: object,
        fields: dict[str, Any],
    ) -> Reply:
        """Ask the Cortex to ``Run`` a fresh child; the reply its answer comes on."""
        sid = as_session_id(parent, "parent")
        seconds = as_run_timeout(timeout)
        (made,) = self._forked(sid, (self._traced(make_spec(spec, **fields)),))
        request = Run(sid, made, seconds)
        self._check_open()
        reply = Reply()
        self._send(request, reply)
        return reply

    def main(self, agent_id: str, key: str = "internal:main:main") -> SessionRef:
        """The one Main of ``agent_id`` for session ``key`` (created on first use).

        Raises ``RejectedInputError`` for an unknown agent or a malformed key.
        """
        return SessionRef(self, self._call(OpenMain(agent_id, key)))

    def spawn(
        self, parent: SessionIdLike, spec: SpawnSpec | None = None, /, **fields: Any
    ) -> Spawned:
        """Spawn a child of ``parent``; a refused spawn (an unknown parent, a
        limit, an unknown skill…) comes back as ``Spawned.error``.
        ``RejectedInputError`` for a ``parent`` that is not a session id or a
        spec that does not build."""
        sid = as_session_id(parent, "parent")
        (made,) = self._forked(sid, (self._traced(make_spec(spec, **fields)),))
        return self._spawned(self._call(Spawn(sid, made)))

    def spawn_many(self, parent: SessionIdLike, specs: Iterable[SpawnSpec]) -> list[Spawned]:
        """Spawn a batch of children of ``parent`` in one turn of the Cortex, their
        records in one commit: one ``Spawned`` per spec, in order. Each spec is
        checked as ``spawn`` checks it (a refused one does not stop the rest);
        ``RejectedInputError`` naming the field for a spec that is not a
        ``SpawnSpec`` or a ``parent`` that is not a session id. The batched
        path for spawning thousands at once."""
        sid = as_session_id(parent, "parent")
        batch = self._forked(sid, self._traced_batch(specs))
        return self._all_spawned(self._call(SpawnMany(sid, batch)))

    def run(
        self,
        parent: SessionIdLike,
        spec: SpawnSpec | None = None,
        /,
        timeout: float | None = None,
        **fields: Any,
    ) -> SessionResult:
        """Spawn a fresh session and wait for its result (never reuses a session).

        The session never outlives the call: ``timeout`` (seconds on the
        node's clock, as a TTL and the grace are) is when it is cancelled
        with its subtree, with the node's grace and code ``timed_out``; the
        call then returns the result that ends it — ``cancelled``/
        ``timed_out`` with what the skill returned while wrapping up (a
        partial result), or ``terminated_by_force`` if it was still running
        at the end of the grace. Its ``session_id`` names the session, for
        ``tree``, ``results`` or ``conversation``. A refused spawn returns a
        ``failed`` result carrying the refusal's error (its ``session_id`` is
        the nil UUID). Raises as ``spawn`` does, ``RejectedInputError``
        naming ``timeout`` unless it is None or a finite number >= 0, and
        ``NodeClosedError`` if the node stops before the session ends.
        """
        reply = self._send_run(parent, spec, timeout, fields)
        return _ran(reply.get(_FOREVER))

    def get(self, session_id: SessionIdLike) -> SessionInfo:
        """Identity and state; ``UnknownSessionError`` for an id the node does not hold."""
        return self._call(GetInfo(as_session_id(session_id)), check=False)

    def cancel(
        self, session_id: SessionIdLike, grace: float | None = None, *, reason: str | None = None
    ) -> ErrorInfo | None:
        """Cancel a session and its subtree (one deadline: now + ``grace``, by
        default ``NodeConfig.grace``; 0 ends what still runs at once with
        ``terminated_by_force``). A second cancel of a session still stopping
        may bring its subtree's deadline closer, never push it back (its
        ``reason`` is not recorded: the first cancel's stands). ``reason``
        (who or why, free text) is recorded on each ``cancel_requested`` event
        of the subtree (``data["reason"]``) and in each result's error detail
        (``detail["reason"]``). None when accepted, ``invalid_transition`` for
        a session that already ended; ``UnknownSessionError`` for an id the
        node does not hold; ``RejectedInputError`` naming ``grace`` unless it
        is a finite number of seconds >= 0, naming ``reason`` unless it is a
        string of at most ``MAX_REASON_CHARS`` characters."""
        request = Cancel(as_session_id(session_id), as_grace(grace), as_reason(reason))
        return self._call(request)

    def terminate(
        self, session_id: SessionIdLike, *, reason: str | None = None
    ) -> ErrorInfo | None:
        """``cancel`` with no grace: the subtree ends ``cancelled`` at once,
        ``terminated_by_force`` for every session that still ran."""
        return self.cancel(session_id, 0.0, reason=reason)

    def suspend(self, session_id: SessionIdLike) -> ErrorInfo | None:
        """Park a Branch at its next checkpoint; ``invalid_transition`` for other
        kinds or a Branch not active; ``UnknownSessionError`` for an unknown id."""
        return self._call(Suspend(as_session_id(session_id)))

    def resume(self, session_id: SessionIdLike) -> ErrorInfo | None:
        """Resume a suspended Branch; ``invalid_transition`` if it is not suspended;
        ``UnknownSessionError`` for an unknown id."""
        return self._call(Resume(as_session_id(session_id)))

    def send(
        self,
        session_id: SessionIdLike,
        message: Any,
        *,
        trace: str | None = None,
        request_id: str | None = None,
    ) -> ErrorInfo | None:
        """Send a Main an inbound message (one message cycle); an error if it
        cannot take it (``not_allowed`` for other kinds, ``session_not_active``
        once it stops); ``UnknownSessionError`` for an unknown id. On a traced
        node the cycle's span continues ``trace`` (a W3C ``traceparent``; a
        malformed one is ignored), by default the caller's current span.
        ``request_id``: an idempotency key (1 to 255 characters; else
        ``RejectedInputError`` naming it): a send repeated with the same key
        while the first message is in the Main's inbox (accepted, its cycle
        not yet run; across a restart too) queues nothing and gets the
        first's answer."""
        return self._call(self._send_request(session_id, message, trace, request_id))

    def wait(self, session_id: SessionIdLike, timeout: float | None = None) -> SessionResult | None:
        """The session's result once it ends; None if ``timeout`` real seconds
        pass first; ``UnknownSessionError`` for an unknown id."""
        sid = as_session_id(session_id)
        reply = Reply()
        self._send(AwaitResult(sid), reply)
        try:
            return reply.get(1e9 if timeout is None else timeout)  # type: ignore[no-any-return]
        except AskTimeoutError:
            return None
        finally:
            if not reply.done:
                self._tell(Call(ForgetWaiter(sid, reply)))

    def result(self, session_id: SessionIdLike) -> SessionResult | None:
        """The session's result if it has ended, else None (never waits);
        ``UnknownSessionError`` for an unknown id."""
        return self._call(GetResult(as_session_id(session_id)), check=False)

    def results(self, session_id: SessionIdLike) -> list[SessionResult]:
        """The child results a session has received (most recent ones);
        ``UnknownSessionError`` for an unknown id."""
        return self._call(GetResults(as_session_id(session_id)), check=False)

    def spending(self, session_id: SessionIdLike) -> Spending:
        """A session's accounts (a ``Spending``): what its own model calls and
        its subtree spent, what calls in flight hold, its budget and what is
        left of it (a Main's: this message cycle's), whether it was clamped
        and the dimension it ran out in. A session that has ended reports its
        result's usage. ``UnknownSessionError`` for an unknown id."""
        return self._call(GetSpending(as_session_id(session_id)), check=False)

    async def amain(self, agent_id: str, key: str = "internal:main:main") -> SessionRef:
        """Awaitable ``main``."""
        sid = await self._acall(OpenMain(agent_id, key))
        return SessionRef(self, sid)

    async def aspawn(
        self, parent: SessionIdLike, spec: SpawnSpec | None = None, /, **fields: Any
    ) -> Spawned:
        """Awaitable ``spawn``."""
        sid = as_session_id(parent, "parent")
        (made,) = await self._aforked(sid, (self._traced(make_spec(spec, **fields)),))
        return self._spawned(await self._acall(Spawn(sid, made)))

    async def aspawn_many(self, parent: SessionIdLike, specs: Iterable[SpawnSpec]) -> list[Spawned]:
        """Awaitable ``spawn_many``."""
        sid = as_session_id(parent, "parent")
        batch = await self._aforked(sid, self._traced_batch(specs))
        return self._all_spawned(await self._acall(SpawnMany(sid, batch)))

    async def arun(
        self,
        parent: SessionIdLike,
        spec: SpawnSpec | None = None,
        /,
        timeout: float | None = None,
        **fields: Any,
    ) -> SessionResult:
        """Awaitable ``run``."""
        reply = self._send_run(parent, spec, timeout, fields)
        return _ran(await reply.get_async(_FOREVER))

    async def aget(self, session_id: SessionIdLike) -> SessionInfo:
        """Awaitable ``get``."""
        return await self._acall(GetInfo(as_session_id(session_id)), check=False)

    async def acancel(
        self, session_id: SessionIdLike, grace: float | None = None, *, reason: str | None = None
    ) -> ErrorInfo | None:
        """Awaitable ``cancel``."""
        request = Cancel(as_session_id(session_id), as_grace(grace), as_reason(reason))
        return await self._acall(request)

    async def aterminate(
        self, session_id: SessionIdLike, *, reason: str | None = None
    ) -> ErrorInfo | None:
        """Awaitable ``terminate``."""
        return await self.acancel(session_id, 0.0, reason=reason)

    async def asuspend(self, session_id: SessionIdLike) -> ErrorInfo | None:
        """Awaitable ``suspend``."""
        return await self._acall(Suspend(as_session_id(session_id)))

    async def aresume(self, session_id: SessionIdLike) -> ErrorInfo | None:
        """Awaitable ``resume``."""
        return await self._acall(Resume(as_session_id(session_id)))

    async def asend(
        self,
        session_id: SessionIdLike,
        message: Any,
        *,
        trace: str | None = None,
        request_id: str | None = None,
    ) -> ErrorInfo | None:
        """Awaitable ``send``."""
        return await self._acall(self._send_request(session_id, message, trace, request_id))

    async def await_result(
        self, session_id: SessionIdLike, timeout: float | None = None
    ) -> SessionResult | None:
        """Awaitable ``wait``."""
        sid = as_session_id(session_id)
        reply = Reply()
        self._send(AwaitResult(sid), reply)
        try:
            return await reply.get_async(1e9 if timeout is None else timeout)  # type: ignore[no-any-return]
        except AskTimeoutError:
            return None
        finally:
            if not reply.done:  # timed out or cancelled: the Cortex forgets the waiter
                self._tell(Call(ForgetWaiter(sid, reply)))

    async def aresult(self, session_id: SessionIdLike) -> SessionResult | None:
        """Awaitable ``result``: the result if the session has ended, else None."""
        return await self._acall(GetResult(as_session_id(session_id)), check=False)

    async def aresults(self, session_id: SessionIdLike) -> list[SessionResult]:
        """Awaitable ``results``."""
        return await self._acall(GetResults(as_session_id(session_id)), check=False)

    async def aspending(self, session_id: SessionIdLike) -> Spending:
        """Awaitable ``spending``."""
        return await self._acall(GetSpending(as_session_id(session_id)), check=False)
