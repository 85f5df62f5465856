"""Opening an LMDB environment safely: one per path per process, one writer
node per directory (a lock file), stale reader slots cleared, fork-aware,
and a damaged file refused before LMDB maps it (``_pages``; the walk of
every page is skipped for a file as a clean close left it, ``_clean``).

The traps of LMDB: a second ``lmdb.open`` of the same path in one
process breaks its locks; an environment must never be used across
``fork()``; readers left by killed processes hold pages until
``reader_check()``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import pathlib
import threading
from dataclasses import dataclass

import lmdb

from sessiontree.protocol import StoreDamagedError, StoreError, StoreFullError, StoreLockedError
from sessiontree.store._clean import (
    forget_clean_close,
    record_clean_close,
    unchanged_since_clean_close,
)
from sessiontree.store._pages import Meta, check_length, check_tree, damaged, read_meta

__all__ = [
    "CORRUPTION",
    "DATABASES",
    "DEFAULT_MAP_SIZE",
    "DEFAULT_MAX_READERS",
    "DIR_MODE",
    "FILE_MODE",
    "LIVE_INDEXED",
    "MARKER",
    "Opened",
    "close_env",
    "damaged_by",
    "mark_committed",
    "open_env",
    "read_marker",
]

DEFAULT_MAP_SIZE = 16 << 30  # sparse: the file grows with the data, not the map
DEFAULT_MAX_READERS = 512  # LMDB's default of 126 is too few for a busy node and its CLI readers

#: The named databases of one store.
DATABASES = (
    "sessions",  # session id -> SessionRecord
    "children",  # parent id + child id -> b"" (the tree index)
    "mains",  # agent id NUL session key -> Main session id
    "conversations",  # session id -> ConversationRecord (counters, current branch)
    "branches",  # session id + branch number (4 bytes) -> BranchRecord
    "messages",  # session id + message id -> MessageRecord (conversation trees)
    "platform_ids",  # session id + a chat platform's message id -> message id
    "memory",  # agent id NUL key -> MemoryRecord
    "memory_ids",  # memory id -> MemoryIdRecord
    "outbox",  # child id -> OutboxRecord (a result owed to the parent)
    "received",  # parent id + child id -> ReceivedRecord (a result filed on the parent)
    "inbox",  # main id + seq -> InboxRecord (acknowledged, not yet run)
    "meta",  # b"meta" -> MetaRecord
    "quarantine",  # db NUL key -> QuarantineRecord
    "usage",  # session id -> UsageRecord (what it and its subtree spent)
    "cycles",  # main id -> CycleRecord (the cycle it started and has not yet snapshotted)
    "wedged",  # wedged id -> WedgedRecord (what recovery held back after repeated crashes)
    "recordings",  # root session id -> RecordingRecord (a recorded subtree's run)
    "calls",  # session id + call id -> CallRecord (a model call in flight, reserved)
    "live",  # session id -> b"" for each session not yet terminal (derived: LIVE_INDEXED)
    "moved",  # slot (2 bytes, big-endian) -> MovedRecord (a slot released to another node)
    "slots",  # slot (2 bytes) -> SlotRecord (its epoch; fencing, not exported)
)

#: The ``live`` key saying the index is kept (built once at open otherwise); no
#: session id is one byte long.
LIVE_INDEXED = b"\x00"

log = logging.getLogger("sessiontree.store")

_LOCK_FILE = "writer.lock"
#: What the store writes holds every session's task, context and results: a
#: directory it creates is its owner's alone, and so is every file in it (and
#: in a backup). The process's umask may narrow these further.
DIR_MODE = 0o700
FILE_MODE = 0o600
#: Written beside data.mdb once the store has committed data: from then on an
#: empty or missing data.mdb is damage, never a fresh store.
MARKER = "sessiontree.marker"
#: LMDB's errors that mean the file itself is damaged.
CORRUPTION: tuple[type[lmdb.Error], ...] = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.PanicError,
)
_open_paths: dict[str, int] = {}  # real path -> pid that opened it
_open_lock = threading.Lock()
_lock_fds: set[int] = set()  # writer-lock descriptors this process holds
_open_at_fork: set[str] = set()  # in a forked child: paths its parent had open
_pid = os.getpid()  # this process's, kept by the fork hook: a write checks it, and
# getpid() is a system call each time


def process_id() -> int:
    """This process's id (``os.getpid()`` without a system call)."""
    return _pid


def _forget_after_fork() -> None:
    global _pid  # noqa: PLW0603 - the one process-wide fact a fork changes
    _pid = os.getpid()
    # The child inherits the parent's bookkeeping but must never use its
    # environments. Its copies of the writer-lock descriptors are closed: a
    # forked worker that outlives a killed parent would otherwise keep the
    # directory locked (closing a copy never releases the parent's flock).
    _open_at_fork.update(_open_paths)
    _open_paths.clear()
    for fd in _lock_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_fds.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


@dataclass
class Opened:
    """An open environment with its named databases and, for a writer, its lock."""

    env: lmdb.Environment
    dbs: dict[str, lmdb._Database]
    path: str
    readonly: bool
    lock_fd: int | None
    pid: int
    stale_readers: int
    pages_walked: int | None  # None: skipped, the file is as a clean close left it


def open_env(
    path: str | os.PathLike[str],
    *,
    readonly: bool,
    map_size: int,
    max_readers: int,
    sync: bool,
    walk: bool = False,
) -> Opened:
    """Open (creating for a writer) the store at ``path``.

    Every page in use is walked first unless the file is as a writer's clean
    close left it (``_clean``), or always with ``walk``.

    Raises ``StoreLockedError`` when another node holds the directory or this
    process already has it open, ``StoreDamagedError`` when ``data.mdb`` is
    damaged (shorter than its meta pages say, a bad meta or B-tree page, or
    empty or missing where the store's marker says data was committed),
    ``StoreError`` when LMDB refuses to open it.
    """
    directory = pathlib.Path(path)
    if not readonly:
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    real = str(directory.resolve())
    with _open_lock:
        if real in _open_paths:
            msg = (
                f"store {real} is already open in this process; open it once and share "
                "the Store (a second LMDB environment on one path breaks its locks)"
            )
            raise StoreLockedError(msg)
        _open_paths[real] = os.getpid()
    lock_fd = None
    try:
        if not readonly:
            lock_fd = _take_writer_lock(directory)
        clean = _check_before_open(directory, readonly=readonly, walk=walk)
        env = lmdb.open(
            real,
            map_size=0 if readonly else map_size,
            max_dbs=len(DATABASES) + 2,
            max_readers=max_readers,
            readonly=readonly,
            sync=sync,
            metasync=sync,
            lock=True,
            mode=DIR_MODE,  # data.mdb and lock.mdb: this without the x bits (0600)
        )
    except lmdb.Error as exc:
        _release(real, lock_fd)
        if isinstance(exc, CORRUPTION):
            raise damaged_by(os.path.join(real, "data.mdb"), exc) from exc
        msg = f"cannot open store {real}: {exc}"
        if real in _open_at_fork:
            msg += (
                " (this process was forked while its parent had the store open, and "
                "py-lmdb refuses to open those files again in the child; start workers "
                "that need the store with exec, e.g. multiprocessing's 'spawn')"
            )
        raise StoreError(msg) from exc
    except BaseException:
        _release(real, lock_fd)
        raise
    try:
        walked = None if clean else _check_pages(env, os.path.join(real, "data.mdb"))
        stale = 0 if readonly else env.reader_check()
        dbs: dict[str, lmdb._Database] = {}
        for name in DATABASES:
            try:
                dbs[name] = env.open_db(name.encode(), create=not readonly)
            except lmdb.NotFoundError:  # a read-only open of a store written before this db existed
                continue
    except BaseException as exc:
        env.close()
        _release(real, lock_fd)
        if isinstance(exc, lmdb.MapFullError):
            msg = f"cannot open store {real}: map_size is too small to hold its databases"
            raise StoreFullError(msg) from exc
        if isinstance(exc, CORRUPTION):
            raise damaged_by(os.path.join(real, "data.mdb"), exc) from exc
        if isinstance(exc, lmdb.Error):
            msg = f"cannot open store {real}: {exc}"
            raise StoreError(msg) from exc
        raise
    return Opened(env, dbs, real, readonly, lock_fd, os.getpid(), stale, walked)


def _check_before_open(directory: pathlib.Path, *, readonly: bool, walk: bool) -> bool:
    """Refuse what LMDB would map and die on, or silently start afresh from;
    whether the file is as a clean close left it (its walk can be skipped:
    never with ``walk``). A writer forgets the clean close here, before LMDB
    opens the file: from here on it may write."""
    meta = _meta_before_open(directory, readonly=readonly)
    real = str(directory.resolve())
    clean = not walk and meta is not None and unchanged_since_clean_close(real, meta)
    if not readonly:
        forget_clean_close(real)
    return clean


def _meta_before_open(directory: pathlib.Path, *, readonly: bool) -> Meta | None:
    """``_check_before_open``'s checks; the current meta page (None: no data
    yet, LMDB starts the file)."""
    data = directory / "data.mdb"
    marked = (directory / MARKER).exists()
    try:
        size = data.stat().st_size
    except FileNotFoundError:
        if marked:
            what = f"it is missing, but {directory / MARKER} says data was committed here"
            raise damaged(str(data), "missing", what) from None
        if readonly:
            msg = f"no store at {directory} (no data.mdb)"
            raise StoreError(msg) from None
        return None
    if size == 0:
        if marked:
            what = f"it is empty (0 bytes), but {directory / MARKER} says data was committed here"
            raise damaged(str(data), "empty", what)
        if readonly:
            msg = f"no store at {directory} (data.mdb is empty: nothing was ever committed)"
            raise StoreError(msg)
        return None  # a store whose creation was cut short: LMDB starts it afresh
    meta = read_meta(str(data))
    check_length(str(data), meta)
    return meta


def _check_pages(env: lmdb.Environment, data: str) -> int:
    """Walk the B-tree pages of the newest snapshot, pinned by a read transaction
    (pages of snapshots at least that new are not reused while it lasts);
    return the pages walked."""
    txn = env.begin()
    try:
        meta = read_meta(data)
        check_length(data, meta)
        return check_tree(data, meta)
    finally:
        txn.abort()


def damaged_by(path: str, exc: lmdb.Error) -> StoreDamagedError:
    """The ``StoreDamagedError`` for one of LMDB's ``CORRUPTION`` errors on ``path``."""
    problem = "page_not_found" if isinstance(exc, lmdb.PageNotFoundError) else "corrupted"
    return damaged(path, problem, f"LMDB reports {exc}")


def read_marker(directory: str) -> str:
    """The text ``mark_committed`` wrote (the meta record as JSON); ``OSError``
    when there is none."""
    return (pathlib.Path(directory) / MARKER).read_text(encoding="utf-8")


def mark_committed(directory: str, content: str) -> None:
    """Write the ``MARKER`` file (atomically, synced) once data is committed."""
    marker = pathlib.Path(directory) / MARKER
    if marker.exists():
        return
    tmp = marker.with_name(f".{MARKER}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
    tmp.replace(marker)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _take_writer_lock(directory: pathlib.Path) -> int:
    fd = os.open(directory / _LOCK_FILE, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        msg = (
            f"store {directory} is held by another node (pid {holder}); "
            "one node writes a store at a time — read it with a read-only open"
        )
        raise StoreLockedError(msg) from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _lock_fds.add(fd)
    return fd


def _release(real: str, lock_fd: int | None) -> None:
    if lock_fd is not None:
        _lock_fds.discard(lock_fd)
        with contextlib.suppress(OSError):
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
    with _open_lock:
        _open_paths.pop(real, None)


def close_env(opened: Opened, *, clean: bool = False) -> None:
    """Close the environment and release the directory (idempotent per ``Opened``).
    ``clean``: a writer's clean close (nothing left to commit, its handle not
    fenced): the data is synced, every page walked, and, when whole, the
    close recorded (``_clean``) before the writer lock is released, so the
    next open need not walk it. Never raises for the walk: damage found is
    logged and leaves no record (the next open walks and refuses the file)."""
    if opened.pid == _pid:
        clean = clean and not opened.readonly and opened.lock_fd is not None
        if clean:
            data = os.path.join(opened.path, "data.mdb")
            try:
                opened.env.sync(True)
                _check_pages(opened.env, data)  # what the next open then need not walk
            except StoreDamagedError as exc:
                log.error("%s (found on closing it; the next open refuses it)", exc)
                clean = False
            except (lmdb.Error, OSError) as exc:
                log.warning("store %s: the close is not recorded as clean: %r", opened.path, exc)
                clean = False
        opened.env.close()
        if clean:
            record_clean_close(opened.path)
        _release(opened.path, opened.lock_fd)
    # After a fork the child must not touch the parent's environment or lock.
