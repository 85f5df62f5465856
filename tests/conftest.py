"""Shared fixtures: a virtual clock and nodes that are always shut down."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessiontree.actors import RealClock, VirtualClock
from sessiontree.supervision import Agent, Node, NodeConfig
from tests import _remote_skills as remote_skills

WAIT = 10.0  # real seconds any bounded wait in a test may take before it fails
_REAL = RealClock()


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An Event a test's skills block on; set at teardown so none is left waiting."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def caught() -> threading.Event:
    """An Event a skill sets once it caught its cancellation."""
    return threading.Event()


@pytest.fixture
def make_node(clock: VirtualClock) -> Iterator[Callable[..., Node]]:
    """Build nodes on the test's virtual clock; every one is shut down after the test."""
    nodes: list[Node] = []

    def make(*agents: Agent, **config: Any) -> Node:
        node_clock = config.pop("clock", clock)
        node = Node(list(agents), NodeConfig(**config), clock=node_clock)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.shutdown(grace=0, timeout=5.0)


@pytest.fixture
def open_node(clock: VirtualClock) -> Iterator[Callable[..., Node]]:
    """Nodes on the test's virtual clock (and a store directory); all shut down after."""
    nodes: list[Node] = []

    def open_(store: Path | None, *agents: Agent, **config: Any) -> Node:
        node = Node(list(agents), NodeConfig(**config), clock=clock, store=store)
        nodes.append(node)
        return node

    yield open_
    for node in nodes:
        node.shutdown(grace=0, timeout=5.0)


def wait_until(condition: Callable[[], object], what: str) -> None:
    """Wait (bounded by ``WAIT`` real seconds, looking every 10 ms with an
    Event's wait, never a sleep) until ``condition()`` holds; fail naming ``what``."""
    pause = threading.Event()
    deadline = _REAL.monotonic() + WAIT
    while not condition():
        assert _REAL.monotonic() < deadline, f"timed out waiting for {what}"
        pause.wait(0.01)


def settle(node: Node) -> None:
    """Wait (bounded) until the node's tree is idle; fail the test if it never is."""
    assert node.wait_idle(WAIT), f"node did not settle: {node.activity.busy} in flight"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A real local Ray cluster for the whole test session , shared
    by every module whose steps run on Ray."""
    try:
        import ray  # noqa: PLC0415 - optional and heavy: only the ray tests need it
    except ImportError:
        if os.environ.get("CI") == "true":
            raise  # under CI a missing tool is a failure, never a skip
        pytest.skip("Ray is not installed here")
    remote_skills.quiet_ray()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
