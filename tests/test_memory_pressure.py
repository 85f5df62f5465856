"""Memory pressure on a fake probe and the virtual clock: branches suspend past
the high mark (one per check), resume below the low mark (one per check, the
oldest-created first), nothing changes between the marks; a caller's
suspension is never undone by it; a bad probe is logged once; the metrics."""

from __future__ import annotations

import logging
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiontree.actors import VirtualClock
from sessiontree.cli import main as cli_main
from sessiontree.protocol import SessionState
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig, NodeMetrics
from sessiontree.supervision._pressure import Step, step
from tests._promtool import promtool
from tests._running_node import RunningNode
from tests.conftest import WAIT, settle

ACTIVE, SUSPENDED = SessionState.ACTIVE, SessionState.SUSPENDED


class FakeProbe:
    """A memory probe whose reading the test sets (``used``), or that raises
    while ``error`` is set."""

    def __init__(self) -> None:
        self.used: object = 0.5
        self.error: Exception | None = None

    def __call__(self) -> object:
        if self.error is not None:
            raise self.error
        return self.used


def idle_main(session: Any) -> None:
    return None


def waits(session: Any) -> str:
    session.sleep(10_000)
    return "done"


AGENT = Agent("agent", {"main": idle_main, "waits": waits}, main_skill="main")


@pytest.fixture
def probe() -> FakeProbe:
    return FakeProbe()


@pytest.fixture
def events() -> list[Event]:
    return []


@pytest.fixture
def node(make_node: Any, probe: FakeProbe, events: list[Event]) -> Node:
    made: Node = make_node(AGENT, check_interval=1.0, memory_pressure=probe)
    made.subscribe(events.append)
    return made


def branches(node: Node, clock: VirtualClock, count: int) -> list[uuid.UUID]:
    """``count`` sleeping branches, created (and checkpointed) 0.1 s apart."""
    main = node.main("agent")
    made = []
    for _ in range(count):
        ref = main.spawn(kind="branch", skill="waits").ref
        assert ref is not None
        made.append(ref.session_id)
        settle(node)
        clock.advance(0.1)
    settle(node)
    return made


def check(node: Node, clock: VirtualClock, times: int = 1) -> None:
    """Let ``times`` periodic checks run (one a virtual second) and settle."""
    for _ in range(times):
        clock.advance(1.0)
        settle(node)


def states(node: Node, ids: list[uuid.UUID]) -> list[SessionState]:
    return [node.get(sid).state for sid in ids]


def of(events: list[Event], kind: EventKind) -> list[uuid.UUID | None]:
    return [e.session_id for e in events if e.kind is kind]


# -- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        (0.95, Step.SUSPEND),
        (0.90, Step.SUSPEND),
        (0.89, Step.HOLD),
        (0.80, Step.HOLD),
        (0.79, Step.RESUME),
        (None, Step.HOLD),
    ],
)
def test_a_reading_suspends_at_the_high_mark_resumes_below_the_low_and_holds_between(
    used: float | None, expected: Step
) -> None:
    assert step(used, high=0.90, low=0.80) is expected


# -- on a node -----------------------------------------------------------------------------


def test_branches_suspend_past_the_high_mark_one_per_check_least_recently_active_first(
    node: Node, clock: VirtualClock, probe: FakeProbe, events: list[Event]
) -> None:
    a, b, c = ids = branches(node, clock, 3)
    check(node, clock)
    assert states(node, ids) == [ACTIVE] * 3
    probe.used = 0.95
    check(node, clock)
    assert states(node, ids) == [SUSPENDED, ACTIVE, ACTIVE]
    check(node, clock, 3)  # the third check finds no branch left to suspend
    assert states(node, ids) == [SUSPENDED] * 3
    assert of(events, EventKind.MEMORY_PRESSURE) == [a, b, c]
    first = next(e for e in events if e.kind is EventKind.MEMORY_PRESSURE)
    assert first.data == {"used": 0.95, "high": 0.90}
    requested = [e for e in events if e.kind is EventKind.SUSPEND_REQUESTED]
    assert [e.data for e in requested] == [{"reason": "memory_pressure"}] * 3
    stats = node.stats()
    assert (stats["pressure_suspensions"], stats["pressure_suspended"]) == (3, 3)


def test_pressure_suspended_branches_resume_below_the_low_mark_oldest_created_first(
    node: Node, clock: VirtualClock, probe: FakeProbe, events: list[Event]
) -> None:
    a, b, c = ids = branches(node, clock, 3)
    # a resume counts as activity: the oldest branch becomes the most recently active
    assert node.suspend(a) is None
    settle(node)
    assert node.resume(a) is None
    settle(node)
    probe.used = 0.93
    check(node, clock, 3)
    assert of(events, EventKind.MEMORY_PRESSURE) == [b, c, a]
    assert states(node, ids) == [SUSPENDED] * 3
    probe.used = 0.5
    check(node, clock)
    assert states(node, ids) == [ACTIVE, SUSPENDED, SUSPENDED]
    check(node, clock)
    assert states(node, ids) == [ACTIVE, ACTIVE, SUSPENDED]
    check(node, clock)
    assert states(node, ids) == [ACTIVE] * 3
    relieved = [e for e in events if e.kind is EventKind.MEMORY_RELIEVED]
    assert [e.session_id for e in relieved] == [a, b, c]
    assert relieved[0].data["used"] == 0.5
    assert relieved[0].data["low"] == 0.80
    assert relieved[1].data["suspended_s"] == pytest.approx(4.0)  # b: suspended 1st, resumed 5th
    stats = node.stats()
    assert (stats["pressure_resumptions"], stats["pressure_suspended"]) == (3, 0)


def test_between_the_marks_nothing_changes_so_branches_do_not_flap(
    node: Node, clock: VirtualClock, probe: FakeProbe, events: list[Event]
) -> None:
    ids = branches(node, clock, 2)
    probe.used = 0.91
    check(node, clock)
    assert states(node, ids) == [SUSPENDED, ACTIVE]
    probe.used = 0.85  # memory came back, but not below the low mark
    check(node, clock, 5)
    assert states(node, ids) == [SUSPENDED, ACTIVE]
    probe.used = 0.79
    check(node, clock)
    assert states(node, ids) == [ACTIVE, ACTIVE]
    probe.used = 0.89  # climbing again, still under the high mark
    check(node, clock, 5)
    assert states(node, ids) == [ACTIVE, ACTIVE]
    assert len(of(events, EventKind.MEMORY_PRESSURE)) == 1
    assert len(of(events, EventKind.MEMORY_RELIEVED)) == 1


def test_a_branch_pressure_resumed_is_not_the_next_one_it_suspends(
    node: Node, clock: VirtualClock, probe: FakeProbe, events: list[Event]
) -> None:
    a, b = ids = branches(node, clock, 2)
    probe.used = 0.95
    check(node, clock)
    probe.used = 0.1
    check(node, clock)
    assert states(node, ids) == [ACTIVE, ACTIVE]
    probe.used = 0.95
    check(node, clock)
    assert states(node, ids) == [ACTIVE, SUSPENDED]
    assert of(events, EventKind.MEMORY_PRESSURE) == [a, b]


def test_a_branch_a_caller_suspended_is_never_resumed_by_memory(
    node: Node, clock: VirtualClock, probe: FakeProbe, events: list[Event]
) -> None:
    mine, taken_over, given_back = ids = branches(node, clock, 3)
    assert node.suspend(mine) is None
    settle(node)
    probe.used = 0.95
    check(node, clock, 2)
    assert of(events, EventKind.MEMORY_PRESSURE) == [taken_over, given_back]
    assert node.stats()["pressure_suspended"] == 2
    # a caller's suspend of a branch pressure suspended is accepted: it is the caller's now
    assert node.suspend(taken_over) is None
    assert node.resume(given_back) is None  # and a caller's resume takes it back
    settle(node)
    assert node.stats()["pressure_suspended"] == 0
    probe.used = 0.95  # would suspend given_back again: the only running branch
    check(node, clock)
    probe.used = 0.2
    check(node, clock, 4)
    assert states(node, ids) == [SUSPENDED, SUSPENDED, ACTIVE]
    assert of(events, EventKind.MEMORY_RELIEVED) == [given_back]


def test_a_pressure_suspended_branch_cancelled_meanwhile_is_forgotten(
    node: Node, clock: VirtualClock, probe: FakeProbe, events: list[Event]
) -> None:
    (only,) = branches(node, clock, 1)
    probe.used = 0.95
    check(node, clock)
    assert node.cancel(only) is None
    assert node.wait(only, WAIT).status is SessionState.CANCELLED
    assert node.stats()["pressure_suspended"] == 0
    probe.used = 0.1
    check(node, clock, 2)
    assert of(events, EventKind.MEMORY_RELIEVED) == []


def test_a_probe_returning_a_bool_suspends_on_true_and_resumes_on_false(
    node: Node, clock: VirtualClock, probe: FakeProbe
) -> None:
    ids = branches(node, clock, 2)
    probe.used = True
    check(node, clock)
    assert states(node, ids) == [SUSPENDED, ACTIVE]
    probe.used = False
    check(node, clock)
    assert states(node, ids) == [ACTIVE, ACTIVE]


def test_a_probe_that_raises_or_returns_nonsense_is_logged_once_and_changes_nothing(
    node: Node,
    clock: VirtualClock,
    probe: FakeProbe,
    events: list[Event],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = branches(node, clock, 2)
    caplog.set_level(logging.WARNING, logger="sessiontree.cortex")
    probe.error = OSError("no /proc here")
    check(node, clock, 3)
    probe.error = None
    probe.used = "lots"
    check(node, clock, 3)  # still failing: not said again
    said = [r.getMessage() for r in caplog.records if "memory-pressure" in r.getMessage()]
    assert said == ["memory-pressure probe raised; read as no reading"]
    probe.used = 0.95  # reads well again: suspends, and a new failure is said again
    check(node, clock)
    probe.used = math.nan
    check(node, clock, 2)
    said = [r.getMessage() for r in caplog.records if "memory-pressure" in r.getMessage()]
    assert len(said) == 2
    assert "returned nan" in said[1]
    assert states(node, ids) == [SUSPENDED, ACTIVE]
    assert len(of(events, EventKind.MEMORY_PRESSURE)) == 1


def test_pressure_is_counted_and_the_last_reading_is_a_gauge_promtool_accepts(
    node: Node, clock: VirtualClock, probe: FakeProbe
) -> None:
    metrics = NodeMetrics(node)
    try:
        assert math.isnan(gauge(metrics, "sessiontree_memory_used_ratio"))  # not read yet
        branches(node, clock, 1)
        probe.used = 0.97
        check(node, clock)
        assert gauge(metrics, "sessiontree_memory_used_ratio") == 0.97
        assert gauge(metrics, "sessiontree_memory_pressure_suspended") == 1
        probe.used = 0.42
        check(node, clock)
        assert gauge(metrics, "sessiontree_memory_used_ratio") == 0.42
        assert gauge(metrics, "sessiontree_memory_pressure_suspensions_total") == 1
        assert gauge(metrics, "sessiontree_memory_pressure_resumptions_total") == 1
        assert gauge(metrics, "sessiontree_memory_pressure_suspended") == 0
        assert gauge(metrics, "sessiontree_memory_high_ratio") == 0.90
        assert gauge(metrics, "sessiontree_memory_low_ratio") == 0.80
        checked = promtool("check", "metrics", stdin=metrics.exposition())
        assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
    finally:
        metrics.close()


def gauge(metrics: NodeMetrics, name: str) -> float:
    found = metrics.registry.get_sample_value(name, {})
    assert found is not None, f"no series {name}"
    return found


def test_without_a_probe_nothing_is_read(make_node: Any, clock: VirtualClock) -> None:
    node = make_node(AGENT, check_interval=1.0, memory_probe=False)
    ids = branches(node, clock, 1)
    check(node, clock, 2)
    assert states(node, ids) == [ACTIVE]
    assert math.isnan(node._runtime.memory_used)


def test_a_node_reads_the_built_in_probe_by_default(make_node: Any, clock: VirtualClock) -> None:
    node = make_node(AGENT, check_interval=1.0)
    check(node, clock)
    assert 0.0 <= node._runtime.memory_used <= 1.0  # this machine's, through /proc and /sys


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"memory_high": 0.7}, "memory_high"),  # not above the default low mark (0.8)
        ({"memory_high": 0.5, "memory_low": 0.5}, "memory_high"),
        ({"memory_high": 1.5}, "memory_high"),
        ({"memory_high": math.nan}, "memory_high"),
        ({"memory_low": 0.0}, "memory_low"),
        ({"memory_low": "0.5"}, "memory_low"),
        ({"memory_low": True}, "memory_low"),
        ({"memory_probe": "yes"}, "memory_probe"),
        ({"memory_pressure": 0.5}, "memory_pressure"),
    ],
)
def test_bad_memory_settings_are_refused_naming_the_field(
    settings: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=rf"NodeConfig\.{field} "):
        NodeConfig(**settings)


def test_the_marks_and_the_probe_have_documented_defaults() -> None:
    config = NodeConfig()
    assert (config.memory_high, config.memory_low) == (0.90, 0.80)
    assert config.memory_probe is True
    assert config.memory_pressure is None


def cli(*args: str) -> Any:
    return CliRunner().invoke(cli_main, list(args), catch_exceptions=False)


@pytest.mark.timeout(120)
def test_the_marks_come_from_the_config_file_and_flags_of_node_start(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("[node]\nmemory_high = 0.7\nmemory_low = 0.5\nmemory_probe = false\n")
    running = RunningNode(tmp_path / "store", "--config", str(config), "--memory-high", "0.95")
    try:
        shown = running.config["node"]
        assert (shown["memory_high"], shown["memory_low"], shown["memory_probe"]) == (
            0.95,
            0.5,
            False,
        )
        assert running.sources["memory_high"] == "flag"
        assert running.sources["memory_low"] == "file"
        status = running.http.get("/v1/node").json()
        assert (status["config"]["memory_high"], status["config"]["memory_low"]) == (0.95, 0.5)
        exposition = running.http.get("/metrics").text
        assert "sessiontree_memory_high_ratio 0.95" in exposition
        assert "sessiontree_memory_low_ratio 0.5" in exposition
    finally:
        assert running.stop() == 0


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--memory-high", "0.5"], "NodeConfig.memory_high (0.5) must be above"),
        (["--memory-low", "0.95"], "NodeConfig.memory_high (0.9) must be above"),
        (["--memory-high", "1.5"], "--memory-high"),
        (["--memory-low", "0"], "--memory-low"),
    ],
)
def test_bad_marks_on_node_start_are_usage_errors_naming_the_field(
    tmp_path: Path, args: list[str], named: str
) -> None:
    result = cli("node", "start", "--store", str(tmp_path / "store"), "--port", "0", *args)
    assert result.exit_code == 2
    assert named in result.output
    assert not (tmp_path / "store").exists()  # refused before the node was made


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ("memory_low = 0.95\n", "NodeConfig.memory_high (0.9) must be above"),
        ("memory_high = 'high'\n", "memory_high = 'high'"),
        ("memory_probe = 'perhaps'\n", "memory_probe = 'perhaps'"),
    ],
)
def test_bad_marks_in_the_config_file_are_usage_errors_naming_the_field(
    tmp_path: Path, table: str, named: str
) -> None:
    config = tmp_path / "node.toml"
    config.write_text("[node]\n" + table)
    store = tmp_path / "store"
    result = cli("node", "start", "--store", str(store), "--port", "0", "--config", str(config))
    assert result.exit_code == 2
    assert named in result.output


def test_a_branch_pressure_suspended_before_a_restart_resumes_once_memory_is_free(
    clock: VirtualClock, probe: FakeProbe, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    node = Node(
        [AGENT], NodeConfig(check_interval=1.0, memory_pressure=probe), clock=clock, store=store
    )
    try:
        (branch,) = branches(node, clock, 1)
        probe.used = 0.95
        check(node, clock)
        assert states(node, [branch]) == [SUSPENDED]
    finally:
        node.shutdown(grace=0)
    node = Node(
        [AGENT], NodeConfig(check_interval=1.0, memory_pressure=probe), clock=clock, store=store
    )
    try:
        assert states(node, [branch]) == [SUSPENDED]
        assert node.stats()["pressure_suspended"] == 1
        check(node, clock)  # still past the high mark: it stays suspended
        assert states(node, [branch]) == [SUSPENDED]
        probe.used = 0.5
        check(node, clock)
        assert states(node, [branch]) == [ACTIVE]
        assert node.stats()["pressure_resumptions"] == 1
    finally:
        node.shutdown(grace=0)
