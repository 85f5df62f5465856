"""Execution backends: the runtime's rules hold wherever a step runs.

Every rule test runs on ``inline``, ``process`` (a real pool of worker
processes) and ``ray`` (a real local Ray cluster, started once for the test
session). Forced termination is checked for real: the step's process is
gone and its file stops growing.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sessiontree.actors import VirtualClock
from sessiontree.actors.backends import BACKENDS, ProcessBackend, RayBackend
from sessiontree.protocol import (
    BackendUnavailableError,
    ErrorCode,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.supervision import Agent, Node, NodeConfig
from tests import _remote_skills as skills
from tests.conftest import WAIT

pytestmark = pytest.mark.timeout(120)

REMOTE = ("process", "ray")


def _main(session: Any) -> None:
    return None


def _closure_with_lock() -> Callable[[Any], str]:
    lock = threading.Lock()

    def holds_lock(session: Any) -> str:
        with lock:
            return "never runs remotely"

    return holds_lock


AGENT = Agent(
    "agent",
    {
        "main": _main,
        "answer": skills.answer,
        "crash": skills.crash,
        "wraps_up": skills.wraps_up,
        "ignores_cancel": skills.ignores_cancel,
        "dies": skills.dies,
        "leaves_traces": skills.leaves_traces,
        "cancelled_while_dirty": skills.cancelled_while_dirty,
        "spawns": skills.spawns,
        "reports": skills.reports,
        "async_answer": skills.async_answer,
        "lambda": lambda session: "a lambda",
        "holds_lock": _closure_with_lock(),
        "unhashable": skills.unhashable,
    },
    main_skill="main",
    max_children=3,
)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "ray":
        request.getfixturevalue("ray_cluster")
    return name


@pytest.fixture
def node_on(make_node: Callable[..., Node], backend: str) -> Callable[..., Node]:
    """A node whose workers run on ``backend``, its pool up before the test."""

    def make(**config: Any) -> Node:
        config.setdefault("process_workers", 2)
        node = make_node(AGENT, backend=backend, **config)
        pool = node.backends.get(backend)
        if isinstance(pool, ProcessBackend | RayBackend):
            assert pool.wait_ready(60.0), f"the {backend} pool did not start"
        return node

    return make


def _spawn(node: Node, parent: Any, skill: str, tmp_path: Path, **fields: Any) -> Any:
    spawned = node.spawn(
        parent, kind=SessionKind.WORKER, skill=skill, metadata={"dir": str(tmp_path)}, **fields
    )
    assert spawned.error is None, spawned.error
    return spawned.ref


def _started(tmp_path: Path, session_id: uuid.UUID) -> int:
    """Wait (bounded) for the step's start marker; its process id."""
    pid = skills.started_pid(tmp_path, session_id, WAIT)
    if pid is None:
        pytest.fail(f"step {session_id} never started")
    return pid


def _gone(pid: int) -> bool:
    """Wait (bounded) until process ``pid`` no longer exists."""
    ticks = threading.Event()
    for _ in range(int(WAIT * 100)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        ticks.wait(0.01)
    return False


def _result(ref: Any) -> SessionResult:
    result = ref.wait(WAIT * 3)
    assert result is not None, "the session never ended"
    return result


# -- the rules, on every backend -------------------------------------------------------------


def test_a_step_result_reaches_its_parent_exactly_once(
    node_on: Callable[..., Node], tmp_path: Path, backend: str
) -> None:
    node = node_on()
    main = node.main("agent")
    ref = _spawn(node, main, "answer", tmp_path, task="sum these")
    result = _result(ref)
    assert result.status is SessionState.COMPLETED
    assert result.artifacts["task"] == "sum these"
    assert result.artifacts["backend"] == backend
    ran_here = result.artifacts["pid"] == os.getpid()
    assert ran_here is (backend == "inline")
    assert node.wait_idle(WAIT)
    delivered = [r for r in node.results(main) if r.session_id == ref.session_id]
    assert len(delivered) == 1


def test_a_raise_in_the_step_is_failed_crashed_with_its_traceback(
    node_on: Callable[..., Node], tmp_path: Path, backend: str
) -> None:
    node = node_on()
    result = _result(_spawn(node, node.main("agent"), "crash", tmp_path, task="t-7"))
    assert result.status is SessionState.FAILED
    assert result.error is not None
    assert result.error.code is ErrorCode.CRASHED
    assert "bad input in t-7" in result.error.message
    assert 'raise ValueError(f"bad input in {session.task}")' in result.error.detail["traceback"]
    assert result.error.detail["type"] == "builtins.ValueError"


def test_a_cancelled_step_wraps_up_in_grace_with_a_partial_result(
    node_on: Callable[..., Node], tmp_path: Path
) -> None:
    node = node_on()
    ref = _spawn(node, node.main("agent"), "wraps_up", tmp_path)
    _started(tmp_path, ref.session_id)
    assert ref.cancel() is None
    result = _result(ref)
    assert result.status is SessionState.CANCELLED
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    assert result.summary == "partial after cancelled"


def test_a_step_cancelled_while_queued_for_a_worker_raises_at_its_first_checkpoint(
    node_on: Callable[..., Node], tmp_path: Path
) -> None:
    node = node_on(process_workers=1, ray_actors=1)
    main = node.main("agent")
    first = _spawn(node, main, "wraps_up", tmp_path)
    _started(tmp_path, first.session_id)
    second = _spawn(node, main, "wraps_up", tmp_path)  # remote: queued behind the first
    assert second.cancel() is None
    assert first.cancel() is None
    assert _result(first).summary == "partial after cancelled"
    assert _result(second).summary == "partial after cancelled"


def test_a_cancel_right_behind_the_spawn_reaches_the_step(
    node_on: Callable[..., Node], tmp_path: Path
) -> None:
    """No wait for the step to start: the cancel may reach the worker before the
    step does (a lost one would leave the step sleeping until the test times out)."""
    node = node_on()
    main = node.main("agent")
    for _ in range(3):
        ref = _spawn(node, main, "wraps_up", tmp_path)
        assert ref.cancel() is None
        assert _result(ref).summary == "partial after cancelled"


def test_ttl_expiry_ends_the_session_and_stops_its_step(
    node_on: Callable[..., Node], tmp_path: Path, clock: VirtualClock, backend: str
) -> None:
    node = node_on()
    ref = _spawn(node, node.main("agent"), "wraps_up", tmp_path, ttl=5.0)
    pid = _started(tmp_path, ref.session_id)
    clock.advance(5.0)
    result = _result(ref)
    assert result.status is SessionState.EXPIRED
    assert result.error is not None
    assert result.error.code is ErrorCode.TTL_EXPIRED
    if backend != "inline":
        assert _gone(pid), f"the {backend} step of an expired session still runs"


def test_limits_hold_for_remote_children(node_on: Callable[..., Node], tmp_path: Path) -> None:
    node = node_on()
    main = node.main("agent")
    running = [_spawn(node, main, "wraps_up", tmp_path) for _ in range(AGENT.max_children)]
    refused = node.spawn(main, kind=SessionKind.WORKER, skill="answer")
    assert refused.error is not None
    assert refused.error.code is ErrorCode.CHILDREN_EXCEEDED
    under_worker = node.spawn(running[0], kind=SessionKind.WORKER, skill="answer")
    assert under_worker.error is not None
    assert under_worker.error.code is ErrorCode.WORKER_CANNOT_SPAWN
    for ref in running:
        ref.cancel()
    assert all(_result(ref).status is SessionState.CANCELLED for ref in running)


def test_a_parent_ending_cancels_its_remote_children(
    node_on: Callable[..., Node], tmp_path: Path
) -> None:
    node = node_on()
    main = node.main("agent")
    branch = node.spawn(
        main, kind=SessionKind.BRANCH, skill="wraps_up", metadata={"dir": str(tmp_path)}
    )
    assert branch.ref is not None
    _started(tmp_path, branch.ref.session_id)
    child = _spawn(node, branch.ref, "wraps_up", tmp_path)
    _started(tmp_path, child.session_id)
    branch.ref.cancel()
    result = _result(child)
    assert result.status is SessionState.CANCELLED
    assert result.error is not None
    assert result.error.code is ErrorCode.PARENT_TERMINATED  # one request, the whole subtree
    assert result.summary == "partial after parent_terminated"


# -- forced termination really stops work -------------------------------------------------------


@pytest.mark.parametrize("backend", REMOTE, indirect=True)
def test_forced_termination_kills_a_step_that_ignores_cancellation(
    node_on: Callable[..., Node], tmp_path: Path, clock: VirtualClock, backend: str
) -> None:
    node = node_on(grace=30.0)
    log = tmp_path / "appended.txt"
    ref = _spawn(node, node.main("agent"), "ignores_cancel", tmp_path, task=str(log))
    pid = _started(tmp_path, ref.session_id)
    assert ref.cancel() is None
    clock.advance(29.0)
    assert ref.wait(0.2) is None  # still in its grace, still appending
    clock.advance(1.0)
    result = _result(ref)
    assert result.status is SessionState.CANCELLED
    assert result.error is not None
    assert result.error.code is ErrorCode.TERMINATED_BY_FORCE
    assert _gone(pid), f"the {backend} step still runs after its grace"
    size = log.stat().st_size
    threading.Event().wait(0.3)  # a window in which a live step would append
    assert log.stat().st_size == size
    assert node.stats()["zombies"] == 0  # killed, not abandoned


def test_forced_termination_inline_abandons_and_counts_the_thread(
    make_node: Callable[..., Node], tmp_path: Path, clock: VirtualClock
) -> None:
    """Inline, Python cannot kill a thread: the step is fenced and counted a zombie."""
    stop = threading.Event()

    def spins(session: Any) -> None:
        skills.started(session)
        stop.wait(WAIT * 3)

    node = make_node(Agent("agent", {"main": _main, "spins": spins}, main_skill="main"))
    ref = _spawn(node, node.main("agent"), "spins", tmp_path)
    _started(tmp_path, ref.session_id)
    ref.cancel()
    clock.advance(30.0)
    result = _result(ref)
    assert result.error is not None
    assert result.error.code is ErrorCode.TERMINATED_BY_FORCE
    assert node.stats()["zombies"] == 1
    stop.set()


@pytest.mark.parametrize("backend", REMOTE, indirect=True)
def test_a_worker_that_dies_under_its_step_is_a_crash_and_is_replaced(
    node_on: Callable[..., Node], tmp_path: Path, backend: str
) -> None:
    node = node_on()
    main = node.main("agent")
    result = _result(_spawn(node, main, "dies", tmp_path))
    assert result.status is SessionState.FAILED
    assert result.error is not None
    assert result.error.code is ErrorCode.CRASHED
    assert "died" in result.error.message
    assert result.error.detail["backend"] == backend
    again = _result(_spawn(node, main, "answer", tmp_path))  # the pool replaced it
    assert again.status is SessionState.COMPLETED


# -- serialisation, fresh sessions, leaves -----------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "skill"), [("process", "lambda"), ("ray", "holds_lock")], indirect=["backend"]
)
def test_a_skill_that_cannot_be_serialised_is_refused_at_spawn(
    node_on: Callable[..., Node], backend: str, skill: str
) -> None:
    node = node_on()
    spawned = node.spawn(node.main("agent"), kind=SessionKind.WORKER, skill=skill)
    assert spawned.ref is None
    assert spawned.error is not None
    assert spawned.error.code is ErrorCode.NOT_SERIALISABLE
    assert skill in spawned.error.message
    assert backend in spawned.error.message
    assert spawned.error.detail["field"] == "skill"
    assert node.stats()["live_sessions"] == 1  # only the Main: nothing was created


@pytest.mark.parametrize("backend", REMOTE, indirect=True)
def test_a_skill_need_not_be_hashable(node_on: Callable[..., Node], tmp_path: Path) -> None:
    node = node_on()
    result = _result(_spawn(node, node.main("agent"), "unhashable", tmp_path))
    assert result.summary == "unhashable ran"


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_process_pool_that_cannot_replace_a_dead_worker_fails_its_steps(
    node_on: Callable[..., Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No process can start any more (EMFILE…): the step whose worker died is a
    crash, and the backend is unavailable instead of leaving steps waiting."""
    node = node_on(process_workers=1)
    pool = node.backends.get("process")
    assert isinstance(pool, ProcessBackend)

    def cannot_start() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(pool, "_spawn_locked", cannot_start)
    main = node.main("agent")
    died = _result(_spawn(node, main, "dies", tmp_path))
    assert died.error is not None
    assert died.error.code is ErrorCode.CRASHED
    refused = node.spawn(main, kind=SessionKind.WORKER, skill="answer")
    assert refused.error is not None
    assert refused.error.code is ErrorCode.BACKEND_UNAVAILABLE
    assert "Too many open files" in refused.error.message


@pytest.mark.parametrize("backend", REMOTE, indirect=True)
def test_a_second_session_on_the_same_worker_sees_nothing_of_the_first(
    node_on: Callable[..., Node], tmp_path: Path, backend: str
) -> None:
    node = node_on(process_workers=1, ray_actors=1)
    main = node.main("agent")
    first = _spawn(node, main, "cancelled_while_dirty", tmp_path)
    first_pid = _started(tmp_path, first.session_id)
    first.cancel()
    assert _result(first).summary == "cancelled"
    dirty = _result(_spawn(node, main, "leaves_traces", tmp_path, task="one"))
    clean = _result(_spawn(node, main, "leaves_traces", tmp_path, task="two"))
    assert dirty.artifacts["pid"] == clean.artifacts["pid"] == first_pid  # one pooled worker
    for seen in (dirty.artifacts, clean.artifacts):
        assert seen["cancel_pending"] is False
        assert seen["messages"] == 0
        assert seen["system_prompt"] == ""
    assert clean.artifacts["task"] == "two"


@pytest.mark.parametrize("backend", REMOTE, indirect=True)
def test_a_remote_step_is_a_leaf(
    node_on: Callable[..., Node], tmp_path: Path, backend: str
) -> None:
    node = node_on()
    result = _result(_spawn(node, node.main("agent"), "spawns", tmp_path))
    assert result.error is not None
    assert result.error.code is ErrorCode.CRASHED
    assert f"runs on the {backend} backend" in result.error.message
    assert "'spawn' is not available" in result.error.message


@pytest.mark.parametrize("backend", REMOTE, indirect=True)
def test_a_remote_branch_cannot_be_suspended(
    node_on: Callable[..., Node], tmp_path: Path, backend: str
) -> None:
    node = node_on()
    spawned = node.spawn(
        node.main("agent"),
        kind=SessionKind.BRANCH,
        skill="wraps_up",
        backend=backend,
        metadata={"dir": str(tmp_path)},
    )
    assert spawned.ref is not None
    _started(tmp_path, spawned.ref.session_id)
    error = spawned.ref.suspend()
    assert error is not None
    assert error.code is ErrorCode.INVALID_TRANSITION
    assert f"runs on the {backend} backend" in error.message
    spawned.ref.cancel()
    assert _result(spawned.ref).status is SessionState.CANCELLED


@pytest.mark.parametrize("backend", REMOTE, indirect=True)
def test_progress_and_messages_of_a_remote_step_reach_the_node(
    node_on: Callable[..., Node], tmp_path: Path, backend: str
) -> None:
    node = node_on()
    notes: list[tuple[str, Any]] = []
    node.subscribe(
        lambda e: (
            notes.append((e.kind.value, e.data))
            if e.kind.value in {"progress", "child_update"}
            else None
        )
    )
    main = node.main("agent")
    ref = _spawn(node, main, "reports", tmp_path)
    assert _result(ref).summary == "reported"
    assert node.wait_idle(WAIT)
    kinds = [kind for kind, _ in notes]
    assert "progress" in kinds
    assert "child_update" in kinds


@pytest.mark.parametrize("backend", REMOTE, indirect=True)
def test_an_async_skill_runs_remotely_too(node_on: Callable[..., Node], tmp_path: Path) -> None:
    node = node_on()
    result = _result(_spawn(node, node.main("agent"), "async_answer", tmp_path, task="x"))
    assert result.status is SessionState.COMPLETED
    assert result.summary.startswith("async x in ")
    assert result.summary != f"async x in {os.getpid()}"


def test_a_branch_runs_inline_unless_its_spawn_names_a_backend(
    node_on: Callable[..., Node], tmp_path: Path, backend: str
) -> None:
    node = node_on()
    main = node.main("agent")
    branch = node.spawn(
        main, kind=SessionKind.BRANCH, skill="answer", metadata={"dir": str(tmp_path)}
    )
    assert branch.ref is not None
    assert _result(branch.ref).artifacts["pid"] == os.getpid()
    assert node.get(branch.ref).backend == "inline"
    worker = _spawn(node, main, "answer", tmp_path)
    assert node.get(worker).backend == backend


# -- bad input and a missing backend ------------------------------------------------------------


def test_an_unknown_backend_is_refused_naming_the_field(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(AGENT)
    spawned = node.spawn(
        node.main("agent"), kind=SessionKind.WORKER, skill="answer", backend="gpu-farm"
    )
    assert spawned.error is not None
    assert spawned.error.code is ErrorCode.UNKNOWN_BACKEND
    assert spawned.error.detail["field"] == "backend"
    assert "gpu-farm" in spawned.error.message
    with pytest.raises(ValueError, match=r"NodeConfig\.backend"):
        NodeConfig(backend="gpu-farm")
    with pytest.raises(ValueError, match=r"NodeConfig\.process_workers"):
        NodeConfig(process_workers=0)


def test_without_ray_installed_the_ray_backend_names_the_extra(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an import of a missing package sees
    node = make_node(AGENT)
    spawned = node.spawn(node.main("agent"), kind=SessionKind.WORKER, skill="answer", backend="ray")
    assert spawned.error is not None
    assert spawned.error.code is ErrorCode.BACKEND_UNAVAILABLE
    assert "sessiontree[ray]" in spawned.error.message
    with pytest.raises(BackendUnavailableError, match=r"sessiontree\[ray\]"):
        make_node(AGENT, backend="ray")


def test_a_process_pool_whose_workers_cannot_start_fails_its_steps_instead_of_looping(
    tmp_path: Path,
) -> None:
    """A worker that exits while starting (a script without the ``__main__`` guard,
    a broken environment) is retried a few times, then the backend is unavailable."""
    pool = ProcessBackend(workers=1)
    pool._context = _BrokenContext(pool._context)  # type: ignore[assignment]
    pool.start()
    try:
        assert not pool.wait_ready(WAIT)
        assert pool.started == 3
        with pytest.raises(BackendUnavailableError, match="__main__"):
            pool.submit(None, None, print)  # type: ignore[arg-type]
    finally:
        pool.close()


class _BrokenContext:
    """A multiprocessing context whose processes exit at once with code 1."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def Pipe(self, duplex: bool = True) -> Any:
        return self._real.Pipe(duplex)

    def Process(self, **kwargs: Any) -> Any:
        return self._real.Process(target=sys.exit, args=(1,), daemon=True)


def test_a_node_whose_ray_cluster_disappears_fails_those_steps_and_serves_the_rest(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """In a child process: the node's own local cluster is SIGKILLed under a step
    (see ``tests/ray_gone_node.py``)."""
    command = [sys.executable, "-m", "tests.ray_gone_node", str(tmp_path)]
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        command, cwd=root, capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["killed"] > 0
    assert report["status"] == "failed"
    assert report["code"] == "backend_unavailable"
    assert report["inline_after"] == "completed"  # the node serves the rest
    assert report["refused"] == "backend_unavailable"  # no new step goes to a dead cluster
    assert report["disconnected"] is True


class _FakeRay:
    """Just enough of ``ray`` for the pool's bookkeeping of its actors: each actor
    comes up when its ``up`` future is resolved (Ray resolves those on a
    callback thread of its own), and kills are recorded with their thread."""

    def __init__(self) -> None:
        self.ups: list[concurrent.futures.Future[bool]] = []
        self.kills: list[str] = []
        self.killed = threading.Event()

    def kill(self, actor: Any, no_restart: bool = True) -> None:
        self.kills.append(threading.current_thread().name)
        self.killed.set()

    def remote(self) -> _FakeRay:  # the actor class: ``.remote()`` makes an actor
        return self

    @property
    def ready(self) -> _FakeRay:  # ``actor.ready.remote().future()``: its up future
        return self

    def future(self) -> concurrent.futures.Future[bool]:
        self.ups.append(concurrent.futures.Future())
        return self.ups[-1]


def _fake_pool() -> tuple[RayBackend, _FakeRay]:
    ray = _FakeRay()
    pool = RayBackend(actors=2)
    pool._ray = ray
    pool._actor_class = ray
    pool._add_actor()
    pool._add_actor()
    return pool, ray


def _come_up_on_a_callback_thread(ray: _FakeRay) -> None:
    late = threading.Thread(
        target=lambda: [up.set_result(True) for up in ray.ups], name="ray-callbacks"
    )
    late.start()
    late.join(WAIT)


def test_a_ray_actor_that_comes_up_after_close_is_never_killed_on_rays_callback_thread() -> None:
    # A blocking ray.kill on that thread waits on the thread itself, and close()'s
    # own kill then waited forever (a README example hung at its shutdown).
    pool, ray = _fake_pool()
    pool.close()
    assert ray.kills == ["MainThread", "MainThread"]  # close() kills both, starting or not
    _come_up_on_a_callback_thread(ray)
    assert ray.kills == ["MainThread", "MainThread"]


def test_a_ray_actor_that_comes_up_after_the_pool_failed_is_killed_off_the_callback_thread() -> (
    None
):
    pool, ray = _fake_pool()  # the application's cluster: it lives on after the pool fails
    try:
        pool._fail("one actor could not start")
        _come_up_on_a_callback_thread(ray)
        assert ray.killed.wait(WAIT)
        assert ray.kills
        assert "ray-callbacks" not in ray.kills
    finally:
        pool.close()
