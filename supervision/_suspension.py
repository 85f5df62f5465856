"""Suspension: a Branch parks at its next checkpoint and gives up its compute
slot and its actor; a resume lets it go on (a restored one runs again).

Refusals are answers (``ErrorInfo`` with ``invalid_transition`` or
``node_closed``); an unknown session raises ``UnknownSessionError``.
"""

from __future__ import annotations

import uuid

from sessiontree.protocol import ErrorCode, ErrorInfo, SessionKind, SessionState
from sessiontree.supervision._entry import TreeEntry
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._starting import Starting
from sessiontree.supervision._tree import Tree

__all__ = ["Suspension"]


class Suspension:
    """Suspends and resumes Branches (Cortex thread)."""

    def __init__(self, tree: Tree, starting: Starting) -> None:
        self.tree = tree
        self.starting = starting

    def suspend(self, session_id: uuid.UUID) -> ErrorInfo | None:
        """Ask a Branch to park at its next checkpoint."""
        entry = self.tree.entry(session_id)
        if entry is None:
            return self.tree.ended_answer(session_id)
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
            self.request_suspend(entry)
            self.tree.emit(EventKind.SUSPEND_REQUESTED, entry)
        return None

    def request_suspend(self, entry: TreeEntry) -> None:
        entry.suspend_requested = True
        core = entry.core
        with core.cond:
            core.suspend_requested = True
            still_parked = core.parked  # resumed a moment ago, not yet off its checkpoint
            core.wake()
        if still_parked:  # it stays parked and will not report again: suspended now
            self.tree.set_state(entry, SessionState.SUSPENDED)
            self.tree.stop_actor(entry)

    def parked(self, session_id: uuid.UUID) -> None:
        """A Branch's skill parked at a checkpoint: it is suspended now."""
        tree = self.tree
        entry = tree.entries.get(session_id)
        if entry is None or not entry.suspend_requested or entry.state is not SessionState.ACTIVE:
            return
        with entry.core.cond:
            parked = entry.core.parked  # False when a resume already let it go (stale)
        if entry.cancel_code is not None or not parked:
            return
        tree.set_state(entry, SessionState.SUSPENDED)
        tree.stop_actor(entry)  # its parked skill needs no mailbox; nothing is queued for it
        if tree.shutdown_waiters:
            tree.check_shutdown()

    def resume(self, session_id: uuid.UUID) -> ErrorInfo | None:
        """Resume a suspended Branch (or withdraw a suspension not yet taken)."""
        tree = self.tree
        entry = tree.entry(session_id)
        if entry is None:
            return tree.ended_answer(session_id)
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
        if tree.closing:
            return ErrorInfo(code=ErrorCode.NODE_CLOSED, message="node is shutting down")
        if entry.rerun:
            self.starting.rerun(entry)
            return None
        entry.suspend_requested = False
        if entry.state is SessionState.SUSPENDED:
            tree.set_state(entry, SessionState.ACTIVE)
        entry.core.request_suspend(False)
        return None
