"""Cancellation, deadlines, fencing and expiry.

One cancellation request fixes one deadline (now + grace) for the whole
subtree it reaches; at the deadline what still runs is fenced and ended
``terminated_by_force`` (the cancellation table in the README's Execution model).
"""

from __future__ import annotations

import uuid
from typing import Any

from sessiontree.actors.runtime import CancelSignal, ForceStop, post, wake_batch
from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    Outcome,
    SessionKind,
    SessionState,
)
from sessiontree.supervision._commits import Commits, store_error
from sessiontree.supervision._endings import Endings
from sessiontree.supervision._entry import TreeEntry, id_text
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._reports import Deadline
from sessiontree.supervision._tree import Tree

__all__ = ["Cancelling"]


class Cancelling:
    """Cancels, expires and forces sessions (Cortex thread)."""

    def __init__(self, tree: Tree, commits: Commits, endings: Endings) -> None:
        self.tree = tree
        self.commits = commits
        self.endings = endings

    def cancel(
        self, session_id: uuid.UUID, grace: float | None = None, reason: str | None = None
    ) -> ErrorInfo | None:
        """Cancel a session and its whole subtree, with one deadline: now +
        ``grace`` (None: the node's; 0: what runs ends ``terminated_by_force``
        at once), ``reason`` on each of their events and results. A second
        cancel of a session still stopping may bring the deadline of its
        subtree closer, never push it back (the first reason stands). An
        ``ErrorInfo`` if it already ended (``UnknownSessionError`` if unknown)."""
        entry = self.tree.entry(session_id)
        if entry is None:
            return self.tree.ended_answer(session_id)
        if entry.state.is_terminal:
            return ErrorInfo(
                code=ErrorCode.INVALID_TRANSITION,
                message=f"session {session_id} already ended ({entry.state.value})",
            )
        grace = self.tree.rt.config.grace if grace is None else grace
        if entry.cancel_code is not None:
            self._shorten(entry, grace)
            return None
        group = [entry, *self.tree.uncancelled_descendants(entry)]
        self.cancel_group(group, ErrorCode.CANCELLED, first=entry, grace=grace, reason=reason)
        return None

    def interrupt(self, session_id: uuid.UUID, code: ErrorCode) -> None:
        """End a live session as a recording says it was interrupted (see
        ``Interrupt``); nothing for one that ended or is cancelled already."""
        entry = self.tree.entry(session_id)
        if entry is None or entry.state.is_terminal:
            return
        if code is ErrorCode.TTL_EXPIRED:
            self.expire(session_id)
        elif code is ErrorCode.TERMINATED_BY_FORCE:
            self.deadline((session_id,))
        elif entry.cancel_code is None:
            group = [entry, *self.tree.uncancelled_descendants(entry)]
            self.cancel_group(group, code, first=entry)

    def _shorten(self, entry: TreeEntry, grace: float) -> None:
        """``entry`` is stopping already: the live sessions of its subtree whose
        deadline lies past now + ``grace`` get that deadline instead."""
        deadline = self.tree.now() + grace
        closer: list[TreeEntry] = []
        stack = [entry]
        entries = self.tree.entries
        while stack:
            current = stack.pop()
            if current.state.is_terminal:
                continue
            if current.cancel_deadline is not None and current.cancel_deadline > deadline:
                current.cancel_deadline = deadline
                closer.append(current)
            stack.extend(c for c in map(entries.get, current.children) if c is not None)
        if closer:
            self._at_deadline(tuple([e.core.session_id for e in closer]), grace)

    def orphans(self, entry: TreeEntry) -> None:
        """``entry`` ended: its live descendants are cancelled (``parent_terminated``)."""
        self.cancel_group(self.tree.uncancelled_descendants(entry), ErrorCode.PARENT_TERMINATED)

    def cancel_group(
        self,
        group: list[TreeEntry],
        code: ErrorCode,
        first: TreeEntry | None = None,
        grace: float | None = None,
        reason: str | None = None,
    ) -> None:
        """Request cancellation of ``group`` (``first`` gets ``code``, the rest
        ``parent_terminated``) with one deadline for all of them: now + ``grace``
        (default: the node's), and ``reason`` on each. Every write it makes goes
        into one commit."""
        rt = self.tree.rt
        grace = rt.config.grace if grace is None else grace
        with self.commits.one_commit():
            running = self._request_cancel(group, code, first, reason)
            deadline = self.tree.now() + grace
            for entry in running:
                entry.cancel_deadline = deadline
            ids = tuple([e.core.session_id for e in running])
            if ids and grace <= 0:
                self.deadline(ids)
        if ids and grace > 0:
            self._at_deadline(ids, grace)

    def _at_deadline(self, ids: tuple[uuid.UUID, ...], grace: float) -> None:
        """End ``ids`` by force in ``grace`` seconds (at once when it is 0)."""
        if grace <= 0:
            self.deadline(ids)
            return
        rt = self.tree.rt
        ref, activity = self.tree.ref, rt.activity
        assert ref is not None

        def fire() -> None:
            post(ref, Deadline(ids), activity)

        rt.clock.call_later(grace, fire)

    def _request_cancel(
        self, group: list[TreeEntry], code: ErrorCode, first: TreeEntry | None, reason: str | None
    ) -> list[TreeEntry]:
        """Mark ``group`` cancelled and wake its skills; end at once what runs
        nothing; the sessions left to wrap up (their deadline is the caller's)."""
        tree, finish = self.tree, self.endings.finish
        running: list[TreeEntry] = []
        wakeups: list[Any] = []
        now = tree.now()
        data = None if reason is None else {"reason": reason}
        for entry in group:
            entry_code = code if (first is None or entry is first) else ErrorCode.PARENT_TERMINATED
            entry.cancel_code = entry_code
            entry.cancel_reason = reason
            core = entry.core
            state = core.state
            kind = core.info.kind
            tree.emit(EventKind.CANCEL_REQUESTED, entry, code=entry_code, data=data, at=now)
            if state is SessionState.PENDING or entry.rerun:  # nothing runs to wrap up
                finish(
                    entry,
                    SessionState.CANCELLED,
                    entry_code,
                    None,
                    message=f"session {id_text(entry)} was cancelled before it ran",
                )
                continue
            if kind is SessionKind.MAIN:
                with core.cond:
                    idle = not core.skill_running
                if idle:
                    core.fence(entry_code)  # a cycle racing this cancel stops at once
                    tree.post(entry, CancelSignal(entry_code))
                    finish(entry, SessionState.CANCELLED, entry_code, None)
                    continue
                tree.post(entry, CancelSignal(entry_code))  # its actor also drops queued input
            else:
                if state is SessionState.SUSPENDED:  # it wakes to wrap up in grace
                    tree.set_state(entry, SessionState.ACTIVE, entry_code)
                entry.suspend_requested = False
                # Straight onto the shared state: a mailbox hop per session made
                # cancelling a 4,681-session tree cost a thread wake-up each.
                core.request_cancel(entry_code, wakeups)
            running.append(entry)
        wake_batch(wakeups)
        return running

    def deadline(self, session_ids: tuple[uuid.UUID, ...]) -> None:
        """The grace of ``session_ids`` ran out: those still live end by force."""
        with self.commits.one_commit():
            for sid in session_ids:
                entry = self.tree.entries.get(sid)
                if entry is None or entry.state.is_terminal:
                    continue
                self.fence(entry, ErrorCode.TERMINATED_BY_FORCE)
                self.endings.finish(
                    entry, SessionState.CANCELLED, ErrorCode.TERMINATED_BY_FORCE, None
                )

    def fence(self, entry: TreeEntry, code: ErrorCode) -> None:
        """Nothing the skill does counts from now on; its actor drops queued
        input and an async task is cancelled."""
        for watch in entry.watchers:
            watch.fenced(code, entry.core.blocked)
        entry.core.fence(code)
        if entry.ref is not None:
            self.tree.post(entry, ForceStop())
        else:  # a parked branch holds no actor
            entry.core.cancel_task()

    def unstored(self, entry: TreeEntry, error: BaseException) -> None:
        """A session that started before its record was durable, whose record the
        store refused: it ends ``failed`` at once with the store's code
        (``store_full``, ``store_failed``); its parent gets that result and its
        subtree is cleaned up like any orphans. One that ended already keeps its end."""
        if entry.state.is_terminal:
            return
        info = store_error(error, entry.session_id)
        self.fence(entry, info.code)
        with self.commits.one_commit():
            # its record again, with its link under its parent: should its end
            # commit where its start did not, the tree index still names it
            self.tree.persist.created(entry, entry.info.created_at)
            self.endings.finish(entry, SessionState.FAILED, info.code, None, error=info)

    def expire(self, session_id: uuid.UUID) -> None:
        """The TTL of ``session_id`` ran out: it ends ``expired`` at once, with
        what it reported so far (a passivated Main comes back to end)."""
        entry = self.tree.entry(session_id)
        if entry is None or entry.state.is_terminal:
            return
        self.fence(entry, ErrorCode.TTL_EXPIRED)
        summary, data = entry.last_progress or ("", {})
        outcome = Outcome(summary=summary, artifacts={"progress": data} if data else {})
        self.endings.finish(entry, SessionState.EXPIRED, ErrorCode.TTL_EXPIRED, outcome)
