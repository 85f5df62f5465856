"""The Cortex: the one actor that decides every change of the session tree.

Every spawn, state change and result goes through its mailbox, so the tree
index (ids, parent, children, kind, state, deadlines) is consistent by
construction. Session actors get their orders from the Cortex only; skill
threads report to it. Handlers never block: they tell, never ask.

A handler that raises means the index can no longer be trusted: the node
fails loudly (every waiting caller gets ``NodeClosedError`` naming the cause)
instead of running headless.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pykka

from sessiontree.actors import TimerHandle
from sessiontree.actors.backends import BACKENDS, ExecutionBackend
from sessiontree.actors.runtime import (
    Activity,
    CancelSignal,
    Counted,
    CycleDone,
    Deliver,
    ForceStop,
    Inbound,
    Passivate,
    Reply,
    RunEnd,
    SessionActorLogic,
    SessionCore,
    StopSession,
    actor_class,
    drain_inbox,
    handler_scope,
    post,
    start_actor,
    start_run,
    stop_actor,
    stop_unstarted,
    wake_batch,
)
from sessiontree.protocol import (
    TERMINAL_STATES,
    TRANSITIONS,
    BackendUnavailableError,
    CancelCmd,
    ErrorCode,
    ErrorInfo,
    InvalidTransitionError,
    NodeClosedError,
    Outcome,
    RejectedInputError,
    ResumeCmd,
    SendCmd,
    SessionInfo,
    SessionKey,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnCmd,
    SpawnSpec,
    SuspendCmd,
    Timings,
    UnknownAgentError,
    UnknownSessionError,
    is_legal_transition,
    new_session_id,
)
from sessiontree.store import SessionRecord
from sessiontree.supervision._config import Agent
from sessiontree.supervision._events import Event, EventKind
from sessiontree.supervision._index import (
    AfterWrite,
    Call,
    ChildUpdate,
    Deadline,
    Entry,
    Expire,
    Granted,
    Idle,
    Parked,
    Progress,
    Reap,
    Refused,
    RunEnded,
    RunsEnded,
    Runtime,
    SharedTtl,
    SpawnAnswer,
    Tick,
)
from sessiontree.supervision._persist import context_from_record
from sessiontree.supervision._recovery import Recovered
from sessiontree.supervision._rules import Capacity, ParentView, check_spawn, resolve_ttl

__all__ = ["CortexLogic"]

log = logging.getLogger("sessiontree.cortex")


# -- the actor ----------------------------------------------------------------


class CortexLogic:
    """Message handling of the Cortex; combined with a pykka base by ``actor_class``."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.rt = runtime
        self.entries: dict[uuid.UUID, Entry] = {}
        self.mains: dict[tuple[str, str], uuid.UUID] = {}
        # for the periodic check: the Mains holding an actor (dropped by it once
        # gone), and the sessions its stuck check has yet to look at this round
        self.resident_mains: dict[uuid.UUID, Entry] = {}
        self.sweep: list[Entry] = []
        self.terminal: collections.deque[uuid.UUID] = collections.deque()
        self.live = 0
        self.sync_threads = 0
        self.zombies = 0
        self.main_zombies = 0
        self.closing = False
        self.failed: BaseException | None = None
        self.shutdown_waiters: list[Reply] = []
        self.self_ref: pykka.ActorRef[Any] | None = None
        self.session_class = actor_class(
            SessionActorLogic, runtime.config.actor_type, runtime.dispatcher
        )
        self.tick_timer: TimerHandle | None = None
        self.to_stop: list[pykka.ActorRef[Any]] = []
        self.stopped = False
        self.persist = runtime.persist
        self.store = runtime.persist.store
        # Mains held by no actor: left dormant by recovery, or passivated when
        # idle (then with the inbox number they go on from); the record here
        # is enough to list them, the store's is read when one comes back.
        self.dormant: dict[uuid.UUID, SessionRecord] = {}
        self.next_seqs: dict[uuid.UUID, int] = {}
        self.batched: list[Callable[[BaseException | None], None]] | None = None
        # the open batch's future and how many writes in it _count_failures counts
        self.counted_writes: tuple[concurrent.futures.Future[None], list[int]] | None = None

    # -- pykka hooks --------------------------------------------------------

    def on_start(self) -> None:
        """Runs on the Cortex thread before any message; arms the periodic check."""
        self.self_ref = self.actor_ref  # type: ignore[attr-defined]
        self.rt.activity.on_idle = self.on_idle
        self._arm_tick()

    def on_stop(self) -> None:
        """Runs on the Cortex thread as it stops: ended actors are stopped, and
        callers still queued or waiting get ``NodeClosedError`` instead of
        waiting for their timeout."""
        self.stopped = True
        self.rt.activity.on_idle = None
        self._stop_ended()
        self._fail_waiters(NodeClosedError("the node stopped before the session ended"))
        drain_inbox(self, self.rt.activity, self._refuse_stopped)  # type: ignore[arg-type]

    def _fail_waiters(self, error: NodeClosedError) -> None:
        for entry in self.entries.values():
            for reply in entry.waiters:
                reply.fail(error)
            entry.waiters.clear()

    def _refuse_stopped(self, body: object) -> None:
        if isinstance(body, Call) and body.reply is not None:
            body.reply.fail(NodeClosedError("the node stopped before answering"))

    def on_failure(self, *exc_info: Any) -> None:
        """Runs on the Cortex thread if it dies: the node fails loudly."""
        error = exc_info[1] if len(exc_info) > 1 else None
        self.rt.on_failed(error or NodeClosedError("the cortex died"))

    def on_receive(self, message: Any) -> Any:
        """Handle one message. Unknown messages are counted and refused; a raise
        inside a handler fails the node loudly (see the module docstring)."""
        counted = isinstance(message, Counted)
        body = message.message if counted else message
        try:
            with handler_scope():
                return self._dispatch(body)
        except (KeyboardInterrupt, SystemExit) as exc:
            self.rt.on_fatal(exc)
            return None
        except BaseException as exc:
            log.critical("cortex handler for %r raised; the node fails", body, exc_info=True)
            if isinstance(body, Call) and body.reply is not None:
                body.reply.fail(NodeClosedError(f"cortex failed: {exc!r}"))
            self._fail(exc)
            return None
        finally:
            if len(self.to_stop) >= _STOP_BATCH or (
                len(self.to_stop) >= _STOP_WHEN_QUIET and self._inbox_empty()
            ):
                self._stop_ended()
            if counted:
                self.rt.activity.end()

    def _inbox_empty(self) -> bool:
        inbox = getattr(self, "actor_inbox", None)
        return inbox is None or inbox.empty()

    def _stop_ended(self) -> None:
        """Stop the actors of ended sessions. Deferred to when the node is idle (a
        ``Reap``), the periodic check, a quiet inbox with a batch waiting, or a
        full batch: waking thousands of actor threads to stop must not hold up
        the state changes of a cascade, nor may ended threads pile up."""
        refs, self.to_stop = self.to_stop, []
        stop, activity = StopSession(), self.rt.activity
        for ref in refs:
            # a worker's actor that never got a message stops here, no pool turn
            if not stop_unstarted(ref):
                post(ref, stop, activity)

    def on_idle(self) -> None:
        """``Activity.on_idle``: ask for a ``Reap`` if ended actors wait to stop.

        Runs on whichever thread finished the last piece of work; it only posts.
        """
        ref = self.self_ref
        if self.to_stop and ref is not None and not self.stopped and ref.is_alive():
            post(ref, Reap(), self.rt.activity)

    def _dispatch(self, body: Any) -> Any:
        if self.failed is not None and not isinstance(body, Call):
            return None  # the index is untrusted: nothing more is decided from it
        match body:
            case Call(name=name, args=args, reply=reply):
                op = getattr(self, f"op_{name}", None)
                if op is None:
                    self._reject(body)
                    if reply is not None:
                        reply.fail(RejectedInputError(f"the cortex has no operation {name!r}"))
                    return None
                if self.failed is not None and name != "stop_all":
                    if reply is not None:
                        reply.fail(NodeClosedError(f"node failed: {self.failed!r}"))
                    return None
                try:
                    value = op(*args, reply=reply) if name in _TAKES_REPLY else op(*args)
                except _CALLER_MISTAKES as exc:  # answered; the index is untouched
                    if reply is None:  # nobody waits for the answer: count it, never fail
                        self.rt.counters["rejected_messages"] += 1
                        log.warning("cortex refused %s%r: %s", name, args, exc)
                        return None
                    reply.fail(exc)
                    return None
                if reply is not None and value is not _DEFERRED:
                    reply.set(value)
            case AfterWrite(then=then, error=error):
                then(error)
            case RunEnded():
                self._runs_ended((body,))
            case RunsEnded(ends=ends):
                self._runs_ended(ends)
            case Granted(session_id=sid):
                self._granted(sid)
            case Parked(session_id=sid):
                self._parked(sid)
            case Idle(session_id=sid, mark=mark):
                self._idle(sid, mark)
            case Expire(session_ids=ids):
                for sid in ids:
                    self._expire(sid)
            case Deadline(session_ids=ids):
                self._deadline(ids)
            case Progress(session_id=sid, note=note, data=data):
                self._progress(sid, note, data)
            case ChildUpdate(session_id=sid, message=message):
                self._child_update(sid, message)
            case Refused(session_id=sid, what=what):
                self.rt.counters["refused_after_fence"] += 1
                self._emit(EventKind.REFUSED, self.entries.get(sid), data={"what": what})
            case Tick() | Reap():
                self._stop_ended()
                if isinstance(body, Tick):
                    self._tick()
            case SpawnCmd() | SendCmd() | CancelCmd() | SuspendCmd() | ResumeCmd():
                return self.op_control(body, reply=None)
            case _:
                self._reject(body)
                return ErrorInfo(
                    code=ErrorCode.REJECTED_INPUT,
                    message=f"the cortex does not take {type(body).__name__}",
                )
        return None

    def _reject(self, body: object) -> None:
        self.rt.counters["rejected_messages"] += 1
        log.warning("cortex refused a message of type %s", type(body).__name__)

    # -- helpers --------------------------------------------------------------

    def _now(self) -> float:
        return self.rt.clock.time()

    def _emit(
        self,
        kind: EventKind,
        entry: Entry | None,
        *,
        previous: SessionState | None = None,
        code: ErrorCode | None = None,
        data: dict[str, Any] | None = None,
        at: float | None = None,
    ) -> None:
        events = self.rt.events
        if not events.observed:  # nobody listens: no event is built
            return
        if at is None:
            at = self._now()
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
                state=core.state._value_,
                previous=None if previous is None else previous._value_,
                code=None if code is None else code._value_,
                data={} if data is None else data,
            )
        events.emit(event)

    def _post(self, entry: Entry, message: object) -> None:
        if entry.ref is not None:
            post(entry.ref, message, self.rt.activity)

    def _set_state(
        self,
        entry: Entry,
        new: SessionState,
        code: ErrorCode | None = None,
        *,
        at: float | None = None,
        taking_slot: bool = False,
    ) -> None:
        """Change ``entry``'s state (and emit it); an ending goes through
        ``_end_state``. ``taking_slot``: it starts, holding the compute slot
        granted to it."""
        old = entry.state
        if not is_legal_transition(old, new):  # a broken invariant: the node fails loudly
            msg = f"session {entry.session_id}: {old} -> {new} is not a legal transition"
            raise InvalidTransitionError(msg, session_id=entry.session_id)
        core = entry.core
        with core.cond:
            core.state = new
            if taking_slot:
                core.holds_slot = True
        self._emit(EventKind.TRANSITION, entry, previous=old, code=code, at=at)
        if new is SessionState.SUSPENDED or old is SessionState.SUSPENDED:
            # a Branch's context is written on suspend (it may come back after
            # a restart); a resume is written so a crash then fails it instead
            self.persist.snapshot(
                entry, self._now() if at is None else at, resume=entry.shutdown_park
            )

    def _lookup(self, session_id: uuid.UUID) -> Entry:
        entry = self._entry(session_id)
        if entry is None:
            msg = f"unknown session {session_id}"
            raise UnknownSessionError(msg, session_id=session_id)
        return entry

    def _uncancelled_descendants(self, entry: Entry) -> list[Entry]:
        """``entry``'s live descendants not yet asked to cancel, parents before
        their children (a list, not a generator: a cascade walks tens of thousands)."""
        found: list[Entry] = []
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

    def _arm_tick(self) -> None:
        ref = self.self_ref
        if ref is None:
            return
        activity = self.rt.activity

        def fire() -> None:
            post(ref, Tick(), activity)

        self.tick_timer = self.rt.clock.call_later(self.rt.config.check_interval, fire)

    # -- creating sessions ----------------------------------------------------

    def _new_entry(
        self,
        agent: Agent,
        kind: SessionKind,
        parent: Entry | None,
        spec: SpawnSpec,
        ttl: float | None,
        key: str | None,
        backend: str = "inline",
        remote: tuple[ExecutionBackend, bytes] | None = None,
        ttl_share: SharedTtl | None = None,
    ) -> Entry:
        now = self._now()
        skill_name = agent.main if kind is SessionKind.MAIN else (spec.skill or agent.default)
        if spec.model_tier is not None:
            tier: str | None = spec.model_tier
        elif kind is SessionKind.WORKER:
            tier = agent.model_tiers[0]
        elif parent is not None:
            tier = parent.info.model_tier
        else:
            tier = agent.model_tiers[-1]
        info = SessionInfo(
            session_id=new_session_id(),
            agent_id=agent.agent_id,
            parent_id=parent.session_id if parent else None,
            kind=kind,
            state=SessionState.ACTIVE if kind is SessionKind.MAIN else SessionState.PENDING,
            depth=parent.info.depth + 1 if parent else 0,
            created_at=now,
            ttl=ttl,
            deadline=None if ttl is None else now + ttl,
            task=spec.task,
            context_summary=spec.context_summary,
            model_tier=tier,
            skill=skill_name,
            key=key,
            request_id=spec.request_id,
            metadata=dict(spec.metadata),
            backend=backend,
        )
        return self._register(agent, info, parent, ttl, remote=remote, ttl_share=ttl_share)

    def _register(
        self,
        agent: Agent,
        info: SessionInfo,
        parent: Entry | None,
        ttl: float | None,
        *,
        restored: bool = False,
        remote: tuple[ExecutionBackend, bytes] | None = None,
        ttl_share: SharedTtl | None = None,
    ) -> Entry:
        """Index a session and start its actor (its first TTL timer: ``ttl`` s,
        on ``ttl_share`` if given); ``restored``: it comes back from the store
        (its event says so); ``remote``: its skill runs on that backend."""
        skill = agent.skills[info.skill]
        kind = info.kind
        core = SessionCore(
            info,
            clock=self.rt.clock,
            activity=self.rt.activity,
            slots=self.rt.slots,
            max_results=self.rt.config.max_retained_results,
        )
        core.remote = remote
        # A remote step is awaited on the loop: it holds no step thread and is
        # killed, never abandoned, so it is never a zombie.
        is_async = remote is not None or agent.is_async(info.skill)
        entry = Entry(core=core, agent=agent, skill=skill, is_async=is_async, parent=parent)
        if kind is SessionKind.MAIN:  # only a Main is ever passivated
            entry.idle_since = self.rt.clock.monotonic()
            self.resident_mains[info.session_id] = entry
        if not (restored and kind is SessionKind.BRANCH):  # a suspended branch waits for one
            self._start_actor(entry)
        self.entries[info.session_id] = entry
        self.live += 1
        if entry.needs_thread:
            self.sync_threads += 1
        if ttl is not None:
            self._arm_ttl(entry, max(ttl, 0.0), ttl_share)
        if self.rt.events.observed:
            data: dict[str, Any] = {"kind": kind._value_, "skill": info.skill}
            if restored:
                data.update(restored=True, created_at=info.created_at)
            self._emit(EventKind.SPAWNED, entry, data=data)
        return entry

    def _start_actor(self, entry: Entry) -> None:
        entry.ref = start_actor(
            self.session_class,
            entry.core,
            self.rt.host,
            entry.skill,
            entry.is_async,
            self.rt.main_executor if entry.kind is SessionKind.MAIN else self.rt.executor,
            self.rt.loop,
            self.rt.activity,
            self._rejected_by_session,
            self.rt.on_fatal,
        )

    def _stop_actor(self, entry: Entry) -> None:
        """A session that needs no mailbox for now (parked, passivated) holds no actor."""
        if entry.ref is not None:
            self.to_stop.append(entry.ref)
            entry.ref = None

    def _rejected_by_session(self, body: object) -> None:
        self.rt.counters["rejected_messages"] += 1

    def _arm_ttl(self, entry: Entry, ttl: float, share: SharedTtl | None = None) -> None:
        """Expire ``entry`` in ``ttl`` s: on a timer of its own, or on ``share``'s
        (armed by its first member; its members share their creation instant)."""
        ref = self.self_ref
        if ref is None:
            return
        if share is None:
            share = self._ttl_share()
        if share.timer is None:
            share.timer = self.rt.clock.call_later(ttl, share)
        share.add(entry.session_id)
        entry.ttl_timer = share

    def _ttl_share(self) -> SharedTtl:
        ref, activity = self.self_ref, self.rt.activity
        assert ref is not None
        return SharedTtl(functools.partial(_post_to, ref, activity))

    def op_main(self, agent_id: str, key: str, reply: Reply | None) -> object:
        """Get or create the one Main of ``agent_id`` for session ``key`` (answered
        once its record is durable)."""
        if self.closing:
            msg = "node is shutting down; no new main sessions"
            raise NodeClosedError(msg)
        agent = self.rt.agents.get(agent_id)
        if agent is None:
            msg = f"unknown agent {agent_id!r}; registered: {sorted(self.rt.agents)}"
            raise UnknownAgentError(msg, field="agent_id")
        key = str(SessionKey.parse(key))
        existing = self.mains.get((agent_id, key))
        if existing is not None and existing in self.dormant:
            return existing  # it comes back when a message reaches it
        if existing is not None and existing in self.entries:
            entry = self.entries[existing]
            if not entry.state.is_terminal:
                return self._answer_when_persisted(entry, reply, existing)
        ttl = agent.ttl_for(SessionKind.MAIN)
        spec = SpawnSpec(kind=SessionKind.MAIN, task=f"main for {key}")
        entry = self._new_entry(agent, SessionKind.MAIN, None, spec, ttl, key)
        self.mains[(agent_id, key)] = entry.session_id
        entry.started_at = self._now()
        self._persist_new(entry)
        return self._answer_when_persisted(entry, reply, entry.session_id)

    def _answer_when_persisted(self, entry: Entry, reply: Reply | None, value: object) -> object:
        if entry.persisted:
            return value

        def answer(error: BaseException | None) -> None:
            if reply is None:
                return
            if error is None:
                reply.set(value)
            else:
                reply.fail(error)

        entry.on_persisted.append(answer)
        return _DEFERRED

    def op_spawn(self, parent_id: uuid.UUID, spec: SpawnSpec, reply: Reply | None = None) -> object:
        """Validate and create a child; never raises for a refused spawn. With a
        store, the child starts (and ``reply`` is answered) once its record is
        durable; a failed write answers the store's error and leaves no child."""
        if self.closing:
            return SpawnAnswer(
                None, ErrorInfo(code=ErrorCode.NODE_CLOSED, message="node is shutting down")
            )
        parent = self._entry(parent_id)
        if parent is not None and spec.request_id is not None:
            first = parent.requests.get(spec.request_id)
            if first is None and parent.core.resumed:
                first = self._stored_request(parent, spec.request_id)
            if first is not None:
                answer = SpawnAnswer(first, None, existing=True)
                known = self.entries.get(first)
                if known is None:
                    return answer
                return self._answer_when_persisted(known, reply, answer)
        admitted = self._admit(parent, parent_id, spec)
        if isinstance(admitted, ErrorInfo):
            return SpawnAnswer(None, admitted)
        assert parent is not None  # admitted: it exists
        entry = self._create_child(parent, admitted)
        if isinstance(entry, SpawnAnswer):
            return entry
        if not self._persist_new(entry):
            self._want_slot(entry)
            return SpawnAnswer(entry.session_id, None)

        def written(error: BaseException | None) -> None:
            if error is None and entry.state is SessionState.PENDING:
                self._want_slot(entry)
            if reply is not None:
                reply.set(_written_answer(entry, error))

        entry.on_persisted.insert(0, written)
        return _DEFERRED

    def op_spawn_many(
        self, parent_id: uuid.UUID, specs: tuple[SpawnSpec, ...], reply: Reply | None = None
    ) -> object:
        """``op_spawn`` for each spec, in order, in one turn of the Cortex (their
        records share one commit); answered with the list of answers once every
        one is (a refused spawn does not stop the ones after it).

        A spec repeated in the batch (the same object) is validated in full once;
        for the children after, only what a spawn changes is checked again (the
        parent's live children and the node's counters), and the first that no
        longer fits is validated in full, so it gets the answer ``op_spawn``
        would give. What waits for the records runs once for the batch.
        """
        answers: list[SpawnAnswer | None] = [None] * len(specs)

        def refused(error: BaseException) -> SpawnAnswer:  # a failed write, as spawn answers it
            return SpawnAnswer(None, _store_error(error, parent_id))

        waiting = _Gather(len(specs), answers, reply, refused)
        parent = None if self.closing else self._entry(parent_id)
        created: list[tuple[int, Entry]] = []
        admitted: _Admitted | ErrorInfo | None = None
        with self._one_commit():
            for i, spec in enumerate(specs):
                if parent is None or spec.request_id is not None:  # op_spawn answers those
                    value = self.op_spawn(parent_id, spec, reply=waiting.slot(i))  # type: ignore[arg-type]
                    if value is not _DEFERRED:
                        waiting.answer(i, value)
                    continue
                if not (
                    isinstance(admitted, _Admitted)
                    and spec is admitted.spec
                    and self._still_admits(parent, admitted)
                ):
                    admitted = self._admit(parent, parent_id, spec)
                    if isinstance(admitted, ErrorInfo):
                        waiting.answer(i, SpawnAnswer(None, admitted))
                        continue
                child = self._create_child(parent, admitted)
                if isinstance(child, SpawnAnswer):
                    waiting.answer(i, child)
                else:
                    created.append((i, child))
            if created:
                self._persist_children(created, waiting)
        return _DEFERRED if reply is not None else answers

    def _admit(
        self, parent: Entry | None, parent_id: uuid.UUID, spec: SpawnSpec
    ) -> _Admitted | ErrorInfo:
        """Validate a spawn under ``parent`` (DESIGN.md §4's order) and resolve what
        its child gets; a refusal is counted, emitted and returned."""
        view = None
        if parent is not None:
            view = ParentView(
                session_id=parent.session_id,
                kind=parent.kind,
                state=parent.state,
                depth=parent.info.depth,
                live_children=parent.live_children,
                cancelling=parent.cancel_code is not None,
            )
        agent = parent.agent if parent is not None else None
        skill_name = (spec.skill or agent.default) if agent is not None else ""
        skill = agent.skills.get(skill_name) if agent is not None else None
        backend = spec.backend or (
            self.rt.config.backend if spec.kind is SessionKind.WORKER else "inline"
        )
        needs_thread = (
            skill is not None
            and agent is not None
            and backend == "inline"
            and not agent.is_async(skill_name)
        )
        capacity = Capacity(
            live_sessions=self.live,
            zombies=self.zombies + self.main_zombies,
            sync_threads=self.sync_threads + self.zombies,
            needs_thread=needs_thread,
        )
        error = check_spawn(view, spec, agent, self.rt.config, capacity)
        remote = None
        if error is None and skill is not None:
            remote, error = self._remote_for(backend, skill, spec)
        if error is not None:
            self._rejected_spawn(parent_id, spec, error)
            return error
        assert agent is not None
        return _Admitted(spec, agent, backend, remote, resolve_ttl(spec, agent), needs_thread)

    def _still_admits(self, parent: Entry, admitted: _Admitted) -> bool:
        """Whether one more child as ``admitted`` still passes every check. Within
        one turn of the Cortex only these change as children are created."""
        config = self.rt.config
        return (
            parent.live_children < parent.agent.max_children
            and self.live < config.max_sessions
            and self.zombies + self.main_zombies < config.max_zombies
            and not (
                admitted.needs_thread
                and self.sync_threads + self.zombies >= config.max_step_threads
            )
        )

    def _create_child(self, parent: Entry, admitted: _Admitted) -> Entry | SpawnAnswer:
        """Index an admitted child under ``parent`` and start its actor; a refusal
        if no actor could be started (then nothing was registered)."""
        spec, ttl = admitted.spec, admitted.ttl
        share = admitted.ttl_share
        if share is None and ttl is not None:
            share = admitted.ttl_share = self._ttl_share()
        try:
            last = admitted.last
            if last is None:
                entry = self._new_entry(
                    admitted.agent,
                    spec.kind,
                    parent,
                    spec,
                    ttl,
                    None,
                    admitted.backend,
                    admitted.remote,
                    share,
                )
            else:  # its sibling's identity but for the id: made at the same instant
                info = msgspec.structs.replace(
                    last, session_id=new_session_id(), metadata=dict(spec.metadata)
                )
                entry = self._register(
                    admitted.agent, info, parent, ttl, remote=admitted.remote, ttl_share=share
                )
            admitted.last = entry.info
        except RuntimeError as exc:  # "can't start new thread"
            error = ErrorInfo(
                code=ErrorCode.CAPACITY_EXCEEDED,
                message=f"no actor could be started for a child of {parent.session_id}: {exc}",
                detail={"limit": "threads"},
            )
            self._rejected_spawn(parent.session_id, spec, error)
            return SpawnAnswer(None, error)
        parent.children[entry.session_id] = None
        parent.live_children += 1
        if spec.request_id is not None:
            parent.requests[spec.request_id] = entry.session_id
        return entry

    def _persist_children(self, created: list[tuple[int, Entry]], waiting: _Gather) -> None:
        """Write the records of a batch's new children; once durable, each starts
        (wants a slot) and its place in ``waiting`` is answered, in order, before
        whoever else waits for it. A failed write takes every one out again."""
        future = None
        for _, entry in created:
            future = self.persist.created(entry, entry.info.created_at)
            if future is None:  # no store: they start now
                break
            entry.persisted = False
        if future is None:
            for i, entry in created:
                self._want_slot(entry)
                waiting.answer(i, SpawnAnswer(entry.session_id, None))
            return

        def written(error: BaseException | None) -> None:
            for i, entry in created:
                entry.persisted = True
                if error is not None:
                    self._store_failed(error)
                    self._discard(entry)
                elif entry.state is SessionState.PENDING:
                    self._want_slot(entry)
                waiting.answer(i, _written_answer(entry, error))
                if entry.on_persisted:
                    others, entry.on_persisted = entry.on_persisted, []
                    for then in others:
                        then(error)

        # Inside one commit every record shares its future: one callback for all.
        self._when_written(future, written)

    def _remote_for(
        self, name: str, skill: Callable[[Any], Any], spec: SpawnSpec
    ) -> tuple[tuple[ExecutionBackend, bytes] | None, ErrorInfo | None]:
        """Where a new child's skill runs: None inline, else its backend and the
        skill's bytes; or why it cannot run there (the spawn is refused)."""
        skill_name = repr(spec.skill) if spec.skill else "the default skill"
        try:
            backend = self.rt.backends.get(name)
        except KeyError:
            return None, ErrorInfo(
                code=ErrorCode.UNKNOWN_BACKEND,
                message=f"backend {name!r} is not one of {list(BACKENDS)}",
                detail={"field": "backend", "backend": name},
            )
        except BackendUnavailableError as exc:
            return None, ErrorInfo(
                code=ErrorCode.BACKEND_UNAVAILABLE,
                message=str(exc),
                detail={"backend": name},
            )
        if backend is None:
            return None, None
        try:
            data = self.rt.backends.serialised(backend, skill)
        except TypeError as exc:
            return None, ErrorInfo(
                code=ErrorCode.NOT_SERIALISABLE,
                message=f"skill {skill_name} cannot run on the {name} backend: {exc}",
                detail={"field": "skill", "backend": name, "skill": spec.skill},
            )
        return (backend, data), None

    def _rejected_spawn(self, parent_id: uuid.UUID, spec: SpawnSpec, error: ErrorInfo) -> None:
        self.rt.counters[f"rejected_{error.code.value}"] += 1
        self.rt.events.emit(
            Event(
                kind=EventKind.REJECTED,
                at=self._now(),
                parent_id=parent_id,
                code=error.code.value,
                data={"kind": spec.kind.value, "message": error.message},
            )
        )

    # -- persistence ----------------------------------------------------------------

    def _stored_request(self, parent: Entry, request_id: str) -> uuid.UUID | None:
        """The child a session spawned with ``request_id`` before a restart (its
        request map starts empty when it comes back from the store)."""
        if self.store is None:
            return None
        for child_id in parent.children:
            child = self.entries.get(child_id)
            info = child.info if child is not None else None
            if info is None:
                record = self.store.session(child_id)
                info = record.info if record is not None else None
            if info is not None and info.request_id == request_id:
                parent.requests[request_id] = child_id
                return child_id
        return None

    def _when_written(
        self,
        future: concurrent.futures.Future[None] | None,
        then: Callable[[BaseException | None], None],
    ) -> None:
        """Run ``then(error)`` on this thread once the store write ``future``
        finished (at once without a store). The write counts as activity."""
        if future is None:
            then(None)
            return
        if self.batched is not None and future is self.persist.shared:
            self.batched.append(then)  # one AfterWrite for the whole batch
            return
        ref, activity = self.self_ref, self.rt.activity
        activity.begin()

        def done(finished: concurrent.futures.Future[None]) -> None:
            try:
                if ref is None or not post(ref, AfterWrite(then, finished.exception()), activity):
                    log.warning("a store write finished after the cortex stopped")
            finally:
                activity.end()

        future.add_done_callback(done)

    def _persist_new(self, entry: Entry) -> bool:
        """Write a new session's record; False when there is no store. Until the
        write is durable, ``entry.on_persisted`` collects who waits for it; if it
        fails, the session is taken out again as if never created."""
        future = self.persist.created(entry, entry.info.created_at)
        if future is None:
            return False
        entry.persisted = False

        def written(error: BaseException | None) -> None:
            entry.persisted = True
            if error is not None:
                self._store_failed(error)
                self._discard(entry)
            waiting, entry.on_persisted = entry.on_persisted, []
            for then in waiting:
                then(error)

        self._when_written(future, written)
        return True

    @contextlib.contextmanager
    def _one_commit(self) -> Iterator[None]:
        """Every write made inside goes into one store batch (one commit), and
        what waits for those writes runs in one ``AfterWrite``: a batched spawn,
        a cascade, a batch of ended runs cost one transaction, not one each."""
        if self.batched is not None:
            yield
            return
        self.batched = []
        self.persist.open_batch()
        shared = self.persist.shared
        try:
            yield
        finally:
            thens, self.batched = self.batched, None
            self.persist.close_batch()
            if thens:

                def run_all(error: BaseException | None) -> None:
                    for then in thens:
                        then(error)

                self._when_written(shared, run_all)

    def _store_failed(self, error: BaseException) -> None:
        self.rt.counters["store_write_errors"] += 1
        self._emit(EventKind.STORE_ERROR, None, data={"error": repr(error)})

    def _discard(self, entry: Entry) -> None:
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
        entry.core.release_slot()
        self._emit(EventKind.DISCARDED, entry)
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
        if entry.ref is not None:
            self.to_stop.append(entry.ref)
            entry.ref = None

    def _entry(self, session_id: uuid.UUID | None) -> Entry | None:
        """The index entry of ``session_id``, bringing a dormant Main back first."""
        if session_id is None:
            return None
        entry = self.entries.get(session_id)
        if entry is None and session_id in self.dormant:
            held = self.dormant.pop(session_id)
            stored = self.store.session(session_id) if self.store is not None else None
            entry = self._restore(stored or held)
            next_seq = self.next_seqs.pop(session_id, None)
            if next_seq is not None:  # it was passivated, not left by recovery
                entry.next_seq = next_seq
                self.rt.counters["reactivated"] += 1
        return entry

    def _restore(self, record: SessionRecord) -> Entry:
        """Bring a stored Main or suspended Branch back into the index, with its
        context, its filed results and ``resumed`` set. A Main takes messages at
        once; a Branch stays suspended until resumed (its skill then runs again)."""
        info = record.info
        agent = self.rt.agents[info.agent_id]
        if info.kind is SessionKind.MAIN and info.skill != agent.main:
            info = msgspec.structs.replace(info, skill=agent.main)
        parent = self._entry(info.parent_id)
        ttl = None if info.deadline is None else info.deadline - self._now()
        entry = self._register(agent, info, parent, ttl, restored=True)
        core = entry.core
        core.context = context_from_record(record.context)
        core.resumed = True
        if self.store is not None:
            for result in self.store.received(info.session_id):
                core.received.append(result)
            for child_id in self.store.children(info.session_id):
                entry.children[child_id] = None
        if parent is not None:
            parent.children[info.session_id] = None
            parent.live_children += 1
        if info.kind is SessionKind.MAIN:
            entry.started_at = self._now()
        else:
            entry.suspend_requested = True
            entry.rerun = True
        self._emit(EventKind.RESTORED, entry)
        return entry

    def op_bring_back(self) -> None:
        """Apply recovery's plan: the first message the node sends (so sessions it
        starts can report to a node that already knows its Cortex, and the work
        counts for ``wait_idle``); a raise here fails the node loudly."""
        plan, self.rt.recovered = self.rt.recovered, None
        if plan is not None:
            self._bring_back(plan)

    def _bring_back(self, plan: Recovered) -> None:
        """Apply recovery's plan (see op_bring_back): dormant Mains, suspended branches,
        results owed to them, the Mains' acknowledged inbound messages."""
        self.dormant = plan.dormant
        self.mains.update(plan.mains)
        rerun = []
        for record in plan.suspended:
            entry = self._restore(record)  # recovery brought its parent back first
            if record.resume:
                rerun.append(entry)
        for parent_id, results in plan.deliveries.items():
            parent = self._entry(parent_id)
            if parent is None:
                continue
            for result in results:
                parent.core.add_result(result)
                parent.receipts.append(result)
                if parent.kind is SessionKind.MAIN:
                    self._post(parent, Deliver(result))
        for session_id, messages in plan.inbox.items():
            main = self._entry(session_id)
            if main is None:
                continue
            for message in messages:
                self._post(main, Inbound(message.message, message.seq))
                main.next_seq = max(main.next_seq, message.seq + 1)
        for entry in rerun:
            self._rerun(entry)

    def _rerun(self, entry: Entry) -> None:
        """Run a restored Branch's skill again (it waits for a slot like a spawn)."""
        entry.suspend_requested = False
        self._want_slot(entry)

    def _want_slot(self, entry: Entry) -> None:
        if self.rt.slots.try_acquire():  # the common case: no callback made for it
            self._activate(entry)
            return
        ref, activity, sid = self.self_ref, self.rt.activity, entry.session_id
        assert ref is not None

        def granted() -> None:
            post(ref, Granted(sid), activity)

        if self.rt.slots.acquire_or_queue(granted):
            self._activate(entry)
        else:
            entry.grant = granted

    def _granted(self, session_id: uuid.UUID) -> None:
        entry = self.entries.get(session_id)
        wanted = entry is not None and (entry.state is SessionState.PENDING or entry.rerun)
        if entry is None or not wanted or entry.state.is_terminal or self.closing:
            self.rt.slots.release()  # it ended while it queued, or the node is closing
            if entry is not None:
                entry.grant = None
            return
        entry.grant = None
        self._activate(entry)

    def _activate(self, entry: Entry) -> None:
        if entry.ref is None:  # a branch restored from the store gets its actor to run
            self._start_actor(entry)
        entry.rerun = False
        entry.started_at = now = self._now()
        self._set_state(entry, SessionState.ACTIVE, at=now, taking_slot=True)
        if not entry.core.fenced:
            rt = self.rt
            start_run(entry.core, rt.host, entry.skill, entry.is_async, rt.executor, rt.loop)

    # -- endings --------------------------------------------------------------

    def _runs_ended(self, ends: tuple[RunEnded, ...]) -> None:
        """Runs that ended in one pass of the event loop: their writes go into one
        commit, they end at one instant (one clock read), and the retained
        endings are evicted once after them rather than after each (with the
        same budget in all: ``_EVICT_TRIES`` an ending). A run whose end ends
        no session (a Main's cycle, a zombie's return) evicts nothing, as before."""
        now = self._now()
        endings = 0
        with self._one_commit():
            for ended in ends:
                endings += self._run_ended(ended.session_id, ended.end, now)
            if endings:
                self._evict(_EVICT_TRIES * endings)

    def _run_ended(self, session_id: uuid.UUID, end: RunEnd, now: float) -> bool:
        """One run's end; True if it ended its session (``_runs_ended`` evicts
        after them)."""
        entry = self.entries.get(session_id)
        if entry is None:
            return False
        if entry.zombie:
            entry.zombie = False
            if entry.kind is SessionKind.MAIN:
                self.main_zombies -= 1
            else:
                self.zombies -= 1
        core = entry.core
        if core.state in TERMINAL_STATES:
            if end.outcome is not None or end.error is not None:
                self.rt.counters["refused_after_fence"] += 1
                self._emit(EventKind.REFUSED, entry, data={"what": "result"})
            return False
        cancel_code = entry.cancel_code
        if cancel_code is None and core.info.kind is SessionKind.MAIN:
            self._emit(
                EventKind.CYCLE_ENDED,
                entry,
                code=end.error.code if end.error else None,
                data={"cycle": end.cycle, **({"error": end.error.message} if end.error else {})},
            )
            if end.error is not None:
                self.rt.counters["main_cycles_failed"] += 1
            self._input(entry)
            entry.snapshot_write = self.persist.snapshot(entry, now, consumed=core.input_seq)
            if not (self.closing and self.store is not None):
                # Closing with a store: no new cycle starts, for one could end after
                # the Cortex stops and then run again after the restart. What is
                # queued stays in the stored inbox and outbox and runs once then.
                self._post(entry, CycleDone())
            ended = False
        else:
            state, code, outcome, error = _ending_of(end, cancel_code)
            self._finish(entry, state, code, outcome, error=error, now=now, evict=False)
            ended = True
        if end.fatal is not None:
            self.rt.on_fatal(end.fatal)
        return ended

    def _finish(
        self,
        entry: Entry,
        state: SessionState,
        code: ErrorCode | None,
        outcome: Outcome | None,
        *,
        error: ErrorInfo | None = None,
        message: str | None = None,
        now: float | None = None,
        evict: bool = True,
    ) -> None:
        """Make ``entry`` terminal, deliver its one result, then clean up its subtree.

        ``now``: when it ended (default: the clock's now). ``evict``: False when
        the caller evicts retained endings itself, once after a batch of them.
        An illegal transition raises ``InvalidTransitionError`` before anything
        changed (a broken invariant: the handler fails the node).
        """
        if now is None:
            now = self._now()
        core = entry.core
        info = core.info
        if code is not None and error is None:
            error = ErrorInfo(
                code=code, message=message or _ENDING_MESSAGES[code].format(_id_text(entry))
            )
        timer = entry.ttl_timer
        if timer is not None:
            timer.cancel()
            entry.ttl_timer = None  # done: the retained record stays small for the GC
        if entry.grant is not None:
            # False: the Granted message is in flight and _granted releases the slot
            self.rt.slots.forget(entry.grant)
            entry.grant = None
        self._end_state(entry, state, code, now)
        self.live -= 1
        if not entry.is_async:
            self._thread_ended(entry)
        timings = Timings(created_at=info.created_at, started_at=entry.started_at, ended_at=now)
        if outcome is None:  # the defaults: no summary, artifacts or memory ids
            result = SessionResult(
                session_id=core.session_id,
                status=state,
                parent_id=info.parent_id,
                kind=info.kind,
                error=error,
                timings=timings,
            )
        else:
            result = SessionResult(
                session_id=core.session_id,
                status=state,
                parent_id=info.parent_id,
                kind=info.kind,
                summary=outcome.summary,
                artifacts=dict(outcome.artifacts),
                memory_ids=tuple(outcome.memory_ids),
                error=error,
                timings=timings,
            )
        entry.result = result
        write = entry.final_write = self.persist.ended(entry, result, now)
        if write is not None:
            self._count_failures(write)
        if entry.waiters:
            for reply in entry.waiters:
                self._answer_durable(entry, reply)
            entry.waiters.clear()
        if entry.parent is not None:
            self._deliver(entry, entry.parent, result, now)
        if entry.ref is not None:
            self.to_stop.append(entry.ref)
            entry.ref = None  # its actor is done: not kept by the retained record
        self.terminal.append(core.session_id)
        if evict:
            self._evict(_EVICT_TRIES)
        # A session that was itself cancelled had its whole subtree marked then
        # (and could spawn nothing since), so there is nothing left to walk.
        if entry.live_children and entry.cancel_code is None:
            self._cancel_group(self._uncancelled_descendants(entry), ErrorCode.PARENT_TERMINATED)
        if self.shutdown_waiters:
            self._check_shutdown()

    def _thread_ended(self, entry: Entry) -> None:
        """A sync session ended: a Branch's or Worker's step thread is no longer
        counted, and one its skill still runs on is abandoned (a zombie)."""
        main = entry.core.info.kind is SessionKind.MAIN
        if not main:
            self.sync_threads -= 1
        if entry.core.skill_running:
            entry.zombie = True
            if main:
                self.main_zombies += 1  # a thread of the Main pool, not the step pool
            else:
                self.zombies += 1

    def _end_state(
        self, entry: Entry, state: SessionState, code: ErrorCode | None, now: float
    ) -> None:
        """``_set_state`` for an ending: ``entry`` becomes ``state`` (terminal) and
        the event says so; under the same lock its compute slot is given back
        and, unless its skill still runs (a forced task is yet to be cancelled),
        its task dropped. ``InvalidTransitionError`` (nothing changed) if the
        transition is illegal."""
        core = entry.core
        old = core.state
        if state not in TRANSITIONS[old]:  # a broken invariant: the node fails loudly
            msg = f"session {core.session_id}: {old} -> {state} is not a legal transition"
            raise InvalidTransitionError(msg, session_id=core.session_id)
        with core.cond:
            core.state = state
            held, core.holds_slot = core.holds_slot, False
            if not core.skill_running:
                core.task = None
                core.task_loop = None
        if held:
            core.slots.release()
        self._emit(EventKind.TRANSITION, entry, previous=old, code=code, at=now)
        if old is SessionState.SUSPENDED:
            # as _set_state writes a Branch leaving suspension (the ending's own write follows)
            self.persist.snapshot(entry, now, resume=entry.shutdown_park)

    def _count_failures(self, future: concurrent.futures.Future[None]) -> None:
        """Count ``future``'s failure (once per write made) as a store write error.

        The writes of an open batch share one future, so it gets one callback
        that counts them all: one per ending cost a callback call each.
        """
        counted = self.counted_writes
        if counted is not None and counted[0] is future:
            counted[1][0] += 1
            return
        writes = [1]
        if future is self.persist.shared:
            self.counted_writes = (future, writes)
        counters = self.rt.counters

        def count(finished: concurrent.futures.Future[None]) -> None:
            # on the writer thread: only counted here; the waiters get the error
            if finished.exception() is not None:
                counters["store_write_errors"] += writes[0]

        future.add_done_callback(count)

    def _answer_durable(self, entry: Entry, reply: Reply) -> None:
        """Answer ``reply`` with the ended session's result once its terminal
        write is durable (the store's error if that write failed)."""
        result, future = entry.result, entry.final_write
        if future is None:
            reply.set(result)
            return

        def answer(finished: concurrent.futures.Future[None]) -> None:
            error = finished.exception()
            if error is None:
                reply.set(result)
            else:
                reply.fail(error)

        future.add_done_callback(answer)

    def _deliver(self, entry: Entry, parent: Entry, result: SessionResult, now: float) -> None:
        """File ``entry``'s result on ``parent`` and say so (a RESULT_DELIVERED event)."""
        parent_core = parent.core
        parent_live = parent_core.state not in TERMINAL_STATES
        if parent_live and self.store is not None:
            parent.receipts.append(result)  # its next snapshot records the receipt
        parent.live_children -= 1
        # Filed at once (so results() and a waiting skill see it now); a live
        # Main also gets it in its mailbox, where it starts a message cycle.
        # Closing with a store, it stays owed and runs after the restart (see _run_ended).
        parent_core.add_result(result)
        live_main = parent_live and parent_core.info.kind is SessionKind.MAIN
        if live_main and not (self.closing and self.store is not None):
            self._input(parent)
            self._post(parent, Deliver(result))
        if self.rt.events.observed:
            self._emit(EventKind.RESULT_DELIVERED, entry, data={"to": _id_text(parent)}, at=now)

    def _evict(self, tries: int) -> None:
        """Forget the oldest endings past ``retain_terminal`` whose terminal write
        is durable (the store answers for them from then on).

        Bounded work per ending: zombies are passed over at most ``tries`` times
        a call (``_EVICT_TRIES`` an ending; passing over every one of them each
        time made a cascade of 90,000 sessions quadratic while their writes were
        queued). An ending whose terminal write is not yet durable stops the
        round: writes commit in the order they were made, so the endings after
        it wait for theirs too.
        """
        terminal, entries = self.terminal, self.entries
        passed = 0
        durable = None  # a write seen done (a batch's endings share one)
        for _ in range(len(terminal) - self.rt.config.retain_terminal):
            sid = terminal[0]
            old = entries.get(sid)
            if old is None:
                terminal.popleft()
                continue
            write = old.final_write
            if write is not None and write is not durable:
                if not write.done():
                    return  # the store still holds its old state (reads fall back to it)
                durable = write
            terminal.popleft()
            if old.zombie:  # its thread may still report: a later round
                terminal.append(sid)
                passed += 1
                if passed >= tries:
                    return
                continue
            del entries[sid]
            parent = old.parent
            if parent is not None:
                parent.children.pop(sid, None)
                if old.info.request_id is not None:
                    parent.requests.pop(old.info.request_id, None)
            old.parent = None
            if old.kind is SessionKind.MAIN:
                key = (old.agent.agent_id, old.info.key or "")
                if self.mains.get(key) == sid:  # a newer Main may hold the key
                    del self.mains[key]

    # -- cancellation -----------------------------------------------------------

    def _cancel_group(
        self,
        group: list[Entry],
        code: ErrorCode,
        first: Entry | None = None,
        grace: float | None = None,
    ) -> None:
        """Request cancellation of ``group`` (``first`` gets ``code``, the rest
        ``parent_terminated``) with one deadline for all of them: now + ``grace``
        (default: the node's). Every write it makes goes into one commit."""
        grace = self.rt.config.grace if grace is None else grace
        with self._one_commit():
            ids = tuple([e.core.session_id for e in self._request_cancel(group, code, first)])
            if ids and grace <= 0:
                self._deadline(ids)
        if not ids or grace <= 0:
            return
        ref, activity = self.self_ref, self.rt.activity
        assert ref is not None

        def fire() -> None:
            post(ref, Deadline(ids), activity)

        self.rt.clock.call_later(grace, fire)

    def _request_cancel(
        self, group: list[Entry], code: ErrorCode, first: Entry | None
    ) -> list[Entry]:
        """Mark ``group`` cancelled and wake its skills; end at once what runs
        nothing; the sessions left to wrap up (their deadline is the caller's)."""
        running: list[Entry] = []
        wakeups: list[Any] = []
        now = self._now()
        for entry in group:
            entry_code = code if (first is None or entry is first) else ErrorCode.PARENT_TERMINATED
            entry.cancel_code = entry_code
            core = entry.core
            state = core.state
            kind = core.info.kind
            self._emit(EventKind.CANCEL_REQUESTED, entry, code=entry_code, at=now)
            if state is SessionState.PENDING or entry.rerun:  # nothing runs to wrap up
                self._finish(
                    entry,
                    SessionState.CANCELLED,
                    entry_code,
                    None,
                    message=f"session {_id_text(entry)} was cancelled before it ran",
                )
                continue
            if kind is SessionKind.MAIN:
                with core.cond:
                    idle = not core.skill_running
                if idle:
                    core.fence(entry_code)  # a cycle racing this cancel stops at once
                    self._post(entry, CancelSignal(entry_code))
                    self._finish(entry, SessionState.CANCELLED, entry_code, None)
                    continue
                self._post(entry, CancelSignal(entry_code))  # its actor also drops queued input
            else:
                if state is SessionState.SUSPENDED:  # it wakes to wrap up in grace
                    self._set_state(entry, SessionState.ACTIVE, entry_code)
                entry.suspend_requested = False
                # Straight onto the shared state: a mailbox hop per session made
                # cancelling a 4,681-session tree cost a thread wake-up each.
                core.request_cancel(entry_code, wakeups)
            running.append(entry)
        wake_batch(wakeups)
        return running

    def _deadline(self, session_ids: tuple[uuid.UUID, ...]) -> None:
        with self._one_commit():
            for sid in session_ids:
                self._force_end(sid)

    def _force_end(self, sid: uuid.UUID) -> None:
        entry = self.entries.get(sid)
        if entry is None or entry.state.is_terminal:
            return
        self._fence(entry, ErrorCode.TERMINATED_BY_FORCE)
        self._finish(entry, SessionState.CANCELLED, ErrorCode.TERMINATED_BY_FORCE, None)

    def _fence(self, entry: Entry, code: ErrorCode) -> None:
        """Nothing the skill does counts from now on; its actor drops queued
        input and an async task is cancelled."""
        entry.core.fence(code)
        if entry.ref is not None:
            self._post(entry, ForceStop())
        else:  # a parked branch holds no actor
            entry.core.cancel_task()

    def op_cancel(self, session_id: uuid.UUID) -> ErrorInfo | None:
        """Cancel a session and its whole subtree, with one deadline."""
        entry = self._lookup(session_id)
        if entry.state.is_terminal:
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} already ended ({entry.state.value})",
            )
        if entry.cancel_code is not None:
            return None  # one request, one deadline: a second cancel changes nothing
        group = [entry, *self._uncancelled_descendants(entry)]
        self._cancel_group(group, ErrorCode.CANCELLED, first=entry)
        return None

    def _expire(self, session_id: uuid.UUID) -> None:
        entry = self._entry(session_id)  # a passivated Main comes back to end
        if entry is None or entry.state.is_terminal:
            return
        self._fence(entry, ErrorCode.TTL_EXPIRED)
        summary, data = entry.last_progress or ("", {})
        outcome = Outcome(summary=summary, artifacts={"progress": data} if data else {})
        self._finish(entry, SessionState.EXPIRED, ErrorCode.TTL_EXPIRED, outcome)

    # -- suspension ---------------------------------------------------------------

    def op_suspend(self, session_id: uuid.UUID) -> ErrorInfo | None:
        """Ask a Branch to park at its next checkpoint."""
        entry = self._lookup(session_id)
        if entry.kind is not SessionKind.BRANCH:
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} is a {entry.kind.value}; only branches suspend",
            )
        if entry.state is not SessionState.ACTIVE or entry.cancel_code is not None:
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} is {entry.state.value}; only active branches "
                "suspend",
            )
        if entry.core.remote is not None:
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} runs on the {entry.info.backend} backend; "
                "only inline branches suspend",
            )
        if not entry.suspend_requested:
            self._request_suspend(entry)
            self._emit(EventKind.SUSPEND_REQUESTED, entry)
        return None

    def _request_suspend(self, entry: Entry) -> None:
        entry.suspend_requested = True
        core = entry.core
        with core.cond:
            core.suspend_requested = True
            still_parked = core.parked  # resumed a moment ago, not yet off its checkpoint
            core.wake()
        if still_parked:  # it stays parked and will not report again: suspended now
            self._set_state(entry, SessionState.SUSPENDED)
            self._stop_actor(entry)

    def _parked(self, session_id: uuid.UUID) -> None:
        entry = self.entries.get(session_id)
        if entry is None or not entry.suspend_requested or entry.state is not SessionState.ACTIVE:
            return
        with entry.core.cond:
            parked = entry.core.parked  # False when a resume already let it go (stale)
        if entry.cancel_code is not None or not parked:
            return
        self._set_state(entry, SessionState.SUSPENDED)
        self._stop_actor(entry)  # its parked skill needs no mailbox; nothing is queued for it
        if self.shutdown_waiters:
            self._check_shutdown()

    def op_resume(self, session_id: uuid.UUID) -> ErrorInfo | None:
        """Resume a suspended Branch (or withdraw a suspension not yet taken)."""
        entry = self._lookup(session_id)
        if (
            entry.kind is not SessionKind.BRANCH
            or not entry.suspend_requested
            or entry.state.is_terminal
            or entry.cancel_code is not None
        ):
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} ({entry.kind.value}, {entry.state.value}) is not "
                "suspended",
            )
        if self.closing:
            return ErrorInfo(code=ErrorCode.NODE_CLOSED, message="node is shutting down")
        if entry.rerun:
            self._rerun(entry)
            return None
        entry.suspend_requested = False
        if entry.state is SessionState.SUSPENDED:
            self._set_state(entry, SessionState.ACTIVE)
        entry.core.request_suspend(False)
        return None

    # -- messages, progress, periodic checks -------------------------------------

    def op_send(self, session_id: uuid.UUID, message: Any, reply: Reply | None = None) -> object:
        """Queue an inbound message for a Main (one message cycle). With a store it
        is written to the Main's inbox first and accepted once durable."""
        entry = self._lookup(session_id)
        if entry.kind is not SessionKind.MAIN:
            return ErrorInfo(
                code=ErrorCode.NOT_ALLOWED,
                message=f"session {session_id} is a {entry.kind.value}; only mains take "
                "messages (context reaches children only at spawn)",
            )
        if entry.state.is_terminal or entry.cancel_code is not None:
            return ErrorInfo(
                code=ErrorCode.SESSION_NOT_ACTIVE,
                message=f"session {session_id} is stopping or ended ({entry.state.value}); "
                "the message was not delivered",
            )
        if self.closing:
            return ErrorInfo(code=ErrorCode.NODE_CLOSED, message="node is shutting down")
        seq = entry.next_seq
        try:
            future = self.persist.inbound(entry, seq, message, self._now())
        except RejectedInputError as exc:
            raise RejectedInputError(str(exc), field="message") from exc
        self._input(entry)
        if future is None:
            self._post(entry, Inbound(message))
            return None
        entry.next_seq += 1
        entry.inflight += 1

        def written(error: BaseException | None) -> None:
            entry.inflight -= 1
            answer: ErrorInfo | None = None
            if error is not None:
                self._store_failed(error)
                answer = _store_error(error, session_id)
            elif entry.state.is_terminal or entry.cancel_code is not None:
                answer = ErrorInfo(
                    code=ErrorCode.SESSION_NOT_ACTIVE,
                    message=f"session {session_id} ended before the message was accepted",
                )
            else:
                self._post(entry, Inbound(message, seq))
            if reply is not None:
                reply.set(answer)

        self._when_written(future, written)
        return _DEFERRED

    def _progress(self, session_id: uuid.UUID, note: str, data: dict[str, Any]) -> None:
        entry = self.entries.get(session_id)
        if entry is None or entry.state.is_terminal:
            return
        entry.last_progress = (note, data)
        self._emit(EventKind.PROGRESS, entry, data={"note": note, **data})

    def _child_update(self, session_id: uuid.UUID, message: Any) -> None:
        """A child's ``send_to_parent``: onto the parent's updates, if both still run."""
        entry = self.entries.get(session_id)
        if entry is None or entry.state.is_terminal or entry.parent is None:
            return
        parent = entry.parent
        if parent.state.is_terminal:
            return
        parent.core.add_update(session_id, message)
        self._emit(EventKind.CHILD_UPDATE, entry, data={"to": str(parent.session_id)})

    def _tick(self) -> None:
        """The periodic check: idle Mains asked whether they may be passivated,
        a slice of the sessions checked for being stuck, memory pressure.

        Its cost is bounded, not a walk of every session each time (a tenth of
        a second at 100,000 sessions): it walks the resident Mains, at most
        ``_SWEEP_SLICE`` sessions for the stuck check (a node holding more is
        swept over several checks), and the branches only when the probe says
        memory is short.
        """
        config = self.rt.config
        now = self.rt.clock.monotonic()
        idle_after = config.passivate_after
        if self.store is not None and not self.closing and idle_after is not None:
            self._ask_idle_mains(now, idle_after)
        self._sweep_stuck(now, config.stuck_after)
        pressure = config.memory_pressure
        if pressure is not None and not self.closing:
            try:
                under_pressure = pressure()
            except Exception:
                log.exception("memory-pressure probe raised; treated as no pressure")
                under_pressure = False
            if under_pressure:
                self._relieve_pressure()
        if not self.closing:
            self._arm_tick()

    def _ask_idle_mains(self, now: float, idle_after: float) -> None:
        entries, resident = self.entries, self.resident_mains
        for sid, entry in list(resident.items()):
            if entries.get(sid) is not entry or entry.state.is_terminal:
                del resident[sid]  # passivated or ended since
            elif entry.state is SessionState.ACTIVE and now - entry.idle_since >= idle_after:
                self._ask_idle(entry)

    def _sweep_stuck(self, now: float, stuck_after: float) -> None:
        sweep = self.sweep
        if not sweep:
            sweep = self.sweep = list(self.entries.values())
        for _ in range(min(len(sweep), _SWEEP_SLICE)):
            entry = sweep.pop()
            core = entry.core
            if (
                core.skill_running
                and not core.blocked
                and not core.stuck
                and core.state is SessionState.ACTIVE
                and core.remote is None  # its worker's liveness is the backend's to watch
                and now - core.last_checkpoint >= stuck_after
            ):
                core.stuck = True
                self.rt.counters["stuck_flagged"] += 1
                self._emit(
                    EventKind.STUCK, entry, data={"since_checkpoint_s": now - core.last_checkpoint}
                )

    def _relieve_pressure(self) -> None:
        """Memory is short: suspend the active branch whose last checkpoint is oldest."""
        candidates = [
            entry
            for entry in self.entries.values()
            if entry.kind is SessionKind.BRANCH
            and entry.state is SessionState.ACTIVE
            and not entry.suspend_requested
            and entry.cancel_code is None
            and entry.core.remote is None
        ]
        if candidates:
            victim = min(candidates, key=lambda e: e.core.last_checkpoint)
            self._emit(EventKind.MEMORY_PRESSURE, victim)
            self.op_suspend(victim.session_id)

    # -- passivation --------------------------------------------------------------

    def _input(self, entry: Entry) -> None:
        """Something was handed to a Main (a message, a result) or a cycle of it
        ended: it is not idle, and a passivation asked about before is stale."""
        entry.mark += 1
        entry.idle_since = self.rt.clock.monotonic()

    def _passivable(self, entry: Entry) -> bool:
        core = entry.core
        return (
            entry.state is SessionState.ACTIVE
            and entry.ref is not None
            and entry.cancel_code is None
            and not core.fenced
            and not core.skill_running
            and entry.live_children == 0
            and entry.inflight == 0
            and entry.persisted
            and not entry.waiters
            and not entry.receipts
        )

    def _ask_idle(self, entry: Entry) -> None:
        """Ask a long-idle Main's actor whether it holds anything (its answer is
        an ``Idle``): only the actor knows what it has queued."""
        if entry.passivating is not None or not self._passivable(entry):
            return
        ref, activity, sid = self.self_ref, self.rt.activity, entry.session_id
        assert ref is not None

        def done(mark: int | None) -> None:
            post(ref, Idle(sid, mark), activity)

        entry.passivating = entry.mark
        self._post(entry, Passivate(entry.mark, done))

    def _idle(self, session_id: uuid.UUID, mark: int | None) -> None:
        """Passivate the Main if nothing reached it since it said it was idle: its
        record is durable (written after its last cycle), so its actor stops and
        the index keeps only what lists it; its next message brings it back."""
        entry = self.entries.get(session_id)
        if entry is None:
            return
        entry.passivating = None
        if mark is None or mark != entry.mark or self.closing or not self._passivable(entry):
            return
        written = entry.snapshot_write
        if written is not None and not written.done():
            # Its record (and the results it files) must be durable before the
            # store is what answers for it: ask again once the write is done.
            ref, activity = self.self_ref, self.rt.activity
            assert ref is not None
            activity.begin()

            def again(_: concurrent.futures.Future[None]) -> None:
                post(ref, Idle(session_id, mark), activity)
                activity.end()

            entry.passivating = mark
            written.add_done_callback(again)
            return
        self._stop_actor(entry)
        del self.entries[session_id]
        self.live -= 1
        self.dormant[session_id] = SessionRecord(info=_with_state(entry))
        self.next_seqs[session_id] = entry.next_seq
        self.rt.counters["passivated"] += 1
        self._emit(EventKind.PASSIVATED, entry)

    # -- queries ------------------------------------------------------------------

    def _known(self, session_id: uuid.UUID) -> Entry | SessionRecord:
        """What this node knows of a session, without waking a dormant Main: its
        index entry, or its stored record (dormant, or ended before a restart
        or eviction). ``UnknownSessionError`` when neither exists."""
        entry = self.entries.get(session_id)
        if entry is not None:
            return entry
        record = self.dormant.get(session_id)
        if record is None and self.store is not None:
            record = self.store.session(session_id)
        if record is None:
            msg = f"unknown session {session_id}"
            raise UnknownSessionError(msg, session_id=session_id)
        return record

    def op_info(self, session_id: uuid.UUID) -> SessionInfo:
        """The session's identity with its current state."""
        known = self._known(session_id)
        return known.info if isinstance(known, SessionRecord) else _with_state(known)

    def op_result(self, session_id: uuid.UUID, reply: Reply) -> object:
        """Answer ``reply`` with the session's result once it has one (and its
        terminal write is durable)."""
        known = self._known(session_id)
        if isinstance(known, SessionRecord):
            if known.result is not None:
                return known.result
            known = self._lookup(session_id)  # a dormant Main: it can still end
        if known.result is not None:
            self._answer_durable(known, reply)
        else:
            known.waiters.append(reply)
        return _DEFERRED

    def op_result_now(self, session_id: uuid.UUID) -> SessionResult | None:
        """The session's result if it has ended, else None."""
        return self._known(session_id).result

    def op_forget_waiter(self, session_id: uuid.UUID, reply: Reply) -> None:
        """Drop a waiter whose caller gave up (its timeout passed)."""
        entry = self.entries.get(session_id)
        if entry is not None and reply in entry.waiters:
            entry.waiters.remove(reply)

    def op_results(self, session_id: uuid.UUID) -> list[SessionResult]:
        """The results this session has received (most recent ``max_retained_results``)."""
        known = self._known(session_id)
        if isinstance(known, SessionRecord):
            return self.store.received(session_id) if self.store is not None else []
        with known.core.cond:
            return list(known.core.received)

    def op_tree(self, session_id: uuid.UUID) -> dict[str, Any]:
        """The subtree under ``session_id`` as nested dicts (info, result, children);
        sessions that ended before a restart come from the store."""

        def node(known: Entry | SessionRecord) -> dict[str, Any]:
            if isinstance(known, SessionRecord):
                info, result = known.info, known.result
                child_ids: list[uuid.UUID] = []
            else:
                info, result = _with_state(known), known.result
                child_ids = list(known.children)
            if self.store is not None:
                seen = set(child_ids)
                child_ids += [c for c in self.store.children(info.session_id) if c not in seen]
            children = []
            for child_id in child_ids:
                try:
                    children.append(node(self._known(child_id)))
                except UnknownSessionError:  # pruned, or evicted without a store
                    continue
            return {"info": info, "result": result, "children": children}

        return node(self._known(session_id))

    def op_sessions(
        self, state: SessionState | None, kind: SessionKind | None
    ) -> list[SessionInfo]:
        """Every session the index holds (dormant Mains included), optionally filtered."""
        infos = [_with_state(e) for e in self.entries.values()]
        infos += [record.info for record in self.dormant.values()]
        return [
            info
            for info in infos
            if (state is None or info.state is state) and (kind is None or info.kind is kind)
        ]

    def op_actor_ref(self, session_id: uuid.UUID) -> pykka.ActorRef[Any] | None:
        """The session's actor (None once it ended, or while a Main is dormant: a
        diagnostic never wakes one), for diagnostics and tests."""
        known = self._known(session_id)
        return None if isinstance(known, SessionRecord) else known.ref

    def op_probe_parked(
        self, session_id: uuid.UUID, probe: Callable[[SessionCore], Any]
    ) -> tuple[bool, Any, Exception | None]:
        """``(True, probe(core), None)`` for a live session holding no actor (a
        parked branch), run on this thread, or ``(True, None, error)`` if the
        probe raised; ``(False, None, None)`` otherwise."""
        entry = self.entries.get(session_id)
        if entry is None or entry.ref is not None or entry.state.is_terminal:
            return False, None, None
        try:
            return True, probe(entry.core), None
        except Exception as exc:  # noqa: BLE001 - the caller's probe: handed back to it
            return True, None, exc

    def op_stuck(self) -> list[SessionInfo]:
        """Sessions flagged as stuck (no checkpoint for ``stuck_after``)."""
        return [_with_state(e) for e in self.entries.values() if e.core.stuck]

    def op_stats(self) -> dict[str, int]:
        """Counters and gauges of the tree."""
        stats = dict(self.rt.counters)
        stats.update(
            live_sessions=self.live,
            indexed_sessions=len(self.entries),
            dormant_sessions=len(self.dormant),
            zombies=self.zombies + self.main_zombies,
            sync_threads=self.sync_threads,
            slots_in_use=self.rt.slots.in_use,
            slots_waiting=self.rt.slots.waiting,
            result_waiters=sum(len(e.waiters) for e in self.entries.values()),
            session_mailbox_depth=sum(
                _inbox_depth(e.ref) for e in self.entries.values() if e.ref is not None
            ),
        )
        return stats

    def op_control(self, command: object, reply: Reply | None = None) -> object:
        """Apply one decoded control command (see ``protocol.ControlMessage``)."""
        match command:
            case SpawnCmd(parent_id=parent_id, spec=spec):
                return self.op_spawn(parent_id, spec, reply)
            case SendCmd(session_id=sid, message=message):
                return self.op_send(sid, message, reply)
            case CancelCmd(session_id=sid):
                return self.op_cancel(sid)
            case SuspendCmd(session_id=sid):
                return self.op_suspend(sid)
            case ResumeCmd(session_id=sid):
                return self.op_resume(sid)
        msg = f"not a control command: {type(command).__name__}"
        raise RejectedInputError(msg)

    # -- shutdown and failure ------------------------------------------------------

    def op_begin_shutdown(self, grace: float, reply: Reply) -> object:
        """Stop taking work; suspend running branches, cancel workers with ``grace``
        (forced at its end, their parents told), keep mains. Answers ``reply`` with
        every session once that has settled or the grace ran out."""
        self.closing = True
        if self.tick_timer is not None:
            self.tick_timer.cancel()
        workers: list[Entry] = []
        for entry in list(self.entries.values()):
            if entry.state.is_terminal:
                continue
            remote = entry.core.remote is not None  # a remote step cannot park: cancelled
            if (entry.kind is SessionKind.WORKER or remote) and entry.cancel_code is None:
                workers.append(entry)
            elif (
                entry.kind is SessionKind.BRANCH
                and entry.state is SessionState.ACTIVE
                and entry.cancel_code is None
                and not entry.suspend_requested
            ):
                entry.shutdown_park = True
                self._request_suspend(entry)
                self._emit(EventKind.SUSPEND_REQUESTED, entry, data={"why": "shutdown"})
        if workers:
            self._cancel_group(workers, ErrorCode.CANCELLED, grace=grace)
        self.shutdown_waiters.append(reply)
        ref, activity = self.self_ref, self.rt.activity
        assert ref is not None

        def give_up() -> None:
            post(ref, Call("shutdown_deadline", ()), activity)

        if grace > 0:
            self.rt.clock.call_later(grace, give_up)
            self._check_shutdown()
        else:
            self.op_shutdown_deadline()
        return _DEFERRED

    def _check_shutdown(self) -> None:
        for entry in self.entries.values():
            if entry.state.is_terminal:
                continue
            if entry.kind is SessionKind.WORKER or entry.core.remote is not None:
                return
            if entry.suspend_requested and entry.state is SessionState.ACTIVE:
                return  # parked by the shutdown, or explicitly suspended: not parked yet
        self._settle_shutdown()

    def op_shutdown_deadline(self) -> None:
        """The shutdown grace ran out: force workers still running, fence branches
        that never parked, then settle."""
        self.op_force_workers()
        for entry in self.entries.values():
            if entry.suspend_requested and entry.state is SessionState.ACTIVE:
                self._fence(entry, ErrorCode.NODE_CLOSED)
        self._settle_shutdown()

    def op_force_workers(self) -> None:
        """Force every worker and remote step still running (a shutdown that ran
        out of real time)."""
        ids = tuple(
            e.session_id
            for e in self.entries.values()
            if (e.kind is SessionKind.WORKER or e.core.remote is not None)
            and not e.state.is_terminal
        )
        self._deadline(ids)

    def _settle_shutdown(self) -> None:
        waiters, self.shutdown_waiters = self.shutdown_waiters, []
        final = [_with_state(e) for e in self.entries.values()]
        for reply in waiters:
            reply.set(final)

    def op_stop_all(self) -> int:
        """Stop every session actor still running (last step of a shutdown)."""
        self._stop_ended()
        stopped = 0
        for entry in self.entries.values():
            if entry.ref is not None and entry.ref.is_alive():
                stop_actor(entry.ref)
                stopped += 1
        if self.tick_timer is not None:
            self.tick_timer.cancel()
        return stopped

    def _fail(self, error: BaseException) -> None:
        if self.failed is not None:
            return
        self.failed = error
        self.closing = True
        self._fail_waiters(NodeClosedError(f"node failed: {error!r}"))
        for reply in self.shutdown_waiters:
            reply.fail(NodeClosedError(f"node failed: {error!r}"))
        self.shutdown_waiters.clear()
        self.rt.events.emit(
            Event(kind=EventKind.NODE_FAILED, at=self._now(), data={"error": repr(error)})
        )
        self.rt.on_failed(error)


_DEFERRED = object()
_EVICT_TRIES = 16  # zombies an ending's eviction passes over at most
_SWEEP_SLICE = 10_000  # sessions the periodic check looks at for being stuck
#: Operations that answer their caller themselves (after a store write).
_TAKES_REPLY = frozenset({"main", "spawn", "spawn_many", "send", "control"})
#: What an operation raises for a bad request (before it changes anything);
#: anything else raised in a handler is a broken invariant and fails the node.
_CALLER_MISTAKES = (UnknownSessionError, RejectedInputError, NodeClosedError)
_STOP_BATCH = 4096  # ended actors waiting to stop: past this they stop at once
_STOP_WHEN_QUIET = 256  # ...and past this whenever the inbox is empty

_ENDING_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.CANCELLED: "session {} was cancelled",
    ErrorCode.PARENT_TERMINATED: "session {} was cancelled because its parent ended",
    ErrorCode.TERMINATED_BY_FORCE: "session {} was still running at its deadline and was "
    "terminated by force",
    ErrorCode.TTL_EXPIRED: "session {} outlived its ttl",
    ErrorCode.NODE_RESTARTED: "session {} was running when the node stopped",
    ErrorCode.NODE_CLOSED: "session {} was stopped with the node",
}


def _inbox_depth(ref: pykka.ActorRef[Any]) -> int:
    """Messages waiting in an actor's inbox (0 for an inbox that cannot say)."""
    qsize = getattr(ref.actor_inbox, "qsize", None)
    return int(qsize()) if callable(qsize) else 0


class _Gather:
    """Collects the answers of a batch and answers ``reply`` once all are in;
    a failed one is answered with ``refused(error)``."""

    __slots__ = ("answers", "left", "refused", "reply")

    def __init__(
        self,
        n: int,
        answers: list[Any],
        reply: Reply | None,
        refused: Callable[[BaseException], Any],
    ) -> None:
        self.answers, self.left, self.reply, self.refused = answers, n, reply, refused
        if n == 0 and reply is not None:
            reply.set(answers)

    def slot(self, i: int) -> _Slot:
        return _Slot(self, i)

    def answer(self, i: int, value: Any) -> None:
        self.answers[i] = value
        self.left -= 1
        if self.left == 0 and self.reply is not None:
            self.reply.set(self.answers)


class _Slot:
    """One place in a ``_Gather``, with the ``set``/``fail`` of a ``Reply``."""

    __slots__ = ("gather", "i")

    def __init__(self, gather: _Gather, i: int) -> None:
        self.gather, self.i = gather, i

    def set(self, value: Any) -> None:
        self.gather.answer(self.i, value)

    def fail(self, error: BaseException) -> None:
        self.gather.answer(self.i, self.gather.refused(error))


@dataclass(slots=True)
class _Admitted:
    """A validated spawn: what its child gets (for every child of a batch that
    repeats the spec, as long as ``CortexLogic._still_admits``)."""

    spec: SpawnSpec
    agent: Agent
    backend: str
    remote: tuple[ExecutionBackend, bytes] | None
    ttl: float | None
    needs_thread: bool
    last: SessionInfo | None = None  # the identity of the last child made from it
    ttl_share: SharedTtl | None = None  # their one TTL timer (they share their creation)


def _post_to(ref: pykka.ActorRef[Any], activity: Activity, message: object) -> None:
    post(ref, message, activity)


def _written_answer(entry: Entry, error: BaseException | None) -> SpawnAnswer:
    """A spawn's answer once its record's write finished: the child, or the
    store's error (a child that already ended is still the answer)."""
    if error is None or entry.state.is_terminal:
        return SpawnAnswer(entry.session_id, None)
    return SpawnAnswer(None, _store_error(error, entry.session_id))


def _id_text(entry: Entry) -> str:
    """``str(entry.session_id)``, made once per session: a cascade needs it in the
    session's ending message and in the delivery event of each of its children.
    (msgspec writes the same canonical form in C, at a fifth of the cost.)"""
    text = entry.id_text
    if text is None:
        text = entry.id_text = msgspec.to_builtins(entry.core.session_id)
    return text


def _ending_of(
    end: RunEnd, cancel_code: ErrorCode | None
) -> tuple[SessionState, ErrorCode | None, Outcome | None, ErrorInfo | None]:
    """How a run's end ends its session (state, code, outcome, error): cancelled
    once cancellation was asked (what it returned is the partial result), else
    failed on its error, cancelled by a ``Cancelled`` of its own, or completed."""
    if cancel_code is not None:
        return SessionState.CANCELLED, cancel_code, end.outcome, None
    if end.error is not None:
        return SessionState.FAILED, end.error.code, None, end.error
    if end.cancelled:
        return SessionState.CANCELLED, ErrorCode.CANCELLED, None, None
    return SessionState.COMPLETED, None, end.outcome, None


def _with_state(entry: Entry) -> SessionInfo:
    info = entry.info
    if info.state is entry.state:
        return info
    return msgspec.structs.replace(info, state=entry.state)


def _store_error(error: BaseException, session_id: uuid.UUID) -> ErrorInfo:
    code = getattr(error, "code", ErrorCode.STORE_FAILED)
    if not isinstance(code, ErrorCode):
        code = ErrorCode.STORE_FAILED
    return ErrorInfo(
        code=code,
        message=f"session {session_id}: the store refused the write: {error}",
        detail={"session_id": str(session_id)},
    )
