"""Shared fixtures: a virtual clock and nodes that are always shut down."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sessiontree.actors import VirtualClock
from sessiontree.supervision import Agent, Node, NodeConfig

WAIT = 10.0  # real seconds any bounded wait in a test may take before it fails


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


def settle(node: Node) -> None:
    """Wait (bounded) until the node's tree is idle; fail the test if it never is."""
    assert node.wait_idle(WAIT), f"node did not settle: {node.activity.busy} in flight"
