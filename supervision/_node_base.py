"""What every ``Node`` method stands on: the line to the Cortex, and the node's life.

``NodeBase`` holds the node's state machine (open → closing → closed, or
failed), the calls that carry a typed request to the Cortex and bring its
answer back (``_call`` and its awaitable ``_acall``; ``_tell`` for a message
that wants no answer), what the runtime reports back (a fatal error, a
failed Cortex), and the shutdown. ``Node`` (in ``_node``) builds the state it
declares and adds the public methods.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Self, TypeVar

import pykka

from sessiontree.actors import AskTimeoutError, Clock, RealClock
from sessiontree.actors.runtime import Activity, Reply, post, refuse_blocking
from sessiontree.conversations import Conversations
from sessiontree.protocol import NodeClosedError, SessionInfo
from sessiontree.supervision._assembly import NodeParts
from sessiontree.supervision._config import NodeConfig
from sessiontree.supervision._gc import release_gc
from sessiontree.supervision._memory import MemorySpace
from sessiontree.supervision._model_calls import ModelCalls
from sessiontree.supervision._requests import (
    BeginShutdown,
    Call,
    ForceWorkers,
    ListSessions,
    ReleaseParked,
    Request,
    ShutdownDeadline,
    StopAll,
)
from sessiontree.supervision._retry import Restarts
from sessiontree.supervision._runtime import Runtime

__all__ = ["NodeBase"]

log = logging.getLogger("sessiontree.node")

T = TypeVar("T")


class NodeBase:
    """The plumbing and the lifecycle of a ``Node`` (which sets what is declared here)."""

    config: NodeConfig
    clock: Clock
    activity: Activity
    failure: BaseException | None
    fatal_error: BaseException | None
    final_sessions: list[SessionInfo]
    rejected_input: int
    memory: MemorySpace
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

    # -- the line to the Cortex -----------------------------------------------------

    def _check_open(self) -> None:
        if self.failure is not None:
            msg = f"node failed: {self.failure!r}"
            raise NodeClosedError(msg)
        if self._state != "open":
            msg = f"node is {self._state}"
            raise NodeClosedError(msg)

    def _tell(self, message: object) -> None:
        if not post(self._cortex, message, self.activity):
            log.warning("cortex is gone; dropped %s", type(message).__name__)

    def _send(self, request: Request[Any], reply: Reply) -> None:
        if not post(self._cortex, Call(request, reply), self.activity):
            msg = "the cortex is not running"
            raise NodeClosedError(msg)

    def _call(self, request: Request[T], *, timeout: float | None = None, check: bool = True) -> T:
        """Ask the Cortex ``request`` and wait for its answer (``check``: refuse
        first if the node is closed). Raises what the Cortex failed the request
        with, ``NodeClosedError`` if it is gone, ``AskTimeoutError`` past ``timeout``."""
        if check:
            self._check_open()
        reply = Reply()
        self._send(request, reply)
        answer: T = reply.get(self.config.ask_timeout if timeout is None else timeout)
        return answer

    async def _acall(self, request: Request[T], *, check: bool = True) -> T:
        """Awaitable ``_call``."""
        if check:
            self._check_open()
        reply = Reply()
        self._send(request, reply)
        answer: T = await reply.get_async(self.config.ask_timeout)
        return answer

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

    def _count_rejected(self) -> None:
        with self._state_lock:
            self.rejected_input += 1

    # -- the lifecycle ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once a shutdown began or the node failed."""
        return self._state != "open" or self.failure is not None

    async def ashutdown(self, grace: float | None = None, timeout: float | None = None) -> None:
        """Awaitable ``shutdown``."""
        await asyncio.to_thread(self.shutdown, grace, timeout)

    # -- shutdown -----------------------------------------------------------------------

    def shutdown(self, grace: float | None = None, timeout: float | None = None) -> None:
        """Stop the node as DESIGN.md §3 says: Mains kept, running Branches suspended
        within the grace, Workers cancelled with grace (their parents told); then
        every actor, the executor and the loop stop. Idempotent.

        ``grace`` defaults to ``config.grace`` on the node's clock; ``timeout``
        bounds the real time spent waiting (default: grace + 5 s with the real
        clock, 5 s with another) — past it, what has not settled is forced.
        Never raises for a Cortex that is gone or failed: what can be released
        is released, and a store that cannot be flushed is logged. Raises
        ``DeadlockError`` on the node's event loop, where it could never end
        (``await node.ashutdown()`` there).
        """
        refuse_blocking()  # on the node's loop (or in a handler) it could never end
        with self._state_lock:
            if self._state != "open":
                return
            self._state = "closing"
        grace = self.config.grace if grace is None else grace
        if timeout is None:
            timeout = grace + 5.0 if isinstance(self.clock, RealClock) else 5.0
        try:
            if self.failure is None:
                reply = Reply()
                self._send(BeginShutdown(grace), reply)
                if self._forced:  # force_shutdown came first
                    self._force_now()
                try:
                    reply.get(timeout)
                except AskTimeoutError:
                    log.warning("shutdown did not settle in %.1f s; forcing", timeout)
                    self._call(ShutdownDeadline(), check=False)
                    self._call(ForceWorkers(), check=False)
                self.final_sessions = self._call(ListSessions(), check=False)
                self._release_parked(timeout)
                self._call(StopAll(), check=False)
        except NodeClosedError:
            pass
        finally:
            self._cortex.stop(block=False)
            self._parts.close()
            if self.config.gc_tuning:
                release_gc()
            self._state = "closed"
            self._stopped.set()

    def _release_parked(self, timeout: float) -> None:
        """Let the running skills go (``Cancelled`` with ``node_closed`` at their
        checkpoint) and wait up to ``timeout`` real seconds for those held at a
        checkpoint to end, so no thread is left blocked behind a closed node."""
        try:
            self._call(ReleaseParked(), check=False, timeout=timeout)
        except AskTimeoutError:
            log.warning("a skill let go at shutdown did not return in %.1f s", timeout)

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ashutdown()
