"""The actors package's three surfaces, pinned, and its modules free of import circles.

``sessiontree.actors`` is what a skill author and an embedding application
use; ``sessiontree.actors.backends`` is where a skill runs;
``sessiontree.actors.runtime`` is the plumbing ``sessiontree.supervision``
assembles a node from. A name moves between them only on purpose.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import sessiontree.actors

ACTORS = [
    "ACTOR_TYPES",
    "EXPORT_FORMATS",
    "AskTimeoutError",
    "AsyncSession",
    "Cancelled",
    "Clock",
    "ContextMessage",
    "Conversation",
    "ConversationBackend",
    "Conversations",
    "MemoryBackend",
    "RealClock",
    "Session",
    "SessionContext",
    "TimerHandle",
    "VirtualClock",
    "nested_json",
    "preview_text",
    "render_html",
    "text_tree",
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


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, ``if TYPE_CHECKING:`` ones included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
    return (found & known) - {module}


def test_the_actors_modules_import_one_another_without_a_circle() -> None:
    root = Path(sessiontree.actors.__file__).resolve().parent
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = ["sessiontree", "actors", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    known = set(modules)
    graph = {name: _imports(path, name, known) for name, path in modules.items()}
    assert "sessiontree.actors.backends._protocol" in graph

    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            pytest.fail("import circle: " + " -> ".join(cycle))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
