"""Linked contexts: every spawned session's context is a branch of its root
Main's conversation, and its result comes back to its parent's branch.

``Contexts`` hands a running Branch or Worker its ``SessionBranch`` (made on
first use, kept until the session's result lands), says where a child forks
by default (its parent's tip at the spawn), checks a fork point a spawn
names, and lands a finished child's result on its parent's branch as a
message that links to the child's branch. Only a child that used its
context gets a result message: a tree of pure-compute workers writes
nothing to any conversation.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from sessiontree.conversations import (
    Conversation,
    Conversations,
    SessionBranch,
    draft_message,
    session_branch,
)
from sessiontree.protocol import (
    Branch,
    ContextScope,
    Message,
    Role,
    SessionInfo,
    SessionKind,
    SessionResult,
    SpawnSpec,
)
from sessiontree.supervision._extension import Extension

if TYPE_CHECKING:
    from sessiontree.supervision._entry import TreeEntry

__all__ = ["Contexts", "result_text"]

log = logging.getLogger("sessiontree.contexts")


class Contexts(Extension):
    """The context branches of a node's running sessions (thread-safe),
    attached to the kernel: a Branch's result names its branch's leaf, and
    a child's result lands on its parent's branch as it is filed."""

    def __init__(self, conversations: Conversations) -> None:
        self.conversations = conversations
        self._views: dict[uuid.UUID, SessionBranch] = {}
        # results for a live Branch that has no handle yet (it has not used its
        # context): its handle takes them when made; they go with its end
        self._early: dict[uuid.UUID, list[Message]] = {}
        self._lock = threading.Lock()

    def branch(
        self, info: SessionInfo, guard: Callable[[str], None] | None = None
    ) -> SessionBranch:
        """``info``'s context branch (a spawned session of a tree with a Main).

        Its guard becomes ``guard`` (the running skill's checkpoint)."""
        view = self._view(info)
        view.guard = guard
        return view

    def detached(
        self, info: SessionInfo, guard: Callable[[str], None] | None = None
    ) -> SessionBranch:
        """A handle on ``info``'s branch that is not kept (for a session that
        already ended: a thread it abandoned makes none that lingers)."""
        view = self._made(info)
        view.guard = guard
        return view

    def _view(self, info: SessionInfo) -> SessionBranch:
        """``info``'s branch handle, made and kept on first use (made outside the
        lock: it may read the store)."""
        view = self._views.get(info.session_id)  # one dict read: atomic
        if view is not None:
            return view
        made = self._made(info)
        with self._lock:
            view = self._views.setdefault(info.session_id, made)
            early = self._early.pop(info.session_id, ())
        for message in early:
            view.arrive(message)
        return view

    def _made(self, info: SessionInfo) -> SessionBranch:
        root = info.conversation
        assert root is not None
        shared = self.conversations.shared(root)
        fork_at = info.fork_at
        made = None
        if info.kind is SessionKind.BRANCH:  # only a Branch's branch is ever stored
            with shared.lock:
                made = session_branch(shared.tip(), info.session_id)
        if made is not None:  # a run after a restart: the branch it wrote before
            fork_at = made.base_id
        elif fork_at is None and info.parent_id == root:
            # spawned from outside a skill with no fork point: the Main's tip now
            fork_at = self.conversations.get(root).active_leaf
        continues = None
        if fork_at is not None and info.context is ContextScope.BRANCH:
            base = shared.backend.message(root, fork_at)
            continues = None if base is None else base.branch_id
        name = f"{info.kind.value}:{info.skill}"[:55] + f"-{info.session_id.hex[:8]}"
        return SessionBranch(
            shared,
            owner=info.session_id,
            name=name,
            fork_at=fork_at,
            scope=info.context,
            continues=continues,
            durable=info.kind is SessionKind.BRANCH,
        )

    def outside_fork_points(
        self, parent: uuid.UUID, specs: tuple[SpawnSpec, ...]
    ) -> tuple[SpawnSpec, ...]:
        """``specs`` spawned from outside a skill (``Node.spawn``): those without
        a fork point fork at the parent's active leaf now when it is a Main
        whose conversation is in use here (no Cortex round trip); else the
        child's first use of its context decides (see ``branch``)."""
        shared = self.conversations.loaded(parent)
        if shared is None or all(spec.fork_at is not None for spec in specs):
            return specs
        tip = Conversation(shared).active_leaf
        if tip is None:
            return specs
        return tuple(spec if spec.fork_at is not None else _with_fork(spec, tip) for spec in specs)

    def fork_point(self, parent: SessionInfo, spec: SpawnSpec) -> SpawnSpec:
        """``spec`` with its fork point: the one it names, checked to be a message
        of the parent's conversation (``ConversationError`` naming ``fork_at``
        if not: nothing was spawned), or the parent's tip now."""
        root = _root_of(parent)
        if root is None:
            return spec
        if spec.fork_at is not None:
            shared = self.conversations.shared(root)
            shared.need(spec.fork_at, "fork_at")
            return spec
        tip = self.tip(parent)
        if tip is None:
            return spec
        return _with_fork(spec, tip)

    def fork_points(
        self, parent: SessionInfo, specs: tuple[SpawnSpec, ...]
    ) -> tuple[SpawnSpec, ...]:
        """``fork_point`` of each of a batch's specs (the parent's tip read once)."""
        if _root_of(parent) is None:
            return specs
        tip: uuid.UUID | None = None
        known = False
        out = []
        for spec in specs:
            if spec.fork_at is not None:
                out.append(self.fork_point(parent, spec))
                continue
            if not known:
                tip, known = self.tip(parent), True
            out.append(spec if tip is None else _with_fork(spec, tip))
        return tuple(out)

    def tip(self, info: SessionInfo) -> uuid.UUID | None:
        """Where ``info``'s next message hangs: a Main's active leaf, a spawned
        session's branch tip (its fork point while it has written nothing).

        Cheap for a session whose conversation nothing here has touched (a
        spawn pays two dict lookups): then a Main's tip is left to its
        child's first use of its context (see ``_made``), and a Branch that
        resumed after a restart and has not touched its context yet gives
        its own fork point."""
        root = _root_of(info)
        shared = None if root is None else self.conversations.loaded(root)
        if shared is None:
            return None if info.kind is SessionKind.MAIN else info.fork_at
        if info.kind is SessionKind.MAIN:
            return Conversation(shared).active_leaf
        view = self._views.get(info.session_id)  # one dict read: atomic
        if view is not None:
            return view.tip()
        with shared.lock:
            made = session_branch(shared.latest(), info.session_id)
        return info.fork_at if made is None else made.tip

    def result(self, entry: TreeEntry, result: SessionResult) -> SessionResult:
        """A Branch that wrote to its context names the last message of its
        branch (what a continuation forks from) and its conversation; the
        other kinds' results are as they were."""
        info = entry.core.info
        if info.kind is not SessionKind.BRANCH:
            return result
        view = self._views.get(info.session_id)  # one dict read: atomic
        if view is not None:
            leaf = view.leaf()
        else:
            stored = self._stored(info)  # resumed after a restart, its context untouched since
            leaf = None if stored is None else stored.leaf_id
        if leaf is None:
            return result
        return msgspec.structs.replace(result, context_leaf=leaf, conversation=info.conversation)

    def _stored(self, info: SessionInfo) -> Branch | None:
        """A Branch's stored branch, if its conversation is loaded here (never
        reads the store: this runs on the Cortex thread)."""
        shared = None if info.conversation is None else self.conversations.loaded(info.conversation)
        if shared is None:
            return None
        with shared.lock:
            return session_branch(shared.latest(), info.session_id)

    def delivered(
        self, entry: TreeEntry, parent_entry: TreeEntry, result: SessionResult, live: bool
    ) -> None:
        """``entry`` ended (runs on the Cortex thread, never waits for the store):
        what arrived for it and was not written is queued on its branch; if it
        used its context, its result goes to ``parent``'s branch: a Main's at
        once (queued), a Branch's into its context at once and to the store
        with its next write or its end. ``live``: the parent has not ended (one
        without a branch handle yet gets the result when it makes one; an
        ended parent's is dropped). A failure is logged, never raised: the
        result itself was delivered already."""
        child, parent = entry.core.info, parent_entry.core.info
        view = self._views.pop(child.session_id, None)  # atomic; made under the lock
        if self._early:  # only the Cortex thread adds, and it is this one
            with self._lock:
                self._early.pop(child.session_id, None)  # it never used its context
        link = None
        try:
            if view is not None:
                if not view.flush():  # what arrived for it and was not written yet
                    _not_written(child.session_id, "its children's results")
                link = view.branch_id if view.made() else None
            elif child.kind is SessionKind.BRANCH:
                stored = self._stored(child)
                if stored is None:
                    return  # it did not use its context: nothing lands
                link = stored.id
            else:
                return
            message = draft_message(
                Role.SYSTEM,  # as chat models take a note between turns
                result_text(child, result),
                session_id=child.session_id,
                link=link,
            )
            if parent.kind is SessionKind.MAIN:
                if not self.conversations.get(parent.session_id).post(message):
                    _not_written(child.session_id, "its result")
                return
            with self._lock:
                target = self._views.get(parent.session_id)
                if target is None and live:
                    self._early.setdefault(parent.session_id, []).append(message)
            if target is not None:
                target.arrive(message)
        except Exception:
            log.exception(
                "session %s: its result could not land on its parent's branch", child.session_id
            )


def _not_written(session_id: uuid.UUID, what: str) -> None:
    log.warning(
        "session %s: %s did not reach its branch (the conversation reloads after a failed write)",
        session_id,
        what,
    )


def result_text(child: SessionInfo, result: SessionResult) -> str:
    """What a child's result says on its parent's branch."""
    head = f"[{child.kind.value} {child.skill} {result.status.value}]"
    said = result.summary
    if result.error is not None:
        said = f"{result.error.code.value}: {result.error.message}" + (
            f" (partial: {said})" if said else ""
        )
    return f"{head} {said}".rstrip()


def _root_of(info: SessionInfo) -> uuid.UUID | None:
    return info.session_id if info.kind is SessionKind.MAIN else info.conversation


def _with_fork(spec: SpawnSpec, tip: uuid.UUID) -> SpawnSpec:
    return msgspec.structs.replace(spec, fork_at=tip)
