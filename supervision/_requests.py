"""What the Node asks of the Cortex: one frozen type per operation.

Each request names the type of its answer (``Request[T]``), so
``Node._call(Spawn(parent_id, spec))`` is a ``SpawnAnswer`` to mypy and to a
reader, and the Cortex handles each one in a ``match`` (``Cortex._answer``);
mypy checks the caller's side, the arms of that match answer what their
request names by review and by the tests.
A request travels in a ``Call`` envelope with the ``Reply`` its caller waits on
(None for a request nobody waits for).

A request the Cortex cannot apply for a caller's reason (an unknown session,
bad input, a closed node) fails its reply with that typed error and changes
nothing; a refused spawn or send is an answer (``SpawnAnswer``, ``ErrorInfo``),
not an error. A feature's own requests (a model call's ``Reserve`` and
``Settle``) are defined by the feature and answered by its extension.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import pykka

from sessiontree.actors.runtime import Reply, SessionCore
from sessiontree.protocol import (
    ControlMessage,
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnSpec,
    Spending,
)
from sessiontree.supervision._entry import SpawnAnswer

__all__ = [
    "DEFERRED",
    "AwaitResult",
    "BeginShutdown",
    "BringBack",
    "Call",
    "Cancel",
    "Control",
    "ForceWorkers",
    "ForgetWaiter",
    "GetActorRef",
    "GetInfo",
    "GetResult",
    "GetResults",
    "GetSpending",
    "GetStats",
    "GetTree",
    "Interrupt",
    "ListSessions",
    "ListStuck",
    "OpenMain",
    "ProbeParked",
    "Redeliver",
    "ReleaseParked",
    "ReleaseReplay",
    "Request",
    "Resume",
    "Run",
    "Send",
    "ShutdownDeadline",
    "ShutdownPending",
    "Spawn",
    "SpawnMany",
    "StopAll",
    "Suspend",
]

T = TypeVar("T")


class Request(msgspec.Struct, Generic[T], frozen=True):
    """A Node -> Cortex operation whose answer is a ``T``."""


class Call(msgspec.Struct, frozen=True):
    """The envelope: ``request``, answered on ``reply`` (None: nobody waits)."""

    request: Request[Any]
    reply: Reply | None = None


# -- changing the tree -----------------------------------------------------------


class OpenMain(Request[uuid.UUID], frozen=True):
    """Get or create the one Main of ``agent_id`` for session ``key``."""

    agent_id: str
    key: str


class Spawn(Request[SpawnAnswer], frozen=True):
    """Validate and create a child of ``parent_id``. ``by_skill``: the parent's
    own skill asks, so the child starts, and is answered, once its record is
    queued (see ``Spawning.spawn``)."""

    parent_id: uuid.UUID
    spec: SpawnSpec
    by_skill: bool = False


class Run(Request[SessionResult | ErrorInfo], frozen=True):
    """``Spawn`` and ``AwaitResult`` in one turn: answered with the new
    session's result once it ends (its terminal write durable), or with the
    ``ErrorInfo`` that refused the spawn. ``timeout`` (clock seconds from
    now): then the session and its subtree are cancelled with the node's
    grace, code ``timed_out``, and the answer is the result that ends it."""

    parent_id: uuid.UUID
    spec: SpawnSpec
    timeout: float | None = None


class SpawnMany(Request[list[SpawnAnswer]], frozen=True):
    """``Spawn`` for each spec, in one turn of the Cortex and one commit
    (``by_skill`` as for ``Spawn``)."""

    parent_id: uuid.UUID
    specs: tuple[SpawnSpec, ...]
    by_skill: bool = False


class Send(Request[ErrorInfo | None], frozen=True):
    """Queue an inbound message for a Main (one message cycle); ``unwedge``: the
    held-back item it requeues, dropped in the same commit (``message_id``: the
    identity it was accepted with, kept); ``trace``: the caller's span (a
    traced node's cycle span continues it); ``request_id``: the sender's
    idempotency key (a repeat while the first is in the inbox is answered as
    the first was, and queues nothing)."""

    session_id: uuid.UUID
    message: object
    unwedge: uuid.UUID | None = None
    trace: str | None = None
    message_id: uuid.UUID | None = None
    request_id: str | None = None


class Cancel(Request[ErrorInfo | None], frozen=True):
    """Cancel a session and its whole subtree, with one deadline: now +
    ``grace`` (None: the node's; 0: at once, what runs ends by force);
    ``reason``: who or why, recorded on the events and the results."""

    session_id: uuid.UUID
    grace: float | None = None
    reason: str | None = None


class Interrupt(Request[None], frozen=True):
    """A replay reached the place where its recording was interrupted: end
    the session as it was then (``ttl_expired``: it expires;
    ``terminated_by_force``: it is forced; otherwise it and its subtree are
    cancelled with that code and the node's grace)."""

    session_id: uuid.UUID
    code: ErrorCode


class Suspend(Request[ErrorInfo | None], frozen=True):
    """Ask a Branch to park at its next checkpoint."""

    session_id: uuid.UUID


class Resume(Request[ErrorInfo | None], frozen=True):
    """Resume a suspended Branch (or withdraw a suspension not yet taken)."""

    session_id: uuid.UUID


class Control(Request[object], frozen=True):
    """Apply one decoded control command; its answer is the command's."""

    command: ControlMessage


class BringBack(Request[None], frozen=True):
    """Apply recovery's plan: the first request a node with a store sends."""


class ReleaseReplay(Request[int], frozen=True):
    """Run what a held replay kept back; answers how many pieces of work."""


class Redeliver(Request[ErrorInfo | None], frozen=True):
    """Run a Main's cycle again for a child's result recovery held back (already
    filed on it); the held-back item ``unwedge`` is dropped first, durably."""

    session_id: uuid.UUID
    result: SessionResult
    unwedge: uuid.UUID


# -- reading the tree --------------------------------------------------------------


class GetInfo(Request[SessionInfo], frozen=True):
    """The session's identity with its current state."""

    session_id: uuid.UUID


class AwaitResult(Request[SessionResult | None], frozen=True):
    """Answer once the session has a result (and its terminal write is durable);
    the call's reply is the waiter ``ForgetWaiter`` names."""

    session_id: uuid.UUID


class ForgetWaiter(Request[None], frozen=True):
    """Drop the waiter of an ``AwaitResult`` whose caller gave up."""

    session_id: uuid.UUID
    reply: Reply


class GetResult(Request[SessionResult | None], frozen=True):
    """The session's result if it has ended, else None."""

    session_id: uuid.UUID


class GetResults(Request[list[SessionResult]], frozen=True):
    """The results the session has received."""

    session_id: uuid.UUID


class GetSpending(Request[Spending], frozen=True):
    """The session's accounts: usage, its subtree's, budget and what is left."""

    session_id: uuid.UUID


class GetTree(Request[dict[str, Any]], frozen=True):
    """The subtree under ``session_id`` as nested dicts."""

    session_id: uuid.UUID


class ListSessions(Request[list[SessionInfo]], frozen=True):
    """Every session the index holds, optionally filtered."""

    state: SessionState | None = None
    kind: SessionKind | None = None


class ListStuck(Request[list[SessionInfo]], frozen=True):
    """Sessions flagged as stuck."""


class GetStats(Request[dict[str, int]], frozen=True):
    """Counters and gauges of the tree."""


class GetActorRef(Request[pykka.ActorRef[Any] | None], frozen=True):
    """The session's actor, for diagnostics (None when it holds none)."""

    session_id: uuid.UUID


class ProbeParked(Request[tuple[bool, object, Exception | None]], frozen=True):
    """Run ``probe`` on a live session that holds no actor (a parked branch)."""

    session_id: uuid.UUID
    probe: Callable[[SessionCore], object]


# -- shutting down ------------------------------------------------------------------


class BeginShutdown(Request[list[SessionInfo]], frozen=True):
    """Stop taking work and settle the tree within ``grace`` seconds."""

    grace: float


class ShutdownDeadline(Request[None], frozen=True):
    """The shutdown's grace ran out: force what still runs, then settle."""


class ShutdownPending(Request[int], frozen=True):
    """How many sessions the shutdown begun still waits for (0: it has settled)."""


class ForceWorkers(Request[None], frozen=True):
    """Force every worker and remote step still running."""


class ReleaseParked(Request[None], frozen=True):
    """Let every running skill go (``Cancelled`` with ``node_closed`` at its
    checkpoint); answered once the runs held at a checkpoint ended (a step of
    a shutdown)."""


class StopAll(Request[int], frozen=True):
    """Stop every session actor still running (the last step of a shutdown)."""


#: What an operation returns when it answers its reply itself, later (once a
#: session ends, or a shutdown settles). One that waits for a store write
#: returns its rest instead, a coroutine whose value answers (``Commits.after``).
DEFERRED: object = object()
