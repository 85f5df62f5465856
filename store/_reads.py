"""``Reads``: the read transactions of one store in this process.

Every read of a ``Store`` runs here, on the caller's thread, in a short
read-only transaction that begins and ends in one ``with`` (a transaction
never crosses threads). ``Reads`` keeps a table of the reads open at the
moment, because LMDB needs them counted twice over:

* ``set_mapsize`` is only safe with no transaction of this process open.
  Growing the map (``resize_map``, run by the writer thread between write
  transactions) and adopting a size another process set (when a read
  begins after the map grew) both wait for the open reads to end, and hold
  new reads back meanwhile.
* A read held open pins old pages, so the file grows while it lasts: after
  each commit ``check_long_reads`` counts and logs any read open longer than
  ``long_read_warn``.

Scans read in chunks of ``_SCAN_CHUNK`` entries, one short transaction each,
so even a scan of a whole database never pins old pages for long.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import lmdb
import msgspec

from sessiontree.protocol import CorruptRecordError, StoreError
from sessiontree.store._env import CORRUPTION, Opened, damaged_by
from sessiontree.store._records import decode_record

__all__ = ["Reads"]

log = logging.getLogger("sessiontree.store")

R = TypeVar("R", bound=msgspec.Struct)

_SCAN_CHUNK = 1024  # records per read transaction when scanning: no long readers


class Reads:
    """The read side of one open environment (any thread may call it).

    ``check_usable`` is called before every read; it raises ``StoreError``
    when the store is closed or was opened in another process (after a
    ``fork()``), and the read does not begin.
    """

    def __init__(
        self, opened: Opened, check_usable: Callable[[], None], long_read_warn: float
    ) -> None:
        self._opened = opened
        self._check_usable = check_usable
        self.long_read_warn = long_read_warn
        self.long_reads = 0
        self._open: dict[int, float] = {}  # id of an open read -> when it began (monotonic)
        self._lock = threading.Condition()
        self._resizing = False

    # -- one read transaction --------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[lmdb.Transaction]:
        """A read-only transaction, aborted on leaving the block. Waits while the
        map is being resized; raises ``StoreError`` when the store is not usable
        or every reader slot is taken, ``StoreDamagedError`` when LMDB finds a
        damaged page on a read inside the block."""
        self._check_usable()
        with self._lock:
            self._lock.wait_for(lambda: not self._resizing)
            token = object()
            self._open[id(token)] = time.monotonic()
        try:
            txn = self._begin(id(token))
            try:
                yield txn
            finally:
                txn.abort()
        except CORRUPTION as exc:
            raise damaged_by(f"{self._opened.path}/data.mdb", exc) from exc
        finally:
            with self._lock:
                del self._open[id(token)]
                self._lock.notify_all()

    def _begin(self, key: int) -> lmdb.Transaction:
        try:
            return self._opened.env.begin(buffers=False)
        except lmdb.MapResizedError:
            # Another process (the writer) grew the map past ours: adopt its size.
            self._adopt_map_size(key)
            return self._opened.env.begin(buffers=False)
        except lmdb.ReadersFullError as exc:
            msg = (
                f"store {self._opened.path}: every reader slot is taken (max_readers "
                f"{self._opened.env.info()['max_readers']}); open it with a larger max_readers"
            )
            raise StoreError(msg) from exc

    def _adopt_map_size(self, key: int) -> None:
        """``set_mapsize(0)`` (take the size the writer set) once no read of
        this process is open; the caller's read ``key`` steps aside meanwhile.
        ``StoreError`` if other reads stay open for 30 s."""
        with self._lock:
            since = self._open.pop(key)
            try:
                if self._resizing:  # another read is adopting it: wait for that
                    self._lock.wait_for(lambda: not self._resizing)
                    return
                self._resizing = True
                try:
                    if not self._lock.wait_for(lambda: not self._open, timeout=30.0):
                        msg = (
                            f"store {self._opened.path} grew, and reads stayed open too "
                            "long to follow"
                        )
                        raise StoreError(msg)
                    self._opened.env.set_mapsize(0)
                finally:
                    self._resizing = False
                    self._lock.notify_all()
            finally:
                self._open[key] = since

    # -- the open reads, as the writer and the figures see them -------------------------

    def resize_map(self, map_size: int) -> None:
        """Set the map to ``map_size`` bytes once no read of this process is open,
        holding new reads back until it is done. Call it on the writer thread
        between write transactions (``Writer.run_alone``); an ``lmdb.Error``
        from ``set_mapsize`` is raised to that caller and reads go on."""
        with self._lock:
            self._resizing = True
            try:
                self._lock.wait_for(lambda: not self._open)
                self._opened.env.set_mapsize(map_size)
            finally:
                self._resizing = False
                self._lock.notify_all()

    def check_long_reads(self) -> None:
        """After a commit (on the writer thread): count read transactions open
        longer than ``long_read_warn`` (they pin old pages, so the file grows),
        logging the first and every thousandth. Never raises."""
        if not self._open:
            return
        oldest = min(self._open.values(), default=None)
        if oldest is not None and time.monotonic() - oldest > self.long_read_warn:
            self.long_reads += 1
            if self.long_reads == 1 or self.long_reads % 1000 == 0:
                log.warning(
                    "a read transaction on %s has been open for %.0f s; the file grows "
                    "while it holds old pages",
                    self._opened.path,
                    time.monotonic() - oldest,
                )

    def oldest_s(self) -> float:
        """Age of the oldest read transaction this process has open (0 when none)."""
        with self._lock:
            if not self._open:
                return 0.0
            return time.monotonic() - min(self._open.values())

    def wait_ended(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every open read to end (closing the
        store); False if some are still open then."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._open, timeout=timeout)

    # -- reading entries ----------------------------------------------------------------

    def db(self, name: str) -> Any:
        """The handle of database ``name``, or None (a store made before it existed)."""
        return self._opened.dbs.get(name)

    def get(self, kind: type[R], db: str, key: bytes) -> R | None:
        """The record under ``key`` in ``db``, or None; ``CorruptRecordError`` if
        it does not decode as a ``kind``."""
        handle = self.db(db)
        if handle is None:
            return None
        with self.transaction() as txn:
            raw = txn.get(key, db=handle)
        if raw is None:
            return None
        return decode_record(kind, bytes(raw), db=db, key=key)

    def get_raw(self, db: str, key: bytes) -> bytes | None:
        """The bytes under ``key`` in ``db``, or None."""
        handle = self.db(db)
        if handle is None:
            return None
        with self.transaction() as txn:
            raw = txn.get(key, db=handle)
        return None if raw is None else bytes(raw)

    def joined(
        self, index: str, db: str, *, skip: bytes = b""
    ) -> Iterator[tuple[bytes, bytes | None]]:
        """For every key of ``index`` but ``skip``, in key order, the raw value
        ``db`` holds under it (None: none), read in short transactions as ``scan``."""
        target = self.db(db)
        keys = ((key, raw) for key, raw in self.scan(index) if key != skip)
        for chunk in _chunks(keys, _SCAN_CHUNK):
            with self.transaction() as txn:
                got = [(key, txn.get(key, db=target)) for key, _ in chunk]
            yield from ((key, None if raw is None else bytes(raw)) for key, raw in got)

    def scan(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Every (key, raw value) of ``db`` under ``prefix``, in key order, read in
        short transactions of ``_SCAN_CHUNK`` records (so a long scan never pins
        old pages while the writer works)."""
        handle = self.db(db)
        if handle is None:
            return
        start = prefix
        first = True
        while True:
            chunk: list[tuple[bytes, bytes]] = []
            with self.transaction() as txn, txn.cursor(db=handle) as cursor:
                found = cursor.set_range(start)
                if found and not first and cursor.key() == start:
                    found = cursor.next()
                while found and len(chunk) < _SCAN_CHUNK:
                    key = bytes(cursor.key())
                    if not key.startswith(prefix):
                        break
                    chunk.append((key, bytes(cursor.value())))
                    found = cursor.next()
            yield from chunk
            if len(chunk) < _SCAN_CHUNK:
                return
            start, first = chunk[-1][0], False

    def decoded(
        self, kind: type[R], db: str, prefix: bytes = b""
    ) -> Iterator[R | CorruptRecordError]:
        """``scan`` decoded: each record, or the ``CorruptRecordError`` naming a bad one."""
        for key, raw in self.scan(db, prefix):
            try:
                yield decode_record(kind, raw, db=db, key=key)
            except CorruptRecordError as exc:
                yield exc

    def every(self, kind: type[R], db: str, prefix: bytes = b"") -> Iterator[R]:
        """``scan`` decoded, every record or none: ``CorruptRecordError`` at the
        first that does not decode (a listing never leaves one out unsaid)."""
        for key, raw in self.scan(db, prefix):
            yield decode_record(kind, raw, db=db, key=key)

    def count(self, db: str) -> int:
        """Entries in ``db`` (0 for a database the store does not have)."""
        handle = self.db(db)
        if handle is None:
            return 0
        with self.transaction() as txn:
            return int(txn.stat(handle)["entries"])


def _chunks(items: Iterator[tuple[bytes, bytes]], size: int) -> Iterator[list[tuple[bytes, bytes]]]:
    chunk: list[tuple[bytes, bytes]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
