"""Mailbox plumbing: the actor class of a node's actors, posting, and replies.

Session logic is written as a mixin and combined here with
:class:`LoopActor`, served on the node's event loop by its
:class:`LoopDispatcher` (the one execution mode: see ``_loop_dispatch``).

Actors started here are kept out of pykka's global ``ActorRegistry`` (one
list, O(n) to unregister, and ``stop_all`` on any ``BaseException``): the node
keeps its own index.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pykka

from sessiontree.actors._activity import Activity
from sessiontree.actors._core import _set_done, call_soon
from sessiontree.actors._loop_actor import LoopActor
from sessiontree.actors._loop_dispatch import STOP, LoopDispatcher
from sessiontree.protocol import DeadlockError, SessionTreeError

__all__ = [
    "AskTimeoutError",
    "Counted",
    "Reply",
    "actor_class",
    "drain_inbox",
    "handler_scope",
    "in_actor_handler",
    "mailbox_depth",
    "mark_serving_thread",
    "post",
    "refuse_blocking",
    "start_actor",
    "stop_actor",
    "unmark_serving_thread",
]

A = TypeVar("A", bound=pykka.Actor)

_local = threading.local()


class AskTimeoutError(SessionTreeError):
    """Raised when an actor did not answer within the ask's timeout."""


def actor_class(logic: type[Any], dispatcher: LoopDispatcher) -> type[LoopActor]:
    """``logic`` (a mixin with ``on_receive``) as a :class:`LoopActor` served by
    ``dispatcher`` (a class of its own per call: one per node)."""
    return type(f"{logic.__name__}[loop]", (logic, LoopActor), {"dispatcher": dispatcher})


def start_actor(cls: type[A], *args: Any, **kwargs: Any) -> pykka.ActorRef[A]:
    """Start an actor without registering it in pykka's global registry."""
    actor = cls(*args, **kwargs)
    actor._start_actor_loop()
    return actor.actor_ref


class Counted:
    """A message counted in the node's :class:`Activity` until its handler returns."""

    __slots__ = ("message",)

    def __init__(self, message: object) -> None:
        self.message = message


def post(ref: pykka.ActorRef[Any], message: object, activity: Activity) -> bool:
    """Tell ``message`` to ``ref``, counted; False if the actor is already dead."""
    activity.begin()
    try:
        ref.tell(Counted(message))
    except pykka.ActorDeadError:
        activity.end()
        return False
    return True


def mailbox_depth(ref: pykka.ActorRef[Any]) -> int:
    """How many messages wait in ``ref``'s inbox (0 for an inbox that cannot say)."""
    qsize = getattr(ref.actor_inbox, "qsize", None)
    return int(qsize()) if qsize is not None else 0


def stop_actor(ref: pykka.ActorRef[Any]) -> None:
    """``ref.stop(block=False)`` without the reply future it would create.

    The actor stops after the messages already in its inbox; messages posted
    later get ``ActorDeadError`` (or are answered with it). Already dead: nothing.
    """
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(STOP)


def drain_inbox(actor: pykka.Actor, activity: Activity, refuse: Callable[[object], None]) -> None:
    """Empty a stopping actor's inbox on its own thread (call from ``on_stop``).

    pykka drops what a stopped actor still holds; here every counted message is
    ended in ``activity`` and handed to ``refuse`` (which answers waiting
    callers), and pykka asks get ``ActorDeadError`` — nobody waits in vain.
    """
    inbox = actor.actor_inbox
    while not inbox.empty():
        envelope = inbox.get()
        message = envelope.message
        if isinstance(message, Counted):
            try:
                refuse(message.message)
            finally:
                activity.end()
        if envelope.reply_to is None:
            continue
        if message is STOP:
            envelope.reply_to.set(None)  # stopped, as asked
        else:
            error = pykka.ActorDeadError(f"{actor} stopped before handling the message")
            envelope.reply_to.set_exception(exc_info=(type(error), error, None))


def in_actor_handler() -> bool:
    """True on a thread where blocking on an actor's answer is refused: inside
    an actor's message handler, or on the node's event loop (it serves the
    actors themselves, see ``LoopDispatcher``, and it runs every async skill)."""
    return getattr(_local, "handler", 0) > 0 or getattr(_local, "serves", 0) > 0


def refuse_blocking() -> None:
    """Raise ``DeadlockError`` where ``in_actor_handler`` says blocking on an
    actor's answer is refused (before anything is asked)."""
    if in_actor_handler():
        msg = (
            "no blocking ask inside an actor handler or on the node's event loop"
            " (deadlock): tell instead, or await the async twin"
        )
        raise DeadlockError(msg)


def mark_serving_thread() -> None:
    """Mark the calling thread as one where blocking asks are refused (an event
    loop's); marks count, one per node serving there."""
    _local.serves = getattr(_local, "serves", 0) + 1


def unmark_serving_thread() -> None:
    """Take back one mark of ``mark_serving_thread`` (a node gave an adopted
    loop back; another node may still serve on it)."""
    _local.serves = max(0, getattr(_local, "serves", 0) - 1)


class handler_scope:  # noqa: N801 - used as a context manager, reads as a statement
    """Marks the current thread as inside an actor handler (for the deadlock guard).

    Scopes are counted, so they may interleave on one thread: the Cortex's
    continuations (tasks on its loop) each hold one across their awaits."""

    def __enter__(self) -> None:
        _local.handler = getattr(_local, "handler", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.handler -= 1


T = TypeVar("T")


class Reply:
    """One answer from an actor to a caller that waits for it, on a thread or a loop.

    Cheap to make, as every ask makes one: the ``threading.Event`` a blocking
    ``get`` needs is made only by such a ``get``, and an awaiting caller's
    timeout is one timer on its loop.
    """

    __slots__ = ("_callbacks", "_done", "_error", "_event", "_lock", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._event: threading.Event | None = None  # made by a blocking get
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] = []

    @property
    def done(self) -> bool:
        """True once answered."""
        return self._done

    def set(self, value: Any) -> None:
        """Answer with ``value`` (first answer wins)."""
        self._finish(value, None)

    def fail(self, error: BaseException) -> None:
        """Answer with an exception, raised in the caller."""
        self._finish(None, error)

    def _finish(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._done:
                return
            self._value, self._error = value, error
            self._done = True
            event = self._event
            callbacks, self._callbacks = self._callbacks, []
        if event is not None:
            event.set()
        for callback in callbacks:
            callback()

    def _result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def get(self, timeout: float) -> Any:
        """Wait (at most ``timeout`` real seconds) and return the answer.

        Raises ``DeadlockError`` when called inside an actor handler (an actor
        must never block on another, or on itself), ``AskTimeoutError`` when no
        answer came in time, or the exception the actor answered with.
        """
        refuse_blocking()
        with self._lock:
            event = None
            if not self._done:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        if event is not None and not event.wait(timeout):
            msg = f"no answer within {timeout} s"
            raise AskTimeoutError(msg)
        return self._result()

    async def get_async(self, timeout: float) -> Any:
        """Await the answer without blocking the event loop; errors as ``get``."""
        with self._lock:
            if self._done:
                return self._result()
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            wake = functools.partial(call_soon, loop, _set_done, fut)
            self._callbacks.append(wake)
        timer = loop.call_later(timeout, _set_done, fut)
        try:
            await fut
        finally:
            timer.cancel()
            if not self._done:  # timed out, or the caller was cancelled: nothing left behind
                with self._lock:
                    if wake in self._callbacks:
                        self._callbacks.remove(wake)
        if not self._done:
            msg = f"no answer within {timeout} s"
            raise AskTimeoutError(msg)
        return self._result()
