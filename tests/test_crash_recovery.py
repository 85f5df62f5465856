"""kill -9 of a real node at random points of a write-heavy workload
(exactly one result per child, also across a restart).

Each chain runs ``tests/crash_node.py`` on one store ROUNDS times. A round
SIGKILLs the node once its ack log holds a random number of lines, reads the
store read-only, then recovers it in this process with a ``Node`` of the same
agents, lets that settle, shuts it down and reads the store again; now and
then it leaves the crash to the next round's node instead, which recovers it
under its own workload. After every round, over every acknowledgement of the
chain so far:

(a) every acknowledged Main and spawn is in the store, each key names a Main;
(b) every acknowledged memory write not overwritten later is readable by its id;
(c) every acknowledged result is the session's stored terminal state;
(d) every branch or worker pending/active at the crash is ``failed`` with
    ``node_restarted``, a suspended branch whose parent did not come back is
    ``cancelled`` with ``parent_terminated``, and nothing else changed;
(e) every terminal child's result is owed to its parent in the outbox or filed
    on it — exactly one of the two — and nothing else is owed or filed;
(f) every acknowledged inbound message and every child result appears exactly
    once in its Main's stored context (a cycle the crash cut short runs again);
(g) a message's cycle runs once, or says it did not: every run of it that
    reached its end (in the workload or in a recovering node) has an attempt
    number of its own — a completed cycle whose snapshot committed never runs
    again, and a rerun after a crash is attempt 2, 3…

The chains' seeds are fixed (``random.Random(chain)``; each round's seed is
in the assertion messages), so a failure replays.
"""

from __future__ import annotations

import collections
import json
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sessiontree.protocol import CorruptRecordError, ErrorCode, SessionKind, SessionState
from sessiontree.store import (
    InboxRecord,
    MemoryRecord,
    OutboxRecord,
    ReceivedRecord,
    SessionRecord,
    Store,
    decode_record,
)
from sessiontree.supervision import Node
from tests.conftest import WAIT
from tests.crash_node import AGENT_ID, CONFIG, AckLog, make_agents

ROOT = Path(__file__).resolve().parent.parent
CHAINS = 10  # stores, each crashed ROUNDS times in a row
ROUNDS = 4
LEFT_TO_NEXT_RUN = 0.3  # the chance a crash is recovered by the next run, not checked here
KILL_AFTER = (1, 400)  # acknowledged operations before the SIGKILL (few: while replaying)
ACK_WAIT = 30.0  # real seconds the workload may take to reach its kill point

IN_FLIGHT = frozenset({SessionState.PENDING, SessionState.ACTIVE})


# -- the subprocess ---------------------------------------------------------------------


def read_acks(path: Path) -> list[dict[str, Any]]:
    """The complete lines of an ack log (a line the kill cut short is left out:
    it acknowledges less, never more)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def run_and_kill(store: Path, log: Path, seed: int, kill_after: int) -> None:
    """Run the workload on ``store`` and SIGKILL it once ``log`` holds ``kill_after`` lines."""
    errors = log.with_suffix(".stderr")
    command = [sys.executable, "-m", "tests.crash_node", str(store), str(log), str(seed)]
    with errors.open("wb") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + ACK_WAIT
            lines = 0
            while lines < kill_after:
                # waiting for another process: a short real pause between looks
                assert process.poll() is None, f"the node exited early: {errors.read_text()}"
                assert time.monotonic() < deadline, (
                    f"{lines} of {kill_after} acks after {ACK_WAIT} s: {errors.read_text()}"
                )
                time.sleep(0.005)
                lines = log.read_bytes().count(b"\n") if log.exists() else 0
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(WAIT)
    assert process.returncode == -signal.SIGKILL, errors.read_text()


# -- reading the store ------------------------------------------------------------------


@dataclass
class StoreView:
    """What one read-only open of a store holds."""

    sessions: dict[uuid.UUID, SessionRecord]
    outbox: dict[uuid.UUID, OutboxRecord]  # child id -> the result owed to its parent
    filed: dict[uuid.UUID, dict[uuid.UUID, ReceivedRecord]]  # parent id -> child id -> result
    inbox: dict[uuid.UUID, list[InboxRecord]]  # main id -> messages not yet run
    mains: dict[str, uuid.UUID | None]  # session key -> main id
    by_id: dict[str, MemoryRecord | None]  # memory id -> ``memory_by_id``
    by_key: dict[str, MemoryRecord | None]  # memory key -> its latest write


def read_store(path: Path, memory_ids: list[str], memory_keys: list[str]) -> StoreView:
    with Store(path, readonly=True) as store:
        sessions = {}
        for record in store.sessions():
            assert not isinstance(record, CorruptRecordError), record
            sessions[record.info.session_id] = record
        outbox = {}
        for owed in store.outbox():
            assert not isinstance(owed, CorruptRecordError), owed
            assert owed.result.session_id not in outbox
            outbox[owed.result.session_id] = owed
        filed: dict[uuid.UUID, dict[uuid.UUID, ReceivedRecord]] = collections.defaultdict(dict)
        for key, raw in store.scan("received"):
            received = decode_record(ReceivedRecord, raw, db="received", key=key)
            parent, child = uuid.UUID(bytes=key[:16]), uuid.UUID(bytes=key[16:])
            assert received.result.session_id == child
            filed[parent][child] = received
        keys = {sid: r.info.key or "" for sid, r in sessions.items() if r.info.key is not None}
        return StoreView(
            sessions=sessions,
            outbox=outbox,
            filed=dict(filed),
            inbox={sid: store.inbox(sid) for sid in keys},
            mains={key: store.main_of(AGENT_ID, key) for key in keys.values()},
            by_id={memory_id: store.memory_by_id(memory_id) for memory_id in memory_ids},
            by_key={key: store.memory(AGENT_ID, key) for key in memory_keys},
        )


# -- the checks -------------------------------------------------------------------------


class Acks:
    """Every acknowledged operation of one chain, across its rounds."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def add(self, lines: list[dict[str, Any]]) -> None:
        self.lines += lines

    def of(self, op: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["op"] == op]

    def last_memory_writes(self) -> dict[str, dict[str, Any]]:
        """Per memory key, the acknowledged write with the highest ``seq``."""
        last: dict[str, dict[str, Any]] = {}
        for line in self.of("memory"):
            if line["key"] not in last or line["seq"] > last[line["key"]]["seq"]:
                last[line["key"]] = line
        return last


def check_acknowledged(acks: Acks, view: StoreView) -> None:
    """(a) Mains and spawns, (b) memory, (c) results."""
    latest: dict[str, SessionRecord] = {}
    for line in acks.of("main"):
        record = view.sessions.get(uuid.UUID(line["id"]))
        assert record is not None, f"acknowledged main {line} is not stored"
        assert record.info.kind is SessionKind.MAIN
        assert record.info.key == line["key"]
        latest[line["key"]] = record
    for key, record in latest.items():
        # the key names the last acknowledged Main, or a successor opened after it ended
        holder_id = view.mains[key]
        assert holder_id is not None, f"no Main under {key}"
        holder = view.sessions[holder_id]
        if holder is not record:
            assert record.info.state.is_terminal, (record.info, holder.info)
            assert holder.info.key == key
            assert holder.info.created_at >= record.info.created_at
    for line in acks.of("spawn"):
        record = view.sessions.get(uuid.UUID(line["id"]))
        assert record is not None, f"acknowledged spawn {line} is not stored"
        assert record.info.kind.value == line["kind"]
        assert str(record.info.parent_id) == line["parent"]
    for line in acks.of("child"):
        # a skill's spawn promised nothing outside the process: it may be gone
        # with its parent's run, or kept (a worker under a running branch is
        # never written); kept, it is what was spawned, and ended
        record = view.sessions.get(uuid.UUID(line["id"]))
        if record is not None:
            assert record.info.kind.value == line["kind"], line
            assert str(record.info.parent_id) == line["parent"], line
    for key, line in acks.last_memory_writes().items():
        stored = view.by_id[line["id"]]
        if stored is not None:
            assert stored.value == line["value"], line
            continue
        # overwritten by the same run's next write, durable but cut off before its ack
        latest = view.by_key[key]
        assert latest is not None, f"acknowledged memory write {line} is gone"
        assert latest.value["nonce"] == line["nonce"], (line, latest)
        assert latest.value["seq"] == line["seq"] + 2, (line, latest)
    for line in acks.of("result"):
        record = view.sessions[uuid.UUID(line["id"])]
        assert record.info.state.value == line["status"], (line, record.info.state)
        assert record.result is not None
        assert record.result.status.value == line["status"]


def came_back(view: StoreView, session_id: uuid.UUID) -> bool:
    """Whether recovery brings the session back: Mains, and suspended branches
    whose parent comes back."""
    info = view.sessions[session_id].info
    if info.kind is SessionKind.MAIN:
        return not info.state.is_terminal
    if info.state is not SessionState.SUSPENDED or info.parent_id is None:
        return False
    return came_back(view, info.parent_id)


def check_recovery(before: StoreView, after: StoreView, figures: dict[str, int]) -> None:
    """(d) what was in flight at the crash failed with node_restarted, a suspended
    branch whose parent did not come back was cancelled, nothing else changed."""
    assert set(after.sessions) == set(before.sessions)
    ended: collections.Counter[ErrorCode] = collections.Counter()
    for session_id, old in before.sessions.items():
        new = after.sessions[session_id]
        if old.info.state.is_terminal or came_back(before, session_id):
            assert new.info.state is old.info.state, (old.info, new.info)
            assert new.result == old.result, (old.result, new.result)
            continue
        if old.info.state is SessionState.SUSPENDED:
            state, code = SessionState.CANCELLED, ErrorCode.PARENT_TERMINATED
        else:
            assert old.info.state in IN_FLIGHT, old.info
            state, code = SessionState.FAILED, ErrorCode.NODE_RESTARTED
        assert new.info.state is state, new.info
        assert new.result is not None
        assert new.result.status is state
        assert new.result.error is not None
        assert new.result.error.code is code, new.result
        ended[code] += 1
    assert figures.get("failed", 0) == ended[ErrorCode.NODE_RESTARTED], figures
    assert figures.get("orphans_cancelled", 0) == ended[ErrorCode.PARENT_TERMINATED], figures
    assert figures.get("quarantined", 0) == 0, figures


def check_one_result_each(view: StoreView) -> None:
    """(e) every terminal child's result is owed or filed, never both, never neither;
    nothing else is owed or filed."""
    for session_id, record in view.sessions.items():
        parent = record.info.parent_id
        if parent is None or not record.info.state.is_terminal:
            assert session_id not in view.outbox, f"{record.info} owes a result it does not have"
            continue
        owed = view.outbox.get(session_id)
        filed = view.filed.get(parent, {}).get(session_id)
        assert (owed is None) != (filed is None), (
            f"{record.info.kind.value} {session_id} ({record.info.state.value}): "
            f"owed={owed is not None} filed={filed is not None}"
        )
        if owed is not None:
            assert owed.parent_id == parent
            assert owed.result.status is record.info.state
        if filed is not None:
            assert filed.result.status is record.info.state
    for parent, children in view.filed.items():
        for child, filed in children.items():
            # a worker its branch's skill spawned has no record of its own: the
            # result names its parent
            record = view.sessions.get(child)
            assert (record.info.parent_id if record else filed.result.parent_id) == parent
    for owed in view.outbox.values():
        # a Main that settled has run a cycle for (and filed) every result it got
        assert view.sessions[owed.parent_id].info.kind is not SessionKind.MAIN, owed


def check_main_contexts(acks: Acks, view: StoreView) -> None:
    """(f) each acknowledged message and each child result once in its Main's
    context; at most once in the context of a Main that ended (it drops what
    it had not run)."""
    sent: dict[str, list[str]] = collections.defaultdict(list)
    for line in acks.of("send"):
        sent[line["main"]].append(line["text"])
    children: dict[uuid.UUID, list[SessionRecord]] = collections.defaultdict(list)
    for record in view.sessions.values():
        if record.info.parent_id is not None:
            children[record.info.parent_id].append(record)
    for main_id, main in view.sessions.items():
        if main.info.kind is not SessionKind.MAIN:
            continue
        assert view.inbox[main_id] == [], "a settled Main has run every stored message"
        ended = main.info.state.is_terminal
        assert main.context is not None
        texts: collections.Counter[str] = collections.Counter()
        results: collections.Counter[tuple[str, str]] = collections.Counter()
        for message in main.context.messages:
            if message.role == "user":
                texts[message.content["text"]] += 1
            else:
                results[(message.content["result"], message.content["status"])] += 1
        assert all(n == 1 for n in texts.values()), [t for t, n in texts.items() if n > 1]
        assert all(n == 1 for n in results.values()), [r for r, n in results.items() if n > 1]
        missing = [text for text in sent[str(main_id)] if text not in texts]
        assert ended or not missing, f"acknowledged messages never ran: {missing}"
        expected = {
            (str(child.info.session_id), child.info.state.value)
            for child in children[main_id]
            if child.info.state.is_terminal
        }
        assert set(results) <= expected, set(results) - expected
        assert ended or set(results) == expected, expected - set(results)


def check_cycles_once(acks: Acks, where: str) -> None:
    """(g) no two runs of one message's cycle share an attempt number."""
    attempts: dict[str, list[int]] = collections.defaultdict(list)
    for line in acks.of("cycle"):
        attempts[line["text"]].append(line["attempt"])
    twice = {text: runs for text, runs in attempts.items() if len(set(runs)) != len(runs)}
    assert not twice, f"{where}: cycles that ran twice as the same attempt: {twice}"


# -- the test ---------------------------------------------------------------------------


def recover(store: Path, log: Path) -> dict[str, int]:
    """Open a node on the store (recovery runs), let it settle, shut it down;
    the cycles it runs are logged to ``log``."""
    ack = AckLog(str(log))
    node = Node(make_agents(ack), CONFIG, store=store)
    try:
        assert node.wait_idle(WAIT), f"the recovered node did not settle: {node.activity.busy}"
        return node.recovery.figures
    finally:
        node.shutdown(grace=0.5, timeout=WAIT)
        ack.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("chain", range(CHAINS))
def test_kill_9_at_random_points_loses_nothing_acknowledged_and_owes_one_result_each(
    chain: int, tmp_path: Path
) -> None:
    rng = random.Random(chain)
    store = tmp_path / "store"
    acks = Acks()
    for round_ in range(ROUNDS):
        log = tmp_path / f"acks-{round_}.jsonl"
        seed = rng.randrange(1 << 30)
        run_and_kill(store, log, seed=seed, kill_after=rng.randint(*KILL_AFTER))
        acks.add(read_acks(log))
        last = acks.last_memory_writes()
        memory_ids = [line["id"] for line in last.values()]
        before = read_store(store, memory_ids, list(last))
        check_acknowledged(acks, before)
        if round_ < ROUNDS - 1 and rng.random() < LEFT_TO_NEXT_RUN:
            continue  # the next run recovers this crash itself, under its own workload
        recovered_log = tmp_path / f"recovered-{round_}.jsonl"
        figures = recover(store, recovered_log)
        acks.add(read_acks(recovered_log))
        after = read_store(store, memory_ids, list(last))
        check_acknowledged(acks, after)
        check_recovery(before, after, figures)
        check_one_result_each(after)
        check_main_contexts(acks, after)
        check_cycles_once(acks, f"chain {chain}, round {round_}, seed {seed}")
