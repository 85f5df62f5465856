"""The Cortex's index and mailbox vocabulary: its messages, its record of each
session (``Entry``) and the runtime pieces it drives (``Runtime``)."""

from __future__ import annotations

import collections
import concurrent.futures
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pykka

from sessiontree.actors import Clock, TimerHandle
from sessiontree.actors.runtime import (
    Activity,
    Backends,
    ComputeSlots,
    Dispatcher,
    EventLoopThread,
    Reply,
    RunEnd,
    SessionCore,
    SessionHost,
    StepExecutor,
)
from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._events import EventBus

if TYPE_CHECKING:
    from sessiontree.supervision._persist import Persister
    from sessiontree.supervision._recovery import Recovered

__all__ = [
    "AfterWrite",
    "Call",
    "ChildUpdate",
    "Deadline",
    "Entry",
    "Expire",
    "Granted",
    "Idle",
    "Parked",
    "Progress",
    "Reap",
    "Refused",
    "RunEnded",
    "RunsEnded",
    "Runtime",
    "SharedTtl",
    "SpawnAnswer",
    "Tick",
]


# -- messages ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """A request: run ``op_<name>(*args)`` and answer on ``reply``."""

    name: str
    args: tuple[Any, ...]
    reply: Reply | None = None


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


class SharedTtl:
    """One TTL timer for sessions created at one instant with one TTL: the
    children of a batched spawn (any other session has a share of its own).
    A timer and its callback per child were a tenth of a spawn.

    Each member calls ``cancel()`` once, as it ends; the timer is cancelled
    when the last member has ended. When it fires (on the clock's thread),
    ``expire`` gets one ``Expire`` of every member; the Cortex passes over
    those already ended.
    """

    __slots__ = ("expire", "ids", "left", "timer")

    def __init__(self, expire: Callable[[Expire], object]) -> None:
        self.expire = expire
        self.ids: list[uuid.UUID] = []
        self.left = 0
        self.timer: TimerHandle | None = None

    def add(self, session_id: uuid.UUID) -> None:
        self.ids.append(session_id)
        self.left += 1

    def cancel(self) -> None:
        """One member ended (call once per member)."""
        self.left -= 1
        if self.left <= 0 and self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.ids = []  # rebound, not cleared: a firing timer may be reading it

    def __call__(self) -> None:
        self.expire(Expire(tuple(self.ids)))


@dataclass(frozen=True, slots=True)
class Deadline:
    session_ids: tuple[uuid.UUID, ...]


@dataclass(frozen=True, slots=True)
class Progress:
    session_id: uuid.UUID
    note: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChildUpdate:
    session_id: uuid.UUID
    message: Any


@dataclass(frozen=True, slots=True)
class Refused:
    session_id: uuid.UUID
    what: str


@dataclass(frozen=True, slots=True)
class AfterWrite:
    """A store write the Cortex waited on finished: run ``then(error)`` (None: durable)."""

    then: Callable[[BaseException | None], None]
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class Tick:
    """The periodic check: stuck sessions and memory pressure."""


@dataclass(frozen=True, slots=True)
class Reap:
    """The node went idle: stop the actors of sessions that ended meanwhile."""


# -- state ------------------------------------------------------------------


@dataclass(slots=True)  # one per spawn: not frozen, see Expire
class SpawnAnswer:
    """The Cortex's answer to a spawn: a session id or an error; ``existing`` for a
    repeated ``request_id``."""

    session_id: uuid.UUID | None
    error: ErrorInfo | None
    existing: bool = False


@dataclass(eq=False, slots=True)
class Entry:
    """The Cortex's record of one session (the tree index is a dict of these)."""

    core: SessionCore
    agent: Agent
    skill: Callable[[Any], Any]
    is_async: bool
    parent: Entry | None
    ref: pykka.ActorRef[Any] | None = None
    children: dict[uuid.UUID, None] = field(default_factory=dict)
    live_children: int = 0
    requests: dict[str, uuid.UUID] = field(default_factory=dict)
    cancel_code: ErrorCode | None = None
    suspend_requested: bool = False
    ttl_timer: SharedTtl | None = None
    grant: Callable[[], None] | None = None
    result: SessionResult | None = None
    waiters: list[Reply] = field(default_factory=list)
    last_progress: tuple[str, dict[str, Any]] | None = None
    started_at: float | None = None
    zombie: bool = False
    shutdown_park: bool = False
    # persistence: results got since the last snapshot (their receipts), the
    # next inbox number, whether the creation is durable (and who waits for
    # it), the terminal write, and whether resuming re-runs the skill (a
    # branch that came back from the store)
    receipts: list[SessionResult] = field(default_factory=list)
    next_seq: int = 0
    persisted: bool = True
    on_persisted: list[Callable[[BaseException | None], None]] = field(default_factory=list)
    final_write: concurrent.futures.Future[None] | None = None
    rerun: bool = False
    # passivation (Mains): inputs posted so far, the monotonic time of the last
    # one, inbound writes not yet durable, the mark a Passivate asked about, the
    # write of its last snapshot
    mark: int = 0
    idle_since: float = 0.0
    inflight: int = 0
    passivating: int | None = None
    snapshot_write: concurrent.futures.Future[None] | None = None
    # str(session_id), once it was needed (see _cortex._id_text)
    id_text: str | None = None

    @property
    def session_id(self) -> uuid.UUID:
        return self.core.session_id

    @property
    def info(self) -> SessionInfo:
        return self.core.info

    @property
    def state(self) -> SessionState:
        return self.core.state

    @property
    def kind(self) -> SessionKind:
        return self.core.info.kind

    @property
    def needs_thread(self) -> bool:
        return not self.is_async and self.kind is not SessionKind.MAIN


@dataclass
class Runtime:
    """The pieces of a node the Cortex drives (built by ``Node``)."""

    config: NodeConfig
    clock: Clock
    activity: Activity
    slots: ComputeSlots
    executor: StepExecutor
    main_executor: StepExecutor
    loop: Callable[[], EventLoopThread]
    events: EventBus
    host: SessionHost
    agents: dict[str, Agent]
    on_fatal: Callable[[BaseException], None]
    on_failed: Callable[[BaseException], None]
    persist: Persister
    recovered: Recovered | None = None
    dispatcher: Dispatcher | None = None
    backends: Backends = field(default_factory=lambda: Backends({}))
    counters: collections.Counter[str] = field(default_factory=collections.Counter)
