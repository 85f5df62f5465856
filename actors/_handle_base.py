"""What both of a skill's handles share (``Session`` and ``AsyncSession``):
the session's identity and context, claiming children's results, and the
checks every call makes first.

Every method of a handle is a checkpoint: a pending cancellation raises
``Cancelled`` into the skill (once; afterwards the skill has the rest of the
grace period to wrap up and return a partial result), a pending suspension
parks the skill until it is resumed, and a fenced session (terminated by
force or expired) gets ``Cancelled`` every time.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from sessiontree.actors._clock import Clock
from sessiontree.actors._compaction import Compaction
from sessiontree.actors._context import ContextMessage, SessionContext
from sessiontree.actors._conversing import ConversationLike, LinkedContext
from sessiontree.actors._core import Cancelled, SessionCore
from sessiontree.actors._host import SessionHost, SpawnedLike
from sessiontree.actors._tape import TapedClock
from sessiontree.protocol import (
    Collected,
    Completion,
    ErrorCode,
    Message,
    NotAllowedError,
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SessionResult,
    SpawnSpec,
)

__all__ = ["HandleBase", "context_message", "landing", "never", "usage_of"]


class HandleBase:
    """What both handles share: identity, context and the non-blocking checks."""

    def __init__(
        self, core: SessionCore, host: SessionHost, *, message: Any = None, cycle: int = 0
    ) -> None:
        self._core = core
        self._host = host
        self._spawned: dict[uuid.UUID, None] = {}  # in spawn order
        self._taken: set[uuid.UUID] = set()
        self._random: random.Random | None = None
        self.message = message
        """For a Main: the inbound message (or child ``SessionResult``) of this cycle."""
        self.cycle = cycle
        """For a Main: which message cycle this is (1, 2, …); 0 for branches and workers."""

    # -- identity (no checkpoint) ---------------------------------------------

    @property
    def info(self) -> SessionInfo:
        """This session's identity as it was spawned."""
        return self._core.info

    @property
    def session_id(self) -> uuid.UUID:
        return self._core.session_id

    @property
    def agent_id(self) -> str:
        return self._core.info.agent_id

    @property
    def kind(self) -> SessionKind:
        return self._core.info.kind

    @property
    def depth(self) -> int:
        return self._core.info.depth

    @property
    def task(self) -> str:
        return self._core.info.task

    @property
    def context_summary(self) -> str:
        return self._core.info.context_summary

    @property
    def input(self) -> Any:
        """The structured input the spawn carried (JSON data: dicts, lists, str,
        numbers, bools), or None; a branch resumed after a restart still has it."""
        return self._core.info.input

    @property
    def model_tier(self) -> str | None:
        return self._core.info.model_tier

    @property
    def clock(self) -> Clock:
        """The node's clock (``monotonic()`` for deadlines; tests advance a virtual
        one). In a recorded run its readings are recorded, and replayed."""
        core = self._core
        tape = core.tape
        return core.clock if tape is None else TapedClock(core.clock, tape)

    @property
    def random(self) -> random.Random:
        """This run's random numbers: draw them here (not from the ``random``
        module) and a recorded run replays with the same ones. Seeded from the
        system's entropy, or in a recorded run by a seed its tape keeps."""
        drawn = self._random
        if drawn is None:
            tape = self._core.tape
            seed = None if tape is None else tape.seed()
            drawn = self._random = random.Random(seed)  # noqa: S311 (a skill's, not secrets)
        return drawn

    @property
    def resumed(self) -> bool:
        """True when this run continues a suspended branch after a node restart."""
        return self._core.resumed

    @property
    def attempt(self) -> int:
        """Which run of this work this is: 1, or more when crashes of the node cut
        earlier runs off (a Main's cycle whose message is replayed after a
        restart, a branch run again after one). A skill whose effects live
        outside the store deduplicates them on it. In a Main's cycle on a node
        with a store, reading it waits until the cycle's start is on record (one
        commit at most), so a crash after the read counts against the input."""
        core = self._core
        if core.mark_durable is not None:
            core.mark_durable()
        return core.attempt

    @property
    def traceparent(self) -> str | None:
        """On a traced node, the W3C ``traceparent`` of this run's span (a Main's:
        its running cycle's), to hand to a service the skill calls; None on a
        node that is not traced. The span is also the current OpenTelemetry
        span while the skill runs."""
        return self._core.cycle_trace or self._core.info.trace

    @property
    def context(self) -> SessionContext:
        """The session's working context (messages, tool results, system prompt)."""
        return self._core.context

    @property
    def cancel_pending(self) -> bool:
        """True once cancellation was requested (not a checkpoint; never raises)."""
        return self._core.cancel_code is not None or self._core.fenced

    @property
    def cancel_reason(self) -> ErrorCode | None:
        """Why cancellation was requested, if it was."""
        return self._core.cancel_code

    @property
    def children(self) -> tuple[uuid.UUID, ...]:
        """Children this run spawned, in order."""
        return tuple(self._spawned)

    @property
    def conversation(self) -> ConversationLike:
        """This session's conversation tree (``append``, ``fork``, ``context``…).

        A Main's is the conversation of its session key. A Branch's or
        Worker's is its own branch of its root Main's conversation, forked
        where its spawn said (``SpawnSpec.fork_at``): what ``complete`` sends
        and records, what ``add_message`` writes; a Branch's is durable, a
        Worker's lives in memory only. Every call on it is a checkpoint.
        Async skills await the write twins (``aappend``…); reads are local,
        and a read of a Main's context first waits (briefly, bounded) for the
        children's results being written to it.
        """
        return self._host.conversation(self._core, self._conversation_guard)

    def _linked(self) -> LinkedContext | None:
        """A spawned session's context branch (None for a Main)."""
        return self._host.linked_context(self._core, self._conversation_guard)

    def _compaction(
        self, linked: LinkedContext
    ) -> tuple[Compaction, list[Message], list[dict[str, Any]]] | None:
        """What a due compaction replaces: the agent's rule, the old messages and
        them as chat messages; None when there is nothing to replace."""
        linked.compact_due = False
        rule = self._host.compaction(self._core)
        old = [] if rule is None else linked.compactable(rule.keep)
        if rule is None or not old:
            return None
        return rule, old, [message.as_chat() for message in old]

    def _note_length(self, linked: LinkedContext, completion: Completion) -> None:
        """Mark the context for compaction before the next call when this one was long."""
        rule = self._host.compaction(self._core)
        if rule is not None and rule.due(completion):
            linked.compact_due = True

    def _conversation_guard(self, what: str) -> None:
        if self._raise_if_cancelled(what):  # a suspension parks at the next awaited checkpoint
            self._unpark()

    def results(self) -> list[SessionResult]:
        """Every child result this session has received so far (not a checkpoint)."""
        with self._core.cond:
            return list(self._core.received)

    # -- checkpoint logic -------------------------------------------------------

    def _raise_if_cancelled(self, what: str = "checkpoint", again: bool = False) -> bool:
        """Raise ``Cancelled`` if due; return True if a suspension is pending.

        A fenced session's call (``what``) is refused and counted every time.
        ``again``: the same call checks again (it waited), so a recorded run's
        tape counts it once.
        """
        core = self._core
        core.touch()
        tape = core.tape
        if tape is not None:
            tape.checkpoint(again)
        fence_code = core.fence_code
        if fence_code is None and core.release_code is not None:  # the node closes
            core.fence(core.release_code)
            fence_code = core.fence_code
        if fence_code is not None:
            self._host.refused(core, what)
            if tape is not None:
                tape.interrupted(fence_code, fenced=True)
            raise Cancelled(fence_code, core.session_id)
        with core.cond:
            code = core.cancel_code
            if code is None:
                if core.suspend_requested:
                    core.parked = True
                    return True
                return False
            if core.cancel_raised:
                return False
            core.cancel_raised = True
        if tape is not None:
            tape.interrupted(code, fenced=False)
        raise Cancelled(code, core.session_id)  # raised with the lock released

    def _unpark(self) -> None:
        with self._core.cond:
            self._core.parked = False

    def _claim(self, child: uuid.UUID) -> SessionResult | None:
        """Take a child's result (call with ``cond`` held); the run will not wait on it again."""
        result = self._core.claim(child)
        if result is not None:
            self._taken.add(child)
        return result

    def _taped(self, taken: list[Collected]) -> list[Collected]:
        """``taken`` (a take's entries), told to a recorded run's tape (call
        only when there is one)."""
        tape = self._core.tape
        assert tape is not None
        tape.took([c.session_id for c in taken if c.result is not None])
        return taken

    def _claim_ready(self, wanted: Sequence[uuid.UUID]) -> bool:
        return all(c in self._core.unclaimed for c in wanted)

    def _collected(self, wanted: Sequence[uuid.UUID]) -> list[Collected]:
        core = self._core
        done: list[Collected] = []
        with core.cond:
            arrived = {r.session_id: i for i, r in enumerate(core.unclaimed.values())}
            order = sorted(wanted, key=lambda c: arrived.get(c, len(arrived)))
            for child in order:
                result = self._claim(child)
                done.append(Collected(session_id=child, result=result, timed_out=result is None))
        return done if core.tape is None else self._taped(done)

    def _remember(self, specs: Sequence[SpawnSpec], answers: list[SpawnedLike]) -> None:
        """Note the children a spawn call made (and tell a recorded run's tape)."""
        for spawned in answers:
            if spawned.session_id is not None:
                self._spawned[spawned.session_id] = None
        tape = self._core.tape
        if tape is not None:
            tape.spawned(specs, [a.session_id for a in answers], [a.error for a in answers])

    def _wanted(self, children: Iterable[uuid.UUID] | None) -> list[uuid.UUID]:
        if children is None:  # every child of this run whose result it has not taken
            return [c for c in self._spawned if c not in self._taken]
        return list(children)

    def updates(self) -> list[tuple[uuid.UUID, Any]]:
        """Messages children sent with ``send_to_parent`` since the last call,
        oldest first, as (child id, message); taken (not a checkpoint)."""
        with self._core.cond:
            taken = list(self._core.updates)
            self._core.updates.clear()
        return taken

    def _first_arrived(self, wanted: Sequence[uuid.UUID]) -> uuid.UUID | None:
        """Of ``wanted``, the child whose result arrived first (call with ``cond`` held)."""
        wanted_set = set(wanted)
        return next((c for c in self._core.unclaimed if c in wanted_set), None)

    def _take_arrived(self, wanted: Sequence[uuid.UUID]) -> list[Collected]:
        with self._core.cond:
            wanted_set = set(wanted)
            arrived = [c for c in self._core.unclaimed if c in wanted_set]
            taken = [
                Collected(session_id=c, result=self._claim(c), timed_out=False) for c in arrived
            ]
        return taken if self._core.tape is None else self._taped(taken)

    def _take_first(self, wanted: Sequence[uuid.UUID]) -> Collected | None:
        with self._core.cond:
            child = self._first_arrived(wanted)
            got = None
            if child is not None:
                got = Collected(session_id=child, result=self._claim(child), timed_out=False)
        if self._core.tape is not None:
            self._taped([] if got is None else [got])
        return got

    def _check_child(self, child: uuid.UUID) -> None:
        if child not in self._spawned:
            msg = f"session {child} is not a child this run of {self.session_id} spawned"
            raise NotAllowedError(msg, session_id=self.session_id)

    def _wake_when_done(self, future: Any) -> None:
        """Have ``future``'s completion wake the skill where it waits."""
        core = self._core

        def wake(_done: Any) -> None:
            with core.cond:
                core.wake()

        future.add_done_callback(wake)

    def _check_memory_write(self) -> None:
        if self.kind is SessionKind.WORKER:
            msg = f"worker session {self.session_id} may not write shared memory"
            raise NotAllowedError(msg, session_id=self.session_id)


def context_message(role: str, content: Any, name: str | None) -> ContextMessage:
    if not isinstance(role, str) or not role:
        msg = f"a context message needs a role string, got {role!r}"
        raise RejectedInputError(msg, field="role")
    try:
        content = msgspec.json.decode(msgspec.json.encode(content))  # a plain JSON copy
    except (TypeError, msgspec.EncodeError) as exc:
        msg = f"context message content must be a JSON value: {exc}"
        raise RejectedInputError(msg, field="content") from exc
    return ContextMessage(role, content, name)


def usage_of(completion: Completion) -> dict[str, Any]:
    """A reply's usage as its context message records it."""
    return msgspec.structs.asdict(completion.usage)


def landing(core: SessionCore) -> bool:
    """Whether a model call in flight finishes and its reply is delivered
    although the session was cancelled: when its budget ran out (the next
    checkpoint raises ``Cancelled``), unless the session is fenced or let go."""
    return core.cancel_code is ErrorCode.BUDGET_EXHAUSTED and not core.letting_go


def never() -> bool:
    """What a plain sleep waits for: nothing but its timeout (or an interrupt)."""
    return False
