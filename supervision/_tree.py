"""The tree's state: the index of sessions, its counters, and the lookups,
registrations and state changes every part of the Cortex shares.

Only the Cortex thread touches a ``Tree``. A broken invariant (an illegal
transition) raises ``InvalidTransitionError`` before anything changed; the
Cortex then fails the node loudly.
"""

from __future__ import annotations

import collections
import functools
import uuid
from typing import Any

import msgspec
import pykka

from sessiontree.actors.backends import ExecutionBackend
from sessiontree.actors.runtime import (
    Activity,
    Reply,
    SessionActorLogic,
    SessionCore,
    StopSession,
    actor_class,
    post,
    start_actor,
    stop_unstarted,
)
from sessiontree.protocol import (
    TERMINAL_STATES,
    CorruptRecordError,
    ErrorCode,
    ErrorInfo,
    InvalidTransitionError,
    SessionInfo,
    SessionKind,
    SessionState,
    SpawnSpec,
    UnknownSessionError,
    is_legal_transition,
)
from sessiontree.store import SessionRecord
from sessiontree.supervision._config import Agent
from sessiontree.supervision._entry import Ledger, SharedTtl, TreeEntry, with_state
from sessiontree.supervision._events import Event, EventKind
from sessiontree.supervision._extension import Grant
from sessiontree.supervision._persist import context_from_record
from sessiontree.supervision._runtime import Runtime

__all__ = ["Tree"]


class Tree:
    """Every session the Cortex knows, and how the parts of the Cortex change it."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.persist = runtime.persist
        self.ext = runtime.extensions
        self.store = runtime.persist.store
        self.session_class = actor_class(SessionActorLogic, runtime.dispatcher)
        self.ref: pykka.ActorRef[Any] | None = None  # the Cortex, once started
        self.entries: dict[uuid.UUID, TreeEntry] = {}
        self.mains: dict[tuple[str, str], uuid.UUID] = {}
        # Mains held by no actor: left dormant by recovery, or passivated when
        # idle (then with the inbox number they go on from); the record here
        # is enough to list them, the store's is read when one comes back.
        self.dormant: dict[uuid.UUID, SessionRecord] = {}
        self.next_seqs: dict[uuid.UUID, int] = {}
        self.ledgers_at_rest: dict[uuid.UUID, Ledger] = {}  # passivated Mains' accounts
        # the Mains holding an actor (the periodic check drops those gone)
        self.resident_mains: dict[uuid.UUID, TreeEntry] = {}
        self.terminal: collections.deque[uuid.UUID] = collections.deque()  # oldest first
        self.live = 0
        self.sync_threads = 0
        self.zombies = 0
        self.main_zombies = 0
        # Replay held back by recovery (the node kept crashing): per session, the
        # cycles (Inbound, Deliver) and parked branches (entries) to run once released.
        self.held_reason: str | None = None
        self.held: dict[uuid.UUID, list[Any]] = {}
        self.closing = False
        self.shutdown_waiters: list[Reply] = []
        # Skills a shutdown let go of their checkpoint, until their runs end; then
        # ``release_reply`` is answered (Shutdown.release_parked).
        self.releasing: set[uuid.UUID] = set()
        self.release_reply: Reply | None = None
        self.to_stop: list[pykka.ActorRef[Any]] = []  # actors of ended sessions

    # -- reading ----------------------------------------------------------------

    def now(self) -> float:
        return self.rt.clock.time()

    def lookup(self, session_id: uuid.UUID) -> TreeEntry:
        """The entry of ``session_id`` (a dormant Main comes back first);
        ``UnknownSessionError`` if the index holds no such session."""
        entry = self.entry(session_id)
        if entry is None:
            msg = f"unknown session {session_id}"
            raise UnknownSessionError(msg, session_id=session_id)
        return entry

    def entry(self, session_id: uuid.UUID | None) -> TreeEntry | None:
        """The index entry of ``session_id``, bringing a dormant Main back first."""
        if session_id is None:
            return None
        entry = self.entries.get(session_id)
        if entry is None and session_id in self.dormant:
            held = self.dormant.pop(session_id)
            stored = self.store.session(session_id) if self.store is not None else None
            entry = self.restore(stored or held)
            next_seq = self.next_seqs.pop(session_id, None)
            if next_seq is not None:  # it was passivated, not left by recovery
                entry.next_seq = next_seq
                self.rt.counters["reactivated"] += 1
        return entry

    def known(self, session_id: uuid.UUID) -> TreeEntry | SessionRecord:
        """What this node knows of a session, without waking a dormant Main: its
        index entry, or its stored record (dormant, or ended before a restart
        or eviction). ``UnknownSessionError`` when neither exists."""
        entry = self.entries.get(session_id)
        if entry is not None:
            return entry
        record = self.dormant.get(session_id)
        if record is None and self.store is not None:
            record = self.stored(session_id)
        if record is None:
            msg = f"unknown session {session_id}"
            raise UnknownSessionError(msg, session_id=session_id)
        return record

    def stored(self, session_id: uuid.UUID) -> SessionRecord | None:
        """``session_id``'s stored record (ended sessions are read when asked for,
        never at start-up): one that does not decode is set aside (quarantined,
        logged, counted) and reads as none."""
        assert self.store is not None
        try:
            return self.store.session(session_id)
        except CorruptRecordError as exc:
            self.store.set_aside(exc)
            return None

    def ended_answer(self, session_id: uuid.UUID) -> ErrorInfo:
        """What cancel, suspend or resume answer for a session the index no longer
        holds but the store does (it ended before a restart, or was evicted):
        ``invalid_transition`` naming how it ended, as for one still indexed.
        ``UnknownSessionError`` when the store has no such session either."""
        known = self.known(session_id)
        state = known.state if isinstance(known, TreeEntry) else known.info.state
        return ErrorInfo(
            code=ErrorCode.INVALID_TRANSITION,
            message=f"session {session_id} already ended ({state.value})",
        )

    def uncancelled_descendants(self, entry: TreeEntry) -> list[TreeEntry]:
        """``entry``'s live descendants not yet asked to cancel, parents before
        their children (a list, not a generator: a cascade walks tens of thousands)."""
        found: list[TreeEntry] = []
        stack = [entry]
        entries = self.entries
        while stack:
            current = stack.pop()
            for child_id in current.children:
                child = entries.get(child_id)
                if child is not None and child.core.state not in TERMINAL_STATES:
                    if child.cancel_code is None:
                        found.append(child)
                    stack.append(child)
        return found

    # -- telling ------------------------------------------------------------------

    def emit(
        self,
        kind: EventKind,
        entry: TreeEntry | None,
        *,
        previous: SessionState | None = None,
        code: ErrorCode | None = None,
        data: dict[str, Any] | None = None,
        at: float | None = None,
    ) -> None:
        """Emit an event about ``entry`` (or the node); nothing is built when
        nobody listens (the session's watchers are told anyway: a recorded
        session's tape keeps what a replay compares)."""
        if entry is not None and entry.watchers:
            for watch in entry.watchers:
                watch.event(kind, entry.core.state, code, data)
        events = self.rt.events
        if not events.observed:
            return
        if at is None:
            at = self.now()
        # _value_ (a plain attribute) rather than .value (an enum property)
        if entry is None:
            event = Event(
                kind=kind,
                at=at,
                previous=None if previous is None else previous._value_,
                code=None if code is None else code._value_,
                data={} if data is None else data,
            )
        else:
            core = entry.core
            info = core.info
            event = Event(
                kind=kind,
                at=at,
                session_id=core.session_id,
                parent_id=info.parent_id,
                session_kind=info.kind._value_,
                agent_id=info.agent_id,
                skill=info.skill,
                state=core.state._value_,
                previous=None if previous is None else previous._value_,
                code=None if code is None else code._value_,
                data={} if data is None else data,
            )
        events.emit(event)

    def post(self, entry: TreeEntry, message: object) -> None:
        """Tell ``entry``'s actor ``message`` (dropped if it holds none)."""
        if entry.ref is not None:
            post(entry.ref, message, self.rt.activity)

    def note_input(self, entry: TreeEntry) -> None:
        """Something was handed to a Main (a message, a result) or a cycle of it
        ended: it is not idle, and a passivation asked about before is stale."""
        entry.mark += 1
        entry.idle_since = self.rt.clock.monotonic()

    # -- changing ---------------------------------------------------------------------

    def set_state(
        self,
        entry: TreeEntry,
        new: SessionState,
        code: ErrorCode | None = None,
        *,
        at: float | None = None,
        taking_slot: bool = False,
    ) -> None:
        """Change ``entry``'s state (and emit it); an ending goes through
        ``Endings.finish``. ``taking_slot``: it starts, holding the compute
        slot granted to it."""
        old = entry.state
        if not is_legal_transition(old, new):  # a broken invariant: the node fails loudly
            msg = f"session {entry.session_id}: {old} -> {new} is not a legal transition"
            raise InvalidTransitionError(msg, session_id=entry.session_id)
        core = entry.core
        with core.cond:
            core.state = new
            if taking_slot:
                core.holds_slot = True
        self.emit(EventKind.TRANSITION, entry, previous=old, code=code, at=at)
        if new is SessionState.SUSPENDED or old is SessionState.SUSPENDED:
            # a Branch's context is written on suspend (it may come back after
            # a restart); a resume is written so a crash then fails it instead
            self.persist.snapshot(
                entry,
                self.now() if at is None else at,
                resume=entry.shutdown_park,
                late=self.unrecorded_children(entry),
            )

    def unrecorded_children(self, entry: TreeEntry) -> list[TreeEntry]:
        """``entry``'s children that were never written (see ``TreeEntry.recorded``)
        and are still indexed: live, or ended."""
        if entry.kind is not SessionKind.BRANCH:
            return []
        late = []
        for child_id in entry.children:
            child = self.entries.get(child_id)
            if child is not None and not child.recorded:
                late.append(child)
        return late

    def register(
        self,
        agent: Agent,
        info: SessionInfo,
        parent: TreeEntry | None,
        ttl: float | None,
        *,
        spec: SpawnSpec | None = None,
        before: SessionInfo | None = None,
        remote: tuple[ExecutionBackend, bytes] | None = None,
        ttl_share: SharedTtl | None = None,
        grants: tuple[Grant, ...] = (),
    ) -> TreeEntry:
        """Index a session and start its actor (its first TTL timer: ``ttl`` s,
        on ``ttl_share`` if given), and tell the extensions: it was made from
        ``spec`` (and what they granted its spawn is told it was made), or
        comes back from the store as ``before`` was stored (its event says
        so); ``remote``: its skill runs on that backend."""
        skill = agent.skills[info.skill]
        kind = info.kind
        rt = self.rt
        core = SessionCore(
            info,
            clock=rt.clock,
            activity=rt.activity,
            slots=rt.slots,
            max_results=rt.config.max_retained_results,
        )
        core.remote = remote
        # A remote step is awaited on the loop: it holds no step thread and is
        # killed, never abandoned, so it is never a zombie.
        is_async = remote is not None or agent.is_async(info.skill)
        entry = TreeEntry(core=core, agent=agent, skill=skill, is_async=is_async, parent=parent)
        data: dict[str, Any] | None = None
        if rt.events.observed:
            data = {"kind": kind._value_, "skill": info.skill}
            if before is not None:
                data.update(restored=True, created_at=info.created_at)
        # first: a recorded session's actor finds its tape
        if before is not None:
            for ext in self.ext.restored:
                ext.restored(entry, before, data)
        elif spec is not None:
            for ext in self.ext.created:
                ext.created(entry, spec, data)
            for grant in grants:
                grant.made(entry)
        if kind is SessionKind.MAIN:  # only a Main is ever passivated
            entry.idle_since = rt.clock.monotonic()
            self.resident_mains[info.session_id] = entry
        if kind is SessionKind.MAIN:  # see start_actor: only a Main has a mailbox
            self.start_actor(entry)
        self.entries[info.session_id] = entry
        self.live += 1
        if entry.needs_thread:
            self.sync_threads += 1
        if ttl is not None:
            self.arm_ttl(entry, max(ttl, 0.0), ttl_share)
        if data is not None:
            self.emit(EventKind.SPAWNED, entry, data=data)
        return entry

    def restore(self, record: SessionRecord) -> TreeEntry:
        """Bring a stored Main or suspended Branch back into the index, with its
        context, its filed results and ``resumed`` set. A Main takes messages at
        once; a Branch stays suspended until resumed (its skill then runs again)."""
        info = record.info
        agent = self.rt.agents[info.agent_id]
        if info.kind is SessionKind.MAIN and info.skill != agent.main:
            info = msgspec.structs.replace(info, skill=agent.main)
        parent = self.entry(info.parent_id)
        ttl = None if info.deadline is None else info.deadline - self.now()
        before = info
        for ext in self.ext.restoring:
            info = ext.restoring(parent, info)
        entry = self.register(agent, info, parent, ttl, before=before)
        core = entry.core
        core.context = context_from_record(record.context)
        core.resumed = True
        if self.store is not None:
            for result in self.store.received(info.session_id, set_aside=True):
                core.received.append(result)
            for child_id in self.store.children(info.session_id):
                entry.children[child_id] = None
        if parent is not None:
            parent.children[info.session_id] = None
            parent.live_children += 1
        if info.kind is SessionKind.MAIN:
            entry.started_at = self.now()
        else:
            entry.suspend_requested = True
            entry.rerun = True
        self.emit(EventKind.RESTORED, entry)
        return entry

    def store_failed(self, error: BaseException) -> None:
        self.rt.counters["store_write_errors"] += 1
        self.emit(EventKind.STORE_ERROR, None, data={"error": repr(error)})

    def discard(self, entry: TreeEntry) -> None:
        """Take out a session whose record could not be written (nobody has its id
        yet); one that already ended keeps its ending."""
        if entry.state.is_terminal:
            return
        if entry.ttl_timer is not None:
            entry.ttl_timer.cancel()
            entry.ttl_timer = None
        if entry.grant is not None:
            self.rt.slots.forget(entry.grant)
            entry.grant = None
        entry.core.fence(ErrorCode.STORE_FAILED)
        entry.core.slots.release()
        self.emit(EventKind.DISCARDED, entry)
        for watch in entry.watchers:
            watch.discarded()
        self.entries.pop(entry.session_id, None)
        self.live -= 1
        if entry.needs_thread:
            self.sync_threads -= 1
        parent = entry.parent
        if parent is not None:
            parent.children.pop(entry.session_id, None)
            parent.live_children -= 1
            if entry.info.request_id is not None:
                parent.requests.pop(entry.info.request_id, None)
        key = (entry.agent.agent_id, entry.info.key or "")
        if self.mains.get(key) == entry.session_id:
            del self.mains[key]
        self.stop_actor(entry)

    # -- actors and timers -----------------------------------------------------------

    def start_actor(self, entry: TreeEntry) -> None:
        """Give a Main its mailbox actor. Branches and Workers hold none: the
        Cortex starts their one run itself and sets their cancel, suspend and
        fence straight on their shared state (``SessionCore``), so an actor
        made and stopped per child was pure cost on the fan-out's hot path."""
        rt = self.rt
        entry.ref = start_actor(
            self.session_class,
            entry.core,
            rt.host,
            entry.skill,
            entry.is_async,
            rt.main_executor if entry.kind is SessionKind.MAIN else rt.executor,
            rt.loop,
            rt.activity,
            self._rejected_by_session,
            rt.on_fatal,
        )

    def stop_actor(self, entry: TreeEntry) -> None:
        """A session that needs no mailbox (ended, parked, passivated) holds no
        actor; its actor is stopped with the next batch (``Tree.stop_ended``)."""
        if entry.ref is not None:
            self.to_stop.append(entry.ref)
            entry.ref = None

    def stop_ended(self) -> None:
        """Stop the actors of ended sessions. The Cortex defers this to when the
        node is idle (a ``Reap``), the periodic check, a quiet inbox with a
        batch waiting, or a full batch: waking thousands of actor threads to
        stop must not hold up the state changes of a cascade, nor may ended
        threads pile up."""
        refs, self.to_stop = self.to_stop, []
        stop, activity = StopSession(), self.rt.activity
        for ref in refs:
            # a worker's actor that never got a message stops here, no turn of the loop
            if not stop_unstarted(ref):
                post(ref, stop, activity)

    def _rejected_by_session(self, body: object) -> None:
        self.rt.counters["rejected_messages"] += 1

    def arm_ttl(self, entry: TreeEntry, ttl: float, share: SharedTtl | None = None) -> None:
        """Expire ``entry`` in ``ttl`` s: on a timer of its own, or on ``share``'s
        (armed by its first member; its members share their creation instant)."""
        if self.ref is None:
            return
        if share is None:
            share = self.ttl_share()
        if share.timer is None:
            share.timer = self.rt.clock.call_later(ttl, share)
        share.add(entry.session_id)
        entry.ttl_timer = share

    def ttl_share(self) -> SharedTtl:
        ref, activity = self.ref, self.rt.activity
        assert ref is not None
        return SharedTtl(functools.partial(_post_to, ref, activity))

    # -- a shutdown's settling --------------------------------------------------------

    def check_shutdown(self) -> None:
        """Answer the shutdown's waiters once nothing is left to settle: no worker
        or remote step runs, no session is in its cancellation grace, and every
        branch asked to park has parked."""
        if not any(map(_holds_shutdown, self.entries.values())):
            self.settle_shutdown()

    def shutdown_pending(self) -> int:
        """How many sessions the shutdown still waits for (``check_shutdown``)."""
        return sum(map(_holds_shutdown, self.entries.values()))

    def settle_shutdown(self) -> None:
        waiters, self.shutdown_waiters = self.shutdown_waiters, []
        final = [with_state(e) for e in self.entries.values()]
        for reply in waiters:
            reply.set(final)

    def run_released(self, session_id: uuid.UUID) -> None:
        """The run of ``session_id`` ended; if a shutdown released it, and it was
        the last one, the shutdown's wait for them is answered."""
        releasing = self.releasing
        if not releasing or session_id not in releasing:
            return
        releasing.discard(session_id)
        reply = self.release_reply
        if not releasing and reply is not None:
            self.release_reply = None
            reply.set(None)


def _holds_shutdown(entry: TreeEntry) -> bool:
    """Whether a shutdown waits for ``entry`` to settle."""
    if entry.state.is_terminal:
        return False
    if entry.kind is SessionKind.WORKER or entry.core.remote is not None:
        return True
    if entry.cancel_code is not None:
        return True  # cancelled before or during the shutdown: wraps up or is forced
    # parked by the shutdown, or explicitly suspended: not parked yet
    return entry.suspend_requested and entry.state is SessionState.ACTIVE


def _post_to(ref: pykka.ActorRef[Any], activity: Activity, message: object) -> None:
    post(ref, message, activity)
