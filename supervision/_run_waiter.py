"""A ``Run``'s waiter: its caller waits for the child's end, not its spawn.

A refused spawn answers the run at once; a new child gets the run's reply as
the waiter of its end, with the run's timeout armed (it cancels the child
``timed_out`` through the Cortex's mailbox). A store error of the child's
end is answered as what the store refused, never raised.
"""

from __future__ import annotations

import uuid
from typing import Any

from sessiontree.actors import TimerHandle
from sessiontree.actors.runtime import Reply, post
from sessiontree.protocol import ErrorCode, StoreError, UnknownSessionError
from sessiontree.supervision._commits import store_error
from sessiontree.supervision._entry import SpawnAnswer
from sessiontree.supervision._queries import await_result
from sessiontree.supervision._requests import DEFERRED, Call, Interrupt
from sessiontree.supervision._tree import Tree

__all__ = ["RunWaiter"]


class RunWaiter:
    """The ``set``/``fail`` of a ``Reply`` for a ``Run``'s spawn: a refusal is
    answered at once, a new session gets the run's reply as its waiter (with
    a timeout, a ``_TimedWaiter`` holding the timer that cancels it)."""

    __slots__ = ("reply", "started", "timeout", "tree")

    def __init__(self, tree: Tree, reply: Reply, timeout: float | None = None) -> None:
        self.tree, self.reply, self.timeout = tree, reply, timeout
        self.started = tree.rt.clock.monotonic()

    def set(self, answer: SpawnAnswer) -> None:
        reply: Reply | _StoreRefusal = self.reply
        sid = answer.session_id
        if sid is None:
            reply.set(answer.error)
            return
        if answer.unstored is not None:  # it ran, but its record was refused: so is its end
            reply.set(answer.unstored)
            return
        # started before its record was durable: a store that refused its end is
        # answered as a refused spawn would be, never raised
        reply = _StoreRefusal(self.reply, sid)
        waiter: Reply | _StoreRefusal | _TimedWaiter = reply
        if self.timeout is not None:  # armed first: an end answered at once disarms it
            waiter = _TimedWaiter(reply, self._time_out(sid, self.timeout))
        try:
            value = await_result(self.tree, sid, waiter)  # type: ignore[arg-type]
        except UnknownSessionError as exc:  # gone already: never fails the Cortex
            waiter.fail(exc)
            return
        if value is not DEFERRED:
            waiter.set(value)

    def _time_out(self, session_id: uuid.UUID, timeout: float) -> TimerHandle:
        """At the run's timeout, cancel ``session_id`` (``timed_out``) through
        the Cortex's mailbox; nothing for a session that has ended by then."""
        tree = self.tree
        ref, rt = tree.ref, tree.rt
        assert ref is not None

        def fire() -> None:
            post(ref, Call(Interrupt(session_id, ErrorCode.TIMED_OUT)), rt.activity)

        left = self.started + timeout - rt.clock.monotonic()
        return rt.clock.call_later(max(0.0, left), fire)

    def fail(self, error: BaseException) -> None:
        self.reply.fail(error)


class _StoreRefusal:
    """A run's reply: a store error of its session's end is answered as what the
    store refused (``store_error``), as a refused spawn is."""

    __slots__ = ("reply", "session_id")

    def __init__(self, reply: Reply, session_id: uuid.UUID) -> None:
        self.reply, self.session_id = reply, session_id

    def set(self, value: Any) -> None:
        self.reply.set(value)

    def fail(self, error: BaseException) -> None:
        if isinstance(error, StoreError):
            self.reply.set(store_error(error, self.session_id))
        else:
            self.reply.fail(error)


class _TimedWaiter:
    """A run's reply while its timeout is armed: the session's end disarms it."""

    __slots__ = ("reply", "timer")

    def __init__(self, reply: Reply | _StoreRefusal, timer: TimerHandle) -> None:
        self.reply, self.timer = reply, timer

    def set(self, value: Any) -> None:
        self.timer.cancel()
        self.reply.set(value)

    def fail(self, error: BaseException) -> None:
        self.timer.cancel()
        self.reply.fail(error)
