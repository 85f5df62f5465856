"""The Cortex's record of one session in the tree index (``TreeEntry``), its
accounts (``Ledger``), the answer to a spawn, and the TTL timer a batch of
children shares."""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import pykka

from sessiontree.actors import TimerHandle
from sessiontree.actors.runtime import Reply, SessionCore
from sessiontree.protocol import (
    Budget,
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    Usage,
)
from sessiontree.supervision._config import Agent
from sessiontree.supervision._reports import Expire

if TYPE_CHECKING:
    from sessiontree.supervision._events import EventKind

__all__ = [
    "NOTHING",
    "Ledger",
    "Reserved",
    "Sent",
    "SessionWatch",
    "SharedTtl",
    "SpawnAnswer",
    "TreeEntry",
    "forget_consumed",
    "id_text",
    "unsettled",
    "with_state",
]


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


@dataclass(slots=True)  # one per spawn: not frozen, see _reports.RunEnded
class SpawnAnswer:
    """The Cortex's answer to a spawn: a session id or an error; ``existing`` for a
    repeated ``request_id``."""

    session_id: uuid.UUID | None
    error: ErrorInfo | None
    existing: bool = False
    clamped: bool = False  # its budget was narrowed to what its parent had left
    # a child that started before its record was durable, and whose record the
    # store refused (it ended failed): why, for a run to answer as a refusal
    unstored: ErrorInfo | None = None


NOTHING = Usage()


@dataclass(slots=True)
class Ledger:
    """One session's accounts (Cortex thread only)."""

    budget: Budget | None = None
    own: Usage = NOTHING
    subtree: Usage = NOTHING
    reserved: Usage = NOTHING
    # a Main's budget holds per message cycle: its subtree's usage when the
    # current cycle began, taken off what the budget counts
    window: Usage = NOTHING
    exhausted: str | None = None  # the dimension that ran out
    warned: bool = False
    clamped: bool = False  # its budget is narrower than its spawn asked

    def new_cycle(self) -> None:
        """A Main's message cycle ended: its budget counts afresh for the next."""
        self.window = self.subtree
        self.exhausted = None
        self.warned = False

    def counted(self) -> Usage:
        """What the budget counts: the subtree's usage (a Main's, this cycle's)."""
        return self.subtree - self.window

    @property
    def settled(self) -> bool:
        """True when no model call is in flight in the subtree (its figures are final)."""
        return not self.reserved.calls

    def committed(self) -> Usage:
        """What is counted and what calls in flight hold: where the soft threshold is read."""
        return self.subtree - self.window + self.reserved


@dataclass(frozen=True, slots=True)
class Reserved:
    """A call's reservation: what it holds against its session and ancestors
    (``chain``, the session first), and the completion tokens it may ask for
    (``None``: unbounded); ``call_id`` names its record in the store."""

    ask: Usage
    max_tokens: int | None
    chain: tuple[uuid.UUID, ...] = ()
    call_id: uuid.UUID = field(default_factory=uuid.uuid4)


def unsettled(entry: TreeEntry) -> bool:
    """True while a model call is in flight in ``entry``'s subtree: its usage
    still moves, so an ended one stays in the index until the call settles."""
    ledger = entry.ledger
    return ledger is not None and not ledger.settled


class SessionWatch(Protocol):
    """A feature following one session (``TreeEntry.watchers``), told on the
    Cortex thread what the node does to it."""

    def event(
        self, kind: EventKind, state: SessionState, code: ErrorCode | None, data: Any
    ) -> None:
        """One of the session's events (told even when no listener would see it)."""

    def fenced(self, code: ErrorCode, inside: bool) -> None:
        """The node ended the session under its skill (``inside``: the skill
        waits in a call of its handle now)."""

    def ended(self, result: SessionResult) -> None:
        """The session ended with ``result`` (after everything else of its ending)."""

    def discarded(self) -> None:
        """The session was taken out as never made (its record was refused)."""


@dataclass(eq=False, slots=True)
class TreeEntry:
    """The Cortex's record of one session (the tree index is a dict of these)."""

    core: SessionCore
    agent: Agent
    skill: Callable[[Any], Any]
    is_async: bool
    parent: TreeEntry | None
    ref: pykka.ActorRef[Any] | None = None
    children: dict[uuid.UUID, None] = field(default_factory=dict)
    live_children: int = 0
    requests: dict[str, uuid.UUID] = field(default_factory=dict)
    cancel_code: ErrorCode | None = None
    cancel_reason: str | None = None  # who or why, as the cancel that reached it said
    cancel_deadline: float | None = None  # on the node's clock, once cancel was requested
    suspend_requested: bool = False
    ttl_timer: SharedTtl | None = None
    grant: Callable[[], None] | None = None
    result: SessionResult | None = None
    waiters: list[Reply] = field(default_factory=list)
    last_progress: tuple[str, dict[str, Any]] | None = None
    started_at: float | None = None
    zombie: bool = False
    shutdown_park: bool = False
    pressured: bool = False  # suspended by memory pressure (stored with its record)
    # persistence: results got since the last snapshot (their receipts), the
    # next inbox number, whether the creation is durable (and what awaits
    # its write: ``Commits.durable``), the terminal write, and whether resuming re-runs the skill (a
    # branch that came back from the store)
    receipts: list[SessionResult] = field(default_factory=list)
    next_seq: int = 0
    # False: nothing of it is written (a worker its running Branch's skill
    # spawned: that parent does not survive a restart); a suspend writes it.
    # A parent's results of such children, not written either (its suspend
    # files or owes them)
    recorded: bool = True
    unwritten: list[SessionResult] = field(default_factory=list)
    # a Main: the messages sent with an idempotency key still in its inbox
    # (request id -> their acceptance; see ``_messages.Sent``)
    sent: dict[str, Sent] | None = None
    persisted: bool = True
    record_write: Awaitable[BaseException | None] | None = None  # its wait, until settled
    final_write: concurrent.futures.Future[None] | None = None
    rerun: bool = False
    # passivation (Mains): inputs posted so far, the monotonic time of the last
    # one, inbound writes not yet durable, the mark a Passivate asked about, the
    # write of its last snapshot, and the inbox numbers of cycles that ran but
    # whose snapshot the store refused (the next snapshot drops them)
    mark: int = 0
    idle_since: float = 0.0
    inflight: int = 0
    passivating: int | None = None
    snapshot_write: concurrent.futures.Future[None] | None = None
    unconsumed: list[int] | None = None
    # str(session_id), once it was needed (see id_text)
    id_text: str | None = None
    # budget and usage, once the session is bounded or has spent (see _ledger)
    ledger: Ledger | None = None
    # the features following this session (see _extension); () for most
    watchers: tuple[SessionWatch, ...] = ()

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


def id_text(entry: TreeEntry) -> str:
    """``str(entry.session_id)``, made once per session: a cascade needs it in the
    session's ending message and in the delivery event of each of its children.
    (msgspec writes the same canonical form in C, at a fifth of the cost.)"""
    text = entry.id_text
    if text is None:
        text = entry.id_text = msgspec.to_builtins(entry.core.session_id)
    return text


def with_state(entry: TreeEntry) -> SessionInfo:
    """The session's identity with its current state."""
    info = entry.info
    if info.state is entry.state:
        return info
    return msgspec.structs.replace(info, state=entry.state)


class Sent:
    """A message sent with an idempotency key, while it is in its Main's inbox:
    its identity, its acceptance once known, and, until then, the inbox write
    that decides it (a repeat awaits it, then reads the acceptance)."""

    __slots__ = ("answer", "done", "id", "written")

    def __init__(self, message_id: uuid.UUID, *, done: bool = False) -> None:
        self.id = message_id
        self.answer: ErrorInfo | None = None
        self.done = done
        self.written: Awaitable[BaseException | None] | None = None

    def answered(self, answer: ErrorInfo | None) -> None:
        self.answer, self.done, self.written = answer, True, None


def forget_consumed(entry: TreeEntry, input_key: str | None) -> None:
    """A Main's cycle ran the input keyed ``input_key`` (``CycleInput.key``: a
    message's is ``m`` and its identity): a key it was sent with is kept no
    longer, as its inbox record is not (a later send with it is a new message)."""
    sent = entry.sent
    if not sent or input_key is None:
        return
    for request_id, first in list(sent.items()):
        if f"m{first.id}" == input_key:
            del sent[request_id]
            return
