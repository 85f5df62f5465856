"""Actors served on one asyncio event loop: a pykka actor type with a deque for a mailbox.

Every actor of a node (the Cortex and each session) is a :class:`LoopActor`
served by the node's :class:`LoopDispatcher` on the thread that runs async
skills: an async skill's message is a ``deque`` append and the turn a
``call_soon``, no thread crossed. Other threads (sync skills' steps, the
store's writer, an application) post the same way; one
``call_soon_threadsafe`` wakes the loop for all that queued since its last turn.

The semantics are pykka's: one message at a time per actor, in the order they
were put; ``on_start`` before the first message, ``on_stop`` when stopped,
``on_failure`` after a told message's handler raised; ``ask``/``tell``/
``stop`` on the actor's ``ActorRef``; ``ActorDeadError`` for whatever is left
in a stopped actor's inbox. Messages go to ``on_receive`` (no proxies).

Only pykka's public API is used: ``pykka.Actor``'s hooks for new actor types
(``_create_actor_inbox``, ``_create_future``, ``_start_actor_loop``),
``ActorRef``, ``ThreadingFuture`` and ``ActorDeadError``. A stop is this
module's own message (:data:`STOP`), sent by ``LoopActor.stop``,
``LoopRef.stop`` and ``stop_actor``.

The rule for handlers: **never block** (on I/O, a lock, another actor's
answer): it holds up every actor and async skill of the node. The dispatcher
reports a handler still running after ``block_threshold`` real seconds
(logged, counted, handed to ``on_blocked``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pykka

from sessiontree.actors._clock import RealClock

__all__ = [
    "STOP",
    "BlockedHandler",
    "LoopDispatcher",
    "handle_now",
    "stop_unstarted",
]

log = logging.getLogger("sessiontree.dispatcher")

# Blocking is a matter of real time, whatever clock a node runs on; a thread
# serves the guard and the wait of close() (the clock starts no thread for it).
_REAL_TIME = RealClock()


class ServingLoop(Protocol):
    """The thread running an asyncio loop (``EventLoopThread``), as the dispatcher sees it."""

    loop: asyncio.AbstractEventLoop

    def is_current(self) -> bool:
        """True on the loop's own thread."""
        ...


class Served(Protocol):
    """What the dispatcher and an inbox use of the actor they serve (``LoopActor``)."""

    _loop_started: bool
    actor_urn: str

    @property
    def actor_stopped(self) -> Any: ...  # is_set(), set()

    @property
    def actor_ref(self) -> Any: ...

    def _setup(self) -> None: ...

    def _handle(self, envelope: Any) -> None: ...


class _Stop:
    """The message that stops a :class:`LoopActor` after what was put before it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "STOP"


STOP = _Stop()


@dataclass(frozen=True, slots=True)
class BlockedHandler:
    """A report: ``actor``'s handler for a ``message_type`` ran ``seconds`` so far."""

    actor: str
    message_type: str
    seconds: float


class _Serving:
    """What the loop's thread is running now, read by the blocking check."""

    __slots__ = ("actor", "handlers", "message", "reported", "started")

    def __init__(self) -> None:
        self.actor: Served | None = None
        self.message: object = None
        self.started: float | None = None
        self.handlers = 0  # handlers run so far: the number of the one running
        # the handler reported last (the check runs on its own thread, maybe
        # late, and reports each handler at most once)
        self.reported = 0


class LoopDispatcher:
    """Serves the inboxes of :class:`LoopActor` s on ``loop``'s thread.

    Each turn of the loop serves the inboxes ready at its start, ``batch``
    messages each at most (a busy actor then goes to the back of the queue),
    then yields to the loop's other callbacks and tasks (fairness with async
    skills). ``block_threshold``: real seconds after which a running handler
    is reported (see the module docstring); ``on_blocked`` is called with a
    :class:`BlockedHandler` on the watchdog thread and must not raise (a raise
    is logged). ``now`` reads the monotonic time (default: the real clock's;
    tests inject their own and call :meth:`check_blocked` themselves, with
    ``watchdog=False``). Once the loop is closed, nothing queued is served.

    Raises ``ValueError`` naming a bad ``batch`` or ``block_threshold``.
    """

    def __init__(
        self,
        loop: ServingLoop,
        *,
        batch: int = 64,
        block_threshold: float = 1.0,
        on_blocked: Callable[[BlockedHandler], None] | None = None,
        now: Callable[[], float] | None = None,
        name: str = "sessiontree-loop-dispatch",
        watchdog: bool = True,
    ) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            msg = f"LoopDispatcher batch must be an integer >= 1, got {batch!r}"
            raise ValueError(msg)
        if not isinstance(block_threshold, int | float) or not block_threshold > 0:
            msg = f"LoopDispatcher block_threshold must be > 0 s, got {block_threshold!r}"
            raise ValueError(msg)
        self.loop = loop
        self.batch = batch
        self.block_threshold = block_threshold
        self.on_blocked = on_blocked
        self.name = name
        self.blocked_reports = 0
        self._now = now or _REAL_TIME.monotonic
        self._queue: collections.deque[_Inbox] = collections.deque()
        self._turn_pending = False
        self._serving = _Serving()
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._pending = 0  # inboxes queued or being served
        self._started = False
        self._closed = threading.Event()
        self._watchdog = watchdog
        self._watchdog_thread: threading.Thread | None = None

    # -- scheduling --------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._started or self._closed.is_set():
                return
            self._started = True
            if self._watchdog:
                self._watchdog_thread = threading.Thread(
                    target=self._watch, name=f"{self.name}-watchdog", daemon=True
                )
                self._watchdog_thread.start()

    @property
    def live_threads(self) -> int:
        """1 (the loop's thread) from the first actor's start until ``close``."""
        return int(self._started and not self._closed.is_set())

    def _schedule(self, inbox: _Inbox) -> None:
        if not self._started:
            self._start()
        with self._lock:
            self._pending += 1
        self._requeue(inbox)

    def _requeue(self, inbox: _Inbox) -> None:
        self._queue.append(inbox)
        if self._turn_pending:
            return
        self._turn_pending = True
        if self.loop.is_current():
            self.loop.loop.call_soon(self._turn)
            return
        try:
            self.loop.loop.call_soon_threadsafe(self._turn)
        except RuntimeError:  # the loop is closed: nothing will serve it again
            self._turn_pending = False

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending == 0:
                self._drained.notify_all()

    def _turn(self) -> None:
        # The flag is cleared before the queue is read: an inbox queued after
        # this point finds it clear and asks for another turn.
        self._turn_pending = False
        ready = self._queue
        for _ in range(len(ready)):
            inbox = ready.popleft()
            try:
                more = inbox.serve(self)
            except BaseException:  # noqa: BLE001 - a hook let it through; the loop lives on
                inbox.failed()
                more = False
            if more:
                self._requeue(inbox)  # more waiting: to the back of the queue
            else:
                self._done()

    def _run(self, actor: Served, message: object, step: Callable[..., None], *args: Any) -> None:
        serving = self._serving
        serving.handlers += 1
        serving.actor, serving.message, serving.started = actor, message, self._now()
        try:
            step(*args)
        finally:
            serving.actor = serving.message = serving.started = None

    # -- the blocking guard ---------------------------------------------------

    def _watch(self) -> None:
        interval = min(self.block_threshold / 2, 1.0)
        while not self._closed.wait(interval):
            self.check_blocked()

    def check_blocked(self) -> BlockedHandler | None:
        """Report the handler running now if it has run past ``block_threshold``
        (once per handler); returns the new report, if any."""
        serving = self._serving
        number = serving.handlers
        started, actor, message = serving.started, serving.actor, serving.message
        now = self._now()
        if started is None or number == serving.reported or now - started < self.block_threshold:
            return None
        serving.reported = number
        self.blocked_reports += 1
        report = BlockedHandler(str(actor), type(message).__name__, now - started)
        log.warning(
            "actor handler blocked: %s has run %.1f s on %s (handlers must not block:"
            " every actor and async skill of the node waits for it)",
            report.actor,
            report.seconds,
            report.message_type,
        )
        if self.on_blocked is not None:
            try:
                self.on_blocked(report)
            except Exception:
                log.exception("on_blocked raised")
        return report

    # -- closing ----------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Wait (off the loop, at most ``timeout`` real seconds) for what is
        queued to be served, then stop the watchdog; idempotent."""
        if self._closed.is_set():
            return
        deadline = _REAL_TIME.monotonic() + timeout
        with self._lock:
            if not self.loop.is_current():
                self._drained.wait_for(lambda: self._pending == 0, timeout)
            self._closed.set()
        thread = self._watchdog_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - _REAL_TIME.monotonic()))


class _Inbox:
    """An actor's mailbox: a deque, and a flag saying it is queued or being served.

    ``put`` schedules the inbox when the flag was clear; serving clears it
    only when the deque is empty (both under the lock, so no message is ever
    left unscheduled). Closed, it lets go of its actor (the two refer to each
    other: kept, a stopped actor would wait for the cyclic garbage collector
    instead of being freed with its last reference).

    An envelope is what ``pykka.ActorRef`` puts: its ``message`` and its
    ``reply_to`` future (None for a tell).
    """

    __slots__ = ("actor", "closed", "dead", "dispatcher", "lock", "messages", "scheduled")

    def __init__(self, actor: Served, dispatcher: LoopDispatcher) -> None:
        self.actor: Served | None = actor
        self.dead = ""  # the stopped actor's name, for what is refused after it
        self.dispatcher = dispatcher
        self.lock = threading.Lock()
        self.messages: collections.deque[Any] = collections.deque()
        self.scheduled = True  # until the actor's start schedules it or clears it
        self.closed = False

    # what pykka.ActorRef and drain_inbox use --------------------------------

    def put(self, envelope: Any, /) -> None:
        """Queue ``envelope``; on a stopped actor an ask is answered with
        ``ActorDeadError`` and a tell raises it."""
        with self.lock:
            if not self.closed:
                self.messages.append(envelope)
                if self.scheduled:
                    return
                self.scheduled = True
                dead = False
            else:
                dead = True
        if dead:
            _refuse(self.dead, envelope, raise_for_tell=True)
            return
        self.dispatcher._schedule(self)

    def get(self) -> Any:
        """The oldest envelope (``IndexError`` when empty: check ``empty`` first)."""
        return self.messages.popleft()

    def empty(self) -> bool:
        return not self.messages

    def qsize(self) -> int:
        return len(self.messages)

    # the dispatcher's side -------------------------------------------------

    def serve(self, dispatcher: LoopDispatcher) -> bool:
        """Run up to a batch of messages; True if more wait (queue it again)."""
        actor = self.actor
        assert actor is not None  # a closed inbox is never scheduled again
        if not actor._loop_started:
            actor._loop_started = True
            dispatcher._run(actor, None, actor._setup)
        stopped = actor.actor_stopped
        pending = self.messages
        for _ in range(dispatcher.batch):
            if not pending or stopped.is_set():
                break
            envelope = pending.popleft()
            dispatcher._run(actor, envelope.message, actor._handle, envelope)
        if stopped.is_set():
            self._teardown()
            return False
        with self.lock:
            if not pending:
                self.scheduled = False
                return False
        return True

    def handle_now(self, message: object) -> bool:
        """Run the actor's handler for ``message`` on the calling thread, now, if
        that is what serving it would do: on the loop's thread, outside any
        handler, the actor started, nothing queued before it. False (nothing
        done) otherwise: the caller puts it in the inbox."""
        dispatcher = self.dispatcher
        if dispatcher._serving.actor is not None or not dispatcher.loop.is_current():
            return False
        with self.lock:
            actor = self.actor
            if self.scheduled or actor is None or not actor._loop_started:
                return False
            self.scheduled = True  # served now: whatever is put meanwhile waits its turn
        dispatcher._run(actor, message, actor._handle, _Now(message))
        if actor.actor_stopped.is_set():
            self._teardown()
            return True
        with self.lock:
            if not self.messages:
                self.scheduled = False
                return True
        dispatcher._schedule(self)
        return True

    def failed(self) -> None:
        """A hook let a ``BaseException`` through: the actor is stopped, its inbox refused."""
        actor = self.actor
        log.exception("%s raised out of its hooks; it is stopped", actor)
        if actor is not None:
            pykka.ActorRegistry.unregister(actor.actor_ref)
            actor.actor_stopped.set()
        self._teardown()

    def _close(self) -> Served | None:
        """Close, letting go of the actor (call holding the lock); the actor."""
        actor, self.actor = self.actor, None
        if actor is not None:
            self.dead = f"{type(actor).__name__} ({actor.actor_urn})"  # as ActorRef says it
        self.closed = True
        return actor

    def _teardown(self) -> None:
        with self.lock:
            self._close()
            left = list(self.messages)
            self.messages.clear()
        for envelope in left:
            _refuse(self.dead, envelope, raise_for_tell=False)

    def close_unstarted(self) -> Served | None:
        """Close an inbox that never got a message (so its actor never ran a hook
        and was never served); its actor, or None if it did get one."""
        with self.lock:
            actor = self.actor
            if self.scheduled or self.messages or actor is None or actor._loop_started:
                return None
            self.scheduled = True  # never served from now on
            return self._close()  # nothing queued to refuse


class _Now:
    """The envelope of a message handled at once (``handle_now``): nobody waits on a reply."""

    __slots__ = ("message",)

    reply_to = None

    def __init__(self, message: object) -> None:
        self.message = message


def handle_now(ref: pykka.ActorRef[Any], message: object) -> bool:
    """Handle a told ``message`` on the calling thread at once, where that keeps
    the actor's order (one message at a time, in the order put): called on the
    serving loop's thread, outside any handler, to a started
    :class:`LoopActor` with an empty inbox. False otherwise (and for any other
    actor): nothing was done, tell it instead.

    This is how the loop's own thread (an async skill, an awaited node
    operation) reaches an actor without a turn of the loop in between.
    """
    inbox = ref.actor_inbox
    return isinstance(inbox, _Inbox) and inbox.handle_now(message)


def stop_unstarted(ref: pykka.ActorRef[Any]) -> bool:
    """Stop a loop actor that never got a message, on the calling thread and
    without a turn of the loop: it ran no hook (``start_on_first_message``), so
    none runs now. True if it was stopped so; False for any other actor (stop
    it as usual). A message sent to it afterwards gets ``ActorDeadError``.

    A node ends tens of thousands of worker sessions whose actors never got a
    message; a stop message each would cost a turn each.
    """
    inbox = ref.actor_inbox
    if not isinstance(inbox, _Inbox):
        return False
    actor = inbox.close_unstarted()
    if actor is None:
        return False
    actor.actor_stopped.set()
    return True


def _refuse(name: str, envelope: Any, *, raise_for_tell: bool) -> None:
    reply = envelope.reply_to
    if reply is None:
        if raise_for_tell:
            msg = f"{name} not found"
            raise pykka.ActorDeadError(msg)
        return
    with contextlib.suppress(queue.Full):  # answered already
        if envelope.message is STOP:
            reply.set(None)  # stopped, as asked
        else:
            error = pykka.ActorDeadError(f"{name} stopped before handling the message")
            reply.set_exception(exc_info=(pykka.ActorDeadError, error, None))
