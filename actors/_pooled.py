"""A pykka actor type whose mailboxes share a small, bounded pool of threads.

``ThreadingActor`` spends one OS thread per actor; ten thousand sessions then
cost ten thousand threads, and spawning and messaging slow down long before
that. :class:`PooledActor` keeps pykka's API and semantics (one message at a
time per actor, in order; ``on_start``/``on_stop``/``on_failure``;
``ask``/``tell``/proxies; ``ActorDeadError`` for whatever is left in a
stopped actor's inbox) but runs every actor's handlers on the threads of a
:class:`Dispatcher`:

* an inbox with messages is *scheduled*: put once on the dispatcher's ready
  queue; a pool thread takes it and handles at most ``batch`` of its
  messages, then puts it back at the end of the queue if more wait
  (fairness: a busy actor yields so the others are served);
* an actor is scheduled by at most one thread at a time, so its handlers
  never run concurrently and see its messages in the order they were put.

The rule for handlers: **never block**. A handler that waits (on I/O, a
lock, another actor's answer) holds one of a few threads that every actor
shares. sessiontree's own handlers only post messages; skill code runs on
the step executor or the event loop. The dispatcher guards the rule: a
handler still running ``block_threshold`` seconds after it began is
reported (logged, counted, handed to ``on_blocked``) and the pool starts a
compensating thread (at most ``max_extra_threads``) so the other actors keep
being served; the extra thread leaves once the blocked handler returned.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import sys
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import pykka
from pykka import ActorDeadError, ActorRegistry, messages
from pykka._envelope import Envelope

from sessiontree.actors._clock import RealClock

__all__ = ["BlockedHandler", "Dispatcher", "PooledActor", "stop_unstarted"]

log = logging.getLogger("sessiontree.dispatcher")

# Blocking is a matter of real time, whatever clock a node runs on; a thread
# serves the guard and the joins of close() (the clock starts no thread for it).
_REAL_TIME = RealClock()


@dataclass(frozen=True, slots=True)
class BlockedHandler:
    """A report: ``actor``'s handler for a ``message_type`` ran ``seconds`` so far."""

    actor: str
    message_type: str
    seconds: float


class _Worker:
    """What one pool thread is doing, read by the blocking check."""

    __slots__ = ("actor", "message", "reported", "started")

    def __init__(self) -> None:
        self.actor: PooledActor | None = None
        self.message: object = None
        self.started: float | None = None
        self.reported = False


class Dispatcher:
    """A bounded pool of threads serving the inboxes of :class:`PooledActor` s.

    ``threads``: the pool's size (threads start on first use). ``batch``: how
    many messages of one actor a thread handles before the actor goes to the
    back of the queue. ``block_threshold``: seconds after which a running
    handler is reported (see the module docstring); ``on_blocked`` is called
    with a :class:`BlockedHandler` on the watchdog thread and must not raise
    (a raise is logged). ``now`` reads the monotonic time (default: the real
    clock's, whatever clock the node runs on; tests inject their own and call
    :meth:`check_blocked` themselves).

    :meth:`close` serves what is queued, then stops the threads.
    """

    def __init__(
        self,
        threads: int = 2,
        *,
        batch: int = 64,
        block_threshold: float = 1.0,
        max_extra_threads: int = 8,
        on_blocked: Callable[[BlockedHandler], None] | None = None,
        now: Callable[[], float] | None = None,
        name: str = "sessiontree-dispatch",
        watchdog: bool = True,
    ) -> None:
        if not isinstance(threads, int) or threads < 1:
            msg = f"Dispatcher threads must be an integer >= 1, got {threads!r}"
            raise ValueError(msg)
        if not isinstance(batch, int) or batch < 1:
            msg = f"Dispatcher batch must be an integer >= 1, got {batch!r}"
            raise ValueError(msg)
        if not block_threshold > 0:
            msg = f"Dispatcher block_threshold must be > 0 s, got {block_threshold!r}"
            raise ValueError(msg)
        self.threads = threads
        self.batch = batch
        self.block_threshold = block_threshold
        self.max_extra_threads = max_extra_threads
        self.on_blocked = on_blocked
        self.name = name
        self.blocked_reports = 0
        self._now = now or _REAL_TIME.monotonic
        self._ready: queue.SimpleQueue[_Inbox | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._pending = 0  # inboxes queued or being served
        self._workers: dict[threading.Thread, _Worker] = {}
        self._extra = 0  # compensating threads alive
        self._blocked = 0  # handlers reported and still running
        self._closed = threading.Event()
        self._watchdog = watchdog
        self._watchdog_thread: threading.Thread | None = None

    # -- scheduling --------------------------------------------------------

    def _schedule(self, inbox: _Inbox) -> None:
        if not self._workers:
            self._start_pool()
        with self._lock:
            self._pending += 1
        self._ready.put(inbox)

    def _requeue(self, inbox: _Inbox) -> None:
        self._ready.put(inbox)

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending == 0:
                self._drained.notify_all()

    def _start_pool(self) -> None:
        with self._lock:
            if self._workers or self._closed.is_set():
                return
            for i in range(self.threads):
                self._spawn_worker(f"{self.name}-{i}", extra=False)
            if self._watchdog:
                self._watchdog_thread = threading.Thread(
                    target=self._watch, name=f"{self.name}-watchdog", daemon=True
                )
                self._watchdog_thread.start()

    def _spawn_worker(self, name: str, *, extra: bool) -> None:
        # under self._lock
        worker = _Worker()
        thread = threading.Thread(target=self._work, args=(worker, extra), name=name, daemon=True)
        self._workers[thread] = worker
        thread.start()

    @property
    def live_threads(self) -> int:
        """Pool threads alive now (compensating ones included)."""
        return len(self._workers)

    def _work(self, worker: _Worker, extra: bool) -> None:
        ready = self._ready
        # A compensating thread looks every so often whether it is still wanted.
        wait = min(self.block_threshold, 1.0) if extra else None
        try:
            while True:
                try:
                    inbox = ready.get(timeout=wait)
                except queue.Empty:
                    if self._extra_done():
                        return
                    continue
                if inbox is None:
                    return
                try:
                    inbox.serve(self, worker)
                except BaseException:  # noqa: BLE001 - a hook pykka lets through; _serve_failed logs it
                    self._serve_failed(inbox)
                if extra and self._extra_done():
                    return
        finally:
            with self._lock:
                self._workers.pop(threading.current_thread(), None)

    def _serve_failed(self, inbox: _Inbox) -> None:
        actor = inbox.actor
        log.exception("%s raised out of its hooks; it is stopped", actor)
        if actor is not None:
            ActorRegistry.unregister(actor.actor_ref)
            actor.actor_stopped.set()
        inbox._teardown()
        self._done()

    def _extra_done(self) -> bool:
        with self._lock:
            if self._extra > self._blocked:
                self._extra -= 1
                return True
            return False

    # -- the blocking guard ---------------------------------------------------

    def _watch(self) -> None:
        interval = min(self.block_threshold / 2, 1.0)
        while not self._closed.wait(interval):
            self.check_blocked()

    def check_blocked(self) -> list[BlockedHandler]:
        """Report every handler running past ``block_threshold`` (once each) and
        start a compensating thread for each; returns the new reports."""
        now = self._now()
        reports: list[BlockedHandler] = []
        with self._lock:
            for worker in self._serving():
                started, actor = worker.started, worker.actor
                if started is None or worker.reported or now - started < self.block_threshold:
                    continue
                worker.reported = True
                self._blocked += 1
                self.blocked_reports += 1
                reports.append(
                    BlockedHandler(str(actor), type(worker.message).__name__, now - started)
                )
                if self._extra < self.max_extra_threads and not self._closed.is_set():
                    self._extra += 1
                    self._spawn_worker(f"{self.name}-extra", extra=True)
        for report in reports:
            log.warning(
                "actor handler blocked: %s has run %.1f s on %s (handlers must not block;"
                " a compensating thread serves the others)",
                report.actor,
                report.seconds,
                report.message_type,
            )
            if self.on_blocked is not None:
                try:
                    self.on_blocked(report)
                except Exception:
                    log.exception("on_blocked raised")
        return reports

    def _serving(self) -> list[_Worker]:
        # under self._lock: what each serving thread is doing
        return list(self._workers.values())

    def _unblocked(self) -> None:
        with self._lock:
            self._blocked -= 1

    # -- closing ----------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Serve what is queued, then stop the pool threads; idempotent.

        Waits at most ``timeout`` real seconds in all: inboxes still queued
        then are not served, and a thread stuck in a blocking handler is left
        behind (the threads are daemons).
        """
        if self._closed.is_set():
            return
        deadline = _REAL_TIME.monotonic() + timeout
        with self._lock:
            self._drained.wait_for(lambda: self._pending == 0, timeout)
            self._closed.set()
            threads = list(self._workers)
        for _ in threads:
            self._ready.put(None)
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join(max(0.0, deadline - _REAL_TIME.monotonic()))
        if self._watchdog_thread is not None and self._watchdog_thread is not current:
            self._watchdog_thread.join(max(0.0, deadline - _REAL_TIME.monotonic()))


_default: Dispatcher | None = None
_default_lock = threading.Lock()


def _default_dispatcher() -> Dispatcher:
    global _default  # noqa: PLW0603 - one shared pool for actors started without one
    with _default_lock:
        if _default is None:
            _default = Dispatcher(name="pykka-pooled")
        return _default


class _Inbox:
    """An actor's mailbox: a deque, and a flag saying it is queued or being served.

    ``put`` schedules the inbox when the flag was clear; the serving thread
    clears it only when the deque is empty (both under the lock, so no
    message is ever left unscheduled). Closed, it lets go of its actor (the
    two refer to each other: kept, a stopped actor would wait for the cyclic
    garbage collector instead of being freed with its last reference).
    """

    __slots__ = ("actor", "closed", "dead", "dispatcher", "lock", "messages", "scheduled")

    def __init__(self, actor: PooledActor, dispatcher: Dispatcher) -> None:
        self.actor: PooledActor | None = actor
        self.dead = ""  # the stopped actor's name, for what is refused after it
        self.dispatcher = dispatcher
        self.lock = threading.Lock()
        self.messages: deque[Envelope[Any]] = deque()
        self.scheduled = True  # until _start_actor_loop runs on_start
        self.closed = False

    # pykka's ActorInbox protocol ------------------------------------------

    def put(self, envelope: Envelope[Any], /) -> None:
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

    def get(self) -> Envelope[Any]:
        """The oldest message (``IndexError`` when empty: check ``empty`` first)."""
        return self.messages.popleft()

    def empty(self) -> bool:
        return not self.messages

    def qsize(self) -> int:
        return len(self.messages)

    # the dispatcher's side -------------------------------------------------

    def serve(self, dispatcher: Dispatcher, worker: _Worker) -> None:
        actor = self.actor
        assert actor is not None  # a closed inbox is never scheduled again
        worker.actor = actor
        try:
            if not actor._pooled_started:
                actor._pooled_started = True
                self._run(worker, None, actor._actor_loop_setup)
            stopped = actor.actor_stopped
            pending = self.messages
            for _ in range(dispatcher.batch):
                if not pending or stopped.is_set():
                    break
                envelope = pending.popleft()
                self._run(worker, envelope.message, actor._pooled_handle, envelope)
            if stopped.is_set():
                self._teardown()
                dispatcher._done()
                return
            with self.lock:
                if not pending:
                    self.scheduled = False
                    dispatcher._done()
                    return
            dispatcher._requeue(self)  # more waiting: to the back of the queue
        finally:
            worker.actor = None

    def _run(self, worker: _Worker, message: object, step: Callable[..., None], *args: Any) -> None:
        worker.message = message
        worker.started = self.dispatcher._now()
        try:
            step(*args)
        finally:
            worker.started = None
            worker.message = None
            if worker.reported:
                worker.reported = False
                self.dispatcher._unblocked()

    def _close(self) -> PooledActor | None:
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

    def close_unstarted(self) -> PooledActor | None:
        """Close an inbox that never got a message (so its actor never ran a hook
        and no pool thread serves it); its actor, or None if it did get one."""
        with self.lock:
            actor = self.actor
            if self.scheduled or self.messages or actor is None or actor._pooled_started:
                return None
            self.scheduled = True  # never served from now on
            return self._close()  # nothing queued to refuse


def stop_unstarted(ref: pykka.ActorRef[Any]) -> bool:
    """Stop a pooled actor that never got a message, on the calling thread and
    without a pool turn: it ran no hook (``start_on_first_message``), so none
    runs now. True if it was stopped so; False for any other actor (stop it as
    usual). A message sent to it afterwards gets ``ActorDeadError``.

    A node ends tens of thousands of worker sessions whose actors never got a
    message; a stop message each would cost a pool turn each.
    """
    inbox = ref.actor_inbox
    if not isinstance(inbox, _Inbox):
        return False
    actor = inbox.close_unstarted()
    if actor is None:
        return False
    actor.actor_stopped.set()
    return True


def _refuse(name: str, envelope: Envelope[Any], *, raise_for_tell: bool) -> None:
    reply = envelope.reply_to
    if reply is None:
        if raise_for_tell:
            msg = f"{name} not found"
            raise ActorDeadError(msg)
        return
    with contextlib.suppress(queue.Full):  # answered already
        if isinstance(envelope.message, messages._ActorStop):
            reply.set(None)
        else:
            error = ActorDeadError(f"{name} stopped before handling the message")
            reply.set_exception(exc_info=(ActorDeadError, error, None))


# Seeded from the OS once; URNs need uniqueness, not secrecy.
_urns = random.Random()  # noqa: S311


class _StopFlag:
    """What pykka reads of ``actor_stopped`` (``is_set``, ``set``, ``wait``),
    without a Condition and a Lock per actor until someone waits on it."""

    __slots__ = ("_event", "_set")

    _lock = threading.Lock()

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        with self._lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


class PooledActor(pykka.Actor):
    """A pykka ``Actor`` served by a :class:`Dispatcher` instead of a thread of its own.

    Subclass it as you would ``ThreadingActor``. ``dispatcher`` (a class
    attribute) picks the pool; unset, actors share one process-wide pool.
    Every hook (``on_start``, ``on_receive``, proxied methods, ``on_stop``,
    ``on_failure``) runs on a pool thread, one at a time per actor. A handler
    that raises is handled as pykka does (the asker gets the exception; a
    tell logs it, calls ``on_failure`` and stops the actor). A
    ``BaseException`` stops this actor and asks every registered actor to
    stop, without waiting (pykka waits, which would tie up the pool).
    """

    dispatcher: ClassVar[Dispatcher | None] = None
    start_on_first_message: ClassVar[bool] = False
    """True: ``on_start`` runs when the first message is served (still before
    it), not on a pool thread of its own as soon as the actor starts. For an
    actor type with no ``on_start`` of its own, that saves a pool hop a start;
    an actor that never gets a message then never runs ``on_start``."""
    _pooled_started: bool

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        # pykka's Actor.__init__, with two costs taken out of every start: the
        # URN from a seeded generator instead of one read of the OS's random
        # source each, and a plain flag instead of a threading.Event.
        self.actor_urn = self._new_urn()
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = _StopFlag()  # type: ignore[assignment]
        self._actor_ref = pykka.ActorRef(self)

    def _new_urn(self) -> str:
        """This actor's ``actor_urn``: a random UUID URN (a subclass may name its own)."""
        return f"urn:uuid:{uuid.UUID(int=_urns.getrandbits(128), version=4)}"

    def _create_actor_inbox(self) -> _Inbox:  # type: ignore[override]
        self._pooled_started = False
        return _Inbox(self, self.dispatcher or _default_dispatcher())

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return pykka.ThreadingFuture()

    def _start_actor_loop(self) -> None:
        inbox = self.actor_inbox
        assert isinstance(inbox, _Inbox)
        if self.start_on_first_message:
            with inbox.lock:  # the first put schedules it; serving runs on_start first
                if not inbox.messages:
                    inbox.scheduled = False
                    return
        inbox.dispatcher._schedule(inbox)  # serving runs on_start first

    def _pooled_handle(self, envelope: Envelope[Any]) -> None:
        # The body of pykka's _actor_loop_running for one message.
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                log.info("Exception returned from %s to caller:", self, exc_info=sys.exc_info())
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:  # noqa: BLE001 - pykka's rule: a failing hook is logged
                    self._handle_failure(*sys.exc_info())
        except BaseException:  # noqa: BLE001 - pykka's rule; the pool thread lives on
            log.debug("%r in %s; stopping all actors", sys.exc_info()[1], self)
            self._stop()
            ActorRegistry.stop_all(block=False)
