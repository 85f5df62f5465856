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
import hashlib
import json
import os
import random
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from sessiontree.conversations._html import render_html
from sessiontree.conversations._text import nested_json, preview_text, text_tree
from sessiontree.protocol import (
    MAX_BRANCH_NAME_CHARS,
    Branch,
    BranchInfo,
    ConversationError,
    ConversationState,
    DeletePlan,
    ErrorCode,
    Merged,
    Message,
    NotAllowedError,
    RejectedInputError,
    Role,
    StoreError,
    as_json,
    check_text,
)

__all__ = [
    "EXPORT_FORMATS",
    "Conversation",
    "ConversationBackend",
    "Conversations",
    "MemoryBackend",
    "TimeSource",
]

EXPORT_FORMATS = ("json", "text", "html")
MAX_CONTEXT = 10_000  # the most messages one context() call returns
_SETTLE_TIMEOUT = 60.0  # seconds a write may wait for the store before it is given up
_PREVIEW = 3  # messages a delete plan previews
_NAME = re.compile(r"[^\x00-\x1f\x7f]+")
_NUMBER = re.compile(r"[0-9]{1,9}")  # a branch number (not "²", not 5,000 digits)
_ROLES = tuple(r.value for r in Role)

BranchRef = int | str | uuid.UUID
F = TypeVar("F")


class TimeSource(Protocol):
    """The clock conversations stamp messages and branches with (a node's clock)."""

    def time(self) -> float:
        """Seconds since the epoch."""
        ...


class ConversationBackend(Protocol):
    """Where conversations live. Reads run on the caller's thread; ``commit``
    is durable when it returns and raises ``StoreError`` (nothing written)."""

    def load(self, session_id: uuid.UUID) -> ConversationState | None:
        """The conversation's bookkeeping, or None if it has none yet."""
        ...

    def message(self, session_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        """One message of this conversation, or None."""
        ...

    def walk(
        self, session_id: uuid.UUID, start: uuid.UUID | None, limit: int, branch_id: str | None
    ) -> list[Message]:
        """From ``start`` towards the root through parent ids, newest first, at
        most ``limit`` messages; with ``branch_id``, stop at the first message
        not on that branch."""
        ...

    def messages(self, session_id: uuid.UUID) -> Iterator[Message]:
        """Every message of the conversation, in no particular order."""
        ...

    def by_platform_id(self, session_id: uuid.UUID, platform_id: str) -> uuid.UUID | None:
        """Our message id for a chat platform's message id, or None."""
        ...

    def submit(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> concurrent.futures.Future[None]:
        """Queue a write of ``state`` that puts and deletes messages (and their
        platform ids); the future resolves once it is durable, or fails with
        ``StoreError`` — then nothing of it was written, and every write of this
        conversation queued after it fails too (it was built on this one)."""
        ...

    def submit_awaitable(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> asyncio.Future[None]:
        """``submit`` from a coroutine on a running event loop (queued at once)."""
        ...


class MemoryBackend:
    """Conversations in dicts (a node without a store); lost with the process."""

    def __init__(self) -> None:
        self._states: dict[uuid.UUID, ConversationState] = {}
        self._messages: dict[uuid.UUID, dict[uuid.UUID, Message]] = {}
        self._platform: dict[uuid.UUID, dict[str, uuid.UUID]] = {}
        self._lock = threading.Lock()

    def load(self, session_id: uuid.UUID) -> ConversationState | None:
        with self._lock:
            state = self._states.get(session_id)
            return None if state is None else msgspec.structs.replace(state)

    def message(self, session_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        with self._lock:
            return self._messages.get(session_id, {}).get(message_id)

    def walk(
        self, session_id: uuid.UUID, start: uuid.UUID | None, limit: int, branch_id: str | None
    ) -> list[Message]:
        out: list[Message] = []
        with self._lock:
            messages = self._messages.get(session_id, {})
            current = start
            while current is not None and len(out) < limit:
                found = messages.get(current)
                if found is None or (branch_id is not None and found.branch_id != branch_id):
                    break
                out.append(found)
                current = found.parent_id
        return out

    def messages(self, session_id: uuid.UUID) -> Iterator[Message]:
        with self._lock:
            snapshot = list(self._messages.get(session_id, {}).values())
        return iter(snapshot)

    def by_platform_id(self, session_id: uuid.UUID, platform_id: str) -> uuid.UUID | None:
        with self._lock:
            return self._platform.get(session_id, {}).get(platform_id)

    def submit(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> concurrent.futures.Future[None]:
        self._apply(state, put, delete)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        return done

    def submit_awaitable(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> asyncio.Future[None]:
        self._apply(state, put, delete)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def _apply(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> None:
        sid = state.session_id
        with self._lock:
            self._states[sid] = msgspec.structs.replace(state)
            messages = self._messages.setdefault(sid, {})
            platform = self._platform.setdefault(sid, {})
            for message in delete:
                messages.pop(message.id, None)
                if message.platform_id is not None:
                    platform.pop(message.platform_id, None)
            for message in put:
                messages[message.id] = message
                if message.platform_id is not None:
                    platform[message.platform_id] = message.id


class _Shared:
    """One conversation's state, shared by every handle on it.

    ``durable`` is the last acknowledged state (what reads see: they never
    wait); ``tip`` the last one submitted (what the next write builds on).
    ``lock`` is never held across I/O by an append: appends of one
    conversation are built and queued in order under it, then wait for their
    commit outside it, so they share commits. A failed write makes the tip
    stale: the next write reloads from the backend once every queued write of
    this conversation has settled. A write whose waiter gave up (a cancelled
    coroutine, a timeout) is booked when it really settles.
    """

    def __init__(
        self, session_id: uuid.UUID, backend: ConversationBackend, clock: TimeSource
    ) -> None:
        self.session_id = session_id
        self.backend = backend
        self.clock = clock
        self.lock = threading.RLock()
        self.settled = threading.Condition(self.lock)
        self.inflight = 0
        self._durable: ConversationState | None = None
        self._tip: ConversationState | None = None
        # platform id -> (message, rev of its write): queued, not yet acknowledged
        self.pending_platform: dict[str, tuple[Message, int]] = {}

    def state(self) -> ConversationState:
        """The acknowledged state (loaded on first use, when nothing is in flight)."""
        with self.lock:
            if self._durable is None:
                self._load()
            assert self._durable is not None
            return self._durable

    def tip(self) -> ConversationState:
        """The state the next write builds on."""
        with self.lock:
            if self._tip is None:
                self._load()
            assert self._tip is not None
            return self._tip

    def settle(self) -> ConversationState:
        """Wait (lock held) until no write of this conversation is in flight; the state."""
        self._drain()
        return self.state()

    def _drain(self) -> None:
        if not self.settled.wait_for(lambda: self.inflight == 0, timeout=_SETTLE_TIMEOUT):
            msg = f"session {self.session_id}: conversation writes did not settle"
            raise StoreError(msg)

    def _load(self) -> None:
        self._drain()  # after a failure: what the backend holds once the queue drained
        loaded = self.backend.load(self.session_id)
        if loaded is None:
            now = self.clock.time()
            main = Branch(number=1, id=_branch_id(), name="main", base_id=None, created_at=now)
            loaded = ConversationState(
                session_id=self.session_id,
                branches=[main],
                current=main.id,
                created_at=now,
                updated_at=now,
            )
        self._durable = self._tip = loaded
        self.pending_platform.clear()

    def queued(self, state: ConversationState, put: Sequence[Message]) -> None:
        """A write of ``state`` putting ``put`` was submitted (lock held)."""
        self._tip = state
        self.inflight += 1
        for message in put:
            if message.platform_id is not None:
                self.pending_platform[message.platform_id] = (message, state.rev)

    def acknowledged(self, state: ConversationState) -> None:
        with self.lock:
            self.inflight -= 1
            if self._durable is None or state.rev > self._durable.rev:
                self._durable = state
            for key, (_, rev) in list(self.pending_platform.items()):
                if rev <= state.rev:
                    del self.pending_platform[key]
            if self.inflight == 0:
                self.settled.notify_all()

    def failed(self) -> None:
        """A write failed: what was acknowledged stays true, the tip is rebuilt."""
        with self.lock:
            self.inflight -= 1
            self._tip = None
            self.pending_platform.clear()
            self.settled.notify_all()

    def book_later(
        self,
        future: concurrent.futures.Future[None] | asyncio.Future[None],
        state: ConversationState,
    ) -> None:
        """The waiter of a write gave up: book the write when it settles."""

        def settled(done: Any) -> None:
            if done.cancelled() or done.exception() is not None:
                self.failed()
            else:
                self.acknowledged(state)

        future.add_done_callback(settled)

    def submit(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> tuple[ConversationState, concurrent.futures.Future[None]]:
        """Queue a write of ``state`` (lock held); the state as written, and its future."""
        return state, self._queue(state, put, delete, self.backend.submit)

    def submit_awaitable(
        self, state: ConversationState, put: Sequence[Message], delete: Sequence[Message]
    ) -> tuple[ConversationState, asyncio.Future[None]]:
        """``submit`` from a coroutine on a running event loop."""
        return state, self._queue(state, put, delete, self.backend.submit_awaitable)

    def _queue(
        self,
        state: ConversationState,
        put: Sequence[Message],
        delete: Sequence[Message],
        send: Callable[[ConversationState, Sequence[Message], Sequence[Message]], F],
    ) -> F:
        """Number ``state`` (a new object, so in place), hand it to ``send``, note it queued."""
        state.rev = self.tip().rev + 1
        future = send(state, put, delete)
        self.queued(state, put)
        return future

    def commit_now(
        self,
        state: ConversationState,
        put: Sequence[Message] = (),
        delete: Sequence[Message] = (),
    ) -> ConversationState:
        """Write ``state`` and wait for it (lock held, nothing in flight)."""
        state, future = self.submit(state, put, delete)
        self.wait(future, state)
        return state

    def can_queue(self) -> bool:
        """Whether an append can be built now without waiting for a reload (lock held)."""
        return self._tip is not None or self.inflight == 0

    def wait(self, future: concurrent.futures.Future[None], state: ConversationState) -> None:
        """Wait for a queued write; a failure is booked now, a give-up when it settles."""
        try:
            future.result(timeout=_SETTLE_TIMEOUT)
        except concurrent.futures.TimeoutError as exc:
            self.book_later(future, state)
            msg = f"session {self.session_id}: the store did not acknowledge the write in time"
            raise StoreError(msg) from exc
        except Exception:
            self.failed()
            raise
        except BaseException:
            self.book_later(future, state)
            raise
        self.acknowledged(state)

    def stored_platform_id(self, platform_id: str) -> Message | None:
        """The stored message recorded for a chat platform's id."""
        found = self.backend.by_platform_id(self.session_id, platform_id)
        return None if found is None else self.backend.message(self.session_id, found)

    def known_platform_id(self, platform_id: str) -> Message | None:
        """The message recorded (or queued) for a chat platform's id (lock held)."""
        pending = self.pending_platform.get(platform_id)
        return pending[0] if pending is not None else self.stored_platform_id(platform_id)


class Conversations:
    """Every conversation of a node, by session id (each loaded once, on first use)."""

    def __init__(self, backend: ConversationBackend, clock: TimeSource) -> None:
        self.backend = backend
        self.clock = clock
        self._shared: dict[uuid.UUID, _Shared] = {}
        self._lock = threading.Lock()

    def get(
        self,
        session_id: uuid.UUID,
        *,
        guard: Callable[[str], None] | None = None,
        writable: bool = True,
    ) -> Conversation:
        """A handle on ``session_id``'s conversation. ``guard(what)`` runs before
        every operation (a skill's checkpoint); ``writable=False`` refuses writes
        with ``NotAllowedError`` (workers keep no memory)."""
        with self._lock:
            shared = self._shared.get(session_id)
            if shared is None:
                shared = self._shared[session_id] = _Shared(session_id, self.backend, self.clock)
        return Conversation(shared, guard=guard, writable=writable)


class Conversation:
    """A handle on one session's conversation tree (thread-safe).

    Bad arguments raise ``RejectedInputError`` naming the field; a message or
    branch the conversation does not have, a name already taken, deleting the
    current branch or a stale confirmation raise ``ConversationError`` (its
    ``code`` says which, its ``field`` names the argument); a failed durable
    write raises ``StoreError`` and changes nothing. Every write has an
    awaitable twin (``aappend``…) that never blocks the event loop.
    """

    def __init__(
        self,
        shared: _Shared,
        *,
        guard: Callable[[str], None] | None = None,
        writable: bool = True,
    ) -> None:
        self._shared = shared
        self._guard = guard
        self._writable = writable

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

    def _error(self, message: str, code: ErrorCode, field: str) -> ConversationError:
        return ConversationError(
            f"session {self.session_id}: {message}",
            code=code,
            field=field,
            session_id=self.session_id,
        )

    # -- reading ------------------------------------------------------------------------

    @property
    def active_leaf(self) -> uuid.UUID | None:
        """The message the next ``append`` hangs under (None for an empty branch at the root)."""
        with self._shared.lock:
            return self._current(self._shared.state()).tip

    @property
    def current_branch(self) -> BranchInfo:
        """The branch ``append`` writes to."""
        with self._shared.lock:
            state = self._enter("current_branch")
            return self._info(state, self._current(state))

    def context(self, limit: int = 100) -> list[Message]:
        """The last ``limit`` messages of the active path, oldest first (O(limit))."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= MAX_CONTEXT:
            msg = f"limit must be an integer in 0..{MAX_CONTEXT}, got {limit!r}"
            raise RejectedInputError(msg, field="limit")
        with self._shared.lock:
            state = self._enter("context")
            tip = self._current(state).tip
        path = self._shared.backend.walk(self.session_id, tip, limit, None)
        path.reverse()
        return path

    def message(self, message_id: uuid.UUID | str) -> Message:
        """One message; ``ConversationError`` (``unknown_message``) if it is not in this one."""
        self._check("message", write=False)
        return self._need(_as_uuid(message_id, "message_id"), "message_id")

    def by_platform_id(self, platform_id: str) -> Message | None:
        """The message a chat platform's id was recorded for, or None."""
        _check_platform_id(platform_id)
        self._check("by_platform_id", write=False)
        return self._shared.stored_platform_id(platform_id)

    def branches(self) -> list[BranchInfo]:
        """Every branch, by number, with its tip, last message, count and age; one is current."""
        with self._shared.lock:
            state = self._enter("branches")
            return [self._info(state, branch) for branch in state.branches]

    def __len__(self) -> int:
        """Messages in the conversation."""
        with self._shared.lock:
            state = self._shared.state()
            return state.messages

    # -- writing -------------------------------------------------------------------------

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
        shared = self._shared
        with shared.lock:
            if once and platform_id is not None:
                known = shared.known_platform_id(platform_id)
                if known is not None:
                    return known, False
            state, message = self._appended(fields)
            state, future = shared.submit(state, (message,), ())
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
        shared = self._shared
        with shared.lock:
            if shared.can_queue():
                state, message = self._appended(fields)
                state, future = shared.submit_awaitable(state, (message,), ())
            else:  # reloading after a failure waits for the queue: not on the loop
                future = None
        if future is None:
            return await asyncio.to_thread(
                self.append,
                role,
                content,
                tool_calls=tool_calls,
                usage=usage,
                platform_id=platform_id,
            )
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
    ) -> tuple[Role, Any, list[Any] | None, dict[str, Any] | None, str | None]:
        """An append's arguments, checked (``RejectedInputError`` naming the bad one)."""
        checked = _role(role)
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
            _check_platform_id(platform_id)
        self._check("append", write=True)
        return checked, content, tool_calls, usage, platform_id

    def _appended(
        self, fields: tuple[Role, Any, list[Any] | None, dict[str, Any] | None, str | None]
    ) -> tuple[ConversationState, Message]:
        """The message at the tip of the current branch, and the state after it (lock held)."""
        role, content, tool_calls, usage, platform_id = fields
        state = self._shared.tip()
        branch = self._current(state)
        now = self._shared.clock.time()
        message = Message(
            id=_new_id(),
            parent_id=branch.tip,
            role=role,
            content=content,
            timestamp=now,
            branch_id=branch.id,
            seq=state.next_seq,
            depth=branch.depth + 1,
            tool_calls=tool_calls,
            usage=usage,
            platform_id=platform_id,
        )
        grown = msgspec.structs.replace(
            branch, leaf_id=message.id, count=branch.count + 1, depth=message.depth, updated_at=now
        )
        return _with_branch(state, grown, next_seq=state.next_seq + 1, updated_at=now), message

    def link_platform_id(self, message_id: uuid.UUID | str, platform_id: str) -> Message:
        """Record the chat platform's id of a message sent out (e.g. the agent's
        reply), so a ``/fork`` replying to it finds it."""
        _check_platform_id(platform_id)
        with self._shared.lock:
            state = self._enter("link_platform_id", write=True)
            message = self._need(_as_uuid(message_id, "message_id"), "message_id")
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
        base_id = _as_uuid(from_message_id, "from_message_id")
        with self._shared.lock:
            state = self._enter("fork", write=True)
            base = self._need(base_id, "from_message_id")
            return self._fork(state, base, name)

    def _fork(self, state: ConversationState, base: Message, name: str | None) -> BranchInfo:
        number = state.next_number
        name = f"branch-{number}" if name is None else self._check_name(state, name)
        if any(b.name == name for b in state.branches):
            if name == f"branch-{number}":
                name = f"branch-{number}-{uuid.uuid4().hex[:4]}"
            else:
                msg = f"a branch named {name!r} exists"
                raise self._error(msg, ErrorCode.BRANCH_EXISTS, "name")
        now = self._shared.clock.time()
        branch = Branch(
            number=number,
            id=_branch_id(),
            name=name,
            base_id=base.id,
            created_at=now,
            updated_at=now,
            depth=base.depth,
        )
        forked = msgspec.structs.replace(
            state,
            branches=[*state.branches, branch],
            current=branch.id,
            next_number=number + 1,
            updated_at=now,
        )
        self._shared.commit_now(forked)
        return self._info(forked, branch)

    def checkout(self, target: BranchRef) -> BranchInfo:
        """Make a branch current: by number, by name, or by message id (the
        branch whose tip it is; any other message forks an unnamed branch there)."""
        with self._shared.lock:
            state = self._enter("checkout", write=True)
            message_id = _maybe_uuid(target)
            if message_id is not None:
                target_message = self._need(message_id, "target")
                tipped = [b for b in state.branches if b.tip == message_id]
                if not tipped:
                    return self._fork(state, target_message, None)
                branch = next((b for b in tipped if b.id == state.current), tipped[0])
            else:
                branch = self._branch(state, target, "target")
            if branch.id != state.current:
                state = msgspec.structs.replace(
                    state,
                    current=branch.id,
                    updated_at=self._shared.clock.time(),
                )
                self._shared.commit_now(state)
            return self._info(state, branch)

    def merge(self, source: BranchRef) -> Merged:
        """Append the source branch's own messages (those after its fork point)
        to the current branch as new messages that record where they came
        from (``merged_from``); both branches stay intact."""
        with self._shared.lock:
            state = self._enter("merge", write=True)
            src = self._branch(state, source, "source")
            into = self._current(state)
            if src.id == into.id:
                raise self._error(
                    f"branch {src.number} ({src.name}) is the current branch; merge another "
                    "branch into it",
                    ErrorCode.CURRENT_BRANCH,
                    "source",
                )
            own = self._own(src)
            own.reverse()
            now = self._shared.clock.time()
            copies: list[Message] = []
            tip, depth, seq = into.tip, into.depth, state.next_seq
            for original in own:
                copy = Message(
                    id=_new_id(),
                    parent_id=tip,
                    role=original.role,
                    content=original.content,
                    timestamp=now,
                    branch_id=into.id,
                    seq=seq,
                    depth=depth + 1,
                    tool_calls=original.tool_calls,
                    usage=original.usage,
                    merged_from=original.id,
                )
                copies.append(copy)
                tip, depth, seq = copy.id, copy.depth, seq + 1
            if copies:
                grown = msgspec.structs.replace(
                    into, leaf_id=tip, count=into.count + len(copies), depth=depth, updated_at=now
                )
                self._shared.commit_now(
                    _with_branch(state, grown, next_seq=seq, updated_at=now), copies
                )
            return Merged(
                source_number=src.number,
                source_name=src.name,
                into_number=into.number,
                into_name=into.name,
                messages=copies,
            )

    def delete_branch(self, branch: BranchRef) -> DeletePlan:
        """Step one of deleting a branch: what would go (count, preview) and the
        token ``confirm_delete`` needs. Nothing is deleted yet; the current
        branch cannot be deleted."""
        with self._shared.lock:
            state = self._enter("delete_branch")
            plan, _ = self._plan(state, self._branch(state, branch, "branch"))
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
            if branch is None:
                target = self._branch(state, int(token.split("-", 1)[0]), "token")
            else:
                target = self._branch(state, branch, "branch")
            plan, doomed = self._plan(state, target)
            if plan.token != token:
                why = (
                    "changed since its deletion was planned; plan it again"
                    if branch is None
                    else f"has no plan with token {token[:64]!r}"
                )
                raise self._error(
                    f"branch {target.number} {why}", ErrorCode.CONFIRMATION_MISMATCH, "token"
                )
            number = target.number
            pending = {k: v for k, v in state.pending_deletes.items() if k != str(number)}
            pruned = msgspec.structs.replace(
                state,
                branches=[b for b in state.branches if b.number != number],
                messages=state.messages - len(doomed),
                updated_at=self._shared.clock.time(),
                pending_deletes=pending,
            )
            self._shared.commit_now(pruned, (), doomed)
            return plan

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
            branches = [self._info(state, b) for b in state.branches]
            tip = self._current(state).tip
        nodes = sorted(self._shared.backend.messages(self.session_id), key=lambda m: m.seq)
        children: dict[uuid.UUID | None, list[dict[str, Any]]] = {}
        for message in nodes:
            node = message.to_spec()
            node["children"] = children.setdefault(message.id, [])
            children.setdefault(message.parent_id, []).append(node)
        ids = {m.id for m in nodes}
        roots = children.get(None, [])
        for parent, orphans in children.items():  # a parent deleted from under them
            if parent is not None and parent not in ids:
                roots.extend(orphans)
        return {
            "sessionId": str(self.session_id),
            "activeLeafId": None if tip is None else str(tip),
            "currentBranchId": state.current,
            "branches": [_branch_spec(b) for b in branches],
            "root": {"id": "root", "children": roots},
        }

    def export_tree(self, fmt: str = "json") -> str:
        """The tree as ``json`` (nested), ``text`` (an ASCII tree) or ``html`` (one
        self-contained interactive page); ``RejectedInputError`` for another format."""
        if fmt not in EXPORT_FORMATS:
            msg = f"format {fmt!r} must be one of {', '.join(EXPORT_FORMATS)}"
            raise RejectedInputError(msg, field="format")
        tree = self.tree()
        if fmt == "json":
            return nested_json(tree)
        if fmt == "text":
            return text_tree(tree)
        return render_html(tree, title=f"Conversation {self.session_id}")

    def transcript(self) -> Iterator[str]:
        """The transcript as JSONL lines (one message a line, in the order written,
        specification keys)."""
        self._check("transcript", write=False)
        for message in sorted(self._shared.backend.messages(self.session_id), key=lambda m: m.seq):
            yield json.dumps(message.to_spec(), ensure_ascii=False) + "\n"

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

    # -- helpers -------------------------------------------------------------------------

    def _need(self, message_id: uuid.UUID, field: str) -> Message:
        found = self._shared.backend.message(self.session_id, message_id)
        if found is None:
            raise self._error(
                f"message {message_id} is not in this session's conversation",
                ErrorCode.UNKNOWN_MESSAGE,
                field,
            )
        return found

    def _current(self, state: ConversationState) -> Branch:
        return next(b for b in state.branches if b.id == state.current)

    def _branch(self, state: ConversationState, ref: BranchRef, field: str) -> Branch:
        """A branch by number (int or digits), id or name."""
        number: int | None = None
        if isinstance(ref, bool) or not isinstance(ref, int | str):
            msg = f"{field} must be a branch number or name, got {type(ref).__name__}"
            raise RejectedInputError(msg, field=field)
        if isinstance(ref, int):
            number = ref
        elif _NUMBER.fullmatch(ref.strip()):
            number = int(ref.strip())
        for branch in state.branches:
            if (number is not None and branch.number == number) or branch.name == ref:
                return branch
            if branch.id == ref:
                return branch
        shown = ", ".join(f"{b.number} {b.name}" for b in state.branches)
        raise self._error(f"no branch {ref!r} (branches: {shown})", ErrorCode.UNKNOWN_BRANCH, field)

    def _check_name(self, state: ConversationState, name: object) -> str:
        if (
            not isinstance(name, str)
            or not 1 <= len(name) <= MAX_BRANCH_NAME_CHARS
            or not _NAME.fullmatch(name)
            or not name.strip()
        ):
            msg = (
                f"branch name must be 1-{MAX_BRANCH_NAME_CHARS} characters without control "
                f"characters, got {name!r}"
            )
            raise RejectedInputError(msg, field="name")
        check_text(name, "name")
        if (
            re.fullmatch(r"[0-9]+", name.strip())
            or _maybe_uuid(name) is not None
            or name.startswith("branch_")
        ):
            msg = f"branch name {name!r} would read as a number or an id; choose a word"
            raise RejectedInputError(msg, field="name")
        return name

    def _own(self, branch: Branch) -> list[Message]:
        """The branch's own messages, newest first."""
        if branch.leaf_id is None:
            return []
        return self._shared.backend.walk(self.session_id, branch.leaf_id, branch.count, branch.id)

    def _info(self, state: ConversationState, branch: Branch) -> BranchInfo:
        tip = branch.tip
        last = None if tip is None else self._shared.backend.message(self.session_id, tip)
        return BranchInfo(
            number=branch.number,
            id=branch.id,
            name=branch.name,
            current=branch.id == state.current,
            base_id=branch.base_id,
            leaf_id=tip,
            last_message=last,
            message_count=0 if last is None else last.depth,
            own_messages=branch.count,
            age_s=max(0.0, self._shared.clock.time() - branch.updated_at),
        )

    def _plan(self, state: ConversationState, branch: Branch) -> tuple[DeletePlan, list[Message]]:
        if branch.id == state.current:
            raise self._error(
                f"branch {branch.number} ({branch.name}) is the current branch; check out "
                "another branch first",
                ErrorCode.CURRENT_BRANCH,
                "branch",
            )
        own = self._own(branch)  # newest first
        own_ids = {m.id: m.depth for m in own}
        floor = own[-1].depth if own else 0  # the shallowest own message
        needed_depth = 0  # own messages at or above this depth stay
        for other in state.branches:
            if other.id == branch.id or other.base_id is None:
                continue
            current: uuid.UUID | None = other.base_id
            while current is not None:
                if current in own_ids:
                    needed_depth = max(needed_depth, own_ids[current])
                    break
                found = self._shared.backend.message(self.session_id, current)
                if found is None or found.depth <= floor:
                    break
                current = found.parent_id
        doomed = [m for m in own if m.depth > needed_depth]
        doomed.reverse()
        digest = hashlib.sha256(
            f"{self.session_id}|{branch.id}|{branch.leaf_id}|{branch.count}|{len(doomed)}".encode()
        ).hexdigest()[:16]
        plan = DeletePlan(
            number=branch.number,
            branch_id=branch.id,
            name=branch.name,
            count=len(doomed),
            kept=len(own) - len(doomed),
            preview=[preview_text(m.content) for m in doomed[:_PREVIEW]],
            token=f"{branch.number}-{digest}",
        )
        return plan, doomed


# -- module helpers ------------------------------------------------------------------------


# Message ids are names, not secrets: a generator seeded from the OS, so an id
# costs no system call (uuid4 makes one per id, ~9 % of an append's time).
_RANDOM = random.Random(os.urandom(32))  # noqa: S311


def _new_id() -> uuid.UUID:
    return uuid.UUID(int=_RANDOM.getrandbits(128), version=4)


def _branch_id() -> str:
    return f"branch_{uuid.uuid4().hex[:8]}"


def _with_branch(
    state: ConversationState, branch: Branch, *, next_seq: int, updated_at: float
) -> ConversationState:
    """``state`` with ``branch`` replaced and the messages up to ``next_seq`` counted."""
    return msgspec.structs.replace(
        state,
        branches=[branch if b.id == branch.id else b for b in state.branches],
        next_seq=next_seq,
        messages=state.messages + next_seq - state.next_seq,
        updated_at=updated_at,
    )


def _role(role: object) -> Role:
    if isinstance(role, str) and role in _ROLES:
        return Role(role)
    choices = ", ".join(_ROLES)
    msg = f"role {role!r} must be one of {choices}"
    raise RejectedInputError(msg, field="role")


def _check_platform_id(platform_id: object) -> None:
    if not isinstance(platform_id, str) or not 1 <= len(platform_id) <= 256:
        msg = f"platform_id must be a string of 1-256 characters, got {platform_id!r}"
        raise RejectedInputError(msg, field="platform_id")
    check_text(platform_id, "platform_id")


def _maybe_uuid(value: object) -> uuid.UUID | None:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str) and len(value) in (32, 36):
        try:
            return uuid.UUID(value)
        except ValueError:
            return None
    return None


def _as_uuid(value: object, field: str) -> uuid.UUID:
    found = _maybe_uuid(value)
    if found is None:
        msg = f"{field} must be a message id (a UUID), got {value!r}"
        raise RejectedInputError(msg, field=field)
    return found


def _branch_spec(info: BranchInfo) -> dict[str, Any]:
    return {
        "number": info.number,
        "id": info.id,
        "name": info.name,
        "baseId": None if info.base_id is None else str(info.base_id),
        "leafId": None if info.leaf_id is None else str(info.leaf_id),
        "messageCount": info.message_count,
        "ownMessages": info.own_messages,
        "current": info.current,
    }
