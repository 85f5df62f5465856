"""The Cortex's waits for the store (``Commits``): the rest of an operation runs
on the node's loop once its write is durable, counts as the node's activity
until it ends, answers its caller, fails the node loudly if it raises, and
ends cleanly when the Cortex stops meanwhile."""

from __future__ import annotations

import collections
import concurrent.futures
import pathlib
from collections.abc import Callable, Coroutine, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from sessiontree.actors import VirtualClock
from sessiontree.actors.runtime import Activity, EventLoopThread, Reply, in_actor_handler
from sessiontree.protocol import (
    NodeClosedError,
    SessionKind,
    SessionState,
    SpawnSpec,
    StoreError,
)
from sessiontree.store import Store
from sessiontree.supervision import Agent, Node, NodeConfig
from sessiontree.supervision._commits import Commits, Refused, Written
from sessiontree.supervision._persist import Persister
from sessiontree.supervision._starting import Starting
from tests.conftest import WAIT, settle


class Kernel:
    """A ``Commits`` on a loop of its own, driven as the Cortex drives it: every
    call made on the loop's thread (``turn``)."""

    def __init__(self, store: Store | None = None) -> None:
        self.loop = EventLoopThread(name="test-commits-loop")
        self.activity = Activity()
        self.persist = Persister(store, collections.Counter())
        runtime = SimpleNamespace(
            persist=self.persist, loop=lambda: self.loop, activity=self.activity
        )
        self.commits = Commits(runtime)  # type: ignore[arg-type]
        self.raised: list[tuple[BaseException, Reply | None]] = []
        self.commits.raised = lambda exc, reply: self.raised.append((exc, reply))

    def turn(self, work: Callable[[], Any]) -> Any:
        """Run ``work()`` on the loop's thread, as a Cortex turn, and return its value."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(work())
            except BaseException as exc:
                done.set_exception(exc)

        self.loop.loop.call_soon_threadsafe(run)
        return done.result(WAIT)

    def after(
        self,
        write: concurrent.futures.Future[None],
        rest: Callable[[Written], Coroutine[Any, Any, Any]],
    ) -> Reply:
        """In one turn: what to await for ``write``, and the rest that awaits it."""
        reply = Reply()

        def start() -> None:
            self.commits.after(rest(self.commits.durable(write)), reply)

        self.turn(start)
        return reply

    def close(self) -> None:
        self.loop.close()


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    made = Kernel()
    yield made
    made.close()


def test_the_rest_runs_on_the_loop_once_the_write_is_durable_and_answers(kernel: Kernel) -> None:
    write: concurrent.futures.Future[None] = concurrent.futures.Future()
    seen: list[Any] = []

    async def rest(written: Written) -> str:
        error = await written
        seen.append((error, kernel.loop.is_current(), in_actor_handler()))
        return "started"

    reply = kernel.after(write, rest)
    assert kernel.activity.busy == 1  # waiting for the write is the node's work
    assert not reply.done
    assert not seen
    write.set_result(None)  # as the writer's thread does
    assert reply.get(WAIT) == "started"
    assert kernel.activity.wait_idle(WAIT)
    assert seen == [(None, True, True)]
    assert kernel.raised == []


def test_a_refused_write_reaches_the_rest_and_answers_only_its_caller(kernel: Kernel) -> None:
    write: concurrent.futures.Future[None] = concurrent.futures.Future()
    refusal = StoreError("the map is full")

    async def rest(written: Written) -> str:
        error = await written
        if error is not None:
            raise Refused(error)
        return "never"

    reply = kernel.after(write, rest)
    write.set_exception(refusal)
    with pytest.raises(StoreError, match="the map is full"):
        reply.get(WAIT)
    assert kernel.activity.wait_idle(WAIT)
    assert kernel.raised == []  # a refusal is an answer, the node goes on


def test_any_other_raise_in_the_rest_goes_to_the_cortexs_failure(kernel: Kernel) -> None:
    write: concurrent.futures.Future[None] = concurrent.futures.Future()
    broken = RuntimeError("index corrupted")

    async def rest(written: Written) -> None:
        await written
        raise broken

    reply = kernel.after(write, rest)
    write.set_result(None)
    assert kernel.activity.wait_idle(WAIT)
    assert kernel.raised == [(broken, reply)]


def test_the_rest_waiting_when_the_cortex_stops_ends_there(kernel: Kernel) -> None:
    write: concurrent.futures.Future[None] = concurrent.futures.Future()
    ran: list[str] = []

    async def rest(written: Written) -> None:
        await written
        ran.append("decided from a stopped index")

    reply = kernel.after(write, rest)
    kernel.turn(kernel.commits.stop)
    write.set_result(None)
    with pytest.raises(NodeClosedError, match="stopped"):
        reply.get(WAIT)
    assert kernel.activity.wait_idle(WAIT)
    assert ran == []
    assert kernel.raised == []
    # once stopped, a new rest is never started, and its caller hears why
    late = kernel.after(concurrent.futures.Future(), rest)
    with pytest.raises(NodeClosedError):
        late.get(WAIT)
    assert kernel.activity.busy == 0


def test_the_writes_of_one_commit_share_one_wait(tmp_path: pathlib.Path) -> None:
    store = Store(tmp_path / "store")
    kernel = Kernel(store)
    try:

        def batch() -> tuple[Written, Written, Written]:
            with kernel.commits.one_commit():
                shared = kernel.persist.shared
                assert shared is not None
                first = kernel.commits.durable(shared)
                second = kernel.commits.durable(shared, urgent=False)
            alone: concurrent.futures.Future[None] = concurrent.futures.Future()
            return first, second, kernel.commits.durable(alone)

        first, second, alone = kernel.turn(batch)
        assert first is second
        assert alone is not first
    finally:
        kernel.close()
        store.close()


# -- on a node --------------------------------------------------------------------------


def _main(session: Any) -> None:
    return None


def _quick(session: Any) -> str:
    return "done"


def test_a_raise_after_a_spawns_record_is_written_fails_the_node_loudly(
    tmp_path: pathlib.Path, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(
        [Agent("agent", {"main": _main, "quick": _quick})],
        NodeConfig(),
        clock=clock,
        store=tmp_path / "store",
    )
    try:
        main = node.main("agent")
        settle(node)

        def broken(self: Starting, entry: Any) -> None:
            raise RuntimeError("index corrupted")

        monkeypatch.setattr(Starting, "want_slot", broken)
        # from outside: the child starts in the rest of the spawn, once its record is durable
        with pytest.raises(NodeClosedError, match="index corrupted"):
            main.spawn(kind="branch", skill="quick")
        assert isinstance(node.failure, RuntimeError)
        with pytest.raises(NodeClosedError, match="index corrupted"):
            node.main("agent")
    finally:
        node.shutdown(grace=0.0)


def test_an_outside_batch_starts_its_children_once_recorded(
    tmp_path: pathlib.Path, clock: VirtualClock
) -> None:
    """The straight walk end to end: admitted, recorded in one commit, then
    started and answered; each child's record is in the store."""
    node = Node(
        [Agent("agent", {"main": _main, "quick": _quick})],
        NodeConfig(),
        clock=clock,
        store=tmp_path / "store",
    )
    try:
        main = node.main("agent")
        specs = [SpawnSpec(kind=SessionKind.BRANCH, skill="quick", task=f"t{i}") for i in range(3)]
        answers = node.spawn_many(main, specs)
        assert all(answer.ok for answer in answers), answers
        store = node.store
        assert store is not None
        for answer in answers:
            assert answer.ref is not None
            assert store.session(answer.ref.session_id) is not None  # durable before the answer
            result = answer.ref.wait(WAIT)
            assert result is not None
            assert result.status is SessionState.COMPLETED
        settle(node)
        assert node.failure is None
        assert node.stats()["store_write_errors"] == 0
    finally:
        node.shutdown(grace=0.0)
