"""Byte-flip fuzz over every kind of stored record.

One byte of one stored value is flipped in ``data.mdb`` itself (a whole byte,
or a single bit), as a bad disk would; then the store is read through its
public paths. Every flip must give a typed error, a quarantine or a clean
read: never a traceback, a 500 or a signal (a signal would end this process).

The flips are deterministic: ``FLIPS`` per stored value, drawn by a generator
seeded with the value's database and key, on a store whose bytes are the same
every run (``tests._damaged_store``). Through the store and the CLI every flip
is read; a node is started (and its HTTP API read) on a representative
subset: for each value, its first flip that does not decode and its first
that does.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from sessiontree.cli import main as cli_main
from sessiontree.cli.server import create_app
from sessiontree.protocol import CorruptRecordError, RecordingError, SessionTreeError
from sessiontree.store import (
    MetaRecord,
    StartsRecord,
    Store,
    decode_id,
    decode_record,
    export_jsonl,
    verify_store,
)
from sessiontree.store._export_format import RECORD_DBS
from sessiontree.store._keys import quarantine_key
from sessiontree.supervision import Node, NodeConfig
from sessiontree.supervision._recording import stored_recording
from tests._damaged_store import IDS, build, flip_in_file, stored_entries
from tests._fakes import FakeMetrics
from tests.conftest import WAIT
from tests.node_agents import agents

pytestmark = pytest.mark.timeout(300)

SEED = 38
FLIPS = 8  # per stored value: half whole bytes, half single bits
#: What a node start reads, and so quarantines when it does not decode (the
#: meta record on opening the store, the rest in recovery; of ``sessions``,
#: only live ones: ended sessions, their filed results and usage are read
#: when asked for).
START_READS = frozenset(
    {
        "sessions",
        "mains",
        "outbox",
        "inbox",
        "meta",
        "cycles",
        "wedged",
        "calls",
    }
)
SESSIONS = (IDS.main, IDS.done, IDS.parked, IDS.worker, IDS.owed)
MAIN = str(IDS.main)


@dataclass(frozen=True)
class Flip:
    """XOR ``mask`` into byte ``offset`` of the value under ``key`` in ``db``;
    ``decodes``: whether the value still decodes as its record type after it."""

    db: str
    key: bytes
    offset: int
    mask: int
    decodes: bool

    def __str__(self) -> str:
        return f"{self.db}[{self.key.hex()[-8:]}]@{self.offset}^{self.mask:#04x}"


def _decodes(db: str, key: bytes, raw: bytes) -> bool:
    try:
        if db in ("mains", "platform_ids"):
            decode_id(raw, db=db, key=key)
        elif db == "meta":
            decode_record(StartsRecord if key == b"starts" else MetaRecord, raw, db=db, key=key)
        else:
            decode_record(RECORD_DBS[db].kind, raw, db=db, key=key)
    except CorruptRecordError:
        return False
    return True


def _flips(template: Path) -> dict[str, list[Flip]]:
    """The flips of every stored value, by database (values of the tree index
    are empty: nothing to flip; the live index holds only its stamp, a start's
    time: a flip there at most has it built again)."""
    found: dict[str, list[Flip]] = {}
    for db, key, raw in stored_entries(template):
        if not raw or db == "live":
            continue
        draw = random.Random(f"{SEED}/{db}/{key.hex()}")
        for n in range(FLIPS):
            offset = draw.randrange(len(raw))
            mask = draw.randrange(1, 256) if n % 2 == 0 else 1 << draw.randrange(8)
            spoilt = bytearray(raw)
            spoilt[offset] ^= mask
            flip = Flip(db, key, offset, mask, _decodes(db, key, bytes(spoilt)))
            found.setdefault(db, []).append(flip)
    return found


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "template"
    build(path)
    return path


TEMPLATE_DBS = (
    "sessions",
    "mains",
    "conversations",
    "branches",
    "messages",
    "platform_ids",
    "memory",
    "memory_ids",
    "outbox",
    "received",
    "inbox",
    "meta",
    "quarantine",
    "usage",
    "cycles",
    "wedged",
    "recordings",
    "calls",
)


def test_the_template_holds_every_kind_of_record(template: Path) -> None:
    with Store(template, readonly=True) as store:
        assert verify_store(store).clean
        held = {db for db in store.databases() if store.count(db)}
    assert held == {*TEMPLATE_DBS, "children", "live"}
    every = _flips(template)
    assert set(every) == set(TEMPLATE_DBS)
    outcomes = Counter(flip.decodes for flips in every.values() for flip in flips)
    assert outcomes[True] > 20, outcomes  # both paths are taken
    assert outcomes[False] > 60, outcomes
    for db in START_READS - {"mains"} | {"received", "usage"}:  # a mains entry: any 16 bytes
        assert any(not flip.decodes for flip in every[db]), db


def _flipped(template: Path, work: Path, flip: Flip) -> Path:
    """A copy of the template with ``flip`` made in its file."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    flip_in_file(work, flip.db, flip.key, flip.offset, flip.mask)
    return work


# -- through the store and the CLI: every flip ------------------------------------------------


def _read_everything(store: Store) -> int:
    """Every public read of a ``Store``, as an embedding application makes them;
    a damaged record may only raise ``CorruptRecordError`` (a recording's
    bytes, ``RecordingError``). Returns how many did."""
    reads: list[Callable[[], object]] = [
        lambda: _first_error(store.sessions()),
        lambda: _first_error(store.outbox()),
        store.wedged_list,
        store.recordings,
        store.quarantine_list,
        store.starts,
        store.calls,
        lambda: store.main_of("assistant", "internal:main:main"),
        lambda: store.memory("assistant", "facts"),
        lambda: store.memory_by_id("mem-1"),
        lambda: store.conversation(IDS.main),
        lambda: store.message(IDS.main, IDS.answer),
        lambda: store.walk(IDS.main, IDS.answer, 10),
        lambda: list(store.messages(IDS.main)),
        lambda: store.platform_message(IDS.main, "tg-1"),
        lambda: store.wedged(IDS.wedged),
        lambda: stored_recording(store, IDS.done),
        lambda: export_jsonl(store, _Discard()),
    ]
    for sid in SESSIONS:
        reads += [
            lambda sid=sid: store.session(sid),
            lambda sid=sid: store.children(sid),
            lambda sid=sid: store.received(sid),
            lambda sid=sid: store.inbox(sid),
            lambda sid=sid: store.usage(sid),
            lambda sid=sid: store.cycle(sid),
            lambda sid=sid: store.recording(sid),
        ]
    typed = 0
    for read in reads:
        try:
            read()
        except (CorruptRecordError, RecordingError):
            typed += 1
    return typed


def _first_error(items: Iterator[object]) -> None:
    """Raise the first ``CorruptRecordError`` a listing yields in place of a record."""
    for item in items:
        if isinstance(item, CorruptRecordError):
            raise item


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


#: (arguments, the exit codes each may give). 74: a damaged record it read;
#: verify 65: records that do not decode; a stored session that is gone, 1.
COMMANDS: tuple[tuple[tuple[str, ...], frozenset[int]], ...] = (
    (("node", "status"), frozenset({0, 74})),
    (("sessions", "ls"), frozenset({0, 74})),
    *((("sessions", "show", str(s)), frozenset({0, 1, 74})) for s in SESSIONS),
    (("sessions", "tree", MAIN), frozenset({0, 1, 74})),
    (("sessions", "results", MAIN), frozenset({0, 1, 74})),
    (("conv", "context", "--session", MAIN), frozenset({0, 1, 74})),
    (("conv", "tree", "--session", MAIN), frozenset({0, 1, 74})),
    (("conv", "branches", "--session", MAIN), frozenset({0, 1, 74})),
    (("conv", "transcript", "--session", MAIN), frozenset({0, 1, 74})),
    (("conv", "context", "--agent", "assistant"), frozenset({0, 1, 74})),
    (("wedged", "ls"), frozenset({0, 74})),
    (("replay",), frozenset({0, 74})),
    (("store", "verify"), frozenset({0, 65})),
)


def _cli(runner: CliRunner, store: Path, args: tuple[str, ...]) -> tuple[int, str]:
    """Run one command in this process; its exit code and output. A raise that
    click did not turn into an exit fails the test (with the flip named)."""
    result = runner.invoke(cli_main, [*args, "--store", str(store)], catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("db", TEMPLATE_DBS)
def test_every_flip_reads_as_a_typed_error_or_a_clean_read(
    template: Path, tmp_path: Path, db: str
) -> None:
    runner = CliRunner()
    seen: Counter[str] = Counter()
    for flip in _flips(template)[db]:
        store = _flipped(template, tmp_path / "store", flip)
        with Store(store, readonly=True) as opened:
            typed = _read_everything(opened)
            unreadable = verify_store(opened).unreadable[db]
            if flip.key == b"meta" and not flip.decodes:
                typed += opened.meta is None  # a read-only open reads on without it
        assert unreadable == (0 if flip.decodes else 1), f"{flip}: verify found {unreadable}"
        if not flip.decodes:  # never skipped unsaid: some read names it
            assert typed, f"{flip}: no read raised"
        for args, allowed in COMMANDS:
            code, output = _cli(runner, store, args)
            assert code in allowed, f"{flip}: {' '.join(args)} exited {code}: {output}"
            assert "Traceback" not in output, f"{flip}: {' '.join(args)}: {output}"
            if code == 74:
                assert "the store holds a damaged record" in output, output
                seen["exit 74"] += 1
        seen["decodes" if flip.decodes else "does not decode"] += 1
    assert seen["decodes"] + seen["does not decode"] == FLIPS * len(
        [k for d, k, raw in stored_entries(template) if d == db and raw]
    )


# -- through a node and its HTTP API: a representative subset -------------------------------------


def _routes() -> Iterator[str]:
    yield from ("/v1/node", "/v1/sessions", "/v1/wedged", "/v1/recovery", "/metrics")
    yield f"/v1/wedged/{IDS.wedged}"
    for sid in SESSIONS:
        yield from (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/tree")
        yield from (f"/v1/sessions/{sid}/results", f"/v1/sessions/{sid}/tree.html")
    for route in ("branches", "context", "tree", "tree.txt", "tree.html", "transcript"):
        yield f"/v1/sessions/{MAIN}/conversation/{route}"


def _subset(flips: list[Flip]) -> list[Flip]:
    """For each value, its first flip that does not decode and its first that does."""
    chosen: dict[tuple[bytes, bool], Flip] = {}
    for flip in flips:
        chosen.setdefault((flip.key, flip.decodes), flip)
    return list(chosen.values())


@pytest.mark.parametrize("db", TEMPLATE_DBS)
def test_a_node_starts_on_every_flip_and_answers_without_a_500(
    template: Path, tmp_path: Path, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    with Store(template, readonly=True) as original:
        live = {key for key, _ in original.scan("live")}  # start-up reads only these sessions
    for flip in _subset(_flips(template)[db]):
        caplog.clear()
        store = _flipped(template, tmp_path / "store", flip)
        node = Node(agents(), NodeConfig(), store=str(store))
        try:
            assert node.store is not None
            set_aside = {key for key, _ in node.store.scan("quarantine")}
            quarantined = node.stats()["store_quarantined"]
            read = db in START_READS and (db != "sessions" or flip.key in live)
            # read when asked for (or at start-up, by a session that comes back)
            on_demand = db in ("received", "usage") or (db == "sessions" and not read)
            if read and not flip.decodes:
                assert quarantined == 1, f"{flip}: {quarantined} quarantined"
                assert quarantine_key(db, flip.key) in set_aside, f"{flip}: not quarantined"
            elif not on_demand:
                assert quarantined == 0, f"{flip}: {quarantined} quarantined"
            with TestClient(
                create_app(node, FakeMetrics(), max_wait=5.0), raise_server_exceptions=False
            ) as client:
                for route in _routes():
                    answer = client.get(route)
                    if answer.status_code >= 500:
                        assert answer.status_code == 503, f"{flip}: {route}: {answer.text}"
                        code = answer.json()["error"]["code"]
                        assert code == "corrupt_record", f"{flip}: {route}: {answer.text}"
            assert node.wait_idle(WAIT), f"{flip}: the node did not settle"
            if on_demand:  # the routes read every session, its results and spending
                expected = 0 if flip.decodes else 1
                quarantined = node.stats()["store_quarantined"]
                assert quarantined == expected, f"{flip}: {quarantined} quarantined once read"
        finally:
            node.shutdown()
        untyped = [r for r in caplog.records if r.exc_info and not _typed(r.exc_info[1])]
        assert not untyped, f"{flip}: {[r.getMessage() for r in untyped]}"


def _typed(exc: Any) -> bool:
    """A logged exception the damage explains: a typed error (a Main's cycle
    that met the damaged record fails with it)."""
    return isinstance(exc, SessionTreeError)
