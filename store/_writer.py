"""The one writer thread: every write transaction of a store, with group commit.

Callers hand a ``WriteBatch`` to ``Writer.submit`` (a
``concurrent.futures.Future``), ``Writer.write`` (blocks) or ``Writer.awrite``
(awaits); the writer takes every batch queued at that moment into one
transaction and one (synced) commit, then acknowledges them. A batch is
acknowledged only once that commit returned, yet concurrent writers share
it, so durable writes per second far exceed the disk's fsync rate. Batches
commit, and are acknowledged, in submission order.

Speed (``benchmarks/bench_store.py``): under load the acknowledgments of
one commit go out after the next group's puts, right before its commit, so
the woken callers run while that fsync is in flight (each put drops the
GIL, and woken callers grabbing it there made puts slow); ``write`` waits on
a bare lock instead of a Future; ``awrite`` wakes each event loop once per
commit (one ``call_soon_threadsafe`` for all its batches), not per batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lmdb
import msgspec

from sessiontree.protocol import (
    Branch,
    ConversationState,
    Message,
    RejectedInputError,
    SessionResult,
    StoreError,
    StoreFullError,
)
from sessiontree.store._io import StoreIO
from sessiontree.store._records import (
    BranchRecord,
    ConversationRecord,
    InboxRecord,
    MemoryIdRecord,
    MemoryRecord,
    MessageRecord,
    OutboxRecord,
    QuarantineRecord,
    ReceivedRecord,
    SessionRecord,
    encode_record,
)

__all__ = [
    "WriteBatch",
    "Writer",
    "branch_key",
    "inbox_key",
    "memory_key",
    "pair_key",
    "platform_key",
]

log = logging.getLogger("sessiontree.store")

_MAX_GROUP = 2048  # batches in one transaction
_MAX_GROUP_BYTES = 32 << 20

# (put | delete | delete_if | delete_prefix | expect | expect_absent, db, key, value)
Op = tuple[str, str, bytes, bytes]


class PreconditionFailedError(Exception):
    """A batch's ``expect`` did not hold at commit time (the writer fails that batch alone)."""


def _encoded(record: msgspec.Struct) -> bytes:
    """``record``'s stored bytes; ``RejectedInputError`` naming its type if msgpack
    cannot hold a value in it."""
    try:
        return encode_record(record)
    except (TypeError, msgspec.EncodeError) as exc:
        msg = f"cannot store a {type(record).__name__}: {exc}"
        raise RejectedInputError(msg, field="value") from exc


def pair_key(first: uuid.UUID, second: uuid.UUID) -> bytes:
    return first.bytes + second.bytes


def inbox_key(session_id: uuid.UUID, seq: int) -> bytes:
    return session_id.bytes + seq.to_bytes(8, "big")


def memory_key(agent_id: str, key: str) -> bytes:
    return f"{agent_id}\x00{key}".encode()


def branch_key(session_id: uuid.UUID, number: int) -> bytes:
    return session_id.bytes + number.to_bytes(4, "big")


def platform_key(session_id: uuid.UUID, platform_id: str) -> bytes:
    return session_id.bytes + platform_id.encode()


def main_key(agent_id: str, key: str) -> bytes:
    return f"{agent_id}\x00{key}".encode()


@dataclass
class WriteBatch:
    """Writes that commit together or not at all. Values are encoded as they
    are added (on the caller's thread); a value msgpack cannot hold raises
    ``RejectedInputError`` there, before anything is queued."""

    ops: list[Op] = field(default_factory=list)
    size: int = 0

    def _put(self, db: str, key: bytes, record: msgspec.Struct) -> None:
        value = _encoded(record)
        self.ops.append(("put", db, key, value))
        self.size += len(key) + len(value)

    def expect(self, db: str, key: bytes, value: bytes | None) -> WriteBatch:
        """Commit this batch only if ``key`` holds ``value`` (None: is absent) when
        the writer reaches it; otherwise the batch fails, alone, with ``StoreError``
        (a write built on an earlier write that failed must not land)."""
        if value is None:
            self.ops.append(("expect_absent", db, key, b""))
        else:
            self.ops.append(("expect", db, key, value))
        return self

    def _delete(self, db: str, key: bytes, *, prefix: bool = False) -> None:
        self.ops.append(("delete_prefix" if prefix else "delete", db, key, b""))

    def __bool__(self) -> bool:
        return bool(self.ops)

    def extend(self, other: WriteBatch) -> WriteBatch:
        """Add ``other``'s writes after these (they then commit together)."""
        self.ops.extend(other.ops)
        self.size += other.size
        return self

    # -- sessions and the tree ------------------------------------------------

    def session(self, record: SessionRecord) -> WriteBatch:
        """Write (or overwrite) a session's record."""
        self._put("sessions", record.info.session_id.bytes, record)
        return self

    def link(self, parent_id: uuid.UUID, child_id: uuid.UUID) -> WriteBatch:
        """Add ``child_id`` under ``parent_id`` in the tree index."""
        self.ops.append(("put", "children", pair_key(parent_id, child_id), b""))
        return self

    def main(self, agent_id: str, key: str, session_id: uuid.UUID) -> WriteBatch:
        """Point (agent, session key) at its Main."""
        self.ops.append(("put", "mains", main_key(agent_id, key), session_id.bytes))
        return self

    def forget_main(self, agent_id: str, key: str, session_id: uuid.UUID) -> WriteBatch:
        """Drop (agent, session key) -> Main, unless by commit time it names another
        Main (a newer one took the key meanwhile)."""
        self.ops.append(("delete_if", "mains", main_key(agent_id, key), session_id.bytes))
        return self

    def forget_session(self, session_id: uuid.UUID) -> WriteBatch:
        """Delete a session's record, its links to children and its filed results."""
        self._delete("sessions", session_id.bytes)
        self._delete("children", session_id.bytes, prefix=True)
        self._delete("received", session_id.bytes, prefix=True)
        self._delete("inbox", session_id.bytes, prefix=True)
        self._delete("conversations", session_id.bytes)
        self._delete("branches", session_id.bytes, prefix=True)
        self._delete("messages", session_id.bytes, prefix=True)
        self._delete("platform_ids", session_id.bytes, prefix=True)
        return self

    def unlink(self, parent_id: uuid.UUID, child_id: uuid.UUID) -> WriteBatch:
        self._delete("children", pair_key(parent_id, child_id))
        return self

    def ended(
        self, record: SessionRecord, parent_id: uuid.UUID, *, parent_ended: bool
    ) -> WriteBatch:
        """A terminal session's record (``session``) and the result it owes its
        parent: filed on the parent's record if ``parent_ended`` (``file``), else
        in the outbox (``owe``). Both are encoded before either is added, so
        ``RejectedInputError`` leaves the batch as it was. (One call for the
        writes of most endings: a cascade makes tens of thousands.)"""
        result = record.result
        if result is None:
            msg = f"session {record.info.session_id}: an ending's record carries its result"
            raise RejectedInputError(msg, field="result")
        child = record.info.session_id.bytes
        value = _encoded(record)
        if parent_ended:
            db, key = "received", parent_id.bytes + child
            owed = _encoded(ReceivedRecord(result=result))
        else:
            db, key = "outbox", child
            owed = _encoded(OutboxRecord(parent_id=parent_id, result=result))
        ops = self.ops
        ops.append(("put", "sessions", child, value))
        ops.append(("put", db, key, owed))
        self.size += len(child) + len(value) + len(key) + len(owed)
        return self

    # -- results ------------------------------------------------------------------

    def owe(self, parent_id: uuid.UUID, result: SessionResult) -> WriteBatch:
        """Put a result owed to ``parent_id`` in the outbox."""
        self._put(
            "outbox", result.session_id.bytes, OutboxRecord(parent_id=parent_id, result=result)
        )
        return self

    def receipt(self, child_id: uuid.UUID) -> WriteBatch:
        """The parent has recorded the child's result: drop it from the outbox."""
        self._delete("outbox", child_id.bytes)
        return self

    def file(self, parent_id: uuid.UUID, result: SessionResult) -> WriteBatch:
        """File a child's result on its parent's record."""
        self._put("received", pair_key(parent_id, result.session_id), ReceivedRecord(result=result))
        return self

    # -- a Main's inbound messages ---------------------------------------------

    def inbox(self, record: InboxRecord) -> WriteBatch:
        self._put("inbox", inbox_key(record.session_id, record.seq), record)
        return self

    def consumed(self, session_id: uuid.UUID, seq: int) -> WriteBatch:
        self._delete("inbox", inbox_key(session_id, seq))
        return self

    def clear_inbox(self, session_id: uuid.UUID) -> WriteBatch:
        self._delete("inbox", session_id.bytes, prefix=True)
        return self

    # -- conversations ---------------------------------------------------------------

    def conversation(self, state: ConversationState) -> WriteBatch:
        """Write a conversation's bookkeeping (its branches go separately: ``branch``)."""
        header = msgspec.structs.replace(state, branches=[])
        self._put("conversations", state.session_id.bytes, ConversationRecord(state=header))
        return self

    def branch(self, session_id: uuid.UUID, branch: Branch) -> WriteBatch:
        """Write one branch of a conversation."""
        record = BranchRecord(session_id=session_id, branch=branch)
        self._put("branches", branch_key(session_id, branch.number), record)
        return self

    def drop_branch(self, session_id: uuid.UUID, number: int) -> WriteBatch:
        """Delete one branch of a conversation (its messages go with ``drop_message``)."""
        self._delete("branches", branch_key(session_id, number))
        return self

    def message(self, session_id: uuid.UUID, message: Message) -> WriteBatch:
        """Write (or overwrite) one conversation message, and its platform id's entry."""
        record = MessageRecord(session_id=session_id, message=message)
        self._put("messages", pair_key(session_id, message.id), record)
        if message.platform_id is not None:
            key = platform_key(session_id, message.platform_id)
            self.ops.append(("put", "platform_ids", key, message.id.bytes))
        return self

    def drop_message(self, session_id: uuid.UUID, message: Message) -> WriteBatch:
        """Delete one conversation message, and its platform id's entry if it still names it."""
        self._delete("messages", pair_key(session_id, message.id))
        if message.platform_id is not None:
            key = platform_key(session_id, message.platform_id)
            self.ops.append(("delete_if", "platform_ids", key, message.id.bytes))
        return self

    # -- shared memory, quarantine, raw ---------------------------------------------

    def memory(self, record: MemoryRecord) -> WriteBatch:
        self._put("memory", memory_key(record.agent_id, record.key), record)
        self._put(
            "memory_ids",
            record.memory_id.encode(),
            MemoryIdRecord(agent_id=record.agent_id, key=record.key),
        )
        return self

    def quarantine(self, record: QuarantineRecord) -> WriteBatch:
        """Move an unreadable value aside (and delete it where it was)."""
        self._put("quarantine", record.db.encode() + b"\x00" + record.key, record)
        self._delete(record.db, record.key)
        return self

    def raw(self, db: str, key: bytes, value: bytes) -> WriteBatch:
        """Put bytes as they are (import, tests); the caller vouches for them."""
        self.ops.append(("put", db, key, value))
        self.size += len(key) + len(value)
        return self


@dataclass(slots=True)
class _Job:
    """One queued batch and the way its caller is told: ``future`` (``submit``,
    ``run_alone``), ``done`` (``write``: a lock released once settled, with
    ``error`` set on failure) or ``waiter`` on ``loop`` (``awrite``)."""

    ops: list[Op]
    size: int
    future: concurrent.futures.Future[None] | None = None
    action: Callable[[], None] | None = None  # run alone, with no transaction open
    done: threading.Lock | None = None
    waiter: asyncio.Future[None] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    error: BaseException | None = None

    def take(self) -> bool:
        """The writer takes the batch: False if its future was cancelled (then
        nothing of it is written); once taken it cannot be cancelled."""
        return self.future is None or self.future.set_running_or_notify_cancel()


def _wake(jobs: list[_Job], error: BaseException | None) -> None:
    """On an event loop: resolve the ``awrite`` waiters of one commit."""
    for job in jobs:
        waiter = job.waiter
        if waiter is not None and not waiter.done():  # done: the caller was cancelled
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)


class Writer:
    """The writer thread of one store. ``submit`` may be called from any thread."""

    def __init__(
        self,
        env: lmdb.Environment,
        dbs: dict[str, lmdb._Database],
        io: StoreIO,
        name: str,
        *,
        group_commit: bool = True,
    ) -> None:
        self._env = env
        self._max_group = _MAX_GROUP if group_commit else 1
        self._dbs = dbs
        self._io = io
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self.commits = 0
        self.batches = 0
        self.errors = 0
        self.full = 0
        self.on_commit: Callable[[], None] | None = None
        self._commit_observers: tuple[Callable[[float, int], None], ...] = ()
        self._observers_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def observe_commits(self, observer: Callable[[float, int], None]) -> Callable[[], None]:
        """Call ``observer(seconds, batches)`` on the writer thread after every
        successful commit: the transaction's duration (puts to durable commit)
        and how many batches shared it. It must be quick; a raise is logged and
        ignored. Returns a function that removes the observer (idempotent)."""
        with self._observers_lock:
            self._commit_observers = (*self._commit_observers, observer)

        def unsubscribe() -> None:
            with self._observers_lock:
                self._commit_observers = tuple(
                    o for o in self._commit_observers if o is not observer
                )

        return unsubscribe

    def submit(self, batch: WriteBatch) -> concurrent.futures.Future[None]:
        """Queue ``batch``; the future resolves once it is durably committed, or
        fails with ``StoreFullError`` / ``StoreError`` (nothing of it written).
        Cancelling the future before the writer takes the batch withdraws it."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._enqueue(_Job(list(batch.ops), batch.size, future))
        return future

    def write(self, batch: WriteBatch, timeout: float | None) -> None:
        """Queue ``batch`` and block until it is durably committed; raise
        ``StoreFullError`` / ``StoreError`` (nothing of it written), or
        ``TimeoutError`` after ``timeout`` seconds (it may still commit)."""
        done = threading.Lock()
        done.acquire()
        job = _Job(list(batch.ops), batch.size, done=done)
        self._enqueue(job)
        if not done.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            msg = f"the store did not acknowledge the write within {timeout} s"
            raise TimeoutError(msg)
        if job.error is not None:
            raise job.error

    async def awrite(self, batch: WriteBatch) -> None:
        """``write`` for a coroutine (the loop is never blocked). Cancelling the
        caller stops its wait only: the batch may still commit."""
        await self.submit_awaitable(batch)

    def submit_awaitable(self, batch: WriteBatch) -> asyncio.Future[None]:
        """Queue ``batch`` now (call on a running event loop) and return a future
        of that loop that resolves once it is durably committed (or fails)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._enqueue(_Job(list(batch.ops), batch.size, waiter=waiter, loop=loop))
        return waiter

    def run_alone(self, action: Callable[[], None]) -> concurrent.futures.Future[None]:
        """Run ``action`` on the writer thread between transactions (e.g. growing the map)."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._enqueue(_Job([], 0, future, action))
        return future

    def _enqueue(self, job: _Job) -> None:
        with self._close_lock:
            if self._closed:
                self._settle([job], StoreError("the store is closed"))
                return
            self._queue.put(job)

    def close(self, timeout: float = 30.0) -> None:
        """Commit what is queued, then stop the thread (idempotent)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout)

    # -- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        committed: list[_Job] = []  # committed, not yet acknowledged (see _transact)
        stop = False
        while not stop:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                self._acknowledge(committed)  # no next group to overlap with: tell them now
                job = self._queue.get()
            if job is None:
                break
            if job.action is not None:
                self._acknowledge(committed)
                self._run_action(job)
                continue
            if not job.take():
                continue
            group, size, pending = [job], job.size, None
            while len(group) < self._max_group and size < _MAX_GROUP_BYTES:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                if more.action is not None:
                    pending = more
                    break
                if more.take():
                    group.append(more)
                    size += more.size
            committed = self._commit(group, committed)
            if pending is not None:
                self._acknowledge(committed)
                self._run_action(pending)
        self._acknowledge(committed)

    def _acknowledge(self, committed: list[_Job]) -> None:
        """Tell the callers of committed batches (and empty the list)."""
        if committed:
            self._settle(committed, None)
            committed.clear()

    def _settle(self, jobs: list[_Job], error: BaseException | None) -> None:
        """Tell each job's caller its outcome: ``error`` None = durably committed.
        ``awrite`` callers are woken with one callback per event loop."""
        loops: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        for job in jobs:
            if job.loop is not None:
                loops.setdefault(job.loop, []).append(job)
            elif job.done is not None:
                job.error = error
                job.done.release()
            elif job.future is not None:
                if error is None:
                    job.future.set_result(None)
                else:
                    job.future.set_exception(error)
        for loop, waiting in loops.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_wake, waiting, error)

    def _run_action(self, job: _Job) -> None:
        assert job.action is not None
        assert job.future is not None
        if not job.take():
            return
        try:
            job.action()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, the writer goes on
            job.future.set_exception(exc)
        else:
            job.future.set_result(None)

    def _commit(self, group: list[_Job], committed: list[_Job]) -> list[_Job]:
        """Commit ``group`` (``committed``, the previous commit's batches, are
        acknowledged on the way, see ``_transact``); return the batches now
        committed and not yet acknowledged. Failures are told at once."""
        started = time.perf_counter()  # measurement only: never drives behaviour
        try:
            self._transact(group, committed)
        except PreconditionFailedError as exc:
            if len(group) > 1:  # the others may hold: each alone
                for job in group:
                    committed = self._commit([job], committed)
                return committed
            self.errors += 1
            self._settle(group, StoreError(f"the write was refused: {exc}"))
            return []
        except lmdb.MapFullError:
            if len(group) > 1:  # find the batch that does not fit; the others may
                for job in group:
                    committed = self._commit([job], committed)
                return committed
            self.full += 1
            self.errors += 1
            self._settle(
                group,
                StoreFullError(
                    "the store's map is full; the write was rolled back whole "
                    "(grow it with Store.grow, see the README)"
                ),
            )
            return []
        except Exception as exc:  # noqa: BLE001 - OSError, lmdb.Error, or a bug (an unknown db, a
            # raising I/O layer): the batches fail, the writer thread must live on
            self.errors += 1
            log.error("store commit failed (%d batches not acknowledged): %r", len(group), exc)
            self._settle(group, StoreError(f"the store could not commit: {exc!r}"))
            return []
        elapsed = time.perf_counter() - started
        self.commits += 1
        self.batches += len(group)
        if self.on_commit is not None:
            self.on_commit()
        for observer in self._commit_observers:
            try:
                observer(elapsed, len(group))
            except Exception:  # an observer's bug must not stop the writer
                log.exception("commit observer %r raised; ignored", observer)
        return group

    def _transact(self, group: list[_Job], committed: list[_Job]) -> None:
        """One transaction for ``group``. ``committed`` (already durable) are
        acknowledged after this group's puts, right before its commit: the
        callers they wake then run while the fsync is in flight, not during the
        puts (each drops the GIL, and woken callers took it from the writer
        there). If this transaction fails they are acknowledged all the same."""
        io, dbs = self._io, self._dbs
        txn: lmdb.Transaction | None = None
        try:
            txn = io.begin(self._env)
            for job in group:
                for kind, db_name, key, value in job.ops:
                    db = dbs[db_name]
                    if kind == "put":
                        io.put(txn, db, key, value)
                    elif kind == "delete":
                        io.delete(txn, db, key)
                    elif kind == "delete_if":  # only while it still holds ``value``
                        if txn.get(key, db=db) == value:
                            io.delete(txn, db, key)
                    elif kind in ("expect", "expect_absent"):
                        found = txn.get(key, db=db)
                        if (found is None) != (kind == "expect_absent") or (
                            found is not None and found != value
                        ):
                            msg = f"{db_name} {key.hex()} changed since the write was built"
                            raise PreconditionFailedError(msg)
                    else:
                        _delete_prefix(io, txn, db, key)
            self._acknowledge(committed)
            io.commit(txn)
        except BaseException:
            self._acknowledge(committed)  # durable already, whatever becomes of this group
            if txn is not None:
                txn.abort()
            raise


def _delete_prefix(io: StoreIO, txn: lmdb.Transaction, db: Any, prefix: bytes) -> None:
    with txn.cursor(db=db) as cursor:
        keys = []
        if cursor.set_range(prefix):
            for raw in cursor.iternext(keys=True, values=False):
                key = bytes(raw)
                if not key.startswith(prefix):
                    break
                keys.append(key)
    for key in keys:
        io.delete(txn, db, key)
