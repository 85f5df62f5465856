"""Scheduled export and retention of a node's store (virtual clock)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from sessiontree.actors import VirtualClock
from sessiontree.protocol import NodeClosedError, SessionKind, SessionState
from sessiontree.store import Store
from sessiontree.supervision import Agent, Node, NodeConfig

WAIT = 10.0


def _noop(session: object) -> str:
    return "done"


AGENT = Agent("keeper", {"work": _noop})


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_export_is_rewritten_on_its_schedule(tmp_path: Path) -> None:
    clock = VirtualClock()
    out = tmp_path / "export.jsonl"
    config = NodeConfig(export_path=str(out), housekeeping_interval=60.0)
    with Node([AGENT], config, clock=clock, store=tmp_path / "store") as node:
        main = node.main("keeper")
        assert node.run(main, kind=SessionKind.WORKER) is not None
        assert not out.exists()
        written = threading.Event()
        real_run = node._parts.housekeeper.run  # type: ignore[union-attr]

        def watched() -> dict[str, object]:
            try:
                return real_run()
            finally:
                written.set()

        node._parts.housekeeper.run = watched  # type: ignore[union-attr,method-assign]
        clock.advance(60.0)
        assert written.wait(WAIT)
        sessions = [line for line in _lines(out) if line["type"] == "session"]
        assert len(sessions) == 2


def test_retention_prunes_old_terminal_sessions_after_exporting_them(tmp_path: Path) -> None:
    clock = VirtualClock()
    out = tmp_path / "export.jsonl"
    config = NodeConfig(export_path=str(out), prune_after=3600.0)
    with Node([AGENT], config, clock=clock, store=tmp_path / "store") as node:
        main = node.main("keeper")
        old = node.run(main, kind=SessionKind.WORKER)
        assert old is not None
        assert old.status is SessionState.COMPLETED
        assert node.housekeep()["pruned"] == 0  # not old enough yet
        clock.jump_wall(7200.0)
        young = node.run(main, kind=SessionKind.WORKER)
        assert young is not None
        done = node.housekeep()
        assert done["pruned"] == 1
        exported = {
            line["record"]["info"]["session_id"]  # type: ignore[index]
            for line in _lines(out)
            if line["type"] == "session"
        }
        assert str(old.session_id) in exported  # exported before it was pruned
        store = node.store
        assert store is not None
        assert store.session(old.session_id) is None
        assert store.session(young.session_id) is not None
        assert store.session(main.session_id) is not None  # live sessions are never pruned


def test_housekeeping_is_off_by_default_and_needs_a_store(tmp_path: Path) -> None:
    with Node([AGENT], store=tmp_path / "store") as node:
        assert node.housekeep() == {}
    with Node([AGENT]) as node, pytest.raises(NodeClosedError, match="no store"):
        node.housekeep()


@pytest.mark.parametrize(
    ("field", "value"),
    [("prune_after", 0.0), ("prune_after", float("nan")), ("housekeeping_interval", 0.0)],
)
def test_bad_housekeeping_settings_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        NodeConfig(**{field: value})  # type: ignore[arg-type]


def test_a_store_opened_elsewhere_is_left_open_by_the_node(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    try:
        with Node([AGENT], store=store) as node:
            node.main("keeper")
        assert store.count("sessions") == 1  # still usable: the node did not close it
    finally:
        store.close()
