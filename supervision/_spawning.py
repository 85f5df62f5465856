"""Spawning: a Main opened for a session key, a child admitted under the rules
and created, a batch of children in one turn and one commit.

A refused spawn is an answer (``SpawnAnswer`` with an ``ErrorInfo``), counted
and emitted, never raised. With a store, a spawn is answered once the new
session's record is durable, and a failed write takes the session out again:
the spawn is admitted and its record queued in the Cortex's turn, and its
rest (``_started``) awaits the write, then starts the child and answers.
A spawn by the parent's own skill and a ``Run`` are answered, and start the
child, as soon as its record is queued (``early``): nothing outside the
process has seen the child yet, the writer commits in order, so the record
is durable no later than anything the child writes, and a failed write ends
the child ``failed`` with the store's code (``_settled``).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from sessiontree.actors import TimerHandle
from sessiontree.actors.backends import BACKENDS, ExecutionBackend
from sessiontree.actors.runtime import Reply, post
from sessiontree.protocol import (
    BackendUnavailableError,
    ErrorCode,
    ErrorInfo,
    NodeClosedError,
    SessionInfo,
    SessionKey,
    SessionKind,
    SessionState,
    SpawnSpec,
    StoreError,
    UnknownAgentError,
    UnknownSessionError,
    new_session_id,
    slot_for,
    slot_of,
)
from sessiontree.supervision._cancelling import Cancelling
from sessiontree.supervision._commits import Commits, Refused, Written, store_error
from sessiontree.supervision._config import Agent
from sessiontree.supervision._entry import SharedTtl, SpawnAnswer, TreeEntry
from sessiontree.supervision._events import Event, EventKind
from sessiontree.supervision._extension import Grant
from sessiontree.supervision._queries import await_result
from sessiontree.supervision._requests import DEFERRED, Call, Interrupt
from sessiontree.supervision._rules import (
    Capacity,
    ParentView,
    check_spawn,
    model_tier,
    resolve_ttl,
)
from sessiontree.supervision._starting import Starting
from sessiontree.supervision._tree import Tree

__all__ = ["Spawning"]


class Spawning:
    """Creates sessions (Cortex thread)."""

    def __init__(
        self,
        tree: Tree,
        commits: Commits,
        starting: Starting,
        cancelling: Cancelling,
    ) -> None:
        self.tree = tree
        self.commits = commits
        self.starting = starting
        self.cancelling = cancelling

    def open_main(self, agent_id: str, key: str) -> object:
        """Get or create the one Main of ``agent_id`` for session ``key`` (answered
        once its record is durable). Raises ``NodeClosedError`` while closing,
        ``UnknownAgentError``, or ``RejectedInputError`` for a malformed key."""
        tree = self.tree
        if tree.closing:
            msg = "node is shutting down; no new main sessions"
            raise NodeClosedError(msg)
        agent = tree.rt.agents.get(agent_id)
        if agent is None:
            msg = f"unknown agent {agent_id!r}; registered: {sorted(tree.rt.agents)}"
            raise UnknownAgentError(msg, field="agent_id")
        key = str(SessionKey.parse(key))
        existing = tree.mains.get((agent_id, key))
        if existing is not None and existing in tree.dormant:
            return existing  # it comes back when a message reaches it
        if existing is not None and existing in tree.entries:
            entry = tree.entries[existing]
            if not entry.state.is_terminal:
                return _when_recorded(entry, existing, tree)
        ttl = agent.ttl_for(SessionKind.MAIN)
        spec = SpawnSpec(kind=SessionKind.MAIN, task=f"main for {key}")
        grants = _features_admit(tree, None, spec, agent)
        assert not isinstance(grants, ErrorInfo)  # a Main is never refused (Extension.admit)
        entry = self._new_entry(agent, None, spec, ttl, key, grants=grants)
        tree.mains[(agent_id, key)] = entry.session_id
        entry.started_at = tree.now()
        written = self._record([entry])
        if written is None:
            return entry.session_id
        return self._main_recorded(entry, written)

    async def _main_recorded(self, entry: TreeEntry, written: Written) -> uuid.UUID:
        """A new Main's record was written (or refused: it is taken out again)."""
        error = await written
        self._settled([entry], error)
        if error is not None:
            raise Refused(error)
        return entry.session_id

    def spawn(
        self,
        parent_id: uuid.UUID,
        spec: SpawnSpec,
        *,
        early: bool = False,
        by_skill: bool = False,
    ) -> object:
        """Validate and create a child; never raises for a refused spawn. With a
        store, the answer is the rest of the spawn (``_started``): the child
        starts, and is the answer, once its record is durable; a failed write
        answers the store's error and leaves no child. ``early`` (a ``Run``,
        whose caller waits for the result): it starts, and is answered, once
        its record is queued; a failed write ends it (``Cancelling.unstored``).
        ``by_skill`` (the parent's skill asks): early, and a worker under a
        running Branch is not written at all (``TreeEntry.recorded``)."""
        early = early or by_skill
        tree = self.tree
        if tree.closing:
            closed = ErrorInfo(code=ErrorCode.NODE_CLOSED, message="node is shutting down")
            self._rejected_spawn(parent_id, spec.kind, closed)
            return SpawnAnswer(None, closed)
        parent = tree.entry(parent_id)
        if parent is not None and spec.request_id is not None:
            first = parent.requests.get(spec.request_id)
            if first is None and parent.core.resumed:
                first = self._stored_request(parent, spec.request_id)
            if first is not None:
                answer = SpawnAnswer(first, None, existing=True)
                known = tree.entries.get(first)
                if known is None:
                    return answer
                return _when_recorded(known, answer, tree)
        admitted = self._admit(parent, parent_id, spec)
        if isinstance(admitted, ErrorInfo):
            return SpawnAnswer(None, admitted)
        assert parent is not None  # admitted: it exists
        entry = self._create_child(parent, admitted, spec, by_skill=by_skill)
        written = self._record([entry], urgent=not early)
        if written is None:
            self.starting.want_slot(entry)
            return _created(entry)
        if early:
            self._start_early([entry], written)
            return _created(entry)
        return self._started(entry, written)

    async def _started(self, entry: TreeEntry, written: Written) -> SpawnAnswer:
        """The rest of a spawn answered once its child's record is durable."""
        error = await written
        self._settled([entry], error)
        return self._answer_written(entry, error)

    def run(
        self, parent_id: uuid.UUID, spec: SpawnSpec, reply: Reply, timeout: float | None = None
    ) -> object:
        """``spawn``, then answer ``reply`` with the new session's result once it
        has one (``Run``): one turn of the Cortex and one wake-up of the caller
        where a spawn and a wait took two of each. ``timeout`` (clock seconds
        from now): the session still running then is cancelled with the
        node's grace (``timed_out``), so it never outlives its caller's wait."""
        waiter = _RunWaiter(self.tree, reply, timeout)
        value = self.spawn(parent_id, spec, early=True)
        if isinstance(value, SpawnAnswer):
            waiter.set(value)
        else:  # a repeated request: its first child, once recorded
            self.commits.after(_then_wait(value, waiter))  # type: ignore[arg-type]
        return DEFERRED

    def spawn_many(
        self, parent_id: uuid.UUID, specs: tuple[SpawnSpec, ...], *, by_skill: bool = False
    ) -> object:
        """``spawn`` for each spec, in order, in one turn of the Cortex (their
        records share one commit): the list of answers, or the rest of the batch
        that answers it once every one is (a refused spawn does not stop the
        ones after it).

        A spec repeated in the batch (or one alike but for its task, context
        summary, input and metadata: ``_admitted_alike``) is validated in full
        once; for the children after, only what a spawn changes is checked again (the
        parent's live children and the node's counters), and the first that no
        longer fits is validated in full, so it gets the answer ``spawn`` would
        give. The batch waits for its records once. ``by_skill``: as for ``spawn``.
        """
        answers: list[Any] = [None] * len(specs)
        rest: list[Coroutine[Any, Any, None]] = []
        parent = None if self.tree.closing else self.tree.entry(parent_id)
        created: list[tuple[int, TreeEntry]] = []
        admitted: _Admitted | ErrorInfo | None = None
        with self.commits.one_commit():
            for i, spec in enumerate(specs):
                if parent is None or spec.request_id is not None:  # spawn answers those
                    value = self.spawn(parent_id, spec, by_skill=by_skill)
                    if isinstance(value, SpawnAnswer):
                        answers[i] = value
                    else:
                        rest.append(_answer_into(answers, i, value, parent_id))  # type: ignore[arg-type]
                    continue
                if not (
                    isinstance(admitted, _Admitted)
                    and _admitted_alike(admitted.spec, spec)
                    and self._still_admits(parent, admitted)
                ):
                    admitted = self._admit(parent, parent_id, spec)
                    if isinstance(admitted, ErrorInfo):
                        answers[i] = SpawnAnswer(None, admitted)
                        continue
                created.append((i, self._create_child(parent, admitted, spec, by_skill=by_skill)))
            if created:
                later = self._persist_children(created, answers, by_skill)
                if later is not None:
                    rest.append(later)
        if not rest:
            return answers
        return _gathered(answers, rest)

    def _admit(
        self, parent: TreeEntry | None, parent_id: uuid.UUID, spec: SpawnSpec
    ) -> _Admitted | ErrorInfo:
        """Validate a spawn under ``parent`` (in the order the README's Limits and
        defaults gives) and resolve what its child gets; a refusal is counted,
        emitted and returned."""
        tree = self.tree
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
        config = tree.rt.config
        backend = spec.backend or (config.backend if spec.kind is SessionKind.WORKER else "inline")
        needs_thread = (
            skill is not None
            and agent is not None
            and backend == "inline"
            and not agent.is_async(skill_name)
        )
        capacity = Capacity(
            live_sessions=tree.live,
            zombies=tree.zombies + tree.main_zombies,
            sync_threads=tree.sync_threads + tree.zombies,
            needs_thread=needs_thread,
        )
        error = check_spawn(view, spec, agent, config, capacity)
        remote = None
        if error is None and skill is not None:
            remote, error = self._remote_for(backend, skill, spec)
        grants: tuple[Grant, ...] = ()
        if error is None:  # the features' rules (budgets), after the kernel's; inline: hot
            assert agent is not None
            for ext in tree.ext.admit:
                granted = ext.admit(parent, spec, agent)
                if isinstance(granted, ErrorInfo):
                    error = granted
                    break
                if granted is not None:
                    grants = (*grants, granted)
        if error is not None:
            self._rejected_spawn(parent_id, spec.kind, error)
            return error
        assert agent is not None
        ttl = resolve_ttl(spec, agent)
        return _Admitted(spec, agent, backend, remote, ttl, needs_thread, grants)

    def _still_admits(self, parent: TreeEntry, admitted: _Admitted) -> bool:
        """Whether one more child as ``admitted`` still passes every check. Within
        one turn of the Cortex only these change as children are created."""
        tree = self.tree
        config = tree.rt.config
        return (
            not admitted.grants  # one granted something is admitted afresh each time
            and parent.live_children < parent.agent.max_children
            and tree.live < config.max_sessions
            and tree.zombies + tree.main_zombies < config.max_zombies
            and not (
                admitted.needs_thread
                and tree.sync_threads + tree.zombies >= config.max_step_threads
            )
        )

    def _create_child(
        self, parent: TreeEntry, admitted: _Admitted, spec: SpawnSpec, *, by_skill: bool
    ) -> TreeEntry:
        """Index a child of ``spec``, admitted as ``admitted``, under ``parent`` (a
        child holds no actor: nothing here can fail for want of a thread).
        ``by_skill``: its parent's skill spawned it; a worker then is not
        written while its parent is a running Branch (see ``TreeEntry.recorded``)."""
        ttl = admitted.ttl
        share = admitted.ttl_share
        if share is None and ttl is not None:
            share = admitted.ttl_share = self.tree.ttl_share()
        last = admitted.last
        if last is None:
            entry = self._new_entry(
                admitted.agent,
                parent,
                spec,
                ttl,
                None,
                admitted.backend,
                admitted.remote,
                share,
                admitted.grants,
            )
        else:  # its sibling's identity but for the id and its work: made at the same instant
            info = msgspec.structs.replace(
                last,
                session_id=new_session_id(slot_of(parent.session_id)),
                task=spec.task,
                context_summary=spec.context_summary,
                metadata=dict(spec.metadata),
                input=spec.input,
                fork_at=spec.fork_at,
                context=spec.context,
            )
            for ext in self.tree.ext.identity:  # (each sets what it stamps afresh)
                info = ext.identity(parent, spec, info)
            grants = admitted.grants
            for grant in grants:
                info = grant.stamp(info)
            entry = self.tree.register(
                admitted.agent,
                info,
                parent,
                ttl,
                spec=spec,
                remote=admitted.remote,
                ttl_share=share,
                grants=grants,
            )
        admitted.last = entry.info
        parent.children[entry.session_id] = None
        parent.live_children += 1
        if spec.request_id is not None:
            parent.requests[spec.request_id] = entry.session_id
        if by_skill and spec.kind is SessionKind.WORKER and parent.kind is SessionKind.BRANCH:
            entry.recorded = False
        return entry

    def _new_entry(
        self,
        agent: Agent,
        parent: TreeEntry | None,
        spec: SpawnSpec,
        ttl: float | None,
        key: str | None,
        backend: str = "inline",
        remote: tuple[ExecutionBackend, bytes] | None = None,
        ttl_share: SharedTtl | None = None,
        grants: tuple[Grant, ...] = (),
    ) -> TreeEntry:
        now = self.tree.now()
        kind = spec.kind
        main = kind is SessionKind.MAIN
        info = SessionInfo(
            session_id=new_session_id(_slot(agent, parent, key)),
            agent_id=agent.agent_id,
            parent_id=parent.session_id if parent else None,
            kind=kind,
            state=SessionState.ACTIVE if main else SessionState.PENDING,
            depth=parent.info.depth + 1 if parent else 0,
            created_at=now,
            ttl=ttl,
            deadline=None if ttl is None else now + ttl,
            task=spec.task,
            context_summary=spec.context_summary,
            model_tier=model_tier(
                spec, agent, parent.info.model_tier if parent else None, root=parent is None
            ),
            skill=agent.main if main else (spec.skill or agent.default),
            key=key,
            request_id=spec.request_id,
            metadata=dict(spec.metadata),
            backend=backend,
            input=spec.input,
            conversation=_conversation_of(parent),
            fork_at=spec.fork_at,
            context=spec.context,
        )
        for ext in self.tree.ext.identity:
            info = ext.identity(parent, spec, info)
        for grant in grants:
            info = grant.stamp(info)
        return self.tree.register(
            agent, info, parent, ttl, spec=spec, remote=remote, ttl_share=ttl_share, grants=grants
        )

    def _persist_children(
        self, created: list[tuple[int, TreeEntry]], answers: list[Any], early: bool
    ) -> Coroutine[Any, Any, None] | None:
        """Write the records of a batch's new children (one write: the batch's);
        the children not written start now and are answered in ``answers``. The
        rest (None: nothing) awaits the write: then each starts (wants a slot)
        and is answered, in order; a failed write takes every one out again.
        ``early``: they start, and are answered, once their records are
        queued, and a failed write ends them."""
        written_ones = [(i, entry) for i, entry in created if entry.recorded]
        written = self._record([entry for _, entry in written_ones], urgent=not early)
        for i, entry in created:
            if written is None or not entry.recorded:  # no store, or a child not written
                self.starting.want_slot(entry)
                answers[i] = _created(entry)
        if written is None:
            return None
        if early:  # answered now: nothing outside the process has seen them yet
            self._start_early([entry for _, entry in written_ones], written)
            for i, entry in written_ones:
                answers[i] = _created(entry)
            return None
        return self._children_started(written_ones, written, answers)

    async def _children_started(
        self, created: list[tuple[int, TreeEntry]], written: Written, answers: list[Any]
    ) -> None:
        """The rest of a batch: once its records are written, its children start
        and are answered, in order."""
        error = await written
        self._settled([entry for _, entry in created], error)
        for i, entry in created:
            answers[i] = self._answer_written(entry, error)

    def _record(self, entries: list[TreeEntry], *, urgent: bool = True) -> Written | None:
        """Write new sessions' records (inside ``one_commit`` when several): what
        to await for them, also kept on each as ``record_write`` for whoever
        else comes to wait; None when nothing is written (no store, or workers
        not ``recorded``). Whoever made them ``_settled`` them once written."""
        persist, future = self.tree.persist, None
        for entry in entries:
            wrote = persist.created(entry, entry.info.created_at)
            if wrote is not None:
                future = wrote
        if future is None:
            return None
        written = self.commits.durable(future, urgent=urgent)
        for entry in entries:
            entry.persisted, entry.record_write = False, written
        return written

    def _settled(
        self, entries: list[TreeEntry], error: BaseException | None, *, early: bool = False
    ) -> None:
        """New sessions' records were written: they are durable, or each is taken
        out again (nobody outside has its id), or, ``early`` (it started
        already), ended ``failed`` with the store's code."""
        tree = self.tree
        for entry in entries:
            entry.persisted, entry.record_write = True, None
            if error is not None:
                tree.store_failed(error)
                if early:
                    self.cancelling.unstored(entry, error)
                else:
                    tree.discard(entry)

    def _answer_written(self, entry: TreeEntry, error: BaseException | None) -> SpawnAnswer:
        """A spawn's answer once its child's record was written: the child, started
        (one that ended meanwhile stays ended); or the store's refusal, counted."""
        if error is None and entry.state is SessionState.PENDING:
            self.starting.want_slot(entry)
        answer = _written_answer(entry, error)
        if answer.error is not None:  # the store refused it (store_full…): counted too
            self._rejected_spawn(entry.info.parent_id, entry.kind, answer.error)
        return answer

    def _start_early(self, entries: list[TreeEntry], written: Written) -> None:
        """Start children spawned ``early`` once their records are submitted to
        the store (at once, or as the open ``one_commit`` ends), so that whatever
        they write is queued, and commits, after them (one that ended meanwhile
        stays ended); should the store refuse the records, they end then."""

        def start() -> None:
            for entry in entries:
                if entry.state is SessionState.PENDING:
                    self.starting.want_slot(entry)

        self.commits.when_submitted(start)
        self.commits.after(self._early_settled(entries, written))

    async def _early_settled(self, entries: list[TreeEntry], written: Written) -> None:
        self._settled(entries, await written, early=True)

    def _remote_for(
        self, name: str, skill: Callable[[Any], Any], spec: SpawnSpec
    ) -> tuple[tuple[ExecutionBackend, bytes] | None, ErrorInfo | None]:
        """Where a new child's skill runs: None inline, else its backend and the
        skill's bytes; or why it cannot run there (the spawn is refused)."""
        backends = self.tree.rt.backends
        skill_name = repr(spec.skill) if spec.skill else "the default skill"
        try:
            backend = backends.get(name)
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
            data = backends.serialised(backend, skill)
        except TypeError as exc:
            return None, ErrorInfo(
                code=ErrorCode.NOT_SERIALISABLE,
                message=f"skill {skill_name} cannot run on the {name} backend: {exc}",
                detail={"field": "skill", "backend": name, "skill": spec.skill},
            )
        return (backend, data), None

    def _rejected_spawn(
        self, parent_id: uuid.UUID | None, kind: SessionKind, error: ErrorInfo
    ) -> None:
        """Count and emit a refused spawn (a rule, capacity, a closing node, or
        the store refusing the new record: ``store_full``, ``store_failed``)."""
        rt = self.tree.rt
        rt.counters[f"rejected_{error.code.value}"] += 1
        parent = None if parent_id is None else self.tree.entries.get(parent_id)
        rt.events.emit(
            Event(
                kind=EventKind.REJECTED,
                at=self.tree.now(),
                parent_id=parent_id,
                agent_id=None if parent is None else parent.info.agent_id,
                code=error.code.value,
                data={"kind": kind.value, "message": error.message},
            )
        )

    def _stored_request(self, parent: TreeEntry, request_id: str) -> uuid.UUID | None:
        """The child a session spawned with ``request_id`` before a restart (its
        request map starts empty when it comes back from the store)."""
        tree = self.tree
        if tree.store is None:
            return None
        for child_id in parent.children:
            child = tree.entries.get(child_id)
            info = child.info if child is not None else None
            if info is None:
                record = tree.stored(child_id)
                info = record.info if record is not None else None
            if info is not None and info.request_id == request_id:
                parent.requests[request_id] = child_id
                return child_id
        return None


def _features_admit(
    tree: Tree, parent: TreeEntry | None, spec: SpawnSpec, agent: Agent
) -> tuple[Grant, ...] | ErrorInfo:
    """What the extensions say to a session of ``spec`` under ``parent`` (None:
    a Main): the first refusal, else what they granted it (as ``_admit``)."""
    grants: tuple[Grant, ...] = ()
    for ext in tree.ext.admit:
        granted = ext.admit(parent, spec, agent)
        if isinstance(granted, ErrorInfo):
            return granted
        if granted is not None:
            grants = (*grants, granted)
    return grants


def _when_recorded(entry: TreeEntry, value: object, tree: Tree) -> object:
    """``value`` now if ``entry``'s record is durable, else the rest that answers
    it once it is (``_once_recorded``)."""
    written = entry.record_write
    if written is None:
        return value
    tree.persist.hurry()  # someone waits for it now
    return _once_recorded(entry, written, value)


async def _once_recorded(
    entry: TreeEntry, written: Awaitable[BaseException | None], value: object
) -> object:
    """``value`` once ``entry``'s record is written; if the store refused it,
    ``Refused`` with its error, unless the session ran already (started early:
    then it stays the answer). Awaited after whoever made the record
    (``Spawning._settled``), so it reads the entry as that left it."""
    error = await written
    if error is not None and not entry.state.is_terminal:
        raise Refused(error)
    return value


async def _answer_into(
    answers: list[Any], i: int, rest: Coroutine[Any, Any, SpawnAnswer], parent_id: uuid.UUID
) -> None:
    """Answer place ``i`` of a batch with what the rest of its spawn answers (a
    refused record: the store's error, as ``spawn`` answers it)."""
    try:
        answers[i] = await rest
    except Refused as refused:
        answers[i] = SpawnAnswer(None, store_error(refused.error, parent_id))


async def _gathered(answers: list[Any], rest: list[Coroutine[Any, Any, None]]) -> list[Any]:
    """A batch's answers, once the rest of each of its spawns answered (in order)."""
    try:
        for part in rest:
            await part
    finally:  # the node stopped meanwhile: the parts not reached are never run
        for part in rest:
            part.close()
    return answers


async def _then_wait(rest: Coroutine[Any, Any, SpawnAnswer], waiter: _RunWaiter) -> None:
    """A ``Run`` of a repeated request: its child (once recorded), then its result."""
    try:
        answer = await rest
    except Refused as refused:
        waiter.fail(refused.error)
        return
    waiter.set(answer)


def _created(entry: TreeEntry, unstored: ErrorInfo | None = None) -> SpawnAnswer:
    """The answer for a child that exists: its id, and whether its budget was clamped."""
    ledger = entry.ledger
    clamped = ledger is not None and ledger.clamped
    return SpawnAnswer(entry.session_id, None, clamped=clamped, unstored=unstored)


def _written_answer(entry: TreeEntry, error: BaseException | None) -> SpawnAnswer:
    """A spawn's answer once its record's write finished: the child, or the
    store's error (a child that already ended is still the answer, with the
    error as ``unstored``)."""
    if error is None:
        return _created(entry)
    refused = store_error(error, entry.session_id)
    if entry.state.is_terminal:
        return _created(entry, unstored=refused)
    return SpawnAnswer(None, refused)


def _admitted_alike(first: SpawnSpec, spec: SpawnSpec) -> bool:
    """Whether ``spec`` is admitted as ``first`` was: it differs at most in what
    its child works on (task, context summary, input, metadata), which no
    rule reads. A pattern's batch makes one spec per task, all alike."""
    return first is spec or (
        spec.kind is first.kind
        and spec.skill == first.skill
        and spec.ttl == first.ttl
        and spec.model_tier == first.model_tier
        and spec.backend == first.backend
        and spec.budget == first.budget
        and spec.request_id is None
    )


class _RunWaiter:
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


@dataclass(slots=True)
class _Admitted:
    """A validated spawn: what its child gets (for every child of a batch that
    repeats the spec, as long as ``Spawning._still_admits``)."""

    spec: SpawnSpec
    agent: Agent
    backend: str
    remote: tuple[ExecutionBackend, bytes] | None
    ttl: float | None
    needs_thread: bool
    grants: tuple[Grant, ...]  # what the extensions granted its child (its budget)
    last: SessionInfo | None = None  # the identity of the last child made from it
    ttl_share: SharedTtl | None = None  # their one TTL timer (they share their creation)


def _slot(agent: Agent, parent: TreeEntry | None, key: str | None) -> int | None:
    """The slot a new session's id carries: its parent's (a tree whose Main is
    unslotted, from a store made before slots, stays unslotted); a Main's is
    its key's."""
    if parent is not None:
        return slot_of(parent.session_id)
    assert key is not None  # only a Main is made without a parent
    return slot_for(agent.agent_id, key)


def _conversation_of(parent: TreeEntry | None) -> uuid.UUID | None:
    """The conversation a child of ``parent`` keeps its context in: its root Main's."""
    if parent is None:
        return None
    info = parent.info
    return info.session_id if info.kind is SessionKind.MAIN else info.conversation
