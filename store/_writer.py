"""The one writer thread: every write transaction of a store, with group commit.

Callers hand a ``WriteBatch`` to ``Writer.submit`` (a
``concurrent.futures.Future``), ``Writer.write`` (blocks) or ``Writer.awrite``
(awaits); the writer takes every batch queued at that moment into one
transaction and one (synced) commit, then acknowledges them. A batch is
acknowledged only once that commit returned, yet concurrent writers share
it, so durable writes per second far exceed the disk's fsync rate. Batches
commit, and are acknowledged, in submission order.

*Fencing*: once the store is open (``fence_at``), every transaction first
reads the store's ``incarnation`` (in the ``meta`` record, bumped by every
writer's open): a different one means another process opened the store
since, and this handle is stale. The group fails with ``StoreFencedError``,
nothing of it written, and so does every write after it (``fenced``): the
writer never writes again. A batch may also name a slot's epoch
(``WriteBatch.in_slot``): a slot at another epoch fails that batch alone,
with ``StoreFencedError`` naming the slot.

A *lazy* batch (``submit(batch, lazy=True)``: a write nobody waits on yet)
does not start a commit by itself: it is carried along with the next batch
someone waits on (any other submission, ``hurry``, ``flush``), or committed
``linger`` seconds (default 1) after it was queued, whichever comes first. Inside a
tree most writes are lazy (a child's record, a Main's cycle mark and
snapshot), so a tree costs the commits of what leaves the process only.

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
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lmdb
import msgspec

from sessiontree.protocol import StoreError, StoreFencedError, StoreFullError
from sessiontree.store._batch import Op, WriteBatch
from sessiontree.store._env import CORRUPTION, damaged_by
from sessiontree.store._io import StoreIO

__all__ = ["PreconditionFailedError", "Writer"]

log = logging.getLogger("sessiontree.store")

_MAX_GROUP = 2048  # batches in one transaction
_MAX_GROUP_BYTES = 32 << 20


class PreconditionFailedError(Exception):
    """A batch's ``expect`` did not hold at commit time (the writer fails that batch alone)."""


class _SlotMovedError(PreconditionFailedError):
    """A batch's ``in_slot`` epoch did not hold at commit time."""

    def __init__(self, message: str, slot: int) -> None:
        super().__init__(message)
        self.slot = slot


class _IncarnationMovedError(Exception):
    """The store's incarnation is not this writer's: another process opened it."""


class _Incarnation(msgspec.Struct):
    """The one field of the ``meta`` record each commit reads (others are skipped)."""

    incarnation: int = 0


class _Epoch(msgspec.Struct):
    """The one field of a ``slots`` record an ``in_slot`` check reads."""

    epoch: int = 0


_INCARNATION = msgspec.msgpack.Decoder(_Incarnation)
_EPOCH = msgspec.msgpack.Decoder(_Epoch)


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
    lazy: bool = False

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
        linger: float = 1.0,
    ) -> None:
        self._env = env
        self._max_group = _MAX_GROUP if group_commit else 1
        self._linger = linger
        self._dbs = dbs
        self._io = io
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self.commits = 0
        self.batches = 0
        self.errors = 0
        self.full = 0
        self.refusing = False  # the last commit failed (a full map, an I/O error, fenced)
        self.incarnation: int | None = None  # checked in every transaction once set
        self.fenced: StoreFencedError | None = None  # set once: every later write fails with it
        self.on_commit: Callable[[], None] | None = None
        self._commit_observers: tuple[Callable[[float, int], None], ...] = ()
        self._observers_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def fence_at(self, incarnation: int) -> None:
        """From the next transaction on, commit only while the store's
        incarnation is ``incarnation`` (the one this process's open wrote)."""
        self.incarnation = incarnation

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

    def submit(self, batch: WriteBatch, *, lazy: bool = False) -> concurrent.futures.Future[None]:
        """Queue ``batch``; the future resolves once it is durably committed, or
        fails with ``StoreFullError`` / ``StoreError`` (nothing of it written).
        Cancelling the future before the writer takes the batch withdraws it.
        ``lazy``: carried along with the next write someone waits on (see the
        module's docstring); whoever comes to wait for it calls ``hurry``."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._enqueue(_Job(list(batch.ops), batch.size, future, lazy=lazy))
        return future

    def hurry(self) -> None:
        """Commit the lazy batches queued so far now rather than at their linger's end."""
        self._enqueue(_Job([], 0))

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

    def transact_alone(
        self, work: Callable[[lmdb.Transaction], None]
    ) -> concurrent.futures.Future[None]:
        """Run ``work`` in a write transaction of its own on the writer thread,
        between group commits, fenced as they are: refused once this handle is
        fenced, and fencing it when another process opened the store since
        (``StoreFencedError``; nothing written). What ``work`` raises aborts
        the transaction and fails the future."""

        def action() -> None:
            if self.fenced is not None:
                raise self.fenced
            with self._env.begin(write=True) as txn:  # aborted by a raise
                if self.incarnation is not None:
                    try:
                        self._check_incarnation(txn)
                    except _IncarnationMovedError as moved:
                        self._fence([], moved)
                        assert self.fenced is not None
                        raise self.fenced from None
                work(txn)

        return self.run_alone(action)

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
        carried: list[_Job] = []  # lazy batches waiting for a commit someone waits on
        size = 0  # their bytes
        due = 0.0  # when the first of them must commit (monotonic seconds)
        stop = False
        while not stop:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                self._acknowledge(committed)  # no next group to overlap with: tell them now
                try:
                    wait = max(0.0, due - time.monotonic()) if carried else None
                    job = self._queue.get(timeout=wait)
                except queue.Empty:  # the linger is over: commit them as they are
                    committed = self._commit(carried, committed)
                    carried, size = [], 0
                    continue
            if job is None:
                break
            if job.action is not None:
                if carried:  # queued before the action: committed before it runs
                    committed = self._commit(carried, committed)
                    carried, size = [], 0
                self._acknowledge(committed)
                self._run_action(job)
                continue
            if not job.take():
                continue
            if not carried:
                due = time.monotonic() + self._linger
            group = carried
            group.append(job)
            size += job.size
            size, urgent, stop, pending = self._gather(group, size)
            urgent = urgent or not job.lazy
            full = len(group) >= self._max_group or size >= _MAX_GROUP_BYTES
            if urgent or full or stop or pending is not None:
                committed = self._commit(group, committed)
                carried, size = [], 0
            else:
                carried = group
            if pending is not None:
                self._acknowledge(committed)
                self._run_action(pending)
        if carried:
            committed = self._commit(carried, committed)
        self._acknowledge(committed)

    def _gather(self, group: list[_Job], size: int) -> tuple[int, bool, bool, _Job | None]:
        """Add what is queued now to ``group`` (up to a group's limits); return its
        size, whether a batch in it is waited on (not lazy), whether ``close``
        was met, and an action met (it runs after the group commits)."""
        urgent = stop = False
        pending = None
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
                urgent = urgent or not more.lazy
        return size, urgent, stop, pending

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
        committed and not yet acknowledged. Failures are told at once. A group
        with nothing to write (``hurry``, ``flush`` alone) needs no transaction."""
        if not any(job.ops for job in group):
            self._acknowledge(committed)
            self._settle(group, None)
            return []
        if self.fenced is not None:  # a stale handle: it never writes again
            self._acknowledge(committed)
            self.errors += 1
            self._settle(group, self.fenced)
            return []
        started = time.perf_counter()  # measurement only: never drives behaviour
        try:
            self._transact(group, committed)
        except PreconditionFailedError as exc:
            if len(group) > 1:  # the others may hold: each alone
                for job in group:
                    committed = self._commit([job], committed)
                return committed
            self.errors += 1
            refused: StoreError = StoreError(f"the write was refused: {exc}")
            if isinstance(exc, _SlotMovedError):
                refused = StoreFencedError(str(exc), path=self._env.path(), slot=exc.slot)
            self._settle(group, refused)
            return []
        except _IncarnationMovedError as exc:
            self._fence(group, exc)
            return []
        except lmdb.MapFullError:
            if len(group) > 1:  # find the batch that does not fit; the others may
                for job in group:
                    committed = self._commit([job], committed)
                return committed
            self.full += 1
            self.errors += 1
            self.refusing = True
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
            self.refusing = True
            log.error("store commit failed (%d batches not acknowledged): %r", len(group), exc)
            error: StoreError = StoreError(f"the store could not commit: {exc!r}")
            if isinstance(exc, CORRUPTION):
                error = damaged_by(os.path.join(self._env.path(), "data.mdb"), exc)
            self._settle(group, error)
            return []
        elapsed = time.perf_counter() - started
        self.refusing = False
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

    def _fence(self, group: list[_Job], moved: _IncarnationMovedError) -> None:
        """Another process opened the store: fail ``group`` and every later write."""
        self.errors += 1
        self.refusing = True
        self.fenced = StoreFencedError(
            f"store {self._env.path()} was opened by another process since this one "
            f"opened it ({moved}); this handle is stale and writes nothing more: stop "
            "this node (the other one holds the store now)",
            path=self._env.path(),
        )
        log.error("%s (%d batches not acknowledged)", self.fenced, len(group))
        self._settle(group, self.fenced)

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
            if self.incarnation is not None:
                self._check_incarnation(txn)
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
                    elif kind == "epoch":  # in_slot: the slot is still at this epoch
                        _check_epoch(txn, db, key, value)
                    else:
                        _delete_prefix(io, txn, db, key)
            self._acknowledge(committed)
            io.commit(txn)
        except BaseException:
            self._acknowledge(committed)  # durable already, whatever becomes of this group
            if txn is not None:
                txn.abort()
            raise

    def _check_incarnation(self, txn: lmdb.Transaction) -> None:
        raw = txn.get(b"meta", db=self._dbs["meta"])
        try:
            found = 0 if raw is None else _INCARNATION.decode(raw).incarnation
        except msgspec.DecodeError:  # damage, not a newer holder: the commit fails, not fenced
            msg = "the store's meta record does not decode: cannot check its incarnation"
            raise StoreError(msg) from None
        if found != self.incarnation:
            msg = f"its incarnation is {found}, this process holds {self.incarnation}"
            raise _IncarnationMovedError(msg)


def _check_epoch(txn: lmdb.Transaction, db: Any, key: bytes, value: bytes) -> None:
    """``_SlotMovedError`` unless the slot keyed ``key`` is at the epoch ``value``
    holds (8 bytes, big-endian); a slot without a record is at epoch 0."""
    raw = txn.get(key, db=db)
    slot, want = int.from_bytes(key, "big"), int.from_bytes(value, "big")
    try:
        found = 0 if raw is None else _EPOCH.decode(raw).epoch
    except msgspec.DecodeError:
        msg = f"slot {slot}'s epoch record does not decode"
        raise _SlotMovedError(msg, slot) from None
    if found != want:
        msg = f"slot {slot} is at epoch {found}, the write was built for epoch {want}"
        raise _SlotMovedError(msg, slot)


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
