"""The LMDB store under faults and bad input: a kill -9 mid-write, a full
map, a damaged file, stale readers.

Every test opens real LMDB files in ``tmp_path``. Events are ordered with
``threading.Event`` and bounded waits, other processes are real
subprocesses (or ``os.fork``) that report on a pipe, and disk faults are
injected through a ``StoreIO`` subclass.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import pathlib
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import lmdb
import msgspec
import pytest

from sessiontree.protocol import (
    CorruptRecordError,
    ErrorCode,
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    StoreError,
    StoreFullError,
    StoreLockedError,
)
from sessiontree.store import (
    SCHEMA_VERSION,
    ContextEntry,
    ContextRecord,
    QuarantineRecord,
    SessionRecord,
    Store,
    StoreIO,
    WriteBatch,
    decode_record,
)

WAIT = 10.0  # real seconds any bounded wait may take before the test fails
MIB = 1 << 20


# -- helpers ---------------------------------------------------------------------------


def _info(session_id: uuid.UUID | None = None, *, task: str = "") -> SessionInfo:
    return SessionInfo(
        session_id=session_id or uuid.uuid4(),
        agent_id="agent",
        parent_id=None,
        kind=SessionKind.MAIN,
        state=SessionState.ACTIVE,
        depth=0,
        created_at=1_700_000_000.0,
        ttl=None,
        deadline=None,
        task=task,
    )


def _record(session_id: uuid.UUID | None = None, *, task: str = "") -> SessionRecord:
    return SessionRecord(info=_info(session_id, task=task), updated_at=1_700_000_001.0)


def _write_sessions(store: Store, n: int, *, task: str = "t") -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    batch = store.batch()
    for i, session_id in enumerate(ids):
        batch.session(_record(session_id, task=f"{task}{i}"))
    store.write(batch)
    return ids


def _raw_keys(store: Store, db: str) -> set[bytes]:
    return {key for key, _ in store.scan(db)}


class Child:
    """A Python subprocess that reports line by line; reads are bounded."""

    def __init__(self, code: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,  # unbuffered: select() on stdout sees every line
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def line(self, timeout: float = WAIT) -> str:
        """The next line it printed; fails the test after ``timeout`` or at its exit."""
        assert self.proc.stdout is not None
        out = bytearray()
        deadline = time.monotonic() + timeout
        while not out.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0.0))
            if not ready:
                pytest.fail(f"child {self.pid} printed nothing within {timeout} s: {out!r}")
            byte = self.proc.stdout.read(1)
            if not byte:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                pytest.fail(f"child {self.pid} ended before printing a line: {err}")
            out += byte
        return out.decode().strip()

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT)

    def finish(self) -> int:
        """Close its stdin (its cue to end) and wait for its exit code."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(WAIT)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.kill()
        for stream in (child.proc.stdin, child.proc.stdout, child.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def spawn(children: list[Child]) -> Any:
    def start(code: str, *args: str) -> Child:
        child = Child(code, *args)
        children.append(child)
        return child

    return start


class GateIO(StoreIO):
    """Holds the writer in ``begin`` once armed, so a test can queue batches
    behind it and release them into one group."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def begin(self, env: lmdb.Environment) -> lmdb.Transaction:
        if self.armed:
            self.armed = False
            self.entered.set()
            if not self.release.wait(WAIT):
                raise OSError(errno.ETIMEDOUT, "the test never released the writer")
        return super().begin(env)

    def hold(self, store: Store) -> Any:
        """Submit a batch (one put to the unused ``messages`` db) and return its
        future once the writer holds on it."""
        self.armed = True
        future = store.submit(store.batch().raw("messages", b"gate", b""))
        assert self.entered.wait(WAIT)
        return future


class FaultIO(StoreIO):
    """Raises ``error`` at ``stage`` for the next ``times`` transactions. A put
    fault strikes the second put of a transaction, after the first one went in."""

    def __init__(self) -> None:
        self.stage: str | None = None
        self.error: BaseException | None = None
        self.times = 0
        self.puts_in_txn = 0

    def arm(self, stage: str, error: BaseException, times: int = 1) -> None:
        self.stage, self.error, self.times = stage, error, times

    def _strike(self, stage: str) -> None:
        if self.stage == stage and self.times > 0:
            self.times -= 1
            assert self.error is not None
            raise self.error

    def begin(self, env: lmdb.Environment) -> lmdb.Transaction:
        self._strike("begin")
        self.puts_in_txn = 0
        return super().begin(env)

    def put(self, txn: lmdb.Transaction, db: Any, key: bytes, value: bytes) -> None:
        if self.puts_in_txn >= 1:
            self._strike("put")
        self.puts_in_txn += 1
        super().put(txn, db, key, value)

    def commit(self, txn: lmdb.Transaction) -> None:
        self._strike("commit")  # before LMDB commits: the disk refused the write
        super().commit(txn)


# -- acknowledged writes (19, 20) ------------------------------------------------------


@pytest.mark.parametrize("parent_ended", [False, True])
def test_an_ending_written_in_one_call_is_its_record_and_its_owed_or_filed_result(
    parent_ended: bool,
) -> None:
    parent_id, child_id = uuid.uuid4(), uuid.uuid4()
    result = SessionResult(session_id=child_id, status=SessionState.CANCELLED, parent_id=parent_id)
    record = msgspec.structs.replace(_record(child_id), result=result)
    one = WriteBatch().ended(record, parent_id, parent_ended=parent_ended)
    apart = WriteBatch().session(record)
    if parent_ended:
        apart.file(parent_id, result)
    else:
        apart.owe(parent_id, result)
    assert one.ops == apart.ops
    assert one.size == apart.size


def test_an_ending_whose_record_cannot_be_stored_adds_nothing() -> None:
    parent_id, child_id = uuid.uuid4(), uuid.uuid4()
    result = SessionResult(session_id=child_id, status=SessionState.COMPLETED, parent_id=parent_id)
    info = msgspec.structs.replace(_info(child_id), metadata={"bad": object()})
    batch = WriteBatch()
    with pytest.raises(RejectedInputError, match="SessionRecord"):
        batch.ended(SessionRecord(info=info, result=result), parent_id, parent_ended=False)
    with pytest.raises(RejectedInputError, match="result"):
        batch.ended(SessionRecord(info=_info(child_id)), parent_id, parent_ended=False)
    assert not batch


def test_a_write_is_readable_as_soon_as_write_returns(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path) as store:
        record = _record(task="hello")
        store.write(store.batch().session(record))
        stored = store.session(record.info.session_id)
        assert stored is not None
        assert stored == record
        assert stored.v == SCHEMA_VERSION


def test_an_awaited_write_is_readable_when_the_await_returns(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path) as store:
        record = _record(task="async")
        asyncio.run(store.awrite(store.batch().session(record)))
        assert store.session(record.info.session_id) == record


def test_every_acknowledged_write_is_there_after_reopening_the_store(
    tmp_path: pathlib.Path,
) -> None:
    written: dict[uuid.UUID, SessionRecord] = {}
    with Store(tmp_path) as store:
        for i in range(20):
            record = _record(task=f"write {i}")
            store.write(store.batch().session(record))
            written[record.info.session_id] = record
        futures = []
        for i in range(20):  # acknowledged by their futures, not by write()
            record = _record(task=f"submit {i}")
            futures.append(store.submit(store.batch().session(record)))
            written[record.info.session_id] = record
        for future in futures:
            future.result(WAIT)
    with Store(tmp_path) as reopened:
        found = [r for r in reopened.sessions() if isinstance(r, SessionRecord)]
        assert {r.info.session_id: r for r in found} == written
        assert reopened.count("sessions") == len(written)


def test_concurrent_writers_share_commits_and_every_write_is_there(
    tmp_path: pathlib.Path,
) -> None:
    threads_n, writes_each = 16, 50
    start = threading.Barrier(threads_n, timeout=WAIT)
    errors: list[BaseException] = []
    ids: list[list[uuid.UUID]] = [[] for _ in range(threads_n)]

    with Store(tmp_path) as store:
        before = store.stats()

        def writer(n: int) -> None:
            try:
                start.wait()
                for i in range(writes_each):
                    record = _record(task=f"{n}/{i}")
                    store.write(store.batch().session(record), timeout=WAIT)
                    ids[n].append(record.info.session_id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(threads_n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT * 3)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        after = store.stats()
        writes = threads_n * writes_each
        assert after["batches"] - before["batches"] == writes
        assert after["commits"] - before["commits"] < writes  # commits were shared
        assert after["write_errors"] == 0
    with Store(tmp_path) as reopened:
        stored = {r.info.session_id for r in reopened.sessions() if isinstance(r, SessionRecord)}
        assert stored == {i for per_thread in ids for i in per_thread}
        assert len(stored) == writes


def test_batches_queued_together_commit_in_one_transaction(tmp_path: pathlib.Path) -> None:
    io = GateIO()
    with Store(tmp_path, io=io) as store:
        held = io.hold(store)
        commits = store.stats()["commits"]
        records = [_record(task=str(i)) for i in range(100)]
        futures = [store.submit(store.batch().session(r)) for r in records]
        assert not any(f.done() for f in futures)  # nothing acknowledged before its commit
        io.release.set()
        held.result(WAIT)
        for future in futures:
            future.result(WAIT)
        assert store.stats()["commits"] - commits == 2  # the held batch, then all 100 at once
        assert all(store.session(r.info.session_id) == r for r in records)


_KILL_WRITER = """
import sys, uuid
from sessiontree.store import Store
store = Store(sys.argv[1])
i = 0
while True:
    parent, child = uuid.UUID(int=i + 1), uuid.UUID(int=10**9 + i)
    batch = store.batch().link(parent, child)
    batch.raw("sessions", parent.bytes, i.to_bytes(8, "big") * 512)
    store.write(batch)
    print(i, flush=True)
    i += 1
"""


def test_every_acknowledged_write_survives_a_kill_9_of_the_writing_process(
    tmp_path: pathlib.Path, spawn: Any
) -> None:
    child = spawn(_KILL_WRITER, str(tmp_path))
    acked = -1
    while acked < 200:
        acked = int(child.line())
    child.kill()  # mid-stream: it was writing the next batches
    with Store(tmp_path) as store:
        sessions = dict(store.scan("sessions"))
        links = _raw_keys(store, "children")
        for i in range(acked + 1):
            parent = uuid.UUID(int=i + 1)
            assert sessions.get(parent.bytes) == i.to_bytes(8, "big") * 512, f"write {i} lost"
        # each batch is atomic: its session value and its link are both there or both not
        for key in sessions:
            i = uuid.UUID(bytes=key).int - 1
            link = uuid.UUID(int=i + 1).bytes + uuid.UUID(int=10**9 + i).bytes
            assert link in links
        assert len(links) == len(sessions) >= acked + 1


def test_a_synced_store_fsyncs_data_and_metadata_on_every_commit(
    tmp_path: pathlib.Path,
) -> None:
    # Lost unsynced writes (LazyFS) cannot be simulated here; what the store
    # controls is that LMDB fsyncs before a commit returns.
    with Store(tmp_path) as store:
        flags = store._opened.env.flags()
        assert flags["sync"] is True
        assert flags["metasync"] is True
        assert store.sync is True


# -- map full (22) ---------------------------------------------------------------------


def _fill_until_full(store: Store) -> tuple[list[bytes], list[bytes], StoreFullError]:
    """Write 40 KiB batches until one does not fit: (written keys, keys of the failed batch)."""
    written: list[bytes] = []
    for n in range(10_000):
        keys = [n.to_bytes(4, "big") + i.to_bytes(4, "big") for i in range(10)]
        batch = store.batch()
        for key in keys:
            batch.raw("sessions", key, bytes([n % 251]) * 4000)
        try:
            store.write(batch)
        except StoreFullError as exc:
            return written, keys, exc
        written.extend(keys)
    pytest.fail("the map never filled")


def test_map_full_rolls_the_whole_batch_back_and_keeps_earlier_data(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path, map_size=MIB) as store:
        written, failed, exc = _fill_until_full(store)
        assert exc.code is ErrorCode.STORE_FULL
        assert written, "some batches fit before the map filled"
        present = _raw_keys(store, "sessions")
        assert present == set(written)  # earlier data intact
        assert not present & set(failed)  # nothing of the failed batch
        stats = store.stats()
        assert stats["store_full"] == 1
        assert stats["write_errors"] == 1
        assert store.count("sessions") == len(written)  # reads still served

        store.grow(8 * MIB)
        assert store.stats()["map_size"] == 8 * MIB
        batch = store.batch()
        for key in failed:
            batch.raw("sessions", key, b"x" * 4000)
        store.write(batch)  # the same batch fits now
        record = _record(task="after grow")
        store.write(store.batch().session(record))
        assert store.session(record.info.session_id) == record
        assert _raw_keys(store, "sessions") >= set(written) | set(failed)
        assert store.stats()["store_full"] == 1
    with Store(tmp_path, map_size=MIB) as reopened:  # the grown map is kept
        assert reopened.count("sessions") == len(written) + len(failed) + 1


def test_only_the_batch_that_does_not_fit_fails_in_a_shared_commit(
    tmp_path: pathlib.Path,
) -> None:
    io = GateIO()
    with Store(tmp_path, map_size=MIB, io=io) as store:
        held = io.hold(store)
        small_a, small_c = _record(task="a"), _record(task="c")
        too_big = store.batch().raw("sessions", b"too big", b"\0" * (2 * MIB))
        too_big.session(_record(task="b"))
        future_a = store.submit(store.batch().session(small_a))
        future_b = store.submit(too_big)
        future_c = store.submit(store.batch().session(small_c))
        io.release.set()
        held.result(WAIT)
        future_a.result(WAIT)
        with pytest.raises(StoreFullError):
            future_b.result(WAIT)
        future_c.result(WAIT)
        assert store.session(small_a.info.session_id) == small_a
        assert store.session(small_c.info.session_id) == small_c
        assert store.count("sessions") == 2  # nothing of the big batch
        assert store.stats()["store_full"] == 1


def test_growing_to_a_map_no_larger_than_the_current_one_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path, map_size=2 * MIB) as store:
        with pytest.raises(ValueError, match="not larger"):
            store.grow(MIB)
        assert store.stats()["map_size"] == 2 * MIB


def test_a_map_too_small_for_the_databases_is_refused_and_leaves_the_path_free(
    tmp_path: pathlib.Path,
) -> None:
    with pytest.raises(StoreFullError):
        Store(tmp_path, map_size=8192)
    with Store(tmp_path) as store:  # neither this process nor the lock kept it
        store.write(store.batch().session(_record()))
        assert store.count("sessions") == 1


# -- injected disk faults (21) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "code"),
    [
        ("put", errno.ENOSPC),
        ("commit", errno.EIO),
        ("begin", errno.EIO),
    ],
    ids=["ENOSPC-on-put", "EIO-on-commit", "EIO-on-begin"],
)
def test_an_injected_disk_error_acknowledges_nothing_and_the_writer_goes_on(
    tmp_path: pathlib.Path, stage: str, code: int
) -> None:
    io = FaultIO()
    with Store(tmp_path, io=io) as store:
        kept = _record(task="before")
        store.write(store.batch().session(kept))
        errors_before = store.stats()["write_errors"]

        io.arm(stage, OSError(code, os.strerror(code)), times=5)
        lost = [_record(task=f"lost {i}") for i in range(5)]
        for record in lost:
            batch = store.batch().session(record).link(uuid.UUID(int=1), record.info.session_id)
            with pytest.raises(StoreError, match=os.strerror(code)) as caught:
                store.write(batch)
            assert caught.value.code is ErrorCode.STORE_FAILED
        assert store.stats()["write_errors"] == errors_before + 5

        for record in lost:  # nothing of any failed batch
            assert store.session(record.info.session_id) is None
        assert store.children(uuid.UUID(int=1)) == []
        assert store.session(kept.info.session_id) == kept

        after = _record(task="after")  # no crash loop: the next write commits
        store.write(store.batch().session(after))
        assert store.session(after.info.session_id) == after
        assert store.writer_thread is not None
        assert store.writer_thread.is_alive()
        assert store.stats()["write_errors"] == errors_before + 5


def test_a_failed_commit_fails_every_batch_that_shared_it(tmp_path: pathlib.Path) -> None:
    class GatedFaults(GateIO, FaultIO):
        def __init__(self) -> None:
            GateIO.__init__(self)
            FaultIO.__init__(self)

    io = GatedFaults()
    with Store(tmp_path, io=io) as store:
        held = io.hold(store)
        records = [_record(task=str(i)) for i in range(10)]
        futures = [store.submit(store.batch().session(r)) for r in records]
        io.arm("commit", OSError(errno.EIO, "injected"), times=2)  # the held one, then the group
        io.release.set()
        with pytest.raises(StoreError):
            held.result(WAIT)
        for future in futures:
            with pytest.raises(StoreError, match="injected"):
                future.result(WAIT)
        assert store.count("sessions") == 0
        store.write(store.batch().session(records[0]))
        assert store.count("sessions") == 1


def test_an_unexpected_error_in_the_write_path_fails_the_batch_not_the_writer(
    tmp_path: pathlib.Path,
) -> None:
    io = FaultIO()
    with Store(tmp_path, io=io) as store:
        io.arm("put", RuntimeError("a bug in an I/O layer"))
        with pytest.raises(StoreError, match="a bug in an I/O layer"):
            store.write(store.batch().session(_record()).session(_record()), timeout=WAIT)
        with pytest.raises(StoreError, match="no_such_db"):
            store.write(store.batch().raw("no_such_db", b"k", b"v"), timeout=WAIT)
        record = _record()
        store.write(store.batch().session(record), timeout=WAIT)
        assert store.session(record.info.session_id) == record
        assert store.count("sessions") == 1
        assert store.stats()["write_errors"] == 2


def test_a_store_whose_first_commit_fails_raises_and_leaves_the_path_free(
    tmp_path: pathlib.Path,
) -> None:
    io = FaultIO()
    io.arm("commit", OSError(errno.EIO, "injected"))
    with pytest.raises(StoreError, match="injected"):
        Store(tmp_path, io=io)
    with Store(tmp_path) as store:  # not left open in this process, nor locked
        assert store.meta is not None
        assert store.count("meta") == 1


def test_a_closed_store_refuses_reads_and_writes(tmp_path: pathlib.Path) -> None:
    store = Store(tmp_path)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.write(store.batch().session(_record()))
    with pytest.raises(StoreError, match="closed"):
        store.session(uuid.uuid4())


# -- corrupt and unknown records (23) --------------------------------------------------


def _corrupt_bytes() -> bytes:
    # 0xc1 is never used by msgpack; the rest is seeded noise
    return b"\xc1" + random.Random(23).randbytes(63)


def _future_bytes(session_id: uuid.UUID | None = None) -> bytes:
    """A session record stamped with a schema version this code does not know."""
    return msgspec.msgpack.encode(msgspec.structs.replace(_record(session_id), v=99))


@pytest.mark.parametrize(
    ("bad_value", "reason"),
    [
        pytest.param(_corrupt_bytes(), "does not decode as SessionRecord", id="random-bytes"),
        pytest.param(_future_bytes(), "schema version 99", id="unknown-version"),
    ],
)
def test_an_unreadable_session_raises_corrupt_record_error_naming_db_and_key(
    tmp_path: pathlib.Path, bad_value: bytes, reason: str
) -> None:
    bad_id = uuid.uuid4()
    with Store(tmp_path) as store:
        store.write(store.batch().raw("sessions", bad_id.bytes, bad_value))
        with pytest.raises(CorruptRecordError) as caught:
            store.session(bad_id)
        error = caught.value
        assert error.db == "sessions"
        assert error.key == bad_id.bytes
        assert "sessions" in str(error)
        assert bad_id.bytes.hex() in str(error)
        assert error.code is ErrorCode.CORRUPT_RECORD
        assert reason in str(error)


def test_listing_sessions_yields_the_bad_records_as_errors_and_keeps_the_good_ones(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path) as store:
        good = _write_sessions(store, 5)
        corrupt_id, future_id = uuid.uuid4(), uuid.uuid4()
        batch = store.batch().raw("sessions", corrupt_id.bytes, _corrupt_bytes())
        batch.raw("sessions", future_id.bytes, _future_bytes(future_id))
        store.write(batch)

        items = list(store.sessions())
        records = [i for i in items if isinstance(i, SessionRecord)]
        errors = [i for i in items if isinstance(i, CorruptRecordError)]
        assert {r.info.session_id for r in records} == set(good)
        assert {e.key for e in errors} == {corrupt_id.bytes, future_id.bytes}
        assert all(e.db == "sessions" for e in errors)
        assert len(items) == 7


def test_a_quarantined_record_leaves_its_database_and_is_listed_with_its_bytes(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path) as store:
        good = _write_sessions(store, 2)
        bad_id = uuid.uuid4()
        store.write(store.batch().raw("sessions", bad_id.bytes, _corrupt_bytes()))
        with pytest.raises(CorruptRecordError) as caught:
            store.session(bad_id)
        quarantined = QuarantineRecord(
            db=caught.value.db,
            key=caught.value.key,
            raw=_corrupt_bytes(),
            reason=str(caught.value),
            at=1.0,
        )
        store.write(store.batch().quarantine(quarantined))
        assert store.session(bad_id) is None
        assert all(isinstance(r, SessionRecord) for r in store.sessions())
        assert {r.info.session_id for r in store.sessions() if isinstance(r, SessionRecord)} == (
            set(good)
        )
        assert store.quarantine_list() == [quarantined]


# -- a msgpack length-prefix bomb (34) -------------------------------------------------

_BOMBS = {
    "array32": b"\xdd\xff\xff\xff\xff",
    "map32": b"\xdf\xff\xff\xff\xff",
    "bin32": b"\xc6\xff\xff\xff\xff",
    "str32": b"\xdb\xff\xff\xff\xff",
}


def _nested_bomb(bomb: bytes) -> bytes:
    """A valid session record whose context message content (typed Any) is the bomb."""
    entry = ContextEntry(role="user", content="PLACEHOLDER")
    record = msgspec.structs.replace(_record(), context=ContextRecord(messages=[entry]))
    raw = msgspec.msgpack.encode(record)
    marker = msgspec.msgpack.encode("PLACEHOLDER")
    assert raw.count(marker) == 1
    return raw.replace(marker, bomb)


@pytest.mark.parametrize("where", ["top-level", "nested-in-any"])
@pytest.mark.parametrize("bomb", list(_BOMBS.values()), ids=list(_BOMBS))
def test_a_length_prefix_bomb_is_refused_quickly_without_a_huge_allocation(
    tmp_path: pathlib.Path, bomb: bytes, where: str
) -> None:
    value = bomb if where == "top-level" else _nested_bomb(bomb)
    bad_id = uuid.uuid4()
    with Store(tmp_path) as store:
        store.write(store.batch().raw("sessions", bad_id.bytes, value))
        tracemalloc.start()
        try:
            started = time.perf_counter()
            with pytest.raises(CorruptRecordError) as caught:
                store.session(bad_id)
            elapsed = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert caught.value.key == bad_id.bytes
        assert peak < 4 * MIB, f"decoding the bomb allocated {peak} bytes"
        assert elapsed < 1.0
        # also straight through the decoder, with no store around it
        with pytest.raises(CorruptRecordError):
            decode_record(SessionRecord, value, db="sessions", key=bad_id.bytes)


# -- schema evolution (30, 35) ---------------------------------------------------------


class SessionRecordV1(msgspec.Struct, kw_only=True):
    """SessionRecord as schema version 1 wrote it (frozen copy: no ``resume``)."""

    v: int = 1
    info: SessionInfo
    context: ContextRecord | None = None
    result: SessionResult | None = None
    updated_at: float = 0.0


class SessionRecordWithAFutureField(msgspec.Struct, kw_only=True):
    """A current-version record carrying a field this code does not know."""

    v: int = SCHEMA_VERSION
    info: SessionInfo
    context: ContextRecord | None = None
    result: SessionResult | None = None
    updated_at: float = 0.0
    resume: bool = False
    priority: list[int] = msgspec.field(default_factory=lambda: [1, 2, 3])


def test_a_v1_session_record_reads_with_the_current_code(tmp_path: pathlib.Path) -> None:
    old = SessionRecordV1(
        info=_info(task="old"),
        context=ContextRecord(system_prompt="be brief"),
        updated_at=5.0,
    )
    raw = msgspec.msgpack.encode(old)
    assert b"resume" not in raw
    with Store(tmp_path) as store:
        store.write(store.batch().raw("sessions", old.info.session_id.bytes, raw))
        record = store.session(old.info.session_id)
    assert record is not None
    assert record.v == 1
    assert record.resume is False
    assert record.info == old.info
    assert record.context == old.context
    assert record.updated_at == old.updated_at


def test_a_current_session_record_reads_with_the_v1_struct() -> None:
    current = msgspec.structs.replace(_record(task="new"), resume=True)
    raw = msgspec.msgpack.encode(current)
    old = msgspec.msgpack.decode(raw, type=SessionRecordV1)  # `resume` skipped
    assert old.v == SCHEMA_VERSION
    assert old.info == current.info
    assert old.updated_at == current.updated_at


def test_an_unknown_field_in_a_stored_record_is_skipped(tmp_path: pathlib.Path) -> None:
    newer = SessionRecordWithAFutureField(info=_info(task="newer"), resume=True)
    with Store(tmp_path) as store:
        raw = msgspec.msgpack.encode(newer)
        store.write(store.batch().raw("sessions", newer.info.session_id.bytes, raw))
        record = store.session(newer.info.session_id)
        assert record is not None
        assert record.info == newer.info
        assert record.resume is True
        assert [r for r in store.sessions() if isinstance(r, CorruptRecordError)] == []


def test_every_stored_record_carries_its_schema_version(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path) as store:
        _write_sessions(store, 3)
        for _, raw in [*store.scan("sessions"), *store.scan("meta")]:
            assert msgspec.msgpack.decode(raw)["v"] == SCHEMA_VERSION


# -- one node per directory, one environment per path (25, 27) -------------------------

_HOLD_WRITER = """
import sys
from sessiontree.store import Store
store = Store(sys.argv[1])
print("ready", flush=True)
sys.stdin.read()
store.close()
"""


def test_a_second_node_on_the_same_directory_is_refused_until_the_holder_dies(
    tmp_path: pathlib.Path, spawn: Any
) -> None:
    holder = spawn(_HOLD_WRITER, str(tmp_path))
    assert holder.line() == "ready"
    with pytest.raises(StoreLockedError, match=rf"pid {holder.pid}\b") as caught:
        Store(tmp_path)
    assert caught.value.code is ErrorCode.STORE_LOCKED
    holder.kill()
    with Store(tmp_path) as store:  # the kernel released the dead node's lock
        store.write(store.batch().session(_record()))
        assert store.count("sessions") == 1


def test_opening_the_same_path_twice_in_one_process_is_refused(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path) as store:
        with pytest.raises(StoreLockedError, match="already open in this process"):
            Store(tmp_path)
        with pytest.raises(StoreLockedError, match="already open in this process"):
            Store(tmp_path, readonly=True)
        with pytest.raises(StoreLockedError):  # another spelling of the same directory
            Store(tmp_path / ".." / tmp_path.name)
        store.write(store.batch().session(_record()))  # the first one is undisturbed
        assert store.count("sessions") == 1
    with Store(tmp_path, readonly=True) as again:
        assert again.count("sessions") == 1


_FORK_AND_HOLD = """
import os, sys
from sessiontree.store import Store
store = Store(sys.argv[1])
if os.fork() == 0:  # a forked worker that outlives its parent
    print(os.getpid(), flush=True)  # the fork handlers have run by now
    sys.stdin.buffer.read()
    os._exit(0)
sys.stdin.buffer.read()
"""


def test_a_forked_child_does_not_keep_the_store_locked_after_its_parent_dies(
    tmp_path: pathlib.Path, spawn: Any
) -> None:
    parent = spawn(_FORK_AND_HOLD, str(tmp_path))
    grandchild = int(parent.line())
    try:
        parent.kill()
        os.kill(grandchild, 0)  # still alive, holding whatever it inherited
        with Store(tmp_path) as store:
            store.write(store.batch().session(_record()))
            assert store.count("sessions") == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


# -- read-only opens beside a live writer ----------------------------------------------

_READ_ONLY_COUNT = """
import sys, threading
from concurrent.futures import ThreadPoolExecutor
from sessiontree.store import Store
with Store(sys.argv[1], readonly=True) as store, ThreadPoolExecutor(8) as pool:
    print(store.count("sessions"), flush=True)
    start = threading.Barrier(8)
    def count(_):
        start.wait(10)  # eight reads at once: all meet a grown map together
        return store.count("sessions")
    for line in sys.stdin:
        print(*sorted(set(pool.map(count, range(8)))), flush=True)
"""


def test_a_read_only_store_in_another_process_sees_committed_data(
    tmp_path: pathlib.Path, spawn: Any
) -> None:
    with Store(tmp_path) as store:
        _write_sessions(store, 7)
        reader = spawn(_READ_ONLY_COUNT, str(tmp_path))
        assert reader.line() == "7"
        _write_sessions(store, 3)
        reader.proc.stdin.write(b"again\n")
        assert reader.line() == "10"
        assert reader.finish() == 0


def test_a_read_only_reader_keeps_reading_after_the_writer_grows_the_map(
    tmp_path: pathlib.Path, spawn: Any
) -> None:
    with Store(tmp_path, map_size=MIB) as store:
        reader = spawn(_READ_ONLY_COUNT, str(tmp_path))
        assert reader.line() == "0"
        store.grow(16 * MIB)
        batch = store.batch()
        for i in range(800):  # ~3 MiB: well past the map the reader opened with
            batch.raw("sessions", i.to_bytes(4, "big"), b"x" * 4000)
        store.write(batch)
        assert store.stats()["used_bytes"] > 2 * MIB
        reader.proc.stdin.write(b"again\n")
        assert reader.line() == "800"
        assert reader.finish() == 0


def test_a_read_only_store_refuses_writes(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path) as store:
        ids = _write_sessions(store, 2)
    with Store(tmp_path, readonly=True) as ro:
        assert ro.writer_thread is None
        with pytest.raises(StoreError, match="read-only"):
            ro.write(ro.batch().session(_record()))
        with pytest.raises(StoreError, match="read-only"):
            ro.grow(64 * MIB)
        assert ro.session(ids[0]) is not None
        assert ro.count("sessions") == 2
        assert "commits" not in ro.stats()


def test_a_read_only_open_of_a_directory_without_a_store_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    with pytest.raises(StoreError, match="no store"):
        Store(tmp_path / "nothing here", readonly=True)
    assert not (tmp_path / "nothing here").exists()


# -- reader slots (24) -----------------------------------------------------------------

_HOLD_READ_ONLY = """
import sys
from sessiontree.store import Store
store = Store(sys.argv[1], readonly=True)
print("ready", flush=True)
for line in sys.stdin:  # on request: the pids in LMDB's reader table
    table = store._opened.env.readers().splitlines()[1:]
    print(*sorted(int(row.split()[0]) for row in table if row.strip()), flush=True)
"""

_DIE_IN_A_READ = """
import sys
from sessiontree.store import Store
store = Store(sys.argv[1], readonly=True)
with store._read():
    print("reading", flush=True)
    sys.stdin.read()
"""


def _reader_pids(store: Store) -> set[int]:
    """Pids in LMDB's reader table (``mdb_reader_list``)."""
    table = store._opened.env.readers()
    return {int(line.split()[0]) for line in table.splitlines()[1:] if line.strip()}


def test_reader_slots_of_a_killed_process_are_cleared_when_the_writer_opens(
    tmp_path: pathlib.Path, spawn: Any
) -> None:
    with Store(tmp_path) as store:
        _write_sessions(store, 1)
    # Another process keeps the environment open, so LMDB keeps its reader
    # table (the first opener of an environment nobody has open resets it).
    keeper = spawn(_HOLD_READ_ONLY, str(tmp_path))
    assert keeper.line() == "ready"
    dead = spawn(_DIE_IN_A_READ, str(tmp_path))
    assert dead.line() == "reading"
    dead.kill()
    keeper.proc.stdin.write(b"readers?\n")
    assert str(dead.pid) in keeper.line().split()  # the dead reader's slot is still taken
    with Store(tmp_path) as store:
        assert store.stale_readers_cleared >= 1
        assert store.stats()["stale_readers_cleared"] == store.stale_readers_cleared
        assert dead.pid not in _reader_pids(store)
        store.write(store.batch().session(_record()))
        assert store.count("sessions") == 2
        keeper.proc.stdin.write(b"readers?\n")
        assert str(dead.pid) not in keeper.line().split()
    assert keeper.finish() == 0


def test_a_reader_table_left_only_by_dead_processes_is_reset_on_open(
    tmp_path: pathlib.Path, spawn: Any
) -> None:
    with Store(tmp_path) as store:
        _write_sessions(store, 1)
    dead = spawn(_DIE_IN_A_READ, str(tmp_path))
    assert dead.line() == "reading"
    dead.kill()
    with Store(tmp_path) as store:
        # Nobody had the environment open: LMDB re-initialised the reader
        # table, so there was nothing stale left for reader_check() to clear.
        assert store.stale_readers_cleared == 0
        assert dead.pid not in _reader_pids(store)


def test_max_readers_is_configurable_and_reported(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path, max_readers=4) as store:
        assert store.stats()["max_readers"] == 4
        with contextlib.ExitStack() as reads:
            for _ in range(4):
                reads.enter_context(store._read())
            with pytest.raises(StoreError, match="max_readers"):
                reads.enter_context(store._read())
            assert store.oldest_read_s() > 0.0  # the four reads still open
        assert store.count("sessions") == 0  # slots came back once the reads ended
    with Store(tmp_path / "default") as store:
        assert store.stats()["max_readers"] == 512


def test_more_than_126_concurrent_reads_fit_the_default_reader_table(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path) as store:
        ids = _write_sessions(store, 1)
        with contextlib.ExitStack() as reads:
            for _ in range(200):  # LMDB's own default would refuse the 127th
                reads.enter_context(store._read())
            assert store.session(ids[0]) is not None
            assert store.stats()["readers"] >= 200


# -- fork (25) -------------------------------------------------------------------------


def _in_forked_child(work: Any) -> dict[str, str]:
    """Run ``work() -> dict`` in an ``os.fork()`` child; return what it reported.
    The child never returns into pytest: it reports on a pipe and ``os._exit``s."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        exit_code = 1
        try:
            os.close(read_end)
            report = work()
            exit_code = 0
        except BaseException as exc:
            report = {"crash": repr(exc)}
        finally:
            try:
                os.write(write_end, json.dumps(report).encode())
            finally:
                os._exit(exit_code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        ready, _, _ = select.select([pipe], [], [], WAIT)
        assert ready, "the forked child reported nothing"
        reported: dict[str, str] = json.loads(pipe.read() or b"{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, reported
    return reported


def _outcome(action: Any) -> str:
    try:
        action()
    except StoreError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_child_is_refused_the_parents_store_and_leaves_the_parent_undisturbed(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path) as store:
        [session_id] = _write_sessions(store, 1, task="from the parent")

        def child() -> dict[str, str]:
            return {
                "write": _outcome(lambda: store.write(store.batch().session(_record()))),
                "read": _outcome(lambda: store.session(session_id)),
                "close": _outcome(store.close),  # must not close the parent's environment
                "writer": _outcome(lambda: Store(tmp_path)),
                "reader": _outcome(lambda: Store(tmp_path, readonly=True)),
            }

        with store._read() as txn:  # a read of the parent's, open across the fork
            report = _in_forked_child(child)
            assert os.getpid() in _reader_pids(store)  # its reader slot survived the child
            assert txn.get(session_id.bytes, db=store._opened.dbs["sessions"]) is not None

        assert "fork" in report["write"]
        assert "fork" in report["read"]
        assert report["close"] == "ok"
        assert report["writer"].startswith("StoreLockedError")  # the parent holds the directory
        # py-lmdb 3 keeps the parent's open files in its "already open" guard in a
        # forked child, so the child cannot reopen the store in-process; the
        # refusal is a typed error that says what to do (an exec'd process can).
        assert report["reader"].startswith("StoreError")
        assert "forked" in report["reader"]
        assert "spawn" in report["reader"]

        # the parent is undisturbed: it writes, reads, and still holds the directory
        record = _record(task="after the fork")
        store.write(store.batch().session(record))
        assert store.session(record.info.session_id) == record
        assert store.count("sessions") == 2
        with pytest.raises(StoreLockedError, match="already open"):
            Store(tmp_path)


# -- writes only on the writer thread (28) ---------------------------------------------


def test_every_write_transaction_runs_on_the_writer_thread(tmp_path: pathlib.Path) -> None:
    class SpyIO(StoreIO):
        def __init__(self) -> None:
            self.threads: list[threading.Thread] = []

        def begin(self, env: lmdb.Environment) -> lmdb.Transaction:
            self.threads.append(threading.current_thread())
            return super().begin(env)

    io = SpyIO()
    with Store(tmp_path, io=io, map_size=8 * MIB) as store:
        callers = [
            threading.Thread(target=_write_sessions, args=(store, 5), name=f"caller-{n}")
            for n in range(8)
        ]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(WAIT)
        _write_sessions(store, 5)  # and from the test's own thread
        store.grow(64 * MIB)
        _write_sessions(store, 1)
        assert store.count("sessions") == 8 * 5 + 5 + 1
        assert io.threads
        assert {t.name for t in io.threads} == {"sessiontree-store-writer"}
        assert all(t is store.writer_thread for t in io.threads)
        assert threading.main_thread() not in io.threads


# -- long read transactions (26) -------------------------------------------------------


def test_a_read_held_across_commits_is_counted_as_long_and_its_age_reported(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path, long_read_warn=0.0) as store:
        _write_sessions(store, 1)
        assert store.stats()["long_reads"] == 0  # no read was open at those commits
        assert store.oldest_read_s() == 0.0
        with store._read():
            written = threading.Event()

            def write_elsewhere() -> None:
                _write_sessions(store, 1)
                written.set()

            writer = threading.Thread(target=write_elsewhere, name="other writer")
            writer.start()
            assert written.wait(WAIT)  # committed while this thread's read was open
            writer.join(WAIT)
            assert store.stats()["long_reads"] >= 1
            assert store.oldest_read_s() > 0.0
        assert store.oldest_read_s() == 0.0
        long_reads = store.stats()["long_reads"]
        _write_sessions(store, 1)
        assert store.stats()["long_reads"] == long_reads


def test_a_paused_scan_holds_no_read_transaction(tmp_path: pathlib.Path) -> None:
    n = 2500  # more than two chunks of the scan
    with Store(tmp_path) as store:
        batch = store.batch()
        for i in range(n):
            batch.raw("sessions", i.to_bytes(4, "big"), b"v")
        store.write(batch)
        keys = []
        for key, _ in store.scan("sessions"):
            assert store.oldest_read_s() == 0.0  # paused at a yield: no reader open
            keys.append(key)
        assert keys == [i.to_bytes(4, "big") for i in range(n)]  # each once, in order


def test_a_scan_over_records_written_between_its_chunks_yields_each_key_once(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path) as store:
        batch = store.batch()
        for i in range(0, 8000, 2):  # 4000 even keys: four chunks
            batch.raw("sessions", i.to_bytes(4, "big"), b"v")
        store.write(batch)
        seen = []
        for key, _ in store.scan("sessions"):
            seen.append(key)
            if len(seen) == 1500:  # mid-scan, between chunks: new keys on both sides
                late = store.batch()
                late.raw("sessions", (1).to_bytes(4, "big"), b"behind")
                late.raw("sessions", (7999).to_bytes(4, "big"), b"ahead")
                store.write(late)
        assert len(seen) == len(set(seen))
        assert seen == sorted(seen)
        assert (7999).to_bytes(4, "big") in seen  # written ahead of the scan: seen
        assert (1).to_bytes(4, "big") not in seen  # behind it: not revisited
        assert len(seen) == 4000 + 1


# -- the standard LMDB tools read the store --------------------------------------------


def test_mdb_stat_reads_a_live_store_and_lists_its_databases(tmp_path: pathlib.Path) -> None:
    tool = shutil.which("mdb_stat")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("mdb_stat is missing under CI: .ci/run installs Debian's lmdb-utils")
        pytest.skip("mdb_stat is not installed (Debian package lmdb-utils)")
    with Store(tmp_path) as store:
        _write_sessions(store, 3)
        out = subprocess.run(
            [tool, "-a", str(tmp_path)], capture_output=True, text=True, timeout=WAIT, check=True
        ).stdout
    entries = {
        name: int(count)
        for name, count in re.findall(r"^Status of (\w+)\n(?:  .*\n)*?  Entries: (\d+)$", out, re.M)
    }
    assert entries["sessions"] == 3
    assert entries["meta"] == 1
    assert {"children", "outbox", "memory", "quarantine"} <= entries.keys()


# -- lazy writes: carried along with the next write someone waits on -------------------


def test_a_lazy_write_goes_with_the_next_waited_write_in_one_commit(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path / "db", linger=3600.0) as store:
        before = store.stats()["commits"]
        first, second = _record(), _record()
        lazy = store.submit(WriteBatch().session(first), lazy=True)
        store.write(WriteBatch().session(second))  # someone waits on this one
        lazy.result(WAIT)
        assert store.stats()["commits"] == before + 1  # one commit for both
        assert store.session(first.info.session_id) is not None


def test_hurry_commits_a_lazy_write_and_an_empty_flush_commits_nothing(
    tmp_path: pathlib.Path,
) -> None:
    with Store(tmp_path / "db", linger=3600.0) as store:
        before = store.stats()["commits"]
        store.flush()
        assert store.stats()["commits"] == before  # nothing queued: no transaction
        record = _record()
        lazy = store.submit(WriteBatch().session(record), lazy=True)
        store.hurry()
        lazy.result(WAIT)
        assert store.stats()["commits"] == before + 1
        assert store.session(record.info.session_id) is not None


def test_a_lazy_write_commits_by_itself_after_its_linger(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path / "db", linger=0.01) as store:
        record = _record()
        store.submit(WriteBatch().session(record), lazy=True).result(WAIT)  # nobody hurried
        assert store.session(record.info.session_id) is not None


def test_a_lazy_write_commits_before_an_action_queued_after_it(tmp_path: pathlib.Path) -> None:
    with Store(tmp_path / "db", linger=3600.0) as store:
        record = _record()
        lazy = store.submit(WriteBatch().session(record), lazy=True)
        store.grow(store.stats()["map_size"] * 2, timeout=WAIT)  # runs between transactions
        assert lazy.done()
        assert lazy.exception() is None


def test_closing_commits_what_was_queued_lazily(tmp_path: pathlib.Path) -> None:
    record = _record()
    with Store(tmp_path / "db", linger=3600.0) as store:
        lazy = store.submit(WriteBatch().session(record), lazy=True)
    assert lazy.result(WAIT) is None
    with Store(tmp_path / "db") as store:
        assert store.session(record.info.session_id) is not None
