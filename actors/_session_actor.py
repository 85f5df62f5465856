"""The session actor: a Main's mailbox, never running skill code.

It takes what the Cortex tells it — a Main's inbound messages and child
results, its cancel, forced termination, its stop — and hands its message
cycles to the step executor or the event loop (``start_run``). A Branch or
Worker has no actor: the Cortex starts its one run itself and sets its
cancel, suspend and fence straight on the session's shared state, so a
skill blocked for minutes in a model call never delays them.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessiontree.actors._activity import Activity
from sessiontree.actors._async_session import AsyncSession
from sessiontree.actors._core import CycleInput, SessionCore
from sessiontree.actors._execution import (
    EventLoopThread,
    StepExecutor,
    crash_info,
    finish_run,
    is_async_skill,
    refuse_run,
    run_async,
    run_sync,
    store_refused,
)
from sessiontree.actors._host import RunEnd, SessionHost
from sessiontree.actors._mailbox import Counted, drain_inbox, handler_scope
from sessiontree.actors._session import Session
from sessiontree.actors.backends._runner import run_remote
from sessiontree.protocol import ErrorCode, ErrorInfo, SessionKind, SessionResult

__all__ = [
    "CancelSignal",
    "CycleDone",
    "CycleRefused",
    "Deliver",
    "ForceStop",
    "Inbound",
    "Inspect",
    "Passivate",
    "RetryCycle",
    "SessionActorLogic",
    "StopSession",
    "start_run",
]

log = logging.getLogger("sessiontree.session")


@dataclass(frozen=True, slots=True)
class Inbound:
    """An inbound message for a Main: queued, then one message cycle. ``seq``
    numbers it in the Main's stored inbox (None without a store); ``attempt``:
    which run of it this is (more than 1 after crashes cut runs off). On a
    traced node ``trace`` is the caller's span (the cycle's span continues it)
    and ``cut_off`` the span of the run a crash cut off (the cycle's links to it).
    ``id``: the message's identity, given when it was accepted and kept across
    restarts (the cycle's conversation appends are keyed by it); ``fresh``: no
    run of it can have written anything yet (see ``CycleInput``)."""

    message: Any
    seq: int | None = None
    attempt: int = 1
    trace: str | None = None
    cut_off: str | None = None
    id: uuid.UUID | None = None
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class Deliver:
    """A child's result, already filed on the session: a Main runs a cycle for it
    (``attempt``, ``cut_off``, ``fresh``: as for ``Inbound``; ``trace``: the
    child's span, which the cycle's span continues)."""

    result: SessionResult
    attempt: int = 1
    trace: str | None = None
    cut_off: str | None = None
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class CancelSignal:
    """Cancellation was requested; ``code`` says why."""

    code: ErrorCode


@dataclass(frozen=True, slots=True)
class ForceStop:
    """The session ended under its running skill (already fenced by the Cortex):
    drop queued input and cancel an async skill's task."""


@dataclass(frozen=True, slots=True)
class Inspect:
    """Run ``probe(core)`` on the actor's thread and answer with its value (an ask).

    An exception the probe raises is answered to the asker; the session
    keeps running.
    """

    probe: Callable[[SessionCore], Any]


@dataclass(frozen=True, slots=True)
class Passivate:
    """May this Main be passivated? ``done(mark)`` answers yes (``mark`` passed
    back as given) when nothing is queued and no cycle runs, ``done(None)`` no.
    The actor keeps running either way; the Cortex decides and stops it."""

    mark: int
    done: Callable[[int | None], None]


@dataclass(frozen=True, slots=True)
class StopSession:
    """The session ended: stop this actor (after what is already queued)."""


@dataclass(frozen=True, slots=True)
class CycleDone:
    """A Main's message cycle ended; start the next one if any is queued."""


@dataclass(frozen=True, slots=True)
class CycleRefused:
    """The store refused a write of the Main's cycle: its message or result is
    not consumed. It goes back to the front of the queue (a result back among
    the unclaimed) and no cycle starts until ``RetryCycle``."""


@dataclass(frozen=True, slots=True)
class RetryCycle:
    """Start cycles again after a ``CycleRefused`` (the store may take writes)."""


class SessionActorLogic:
    """Message handling of a session actor; made a ``LoopActor`` by ``actor_class``.

    Handlers run on the node's event loop, one at a time; a handler that
    raises is logged and counted, never fatal to the actor. A
    ``KeyboardInterrupt``/``SystemExit`` in a handler is handed to ``on_fatal``
    (the node shuts down in order) instead of pykka's ``stop_all``.
    """

    #: A session actor has no ``on_start``: it takes a turn of the loop only
    #: once it has a message (see ``LoopActor.start_on_first_message``).
    start_on_first_message = True

    def __init__(
        self,
        core: SessionCore,
        host: SessionHost,
        skill: Callable[[Any], Any],
        is_async: bool,
        executor: StepExecutor,
        loop: Callable[[], EventLoopThread],
        activity: Activity,
        on_rejected: Callable[[object], None],
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self.core = core  # before the base's __init__: the actor's URN reads it
        super().__init__()
        self.host = host
        self.skill = skill
        self.is_async = is_async
        self.executor = executor
        self.loop = loop
        self.activity = activity
        self.on_rejected = on_rejected
        self.on_fatal = on_fatal
        self.inputs: collections.deque[Any] = collections.deque()
        self.cycle_running = False
        self.cycles = 0
        self.current: Inbound | Deliver | None = None  # what the running cycle runs for
        self.held = False  # the store refused a cycle: none starts until RetryCycle

    def _new_urn(self) -> str:
        """A session actor is named after its session: no UUID made per spawn."""
        return f"urn:uuid:{self.core.session_id}"

    def on_stop(self) -> None:
        """Runs on the actor's thread as it stops: what is still queued is dropped
        without leaving the node's activity count behind."""
        drain_inbox(self, self.activity, lambda body: None)  # type: ignore[arg-type]

    def on_receive(self, message: Any) -> Any:
        """Dispatch one message; see the class docstring for failures."""
        counted = isinstance(message, Counted)
        body = message.message if counted else message
        try:
            with handler_scope():
                return self._dispatch(body)
        except (KeyboardInterrupt, SystemExit) as exc:
            self.on_fatal(exc)
            return None
        except Exception:
            if isinstance(body, Inspect):
                raise  # pykka answers the asker with it; the actor lives on
            log.exception("session %s: handler for %r raised", self.core.session_id, body)
            self.on_rejected(body)
            return None
        except BaseException:
            log.exception("session %s: handler for %r raised", self.core.session_id, body)
            self.on_rejected(body)
            return None
        finally:
            if counted:
                self.activity.end()

    def _dispatch(self, body: Any) -> Any:
        core = self.core
        match body:
            case StopSession():  # first: every ended session gets one
                self._stop_now()
            case Inbound():
                self.inputs.append(body)
                self._next_cycle()
            case Deliver():  # already filed by the Cortex
                if core.info.kind is SessionKind.MAIN:
                    self.inputs.append(body)
                    self._next_cycle()
            case CycleDone():
                self.cycle_running = False
                self.current = None
                self._next_cycle()
            case CycleRefused():
                self._keep_current()
            case RetryCycle():
                self.held = False
                self._next_cycle()
            case CancelSignal(code=code):
                core.request_cancel(code)
                self.inputs.clear()
            case ForceStop():
                self._force()
            case Inspect(probe=probe):
                return probe(core)
            case Passivate(mark=mark, done=done):
                idle = not self.inputs and not self.cycle_running and not core.fenced
                done(mark if idle else None)
            case _:
                self.on_rejected(body)
                return ErrorInfo(
                    code=ErrorCode.REJECTED_INPUT,
                    message=f"session {core.session_id} does not take {type(body).__name__}",
                )
        return None

    def _stop_now(self) -> None:
        """Stop now, on this message, so the stop is counted in activity until
        done (wait_idle then sees no ended actor still winding down).

        pykka's ``Actor._stop`` without its registry removal and its two debug
        lines (each formatting the actor's name): a session actor is never in
        pykka's registry, and a cascade stops tens of thousands of them.
        """
        self.actor_stopped.set()  # type: ignore[attr-defined]
        try:
            self.on_stop()
        except Exception:
            log.exception("session %s: on_stop raised", self.core.session_id)

    def _force(self) -> None:
        core = self.core
        self.inputs.clear()
        core.cancel_task()

    def _keep_current(self) -> None:
        """The running cycle's input was not consumed: first in line again, held."""
        item, self.current = self.current, None
        self.cycle_running = False
        core = self.core
        if item is None or core.cancel_code is not None or core.fenced:
            return  # ending: what it held goes with it
        if isinstance(item, Deliver):
            with core.cond:  # claimed when the cycle started: owed again
                core.unclaimed[item.result.session_id] = item.result
        self.inputs.appendleft(dataclasses.replace(item, fresh=False))  # it ran once
        self.held = True

    def _next_cycle(self) -> None:
        core = self.core
        while (
            self.inputs
            and not self.cycle_running
            and not self.held
            and core.cancel_code is None
            and not core.fenced
        ):
            item = self.inputs.popleft()
            if isinstance(item, Deliver):
                with core.cond:
                    result = core.claim(item.result.session_id)
                if result is None:  # a collect in an earlier cycle already took it
                    continue
                child, message = result.session_id, result
                cycle_input = CycleInput(None, f"r{child}", fresh=item.fresh)
            else:
                child, message = None, item.message
                key = None if item.id is None else f"m{item.id}"
                cycle_input = CycleInput(item.seq, key, fresh=item.fresh)
            with core.cond:
                core.cycle_input = cycle_input
            core.attempt = item.attempt
            self.cycles += 1
            self.cycle_running = True
            self.current = item
            trace = self.host.cycle_traced(core, self.cycles, item.trace, item.cut_off)
            if trace is not None or core.cycle_trace is not None:  # see SessionCore
                core.cycle_trace = trace
            # With a store the cycle's start is marked, queued before anything the
            # cycle writes: a crash in it then counts against its input. It waits
            # for the mark only while the store refuses writes (see the host).
            marked = self.host.cycle_starting(core, core.input_seq, child, item.attempt, message)
            if marked is None:
                self._submit(message, self.cycles)
            else:
                self.activity.begin()  # busy while the mark is written: the cycle is due
                marked.add_done_callback(functools.partial(self._marked, message, self.cycles))

    def _marked(self, message: Any, cycle: int, marked: concurrent.futures.Future[None]) -> None:
        """The cycle's start is durable (on the store's writer thread): run it,
        unless the Main was cancelled or fenced meanwhile (its end does not wait
        for a cycle that never started). A mark the store refused ends the
        cycle as refused without running it (its input is kept for a retry);
        one that failed otherwise is logged and the cycle runs anyway."""
        core = self.core
        if core.fenced or core.cancel_code is not None:
            self.activity.end()
            return
        error = marked.exception()
        try:
            refusal = None if error is None else store_refused(error)
            if refusal is not None:
                refuse_run(self.host, core, refusal, cycle)
                return
            if error is not None:
                log.error(
                    "session %s: the start of cycle %d could not be recorded: %s",
                    self.core.session_id,
                    cycle,
                    error,
                )
            self._submit(message, cycle)
        finally:
            self.activity.end()

    def _submit(self, message: Any, cycle: int) -> None:
        start_run(
            self.core,
            self.host,
            self.skill,
            self.is_async,
            self.executor,
            self.loop,
            message,
            cycle,
        )


def start_run(
    core: SessionCore,
    host: SessionHost,
    skill: Callable[[Any], Any],
    is_async: bool,
    executor: StepExecutor,
    loop: Callable[[], EventLoopThread],
    message: Any = None,
    cycle: int = 0,
) -> None:
    """Hand one run of ``skill`` to the step executor, the event loop or the
    session's backend; it never runs the skill on the calling thread. A run
    that cannot start (no thread, a closed loop) ends at once as ``crashed``.

    The session actor starts a Main's cycles; the Cortex starts a Branch's or
    Worker's one run itself (it needs nothing of the actor but the session's
    shared state, and a mailbox hop per spawn was a fifth of its cost).
    """
    core.activity.begin()  # the run counts as busy until it ends or blocks
    with core.cond:
        core.skill_running = True
    try:
        if core.remote is not None:  # awaited on the loop; the step runs elsewhere
            backend, data = core.remote
            remote_async = is_async_skill(skill)
            loop_thread = loop()

            async def start_remote() -> None:
                core.task = asyncio.current_task()
                core.task_loop = loop_thread.loop
                await run_remote(host, core, backend, data, remote_async)

            loop_thread.submit(start_remote)
        elif is_async:
            handle = AsyncSession(core, host, message=message, cycle=cycle)
            # run_async notes its task on the core itself: no wrapper coroutine
            # (and its closure) held for as long as the skill waits
            loop().submit(functools.partial(run_async, host, core, skill, handle, cycle))
        else:
            sync_handle = Session(core, host, message=message, cycle=cycle)
            executor.submit(lambda: run_sync(host, core, skill, sync_handle, cycle))
    except Exception as exc:
        log.exception("session %s: its run could not start", core.session_id)
        finish_run(host, core, RunEnd(error=crash_info(exc), cycle=cycle))
