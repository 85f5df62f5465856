"""The record of a clean close: what lets an open skip walking every page.

Before LMDB maps ``data.mdb`` the store walks every page in use
(``_pages.check_tree``): a page of junk would end the process on one of
LMDB's assertions. The walk costs time in proportion to the file (about
1.5 s for a file of 1.8 GB), not to what is live. A file nothing has
written since its writer closed it cleanly needs no walk, and
``CLOSED`` says which file that is.

A writer's clean close (its writer thread stopped, nothing fenced, the
data synced) walks every page itself, and when the file is whole (the
environment closed, the writer lock still held) writes ``CLOSED`` beside
``data.mdb``: its device, inode, size, modification time and the
transaction of its current meta page. So the walk moves from the next
start to this stop, and a page damaged while the node ran is still found
before LMDB next maps the file. The modification time is set
back first, to two seconds before the close with random nanoseconds, so that
any later write to the file, even one within the same tick of the clock
(file times are coarse), leaves a time the record does not hold. An open
skips the walk only when every figure still matches; a writer's open
removes the record (synced) before LMDB opens the file, so a run that ends
in a crash, or a power loss, leaves none, and the next open walks.

What a matching record cannot see: the disk itself changing the bytes at
rest, with no write through the file system (a failing disk). Those are
LMDB's to meet, as they are for pages read after any open.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time

from sessiontree.store._pages import Meta, read_meta

__all__ = ["CLOSED", "forget_clean_close", "record_clean_close", "unchanged_since_clean_close"]

#: Written beside data.mdb by a clean close; removed by the next writer's open.
CLOSED = "sessiontree.closed"


def _figures(data: str, meta: Meta) -> dict[str, int]:
    st = os.stat(data)
    return {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "txnid": meta.txnid,
        "last_page": meta.last_page,
    }


def record_clean_close(directory: str) -> None:
    """Write ``CLOSED`` for ``directory``'s ``data.mdb`` as it is now. Call it
    only once the environment is synced and closed, while the writer lock is
    still held. A failure (``OSError``, a damaged meta page) leaves no record:
    the next open walks."""
    data = os.path.join(directory, "data.mdb")
    record = os.path.join(directory, CLOSED)
    try:
        st = os.stat(data)
        # Two whole seconds back: earlier than any later write's time on any file
        # system's granularity (one second at worst), and, where the times keep
        # nanoseconds, random below the second.
        before = (int(time.time()) - 2) * 1_000_000_000 + secrets.randbelow(1_000_000_000)
        os.utime(data, ns=(st.st_atime_ns, before))
        figures = _figures(data, read_meta(data))
        tmp = os.path.join(directory, f".{CLOSED}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(json.dumps(figures, sort_keys=True) + "\n")
        os.replace(tmp, record)
    except Exception:  # noqa: BLE001 - no record is always safe: the next open walks
        with contextlib.suppress(OSError):
            os.unlink(record)


def unchanged_since_clean_close(directory: str, meta: Meta) -> bool:
    """Whether ``directory``'s ``data.mdb`` (whose current meta page is
    ``meta``) is the very file a clean close left: ``CLOSED`` is there and
    every figure in it matches. Never raises: anything unreadable is False."""
    data = os.path.join(directory, "data.mdb")
    try:
        with open(os.path.join(directory, CLOSED), encoding="utf-8") as file:
            recorded = json.loads(file.read())
        return bool(recorded == _figures(data, meta))
    except (OSError, ValueError):
        return False


def forget_clean_close(directory: str) -> None:
    """Remove ``CLOSED`` (a writer's open, before its first write), synced so
    that no crash brings it back; ``OSError`` when it cannot be removed."""
    try:
        os.unlink(os.path.join(directory, CLOSED))
    except FileNotFoundError:
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
