"""A hot copy of a store's file, as ``mdb_copy`` makes it.

LMDB copies the environment from one read transaction, so the copy is one
consistent snapshot even while the writer commits (the writer only has to
keep the pages of that snapshot until the copy ends, so the file may grow
meanwhile). The copy is written into a hidden directory beside the
destination, synced, then renamed into place: a destination that exists is
a whole backup.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import time
from dataclasses import dataclass

import lmdb

from sessiontree.protocol import StoreError
from sessiontree.store._env import CORRUPTION, DIR_MODE, FILE_MODE, MARKER, damaged_by
from sessiontree.store._pages import read_meta

__all__ = ["Backup", "copy_env"]


@dataclass(frozen=True)
class Backup:
    """What ``Store.backup`` wrote: the directory, the bytes of its ``data.mdb``,
    the transaction id it holds (every commit up to it), and the seconds taken."""

    path: str
    bytes: int
    txnid: int
    seconds: float
    compact: bool


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
    started = time.perf_counter()
    target = pathlib.Path(dest).absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        msg = f"backup destination {target} exists and is not an empty directory"
        raise StoreError(msg)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=DIR_MODE, parents=True)
        try:
            txnid = _copy(env, str(partial), compact=compact, txn=txn)
        except CORRUPTION as exc:
            raise damaged_by(os.path.join(source, "data.mdb"), exc) from exc
        except lmdb.Error as exc:
            msg = f"cannot back the store {source} up to {target}: {exc}"
            raise StoreError(msg) from exc
        data = partial / "data.mdb"
        os.chmod(data, FILE_MODE)  # LMDB writes the copy as the umask allows
        _fsync(data)
        marker = pathlib.Path(source) / MARKER
        if marker.exists():
            shutil.copyfile(marker, partial / MARKER)
            os.chmod(partial / MARKER, FILE_MODE)
            _fsync(partial / MARKER)
        _fsync(partial)
        if txnid is None:
            txnid = read_meta(str(data)).txnid  # a plain copy keeps the source's
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
    return Backup(str(target), size, txnid, time.perf_counter() - started, compact)


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
