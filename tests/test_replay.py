"""Recording and deterministic replay of a subtree (issue 26).

A research tree modelled on the demo's (``tests/replay_tree.py``: random
numbers drawn through the session, clock readings, model calls to the
chat-completions stand-in on 127.0.0.1, a crash, a quorum that cancels a
child in grace) is recorded, then replayed on a virtual clock with the
server stopped: every session's events and result are the same. A skill
changed since makes the replay stop at its first divergence; a recording
survives a ``kill -9`` of its node; bad recordings are typed errors."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sessiontree.actors import Cancelled, Session, VirtualClock
from sessiontree.cli import main as cli_main
from sessiontree.protocol import (
    ErrorCode,
    Outcome,
    Recording,
    RecordingError,
    RejectedInputError,
    ReplayReport,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnSpec,
    TapeClock,
    TapedSession,
    TapeInterrupt,
    TapeModel,
    TapeSeed,
    TapeSpawn,
)
from sessiontree.supervision import Agent, Node, NodeConfig, load_recording
from sessiontree.testing import StandinServer
from tests import replay_tree
from tests._processes import line_then_kill_9
from tests.conftest import WAIT, settle
from tests.replay_tree import config, make_agent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server() -> Iterator[StandinServer]:
    with StandinServer() as standin:
        yield standin


def record_branch(node: Node, skill: str) -> uuid.UUID:
    """Spawn a recorded Branch of ``skill`` under the agent's Main; its id."""
    spawned = node.spawn(node.main("agent").session_id, kind="branch", skill=skill, record=True)
    assert spawned.session_id is not None
    return spawned.session_id


def ended_and_replayed(
    node: Node, root: uuid.UUID
) -> tuple[SessionResult, Recording, ReplayReport]:
    """The recorded ``root``'s result once it ended, its recording, and a replay of it."""
    result = node.ref(root).wait(WAIT)
    assert result is not None
    settle(node)
    return result, node.recordings.recording(root), node.recordings.replay(root)


def clocked_agent(**skills: Callable[..., Any]) -> Agent:
    """An agent of ``skills`` (and a Main that does nothing)."""
    return Agent("agent", {"lead": replay_tree.lead, **skills}, main_skill="lead")


def clocked_node(clock: VirtualClock, **skills: Callable[..., Any]) -> Node:
    """A node on ``clock`` (grace 5 s) for an agent of ``skills``; the test shuts it down."""
    return Node([clocked_agent(**skills)], NodeConfig(grace=5.0), clock=clock)


def record(node: Node) -> SessionResult:
    result = node.main("agent").run(
        kind="branch", skill="research", task="agents", record=True, timeout=WAIT * 3
    )
    assert result is not None
    assert result.ok, result
    return result


def test_a_recorded_tree_replays_identically_with_the_model_server_stopped() -> None:
    with StandinServer() as standin:
        node = Node([make_agent()], config(standin.url))
        result = record(node)
        recording = node.recordings.recording(result.session_id)
        asked = len(standin.requests)
    try:
        report = node.recordings.replay(result.session_id)
    finally:
        node.shutdown()

    assert recording.complete
    assert recording.recording_id == result.session_id
    paths = sorted(s.path for s in recording.sessions)
    # the root, its four workers, the tracing branch and its three readers
    assert paths == ["0", "0.0", "0.1", "0.2", "0.3", "0.4", "0.4.0", "0.4.1", "0.4.2"]
    tapes = {s.path: s for s in recording.sessions}
    assert isinstance(tapes["0"].tape[0], TapeSeed)  # the research branch's own number
    assert all(isinstance(tapes[p].tape[0], TapeSeed) for p in ("0.0", "0.1", "0.2"))
    models = [e for s in recording.sessions for e in s.tape if isinstance(e, TapeModel)]
    assert len(models) == asked  # every reply the server gave is on a tape
    assert tapes["0.3"].result is not None
    assert tapes["0.3"].result.status is SessionState.FAILED  # the corrupt PDF
    cut = [s for s in recording.sessions if any(isinstance(e, TapeInterrupt) for e in s.tape)]
    assert [s.path for s in cut] == ["0.4.2"]  # the quorum cancelled it in grace

    assert report.identical, report.divergence
    assert report.divergence is None
    assert report.sessions == len(recording.sessions)
    assert report.steps == sum(len(s.tape) for s in recording.sessions)
    assert report.result is not None
    assert report.result.artifacts == result.artifacts  # the draw, the clock, the replies
    assert report.result.session_id != result.session_id  # a fresh run of it
    # the replay's clock: the model's recorded latencies, skills' own work in no time
    took = sum(e.took for e in models)
    assert report.recorded_s is not None
    assert report.replayed_s is not None
    assert 0 < report.replayed_s <= report.recorded_s
    assert report.replayed_s <= took


def research_clock_first(session: Session) -> object:
    session.clock.monotonic()  # reads the clock before drawing its number
    return replay_tree.research(session)


def test_a_changed_skill_makes_the_replay_report_its_first_divergence(
    server: StandinServer,
) -> None:
    node = Node([make_agent()], config(server.url))
    try:
        result = record(node)
        recording = node.recordings.recording(result.session_id)
    finally:
        node.shutdown()
    ids = {s.path: s.session_id for s in recording.sessions}

    asks_otherwise = Node.replay_recording(
        recording, [make_agent(read=replay_tree.read_differently)]
    )
    found = asks_otherwise.divergence
    assert not asks_otherwise.identical
    assert found is not None
    assert found.session in {"0.0", "0.1", "0.2"}  # whichever reader asked first
    assert (found.skill, found.step) == ("read", "1")  # its number drawn, then the call
    assert found.session_id == ids[found.session]
    assert "notes on paper" in found.recorded
    assert "a summary of paper" in found.happened

    reads_clock_first = Node.replay_recording(
        recording, [make_agent(research=research_clock_first)]
    )
    found = reads_clock_first.divergence
    assert found is not None
    assert (found.session, found.skill, found.step) == ("0", "research", "0")
    assert found.recorded == "a random seed drawn"
    assert found.happened == "a monotonic clock reading"


def test_an_exported_recording_replays_from_its_file_on_another_node(
    server: StandinServer, tmp_path: pathlib.Path
) -> None:
    node = Node([make_agent()], config(server.url))
    path = tmp_path / "run.recording"
    try:
        result = record(node)
        exported = node.recordings.export_recording(result.session_id, path)
    finally:
        node.shutdown()
    loaded = load_recording(path)
    assert loaded == exported
    report = Node.replay_recording(loaded, [make_agent()])
    assert report.identical, report.divergence


def waiter(session: Session) -> str:
    session.progress("waiting")
    try:
        session.sleep(60.0)
    except Cancelled:
        session.progress("wrapping up")
        return "wrapped up"
    return "slept"


def keeper(session: Session) -> dict[str, object]:
    session.spawn_many(
        [
            SpawnSpec(kind=SessionKind.WORKER, skill="waiter", task="cancelled"),
            SpawnSpec(kind=SessionKind.WORKER, skill="waiter", task="expires", ttl=5.0),
        ]
    )
    got = session.collect()
    return {
        "got": [
            [c.result.status.value, c.result.error and c.result.error.code.value, c.result.summary]
            for c in got
            if c.result is not None
        ]
    }


def test_a_cancel_from_outside_and_a_ttl_replay_where_they_reached_the_skills() -> None:
    clock = VirtualClock()
    node = clocked_node(clock, keeper=keeper, waiter=waiter)
    try:
        root = record_branch(node, "keeper")
        settle(node)
        children = node.tree(root)["children"]
        cancelled = next(c["info"].session_id for c in children if c["info"].task == "cancelled")
        assert node.cancel(cancelled) is None  # an operator's cancel, mid-sleep
        settle(node)
        clock.advance(10.0)  # the other one's TTL of 5 s runs out
        settle(node)
        result, recording, report = ended_and_replayed(node, root)
    finally:
        node.shutdown()

    assert result.artifacts["got"] == [
        ["cancelled", "cancelled", "wrapped up"],
        ["expired", "ttl_expired", "waiting"],
    ]
    tapes = {s.path: s.tape for s in recording.sessions}
    assert tapes["0.0"] == [TapeInterrupt("cancelled", 2)]  # in the sleep, its second call
    assert report.identical, report.divergence


def test_a_recording_survives_a_kill_9_and_replays_from_the_store(
    tmp_path: pathlib.Path,
) -> None:
    store = tmp_path / "store"
    with StandinServer() as standin:
        root = uuid.UUID(line_then_kill_9("tests.replay_tree", str(store), standin.url))
    node = Node([make_agent()], config("http://127.0.0.1:9/v1"), store=store)
    try:
        report = node.recordings.replay(root)  # the server is gone: the tape answers
    finally:
        node.shutdown()
    assert report.identical, report.divergence
    assert report.sessions == 9


def test_a_run_cut_off_by_a_kill_9_is_an_incomplete_recording(tmp_path: pathlib.Path) -> None:
    store = tmp_path / "store"
    with StandinServer() as standin:
        root = uuid.UUID(line_then_kill_9("tests.replay_tree", str(store), standin.url, "--cut"))
    node = Node([make_agent()], config("http://127.0.0.1:9/v1"), store=store)
    try:
        with pytest.raises(RecordingError) as raised:
            node.recordings.replay(root)
    finally:
        node.shutdown()
    assert raised.value.reason == "incomplete"
    assert raised.value.session_id == root


# -- bad input ----------------------------------------------------------------------------


def test_replaying_a_session_that_was_not_recorded_is_a_typed_error(
    server: StandinServer, tmp_path: pathlib.Path
) -> None:
    for store in (None, tmp_path / "store"):
        node = Node([make_agent()], config(server.url), store=store)
        try:
            plain = node.main("agent").run(kind="branch", skill="read", task="x", timeout=WAIT)
            assert plain is not None
            for session_id in (plain.session_id, uuid.uuid4()):
                with pytest.raises(RecordingError) as raised:
                    node.recordings.replay(session_id)
                assert raised.value.reason == "not_recorded"
                assert raised.value.session_id == session_id
        finally:
            node.shutdown()


def test_a_recording_of_another_format_version_is_refused(tmp_path: pathlib.Path) -> None:
    other = _small_recording(format=2)
    path = tmp_path / "other.recording"
    path.write_bytes(other.encode())
    with pytest.raises(RecordingError) as raised:
        load_recording(path)
    assert raised.value.reason == "version"
    assert "format 2" in str(raised.value)


def test_a_truncated_or_malformed_recording_is_refused(tmp_path: pathlib.Path) -> None:
    whole = _small_recording().encode()
    cases = {
        "truncated": whole[: len(whole) - 7],
        "malformed": b"not a recording at all",
    }
    cases["malformed body"] = whole[:22] + b"\xc1\xc1\xc1"
    for name, data in cases.items():
        path = tmp_path / "bad.recording"
        path.write_bytes(data)
        with pytest.raises(RecordingError) as raised:
            load_recording(path)
        assert raised.value.reason == name.split()[0], name


def test_a_recording_that_decodes_but_breaks_its_rules_is_refused_naming_the_field() -> None:
    def taped(*tape: Any) -> TapedSession:
        return TapedSession(
            path="0", session_id=uuid.uuid4(), kind="branch", skill="s", tape=[*tape]
        )

    shallow = _small_recording()
    shallow.depth = 0
    odd_code = _small_recording()
    odd_code.sessions = [taped(TapeInterrupt(code="no_such_code", call=1))]
    uneven = _small_recording()
    spawn = TapeSpawn(skills=["a", "b"], tasks=["t"], children=[1, 2], refused=[None, None])
    uneven.sessions = [taped(TapeSeed(seed=1), spawn)]
    cases = {
        "depth 0": shallow,
        "sessions[0].tape[0].code 'no_such_code' is not an error code": odd_code,
        "sessions[0].tape[1]: its lists differ in length": uneven,
    }
    for problem, recording in cases.items():
        with pytest.raises(RecordingError) as raised:
            Recording.decode(recording.encode())
        assert raised.value.reason == "malformed", problem
        assert problem in str(raised.value)


def test_a_recording_file_past_the_size_cap_is_refused_before_it_is_read(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.recording"
    path.write_bytes(_small_recording().encode())
    monkeypatch.setattr("sessiontree.supervision._node_replay.MAX_RECORDING_BYTES", 16)
    with pytest.raises(RecordingError) as raised:
        load_recording(path)
    assert raised.value.reason == "too_large"
    assert str(path) in str(raised.value)


def test_replaying_without_the_recorded_agent_or_an_incomplete_recording_is_refused() -> None:
    with pytest.raises(RecordingError) as raised:
        Node.replay_recording(_small_recording(), [Agent("someone else", {"s": waiter})])
    assert raised.value.reason == "unknown_agent"
    unfinished = _small_recording()
    unfinished.complete = False
    with pytest.raises(RecordingError) as raised:
        Node.replay_recording(unfinished, [make_agent()])
    assert raised.value.reason == "incomplete"
    rootless = _small_recording()  # complete, but holding no session at all
    with pytest.raises(RecordingError, match="no root") as raised:
        Node.replay_recording(rootless, [make_agent()])
    assert raised.value.reason == "malformed"


def test_a_spawn_whose_record_flag_is_not_a_bool_is_refused_naming_it() -> None:
    node = Node([make_agent()], config("http://127.0.0.1:9/v1"))
    try:
        with pytest.raises(RejectedInputError) as raised:
            node.spawn(node.main("agent").session_id, kind="branch", record="yes")
    finally:
        node.shutdown()
    assert raised.value.field == "record"


def _small_recording(format: int = 1) -> Recording:
    return Recording(
        format=format,
        recording_id=uuid.uuid4(),
        agent_id="agent",
        depth=1,
        spec=SpawnSpec(kind=SessionKind.BRANCH, skill="research", task="t", record=True),
        started_at=1_700_000_000.0,
        grace=5.0,
        complete=True,
    )


def outer(session: Session) -> str:
    """A Branch that records only the subtree of the one child it spawns."""
    spawned = session.spawn(kind="branch", skill="research", task="deeper", record=True)
    assert spawned.session_id is not None
    result = session.wait(spawned.session_id)
    assert result is not None
    return str(spawned.session_id)


def test_a_subtree_recorded_below_a_branch_replays_at_its_depth(server: StandinServer) -> None:
    node = Node([make_agent(outer=outer)], config(server.url))
    try:
        result = node.main("agent").run(kind="branch", skill="outer", task="o", timeout=WAIT * 3)
        assert result is not None
        assert result.ok, result
        inner = uuid.UUID(result.summary)
        recording = node.recordings.recording(inner)
        report = node.recordings.replay(inner)
        with pytest.raises(RecordingError):
            node.recordings.recording(result.session_id)  # the outer branch itself was not recorded
    finally:
        node.shutdown()
    assert recording.depth == 2
    assert report.identical, report.divergence
    assert report.sessions == 9


def test_the_cli_lists_replays_and_exports_a_stored_recording(
    server: StandinServer, tmp_path: pathlib.Path
) -> None:
    store = tmp_path / "store"
    node = Node([make_agent()], config(server.url), store=store)
    try:
        root = record(node).session_id
        recorded = node.recordings.recording(root)  # complete and written
    finally:
        node.shutdown()
    runner = CliRunner()

    def cli(*args: str) -> Result:
        return runner.invoke(cli_main, list(args), catch_exceptions=False)

    listed = cli("replay", "--store", str(store), "--json")
    assert listed.exit_code == 0, listed.output
    (entry,) = json.loads(listed.output)
    assert (entry["recording_id"], entry["complete"]) == (str(root), True)
    started = dt.datetime.fromisoformat(entry["started_at"].replace("Z", "+00:00"))
    assert started.tzinfo == dt.UTC  # as every --json says its times (cli/_times.py)
    assert started.timestamp() == pytest.approx(recorded.started_at, abs=0.001)

    agents = "tests.replay_tree:agents"
    same = cli("replay", str(root)[:8], "--store", str(store), "--agents", agents)
    assert same.exit_code == 0, same.output
    assert same.output.startswith("identical: 9 sessions")

    changed = cli(
        "replay", str(root), "--store", str(store), "--agents", "tests.replay_tree:changed_agents"
    )
    assert changed.exit_code == 1
    assert changed.output.startswith("diverged at session 0.")
    assert "a summary of paper" in changed.output

    path = tmp_path / "run.recording"
    exported = cli("replay", str(root), "--store", str(store), "--export", str(path))
    assert exported.exit_code == 0, exported.output
    report = cli("replay", "--file", str(path), "--agents", agents, "--json")
    assert report.exit_code == 0, report.output
    assert json.loads(report.output)["identical"] is True

    path.write_bytes(path.read_bytes()[:-5])
    truncated = cli("replay", "--file", str(path), "--agents", agents)
    assert truncated.exit_code == 1
    assert "truncated" in truncated.output
    never = uuid.uuid4()
    unrecorded = cli("replay", str(never), "--store", str(store), "--agents", agents)
    assert unrecorded.exit_code == 1
    assert f"session {never} was not recorded" in unrecorded.output
    prefix = "1" * 8 if str(root).startswith("0") else "0" * 8  # one the root's id does not have
    no_prefix = cli("replay", prefix, "--store", str(store))
    assert no_prefix.exit_code == 2  # no recording starts with it: a usage error
    assert "no recording starts with" in no_prefix.output


def ask(session: Session) -> str:
    """Streams a reply, or waits on a slow one until it is cancelled."""
    if session.task == "slow":
        try:
            session.complete("a slow question")
        except Cancelled:
            # wrap up in grace: the closed call settles first (a run that
            # ended at once would race its settlement, recorded or not)
            session.sleep(1.0)
            return "gave up waiting"
        return "answered"  # pragma: no cover - the server holds the reply
    reply = session.complete("stream it", stream=True)
    return reply.text or ""


def asker(session: Session) -> Outcome:
    noted = session.memory_put("asked", session.task)  # a fresh memory id every run
    slow = session.spawn(kind=SessionKind.WORKER, skill="ask", task="slow")
    session.sleep(1.0)  # the test lets it go once the slow question is out
    streamed = session.spawn(kind=SessionKind.WORKER, skill="ask", task="stream")
    assert streamed.session_id is not None
    assert slow.session_id is not None
    first = session.wait(streamed.session_id)
    second = session.wait(slow.session_id)
    assert first is not None
    assert second is not None
    return Outcome(summary=f"{first.summary} / {second.summary}", memory_ids=(noted,))


def test_a_call_cut_by_a_cancel_a_streamed_call_and_a_memory_write_replay(
    server: StandinServer,
) -> None:
    clock = VirtualClock()
    node = Node([make_agent(asker=asker, ask=ask)], config(server.url), clock=clock)
    try:
        server.fail_next("slow", delay=30.0)  # the first request waits: the slow one's
        root = record_branch(node, "asker")
        assert server.wait_for_requests(1, WAIT)  # the slow question is out
        settle(node)
        clock.advance(1.0)
        assert server.wait_for_completions(1, WAIT)  # the streamed one answered
        slow = next(
            c["info"].session_id for c in node.tree(root)["children"] if c["info"].task == "slow"
        )
        assert node.cancel(slow) is None  # cut while its call waits
        assert server.wait_for_disconnects(1, WAIT)  # the request closed
        assert _settled(node, slow), "the closed call never settled"
        clock.advance(1.0)
        result, recording, report = ended_and_replayed(node, root)
    finally:
        node.shutdown()
    assert result.summary.endswith("/ gave up waiting"), result
    tapes = {s.path: s for s in recording.sessions}
    slow_tape = tapes["0.0"].tape
    assert [type(e).__name__ for e in slow_tape] == ["TapeModel", "TapeInterrupt"]
    assert isinstance(slow_tape[0], TapeModel)
    assert slow_tape[0].cut  # taped before the cancellation that closed it
    streamed = tapes["0.1"].tape[0]
    assert isinstance(streamed, TapeModel)
    assert len(streamed.pieces) > 1  # the stand-in streams a word a piece
    assert report.identical, report.divergence


def _settled(node: Node, session_id: uuid.UUID) -> bool:
    """Whether the call ``session_id`` closed has been counted (bounded wait:
    nothing tells the test when a closed request's settlement lands)."""
    for _ in range(int(WAIT / 0.01)):
        settle(node)
        if node.tree(session_id)["spending"].usage.calls == 1:
            return True
        threading.Event().wait(0.01)
    return False


def canceller(session: Session) -> str:
    _kept, dropped = session.spawn_many(
        [
            SpawnSpec(kind=SessionKind.WORKER, skill="waiter", task="kept"),
            SpawnSpec(kind=SessionKind.WORKER, skill="waiter", task="dropped"),
        ]
    )
    assert dropped.session_id is not None
    session.sleep(1.0)  # both run by then
    session.cancel_child(dropped.session_id)
    return ", ".join(c.result.summary for c in session.collect() if c.result is not None)


def keeps_both(session: Session) -> str:
    session.spawn_many(
        [
            SpawnSpec(kind=SessionKind.WORKER, skill="waiter", task="kept"),
            SpawnSpec(kind=SessionKind.WORKER, skill="waiter", task="dropped"),
        ]
    )
    return ", ".join(c.result.summary for c in session.collect() if c.result is not None)


def test_a_parent_that_no_longer_cancels_its_child_diverges_at_the_cancel() -> None:
    clock = VirtualClock()
    skills = {"canceller": canceller, "waiter": waiter}
    node = clocked_node(clock, **skills)
    try:
        root = record_branch(node, "canceller")
        settle(node)
        clock.advance(1.0)
        settle(node)
        clock.advance(60.0)  # the kept one sleeps its minute out
        result, recording, same = ended_and_replayed(node, root)
    finally:
        node.shutdown()
    assert result.summary == "wrapped up, slept"
    assert same.identical, same.divergence
    changed = clocked_agent(**{**skills, "canceller": keeps_both})
    found = Node.replay_recording(recording, [changed]).divergence
    assert found is not None
    assert (found.session, found.step) == ("0", "1")  # after its spawn: the cancel
    assert found.recorded == "cancelling child 1"


def patient(session: Session) -> str:
    """Sleeps; a cancellation cuts it short (and it reads the clock as it goes)."""
    try:
        session.sleep(float(session.task))
    except Cancelled:
        session.clock.monotonic()  # taped after a cancel; after a fence (a TTL) not
        if session.cancel_reason is ErrorCode.TTL_EXPIRED:
            raise
        return "cut"
    return "slept"


def leaves_early(session: Session) -> str:
    session.spawn(kind=SessionKind.WORKER, skill="patient", task="60")
    session.sleep(1.0)
    return "left"  # the child is cancelled as its parent ends


def waits_out_of_order(session: Session) -> str:
    specs = [
        SpawnSpec(kind=SessionKind.WORKER, skill="patient", task="1"),
        SpawnSpec(kind=SessionKind.WORKER, skill="patient", task="60", ttl=5.0),
        SpawnSpec(kind=SessionKind.WORKER, skill="patient", task="10"),
    ]
    x, y, z = session.spawn_many(specs)
    got = [session.wait(c.session_id) for c in (y, x, z) if c.session_id is not None]
    return ", ".join(f"{r.status.value} {r.summary}" for r in got if r is not None)


@pytest.mark.parametrize(
    ("skill", "steps", "summary"),
    [
        ("leaves_early", (1.0,), "left"),
        ("waits_out_of_order", (1.0, 4.0, 5.0), "expired , completed slept, completed slept"),
    ],
)
def test_a_parent_ending_and_an_expiry_between_takes_replay_identically(
    skill: str, steps: tuple[float, ...], summary: str
) -> None:
    clock = VirtualClock()
    node = clocked_node(
        clock,
        patient=patient,
        leaves_early=leaves_early,
        waits_out_of_order=waits_out_of_order,
    )
    try:
        root = record_branch(node, skill)
        for step in steps:
            settle(node)
            clock.advance(step)
        result, recording, report = ended_and_replayed(node, root)
    finally:
        node.shutdown()
    assert result.summary == summary
    assert report.identical, report.divergence
    if skill == "leaves_early":
        child = next(s for s in recording.sessions if s.path == "0.0")
        assert child.tape == [TapeInterrupt("parent_terminated", 1), TapeClock("monotonic", 1.0)]
        assert child.result is not None
        assert child.result.summary == "cut"
