"""Conversation trees: append, fork, branches, checkout, context, merge, delete, export.

A conversation belongs to one session. Its messages form a tree through
``parent_id``; a *branch* is a linear run of messages hanging under a fork
point, with a stable number (``main`` is 1) and a unique name; the current
branch's tip is the active leaf, where ``append`` hangs the next message.
``context(limit)`` walks from the active leaf to the root through parent
ids, so other branches never leak in.

Cost: ``append`` is one durable write of the message and the conversation's
bookkeeping (O(1) in the conversation's size); ``context(limit)`` reads at
most ``limit`` messages by id. Only exports and ``delete_branch`` read more.

Checking out a message that is not the tip of a branch forks an unnamed
branch there (as git does when you commit on a detached head), so every
branch stays linear and nothing is ever appended in the middle of one.

Where the messages live is a ``ConversationBackend``: the node's LMDB store
(wired in by supervision) or ``MemoryBackend``. A write is acknowledged
only once the backend made it durable; when it fails (``StoreError``,
``StoreFullError``) nothing of it happened, in the store or in memory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from sessiontree.conversations import _branching as ops
from sessiontree.conversations._backend import ConversationBackend, TimeSource
from sessiontree.conversations._export import (
    check_format,
    nested_tree,
    render,
    transcript_lines,
)
from sessiontree.conversations._values import (
    BranchRef,
    as_uuid,
    check_platform_id,
    draft,
    role_of,
)
from sessiontree.conversations._writes import SharedConversation
from sessiontree.protocol import (
    BranchInfo,
    ConversationState,
    DeletePlan,
    Merged,
    Message,
    NotAllowedError,
    RejectedInputError,
    Role,
    as_json,
)

__all__ = ["MAX_CONTEXT", "Conversation", "Conversations"]

MAX_CONTEXT = 10_000  # the most messages one context() call returns

_Fields = tuple[Role, Any, list[Any] | None, dict[str, Any] | None, str | None]
#: What a keyed append is given: its message id, and whether the conversation
#: may hold that id already (then it is looked up, and replaced if there).
Key = tuple[uuid.UUID, bool]


class Conversations:
    """Every conversation of a node, by session id (each loaded once, on first use)."""

    def __init__(self, backend: ConversationBackend, clock: TimeSource) -> None:
        self.backend = backend
        self.clock = clock
        self._shared: dict[uuid.UUID, SharedConversation] = {}
        self._lock = threading.Lock()

    def get(
        self,
        session_id: uuid.UUID,
        *,
        guard: Callable[[str], None] | None = None,
        writable: bool = True,
        keys: Callable[[], Key | None] | None = None,
    ) -> Conversation:
        """A handle on ``session_id``'s conversation. ``guard(what)`` runs before
        every operation (a skill's checkpoint); ``writable=False`` refuses writes
        with ``NotAllowedError`` (workers keep no memory); ``keys()`` gives each
        append its message id (see ``Conversation``)."""
        return Conversation(self.shared(session_id), guard=guard, writable=writable, keys=keys)

    def loaded(self, session_id: uuid.UUID) -> SharedConversation | None:
        """``session_id``'s shared conversation if a handle on it was made here."""
        with self._lock:
            return self._shared.get(session_id)

    def shared(self, session_id: uuid.UUID) -> SharedConversation:
        """The state and write queue every handle on ``session_id``'s conversation shares."""
        with self._lock:
            shared = self._shared.get(session_id)
            if shared is None:
                shared = SharedConversation(session_id, self.backend, self.clock)
                self._shared[session_id] = shared
        return shared


class Conversation:
    """A handle on one session's conversation tree (thread-safe).

    Bad arguments raise ``RejectedInputError`` naming the field; a message or
    branch the conversation does not have, a name already taken, deleting the
    current branch or a stale confirmation raise ``ConversationError`` (its
    ``code`` says which, its ``field`` names the argument); a failed durable
    write raises ``StoreError`` and changes nothing. Every write has an
    awaitable twin (``aappend``…) that never blocks the event loop.

    ``keys`` (a Main's cycle): called once per append, it gives the message
    its id and whether the conversation may hold it already (None: a new
    id). An append whose id the conversation holds replaces that message
    where it stands (its role, content, tool calls, usage and time) instead
    of adding one: a cycle a crash cut off and ran again writes what its
    earlier run wrote, once.
    """

    def __init__(
        self,
        shared: SharedConversation,
        *,
        guard: Callable[[str], None] | None = None,
        writable: bool = True,
        keys: Callable[[], Key | None] | None = None,
    ) -> None:
        self._shared = shared
        self._guard = guard
        self._writable = writable
        self._keys = keys

    @property
    def session_id(self) -> uuid.UUID:
        return self._shared.session_id

    def _check(self, what: str, *, write: bool) -> None:
        if self._guard is not None:
            self._guard(what)
        if write and not self._writable:
            msg = f"session {self.session_id} is a worker and may not write its conversation"
            raise NotAllowedError(msg, session_id=self.session_id)

    def _enter(self, what: str, *, write: bool = False) -> ConversationState:
        """Run the guard; the acknowledged state (lock held). A write first waits
        until no append of this conversation is in flight."""
        self._check(what, write=write)
        return self._shared.settle() if write else self._shared.state()

    # -- reading ------------------------------------------------------------------------

    @property
    def active_leaf(self) -> uuid.UUID | None:
        """The message the next ``append`` hangs under (None for an empty branch at the root)."""
        with self._shared.lock:
            return ops.current(self._shared.state()).tip

    @property
    def current_branch(self) -> BranchInfo:
        """The branch ``append`` writes to."""
        with self._shared.lock:
            state = self._enter("current_branch")
            return ops.branch_info(self._shared, state, ops.current(state))

    def context(self, limit: int = 100) -> list[Message]:
        """The last ``limit`` messages of the active path, oldest first (O(limit))."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= MAX_CONTEXT:
            msg = f"limit must be an integer in 0..{MAX_CONTEXT}, got {limit!r}"
            raise RejectedInputError(msg, field="limit")
        self._shared.posts_settled()  # children's results that landed here
        with self._shared.lock:
            state = self._enter("context")
            tip = ops.current(state).tip
        path = self._shared.backend.walk(self.session_id, tip, limit, None)
        path.reverse()
        return path

    def message(self, message_id: uuid.UUID | str) -> Message:
        """One message; ``ConversationError`` (``unknown_message``) if it is not in this one."""
        self._check("message", write=False)
        return self._shared.need(as_uuid(message_id, "message_id"), "message_id")

    def by_platform_id(self, platform_id: str) -> Message | None:
        """The message a chat platform's id was recorded for, or None."""
        check_platform_id(platform_id)
        self._check("by_platform_id", write=False)
        return self._shared.stored_platform_id(platform_id)

    def branches(self) -> list[BranchInfo]:
        """Every branch, by number, with its tip, last message, count and age; one is current."""
        with self._shared.lock:
            state = self._enter("branches")
            return [ops.branch_info(self._shared, state, branch) for branch in state.branches]

    def __len__(self) -> int:
        """Messages in the conversation."""
        with self._shared.lock:
            state = self._shared.state()
            return state.messages

    # -- appending -----------------------------------------------------------------------
    def append(
        self,
        role: Role | str,
        content: Any,
        *,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
        platform_id: str | None = None,
    ) -> Message:
        """Append a message at the active leaf of the current branch; returns it once durable.

        ``platform_id``: the chat platform's id of this message (a later
        ``/fork`` sent as a reply to it finds it). Appends of one conversation
        from several threads queue in order and share commits.
        """
        message, _ = self._append(role, content, tool_calls, usage, platform_id, once=False)
        return message

    def append_once(
        self,
        role: Role | str,
        content: Any,
        *,
        platform_id: str,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> tuple[Message, bool]:
        """``append``, unless a message with this ``platform_id`` was already
        appended (or is being): then that message, and False. Checked and
        appended atomically, so a chat gateway's retry is never stored twice."""
        return self._append(role, content, tool_calls, usage, platform_id, once=True)

    def _append(
        self,
        role: Role | str,
        content: Any,
        tool_calls: list[Any] | None,
        usage: dict[str, Any] | None,
        platform_id: str | None,
        *,
        once: bool,
    ) -> tuple[Message, bool]:
        fields = self._fields(role, content, tool_calls, usage, platform_id)
        key = None if self._keys is None else self._keys()
        shared = self._shared
        with shared.lock:
            if once and platform_id is not None:
                known = shared.known_platform_id(platform_id)
                if known is not None:
                    return known, False
            state, message, dropped = self._appended(fields, key)
            state, future = shared.submit(state, (message,), dropped)
        shared.wait(future, state)
        return message, True

    async def aappend(
        self,
        role: Role | str,
        content: Any,
        *,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
        platform_id: str | None = None,
    ) -> Message:
        """Awaitable ``append``: queued on the store's writer from the event loop,
        no thread of its own. A caller cancelled while it waits stops waiting;
        the append itself goes on (and lands or fails like any other)."""
        fields = self._fields(role, content, tool_calls, usage, platform_id)
        key = None if self._keys is None else self._keys()
        shared = self._shared
        with shared.lock:
            if shared.can_queue():
                state, message, dropped = self._appended(fields, key)
                state, future = shared.submit_awaitable(state, (message,), dropped)
            else:  # reloading after a failure waits for the queue: not on the loop
                future = None
        if future is None:
            placed, _ = await asyncio.to_thread(self._append_keyed, fields, key)
            return placed
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            shared.book_later(future, state)  # the write goes on: booked when it settles
            raise
        except Exception:
            shared.failed()
            raise
        shared.acknowledged(state)
        return message

    def _fields(
        self,
        role: Role | str,
        content: Any,
        tool_calls: list[Any] | None,
        usage: dict[str, Any] | None,
        platform_id: str | None,
    ) -> _Fields:
        """An append's arguments, checked (``RejectedInputError`` naming the bad one)."""
        checked = role_of(role)
        content = as_json("content", content)
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise RejectedInputError("tool_calls must be a list", field="tool_calls")
            tool_calls = as_json("tool_calls", tool_calls)
        if usage is not None:
            if not isinstance(usage, dict):
                raise RejectedInputError("usage must be a mapping", field="usage")
            usage = as_json("usage", usage)
        if platform_id is not None:
            check_platform_id(platform_id)
        self._check("append", write=True)
        return checked, content, tool_calls, usage, platform_id

    def _append_keyed(self, fields: _Fields, key: Key | None) -> tuple[Message, bool]:
        """``append`` of checked ``fields`` with the id ``key`` already taken."""
        shared = self._shared
        with shared.lock:
            state, message, dropped = self._appended(fields, key)
            state, future = shared.submit(state, (message,), dropped)
        shared.wait(future, state)
        return message, True

    def _appended(
        self, fields: _Fields, key: Key | None
    ) -> tuple[ConversationState, Message, tuple[Message, ...]]:
        """The message at the tip of the current branch, or (``key`` held already)
        in the place of the one it replaces; the state after it, and what the
        write drops (a replaced message's other platform id). Lock held."""
        role, content, tool_calls, usage, platform_id = fields
        shared = self._shared
        if key is not None and key[1]:
            earlier = shared.backend.message(shared.session_id, key[0])
            if earlier is not None:
                return self._replaced(earlier, fields)
        message = draft(role, content, tool_calls=tool_calls, usage=usage, platform_id=platform_id)
        if key is not None:
            message = msgspec.structs.replace(message, id=key[0])
        state, placed = self._placed(message)
        return state, placed, ()

    def _replaced(
        self, earlier: Message, fields: _Fields
    ) -> tuple[ConversationState, Message, tuple[Message, ...]]:
        """``earlier`` rewritten with ``fields`` where it stands (lock held)."""
        role, content, tool_calls, usage, platform_id = fields
        now = self._shared.clock.time()
        message = msgspec.structs.replace(
            earlier,
            role=role,
            content=content,
            tool_calls=tool_calls,
            usage=usage,
            platform_id=platform_id or earlier.platform_id,
            timestamp=now,
        )
        moved = earlier.platform_id not in (None, message.platform_id)
        state = msgspec.structs.replace(self._shared.tip(), updated_at=now)
        return state, message, (earlier,) if moved else ()

    def _placed(self, message: Message) -> tuple[ConversationState, Message]:
        """``message`` (a draft) at the tip of the current branch, and the state
        after it (lock held)."""
        state = self._shared.tip()
        state, (placed,) = ops.chain(
            state, ops.current(state), [message], self._shared.clock.time()
        )
        return state, placed

    def post(self, message: Message) -> bool:
        """Queue ``message`` (a ``draft``) at the tip of the current branch
        without waiting for it to be durable (a read of the context waits for
        it); False (nothing queued) while the conversation must first reload
        after a failed write. Never blocks on the store: the Cortex lands a
        Main's children's results this way."""
        shared = self._shared
        with shared.lock:
            if not shared.can_queue():
                return False
            state, placed = self._placed(message)
            state, future = shared.submit(state, (placed,), ())
            shared.posted_write(future, state)
        return True

    def post_append(self, role: Role | str, content: Any) -> concurrent.futures.Future[None] | None:
        """``append`` without waiting for it to be durable (keyed as ``append``
        is; a read of the context waits for it): the write's future, which
        fails with ``StoreError`` if the store refuses it; None (nothing
        queued, no key taken) while the conversation must first reload after a
        failed write. Never blocks on the store. ``RejectedInputError`` naming
        the field for a bad role or content."""
        fields = self._fields(role, content, None, None, None)
        shared = self._shared
        with shared.lock:
            if not shared.can_queue():
                return None
            key = None if self._keys is None else self._keys()
            state, message, dropped = self._appended(fields, key)
            state, future = shared.submit(state, (message,), dropped)
            shared.posted_write(future, state)
        return future

    # -- the tree: forks, checkouts, merges, deletions ------------------------------------

    def link_platform_id(self, message_id: uuid.UUID | str, platform_id: str) -> Message:
        """Record the chat platform's id of a message sent out (e.g. the agent's
        reply), so a ``/fork`` replying to it finds it."""
        check_platform_id(platform_id)
        with self._shared.lock:
            state = self._enter("link_platform_id", write=True)
            message = self._shared.need(as_uuid(message_id, "message_id"), "message_id")
            linked = msgspec.structs.replace(message, platform_id=platform_id)
            drop = [message] if message.platform_id not in (None, platform_id) else []
            touched = msgspec.structs.replace(state, updated_at=self._shared.clock.time())
            self._shared.commit_now(touched, [linked], drop)
            return linked

    def fork(self, from_message_id: uuid.UUID | str, name: str | None = None) -> BranchInfo:
        """A new branch whose next message hangs under ``from_message_id``; it becomes current.

        Names are unique per conversation (default ``branch-N``), 1-64
        characters without control characters, and neither a number nor an id.
        """
        base_id = as_uuid(from_message_id, "from_message_id")
        with self._shared.lock:
            state = self._enter("fork", write=True)
            base = self._shared.need(base_id, "from_message_id")
            return ops.fork(self._shared, state, base, name)

    def checkout(self, target: BranchRef) -> BranchInfo:
        """Make a branch current: by number, by name, or by message id (the
        branch whose tip it is; any other message forks an unnamed branch there)."""
        with self._shared.lock:
            state = self._enter("checkout", write=True)
            return ops.checkout(self._shared, state, target)

    def merge(self, source: BranchRef) -> Merged:
        """Append the source branch's own messages (those after its fork point)
        to the current branch as new messages that record where they came
        from (``merged_from``); both branches stay intact."""
        with self._shared.lock:
            state = self._enter("merge", write=True)
            return ops.merge(self._shared, state, source)

    def delete_branch(self, branch: BranchRef) -> DeletePlan:
        """Step one of deleting a branch: what would go (count, preview) and the
        token ``confirm_delete`` needs. Nothing is deleted yet; the current
        branch cannot be deleted."""
        with self._shared.lock:
            state = self._enter("delete_branch")
            target = ops.find_branch(self._shared, state, branch, "branch")
            plan, _ = ops.plan_delete(self._shared, state, target)
            return plan

    def confirm_delete(self, token: str, branch: BranchRef | None = None) -> DeletePlan:
        """Step two: delete the branch the token's plan names, and only the
        messages no other branch needs. A token from a plan that no longer
        holds (the branch changed since), or not of ``branch`` when it is
        given, is refused with ``confirmation_mismatch``."""
        if not isinstance(token, str) or (
            branch is None and not re.fullmatch(r"\d+-[0-9a-f]{16}", token)
        ):
            msg = f"confirmation token {token!r} is not one delete_branch issued"
            raise RejectedInputError(msg, field="token")
        with self._shared.lock:
            state = self._enter("confirm_delete", write=True)
            return ops.confirm_delete(self._shared, state, token, branch)

    def remember_delete(self, plan: DeletePlan) -> None:
        """Keep ``plan``'s token for a chat's ``/confirm-delete-branch N`` (persisted)."""
        with self._shared.lock:
            state = self._enter("delete_branch", write=True)
            pending = {**state.pending_deletes, str(plan.number): plan.token}
            self._shared.commit_now(msgspec.structs.replace(state, pending_deletes=pending))

    def pending_delete(self, number: int) -> str | None:
        """The token a chat's ``/delete-branch number`` left, if any."""
        with self._shared.lock:
            return self._shared.state().pending_deletes.get(str(number))

    # -- exporting -----------------------------------------------------------------------

    def tree(self) -> dict[str, Any]:
        """The whole tree, nested, in the specification's keys (``parentId``…)."""
        with self._shared.lock:
            state = self._enter("tree")
            branches = [ops.branch_info(self._shared, state, b) for b in state.branches]
            tip = ops.current(state).tip
        messages = self._shared.backend.messages(self.session_id)
        return nested_tree(self.session_id, state.current, tip, branches, messages)

    def export_tree(self, fmt: str = "json") -> str:
        """The tree as ``json`` (nested), ``text`` (an ASCII tree) or ``html`` (one
        self-contained interactive page); ``RejectedInputError`` for another format."""
        check_format(fmt)
        return render(self.tree(), fmt)

    def transcript(self) -> Iterator[str]:
        """The transcript as JSONL lines (one message a line, in the order written,
        specification keys)."""
        self._check("transcript", write=False)
        yield from transcript_lines(self._shared.backend.messages(self.session_id))

    # -- async twins ---------------------------------------------------------------------

    async def afork(self, from_message_id: uuid.UUID | str, name: str | None = None) -> BranchInfo:
        return await asyncio.to_thread(self.fork, from_message_id, name)

    async def acheckout(self, target: BranchRef) -> BranchInfo:
        return await asyncio.to_thread(self.checkout, target)

    async def amerge(self, source: BranchRef) -> Merged:
        return await asyncio.to_thread(self.merge, source)

    async def aconfirm_delete(self, token: str, branch: BranchRef | None = None) -> DeletePlan:
        return await asyncio.to_thread(self.confirm_delete, token, branch)

    async def alink_platform_id(self, message_id: uuid.UUID | str, platform_id: str) -> Message:
        return await asyncio.to_thread(self.link_platform_id, message_id, platform_id)
