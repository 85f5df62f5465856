"""What a session's handle asks of the tape of a recorded (or replayed) run.

``supervision`` records a subtree's run and replays it (issue 26); the
handle only tells the tape what its skill met, and in a replay takes from
it what the skill is to meet: clock readings, the random seed, where a
cancellation reaches the skill, and when a child's result may arrive.
Model replies are taped where the call goes out, in ``supervision``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

from sessiontree.actors._clock import Clock, TimerHandle
from sessiontree.protocol import ErrorCode, ErrorInfo, SessionResult, SpawnSpec

__all__ = ["Tape", "TapedClock"]


class Tape(Protocol):
    """One session's tape. Every method runs on the thread that calls it (the
    skill's, the event loop's for an async skill, the Cortex's for
    ``defer_cancel`` and ``holds``) and never raises for what the skill does;
    in a replay that diverged, the tape has reported it and its session is
    being ended by force. ``replaying``: the tape hands out a recording."""

    replaying: bool

    def read(self, which: str, value: Callable[[], float]) -> float:
        """A clock reading (``which``: ``monotonic`` or ``time``): ``value()``,
        recorded; in a replay, the recorded reading."""
        ...

    def at(self, when: float) -> float:
        """A ``monotonic`` instant the skill computed from its readings, on the clock."""
        ...

    def seed(self) -> int:
        """The seed of the session's random numbers: drawn and recorded, or replayed."""
        ...

    def checkpoint(self, again: bool) -> None:
        """A checkpoint (``again``: of a call that checked already, after a
        wait): in a replay, a cancellation recorded at this call is applied now."""
        ...

    def defer_cancel(self, code: ErrorCode) -> bool:
        """True to keep a cancellation from the skill until its recorded place
        (a replay), False to let it through."""
        ...

    def interrupted(self, code: ErrorCode, *, fenced: bool) -> None:
        """``Cancelled(code)`` is raised into the skill here (``fenced``: the
        session has ended under it, and every later call raises too)."""
        ...

    def spawned(
        self,
        specs: Sequence[SpawnSpec],
        children: Sequence[uuid.UUID | None],
        refused: Sequence[ErrorInfo | None],
    ) -> None:
        """One spawn call's specs and their answers (the child, or why none), in order."""
        ...

    def took(self, children: Sequence[uuid.UUID]) -> None:
        """The skill took these children's results, in this order."""
        ...

    def cancelled_child(self, child: uuid.UUID) -> None:
        """The skill cancelled this child."""
        ...

    def holds(self, result: SessionResult) -> bool:
        """True to keep a child's result back until its recorded turn (a replay)."""
        ...

    def end_run(self, report: Callable[[], None]) -> None:
        """The skill's run ended: ``report`` it, now or in its recorded turn."""
        ...


class TapedClock:
    """The clock a recorded session's skill reads: readings go through its
    tape; timers run on the node's clock."""

    __slots__ = ("_clock", "_tape")

    def __init__(self, clock: Clock, tape: Tape) -> None:
        self._clock = clock
        self._tape = tape

    def time(self) -> float:
        return self._tape.read("time", self._clock.time)

    def monotonic(self) -> float:
        return self._tape.read("monotonic", self._clock.monotonic)

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self._clock.call_later(delay, callback)

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return self._clock.call_at(self._tape.at(when), callback)
