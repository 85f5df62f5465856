"""Recovery that cannot spiral (issue 21): what a crash interrupted is fresh,
stale or wedged; a node that keeps crashing holds its replay back.

The rules are pure functions, tested as such. The rest runs real nodes on a
real LMDB store and the virtual clock: a crash is what it leaves in the store
(a Main's cycle mark and its inbox, a parked branch's run count, the node's
start record), written here directly, or a real ``kill -9`` in
``test_poison.py``.
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from sessiontree.actors import VirtualClock
from sessiontree.actors.runtime import CycleDone
from sessiontree.protocol import (
    ErrorCode,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.store import (
    CycleRecord,
    InboxRecord,
    StartsRecord,
    Store,
    WriteBatch,
    verify_store,
)
from sessiontree.supervision import Agent, Decision, Node, NodeConfig, NodeMetrics, classify
from sessiontree.supervision._entry import TreeEntry
from sessiontree.supervision._recovery import recover
from sessiontree.supervision._recovery_rules import crashes_after_start, hold_replay
from sessiontree.supervision._tree import Tree
from tests.conftest import settle

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
NOW = 1_800_000_000.0


# -- the rules ---------------------------------------------------------------------------


def rule(**given: Any) -> Any:
    fields: dict[str, Any] = {
        "attempts": 0,
        "created_at": NOW - 10,
        "deadline": None,
        "now": NOW,
        "max_attempts": 3,
        "max_age": None,
    }
    return classify(**{**fields, **given})


def test_work_never_cut_off_is_fresh_as_a_first_attempt() -> None:
    verdict = rule()
    assert (verdict.decision, verdict.attempt) == (Decision.FRESH, 1)


def test_work_cut_off_twice_is_fresh_as_its_third_attempt() -> None:
    verdict = rule(attempts=2)
    assert (verdict.decision, verdict.attempt) == (Decision.FRESH, 3)


def test_work_cut_off_as_often_as_the_limit_is_wedged() -> None:
    verdict = rule(attempts=3)
    assert verdict.decision is Decision.WEDGED
    assert "3 runs" in verdict.reason


def test_work_past_its_ttl_is_stale_even_when_wedged() -> None:
    verdict = rule(attempts=5, deadline=NOW - 1)
    assert verdict.decision is Decision.STALE
    assert "TTL" in verdict.reason


def test_work_older_than_the_max_age_is_stale() -> None:
    assert rule(created_at=NOW - 100, max_age=60.0).decision is Decision.STALE
    assert rule(created_at=NOW - 30, max_age=60.0).decision is Decision.FRESH


def test_crashes_count_the_previous_run_only_when_it_never_stopped_cleanly() -> None:
    clean = crashes_after_start(
        previous_running=False, previous_start=NOW - 5, crashes=[NOW - 20], now=NOW, period=60
    )
    assert clean == [NOW - 20]
    crashed = crashes_after_start(
        previous_running=True,
        previous_start=NOW - 5,
        crashes=[NOW - 90, NOW - 20],
        now=NOW,
        period=60,
    )
    assert crashed == [NOW - 20, NOW - 5]  # the one older than the period is forgotten


def test_replay_is_held_at_the_restart_intensity_and_never_at_zero() -> None:
    assert hold_replay([NOW] * 4, intensity=5, period=60) is None
    reason = hold_replay([NOW] * 5, intensity=5, period=60)
    assert reason is not None
    assert "restart_intensity=5" in reason
    assert hold_replay([NOW] * 50, intensity=0, period=60) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("recovery_attempts", 0),
        ("recovery_attempts", True),
        ("restart_intensity", -1),
        ("recovery_max_age", 0),
        ("restart_period", float("nan")),
    ],
)
def test_bad_recovery_settings_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        NodeConfig(**{field: value})


# -- nodes on a store ----------------------------------------------------------------------


class Cycles:
    """A Main skill recording (message, attempt) for every cycle it runs; a
    child's result is recorded as ("result", child id)."""

    def __init__(self) -> None:
        self.ran: list[tuple[Any, int]] = []
        self.lock = threading.Lock()

    def __call__(self, session: Any) -> None:
        message = session.message
        if isinstance(message, SessionResult):
            message = ("result", message.session_id)
        with self.lock:
            self.ran.append((message, session.attempt))

    def results_of(self, child: uuid.UUID) -> int:
        """How many cycles ran for ``child``'s result."""
        return sum(1 for message, _ in self.ran if message == ("result", child))


def loops(session: Any) -> str:
    """A branch that runs until parked or cancelled; ``attempt`` in its result."""
    while True:
        session.checkpoint()
        session.sleep(0.5)


FIXED = threading.Event()  # set: "finishes" returns at once (the operator fixed it)


@pytest.fixture(autouse=True)
def not_fixed() -> Iterator[None]:
    FIXED.clear()
    yield
    FIXED.clear()


def finishes(session: Any) -> dict[str, Any]:
    """A branch that runs until a shutdown parks it, and finishes once it runs
    again after a restart (or at once once ``FIXED``)."""
    while not (session.resumed or FIXED.is_set()):
        session.checkpoint()
        session.sleep(0.5)
    return {"attempt": session.attempt, "resumed": session.resumed}


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=NOW)


@pytest.fixture
def nodes(clock: VirtualClock) -> Iterator[Callable[..., Node]]:
    opened: list[Node] = []

    def open_(store: pathlib.Path, agent: Agent, **config: Any) -> Node:
        node = Node([agent], NodeConfig(grace=5.0, **config), clock=clock, store=store)
        opened.append(node)
        return node

    yield open_
    for node in opened:
        node.shutdown(grace=0.0)


def agent_with(main: Cycles) -> Agent:
    return Agent("agent", {"main": main, "loops": loops, "finishes": finishes}, main_skill="main")


def main_id_of(node: Node) -> uuid.UUID:
    return node.main("agent").session_id


def leave_as_a_crash_would(
    store_path: pathlib.Path,
    main_id: uuid.UUID,
    messages: list[Any],
    *,
    cut_off: int | None = None,
    first_seq: int = 0,
    received_at: float = NOW,
) -> None:
    """Write what a crash in the middle of the first of ``messages`` leaves: the
    acknowledged messages in the Main's inbox, and (``cut_off``) the mark of
    that cycle's attempt."""
    batch = WriteBatch()
    for n, message in enumerate(messages):
        record = InboxRecord(
            session_id=main_id, seq=first_seq + n, message=message, received_at=received_at
        )
        batch.inbox(record)
    if cut_off is not None:
        mark = CycleRecord(session_id=main_id, seq=first_seq, attempt=cut_off, started_at=NOW)
        batch.cycle(mark)
    batch.starts(StartsRecord(running=False))  # the crash itself is not what these test
    with Store(store_path) as store:
        store.write(batch)


def test_a_cycle_is_on_record_once_its_skill_reads_its_attempt_and_unmarked_with_its_snapshot(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    """The cycle does not wait for its mark; a skill that reads its attempt (to
    deduplicate effects outside the store) waits until the mark is durable."""
    seen: list[CycleRecord | None] = []
    node: Node | None = None

    def main(session: Any) -> None:
        assert node is not None
        assert node.store is not None
        assert session.attempt == 1
        seen.append(node.store.cycle(session.session_id))

    node = nodes(tmp_path, Agent("agent", {"main": main}, main_skill="main"))
    ref = node.main("agent")
    assert ref.send("hello") is None
    settle(node)
    (mark,) = seen
    assert mark is not None
    assert (mark.session_id, mark.seq, mark.child_id, mark.attempt) == (ref.session_id, 0, None, 1)
    assert node.store is not None
    node.store.flush()
    assert node.store.cycle(ref.session_id) is None
    assert node.store.inbox(ref.session_id) == []


def test_a_replayed_cycle_runs_only_once_its_mark_is_durable(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    """A fresh input's cycle does not wait for its mark; one replayed after a
    restart does, so a crash it causes again counts against it (a poison
    message is held back after ``recovery_attempts``), whether or not its
    skill reads its attempt."""
    seen: list[CycleRecord | None] = []
    node: Node | None = None

    def main(session: Any) -> None:
        assert node is not None
        assert node.store is not None
        seen.append(node.store.cycle(session.session_id))  # before reading the attempt

    agent = Agent("agent", {"main": main}, main_skill="main")
    node = nodes(tmp_path, agent)
    main_id = node.main("agent").session_id
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main_id, ["cut"], cut_off=1)
    node = nodes(tmp_path, agent)
    settle(node)
    (mark,) = seen
    assert mark is not None
    assert (mark.session_id, mark.seq, mark.attempt) == (main_id, 0, 2)


def test_the_snapshot_ending_a_cycle_reaches_the_store_before_the_next_cycles_mark(
    nodes: Callable[..., Node],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    release: threading.Event,
) -> None:
    """The snapshot that ends a cycle drops the Main's mark. Had the next cycle's
    mark been submitted before it, the snapshot would drop that mark too, and a
    crash in that cycle would run it again as the same attempt. The order of
    the cycle writes shows whether the first snapshot came after that mark."""
    cycle_writes: list[str] = []
    lock = threading.Lock()
    second_mark = threading.Event()
    submit, post = Store.submit, Tree.post

    def spied_submit(
        store: Store, batch: WriteBatch, *, lazy: bool = False
    ) -> concurrent.futures.Future[None]:
        with lock:
            cycle_writes.extend(kind for kind, db, _, _ in batch.ops if db == "cycles")
            if cycle_writes.count("put") == 2:
                second_mark.set()
        return submit(store, batch, lazy=lazy)

    cycles_done: list[TreeEntry] = []

    def counted_post(tree: Tree, entry: TreeEntry, message: object) -> None:
        post(tree, entry, message)
        if isinstance(message, CycleDone):
            cycles_done.append(entry)

    monkeypatch.setattr(Store, "submit", spied_submit)
    monkeypatch.setattr(Tree, "post", counted_post)
    ran: list[Any] = []
    first_running = threading.Event()

    def main(session: Any) -> None:
        ran.append(session.message)
        if session.message == "one":
            first_running.set()
            assert release.wait(WAIT)

    node = nodes(tmp_path, Agent("agent", {"main": main}, main_skill="main"))
    ref = node.main("agent")
    assert ref.send("one") is None
    assert first_running.wait(WAIT)
    assert ref.send("two") is None  # queued on the Main before its first cycle ends
    release.set()
    settle(node)
    assert ran == ["one", "two"]
    assert len(cycles_done) == 2
    assert second_mark.is_set()
    assert cycle_writes == ["put", "delete", "put", "delete"]
    assert node.store is not None
    node.store.flush()
    assert node.store.cycle(ref.session_id) is None


def test_a_message_cut_off_once_runs_again_as_attempt_two_then_the_rest_in_order(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    log = Cycles()
    node = nodes(tmp_path, agent_with(log))
    main = main_id_of(node)
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main, ["cut", "next"], cut_off=1)

    node = nodes(tmp_path, agent_with(log))
    settle(node)
    assert log.ran == [("cut", 2), ("next", 1)]
    assert node.recovery.figures["fresh"] == 2
    (decision,) = node.recovery.decisions  # a plain first run is counted, not listed
    assert (decision.kind, decision.decision, decision.attempt, decision.seq) == (
        "message",
        "fresh",
        2,
        0,
    )
    assert node.recovery.wedged() == []


def test_a_rerun_a_crash_cut_off_before_it_started_still_runs_as_attempt_two(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    """A node recovers (its rerun of the cut-off cycle is attempt 2) and is killed
    before that rerun marked its cycle: the count is still in the store, so the
    next node runs it as attempt 2, never as a first attempt again (issue 22)."""
    log = Cycles()
    node = nodes(tmp_path, agent_with(log))
    main = main_id_of(node)
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main, ["cut", "next"], cut_off=1)
    with Store(tmp_path) as store:  # recovery's commit, then the kill: no cycle ran
        assert recover(store, {"agent": agent_with(log)}, NOW).attempts == {(main, 0): 2}
    assert log.ran == []

    node = nodes(tmp_path, agent_with(log))
    settle(node)
    assert log.ran == [("cut", 2), ("next", 1)]


def test_a_cut_off_message_runs_again_before_the_results_owed_to_its_main(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    """A Main has one cycle mark, which its next cycle's snapshot drops: the cycle
    a crash cut off runs again first, so its count stays in the store until its
    rerun marks itself, whatever else the Main has to run."""
    log = Cycles()
    node = nodes(tmp_path, agent_with(log))
    main = main_id_of(node)
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main, ["cut", "next"], cut_off=1)
    child = uuid.uuid4()
    owed = SessionResult(
        session_id=child, status=SessionState.COMPLETED, parent_id=main, kind=SessionKind.WORKER
    )
    with Store(tmp_path) as store:
        store.write(WriteBatch().owe(main, owed))

    node = nodes(tmp_path, agent_with(log))
    settle(node)
    assert log.ran == [("cut", 2), (("result", child), 1), ("next", 1)]


def test_a_message_cut_off_at_every_attempt_is_held_back_and_the_rest_runs(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    log = Cycles()
    node = nodes(tmp_path, agent_with(log), recovery_attempts=3)
    main = main_id_of(node)
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main, [{"poison": True}, "after"], cut_off=3)

    node = nodes(tmp_path, agent_with(log), recovery_attempts=3)
    settle(node)
    assert log.ran == [("after", 1)]
    assert node.recovery.figures["wedged"] == 1
    (item,) = node.recovery.wedged()
    assert (item.kind, item.session_id, item.seq, item.message, item.attempts) == (
        "message",
        main,
        0,
        {"poison": True},
        3,
    )
    assert item.reason.startswith("wedged: a crash cut off each of its last 3 runs")
    (decision,) = node.recovery.decisions
    assert (decision.decision, decision.wedged_id) == ("wedged", item.wedged_id)
    assert node.store is not None
    node.store.flush()
    assert node.store.inbox(main) == []  # never run again on its own
    node.shutdown()

    node = nodes(tmp_path, agent_with(log))  # a restart does not bring it back
    settle(node)
    assert log.ran == [("after", 1)]
    assert [w.wedged_id for w in node.recovery.wedged()] == [item.wedged_id]
    assert node.store is not None
    verified = verify_store(node.store)  # every new record decodes under its own key
    assert verified.clean, verified.problems
    assert verified.entries["wedged"] == 1


def test_a_requeued_message_runs_once_as_a_first_attempt_and_is_no_longer_held(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    log = Cycles()
    node = nodes(tmp_path, agent_with(log))
    main = main_id_of(node)
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main, ["fixed now"], cut_off=3)
    node = nodes(tmp_path, agent_with(log))
    settle(node)
    (item,) = node.recovery.wedged()

    requeued = node.recovery.requeue(str(item.wedged_id))
    assert (requeued.session_id, requeued.error) == (main, None)
    settle(node)
    assert log.ran == [("fixed now", 1)]
    assert node.recovery.wedged() == []
    again = node.recovery.requeue(item.wedged_id)
    assert again.error is not None
    assert again.error.code is ErrorCode.UNKNOWN_SESSION


def test_a_dropped_item_is_gone_and_dropping_it_again_says_so(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    log = Cycles()
    node = nodes(tmp_path, agent_with(log))
    main = main_id_of(node)
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main, ["poison"], cut_off=3)
    node = nodes(tmp_path, agent_with(log))
    (item,) = node.recovery.wedged()
    metrics = NodeMetrics(node, CollectorRegistry())
    try:
        assert "sessiontree_wedged_items 1.0" in metrics.exposition().decode()
        assert node.recovery.drop_wedged(item.wedged_id) is True
        assert "sessiontree_wedged_items 0.0" in metrics.exposition().decode()
    finally:
        metrics.close()
    assert node.recovery.wedged() == []
    assert node.recovery.drop_wedged(item.wedged_id) is False
    assert log.ran == []


def test_a_bad_wedged_id_is_refused_naming_the_field(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    node = nodes(tmp_path, agent_with(Cycles()))
    with pytest.raises(RejectedInputError) as caught:
        node.recovery.requeue("not-an-id")
    assert caught.value.field == "wedged_id"


def test_a_message_older_than_the_max_age_is_held_back_as_stale(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    log = Cycles()
    node = nodes(tmp_path, agent_with(log))
    main = main_id_of(node)
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main, ["old"], received_at=NOW - 7200)
    node = nodes(tmp_path, agent_with(log), recovery_max_age=3600.0)
    settle(node)
    assert log.ran == []
    (item,) = node.recovery.wedged()
    assert item.reason.startswith("stale: it is 7200 s old")
    assert node.recovery.figures["stale"] == 1


def park_a_branch(
    nodes: Callable[..., Node],
    store_path: pathlib.Path,
    log: Cycles,
    skill: str,
) -> tuple[uuid.UUID, uuid.UUID]:
    """A Main with one branch of ``skill`` parked by a clean shutdown."""
    node = nodes(store_path, agent_with(log))
    main = node.main("agent")
    spawned = main.spawn(kind="branch", skill=skill, ttl=600.0)
    assert spawned.ok, spawned.error
    settle(node)
    assert spawned.session_id is not None
    node.shutdown(grace=5.0)
    with Store(store_path) as store:
        record = store.session(spawned.session_id)
        assert record is not None
        assert (record.info.state, record.resume, record.attempts) == (
            SessionState.SUSPENDED,
            True,
            0,
        )
    return main.session_id, spawned.session_id


def set_branch_attempts(store_path: pathlib.Path, branch: uuid.UUID, attempts: int) -> None:
    """What a crash during the rerun of a parked branch leaves: its count."""
    with Store(store_path) as store:
        record = store.session(branch)
        assert record is not None
        store.write(
            WriteBatch()
            .session(msgspec.structs.replace(record, attempts=attempts))
            .starts(StartsRecord(running=False))
        )


def test_a_parked_branch_runs_again_counting_its_attempt_durably_first(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    log = Cycles()
    _, branch = park_a_branch(nodes, tmp_path, log, "finishes")
    set_branch_attempts(tmp_path, branch, 1)  # one rerun was cut off by a crash

    node = nodes(tmp_path, agent_with(log))
    result = node.wait(branch, WAIT)
    assert result is not None
    assert result.status is SessionState.COMPLETED
    assert result.artifacts == {"attempt": 2, "resumed": True}
    settle(node)
    assert log.results_of(branch) == 1


def test_a_parked_branch_cut_off_at_every_rerun_ends_wedged_and_its_parent_hears_once(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    log = Cycles()
    main, branch = park_a_branch(nodes, tmp_path, log, "finishes")
    set_branch_attempts(tmp_path, branch, 3)

    node = nodes(tmp_path, agent_with(log))
    settle(node)
    info = node.get(branch)
    assert info.state is SessionState.FAILED
    result = node.result(branch)
    assert result is not None
    assert result.error is not None
    assert result.error.code is ErrorCode.WEDGED
    assert log.results_of(branch) == 1
    (item,) = node.recovery.wedged()
    assert (item.kind, item.session_id) == ("branch", branch)
    node.shutdown()

    node = nodes(tmp_path, agent_with(log))  # told once, also across a restart
    settle(node)
    assert log.results_of(branch) == 1

    FIXED.set()
    requeued = node.recovery.requeue(item.wedged_id)  # a fresh session under the same parent
    assert requeued.error is None
    assert requeued.session_id is not None
    assert requeued.session_id != branch
    fresh = node.wait(requeued.session_id, WAIT)
    assert fresh is not None
    assert fresh.status is SessionState.COMPLETED
    assert fresh.artifacts == {"attempt": 1, "resumed": False}
    assert node.get(requeued.session_id).parent_id == main
    assert node.recovery.wedged() == []


def test_a_suspended_branch_whose_ttl_ran_out_while_the_node_was_down_ends_expired(
    nodes: Callable[..., Node], tmp_path: pathlib.Path, clock: VirtualClock
) -> None:
    log = Cycles()
    _, branch = park_a_branch(nodes, tmp_path, log, "loops")
    clock.advance(601.0)
    node = nodes(tmp_path, agent_with(log))
    settle(node)
    result = node.result(branch)
    assert result is not None
    assert result.error is not None
    assert (result.status, result.error.code) == (SessionState.EXPIRED, ErrorCode.TTL_EXPIRED)
    assert log.results_of(branch) == 1
    assert node.recovery.figures["stale"] == 1
    assert node.recovery.wedged() == []  # an ended branch is not held: it is over


def test_a_node_that_keeps_crashing_holds_replay_until_released(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    log = Cycles()
    node = nodes(tmp_path, agent_with(log))
    main = main_id_of(node)
    node.shutdown()
    leave_as_a_crash_would(tmp_path, main, ["replayed"], cut_off=1)
    with Store(tmp_path) as store:  # four crashes in the last minute, and one more now
        crashes = [NOW - 50, NOW - 40, NOW - 30, NOW - 20]
        store.write(
            WriteBatch().starts(StartsRecord(running=True, started_at=NOW - 10, crashes=crashes))
        )

    node = nodes(tmp_path, agent_with(log), restart_intensity=5, restart_period=300.0)
    assert node.recovery.replay_held is not None
    assert "crashed 5 times" in node.recovery.replay_held
    assert node.recovery.figures["recent_crashes"] == 5
    settle(node)
    node.shutdown()  # a clean stop while held: the count of the cut-off cycle is kept
    node = nodes(tmp_path, agent_with(log), restart_intensity=5, restart_period=300.0)
    assert node.recovery.replay_held is not None
    assert node.main("agent").send("new") is None  # accepted, queued behind the held replay
    settle(node)
    assert log.ran == []

    metrics = NodeMetrics(node, CollectorRegistry())
    try:
        held = metrics.exposition().decode()
        assert "sessiontree_replay_held 1.0" in held
        assert 'sessiontree_recovery_decisions_total{decision="fresh"} 1.0' in held
        assert node.recovery.release_replay() == 2
        settle(node)
        assert log.ran == [("replayed", 2), ("new", 1)]
        assert node.recovery.replay_held is None
        assert "sessiontree_replay_held 0.0" in metrics.exposition().decode()
    finally:
        metrics.close()
    node.shutdown()
    node = nodes(tmp_path, agent_with(log), restart_intensity=5, restart_period=300.0)
    assert node.recovery.replay_held is None  # released: the crashes so far are forgiven


def test_a_clean_shutdown_is_not_counted_as_a_crash(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    for _ in range(6):
        node = nodes(tmp_path, agent_with(Cycles()), restart_intensity=2)
        assert node.recovery.replay_held is None
        node.shutdown()
    with Store(tmp_path, readonly=True) as store:
        starts = store.starts()
    assert starts is not None
    assert (starts.running, starts.crashes) == (False, [])


def test_main_sessions_are_untouched_by_classification(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    node = nodes(tmp_path, agent_with(Cycles()))
    main = main_id_of(node)
    node.shutdown()
    node = nodes(tmp_path, agent_with(Cycles()))
    assert node.get(main).kind is SessionKind.MAIN
    assert node.recovery.figures["mains"] == 1
    assert node.recovery.decisions == []


def test_a_cycle_a_clean_shutdown_let_go_runs_again_as_it_was_never_counted_as_a_crash(
    nodes: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    runs: list[int] = []

    def main(session: Any) -> None:
        runs.append(session.attempt)
        if not FIXED.is_set():
            session.sleep(3600.0)  # at a checkpoint: the shutdown lets it go

    agent = Agent("agent", {"main": main}, main_skill="main")
    for _ in range(4):  # more clean stops than recovery_attempts
        node = nodes(tmp_path, agent)
        if not runs:
            assert node.main("agent").send("slow") is None
        settle(node)
        node.shutdown(grace=1.0)
    FIXED.set()
    node = nodes(tmp_path, agent)
    settle(node)
    assert runs == [1, 1, 1, 1, 1]
    assert node.recovery.wedged() == []
    assert node.recovery.decisions == []
