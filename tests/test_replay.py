"""Recording and deterministic replay of a subtree (issue 26).

A research tree modelled on the demo's (``tests/replay_tree.py``: random
numbers drawn through the session, clock readings, model calls to the
chat-completions stand-in on 127.0.0.1, a crash, a quorum that cancels a
child in grace) is recorded, then replayed on a virtual clock with the
server stopped: every session's events and result are the same. A skill
changed since makes the replay stop at its first divergence; a recording
survives a ``kill -9`` of its node; bad recordings are typed errors."""

from __future__ import annotations

import pathlib
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from sessiontree.actors import AsyncSession, Cancelled, Session, VirtualClock
from sessiontree.cli._standin import StandinServer
from sessiontree.protocol import (
    Recording,
    RecordingError,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnSpec,
    TapeInterrupt,
    TapeModel,
    TapeSeed,
)
from sessiontree.supervision import Agent, Node, NodeConfig, load_recording
from tests import replay_tree
from tests.conftest import WAIT, settle
from tests.replay_tree import config, make_agent

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def server() -> Iterator[StandinServer]:
    with StandinServer() as standin:
        yield standin


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
        recording = node.recording(result.session_id)
        asked = len(standin.requests)
    try:
        report = node.replay(result.session_id)
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


async def read_differently(session: AsyncSession) -> str:
    roll = session.random.random()
    reply = await session.complete(f"a summary of {session.task} ({roll:.4f})")
    return f"{session.task}: {reply.text}"


def research_clock_first(session: Session) -> object:
    session.clock.monotonic()  # reads the clock before drawing its number
    return replay_tree.research(session)


def test_a_changed_skill_makes_the_replay_report_its_first_divergence(
    server: StandinServer,
) -> None:
    node = Node([make_agent()], config(server.url))
    try:
        result = record(node)
        recording = node.recording(result.session_id)
    finally:
        node.shutdown()
    ids = {s.path: s.session_id for s in recording.sessions}

    asks_otherwise = Node.replay_recording(recording, [make_agent(read=read_differently)])
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
        exported = node.export_recording(result.session_id, path)
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
    skills = {"lead": replay_tree.lead, "keeper": keeper, "waiter": waiter}
    node = Node([Agent("agent", skills, main_skill="lead")], NodeConfig(grace=5.0), clock=clock)
    try:
        spawned = node.spawn(
            node.main("agent").session_id, kind="branch", skill="keeper", task="t", record=True
        )
        assert spawned.session_id is not None
        root = spawned.session_id
        settle(node)
        children = node.tree(root)["children"]
        cancelled = next(c["info"].session_id for c in children if c["info"].task == "cancelled")
        assert node.cancel(cancelled) is None  # an operator's cancel, mid-sleep
        settle(node)
        clock.advance(10.0)  # the other one's TTL of 5 s runs out
        settle(node)
        result = node.ref(root).wait(WAIT)
        assert result is not None
        recording = node.recording(root)
        report = node.replay(root)
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
        root = _run_and_kill(store, standin.url)
    node = Node([make_agent()], config("http://127.0.0.1:9/v1"), store=store)
    try:
        report = node.replay(root)  # the server is gone: the tape answers
    finally:
        node.shutdown()
    assert report.identical, report.divergence
    assert report.sessions == 9


def test_a_run_cut_off_by_a_kill_9_is_an_incomplete_recording(tmp_path: pathlib.Path) -> None:
    store = tmp_path / "store"
    with StandinServer() as standin:
        root = _run_and_kill(store, standin.url, "--cut")
    node = Node([make_agent()], config("http://127.0.0.1:9/v1"), store=store)
    try:
        with pytest.raises(RecordingError) as raised:
            node.replay(root)
    finally:
        node.shutdown()
    assert raised.value.reason == "incomplete"
    assert raised.value.session_id == root


def _run_and_kill(store: pathlib.Path, url: str, *flags: str) -> uuid.UUID:
    command = [sys.executable, "-m", "tests.replay_tree", str(store), url, *flags]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            ready, _, _ = select.select([child.stdout], [], [], 60.0)
            assert ready, "the recorded run never printed its id"
            root = uuid.UUID(child.stdout.readline().strip())  # durable when printed
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(30)
    assert child.returncode == -signal.SIGKILL
    return root


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
                    node.replay(session_id)
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


def test_replaying_without_the_recorded_agent_or_an_incomplete_recording_is_refused() -> None:
    with pytest.raises(RecordingError) as raised:
        Node.replay_recording(_small_recording(), [Agent("someone else", {"s": waiter})])
    assert raised.value.reason == "unknown_agent"
    unfinished = _small_recording()
    unfinished.complete = False
    with pytest.raises(RecordingError) as raised:
        Node.replay_recording(unfinished, [make_agent()])
    assert raised.value.reason == "incomplete"


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
        recording = node.recording(inner)
        report = node.replay(inner)
        with pytest.raises(RecordingError):
            node.recording(result.session_id)  # the outer branch itself was not recorded
    finally:
        node.shutdown()
    assert recording.depth == 2
    assert report.identical, report.divergence
    assert report.sessions == 9
