"""The actors package's three surfaces, pinned (import directions and circles:
test_layout.py).

``sessiontree.actors`` is what a skill author and an embedding application
use; ``sessiontree.actors.backends`` is where a skill runs;
``sessiontree.actors.runtime`` is the plumbing ``sessiontree.supervision``
assembles a node from. A name moves between them only on purpose.
"""

from __future__ import annotations

import importlib

import pytest

ACTORS = [
    "ACTOR_TYPES",
    "AskTimeoutError",
    "AsyncSession",
    "Cancelled",
    "Clock",
    "ContextMessage",
    "ConversationLike",
    "RealClock",
    "Session",
    "SessionContext",
    "TimerHandle",
    "VirtualClock",
]

BACKENDS = [
    "BACKENDS",
    "ExecutionBackend",
    "ProcessBackend",
    "RayBackend",
    "RemoteRun",
    "RemoteSession",
    "StepEnd",
    "StepEvent",
    "StepJob",
]

RUNTIME = [
    "Activity",
    "Backends",
    "BlockedHandler",
    "CancelSignal",
    "ComputeSlots",
    "Counted",
    "CycleDone",
    "Deliver",
    "Dispatcher",
    "EventLoopThread",
    "ForceStop",
    "Inbound",
    "Inspect",
    "LoopTimer",
    "Passivate",
    "PooledActor",
    "Reply",
    "RunEnd",
    "SessionActorLogic",
    "SessionCond",
    "SessionCore",
    "SessionHost",
    "SpawnedLike",
    "StepExecutor",
    "StopSession",
    "actor_class",
    "crash_info",
    "drain_inbox",
    "finish_run",
    "handler_scope",
    "in_actor_handler",
    "is_async_skill",
    "post",
    "start_actor",
    "start_run",
    "stop_actor",
    "stop_unstarted",
    "to_outcome",
    "wake_batch",
]

SURFACES = {
    "sessiontree.actors": ACTORS,
    "sessiontree.actors.backends": BACKENDS,
    "sessiontree.actors.runtime": RUNTIME,
}


@pytest.mark.parametrize("name", sorted(SURFACES))
def test_each_actors_surface_exports_exactly_its_names_sorted(name: str) -> None:
    module = importlib.import_module(name)
    assert list(module.__all__) == SURFACES[name]
    assert list(module.__all__) == sorted(module.__all__, key=lambda n: (not n.isupper(), n))
    for exported in module.__all__:
        assert hasattr(module, exported), exported


def test_no_name_is_exported_from_two_actors_surfaces() -> None:
    seen: dict[str, str] = {}
    for name, exported in SURFACES.items():
        for each in exported:
            assert each not in seen, f"{each} is exported by {seen.get(each)} and {name}"
            seen[each] = name
