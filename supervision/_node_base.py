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
import sys
import threading
from types import TracebackType
from typing import Any, Self, TypeVar

import pykka

from sessiontree.actors import AskTimeoutError, Clock, RealClock
from sessiontree.actors.runtime import Activity, Reply, post, refuse_blocking
from sessiontree.conversations import Conversations
from sessiontree.protocol import NodeClosedError, SessionInfo
from sessiontree.supervision._assembly import NodeParts
from sessiontree.supervision._config import NodeConfig
from sessiontree.supervision._exits import CtrlC, Interrupted, forget_at_exit, say
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
    ShutdownPending,
    StopAll,
)
from sessiontree.supervision._retry import Restarts
from sessiontree.supervision._runtime import Runtime

__all__ = ["NodeBase"]

log = logging.getLogger("sessiontree.node")

_CTRL_C_POLL = 0.1  # real seconds between looks at a Ctrl-C while a shutdown waits
_AFTER_CTRL_C = 1.0  # real seconds a forced shutdown still waits for what it let go
# A shutdown's timeout bounds real time whatever clock the node runs on (a
# virtual one included); read through the one real clock (no timer is started).
_REAL = RealClock()

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
    _ctrl_c_seen: int

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
                    self._settle(grace, timeout, why, ctrl_c)
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

    def _settle(self, grace: float, timeout: float, why: str | None, ctrl_c: CtrlC) -> None:
        """The Cortex's part of a shutdown: settle the tree (within ``grace``,
        ``timeout`` real seconds at most, less after a Ctrl-C), let the skills
        still running go, stop every actor."""
        reply = Reply()
        self._send(BeginShutdown(grace), reply)
        if self._forced:  # force_shutdown came first
            self._force_now()
        elif not reply.done:
            self._announce(grace, why, ctrl_c)
        if not self._wait(reply, timeout, ctrl_c):
            log.warning("shutdown did not settle in %.1f s; forcing", timeout)
            self._call(ShutdownDeadline(), check=False)
            self._call(ForceWorkers(), check=False)
        self.final_sessions = self._call(ListSessions(), check=False)
        # Let the running skills go (``Cancelled`` with ``node_closed`` at their
        # checkpoint) and wait for those held at a checkpoint to end, so no
        # thread is left blocked behind a closed node.
        released = Reply()
        self._send(ReleaseParked(), released)
        if not self._wait(released, timeout, ctrl_c):
            log.warning("a skill let go at shutdown did not return in time")
        self._call(StopAll(), check=False)

    def _announce(self, grace: float, why: str | None, ctrl_c: CtrlC) -> None:
        """Say what the shutdown waits for and how long (nothing if for nothing)."""
        pending = self._call(ShutdownPending(), check=False)
        if not pending:
            return
        sessions = "1 session" if pending == 1 else f"{pending} sessions"
        when = " at exit (shutdown() was not called)" if why == "exit" else ""
        line = f"shutting down{when}: waiting up to {grace:g} s for {sessions} to wrap up"
        if ctrl_c.installed:
            line += "; Ctrl-C again to stop now" if why == "interrupt" else "; Ctrl-C to stop now"
        say(logging.WARNING if why else logging.INFO, line)

    def _wait(self, reply: Reply, timeout: float, ctrl_c: CtrlC) -> bool:
        """Wait up to ``timeout`` real seconds for ``reply`` (raising what it
        failed with); False if it did not come. A Ctrl-C meanwhile (``ctrl_c``
        installed: it is looked at every ``_CTRL_C_POLL`` s) forces the
        shutdown, and the wait goes on for ``_AFTER_CTRL_C`` s at most."""
        if self._ctrl_c_seen:  # forced by a Ctrl-C already: what is left is quick
            timeout = min(timeout, _AFTER_CTRL_C)
        deadline = _REAL.monotonic() + timeout
        while True:
            left = deadline - _REAL.monotonic()
            if left <= 0:
                return reply.done
            try:
                reply.get(min(left, _CTRL_C_POLL) if ctrl_c.installed else left)
            except AskTimeoutError:
                pass
            else:
                return True
            if ctrl_c.count > self._ctrl_c_seen:
                self._ctrl_c_seen = ctrl_c.count
                if not self._forced:
                    say(logging.WARNING, "stopping now: what still runs ends by force")
                    self._forced = True
                    self._force_now()
                deadline = min(deadline, _REAL.monotonic() + _AFTER_CTRL_C)

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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Shut the node down. A ``KeyboardInterrupt`` leaving the block goes on
        as ``Interrupted`` (still a ``KeyboardInterrupt``; uncaught, the program
        exits 130 without a traceback)."""
        interrupted = isinstance(exc, KeyboardInterrupt)
        self._shutdown(None, None, "interrupt" if interrupted else None)
        if interrupted and not isinstance(exc, Interrupted):
            raise Interrupted from exc

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ashutdown()
