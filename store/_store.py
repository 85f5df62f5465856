"""``Store``: one LMDB environment per node — its writer thread and its reads.

``Store`` is the one object the rest of the runtime holds. It opens the
environment (``_env``), hands every write to its writer thread
(``_writer``, batches built with ``_batch``) and answers reads through
``Reads`` (``_reads``: short read transactions on the caller's thread, and
the bookkeeping growing the map needs); the conversation reads that span
several entries are in ``_conversation_reads``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import lmdb
import msgspec

from sessiontree.protocol import (
    ConversationState,
    CorruptRecordError,
    Message,
    SessionResult,
    StoreError,
    StoreFencedError,
)
from sessiontree.store._backup import Backup, copy_env
from sessiontree.store._batch import WriteBatch
from sessiontree.store._conversation_reads import conversation_read, walk
from sessiontree.store._env import (
    DEFAULT_MAP_SIZE,
    DEFAULT_MAX_READERS,
    LIVE_INDEXED,
    close_env,
    open_env,
    process_id,
)
from sessiontree.store._io import StoreIO
from sessiontree.store._keys import main_key, memory_key, pair_key, platform_key
from sessiontree.store._live import index_live
from sessiontree.store._meta import open_meta, read_meta
from sessiontree.store._reads import Reads
from sessiontree.store._records import (
    CallRecord,
    CycleRecord,
    InboxRecord,
    MemoryIdRecord,
    MemoryRecord,
    MessageRecord,
    MetaRecord,
    OutboxRecord,
    QuarantineRecord,
    ReceivedRecord,
    RecordingRecord,
    SessionRecord,
    StartsRecord,
    UsageRecord,
    WedgedRecord,
    decode_id,
    decode_record,
)
from sessiontree.store._store_slots import StoreSlots
from sessiontree.store._writer import Writer

__all__ = ["Store"]

log = logging.getLogger("sessiontree.store")

R = TypeVar("R", bound=msgspec.Struct)


class Store:
    """The LMDB store of one node.

    Open it for writing (one node per directory: a second is refused with
    ``StoreLockedError``) or ``readonly=True`` (the CLI beside a live node).
    Every write goes through ``submit``/``write`` to the one writer thread;
    reads run on the caller's thread in short read transactions. After a
    ``fork()`` the child must open its own ``Store`` (this one raises
    ``StoreError`` there). Close it with ``close()`` or a ``with`` block.

    ``sync`` (default on): a commit returns only once fsync'd. ``group_commit``
    (default on): batches queued together share one commit; off, every batch
    is its own transaction (the naive baseline of ``bench_store``).
    ``linger``: how long a lazy write (``submit(batch, lazy=True)``, one
    nobody waits on yet) may wait for a commit someone waits on before it
    commits by itself (seconds).
    ``long_read_warn``: a read transaction open longer than this is counted
    and logged (it pins old pages, so the file grows). ``io``: the I/O layer
    (tests inject faults with a subclass).

    Opening walks every page of the file first (a damaged one is refused
    with ``StoreDamagedError``), unless the file is as a writer's clean close
    left it (``close()`` records it; ``pages_walked`` is None then); ``walk``
    walks it regardless (``store verify``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        map_size: int = DEFAULT_MAP_SIZE,
        max_readers: int = DEFAULT_MAX_READERS,
        sync: bool = True,
        io: StoreIO | None = None,
        long_read_warn: float = 60.0,
        group_commit: bool = True,
        linger: float = 1.0,
        walk: bool = False,
    ) -> None:
        self._opened = open_env(
            path,
            readonly=readonly,
            map_size=map_size,
            max_readers=max_readers,
            sync=sync,
            walk=walk,
        )
        self.path = self._opened.path
        self.readonly = readonly
        self.sync = sync
        self.quarantined = 0
        self._set_aside: set[tuple[str, bytes]] = set()  # quarantined after start-up
        self._closed = False
        self._reads = Reads(self._opened, self._check_usable, long_read_warn)
        #: a slot's epoch, and moving a slot (``_store_slots``)
        self.slots = StoreSlots(
            self._reads, self._opened.dbs, self._usable_writer, lambda: self._node_id
        )
        self._writer: Writer | None = None
        try:
            if not readonly:
                self._writer = Writer(
                    self._opened.env,
                    self._opened.dbs,
                    io or StoreIO(),
                    "sessiontree-store-writer",
                    group_commit=group_commit,
                    linger=linger,
                )
                self._writer.on_commit = self._reads.check_long_reads
                opened, rewritten = open_meta(self._reads, self.write, self.path)
                self.quarantined += rewritten
                self._writer.fence_at(opened.incarnation)
                self.meta: MetaRecord | None = opened
                index_live(self)
            else:
                try:
                    self.meta = self._read_meta()
                except CorruptRecordError:  # still readable: `store verify` names it
                    self.meta = None
            self.slots.reload()
        except BaseException:
            self.close()  # a failed open leaves neither the path nor the lock held
            raise

    # -- lifecycle ------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._opened.pid != process_id():
            msg = (
                f"store {self.path} was opened in process {self._opened.pid}; after fork() "
                "open a new Store in this process"
            )
            raise StoreError(msg)
        if self._closed:
            msg = f"store {self.path} is closed"
            raise StoreError(msg)

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the environment (idempotent)."""
        if self._closed:
            return
        if self._opened.pid != process_id():
            # A forked child: the writer, the reads and the environment are the
            # parent's (waiting on its reads here could only time out).
            self._closed = True
            return
        clean = False
        if self._writer is not None:
            self._writer.close()
            clean = self._closes_cleanly(self._writer)
        self._closed = True
        self._reads.wait_ended(timeout=30.0)
        close_env(self._opened, clean=clean)

    def _closes_cleanly(self, writer: Writer) -> bool:
        """Whether this close leaves the file as this handle wrote it: the writer
        stopped with its last commit through, not fenced, and the store still at
        this handle's incarnation (then the close is recorded and the next open
        skips walking every page)."""
        meta = getattr(self, "meta", None)  # unset when the open failed
        if meta is None or writer.thread.is_alive() or writer.refusing:
            return False
        try:
            held = self._read_meta()
        except StoreError:
            return False
        return held is not None and held.incarnation == meta.incarnation

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pages_walked(self) -> int | None:
        """Pages the open walked to check the file, or None: it skipped the
        walk, the file being as a writer's clean close left it."""
        return self._opened.pages_walked

    @property
    def stale_readers_cleared(self) -> int:
        """Reader slots of dead processes that ``reader_check()`` freed on open."""
        return self._opened.stale_readers

    @property
    def long_read_warn(self) -> float:
        """Seconds a read transaction may stay open before commits count it as long."""
        return self._reads.long_read_warn

    @long_read_warn.setter
    def long_read_warn(self, seconds: float) -> None:
        self._reads.long_read_warn = seconds

    @property
    def long_reads(self) -> int:
        """Commits that found a read transaction open longer than ``long_read_warn``."""
        return self._reads.long_reads

    @property
    def writer_thread(self) -> threading.Thread | None:
        return self._writer.thread if self._writer is not None else None

    def observe_commits(self, observer: Callable[[float, int], None]) -> Callable[[], None]:
        """Call ``observer(seconds, batches)`` on the writer thread after each
        successful commit (its duration, and the write batches that shared it).
        It must be quick; a raise is logged and ignored, never reaching the
        writer. Returns a function that removes it (idempotent). A read-only
        store never commits: the observer is never called."""
        if self._writer is None:
            return _no_op
        return self._writer.observe_commits(observer)

    # -- writing ----------------------------------------------------------------------

    def batch(self) -> WriteBatch:
        """A new, empty batch of writes that commit together."""
        return WriteBatch()

    def submit(self, batch: WriteBatch, *, lazy: bool = False) -> concurrent.futures.Future[None]:
        """Queue ``batch`` for the writer; the future resolves once it is durably
        committed, or fails with ``StoreFullError``/``StoreError``. Cancelling
        it before the writer takes the batch withdraws the batch. ``lazy``: a
        write nobody waits on yet, carried along with the next one someone
        does (within ``linger`` seconds); who comes to wait calls ``hurry``."""
        return self._usable_writer().submit(batch, lazy=lazy)

    @property
    def refusing(self) -> bool:
        """Whether the last commit failed (a full map, an I/O error): writes are
        likely refused until one succeeds again. Once ``fenced``, always."""
        return self._writer is not None and self._writer.refusing

    @property
    def fenced(self) -> StoreFencedError | None:
        """Why this handle writes nothing more (another process opened the store
        since this one did: every write fails with this error), or None."""
        return self._writer.fenced if self._writer is not None else None

    @property
    def incarnation(self) -> int:
        """The store's incarnation as this handle opened it (its writer's open
        bumped it; a read-only open reports what it read, 0 when none)."""
        return self.meta.incarnation if self.meta is not None else 0

    def hurry(self) -> None:
        """Commit the lazy writes queued so far at once (a no-op on a closed store)."""
        if self._writer is not None and not self._closed:
            self._writer.hurry()

    def _usable_writer(self) -> Writer:
        self._check_usable()
        if self._writer is None:
            msg = f"store {self.path} is open read-only"
            raise StoreError(msg)
        return self._writer

    async def awrite(self, batch: WriteBatch) -> None:
        """Awaitable ``write`` (the event loop is never blocked; the writer wakes
        it once per commit for all its writes). Cancelling the caller stops the
        wait only: the batch may still commit."""
        await self._usable_writer().awrite(batch)

    def submit_awaitable(self, batch: WriteBatch) -> asyncio.Future[None]:
        """Queue ``batch`` at once (call it on a running event loop) and return an
        awaitable that resolves once it is durably committed, or raises
        ``StoreFullError``/``StoreError``."""
        return self._usable_writer().submit_awaitable(batch)

    def write(self, batch: WriteBatch, timeout: float | None = 60.0) -> None:
        """``submit`` and wait: returns once durable; raises ``StoreFullError`` or
        ``StoreError`` when nothing of it was written, ``TimeoutError`` after
        ``timeout`` seconds (the batch may still commit)."""
        self._usable_writer().write(batch, timeout)

    def flush(self, timeout: float | None = 60.0) -> None:
        """Wait until everything submitted before this call is committed."""
        self.write(WriteBatch(), timeout)

    def grow(self, map_size: int, timeout: float | None = 60.0) -> None:
        """Grow the map to ``map_size`` bytes. Runs on the writer between
        transactions once no read transaction of this process is open (the
        only safe moment for ``set_mapsize``); new reads wait meanwhile."""
        self._check_usable()
        if self._writer is None:
            msg = f"store {self.path} is open read-only"
            raise StoreError(msg)
        if map_size <= self._opened.env.info()["map_size"]:
            msg = f"map_size {map_size} is not larger than the current map"
            raise ValueError(msg)
        self._writer.run_alone(lambda: self._reads.resize_map(map_size)).result(timeout)

    # -- reading ----------------------------------------------------------------------

    def _read(self) -> contextlib.AbstractContextManager[lmdb.Transaction]:
        """One read transaction (``Reads.transaction``; tests hold reads open with it)."""
        return self._reads.transaction()

    def oldest_read_s(self) -> float:
        """Age of the oldest read transaction this process has open (0 when none)."""
        return self._reads.oldest_s()

    def scan(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Every (key, raw value) of ``db`` under ``prefix``, in key order, read in
        short transactions (so a long scan never pins old pages while the writer
        works)."""
        return self._reads.scan(db, prefix)

    def decoded(
        self, kind: type[R], db: str, prefix: bytes = b""
    ) -> Iterator[R | CorruptRecordError]:
        """``scan`` decoded: each record, or the ``CorruptRecordError`` naming a bad one."""
        return self._reads.decoded(kind, db, prefix)

    def databases(self) -> list[str]:
        """The named databases this store has, in ``DATABASES`` order (a read-only
        open of a store written by older code may lack some)."""
        return list(self._opened.dbs)

    def count(self, db: str) -> int:
        """Entries in ``db``."""
        return self._reads.count(db)

    def session(self, session_id: uuid.UUID) -> SessionRecord | None:
        """The stored record of a session, or None; ``CorruptRecordError`` if unreadable."""
        return self._reads.get(SessionRecord, "sessions", session_id.bytes)

    def sessions(self) -> Iterator[SessionRecord | CorruptRecordError]:
        """Every session record (bad ones as ``CorruptRecordError``)."""
        return self._reads.decoded(SessionRecord, "sessions")

    def children(self, parent_id: uuid.UUID) -> list[uuid.UUID]:
        """The children the tree index holds for ``parent_id``, in id order;
        ``CorruptRecordError`` for an entry that is not parent id + child id."""
        return [
            decode_id(key[16:], db="children", key=key)
            for key, _ in self._reads.scan("children", parent_id.bytes)
        ]

    def main_of(self, agent_id: str, key: str) -> uuid.UUID | None:
        """The Main recorded for (agent, session key), or None;
        ``CorruptRecordError`` if the entry is not a session id."""
        at = main_key(agent_id, key)
        raw = self._reads.get_raw("mains", at)
        return None if raw is None else decode_id(raw, db="mains", key=at)

    def outbox(self) -> Iterator[OutboxRecord | CorruptRecordError]:
        """Every result still owed to a parent."""
        return self._reads.decoded(OutboxRecord, "outbox")

    def received(self, parent_id: uuid.UUID, *, set_aside: bool = False) -> list[SessionResult]:
        """Results filed on ``parent_id``'s record; ``CorruptRecordError`` if one
        is unreadable, or, ``set_aside``, that one quarantined (``set_aside``)
        and left out."""
        if not set_aside:
            filed = self._reads.every(ReceivedRecord, "received", parent_id.bytes)
            return [record.result for record in filed]
        results = []
        for key, raw in self._reads.scan("received", parent_id.bytes):
            try:
                results.append(decode_record(ReceivedRecord, raw, db="received", key=key).result)
            except CorruptRecordError as exc:
                self.set_aside(exc)
        return results

    def inbox(self, session_id: uuid.UUID) -> list[InboxRecord]:
        """A Main's acknowledged inbound messages not yet run, in order;
        ``CorruptRecordError`` if one is unreadable."""
        return list(self._reads.every(InboxRecord, "inbox", session_id.bytes))

    def memory(self, agent_id: str, key: str) -> MemoryRecord | None:
        """The latest shared-memory write of ``agent_id`` under ``key``."""
        return self._reads.get(MemoryRecord, "memory", memory_key(agent_id, key))

    def memory_by_id(self, memory_id: str) -> MemoryRecord | None:
        """The write a memory id names, or None (unknown, or overwritten since)."""
        where = self._reads.get(MemoryIdRecord, "memory_ids", memory_id.encode())
        if where is None:
            return None
        record = self.memory(where.agent_id, where.key)
        if record is None or record.memory_id != memory_id:
            return None
        return record

    def usage(self, session_id: uuid.UUID, *, set_aside: bool = False) -> UsageRecord | None:
        """What a session and its subtree have spent, or None (it never spent);
        ``CorruptRecordError`` if the record is unreadable, or, ``set_aside``,
        None with the record quarantined (``set_aside``)."""
        try:
            return self._reads.get(UsageRecord, "usage", session_id.bytes)
        except CorruptRecordError as exc:
            if not set_aside:
                raise
            self.set_aside(exc)
            return None

    def calls(self) -> list[CallRecord]:
        """Every model call in flight as the store knows it;
        ``CorruptRecordError`` at the first record that does not decode."""
        return list(self._reads.every(CallRecord, "calls"))

    def cycle(self, session_id: uuid.UUID) -> CycleRecord | None:
        """The cycle a Main started and has not snapshotted, or None;
        ``CorruptRecordError`` if unreadable."""
        return self._reads.get(CycleRecord, "cycles", session_id.bytes)

    def wedged(self, wedged_id: uuid.UUID) -> WedgedRecord | None:
        """One piece of work recovery held back, or None; ``CorruptRecordError``
        if unreadable."""
        return self._reads.get(WedgedRecord, "wedged", wedged_id.bytes)

    def wedged_list(self) -> list[WedgedRecord]:
        """What recovery held back, oldest first; ``CorruptRecordError`` if one is
        unreadable (recovery quarantines those at start-up)."""
        return sorted(self._reads.every(WedgedRecord, "wedged"), key=lambda w: w.at)

    def recording(self, recording_id: uuid.UUID) -> RecordingRecord | None:
        """A recorded subtree's run under its root's id, or None;
        ``CorruptRecordError`` if unreadable."""
        return self._reads.get(RecordingRecord, "recordings", recording_id.bytes)

    def recordings(self) -> list[RecordingRecord]:
        """Every recording, oldest first; ``CorruptRecordError`` if one is unreadable."""
        return sorted(self._reads.every(RecordingRecord, "recordings"), key=lambda r: r.started_at)

    def starts(self) -> StartsRecord | None:
        """The node's recent starts (None before the first); ``CorruptRecordError``
        if unreadable."""
        return self._reads.get(StartsRecord, "meta", b"starts")

    def set_aside(self, error: CorruptRecordError) -> None:
        """Quarantine the record ``error`` names (read after start-up, as ended
        sessions are): moved to ``quarantine``, logged and counted once, as
        recovery does with what it reads. The write is not waited for."""
        if (error.db, error.key) in self._set_aside:
            return
        self._set_aside.add((error.db, error.key))
        raw = self._reads.get_raw(error.db, error.key) or b""
        log.error("quarantined %s record %s: %s", error.db, error.key.hex(), error)
        record = QuarantineRecord(
            db=error.db, key=error.key, raw=raw, reason=str(error), at=time.time()
        )
        self.quarantined += 1
        self.submit(WriteBatch().quarantine(record, if_unchanged=True))

    def quarantine_list(self) -> list[QuarantineRecord]:
        """Values recovery set aside; ``CorruptRecordError`` if one is unreadable."""
        return list(self._reads.every(QuarantineRecord, "quarantine"))

    # -- conversations -------------------------------------------------------------------

    def conversation(self, session_id: uuid.UUID) -> ConversationState | None:
        """A session's conversation bookkeeping with its branches (in number order),
        or None; ``CorruptRecordError`` if it or one of its branches is unreadable."""
        return conversation_read(self._reads, session_id)[0]

    def conversation_read(
        self, session_id: uuid.UUID
    ) -> tuple[ConversationState | None, bytes | None]:
        """``conversation`` and the stored bytes of its bookkeeping record, read in
        one transaction (the bytes are what the next write may ``expect``)."""
        return conversation_read(self._reads, session_id)

    def message(self, session_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        """One conversation message, or None; ``CorruptRecordError`` if unreadable."""
        record = self._reads.get(MessageRecord, "messages", pair_key(session_id, message_id))
        return None if record is None else record.message

    def walk(
        self,
        session_id: uuid.UUID,
        start: uuid.UUID | None,
        limit: int,
        branch_id: str | None = None,
    ) -> list[Message]:
        """From message ``start`` towards the root, newest first, at most ``limit``
        (with ``branch_id``: only while on that branch), in one read transaction;
        ``CorruptRecordError`` for a message that does not decode."""
        return walk(self._reads, session_id, start, limit, branch_id)

    def messages(self, session_id: uuid.UUID) -> Iterator[Message]:
        """Every message of a session's conversation, in id order;
        ``CorruptRecordError`` at one that does not decode."""
        for record in self._reads.every(MessageRecord, "messages", session_id.bytes):
            yield record.message

    def platform_message(self, session_id: uuid.UUID, platform_id: str) -> uuid.UUID | None:
        """Our message id for a chat platform's message id in a session, or None;
        ``CorruptRecordError`` if the entry is not a message id."""
        at = platform_key(session_id, platform_id)
        raw = self._reads.get_raw("platform_ids", at)
        return None if raw is None else decode_id(raw, db="platform_ids", key=at)

    # -- identity and figures ------------------------------------------------------------

    def _read_meta(self) -> MetaRecord | None:
        return read_meta(self._reads)

    @property
    def _node_id(self) -> str:
        meta = getattr(self, "meta", None)
        return meta.node_id if meta is not None else ""

    def live_records(self) -> Iterator[tuple[bytes, bytes | None]]:
        """The raw record of every session not yet terminal, by the index of live
        sessions: (key, raw), raw None for a key whose record is gone."""
        return self._reads.joined("live", "sessions", skip=LIVE_INDEXED)

    def backup(self, dest: str | os.PathLike[str], *, compact: bool = False) -> Backup:
        """Copy the store into the directory ``dest`` (it must not exist, or be
        empty): one consistent snapshot holding every commit acknowledged
        before the call, taken while writes go on (read-only stores too, so
        the CLI backs up beside a live node), synced, and renamed into place
        only once whole. ``compact`` leaves free pages out (slower, smaller).
        Raises ``StoreError`` naming ``dest`` when it is taken or cannot be
        written, ``StoreDamagedError`` when a damaged page is met."""
        with self._reads.transaction() as txn:  # a read: the map is not resized under it
            return copy_env(self._opened.env, self.path, dest, compact=compact, txn=txn)

    def stats(self) -> dict[str, Any]:
        """Figures of the store: entries per database, commits, errors, map use."""
        self._check_usable()
        info = self._opened.env.info()
        stat = self._opened.env.stat()
        figures: dict[str, Any] = {
            "path": self.path,
            "map_size": info["map_size"],
            "used_bytes": (info["last_pgno"] + 1) * stat["psize"],
            "readers": info["num_readers"],
            "max_readers": info["max_readers"],
            "stale_readers_cleared": self._opened.stale_readers,
            "oldest_read_s": self.oldest_read_s(),
            "long_reads": self._reads.long_reads,
            "quarantined": self.quarantined,
        }
        if self._writer is not None:
            figures.update(
                commits=self._writer.commits,
                batches=self._writer.batches,
                write_errors=self._writer.errors,
                store_full=self._writer.full,
            )
        for name in self._opened.dbs:
            figures[f"entries_{name}"] = self.count(name)
        return figures


def _no_op() -> None:
    return None
