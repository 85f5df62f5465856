"""What the Cortex writes to the store, and when (ARCHITECTURE.md, "Persistence").

- Main: its record at creation, its full context after every message cycle
  (with the inbound message that cycle consumed), its end.
- Branch: a record at spawn, its full context on suspend and on its end.
- Worker: only an index record (identity and state, no task, no context) at
  spawn and at its end, so a restart can still fail it and tell its parent;
  none at all for one its running Branch's skill spawned (that parent does
  not survive a restart) unless the Branch suspends (``snapshot``'s ``late``).

A session's terminal record and the result owed to its parent go in one
batch (the outbox); the parent's next snapshot files the result on the
parent and drops it from the outbox (its receipt). Every method returns the
write's future, or None when the node has no store (nothing to wait for).
Writes are queued in the order the Cortex decides them and commit in that
order. They are queued *lazily*: carried along with the next write someone
waits on; whoever comes to wait for one calls ``hurry``, so a write commits
at once only when somebody is waiting for it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from sessiontree.actors import ContextMessage, SessionContext
from sessiontree.protocol import TERMINAL_STATES, RejectedInputError, SessionKind, SessionResult
from sessiontree.store import (
    CallRecord,
    ContextEntry,
    ContextRecord,
    InboxRecord,
    SessionRecord,
    Store,
    UsageRecord,
    WriteBatch,
)
from sessiontree.supervision._entry import Reserved, TreeEntry

__all__ = ["Persister", "context_from_record"]

log = logging.getLogger("sessiontree.persist")

Future = concurrent.futures.Future[None]


def _context_record(context: SessionContext) -> ContextRecord:
    return ContextRecord(
        system_prompt=context.system_prompt,
        messages=[
            ContextEntry(
                role=m.role,
                content=m.content,
                name=m.name,
                tool_calls=m.tool_calls,
                tool_call_id=m.tool_call_id,
            )
            for m in context.messages
        ],
        tool_results=[dict(r) for r in context.tool_results],
    )


def context_from_record(record: ContextRecord | None) -> SessionContext:
    """The working context a stored record holds (empty when it holds none)."""
    if record is None:
        return SessionContext()
    return SessionContext(
        system_prompt=record.system_prompt,
        messages=[
            ContextMessage(m.role, m.content, m.name, m.tool_calls, m.tool_call_id)
            for m in record.messages
        ],
        tool_results=[dict(r) for r in record.tool_results],
    )


def _finish_like(shared: Future, done: Future) -> None:
    error = done.exception()
    if error is None:
        shared.set_result(None)
    else:
        shared.set_exception(error)


class Persister:
    """Builds and submits the Cortex's writes (called on the Cortex thread only)."""

    def __init__(self, store: Store | None, counters: Any) -> None:
        self.store = store
        self.counters = counters
        self._open: WriteBatch | None = None
        self.shared: Future | None = None
        """While a batch is open: the one future every write submitted returns."""
        # settles whose write the store refused: written again with the next one
        self._unwritten: list[tuple[list[TreeEntry], Reserved]] = []
        self._hurry_at_close = False  # someone waits for the open batch

    def hurry(self) -> None:
        """Someone waits for a write made so far: commit it now (the open batch
        as soon as it is submitted), not at the store's linger."""
        if self.store is None:
            return
        if self._open is not None:
            self._hurry_at_close = True
        else:
            self.store.hurry()

    def open_batch(self) -> None:
        """Until ``close_batch``, every write goes into one batch (one commit, one
        future, ``shared``: if it fails, every write in it failed)."""
        if self.store is not None and self._open is None:
            self._open, self.shared = WriteBatch(), concurrent.futures.Future()

    def close_batch(self) -> None:
        """Submit the open batch; ``shared`` then finishes with its commit."""
        batch, shared = self._open, self.shared
        self._open = self.shared = None
        hurry, self._hurry_at_close = self._hurry_at_close, False
        if batch is None or shared is None:
            return
        if not batch:
            shared.set_result(None)
            if hurry:  # someone waits for a write made before the batch opened
                self.hurry()
            return
        submitted = self._submit(batch)
        assert submitted is not None  # there is a store: a batch is open only then
        submitted.add_done_callback(functools.partial(_finish_like, shared))
        if hurry:
            self.hurry()

    def _record(
        self, entry: TreeEntry, *, context: bool, now: float, resume: bool = False
    ) -> SessionRecord:
        info, state = entry.info, entry.state
        if info.kind is SessionKind.WORKER:  # identity and state: a restart can fail it
            info = msgspec.structs.replace(
                info, state=state, task="", context_summary="", metadata={}, input=None
            )
        elif info.state is not state:
            info = msgspec.structs.replace(info, state=state)
        return SessionRecord(
            info=info,
            context=_context_record(entry.core.context) if context else None,
            result=entry.result,
            updated_at=now,
            resume=resume,
            pressured=entry.pressured,
        )

    def _add_record(
        self, batch: WriteBatch, entry: TreeEntry, *, now: float, resume: bool = False
    ) -> None:
        wants_context = entry.kind is not SessionKind.WORKER
        try:
            batch.session(self._record(entry, context=wants_context, now=now, resume=resume))
        except RejectedInputError:
            # A skill put something msgpack cannot hold straight into its context:
            # keep its state and result, count the context as unstorable.
            self.counters["context_unstorable"] += 1
            log.error(
                "session %s: its context cannot be stored; saved without it", entry.session_id
            )
            batch.session(self._record(entry, context=False, now=now, resume=resume))

    def _receipts(self, batch: WriteBatch, entry: TreeEntry, *, ended: bool) -> None:
        """File the results the session has taken since its last snapshot and drop
        them from the outbox. While it lives, a result it has not yet taken (a
        Main's cycle for it has not run) stays owed, so a restart delivers it."""
        if not entry.receipts:
            return
        core = entry.core
        with core.cond:
            taken = [r for r in entry.receipts if ended or r.session_id not in core.unclaimed]
        if len(taken) == len(entry.receipts):
            entry.receipts.clear()
        else:
            kept = {r.session_id for r in taken}
            entry.receipts[:] = [r for r in entry.receipts if r.session_id not in kept]
        for result in taken:
            batch.file(entry.session_id, result).receipt(result.session_id)

    def _batch(self) -> WriteBatch:
        """Where a write that cannot fail half-way goes: straight into the open
        batch if there is one (a batched spawn, a cascade's endings), else a
        batch of its own. A write that may raise part-way builds its own."""
        return self._open if self._open is not None else WriteBatch()

    def _submit(self, batch: WriteBatch) -> Future | None:
        assert self.store is not None
        if batch is self._open:
            return self.shared
        if self._open is not None:
            self._open.extend(batch)
            return self.shared
        try:
            return self.store.submit(batch, lazy=True)
        except Exception as exc:  # noqa: BLE001 - a closed store: counted, never fails the Cortex
            self.counters["store_write_errors"] += 1
            future: Future = concurrent.futures.Future()
            future.set_exception(exc)
            return future

    # -- the writes ------------------------------------------------------------------

    def created(self, entry: TreeEntry, now: float) -> Future | None:
        """A new session: its record, its link under its parent, a Main's key
        (nothing for one that is not ``recorded``)."""
        if self.store is None or not entry.recorded:
            return None
        batch = self._batch()
        self._add_record(batch, entry, now=now)
        info = entry.info
        if info.parent_id is not None:
            batch.link(info.parent_id, info.session_id)
        if info.kind is SessionKind.MAIN and info.key is not None:
            batch.main(info.agent_id, info.key, info.session_id)
        return self._submit(batch)

    def inbound(
        self,
        entry: TreeEntry,
        seq: int,
        message: Any,
        now: float,
        message_id: uuid.UUID | None = None,
        unwedge: uuid.UUID | None = None,
        request_id: str | None = None,
    ) -> Future | None:
        """An inbound message a Main accepted (dropped by the cycle that runs it);
        ``unwedge``: the held-back item it requeues, dropped in the same commit;
        ``request_id``: the sender's idempotency key, kept with it."""
        if self.store is None:
            return None
        batch = WriteBatch()
        batch.inbox(
            InboxRecord(
                session_id=entry.session_id,
                seq=seq,
                message=message,
                received_at=now,
                id=message_id,
                request_id=request_id,
            )
        )
        if unwedge is not None:
            batch.unwedge(unwedge)
        return self._submit(batch)

    def unwedge(self, wedged_id: uuid.UUID) -> Future | None:
        """Drop a held-back item (requeued, or dropped by the operator)."""
        if self.store is None:
            return None
        return self._submit(WriteBatch().unwedge(wedged_id))

    def snapshot(
        self,
        entry: TreeEntry,
        now: float,
        *,
        consumed: Sequence[int] = (),
        resume: bool = False,
        late: Sequence[TreeEntry] = (),
    ) -> Future | None:
        """A live session's full state: a Main after a cycle (dropping the inbox
        messages ``consumed`` numbers), a Branch on suspend or resume; with the
        receipts of the results it got since the last one. A Branch that
        suspends may come back after a restart, so what it has of children
        never written goes with it: their records (``late``: live ones, and
        ended ones still indexed) and their results (``TreeEntry.unwritten``),
        filed if it took them, owed if not."""
        if self.store is None:
            return None
        batch = WriteBatch()
        for child in late:
            child.recorded = True
            self._add_record(batch, child, now=now)
            batch.link(entry.session_id, child.session_id)
        if entry.unwritten:
            self._file_unwritten(batch, entry)
        self._add_record(batch, entry, now=now, resume=resume)
        for seq in consumed:
            batch.consumed(entry.session_id, seq)
        if entry.kind is SessionKind.MAIN:
            batch.cycle_done(entry.session_id)
        self._receipts(batch, entry, ended=False)
        return self._submit(batch)

    def _file_unwritten(self, batch: WriteBatch, entry: TreeEntry) -> None:
        """File on ``entry`` the results of its never-written children it took;
        owe (in the outbox) those it has not taken, receipted by a later write."""
        core = entry.core
        with core.cond:
            untaken = set(core.unclaimed)
        for result in entry.unwritten:
            if result.session_id in untaken:
                batch.owe(entry.session_id, result)
                entry.receipts.append(result)
            else:
                batch.file(entry.session_id, result)
        entry.unwritten = []

    def call(self, reserved: Reserved, now: float) -> Future | None:
        """A model call about to leave the node, with the worst case it reserved
        (a ``CallRecord``; the call waits until it is durable)."""
        if self.store is None:
            return None
        chain = reserved.chain
        record = CallRecord(
            session_id=chain[0],
            call_id=reserved.call_id,
            chain=chain,
            ask=reserved.ask,
            reserved_at=now,
        )
        return self._submit(self._batch().call(record))

    def usage(self, entries: list[TreeEntry], settled: Reserved | None = None) -> Future | None:
        """What ``entries`` and their subtrees have spent (accounting, whatever
        their kind): after a model call settles (``settled``: its record goes
        in the same commit), or a spawn under a budget. A settle the store
        refused before (``settle_refused``) goes again in this commit: its
        call's record must go with usage that counts it, never without."""
        if self.store is None:
            return None
        if settled is None and not entries:
            return None
        batch = self._batch()
        if self._unwritten:
            for earlier, call in self._unwritten:
                batch.call_done(call.chain[0], call.call_id)
                entries = [*entries, *earlier]
            self._unwritten = []
        if settled is not None:
            batch.call_done(settled.chain[0], settled.call_id)
        for entry in entries:
            ledger = entry.ledger
            if ledger is not None:
                record = UsageRecord(
                    session_id=entry.session_id, own=ledger.own, subtree=ledger.subtree
                )
                batch.usage(record)
        return self._submit(batch)

    def settle_refused(self, entries: list[TreeEntry], settled: Reserved) -> None:
        """The store refused a settle's write (``usage(entries, settled)``): its
        call's record stays until the next usage write, which writes these
        entries' accounts again with it (a record dropped while the usage it
        counts was lost would lose the call; one kept beside usage that counts
        it would count it twice after a restart)."""
        self._unwritten.append((entries, settled))

    def ended(self, entry: TreeEntry, result: SessionResult, now: float) -> Future | None:
        """A terminal state and, in the same batch, the result owed to the parent:
        in the outbox if the parent lives, filed on its record if it has ended.

        Nothing for a session that is not ``recorded``.

        ``RejectedInputError`` if the record cannot be stored even without its
        context."""
        if self.store is None or not entry.recorded:
            return None
        batch = self._batch()
        core = entry.core
        info = core.info
        parent = entry.parent
        if info.kind is SessionKind.WORKER and parent is not None:
            # Most endings: a worker's record (it holds no context to leave out
            # when it cannot be stored) and the result it owes, in one call. A
            # worker has no children, so no receipts.
            record = self._record(entry, context=False, now=now)
            parent_core = parent.core
            batch.ended(
                record, parent_core.session_id, parent_ended=parent_core.state in TERMINAL_STATES
            )
            return self._submit(batch)
        self._add_record(batch, entry, now=now)
        if entry.receipts:
            self._receipts(batch, entry, ended=True)
        if info.kind is SessionKind.MAIN:
            batch.clear_inbox(core.session_id)
        if parent is not None:
            if parent.core.state in TERMINAL_STATES:
                batch.file(parent.core.session_id, result)
            else:
                batch.owe(parent.core.session_id, result)
        return self._submit(batch)
