"""``LoopActor``: a pykka actor type served on an event loop (``_loop_dispatch``).

Only pykka's public API is used: ``pykka.Actor``'s hooks for new actor types
(``_create_actor_inbox``, ``_create_future``, ``_start_actor_loop``),
``ActorRef``, ``ThreadingFuture`` and ``ActorDeadError``. What the actor
does on each message is what pykka's actor loop does, one message at a time;
its inbox and its turns are the dispatcher's.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import uuid
from typing import Any, ClassVar

import pykka

from sessiontree.actors._loop_dispatch import STOP, LoopDispatcher, _Inbox

__all__ = ["LoopActor", "LoopRef"]

log = logging.getLogger("sessiontree.dispatcher")


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


class LoopRef(pykka.ActorRef[Any]):
    """A :class:`LoopActor`'s ``ActorRef``: pykka's, with ``stop`` sending :data:`STOP`."""

    def stop(self, *, block: bool = True, timeout: float | None = None) -> Any:
        """As ``pykka.ActorRef.stop``: True once stopped (or being stopped),
        False if the actor was already dead; a future of that with ``block=False``."""
        asked = self.ask(STOP, block=False)

        def stopped(timeout: float | None) -> bool:
            try:
                asked.get(timeout=timeout)
            except pykka.ActorDeadError:
                return False
            return True

        future: pykka.ThreadingFuture[bool] = pykka.ThreadingFuture()
        future.set_get_hook(stopped)
        return future.get(timeout=timeout) if block else future


class LoopActor(pykka.Actor):
    """A pykka ``Actor`` served on an event loop by a :class:`LoopDispatcher`.

    Subclass it and set ``dispatcher`` (a class attribute) to the dispatcher
    of the loop that serves it; a start without one raises ``RuntimeError``.
    ``on_start``, ``on_receive``, ``on_stop`` and ``on_failure`` run on the
    loop's thread, one at a time per actor. A handler that raises is handled
    as pykka does: the asker gets the exception; a tell logs it, stops the
    actor and calls ``on_failure``. A ``BaseException`` (``SystemExit``...)
    from a handler stops this actor (``on_stop`` runs; an asker gets it
    raised) and nothing else: the loop and the other actors live on.
    """

    dispatcher: ClassVar[LoopDispatcher | None] = None
    start_on_first_message: ClassVar[bool] = False
    """True: ``on_start`` runs when the first message is served (still before
    it), not on a turn of its own as soon as the actor starts. For an actor
    type with no ``on_start`` of its own, that saves a turn a start; an actor
    that never gets a message then never runs ``on_start``."""
    _loop_started: bool

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        # What pykka's Actor.__init__ sets, with two costs taken out of every
        # start: the URN from a seeded generator instead of one read of the OS's
        # random source each, and a plain flag instead of a threading.Event.
        self.actor_urn = self._new_urn()
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = _StopFlag()  # type: ignore[assignment]
        self._loop_ref = LoopRef(self)

    @property
    def actor_ref(self) -> LoopRef:
        """This actor's :class:`LoopRef`."""
        return self._loop_ref

    def _new_urn(self) -> str:
        """This actor's ``actor_urn``: a random UUID URN (a subclass may name its own)."""
        return f"urn:uuid:{uuid.UUID(int=_urns.getrandbits(128), version=4)}"

    # pykka's hooks for an actor type ----------------------------------------

    def _create_actor_inbox(self) -> _Inbox:  # type: ignore[override]
        self._loop_started = False
        dispatcher = self.dispatcher
        if dispatcher is None:
            msg = f"{type(self).__name__} has no dispatcher: set the class's dispatcher"
            raise RuntimeError(msg)
        return _Inbox(self, dispatcher)

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

    # what pykka's actor loop does, one message at a time -----------------------

    def stop(self) -> None:
        """Stop the actor after the messages already in its inbox (as ``pykka.Actor.stop``)."""
        self._loop_ref.tell(STOP)

    def _setup(self) -> None:
        try:
            self.on_start()
        except Exception:  # noqa: BLE001 - pykka's rule: a failing hook is logged
            self._failed()

    def _handle(self, envelope: Any) -> None:
        message, reply = envelope.message, envelope.reply_to
        try:
            if message is STOP:
                self._stopped()
                response = None
            else:
                response = self.on_receive(message)
            if reply is not None:
                reply.set(response)
        except Exception:
            if reply is not None:
                log.info("Exception returned from %s to caller:", self, exc_info=sys.exc_info())
                reply.set_exception()
            else:
                self._failed()
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:  # noqa: BLE001 - pykka's rule: a failing hook is logged
                    self._failed()
        except BaseException:
            log.exception("%s raised out of its handler; it is stopped", self)
            if reply is not None:
                reply.set_exception()
            if not self.actor_stopped.is_set():
                self._stopped()

    def _stopped(self) -> None:
        # Out of pykka's registry if ``start`` put it there (a node's actors never are).
        pykka.ActorRegistry.unregister(self._loop_ref)
        self.actor_stopped.set()
        try:
            self.on_stop()
        except Exception:  # noqa: BLE001 - pykka's rule: a failing hook is logged
            self._failed()

    def _failed(self) -> None:
        log.error("Unhandled exception in %s:", self, exc_info=sys.exc_info())
        pykka.ActorRegistry.unregister(self._loop_ref)
        self.actor_stopped.set()
