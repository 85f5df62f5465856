"""The node's async core: the line to the Cortex, the operations on one
session, and the node's life.

``NodeCore`` holds the node's state machine (open → closing → closed, or
failed), the calls that carry a typed request to the Cortex and bring its
answer back (``_acall``, which every operation awaits, and its blocking
face ``_call`` for a skill's thread and the shutdown; ``_tell`` for a
message that wants no answer), the operations on one session (open a Main,
spawn, run, read, cancel, suspend, resume, send, wait) that ``Node`` and
``SessionRef`` offer, what the runtime reports back (a fatal error, a failed
Cortex), and the shutdown.

Each operation is written once, awaitable (``a``-prefixed), waiting for the
Cortex only through ``_faces.answer``; its blocking face is derived
(``_faces.blocking``) and runs it on the calling thread. ``Node`` (in
``_node``), the one class built on this, sets the state declared here and
adds the node-wide reads, the input from outside and the groups of the
rest of its surface; the node's parts (its groups, the host, routing)
stand on this class, so no module below ``_node`` needs ``Node`` itself.
"""

from __future__ import annotations

import logging
import sys
import threading
import uuid
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec
import pykka

from sessiontree.actors import AskTimeoutError, Clock, RealClock
from sessiontree.actors.runtime import Activity, Reply, handle_now, post, refuse_blocking
from sessiontree.conversations import Conversations
from sessiontree.protocol import (
    ErrorInfo,
    NodeClosedError,
    SessionInfo,
    SessionResult,
    SlotFrozenError,
    SpawnSpec,
    Spending,
    check_message,
    check_request_id,
    make_spec,
    parse_traceparent,
    slot_for,
    slot_of,
    spawn_batch,
)
from sessiontree.store import Store
from sessiontree.supervision._assembly import NodeParts
from sessiontree.supervision._closing import settle
from sessiontree.supervision._config import NodeConfig
from sessiontree.supervision._entry import SpawnAnswer
from sessiontree.supervision._exits import CtrlC, forget_at_exit, say
from sessiontree.supervision._faces import answer, blocking, offloaded, run_blocking
from sessiontree.supervision._gc import release_gc
from sessiontree.supervision._memory import MemorySpace
from sessiontree.supervision._model_calls import ModelCalls
from sessiontree.supervision._refs import (
    SessionIdLike,
    SessionRef,
    Spawned,
    as_grace,
    as_reason,
    as_run_timeout,
    as_session_id,
    refused_result,
)
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
    Request,
    Resume,
    Run,
    Send,
    ShutdownDeadline,
    Spawn,
    SpawnMany,
    Suspend,
)
from sessiontree.supervision._retry import Restarts
from sessiontree.supervision._runtime import Runtime
from sessiontree.supervision._trace_context import caller_traceparent

__all__ = ["NodeCore"]

log = logging.getLogger("sessiontree.node")

# A shutdown's timeout bounds real time whatever clock the node runs on (a
# virtual one included); read through the one real clock (no timer is started).
_REAL = RealClock()
_FOREVER = 1e9  # real seconds: a wait bounded only by the session's end

T = TypeVar("T")


class NodeCore:
    """The async core of a ``Node`` (which sets what is declared here): the
    line to the Cortex, the operations on one session, the lifecycle."""

    config: NodeConfig
    clock: Clock
    activity: Activity
    failure: BaseException | None
    fatal_error: BaseException | None
    final_sessions: list[SessionInfo]
    rejected_input: int
    memory: MemorySpace
    store: Store | None
    conversations: Conversations
    _restarts: Restarts
    _runtime: Runtime
    _parts: NodeParts
    _model_calls: ModelCalls
    _cortex: pykka.ActorRef[Any]
    _state: str  # "open", "closing", "closed"
    _forced: bool
    _stopped: threading.Event
    _state_lock: threading.Lock
    _ctrl_c_seen: int
    frozen_slots: set[int]

    def _init_lifecycle(self) -> None:
        """The state of a node that has not started its Cortex yet."""
        self.fatal_error = None
        self.failure = None
        self.final_sessions = []
        self.rejected_input = 0
        self._state = "open"
        self._forced = False
        self._stopped = threading.Event()
        self._state_lock = threading.Lock()
        self._ctrl_c_seen = 0  # the Ctrl-Cs a shutdown has acted on
        self.frozen_slots: set[int] = set()  # refusing new input (``node.slots.freeze``)

    # -- the line to the Cortex -----------------------------------------------------

    def _check_open(self) -> None:
        if self.failure is not None:
            msg = f"node failed: {self.failure!r}"
            raise NodeClosedError(msg)
        if self._state != "open":
            msg = f"node is {self._state}"
            raise NodeClosedError(msg)

    def _tell(self, message: object) -> None:
        # On the loop's own thread with the Cortex idle, handled at once (no turn).
        if handle_now(self._cortex, message):
            return
        if not post(self._cortex, message, self.activity):
            log.warning("cortex is gone; dropped %s", type(message).__name__)

    def _send(self, request: Request[Any], reply: Reply) -> None:
        call = Call(request, reply)
        if handle_now(self._cortex, call):
            return
        if not post(self._cortex, call, self.activity):
            msg = "the cortex is not running"
            raise NodeClosedError(msg)

    async def _acall(
        self, request: Request[T], *, timeout: float | None = None, check: bool = True
    ) -> T:
        """Ask the Cortex ``request`` and wait for its answer (``check``: refuse
        first if the node is closed). Raises what the Cortex failed the request
        with, ``NodeClosedError`` if it is gone, ``AskTimeoutError`` past
        ``timeout`` (default ``config.ask_timeout``)."""
        if check:
            self._check_open()
        reply = Reply()
        self._send(request, reply)
        got: T = await answer(reply, self.config.ask_timeout if timeout is None else timeout)
        return got

    def _call(self, request: Request[T], *, timeout: float | None = None, check: bool = True) -> T:
        """``_acall`` on the calling thread (a skill's, the shutdown's): a
        blocking ask, ``DeadlockError`` where one is refused."""
        return run_blocking(self._acall(request, timeout=timeout, check=check))

    def _on_fatal(self, error: BaseException) -> None:
        """A KeyboardInterrupt/SystemExit inside the runtime: shut down in order."""
        if self.fatal_error is not None:
            return
        self.fatal_error = error
        log.critical("%r inside the runtime; shutting the node down", error)
        threading.Thread(target=self.shutdown, name="sessiontree-fatal", daemon=True).start()

    def _on_failed(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
            log.critical("the cortex failed (%r); the node refuses all further work", error)

    # -- slots moved away or being moved (``node.slots``) ------------------------------

    def _here(self, value: object, argument: str = "session_id", *, new: bool = False) -> uuid.UUID:
        """``as_session_id``, then ``SlotMovedError`` for a session of a slot the
        store released, and (``new``: new input for it) ``SlotFrozenError``
        for one of a slot being moved."""
        sid = as_session_id(value, argument)
        slot = slot_of(sid)
        if slot is None:
            return sid
        if self.store is not None:
            self.store.slots.check_here(slot, sid)
        if new and slot in self.frozen_slots:
            msg = f"session {sid} is in slot {slot}, which is frozen to move; try again later"
            raise SlotFrozenError(msg, slot=slot, session_id=sid)
        return sid

    def _key_here(self, agent_id: str, key: str) -> None:
        """For a Main by key: as ``_here``, for the slot of (agent, key), unless
        the store holds an unslotted Main for it (made before slots: it stays)."""
        if not isinstance(agent_id, str) or not isinstance(key, str):
            return  # OpenMain names the bad argument
        slot = slot_for(agent_id, key)
        store = self.store
        moved = store is not None and store.slots.moved(slot) is not None
        if not moved and slot not in self.frozen_slots:
            return
        held = store.main_of(agent_id, key) if store is not None else None
        if held is not None and slot_of(held) is None:
            return
        if store is not None:
            store.slots.check_here(slot)
        msg = f"Main {agent_id} {key} is in slot {slot}, which is frozen to move; try again later"
        raise SlotFrozenError(msg, slot=slot)

    def _count_rejected(self) -> None:
        with self._state_lock:
            self.rejected_input += 1

    # -- one session: open, spawn, run, read, control -----------------------------
    # Each is written once, awaitable; its blocking face follows it (``blocking``).

    async def amain(self, agent_id: str, key: str = "internal:main:main") -> SessionRef:
        """The one Main of ``agent_id`` for session ``key`` (created on first use).

        Raises ``RejectedInputError`` for an unknown agent or a malformed key,
        ``SlotMovedError`` when the key's slot moved to another node,
        ``SlotFrozenError`` while it is frozen to move.
        """
        self._key_here(agent_id, key)
        session_id: uuid.UUID = await self._acall(OpenMain(agent_id, key))
        return SessionRef(self, session_id)

    main = blocking(amain)

    async def aspawn(
        self, parent: SessionIdLike, spec: SpawnSpec | None = None, /, **fields: Any
    ) -> Spawned:
        """Spawn a child of ``parent``; a refused spawn (an unknown parent, a
        limit, an unknown skill…) comes back as ``Spawned.error``.
        ``RejectedInputError`` for a ``parent`` that is not a session id or a
        spec that does not build."""
        sid = self._here(parent, "parent", new=True)
        (made,) = await self._forked(sid, (self._traced(make_spec(spec, **fields)),))
        return self._spawned(await self._acall(Spawn(sid, made)))

    spawn = blocking(aspawn)

    async def aspawn_many(self, parent: SessionIdLike, specs: Iterable[SpawnSpec]) -> list[Spawned]:
        """Spawn a batch of children of ``parent`` in one turn of the Cortex, their
        records in one commit: one ``Spawned`` per spec, in order. Each spec is
        checked as ``spawn`` checks it (a refused one does not stop the rest);
        ``RejectedInputError`` naming the field for a spec that is not a
        ``SpawnSpec`` or a ``parent`` that is not a session id. The batched
        path for spawning thousands at once."""
        sid = self._here(parent, "parent", new=True)
        batch = await self._forked(sid, self._traced_batch(specs))
        return self._all_spawned(await self._acall(SpawnMany(sid, batch)))

    spawn_many = blocking(aspawn_many)

    async def arun(
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
        sid = self._here(parent, "parent", new=True)
        seconds = as_run_timeout(timeout)
        (made,) = await self._forked(sid, (self._traced(make_spec(spec, **fields)),))
        self._check_open()
        reply = Reply()
        self._send(Run(sid, made, seconds), reply)
        ran: SessionResult | ErrorInfo = await answer(reply, _FOREVER)
        return refused_result(ran) if isinstance(ran, ErrorInfo) else ran

    run = blocking(arun)

    async def aget(self, session_id: SessionIdLike) -> SessionInfo:
        """Identity and state; ``UnknownSessionError`` for an id the node does not hold."""
        return await self._acall(GetInfo(self._here(session_id)), check=False)

    get = blocking(aget)

    async def acancel(
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
        request = Cancel(self._here(session_id), as_grace(grace), as_reason(reason))
        return await self._acall(request)

    cancel = blocking(acancel)

    async def aterminate(
        self, session_id: SessionIdLike, *, reason: str | None = None
    ) -> ErrorInfo | None:
        """``cancel`` with no grace: the subtree ends ``cancelled`` at once,
        ``terminated_by_force`` for every session that still ran."""
        return await self.acancel(session_id, 0.0, reason=reason)

    terminate = blocking(aterminate)

    async def asuspend(self, session_id: SessionIdLike) -> ErrorInfo | None:
        """Park a Branch at its next checkpoint; ``invalid_transition`` for other
        kinds or a Branch not active; ``UnknownSessionError`` for an unknown id."""
        return await self._acall(Suspend(self._here(session_id)))

    suspend = blocking(asuspend)

    async def aresume(self, session_id: SessionIdLike) -> ErrorInfo | None:
        """Resume a suspended Branch; ``invalid_transition`` if it is not suspended;
        ``UnknownSessionError`` for an unknown id; ``SlotFrozenError`` while its
        slot is frozen to move (``node.slots.unfreeze`` resumes what it parked)."""
        return await self._acall(Resume(self._here(session_id, new=True)))

    resume = blocking(aresume)

    async def asend(
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
        check_message(message)
        check_request_id(request_id)
        if self.config.tracing is not None:
            trace = caller_traceparent() if trace is None else parse_traceparent(trace)
        else:
            trace = None
        send = Send(self._here(session_id, new=True), message, trace=trace, request_id=request_id)
        return await self._acall(send)

    send = blocking(asend)

    async def await_result(
        self, session_id: SessionIdLike, timeout: float | None = None
    ) -> SessionResult | None:
        """The session's result once it ends; None if ``timeout`` real seconds
        pass first; ``UnknownSessionError`` for an unknown id."""
        sid = self._here(session_id)
        reply = Reply()
        self._send(AwaitResult(sid), reply)
        try:
            return await answer(reply, _FOREVER if timeout is None else timeout)  # type: ignore[no-any-return]
        except AskTimeoutError:
            return None
        finally:
            if not reply.done:  # timed out or cancelled: the Cortex forgets the waiter
                self._tell(Call(ForgetWaiter(sid, reply)))

    wait = blocking(await_result)

    async def aresult(self, session_id: SessionIdLike) -> SessionResult | None:
        """The session's result if it has ended, else None (never waits);
        ``UnknownSessionError`` for an unknown id."""
        return await self._acall(GetResult(self._here(session_id)), check=False)

    result = blocking(aresult)

    async def aresults(self, session_id: SessionIdLike) -> list[SessionResult]:
        """The child results a session has received (most recent ones);
        ``UnknownSessionError`` for an unknown id."""
        return await self._acall(GetResults(self._here(session_id)), check=False)

    results = blocking(aresults)

    async def aspending(self, session_id: SessionIdLike) -> Spending:
        """A session's accounts (a ``Spending``): what its own model calls and
        its subtree spent, what calls in flight hold, its budget and what is
        left of it (a Main's: this message cycle's), whether it was clamped
        and the dimension it ran out in. A session that has ended reports its
        result's usage. ``UnknownSessionError`` for an unknown id."""
        return await self._acall(GetSpending(self._here(session_id)), check=False)

    spending = blocking(aspending)

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

    async def _forked(
        self, parent: uuid.UUID, specs: tuple[SpawnSpec, ...]
    ) -> tuple[SpawnSpec, ...]:
        """``specs`` with their fork points: each one named is checked against
        ``parent``'s conversation (``ConversationError`` naming ``fork_at``:
        nothing is spawned); see ``Contexts.outside_fork_points`` for the rest."""
        if any(spec.fork_at is not None for spec in specs):
            info = await self._acall(GetInfo(parent), check=False)
            for spec in specs:
                if spec.fork_at is not None:
                    self._parts.contexts.fork_point(info, spec)
        return self._parts.contexts.outside_fork_points(parent, specs)

    # -- the lifecycle ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once a shutdown began or the node failed."""
        return self._state != "open" or self.failure is not None

    # -- shutdown -----------------------------------------------------------------------

    def shutdown(self, grace: float | None = None, timeout: float | None = None) -> None:
        """Stop the node (the README's Execution model, "Shutdown"): Mains kept,
        running Branches suspended within the grace, Workers cancelled with grace
        (their parents told); then every actor, the executor and the loop stop. Idempotent.

        ``grace`` defaults to ``config.grace`` on the node's clock; ``timeout``
        bounds the real time spent waiting (default: grace + 5 s with the real
        clock, 5 s with another) — past it, what has not settled is forced.
        When it has sessions to wait for it says so, with the grace, on the
        ``sessiontree.node`` logger (WARNING when a Ctrl-C brought it, INFO
        else; on stderr when logging is not set up). Run on the main thread
        while SIGINT has Python's default handler, a Ctrl-C during it ends
        the grace at once (``force_shutdown``) instead of raising
        ``KeyboardInterrupt`` (see ``_exits``); the handler is put back after.
        Never raises for a Cortex that is gone or failed: what can be released
        is released, and a store that cannot be flushed is logged. Raises
        ``DeadlockError`` on the node's event loop, where it could never end
        (``await node.ashutdown()`` there).
        """
        interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        self._shutdown(grace, timeout, "interrupt" if interrupted else None)

    ashutdown = offloaded(shutdown)

    def _shutdown(self, grace: float | None, timeout: float | None, why: str | None) -> None:
        """``shutdown``; ``why``: "interrupt" (a Ctrl-C brought it), "exit" (the
        interpreter exits and nobody called it) or None."""
        refuse_blocking()  # on the node's loop (or in a handler) it could never end
        with self._state_lock:
            if self._state != "open":
                return
            self._state = "closing"
        grace = self.config.grace if grace is None else grace
        if timeout is None:
            timeout = grace + 5.0 if isinstance(self.clock, RealClock) else 5.0
        with CtrlC() as ctrl_c:
            try:
                if self.failure is None:
                    settle(self, grace, timeout, why, ctrl_c)
            except NodeClosedError:
                pass
            finally:
                forget_at_exit(id(self))
                self._cortex.stop(block=False)
                self._parts.close()
                if self.config.gc_tuning:
                    release_gc()
                self._state = "closed"
                self._stopped.set()

    def _shut_down_at_exit(self) -> None:
        """The interpreter exits and this node is still open: shut it down (see
        ``_exits``), with the grace on a real clock, at once on another. Not a
        node started on an application's loop that has ended (``astart``):
        nothing would answer the shutdown there."""
        adopted = self._parts.adopt
        if adopted is not None and not adopted.is_running():
            say(
                logging.WARNING,
                "a node started on an event loop that has ended was not shut down "
                "(await node.ashutdown() before the loop ends)",
            )
            return
        # A clock that does not move by itself (a VirtualClock) has nobody left to
        # move it: a grace on it would only wait out the timeout.
        grace = None if isinstance(self.clock, RealClock) else 0.0
        self._shutdown(grace, None, "exit")

    def force_shutdown(self) -> None:
        """Cut a shutdown short: what still runs is forced now (the second
        signal of a standalone node). Called before ``shutdown`` began, the
        shutdown forces at once when it does; after it ended, does nothing."""
        with self._state_lock:
            self._forced = True
            closing = self._state == "closing"
        if closing and self.failure is None:
            self._force_now()

    def _force_now(self) -> None:
        try:
            self._call(ShutdownDeadline(), check=False, timeout=5.0)
        except (NodeClosedError, AskTimeoutError) as exc:
            log.warning("could not force the shutdown: %r", exc)

    def wait_closed(self, timeout: float) -> bool:
        """Block until a shutdown (asked for, or after a fatal error) has finished."""
        return self._stopped.wait(timeout)
