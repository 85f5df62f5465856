"""A damaged store file is named, never fatal: a truncated, scribbled, emptied or
missing ``data.mdb`` gives ``StoreDamagedError`` (exit 74 in the CLI, one line
on stderr) in real subprocesses, never a signal or a traceback; the meta-page
and page-walk checks on crafted files; LMDB's corruption errors on reads and
commits typed the same way."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import lmdb
import pytest

from sessiontree.protocol import (
    ErrorCode,
    SessionInfo,
    SessionKind,
    SessionState,
    StoreDamagedError,
    StoreError,
)
from sessiontree.store import ContextEntry, ContextRecord, SessionRecord, Store, StoreIO, WriteBatch
from sessiontree.store._env import MARKER
from sessiontree.store._pages import check_length, check_tree, read_meta
from tests._running_node import ROOT

pytestmark = pytest.mark.timeout(120)

EXIT_STORE_DAMAGED = 74
SESSIONS = 600  # ~1 KiB each: a file of a few hundred pages, a tree of depth 2 or more


def record(n: int) -> SessionRecord:
    info = SessionInfo(
        session_id=uuid.UUID(int=n + 1),
        agent_id="assistant",
        parent_id=None,
        kind=SessionKind.MAIN,
        state=SessionState.ACTIVE,
        depth=0,
        created_at=1_700_000_000.0 + n,
        ttl=None,
        deadline=None,
        key=f"internal:main:{n}",
        skill="main",
    )
    context = ContextRecord(messages=[ContextEntry(role="user", content="x" * 900)])
    return SessionRecord(info=info, context=context, updated_at=1_700_000_000.0 + n)


def build(path: Path, sessions: int = SESSIONS) -> Path:
    """A store of ``sessions`` Mains, closed; returns its ``data.mdb``."""
    with Store(path, sync=False) as store:
        batch = WriteBatch()
        for n in range(sessions):
            batch.session(record(n))
        store.write(batch)
    return path / "data.mdb"


def truncate(data: Path, size: int) -> None:
    os.truncate(data, size)


def scribble(data: Path) -> None:
    """Junk over every fifth page past the two meta pages (deterministic)."""
    junk = random.Random(21)
    pages = data.stat().st_size // 4096
    with data.open("r+b") as file:
        for page in range(3, pages, 5):
            file.seek(page * 4096)
            file.write(junk.randbytes(4096))


def sessiontree(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


_META_FIELDS = {"map_size": 16 + 16, "last_page": 16 + 24 + 2 * 48}  # offsets in a meta page


def newer_meta(data: Path) -> int:
    """The number of the meta page LMDB takes as current (the larger transaction)."""
    raw = data.read_bytes()
    txnids = [struct.unpack_from("<Q", raw, n * 4096 + 16 + 24 + 2 * 48 + 8)[0] for n in (0, 1)]
    return 0 if txnids[0] >= txnids[1] else 1


def set_meta(data: Path, field: str, value: int, number: int | None = None) -> int:
    """Write ``value`` into ``field`` of meta page ``number`` (the current one by
    default); returns the page's number."""
    page = newer_meta(data) if number is None else number
    with data.open("r+b") as file:
        file.seek(page * 4096 + _META_FIELDS[field])
        file.write(struct.pack("<Q", value))
    return page


# -- each damage, each command, in a real subprocess ------------------------------------------

DAMAGES = {
    "truncated-to-half": (lambda d: truncate(d, d.stat().st_size // 2), "truncated"),
    "truncated-to-8KiB": (lambda d: truncate(d, 8192), "truncated"),
    "scribbled": (scribble, "bad_page"),
    "zero-length": (lambda d: truncate(d, 0), "empty"),
    "missing": (lambda d: d.unlink(), "missing"),
    "last-page-past-the-map": (lambda d: set_meta(d, "last_page", 2**64 - 1), "bad_meta"),
    "map-no-process-maps": (lambda d: set_meta(d, "map_size", 2**62), "bad_meta"),
}
COMMANDS = {
    "node start": lambda s, tmp: (
        "node",
        "start",
        "--store",
        s,
        "--port",
        "0",
        "--agents",
        "tests.node_agents:agents",
    ),
    "node status": lambda s, tmp: ("node", "status", "--store", s),
    "export": lambda s, tmp: ("export", "--store", s, "--out", str(tmp / "out.jsonl")),
    "store backup": lambda s, tmp: ("store", "backup", "--store", s, str(tmp / "backup")),
    "store verify": lambda s, tmp: ("store", "verify", "--store", s),
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_store_file_exits_74_with_one_line_naming_it(
    tmp_path: Path, damage: str, command: str
) -> None:
    store = tmp_path / "store"
    data = build(store)
    spoil, problem = DAMAGES[damage]
    spoil(data)
    proc = sessiontree(*COMMANDS[command](str(store), tmp_path))
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr}"
    assert proc.returncode == EXIT_STORE_DAMAGED, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert f"store file {store.resolve() / 'data.mdb'} is damaged ({problem})" in lines[0]
    assert "restore the store from a backup" in lines[0]
    assert not (tmp_path / "out.jsonl").exists()
    assert not (tmp_path / "backup").exists()


def test_the_messages_say_what_is_wrong_in_numbers(tmp_path: Path) -> None:
    data = build(tmp_path / "half")
    size = data.stat().st_size
    truncate(data, size // 2)
    with pytest.raises(StoreDamagedError) as caught:
        Store(tmp_path / "half", readonly=True)
    assert f"expected {size} bytes" in str(caught.value)
    assert f"found {size // 2}" in str(caught.value)
    assert caught.value.code is ErrorCode.STORE_DAMAGED
    assert caught.value.to_info().detail == {"path": str(data.resolve()), "problem": "truncated"}

    data = build(tmp_path / "scribbled")
    scribble(data)
    with pytest.raises(StoreDamagedError) as caught:
        Store(tmp_path / "scribbled")
    assert caught.value.problem == "bad_page"
    assert "page " in str(caught.value)
    assert "of database" in str(caught.value)


def test_a_damaged_store_is_refused_without_holding_it(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    good = data.read_bytes()
    truncate(data, 8192)
    with pytest.raises(StoreDamagedError):
        Store(tmp_path / "s")
    data.write_bytes(good)  # restored: the path and the writer lock were released
    with Store(tmp_path / "s") as store:
        assert store.count("sessions") == SESSIONS


# -- the marker: an empty or missing data.mdb where data was committed ---------------------------


def test_the_marker_is_written_once_data_is_committed(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        assert store.meta is not None
        assert store.meta.node_id in (tmp_path / "s" / MARKER).read_text()


def test_an_empty_or_missing_file_with_the_marker_is_damage(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    truncate(data, 0)
    for readonly in (False, True):
        with pytest.raises(StoreDamagedError) as caught:
            Store(tmp_path / "s", readonly=readonly)
        assert caught.value.problem == "empty"
        assert "0 bytes" in str(caught.value)
    assert data.stat().st_size == 0  # the writer did not start a fresh store over it
    data.unlink()
    with pytest.raises(StoreDamagedError) as caught:
        Store(tmp_path / "s")
    assert caught.value.problem == "missing"
    assert not data.exists()


def test_an_empty_file_without_the_marker_is_a_store_never_committed(tmp_path: Path) -> None:
    # A creation cut short before its first commit: nothing was ever acknowledged.
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "data.mdb").write_bytes(b"")
    with pytest.raises(StoreError) as caught:
        Store(tmp_path / "s", readonly=True)
    assert not isinstance(caught.value, StoreDamagedError)
    assert "nothing was ever committed" in str(caught.value)
    with Store(tmp_path / "s") as store:
        assert store.count("sessions") == 0
    assert (tmp_path / "s" / MARKER).exists()


# -- the meta pages and the page walk, on crafted files ---------------------------------------


def test_read_meta_picks_the_newer_meta_page_and_its_figures(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    env = lmdb.open(str(tmp_path / "s"), readonly=True, max_dbs=20)
    try:
        info = env.info()
        psize = env.stat()["psize"]
    finally:
        env.close()
    meta = read_meta(str(data))
    assert meta.txnid == info["last_txnid"]
    assert meta.last_page == info["last_pgno"]
    assert meta.page_size == psize
    assert meta.length == (info["last_pgno"] + 1) * psize <= data.stat().st_size
    assert check_tree(str(data), meta) >= meta.last_page // 2  # most pages are in use


def _meta_offset(number: int) -> int:
    return number * 4096


@pytest.mark.parametrize("number", [0, 1])
def test_a_bad_magic_on_either_meta_page_is_a_bad_meta(tmp_path: Path, number: int) -> None:
    data = build(tmp_path / "s")
    with data.open("r+b") as file:
        file.seek(_meta_offset(number) + 16)
        file.write(struct.pack("<I", 0x12345678))
    with pytest.raises(StoreDamagedError) as caught:
        read_meta(str(data))
    assert caught.value.problem == "bad_meta"
    assert f"meta page {number} is unreadable" in str(caught.value)


def test_an_unknown_data_version_is_named(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    with data.open("r+b") as file:
        file.seek(_meta_offset(1) + 20)
        file.write(struct.pack("<I", 7))
    with pytest.raises(StoreDamagedError, match="LMDB data version 7"):
        read_meta(str(data))


def test_a_last_page_past_the_map_is_a_bad_meta_that_offers_the_other_page(
    tmp_path: Path,
) -> None:
    data = build(tmp_path / "s")
    with Store(tmp_path / "s") as store:  # one more commit: each meta page holds data
        store.write(WriteBatch().session(record(SESSIONS)))
    older = read_meta(str(data))
    page = set_meta(data, "last_page", 2**64 - 1)
    with pytest.raises(StoreDamagedError) as caught:
        read_meta(str(data))
    assert caught.value.problem == "bad_meta"
    message = str(caught.value)
    assert f"meta page {page} (transaction {older.txnid}) says its last page is {2**64 - 1}" in (
        message
    )
    assert "past its own map of 17179869184 bytes" in message
    assert f"meta page {1 - page} (transaction {older.txnid - 1}) reads whole" in message
    where = tmp_path / "s"
    assert f"`sessiontree store backup --meta-page {1 - page} --store {where} DEST`" in message


def test_a_map_no_process_can_map_is_a_bad_meta(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    page = set_meta(data, "map_size", 2**62)
    with pytest.raises(StoreDamagedError) as caught:
        Store(tmp_path / "s", readonly=True)
    assert caught.value.problem == "bad_meta"
    assert f"meta page {page} (transaction" in str(caught.value)
    assert f"says the map is {2**62} bytes, more than a process maps" in str(caught.value)
    set_meta(data, "map_size", 16 << 30, page)  # the older page may say anything
    set_meta(data, "map_size", 2**62, 1 - page)
    with Store(tmp_path / "s", readonly=True) as store:
        assert store.count("sessions") == SESSIONS


def test_a_backup_from_the_offered_meta_page_holds_all_but_the_last_commit(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    data = build(store)
    with Store(store) as opened:
        opened.write(WriteBatch().session(record(SESSIONS)))
    page = set_meta(data, "last_page", 2**64 - 1)
    good = tmp_path / "good"
    proc = sessiontree(
        "store", "backup", "--meta-page", str(1 - page), "--store", str(store), str(good)
    )
    assert proc.returncode == 0, proc.stderr
    assert f"(its meta page {1 - page})" in proc.stdout
    assert {p.name: p.stat().st_mode & 0o777 for p in good.iterdir()} == {
        "data.mdb": 0o600,
        "sessiontree.marker": 0o600,
    }
    with Store(good, readonly=True) as copied:
        assert copied.count("sessions") == SESSIONS  # the last commit's session is not there
        assert copied.session(record(SESSIONS).info.session_id) is None
    assert sessiontree("store", "verify", "--store", str(good)).returncode == 0
    # the damaged page is no way out, nor is --compact
    bad = sessiontree(
        "store", "backup", "--meta-page", str(page), "--store", str(store), str(tmp_path / "x")
    )
    assert bad.returncode == EXIT_STORE_DAMAGED, bad.stderr
    assert f"meta page {page} does not read whole either" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert not (tmp_path / "x").exists()
    usage = sessiontree(
        "store", "backup", "--compact", "--meta-page", "0", "--store", str(store), str(good)
    )
    assert usage.returncode == 2


def test_a_file_shorter_than_two_pages_is_truncated(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    truncate(data, 5000)
    with pytest.raises(StoreDamagedError) as caught:
        read_meta(str(data))
    assert caught.value.problem == "truncated"
    assert "expected at least 8192 bytes (two meta pages), found 5000" in str(caught.value)


def test_check_length_names_both_lengths(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    meta = read_meta(str(data))
    check_length(str(data), meta)
    truncate(data, meta.length - 4096)
    with pytest.raises(StoreDamagedError) as caught:
        check_length(str(data), meta)
    assert f"expected {meta.length} bytes" in str(caught.value)
    assert f"found {meta.length - 4096}" in str(caught.value)


def test_a_page_that_carries_another_number_is_named_with_its_database(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    meta = read_meta(str(data))
    with Store(tmp_path / "s", readonly=True) as store, store._read() as txn:
        root = txn.stat(store._opened.dbs["sessions"])
    assert root["depth"] >= 2
    # the first branch page's first child: a leaf of `sessions`
    page = _sessions_leaf(data, meta)
    with data.open("r+b") as file:
        file.seek(page * 4096)
        file.write(struct.pack("<Q", page + 1000))
    with pytest.raises(StoreDamagedError) as caught:
        check_tree(str(data), meta)
    assert f"page {page} of database 'sessions': its header says page {page + 1000}" in str(
        caught.value
    )


def _sessions_leaf(data: Path, meta: object) -> int:
    """A leaf page number of the ``sessions`` tree (found by walking it)."""
    from sessiontree.store import _pages  # noqa: PLC0415 - the walk's internals, for a test

    found: list[int] = []

    class Spy(_pages._Walk):
        def leaf(
            self, db: str, pgno: int, page: bytes, offsets: tuple[int, ...], **kw: bool
        ) -> None:
            if db == "sessions":
                found.append(pgno)
            super().leaf(db, pgno, page, offsets, **kw)

    fd = os.open(data, os.O_RDONLY)
    try:
        assert isinstance(meta, _pages.Meta)
        Spy(fd, str(data), meta).run()
    finally:
        os.close(fd)
    return found[len(found) // 2]


def test_a_zeroed_page_is_named(tmp_path: Path) -> None:
    data = build(tmp_path / "s")
    meta = read_meta(str(data))
    page = _sessions_leaf(data, meta)
    with data.open("r+b") as file:
        file.seek(page * 4096)
        file.write(bytes(4096))
    with pytest.raises(StoreDamagedError, match=f"page {page} of database 'sessions'"):
        Store(tmp_path / "s", readonly=True)


def test_the_walk_beside_a_live_writer_finds_no_damage(tmp_path: Path) -> None:
    # Walks while the writer commits: the read transaction pins the snapshot
    # walked, so pages the writer frees are not reused under the walk.
    with Store(tmp_path / "s", sync=False) as writer:
        batch = WriteBatch()
        for n in range(SESSIONS):
            batch.session(record(n))
        writer.write(batch)
        deadline = time.monotonic() + 2.0
        opens = 0
        n = SESSIONS
        while time.monotonic() < deadline or opens < 5:
            futures = [writer.submit(WriteBatch().session(record(n + i))) for i in range(50)]
            n += 50
            with writer._read():  # what the open does: walk under a read transaction
                data = str(tmp_path / "s" / "data.mdb")
                check_tree(data, read_meta(data))
            opens += 1
            for future in futures:
                future.result(30)
    assert opens >= 5


# -- LMDB's own corruption errors, typed ------------------------------------------------------


def test_a_corruption_error_on_a_read_is_a_store_damaged_error(tmp_path: Path) -> None:
    build(tmp_path / "s")
    with Store(tmp_path / "s", readonly=True) as store:
        with pytest.raises(StoreDamagedError) as caught, store._read():
            raise lmdb.PageNotFoundError("mdb_get: MDB_PAGE_NOTFOUND")
        assert caught.value.problem == "page_not_found"
        assert "MDB_PAGE_NOTFOUND" in str(caught.value)
        with pytest.raises(StoreDamagedError) as caught, store._read():
            raise lmdb.CorruptedError("mdb_cursor_get: MDB_CORRUPTED")
        assert caught.value.problem == "corrupted"
        assert store.count("sessions") == SESSIONS  # the store still answers


def test_a_corruption_error_on_a_commit_is_a_store_damaged_error(tmp_path: Path) -> None:
    class CorruptIO(StoreIO):
        armed = False

        def commit(self, txn: lmdb.Transaction) -> None:
            if self.armed:
                self.armed = False
                raise lmdb.CorruptedError("mdb_txn_commit: MDB_CORRUPTED")
            super().commit(txn)

    io = CorruptIO()
    with Store(tmp_path / "s", io=io) as store:
        io.armed = True
        with pytest.raises(StoreDamagedError) as caught:
            store.write(WriteBatch().session(record(1)))
        assert caught.value.path == str((tmp_path / "s" / "data.mdb").resolve())
        store.write(WriteBatch().session(record(2)))  # the writer lives on
        assert store.count("sessions") == 1


def test_the_walk_follows_named_and_dupsort_databases_and_overflow_runs(tmp_path: Path) -> None:
    # Plain LMDB beyond what the store writes today: a DUPSORT database whose key
    # holds a sub-database, and values big enough for overflow pages.
    env = lmdb.open(str(tmp_path), max_dbs=4)
    dups = env.open_db(b"dups", dupsort=True)
    big = env.open_db(b"big")
    with env.begin(write=True) as txn:
        for n in range(3000):
            txn.put(b"k", b"v%06d" % n, db=dups)
        txn.put(b"one", b"x" * 20_000, db=big)
    env.close()
    data = str(tmp_path / "data.mdb")
    meta = read_meta(data)
    assert check_tree(data, meta) >= 10
    env = lmdb.open(str(tmp_path), max_dbs=4, readonly=True)
    with env.begin() as txn:
        assert txn.stat(env.open_db(b"big", txn=txn))["overflow_pages"] >= 5
    env.close()
    # the overflow run's first page (found by its flags) given another number
    raw = Path(data).read_bytes()
    heads = [
        p
        for p in range(2, meta.last_page + 1)
        if struct.unpack_from("<H", raw, p * 4096 + 10)[0] & 0x04
        and struct.unpack_from("<Q", raw, p * 4096)[0] == p
    ]
    assert len(heads) == 1
    with open(data, "r+b") as file:
        file.seek(heads[0] * 4096)
        file.write(struct.pack("<Q", 0))
    with pytest.raises(StoreDamagedError, match=f"page {heads[0]} of database 'big'"):
        check_tree(data, meta)
