"""Runs that end in one pass of the event loop reach the Cortex as one batch
(``RunsEnded``); a batch must end its sessions exactly as one ``RunEnded``
each would: the same states, results, stored records and events."""

from __future__ import annotations

import pathlib
import threading
import uuid
from typing import Any

import msgspec
import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.actors.runtime import RunEnd, SessionCore
from sessiontree.protocol import SessionKind, SpawnSpec
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig
from sessiontree.supervision._host import NodeHost
from sessiontree.supervision._reports import RunEnded
from tests.conftest import WAIT, settle

FANOUT = 3
TERMINAL = {"completed", "failed", "expired", "cancelled"}


async def resident(session: Any) -> None:
    """Waits at a checkpoint until cancelled."""
    await session.sleep(3600.0)


async def partial(session: Any) -> str:
    """Wraps up in grace with a partial result."""
    try:
        await session.sleep(3600.0)
    except Cancelled:
        return "partial"
    return "never"


async def branch(session: Any) -> None:
    """Spawns its workers in one batch, then waits for them."""
    specs = [SpawnSpec(kind=SessionKind.WORKER, skill="resident")] * (FANOUT - 1)
    specs.append(SpawnSpec(kind=SessionKind.WORKER, skill="partial"))
    await session.spawn_many(specs)
    await session.collect(timeout=3600.0)


def main_cycle(session: Any) -> None:
    """A Main's message cycle: nothing to do."""


def _cascade(store: pathlib.Path, clock: VirtualClock) -> dict[str, Any]:
    """Build a Main with two Branches of workers, all in flight; cancel the Main;
    what every session ended with, named by its place in the tree."""
    skills = {"main": main_cycle, "branch": branch, "resident": resident, "partial": partial}
    agent = Agent("a", skills, main_skill="main")
    node = Node([agent], NodeConfig(), clock=clock, store=store)
    try:
        events: list[Event] = []
        ended = threading.Event()
        total = 1 + 2 + 2 * FANOUT

        def watch(event: Event) -> None:
            events.append(event)
            terminal = [e for e in events if e.kind is EventKind.TRANSITION and e.state in TERMINAL]
            if len(terminal) == total:
                ended.set()

        node.subscribe(watch)
        main = node.main("a")
        node.spawn_many(main, [SpawnSpec(kind=SessionKind.BRANCH, skill="branch")] * 2)
        while node.stats()["live_sessions"] < total:
            settle(node)
        settle(node)
        assert main.cancel() is None
        assert ended.wait(WAIT), "the cascade did not end every session"
        settle(node)

        # a session's name: its parent's and its place among the parent's spawns
        names: dict[uuid.UUID, str] = {main.session_id: "m"}
        spawned: dict[uuid.UUID, int] = {}
        for event in events:
            if event.kind is EventKind.SPAWNED and event.parent_id in names:
                assert event.session_id is not None
                place = spawned[event.parent_id] = spawned.get(event.parent_id, -1) + 1
                names[event.session_id] = f"{names[event.parent_id]}/{place}"
        assert len(names) == total

        def named(value: Any) -> Any:
            value = msgspec.to_builtins(value)
            if isinstance(value, dict):
                return {k: named(v) for k, v in value.items()}
            if isinstance(value, list):
                return [named(v) for v in value]
            if isinstance(value, str):
                for sid, name in names.items():
                    value = value.replace(str(sid), name)
            return value

        seen: dict[str, list[Any]] = {name: [] for name in names.values()}
        for event in events:
            if event.session_id in names and event.kind is not EventKind.SPAWNED:
                seen[names[event.session_id]].append(named(event))
        assert node.store is not None
        node.store.flush(WAIT)  # every terminal write durable before it is read back
        stats = node.stats()
        del stats["store_commits"]  # how many commits the writes shared: timing, not outcome
        return {
            "events": seen,
            "results": {name: named(node.result(sid)) for sid, name in names.items()},
            "received": {name: _by_id(named(node.results(sid))) for sid, name in names.items()},
            "records": {name: named(node.store.session(sid)) for sid, name in names.items()},
            "filed": {name: _by_id(named(node.store.received(sid))) for sid, name in names.items()},
            "outbox": named(list(node.store.outbox())),
            "stats": stats,
        }
    finally:
        node.shutdown(grace=0, timeout=WAIT)


def _by_id(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results in the order of their sessions' names (the store keeps them by id)."""
    return sorted(results, key=lambda r: str(r["session_id"]))


def test_a_batch_of_ended_runs_ends_them_as_one_by_one_does(
    tmp_path: pathlib.Path, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    tell = Node._tell

    def counting(self: Node, message: object) -> None:
        ends = getattr(message, "ends", None)
        if ends is not None:
            batches.append(len(ends))
        tell(self, message)

    monkeypatch.setattr(Node, "_tell", counting)
    batched = _cascade(tmp_path / "batched", clock)
    assert max(batches) > 1  # the workers' runs did end in batches

    def one_by_one(self: NodeHost, core: SessionCore, end: RunEnd) -> None:
        self.node._tell(RunEnded(core.session_id, end))

    monkeypatch.setattr(NodeHost, "run_ended", one_by_one)
    batches.clear()
    single = _cascade(tmp_path / "single", clock)
    assert not batches

    for key in batched:
        assert batched[key] == single[key], key
    partial_result = batched["results"]["m/0/2"]
    assert partial_result["summary"] == "partial"
    assert partial_result["error"]["code"] == "parent_terminated"


def test_an_ending_names_its_session_and_the_parent_it_delivered_to(make_node: Any) -> None:
    skills = {"main": main_cycle, "branch": branch, "resident": resident, "partial": partial}
    node = make_node(Agent("a", skills, main_skill="main"))
    delivered: dict[uuid.UUID, Any] = {}
    node.subscribe(
        lambda e: (
            delivered.__setitem__(e.session_id, e.data["to"])
            if e.kind is EventKind.RESULT_DELIVERED
            else None
        )
    )
    main = node.main("a")
    (spawned,) = node.spawn_many(main, [SpawnSpec(kind=SessionKind.BRANCH, skill="branch")])
    settle(node)
    assert main.cancel() is None
    settle(node)
    branch_id = spawned.session_id
    assert branch_id is not None
    result = node.result(branch_id)
    assert result is not None
    assert result.error is not None
    assert result.error.message == f"session {branch_id} was cancelled because its parent ended"
    assert delivered[branch_id] == str(main.session_id)
    worker = node.results(branch_id)[0]
    assert delivered[worker.session_id] == str(branch_id)
