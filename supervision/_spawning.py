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
from collections.abc import Awaitable, Coroutine
from typing import Any

import msgspec

from sessiontree.actors.backends import ExecutionBackend
from sessiontree.actors.runtime import Reply
from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    NodeClosedError,
    SessionInfo,
    SessionKey,
    SessionKind,
    SessionState,
    SpawnSpec,
    UnknownAgentError,
    new_session_id,
    slot_for,
    slot_of,
)
from sessiontree.supervision._admission import Admission, Admitted, admitted_alike, features_admit
from sessiontree.supervision._cancelling import Cancelling
from sessiontree.supervision._commits import Commits, Refused, Written, store_error
from sessiontree.supervision._config import Agent
from sessiontree.supervision._entry import SharedTtl, SpawnAnswer, TreeEntry
from sessiontree.supervision._extension import Grant
from sessiontree.supervision._requests import DEFERRED
from sessiontree.supervision._rules import (
    model_tier,
)
from sessiontree.supervision._run_waiter import RunWaiter
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
        self.admission = Admission(tree)

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
        grants = features_admit(tree, None, spec, agent)
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
            self.admission.rejected(parent_id, spec.kind, closed)
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
        admitted = self.admission.admit(parent, parent_id, spec)
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
        waiter = RunWaiter(self.tree, reply, timeout)
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
        admitted: Admitted | ErrorInfo | None = None
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
                    isinstance(admitted, Admitted)
                    and admitted_alike(admitted.spec, spec)
                    and self.admission.still_admits(parent, admitted)
                ):
                    admitted = self.admission.admit(parent, parent_id, spec)
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

    def _create_child(
        self, parent: TreeEntry, admitted: Admitted, spec: SpawnSpec, *, by_skill: bool
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
            self.admission.rejected(entry.info.parent_id, entry.kind, answer.error)
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


async def _then_wait(rest: Coroutine[Any, Any, SpawnAnswer], waiter: RunWaiter) -> None:
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
