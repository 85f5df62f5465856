"""A hot copy of a store's file, as ``mdb_copy`` makes it.

LMDB copies the environment from one read transaction, so the copy is one
consistent snapshot even while the writer commits (the writer only has to
keep the pages of that snapshot until the copy ends, so the file may grow
meanwhile). The copy is written into a hidden directory beside the
destination, synced, then renamed into place: a destination that exists is
a whole backup. ``backup_from_meta_page`` copies a store whose newer meta
page is damaged as its other meta page describes it.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

import lmdb

from sessiontree.protocol import StoreError
from sessiontree.store._env import (
    CORRUPTION,
    DATABASES,
    DIR_MODE,
    FILE_MODE,
    MARKER,
    damaged_by,
)
from sessiontree.store._pages import (
    Meta,
    check_length,
    check_tree,
    damaged,
    out_of_bounds,
    read_meta,
    read_meta_pages,
)

__all__ = ["Backup", "backup_from_meta_page", "copy_env"]


@dataclass(frozen=True)
class Backup:
    """What ``Store.backup`` wrote: the directory, the bytes of its ``data.mdb``,
    the transaction id it holds (every commit up to it), and the seconds taken."""

    path: str
    bytes: int
    txnid: int
    seconds: float
    compact: bool
    meta_page: int | None = None  # copied as this meta page describes it (a damaged other)


def copy_env(
    env: lmdb.Environment,
    source: str,
    dest: str | os.PathLike[str],
    *,
    compact: bool,
    txn: lmdb.Transaction,
) -> Backup:
    """Copy ``env`` (the store at ``source``) into ``dest``, which must not exist
    or be an empty directory; ``txn`` is a read transaction of ``env`` held
    meanwhile (a compacted copy is made from its snapshot, and says so: its
    own file starts again at transaction 1). The directory is made 0700 and
    its files 0600. Raises ``StoreError`` naming ``dest`` when it is taken or
    cannot be written (nothing is left behind then), ``StoreDamagedError``
    when LMDB finds a damaged page while copying."""

    def fill(partial: pathlib.Path) -> int:
        try:
            txnid = _copy(env, str(partial), compact=compact, txn=txn)
        except CORRUPTION as exc:
            raise damaged_by(os.path.join(source, "data.mdb"), exc) from exc
        except lmdb.Error as exc:
            msg = f"cannot back the store {source} up to {dest}: {exc}"
            raise StoreError(msg) from exc
        if txnid is None:  # a plain copy keeps the source's in its meta page
            txnid = read_meta(str(partial / "data.mdb")).txnid
        return txnid

    return _write(source, dest, fill, compact=compact)


def backup_from_meta_page(
    source: str | os.PathLike[str], dest: str | os.PathLike[str], page: int
) -> Backup:
    """Copy the store at ``source``, whose other meta page is damaged, into
    ``dest`` as meta page ``page`` (0 or 1) describes it: the file with that
    page in both places, so LMDB opens it at that page's transaction (commits
    after it, if the damaged page held one, are not in the copy). LMDB keeps
    the pages of the snapshot before its last commit untouched, which is what
    makes the older page's snapshot whole.

    Raises ``StoreDamagedError`` (``bad_meta``) when that page does not read
    whole either (not a meta page, figures out of bounds, past the file's
    end), or the copy's tree does not walk clean; ``StoreError`` as
    ``copy_env`` for ``dest``, and when LMDB cannot open the copy."""
    data = str(pathlib.Path(source).absolute() / "data.mdb")
    size, pages = read_meta_pages(data)
    chosen = pages[page]
    why = chosen if not isinstance(chosen, Meta) else out_of_bounds(chosen)
    if why is None and isinstance(chosen, Meta) and chosen.length > size:
        why = f"needs {chosen.length} bytes, the file has {size}"
    if why is not None or not isinstance(chosen, Meta):
        raise damaged(data, "bad_meta", f"meta page {page} does not read whole either ({why})")
    psize = chosen.page_size

    def fill(partial: pathlib.Path) -> int:
        copy = partial / "data.mdb"
        shutil.copyfile(data, copy)
        os.chmod(copy, FILE_MODE)
        with copy.open("r+b") as file:
            file.seek(page * psize)
            raw = file.read(psize)
            other = 1 - page
            file.seek(other * psize)
            file.write(other.to_bytes(8, "little") + raw[8:])  # its header names its place
        meta = read_meta(str(copy))
        check_length(str(copy), meta)
        check_tree(str(copy), meta)
        _opens(partial)
        return chosen.txnid

    return _write(str(source), dest, fill, compact=False, meta_page=page)


def _opens(directory: pathlib.Path) -> None:
    """``StoreError`` unless LMDB opens the store in ``directory`` and reads its
    databases (read-only, without a lock file)."""
    try:
        env = lmdb.open(str(directory), readonly=True, lock=False, max_dbs=len(DATABASES) + 2)
        try:
            with env.begin() as txn:
                for name in DATABASES:
                    with contextlib.suppress(lmdb.NotFoundError):
                        txn.stat(env.open_db(name.encode(), txn=txn, create=False))
        finally:
            env.close()
    except lmdb.Error as exc:
        msg = f"LMDB cannot open the copy in {directory}: {exc}"
        raise StoreError(msg) from exc


def _write(
    source: str,
    dest: str | os.PathLike[str],
    fill: Callable[[pathlib.Path], int],
    *,
    compact: bool,
    meta_page: int | None = None,
) -> Backup:
    """Make ``dest`` a backup of ``source``: ``fill`` writes ``data.mdb`` into a
    hidden directory beside it and returns the transaction the copy holds;
    the marker is copied, everything synced, and the directory renamed into
    place."""
    started = time.perf_counter()
    target = pathlib.Path(dest).absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        msg = f"backup destination {target} exists and is not an empty directory"
        raise StoreError(msg)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=DIR_MODE, parents=True)
        txnid = fill(partial)
        data = partial / "data.mdb"
        os.chmod(data, FILE_MODE)  # LMDB writes a copy as the umask allows
        _fsync(data)
        marker = pathlib.Path(source) / MARKER
        if marker.exists():
            shutil.copyfile(marker, partial / MARKER)
            os.chmod(partial / MARKER, FILE_MODE)
            _fsync(partial / MARKER)
        _fsync(partial)
        size = data.stat().st_size
        if target.exists():
            target.rmdir()  # empty, checked above
        partial.rename(target)
        _fsync(target.parent)
    except OSError as exc:
        msg = f"cannot back the store {source} up to {target}: {exc}"
        raise StoreError(msg) from exc
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(partial)
    seconds = time.perf_counter() - started
    return Backup(str(target), size, txnid, seconds, compact, meta_page)


def _copy(env: lmdb.Environment, path: str, *, compact: bool, txn: lmdb.Transaction) -> int | None:
    """``env.copy`` into ``path``: the source's transaction id a compacted copy
    holds (None for a plain copy: its meta page says)."""
    if not compact:
        env.copy(path)  # LMDB takes its own snapshot, no older than ``txn``'s
        return None
    try:
        env.copy(path, compact=True, txn=txn)
    except TypeError:  # an LMDB built without copying from a given transaction
        env.copy(path, compact=True)  # a snapshot no older than txn's: at least that
    return int(txn.id())


def _fsync(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
