"""What the runtime reports to the Cortex: sessions' runs and timers.

Each is a small message the Cortex takes in its mailbox and ``match``es
(``Cortex._dispatch``); none carries an answer back. The Node's own
requests are in ``_requests``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sessiontree.actors.runtime import RunEnd

__all__ = [
    "ChildUpdate",
    "Deadline",
    "Expire",
    "Granted",
    "Idle",
    "Parked",
    "Progress",
    "Reap",
    "Refused",
    "RunEnded",
    "RunsEnded",
    "Streamed",
    "Tick",
]


# Made once per ended run, on the event loop: plain slots (a frozen
# dataclass's __init__ costs several times as much, an object.__setattr__ a field).
@dataclass(slots=True)
class RunEnded:
    session_id: uuid.UUID
    end: RunEnd


@dataclass(frozen=True, slots=True)
class RunsEnded:
    """Runs that ended in one pass of the event loop, reported together."""

    ends: tuple[RunEnded, ...]


@dataclass(frozen=True, slots=True)
class Parked:
    session_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Idle:
    """A Main's actor answered ``Passivate``: nothing queued, no cycle running
    (``mark`` is the input count it saw; None: it was busy)."""

    session_id: uuid.UUID
    mark: int | None


@dataclass(frozen=True, slots=True)
class Granted:
    session_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Expire:
    """The TTL of these sessions ran out (those still live end ``expired``)."""

    session_ids: tuple[uuid.UUID, ...]


@dataclass(frozen=True, slots=True)
class Deadline:
    session_ids: tuple[uuid.UUID, ...]


@dataclass(frozen=True, slots=True)
class Progress:
    session_id: uuid.UUID
    note: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CycleStarted:
    """A traced Main's cycle ``cycle`` started under span ``trace`` (a child of
    ``parent``, linked to ``cut_off``: the run a crash cut off), at ``at``."""

    session_id: uuid.UUID
    cycle: int
    trace: str
    parent: str | None
    cut_off: str | None
    at: float


@dataclass(frozen=True, slots=True)
class Streamed:
    """Pieces of streamed model replies that arrived in one pass of the event
    loop, as (session id, text) in arrival order: each is a progress report
    of its session with ``{"delta": text}``."""

    pieces: tuple[tuple[uuid.UUID, str], ...]


@dataclass(frozen=True, slots=True)
class ChildUpdate:
    session_id: uuid.UUID
    message: Any


@dataclass(frozen=True, slots=True)
class Refused:
    session_id: uuid.UUID
    what: str


@dataclass(frozen=True, slots=True)
class Tick:
    """The periodic check: stuck sessions and memory pressure. ``memory``: the
    memory probe's reading (None: no probe, or no reading), taken on the
    clock's timer thread so its file reads never hold up the Cortex's turn."""

    memory: float | None = None


@dataclass(frozen=True, slots=True)
class Reap:
    """The node went idle: stop the actors of sessions that ended meanwhile."""
