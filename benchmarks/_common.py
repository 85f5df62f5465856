"""What the benchmarks share: logging to stderr, durable stores on a real disk,
and timed windows of producers writing to a store (threads or coroutines).

Each script runs as ``python benchmarks/bench_x.py``, so this directory is on
``sys.path`` and ``from _common import ...`` finds this module.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sessiontree.store import Store

__all__ = [
    "SYNC_CHECKS",
    "async_window",
    "fdatasync_ms",
    "filesystem_of",
    "log",
    "on_fresh_store",
    "open_synced",
    "real_disk_dir",
    "thread_window",
]


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


T = TypeVar("T")


def on_fresh_store(
    base: str, prefix: str, run: Callable[[Store], T], *, group_commit: bool = True
) -> T:
    """``run(store)`` on a new synced store in a temporary directory under
    ``base`` (garbage collected first); the store is closed and removed after."""
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        store = open_synced(path, group_commit=group_commit)
        try:
            gc.collect()
            return run(store)
        finally:
            store.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


class _Window:
    """Acknowledged writes (``unit``s) and commits over a timed window."""

    def __init__(self, store: Store, counts: list[int], unit: str) -> None:
        self.store, self.counts, self.unit = store, counts, unit
        self.t0 = 0.0
        self.w0 = self.c0 = 0

    def start(self) -> None:
        self.w0, self.c0 = sum(self.counts), self.store.stats()["commits"]
        self.t0 = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        w1, c1 = sum(self.counts), self.store.stats()["commits"]
        elapsed = time.perf_counter() - self.t0
        writes, commits = w1 - self.w0, c1 - self.c0
        unit = self.unit
        return {
            f"{unit}s": writes,
            "commits": commits,
            "window_s": elapsed,
            f"{unit}s_per_s": writes / elapsed,
            "commits_per_s": commits / elapsed,
            f"{unit}s_per_commit": writes / commits if commits else None,
        }


def thread_window(
    store: Store,
    steps: Sequence[Callable[[], object]],
    warmup: float,
    window: float,
    unit: str,
) -> dict[str, Any]:
    """One thread per step, each calling its step (one acknowledged write) over
    and over; figures of the ``window`` seconds after a ``warmup``. A producer's
    exception is raised here once all have stopped."""
    counts = [0] * len(steps)
    stop = threading.Event()
    errors: list[BaseException] = []
    start = threading.Barrier(len(steps) + 1)

    def producer(i: int, step: Callable[[], object]) -> None:
        try:
            start.wait()
            while not stop.is_set():
                step()
                counts[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=producer, args=(i, step), name=f"producer-{i}", daemon=True)
        for i, step in enumerate(steps)
    ]
    for thread in threads:
        thread.start()
    start.wait()
    measure = _Window(store, counts, unit)
    time.sleep(warmup)
    measure.start()
    time.sleep(window)
    figures = measure.stop()
    stop.set()
    for thread in threads:
        thread.join(60.0)
    if errors:
        raise errors[0]
    return figures


def async_window(
    store: Store,
    steps: Sequence[Callable[[], Awaitable[object]]],
    warmup: float,
    window: float,
    unit: str,
) -> dict[str, Any]:
    """``thread_window`` with one coroutine per step, all on one event loop."""
    counts = [0] * len(steps)

    async def main() -> dict[str, Any]:
        stop = asyncio.Event()

        async def producer(i: int, step: Callable[[], Awaitable[object]]) -> None:
            while not stop.is_set():
                await step()
                counts[i] += 1

        tasks = [asyncio.create_task(producer(i, step)) for i, step in enumerate(steps)]
        measure = _Window(store, counts, unit)
        await asyncio.sleep(warmup)
        measure.start()
        await asyncio.sleep(window)
        figures = measure.stop()
        stop.set()
        await asyncio.gather(*tasks)
        return figures

    return asyncio.run(main())
