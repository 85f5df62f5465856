"""What the benchmarks share: logging to stderr, and durable stores on a real disk.

Each script runs as ``python benchmarks/bench_x.py``, so this directory is on
``sys.path`` and ``from _common import ...`` finds this module.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from sessiontree.store import Store

__all__ = ["SYNC_CHECKS", "fdatasync_ms", "filesystem_of", "log", "open_synced", "real_disk_dir"]


def log(msg: str) -> None:
    """Progress on stderr (stdout carries only the final JSON line)."""
    print(msg, file=sys.stderr, flush=True)


def filesystem_of(path: str) -> str:
    """The type of the filesystem ``path`` is on (longest mount-point match)."""
    real = os.path.realpath(path)
    best, fstype = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) > len(best):
                    best, fstype = mount, parts[2]
    except OSError:
        pass
    return fstype


def real_disk_dir(name: str, parent: str | None) -> tuple[str, str] | None:
    """A new temporary directory for ``name``'s stores under ``parent`` (default:
    the system's temporary directory) and its filesystem type; None, logged, when
    that is a RAM filesystem (durable-write figures would mean nothing there)."""
    parent = parent or tempfile.gettempdir()
    fstype = filesystem_of(parent)
    if fstype in ("tmpfs", "ramfs"):
        log(f"{name}: {parent} is on {fstype}; pass --dir on a real disk")
        return None
    return tempfile.mkdtemp(prefix=f"{name}-", dir=parent), fstype


def fdatasync_ms(directory: str, n: int = 200) -> float:
    """Median latency of a 4 KiB pwrite + fdatasync in ``directory``."""
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    times = []
    try:
        block = b"\xa5" * 4096
        for i in range(n):
            t0 = time.perf_counter()
            os.pwrite(fd, block, (i % 16) * 4096)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times) * 1000.0


#: One entry per store ``open_synced`` opened: were its commits synced?
SYNC_CHECKS: list[bool] = []


def open_synced(path: str, *, group_commit: bool = True) -> Store:
    """A store whose commits are fsync'd before they return (asserted: LMDB's
    own ``sync`` and ``metasync`` flags of the open environment)."""
    store = Store(path, group_commit=group_commit)
    flags = store._opened.env.flags()
    synced = bool(store.sync and flags["sync"] and flags["metasync"])
    SYNC_CHECKS.append(synced)
    if not synced:
        store.close()
        msg = f"store {path} is not synced: {flags}"
        raise AssertionError(msg)
    return store
