"""A spawned session's context: its own branch of its root Main's conversation.

A Branch or Worker session does not get a conversation of its own. Its
context is one linear branch of the conversation its root Main owns, forked
at a message (by default the spawning session's tip at the spawn) and named
after the session (id ``session_<hex>``). What its model sees is chosen at
the spawn (``ContextScope``): its own messages (the default: context never
flows automatically), or the whole path from the root. A continued
sub-agent's branch ``continues`` the old one: its own context runs on into
the old branch's messages.

The branch is made by the session's first write, so a session that never
writes costs the conversation nothing. A Branch's messages are written
through the conversation's write queue (durable when ``append`` returns); a
Worker keeps no memory, so its branch lives in this object only and is gone
with it (only its result reaches its parent's branch, as a message).

Reads and writes are checkpoints of the session (``guard``). The tree's own
operations (fork, checkout, merge, deleting branches) belong to the people
browsing the conversation: here they raise ``NotAllowedError``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from sessiontree.conversations import _branching as ops
from sessiontree.conversations._branch_rows import (
    Entry,
    drafts,
    from_summary,
    newest_original,
    own_messages,
    summary_entry,
)
from sessiontree.conversations._conversation import MAX_CONTEXT, Conversation
from sessiontree.conversations._export import check_format, render
from sessiontree.conversations._values import as_uuid, role_of
from sessiontree.conversations._writes import SharedConversation
from sessiontree.protocol import (
    Branch,
    BranchInfo,
    ContextScope,
    ConversationState,
    DeletePlan,
    Merged,
    Message,
    NotAllowedError,
    RejectedInputError,
    Role,
    as_json,
)

__all__ = ["Entry", "SessionBranch", "session_branch", "session_branch_id"]


def session_branch_id(session_id: uuid.UUID) -> str:
    """The id of the branch a spawned session writes on."""
    return f"session_{session_id.hex}"


def session_branch(state: ConversationState, session_id: uuid.UUID) -> Branch | None:
    """The branch ``session_id`` writes on in ``state``, if it has been made."""
    wanted = session_branch_id(session_id)
    for branch in reversed(state.branches):  # new branches are at the end
        if branch.id == wanted:
            return branch
    return None


class SessionBranch:
    """One spawned session's branch of its root's conversation (thread-safe).

    ``durable=False`` (a Worker): messages stay in this object. Bad arguments
    raise ``RejectedInputError`` naming the field; a fork point that is gone
    (its branch was deleted) raises ``ConversationError`` naming ``fork_at``;
    a failed durable write raises ``StoreError`` and changes nothing.
    """

    def __init__(
        self,
        shared: SharedConversation,
        *,
        owner: uuid.UUID,
        name: str,
        fork_at: uuid.UUID | None,
        scope: ContextScope = ContextScope.OWN,
        continues: str | None = None,
        durable: bool = True,
        guard: Callable[[str], None] | None = None,
    ) -> None:
        self._shared = shared
        self.owner = owner
        self.branch_id = session_branch_id(owner)
        self.name = name
        self.fork_at = fork_at
        self.scope = scope
        self.continues = continues
        self.durable = durable
        self.guard = guard
        self.compact_due = False  # see Compaction: the last call was long
        self._memory: list[Message] = []  # a worker's own messages, oldest first
        self._base_depth: int | None = None  # depth of the fork point (a worker's)
        # children's results that arrived and are not written yet: the session's
        # next write puts them in (after the answers of a tool call it ends),
        # so they never split a turn of its own
        self._arrived: list[Message] = []
        self._arrivals = threading.Lock()

    # -- what the session reads ---------------------------------------------------------

    @property
    def session_id(self) -> uuid.UUID:
        """The conversation's id (the root Main's session id)."""
        return self._shared.session_id

    @property
    def active_leaf(self) -> uuid.UUID | None:
        """The message this session's next message hangs under."""
        return self.tip()

    @property
    def current_branch(self) -> BranchInfo:
        """This session's branch (a worker's, or one not written yet, as it would be)."""
        self._check("current_branch")
        with self._shared.lock:
            state = self._shared.state()
            branch = self.stored(state)
        if branch is not None:
            info = ops.branch_info(self._shared, state, branch)
            return msgspec.structs.replace(info, session_id=self.owner)
        last = self._memory[-1] if self._memory else None
        tip = self.tip()
        return BranchInfo(
            number=0,
            id=self.branch_id,
            name=self.name,
            current=False,
            base_id=self.fork_at,
            leaf_id=tip,
            last_message=last,
            message_count=(self._depth_of_base() + len(self._memory)) if tip else 0,
            own_messages=len(self._memory),
            age_s=0.0,
            session_id=self.owner,
        )

    def tip(self) -> uuid.UUID | None:
        """Where the next message hangs: the last own message, else the fork point."""
        if not self.durable:
            return self._memory[-1].id if self._memory else self.fork_at
        with self._shared.lock:
            branch = self.stored(self._shared.tip())
        return self.fork_at if branch is None else branch.tip

    def leaf(self) -> uuid.UUID | None:
        """The last written message of this (durable) branch, or None while it has none."""
        if not self.durable:
            return None
        with self._shared.lock:
            branch = self.stored(self._shared.state())  # acknowledged: never waits
        return None if branch is None else branch.leaf_id

    def made(self) -> bool:
        """Whether its (durable) branch exists: written, or its first write queued."""
        if not self.durable:
            return False
        with self._shared.lock:
            return self.stored(self._shared.latest()) is not None

    def stored(self, state: ConversationState) -> Branch | None:
        """This session's branch in ``state``, if it has been made (lock held)."""
        return session_branch(state, self.owner)

    def context(self, limit: int = 100) -> list[Message]:
        """The last ``limit`` messages this session's model sees, oldest first:
        its own (and, continuing another branch, that branch's), or with
        ``path`` everything from the root."""
        _check_limit(limit)
        self._check("context")
        return self.messages(limit)

    def messages(self, limit: int = MAX_CONTEXT) -> list[Message]:
        """``context`` without the checkpoint (what a model call sends): from the
        newest summary on when compaction wrote one, and the children's results
        that arrived since its last write at the end. With ``path`` it first
        waits (bounded) for results landing on the Main's branch."""
        with self._arrivals:
            out: list[Message] = self._arrived[::-1][:limit]
        if limit > len(out):
            out.extend(reversed(self._memory[len(out) - limit :]))
        backend, root = self._shared.backend, self._shared.session_id
        with self._shared.lock:
            state = self._shared.state()
            mine = self.stored(state) if self.durable else None
            branches = {b.id: b for b in state.branches} if self.continues else {}
        if mine is None:  # a worker's, or a branch not written yet: from the fork point
            start, on, base = self.fork_at, None, self.fork_at
        else:
            start, on, base = mine.tip, self.branch_id, mine.base_id
        if self.scope is ContextScope.PATH:
            self._shared.posts_settled()
            out.extend(backend.walk(root, start, limit - len(out), None))
        else:
            if on is not None:
                out.extend(backend.walk(root, start, limit - len(out), on))
            followed = self.continues
            while followed is not None and len(out) < limit:
                old = branches.get(followed)
                if old is None:
                    break
                out.extend(backend.walk(root, base, limit - len(out), old.id))
                followed, base = old.continues, old.base_id
        out = from_summary(out)
        out.reverse()
        return out

    def compactable(self, keep: int) -> list[Message]:
        """The context's messages a summary would replace: all but the last
        ``keep``, and with them the answers of a tool call they end on; none
        when that would replace only an earlier summary."""
        context = self.messages()
        cut = len(context) - keep
        while 0 < cut < len(context) and context[cut].role is Role.TOOL:
            cut += 1  # a tool call's answers go with the call
        old = context[:cut] if cut > 0 else []
        return old if any(m.compacts is None for m in old) else []

    def compact(self, summary: str, old: list[Message]) -> Message:
        """Write ``summary`` as the message that stands for ``old`` (what
        ``compactable`` gave): the context then starts at it; the originals stay."""
        return self.write([summary_entry(summary)], compacts=newest_original(old))[-1]

    async def acompact(self, summary: str, old: list[Message]) -> Message:
        """Awaitable ``compact``."""
        return (await self.awrite([summary_entry(summary)], compacts=newest_original(old)))[-1]

    def history(self) -> list[dict[str, Any]]:
        """The context as chat-completions messages (what ``complete`` sends)."""
        return [message.as_chat() for message in self.messages()]

    async def settled(self) -> None:
        """Wait, without blocking the loop, for what ``history`` reads that is
        still being written (with ``path``: results landing on the Main's branch)."""
        if self.scope is ContextScope.PATH:
            await self._shared.aposts_settled()

    def message(self, message_id: uuid.UUID | str) -> Message:
        """One message of the conversation (or of a worker's own branch)."""
        self._check("message")
        wanted = as_uuid(message_id, "message_id")
        for message in self._memory:
            if message.id == wanted:
                return message
        return self._shared.need(wanted, "message_id")

    def by_platform_id(self, platform_id: str) -> Message | None:
        """The conversation's message for a chat platform's id, or None."""
        self._check("by_platform_id")
        return self._shared.stored_platform_id(platform_id)

    def branches(self) -> list[BranchInfo]:
        """Every branch of the conversation (read only), this session's among them."""
        return self._conversation().branches()

    def __len__(self) -> int:
        """Messages on this session's own branch."""
        if not self.durable:
            return len(self._memory)
        with self._shared.lock:
            branch = self.stored(self._shared.state())
        return 0 if branch is None else branch.count

    def tree(self) -> dict[str, Any]:
        """The whole conversation, nested (a worker's branch is not in it)."""
        return self._conversation().tree()

    def export_tree(self, fmt: str = "json") -> str:
        """The conversation as ``json``, ``text`` or ``html``."""
        check_format(fmt)
        return render(self.tree(), fmt)

    def transcript(self) -> Iterator[str]:
        """The conversation's transcript as JSONL lines."""
        return self._conversation().transcript()

    # -- what the session writes ---------------------------------------------------------

    def append(
        self,
        role: Role | str,
        content: Any,
        *,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
        platform_id: str | None = None,
    ) -> Message:
        """Append a message to this session's branch; returns it once durable
        (a worker's: at once, in memory)."""
        _no_platform_id(platform_id)
        entry = self._entry(role, content, tool_calls)
        self._check("append")
        return self.write([entry], usage=usage)[0]

    def append_once(
        self,
        role: Role | str,
        content: Any,
        *,
        platform_id: str,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> tuple[Message, bool]:
        """Not on a session's branch: chat platform ids belong to a Main's conversation."""
        _no_platform_id(platform_id)
        raise AssertionError  # pragma: no cover - _no_platform_id raised

    async def aappend(
        self,
        role: Role | str,
        content: Any,
        *,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
        platform_id: str | None = None,
    ) -> Message:
        """Awaitable ``append`` (the write is queued from the loop, no thread held)."""
        _no_platform_id(platform_id)
        entry = self._entry(role, content, tool_calls)
        self._check("append")
        return (await self.awrite([entry], usage=usage))[0]

    def write(
        self,
        entries: list[Entry],
        usage: dict[str, Any] | None = None,
        compacts: uuid.UUID | None = None,
    ) -> list[Message]:
        """Append ``entries`` in one write (no checkpoint), with the children's
        results that arrived since the last; durable when it returns. ``usage``
        and ``compacts`` go on the last entry. Returns the entries' messages."""
        if not self.durable:
            return self._remember(entries, usage, compacts)
        shared = self._shared
        rows = self._rows(entries)
        try:
            with shared.lock:
                state, messages = self.grown(shared.tip(), rows, usage, compacts)
                state, future = shared.submit(state, messages, ())
            shared.wait(future, state)
        except BaseException:
            self._put_back(rows)
            raise
        return own_messages(rows, messages)

    async def awrite(
        self,
        entries: list[Entry],
        usage: dict[str, Any] | None = None,
        compacts: uuid.UUID | None = None,
    ) -> list[Message]:
        """``write`` from a coroutine; a caller cancelled while it waits stops
        waiting, and the write goes on (it lands or fails like any other)."""
        if not self.durable:
            return self._remember(entries, usage, compacts)
        shared = self._shared
        with shared.lock:
            if not shared.can_queue():  # a reload after a failure waits: not on the loop
                future = None
            else:
                rows = self._rows(entries)
                try:
                    state, messages = self.grown(shared.tip(), rows, usage, compacts)
                    state, future = shared.submit_awaitable(state, messages, ())
                except BaseException:
                    self._put_back(rows)
                    raise
        if future is None:
            return await asyncio.to_thread(self.write, entries, usage, compacts)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            shared.book_later(future, state)  # the write goes on: what arrived is in it
            raise
        except Exception:
            shared.failed()
            self._put_back(rows)
            raise
        shared.acknowledged(state)
        return own_messages(rows, messages)

    def arrive(self, message: Message) -> None:
        """A child's result (its role, content and links) arrived: it is in the
        context now and goes to the store with the session's next write, or
        with ``flush`` at its end. Never blocks."""
        with self._arrivals:
            self._arrived.append(message)

    def flush(self) -> bool:
        """Queue what arrived and was not written (the session ended) without
        waiting for it to be durable; False (nothing queued) while the
        conversation must first reload after a failed write."""
        rows: list[Entry | Message] = list(self._take_arrived())
        if not rows:
            return True
        shared = self._shared
        with shared.lock:
            if not shared.can_queue():
                return False
            state, messages = self.grown(shared.tip(), rows, None)
            state, future = shared.submit(state, messages, ())
            shared.posted_write(future, state)
        return True

    def _take_arrived(self) -> list[Message]:
        with self._arrivals:
            arrived, self._arrived = self._arrived, []
        return arrived

    def _rows(self, entries: list[Entry]) -> list[Entry | Message]:
        """What one write puts on the branch: ``entries`` with what arrived
        before them, or after the tool answers they start with (the answers
        belong to the call before)."""
        arrived = self._take_arrived()
        if not arrived:
            return list(entries)
        answers = 0
        while answers < len(entries) and entries[answers][0] is Role.TOOL:
            answers += 1
        return [*entries[:answers], *arrived, *entries[answers:]]

    def _put_back(self, rows: list[Entry | Message]) -> None:
        """A write failed: what arrived is kept for the next one."""
        arrived = [row for row in rows if isinstance(row, Message)]
        if arrived:
            with self._arrivals:
                self._arrived[:0] = arrived

    def grown(
        self,
        state: ConversationState,
        rows: list[Entry | Message],
        usage: dict[str, Any] | None,
        compacts: uuid.UUID | None = None,
    ) -> tuple[ConversationState, list[Message]]:
        """``state`` with ``rows`` on this session's branch, made by the first
        write (lock held): each entry a new message, each arrived result a new
        message with its content and links; ``usage`` and ``compacts`` on the
        last entry. ``ConversationError`` naming ``fork_at`` if the fork point
        is gone."""
        now = self._shared.clock.time()
        branch = self.stored(state)
        if branch is None:
            depth = 0 if self.fork_at is None else self._shared.need(self.fork_at, "fork_at").depth
            branch = Branch(
                number=state.next_number,
                id=self.branch_id,
                name=self.name,
                base_id=self.fork_at,
                created_at=now,
                updated_at=now,
                depth=depth,
                session_id=self.owner,
                continues=self.continues,
            )
            state = msgspec.structs.replace(
                state, branches=[*state.branches, branch], next_number=state.next_number + 1
            )
        return ops.chain(state, branch, drafts(rows, usage, compacts), now)

    def _remember(
        self,
        entries: list[Entry],
        usage: dict[str, Any] | None,
        compacts: uuid.UUID | None = None,
    ) -> list[Message]:
        """A worker's write: in memory only."""
        with self._shared.lock:
            messages = ops.placed(
                drafts(list(entries), usage, compacts),
                tip=self.tip(),
                depth=self._depth_of_base() + len(self._memory),
                seq=len(self._memory),
                branch_id=self.branch_id,
                now=self._shared.clock.time(),
            )
            self._memory.extend(messages)
            return messages

    def _depth_of_base(self) -> int:
        if self._base_depth is None:
            base = self.fork_at
            self._base_depth = 0 if base is None else self._shared.need(base, "fork_at").depth
        return self._base_depth

    def _entry(self, role: Role | str, content: Any, tool_calls: list[Any] | None) -> Entry:
        checked = role_of(role)
        content = as_json("content", content)
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise RejectedInputError("tool_calls must be a list", field="tool_calls")
            tool_calls = as_json("tool_calls", tool_calls)
        return checked, content, tool_calls, None, None

    # -- the tree's operations are not a session's ------------------------------------------

    def link_platform_id(self, message_id: uuid.UUID | str, platform_id: str) -> Message:
        raise self._not_here("link_platform_id")

    def fork(self, from_message_id: uuid.UUID | str, name: str | None = None) -> BranchInfo:
        raise self._not_here("fork")

    def checkout(self, target: Any) -> BranchInfo:
        raise self._not_here("checkout")

    def merge(self, source: Any) -> Merged:
        raise self._not_here("merge")

    def delete_branch(self, branch: Any) -> DeletePlan:
        raise self._not_here("delete_branch")

    def confirm_delete(self, token: str, branch: Any = None) -> DeletePlan:
        raise self._not_here("confirm_delete")

    async def afork(self, from_message_id: uuid.UUID | str, name: str | None = None) -> BranchInfo:
        raise self._not_here("fork")

    async def acheckout(self, target: Any) -> BranchInfo:
        raise self._not_here("checkout")

    async def amerge(self, source: Any) -> Merged:
        raise self._not_here("merge")

    async def aconfirm_delete(self, token: str, branch: Any = None) -> DeletePlan:
        raise self._not_here("confirm_delete")

    async def alink_platform_id(self, message_id: uuid.UUID | str, platform_id: str) -> Message:
        raise self._not_here("link_platform_id")

    # -- helpers -------------------------------------------------------------------------

    def _check(self, what: str) -> None:
        if self.guard is not None:
            self.guard(what)

    def _conversation(self) -> Conversation:
        return Conversation(self._shared, guard=self.guard, writable=False)

    def _not_here(self, what: str) -> NotAllowedError:
        msg = (
            f"session {self.owner}: {what} is not a sub-agent's to do; its context is one "
            f"linear branch ({self.branch_id}) of conversation {self.session_id}"
        )
        return NotAllowedError(msg, session_id=self.owner)


def _check_limit(limit: object) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= MAX_CONTEXT:
        msg = f"limit must be an integer in 0..{MAX_CONTEXT}, got {limit!r}"
        raise RejectedInputError(msg, field="limit")


def _no_platform_id(platform_id: object) -> None:
    if platform_id is not None:
        msg = "platform_id belongs to a Main's conversation, not a sub-agent's branch"
        raise RejectedInputError(msg, field="platform_id")
