"""Messages that reach sessions: inbound messages to a Main (one message
cycle each), progress notes, and a child's updates to its parent.

A message a Main cannot take is refused with an ``ErrorInfo`` (not a Main,
stopping or ended, node closing, the store refused it); a message too large
or not encodable raises ``RejectedInputError`` naming the field.
"""

from __future__ import annotations

import os
import random
import uuid
from typing import Any

from sessiontree.actors.runtime import Deliver, Inbound
from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SessionResult,
)
from sessiontree.supervision._commits import Commits, Written, store_error
from sessiontree.supervision._entry import Sent, TreeEntry
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._reports import CycleStarted
from sessiontree.supervision._tree import Tree

__all__ = ["Messages"]

# Message ids are names, not secrets: a generator seeded from the OS, so an id
# costs no system call (as the conversations' message ids).
_IDS = random.Random(os.urandom(32))  # noqa: S311


def _refusal(session_id: uuid.UUID, info: SessionInfo) -> ErrorInfo:
    """Why a session the index no longer holds, or one that is not a Main,
    cannot take a message: ``not_allowed`` for a branch or worker (whatever
    its state), ``session_not_active`` for a Main that ended."""
    if info.kind is not SessionKind.MAIN:
        return ErrorInfo(
            code=ErrorCode.NOT_ALLOWED,
            message=f"session {session_id} is a {info.kind.value}; only mains take "
            "messages (context reaches children only at spawn)",
        )
    return ErrorInfo(
        code=ErrorCode.SESSION_NOT_ACTIVE,
        message=f"session {session_id} ended ({info.state.value}); the message was not delivered",
    )


async def _as_first(first: Sent) -> ErrorInfo | None:
    """A repeat of a keyed send whose first is not yet accepted: answered as the
    first is, once its inbox write is done (awaited after the first's own rest,
    which sets the answer)."""
    assert first.written is not None  # set as the first's write was made
    await first.written
    return first.answer


class Messages:
    """Hands messages to sessions (Cortex thread)."""

    def __init__(self, tree: Tree, commits: Commits) -> None:
        self.tree = tree
        self.commits = commits

    def send(
        self,
        session_id: uuid.UUID,
        message: object,
        *,
        unwedge: uuid.UUID | None = None,
        trace: str | None = None,
        message_id: uuid.UUID | None = None,
        request_id: str | None = None,
    ) -> object:
        """Queue an inbound message for a Main (one message cycle). With a store it
        is written to the Main's inbox first and accepted once durable (with
        ``unwedge``, the held-back item it requeues is dropped in that commit).
        It gets an identity (``message_id``, else a new one) that its cycle's
        conversation appends are keyed by. ``request_id``: the sender's
        idempotency key: a repeat while the first is in the inbox (accepted, its
        cycle not yet run) queues nothing and is answered as the first was (once
        that is known: ``_as_first``)."""
        tree = self.tree
        entry = tree.entry(session_id)
        if entry is None:  # ended before a restart or evicted: answered as if indexed
            return _refusal(session_id, tree.known(session_id).info)
        if entry.kind is not SessionKind.MAIN:
            return _refusal(session_id, entry.info)
        if entry.state.is_terminal or entry.cancel_code is not None:
            return ErrorInfo(
                code=ErrorCode.SESSION_NOT_ACTIVE,
                message=f"session {session_id} is stopping or ended ({entry.state.value}); "
                "the message was not delivered",
            )
        if tree.closing:
            return ErrorInfo(code=ErrorCode.NODE_CLOSED, message="node is shutting down")
        if request_id is not None and entry.sent is not None:
            first = entry.sent.get(request_id)
            if first is not None:
                return first.answer if first.done else _as_first(first)
        seq = entry.next_seq
        fresh = message_id is None  # no run of it can have written anything yet
        mid = message_id or uuid.UUID(int=_IDS.getrandbits(128), version=4)
        try:
            future = tree.persist.inbound(
                entry, seq, message, tree.now(), mid, unwedge, request_id=request_id
            )
        except RejectedInputError as exc:
            raise RejectedInputError(str(exc), field="message") from exc
        tree.note_input(entry)
        sent = None
        if request_id is not None:
            sent = Sent(mid)
            if entry.sent is None:
                entry.sent = {}
            entry.sent[request_id] = sent
        if future is None:
            tree.post(entry, Inbound(message, trace=trace, id=mid, fresh=fresh))
            if sent is not None:
                sent.answered(None)
            return None
        entry.next_seq += 1
        entry.inflight += 1
        inbound = Inbound(message, seq, trace=trace, id=mid, fresh=fresh)
        written = self.commits.durable(future)
        if sent is not None:
            sent.written = written
        return self._accepted(entry, written, inbound, sent, request_id)

    async def _accepted(
        self,
        entry: TreeEntry,
        written: Written,
        inbound: Inbound,
        sent: Sent | None,
        request_id: str | None,
    ) -> ErrorInfo | None:
        """The rest of a send: once the message is in the Main's stored inbox, its
        cycle is queued (behind a held-back replay, if the Main has one); the
        answer is None, or why it was not accepted."""
        error = await written
        tree = self.tree
        session_id = entry.session_id
        entry.inflight -= 1
        answer: ErrorInfo | None = None
        if error is not None:
            tree.store_failed(error)
            answer = store_error(error, session_id)
        elif entry.state.is_terminal or entry.cancel_code is not None:
            answer = ErrorInfo(
                code=ErrorCode.SESSION_NOT_ACTIVE,
                message=f"session {session_id} ended before the message was accepted",
            )
        elif tree.held_reason is not None and session_id in tree.held:
            tree.held[session_id].append(inbound)  # runs after the held replay, once released
        else:
            tree.post(entry, inbound)
        if sent is not None:
            if answer is not None and entry.sent is not None:  # refused: a retry may pass
                entry.sent.pop(request_id or "", None)
            sent.answered(answer)
        return answer

    def redeliver(self, session_id: uuid.UUID, result: SessionResult, unwedge: uuid.UUID) -> object:
        """Run a Main's cycle for a child result recovery held back (filed on it
        already) once the held-back item is durably dropped."""
        tree = self.tree
        entry = tree.lookup(session_id)
        if entry.kind is not SessionKind.MAIN or entry.state.is_terminal:
            return ErrorInfo(
                code=ErrorCode.SESSION_NOT_ACTIVE,
                message=f"session {session_id} is not a live Main; its result cannot run again",
            )
        future = tree.persist.unwedge(unwedge)
        if future is None:
            self._deliver(entry, result)
            return None
        return self._redelivered(entry, result, self.commits.durable(future))

    async def _redelivered(
        self, entry: TreeEntry, result: SessionResult, written: Written
    ) -> ErrorInfo | None:
        error = await written
        if error is not None:
            self.tree.store_failed(error)
            return store_error(error, entry.session_id)
        if not entry.state.is_terminal:
            self._deliver(entry, result)
        return None

    def _deliver(self, entry: TreeEntry, result: SessionResult) -> None:
        with entry.core.cond:
            entry.core.unclaimed[result.session_id] = result
        self.tree.post(entry, Deliver(result))

    def progress(self, session_id: uuid.UUID, note: str, data: dict[str, Any]) -> None:
        """A session's progress note: kept (an expiry reports it) and emitted."""
        entry = self.tree.entries.get(session_id)
        if entry is None or entry.state.is_terminal:
            return
        entry.last_progress = (note, data)
        self.tree.emit(EventKind.PROGRESS, entry, data={"note": note, **data})

    def cycle_started(self, started: CycleStarted) -> None:
        """A traced Main's cycle started: emitted (its span begins)."""
        entry = self.tree.entries.get(started.session_id)
        if entry is None:
            return
        data: dict[str, Any] = {"cycle": started.cycle, "trace": started.trace}
        if started.parent is not None:
            data["parent_trace"] = started.parent
        if started.cut_off is not None:
            data["cut_off"] = started.cut_off
        self.tree.emit(EventKind.CYCLE_STARTED, entry, data=data, at=started.at)

    def child_update(self, session_id: uuid.UUID, message: Any) -> None:
        """A child's ``send_to_parent``: onto the parent's updates, if both still run."""
        entry = self.tree.entries.get(session_id)
        if entry is None or entry.state.is_terminal or entry.parent is None:
            return
        parent = entry.parent
        if parent.state.is_terminal:
            return
        parent.core.add_update(session_id, message)
        self.tree.emit(EventKind.CHILD_UPDATE, entry, data={"to": str(parent.session_id)})
