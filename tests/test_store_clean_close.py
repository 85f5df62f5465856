"""The page walk is skipped only for a file as a writer's clean close left it:
any write since (even at once, within one tick of the file system's clock),
a kill, a copy, or ``walk=True`` walks it again, and a damaged page is still
refused before LMDB reads it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessiontree.protocol import StoreDamagedError
from sessiontree.store import Store, WriteBatch
from sessiontree.store._clean import CLOSED
from sessiontree.store._pages import read_meta
from tests._running_node import ROOT
from tests.test_store_damage import _sessions_leaf, build, record, sessiontree

pytestmark = pytest.mark.timeout(60)


_PAGES_WALKED = textwrap.dedent(
    """
    import sys
    from sessiontree.store import Store

    with Store(sys.argv[1], readonly=True) as store:
        print(store.pages_walked)
    """
)


def test_a_clean_close_lets_the_next_open_skip_the_walk_once(tmp_path: Path) -> None:
    path = tmp_path / "store"
    build(path, sessions=50)
    assert (path / CLOSED).exists()
    with Store(path, readonly=True) as reader:
        assert reader.pages_walked is None  # a read-only open does not use it up
    with Store(path) as store:
        assert store.pages_walked is None
        assert not (path / CLOSED).exists()  # this writer may write from here on
        beside = subprocess.run(  # a reader beside a live writer walks
            [sys.executable, "-c", _PAGES_WALKED, str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert int(beside.stdout) > 0
        store.write(WriteBatch().session(record(99)))
    with Store(path, readonly=True, walk=True) as verifying:
        assert verifying.pages_walked is not None
        assert verifying.pages_walked > 0


def test_a_page_scribbled_right_after_a_clean_close_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store"
    data = build(path)  # closed cleanly; the junk follows at once
    page = _sessions_leaf(data, read_meta(str(data)))
    with data.open("r+b") as file:
        file.seek(page * 4096)
        file.write(b"\xa5" * 4096)
    assert (path / CLOSED).exists()
    with pytest.raises(StoreDamagedError) as caught:
        Store(path, readonly=True)
    assert caught.value.problem == "bad_page"
    assert f"page {page} of database 'sessions'" in str(caught.value)
    proc = sessiontree("store", "verify", "--store", str(path))
    assert proc.returncode == 74, proc.stderr


def test_a_copy_of_a_cleanly_closed_store_is_walked(tmp_path: Path) -> None:
    build(tmp_path / "store", sessions=20)
    shutil.copytree(tmp_path / "store", tmp_path / "copy")  # the record travels, the file is new
    with Store(tmp_path / "copy") as store:
        assert store.pages_walked is not None


_KILLED = textwrap.dedent(
    """
    import sys, time
    from sessiontree.store import Store, WriteBatch
    from tests.test_store_damage import record

    store = Store(sys.argv[1])
    store.write(WriteBatch().session(record(700)))
    print("written", flush=True)
    time.sleep(60)
    """
)


def test_a_killed_writer_leaves_no_record_and_the_next_open_walks(tmp_path: Path) -> None:
    path = tmp_path / "store"
    build(path, sessions=20)
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as killed:
        assert killed.stdout is not None
        try:
            assert killed.stdout.readline() == "written\n"
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.wait(timeout=10)
    assert not (path / CLOSED).exists()
    with Store(path) as store:
        assert store.pages_walked is not None
        assert store.count("sessions") == 21


def test_a_record_that_does_not_match_or_read_means_a_walk(tmp_path: Path) -> None:
    path = tmp_path / "store"
    build(path, sessions=20)
    figures = json.loads((path / CLOSED).read_text())
    (path / CLOSED).write_text(json.dumps({**figures, "txnid": figures["txnid"] + 1}))
    with Store(path, readonly=True) as store:
        assert store.pages_walked is not None
    (path / CLOSED).write_text("{not json")
    with Store(path) as store:
        assert store.pages_walked is not None
    with Store(path) as store:  # closed cleanly again just above
        assert store.pages_walked is None


def test_a_page_damaged_while_the_store_was_open_is_found_at_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store"
    data = build(path)
    store = Store(path)
    try:
        page = _sessions_leaf(data, read_meta(str(data)))
        with data.open("r+b") as file:  # something other than the store writes the file
            file.seek(page * 4096)
            file.write(b"\x00" * 4096)
    finally:
        store.close()
    assert not (path / CLOSED).exists()
    assert f"page {page} of database 'sessions'" in caplog.text
    assert "found on closing it" in caplog.text
    with pytest.raises(StoreDamagedError) as caught:
        Store(path, readonly=True)
    assert caught.value.problem == "bad_page"
