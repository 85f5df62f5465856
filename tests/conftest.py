"""Shared fixtures: a virtual clock, nodes that are always shut down, and every
test that can build a node run once per actor type."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessiontree.actors import ACTOR_TYPES, VirtualClock
from sessiontree.supervision import Agent, Node, NodeConfig
from sessiontree.supervision import _config as node_defaults
from tests import _remote_skills as remote_skills

#: Modules whose tests never build a node in this process or a child process
#: (or, for the schema test, build their one node at import; for the CLI's
#: imports, one that only answers the commands; for the Quick start, the demo's
#: in a fresh venv), the backend tests (where a step runs is apart from what
#: serves mailboxes), the HTTP server's guards, the agents' import path and the
#: terminal escapes (no session actor takes part in what they try), and the
#: embedded script's end (signals and exit hooks, in subprocesses that cost
#: seconds each): they run once.
SINGLE_RUN = frozenset(
    {
        "test_agents_path",
        "test_backends",
        "test_chat",
        "test_cli_lazy",
        "test_cross_site",
        "test_conversation_property",
        "test_conversations",
        "test_embedded_exit",
        "test_export",
        "test_http_schema",
        "test_loop_dispatch",
        "test_node_connections",
        "test_pooled_actor",
        "test_remote_models",
        "test_scale",
        "test_standin",
        "test_protocol",
        "test_quick_start",
        "test_record_damage",
        "test_record_fuzz",
        "test_store",
        "test_store_backup",
        "test_store_damage",
        "test_terminal_escapes",
        "test_tree_html",
        "test_virtual_clock",
    }
)


#: Modules that also run on pooled actors served by a pool of threads
#: (``dispatch="threads"``; ``pooled`` alone is served on the event loop): the
#: tree's state machine, the lifecycle and the coordination patterns.
THREADS_TOO = frozenset({"test_lifecycle", "test_patterns", "test_tree_machine"})
POOLED_ON_THREADS = "pooled-threads"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that can build a node on each actor type (the
    suite passes on pooled and on ``ThreadingActor`` session actors)."""
    stem = Path(metafunc.definition.path).stem
    if stem not in SINGLE_RUN:
        kinds = sorted(ACTOR_TYPES) + ([POOLED_ON_THREADS] if stem in THREADS_TOO else [])
        metafunc.parametrize("actor_type", kinds, indirect=True)


@pytest.fixture(autouse=True)
def actor_type(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The actor type every node of this test runs its sessions on, by default:
    in this process (``NodeConfig()``) and in node subprocesses (environment);
    ``pooled-threads``: pooled actors on a pool of threads (in this process)."""
    param: str = getattr(request, "param", node_defaults._DEFAULTS["actor_type"])
    kind = "pooled" if param == POOLED_ON_THREADS else param
    dispatch = "threads" if param == POOLED_ON_THREADS else "loop"
    monkeypatch.setitem(node_defaults._DEFAULTS, "dispatch", dispatch)
    monkeypatch.setitem(node_defaults._DEFAULTS, "actor_type", kind)
    monkeypatch.setenv("SESSIONTREE_NODE_START_ACTOR_TYPE", kind)
    monkeypatch.setenv("SESSIONTREE_TEST_ACTOR_TYPE", kind)
    return kind


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
