"""A node's shutdown as the Cortex runs it (the README's Execution model, "Shutdown"): no new
work; running Branches park (they resume after a restart); Workers and remote
steps are cancelled with the grace, forced at its end; a session already
cancelled wraps up within the grace (or its own deadline) or is forced; Mains
stay. The caller is answered with every session once that has settled or the
grace ran out. Whether it has settled is asked after every ending and every
park, so the check lives with the tree's state (``Tree.check_shutdown``),
where endings and suspension reach it.

Last, the skills still running are let go (``release_parked``) so no thread
is left behind: at the checkpoint they are parked or blocked at, or their
next one, they get ``Cancelled`` with ``node_closed``; their sessions keep the
state they have (a branch the shutdown parked resumes after a restart, a
Main's unfinished cycle runs again then), and whatever their runs end with
is refused.
"""

from __future__ import annotations

import uuid

from sessiontree.actors.runtime import Reply, post, stop_actor
from sessiontree.protocol import ErrorCode, SessionKind, SessionState
from sessiontree.supervision._cancelling import Cancelling
from sessiontree.supervision._entry import TreeEntry
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._periodic import Periodic
from sessiontree.supervision._requests import DEFERRED, Call, ShutdownDeadline
from sessiontree.supervision._suspension import Suspension
from sessiontree.supervision._tree import Tree

__all__ = ["Shutdown"]


class Shutdown:
    """Settles the tree for a node's shutdown (Cortex thread)."""

    def __init__(
        self, tree: Tree, cancelling: Cancelling, suspension: Suspension, periodic: Periodic
    ) -> None:
        self.tree = tree
        self.cancelling = cancelling
        self.suspension = suspension
        self.periodic = periodic

    def begin(self, grace: float, reply: Reply) -> object:
        """Stop taking work; suspend running branches, cancel workers with ``grace``
        (forced at its end, their parents told), keep mains. Answers ``reply`` with
        every session once that has settled or the grace ran out."""
        tree = self.tree
        tree.closing = True
        self.periodic.disarm()
        workers: list[TreeEntry] = []
        for entry in list(tree.entries.values()):
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
                self.suspension.request_suspend(entry)
                tree.emit(EventKind.SUSPEND_REQUESTED, entry, data={"why": "shutdown"})
        if workers:
            self.cancelling.cancel_group(workers, ErrorCode.CANCELLED, grace=grace)
        tree.shutdown_waiters.append(reply)
        ref, activity = tree.ref, tree.rt.activity
        assert ref is not None

        def give_up() -> None:
            post(ref, Call(ShutdownDeadline()), activity)

        if grace > 0:
            tree.rt.clock.call_later(grace, give_up)
            tree.check_shutdown()
        else:
            self.deadline()
        return DEFERRED

    def deadline(self) -> None:
        """The shutdown grace ran out: force workers and cancelled sessions still
        running, fence branches that never parked (one whose park is still on its
        way to the Cortex is suspended now), then settle."""
        self.force_workers()
        tree = self.tree
        for entry in list(tree.entries.values()):
            if entry.suspend_requested and entry.state is SessionState.ACTIVE:
                with entry.core.cond:
                    parked = entry.core.parked
                if parked:  # as Suspension.parked does, without settling yet
                    tree.set_state(entry, SessionState.SUSPENDED)
                    tree.stop_actor(entry)
                else:
                    self.cancelling.fence(entry, ErrorCode.NODE_CLOSED)
        tree.settle_shutdown()

    def force_workers(self) -> None:
        """Force every worker and remote step still running, and every session
        still in its cancellation grace (a shutdown that ran out of time)."""
        ids = tuple(
            e.session_id
            for e in self.tree.entries.values()
            if (
                e.kind is SessionKind.WORKER
                or e.core.remote is not None
                or e.cancel_code is not None
            )
            and not e.state.is_terminal
        )
        self.cancelling.deadline(ids)

    def release_parked(self, reply: Reply) -> object:
        """Let every skill still running go (``SessionCore.release``): at the
        checkpoint it is parked or blocked at (a Branch parked by the shutdown or
        before it, a Main's cycle waiting on its children), or at its next one, it
        gets ``Cancelled`` (``node_closed``), so its thread (or task) ends. Its
        session keeps its state and stored record (a Main's message, not
        consumed, runs again after a restart); what its run ends with is refused
        (``Endings``). Answers ``reply`` once every run held at a checkpoint now
        has ended (None at once when none is); the caller bounds the wait."""
        tree = self.tree
        held_now: set[uuid.UUID] = set()
        for entry in tree.entries.values():
            core = entry.core
            if entry.state.is_terminal or core.remote is not None:
                continue
            with core.cond:
                held = core.skill_running and (core.parked or core.blocked)
            core.release(ErrorCode.NODE_CLOSED)  # also one whose cycle is about to start
            if held:
                held_now.add(entry.session_id)
        if not held_now:
            return None
        tree.releasing = held_now
        tree.release_reply = reply
        return DEFERRED

    def stop_all(self) -> int:
        """Stop every session actor still running (last step of a shutdown); how many."""
        tree = self.tree
        tree.stop_ended()
        stopped = 0
        for entry in tree.entries.values():
            if entry.ref is not None and entry.ref.is_alive():
                stop_actor(entry.ref)
                stopped += 1
        self.periodic.disarm()
        return stopped
