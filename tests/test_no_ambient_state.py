"""No ambient state in sessions (the README's Execution model): no ``os.chdir``, ``os.environ``,
``os.getenv`` or ``os.putenv`` in skill execution paths.

Two checks, as issue 2 asks: an AST scan of every source file of the packages
skills run through (``actors/``, ``supervision/``, ``protocol/``,
``conversations/``), and a runtime
guard (``tests/_guard.py``, the ``ambient_guard`` fixture) that fails any use
from the threads that run skills.
"""

from __future__ import annotations

import ast
import asyncio
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sessiontree.actors import Cancelled, VirtualClock
from sessiontree.protocol import ErrorCode, SessionState
from sessiontree.supervision import Agent
from tests._guard import (
    SKILL_THREAD_PREFIXES,
    AmbientGuard,
    AmbientStateError,
    ambient_guard,
)
from tests.conftest import WAIT, settle

__all__ = ["ambient_guard"]  # the fixture, imported so pytest finds it here

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "supervision", "protocol", "conversations")

#: Attributes of ``os`` that are ambient process state. The issue names the first
#: four; the rest are the same thing under another name.
AMBIENT_OS_NAMES = frozenset(
    {
        "chdir",
        "environ",
        "getenv",
        "putenv",
        "fchdir",
        "environb",
        "getenvb",
        "unsetenv",
    }
)
#: ``os.path`` functions that read ``os.environ`` (HOME and friends).
AMBIENT_OS_PATH_NAMES = frozenset({"expanduser", "expandvars"})
#: Modules that expose the same functions as ``os``.
OS_MODULES = frozenset({"os", "posix", "nt"})


# -- the AST scan ------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


class _AmbientScan(ast.NodeVisitor):
    """Finds uses of ambient process state, however ``os`` was imported."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.findings: list[Finding] = []
        self.os_names: set[str] = set()  # local names bound to os / posix / nt
        self.os_path_names: set[str] = set()  # local names bound to os.path

    def _found(self, node: ast.AST, what: str) -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), what))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            if alias.name == "os.path" and alias.asname:
                self.os_path_names.add(alias.asname)
            elif top in OS_MODULES:
                self.os_names.add(alias.asname or top)
            elif alias.name in ("posixpath", "ntpath"):
                self.os_path_names.add(alias.asname or alias.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            if module in OS_MODULES:
                if alias.name == "*":
                    self._found(node, f"from {module} import *")
                elif alias.name in AMBIENT_OS_NAMES:
                    self._found(node, f"from {module} import {alias.name}")
                elif alias.name == "path":
                    self.os_path_names.add(alias.asname or "path")
            elif module in ("os.path", "posixpath", "ntpath") and (
                alias.name == "*" or alias.name in AMBIENT_OS_PATH_NAMES
            ):
                self._found(node, f"from {module} import {alias.name}")
        self.generic_visit(node)

    def _is_os(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in self.os_names

    def _is_os_path(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.os_path_names
        return isinstance(node, ast.Attribute) and node.attr == "path" and self._is_os(node.value)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._is_os(node.value) and node.attr in AMBIENT_OS_NAMES:
            self._found(node, f"{ast.unparse(node)}")
        elif self._is_os_path(node.value) and node.attr in AMBIENT_OS_PATH_NAMES:
            self._found(node, f"{ast.unparse(node)} (reads os.environ)")
        elif self._is_os(node.value) and node.attr == "__dict__":
            self._found(node, f"{ast.unparse(node)} (reaches os by name)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        first = node.args[0] if node.args else None
        constant = first.value if isinstance(first, ast.Constant) else None
        if name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2:
            target, attr = node.args[0], node.args[1]
            if isinstance(attr, ast.Constant) and (
                (self._is_os(target) and attr.value in AMBIENT_OS_NAMES)
                or (self._is_os_path(target) and attr.value in AMBIENT_OS_PATH_NAMES)
            ):
                self._found(node, f"{ast.unparse(node)}")
        if name == "vars" and first is not None and self._is_os(first):
            self._found(node, f"{ast.unparse(node)} (reaches os by name)")
        dynamic = name == "__import__" or (
            isinstance(func, ast.Attribute) and func.attr == "import_module"
        )
        if dynamic and isinstance(constant, str) and constant.split(".")[0] in OS_MODULES:
            self._found(node, f"{ast.unparse(node)} (imports os dynamically)")
        self.generic_visit(node)


def scan_source(source: str, path: str = "<string>") -> list[Finding]:
    """Every use of ambient process state in ``source``."""
    scan = _AmbientScan(path)
    scan.visit(ast.parse(source, filename=path))
    return scan.findings


def package_sources() -> list[Path]:
    files: list[Path] = []
    for package in PACKAGES:
        directory = ROOT / package
        assert directory.is_dir(), f"package folder {directory} is missing"
        files.extend(sorted(directory.rglob("*.py")))
    return files


def test_scan_covers_every_source_file_of_the_skill_paths() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in package_sources()}
    for expected in (
        "actors/_session.py",
        "actors/_execution.py",
        "actors/_session_actor.py",
        "actors/_core.py",
        "supervision/_cortex.py",
        "supervision/_node.py",
        "protocol/_codec.py",
        "conversations/_conversation.py",
    ):
        assert expected in files
    assert all("__pycache__" not in f for f in files)


def test_skill_execution_paths_never_touch_ambient_state() -> None:
    findings: list[Finding] = []
    for path in package_sources():
        findings.extend(scan_source(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))))
    assert not findings, "ambient state in skill execution paths:\n" + "\n".join(
        str(f) for f in findings
    )


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("import os\nos.chdir('/tmp')", "os.chdir"),
        ("import os\nx = os.environ['HOME']", "os.environ"),
        ("import os\nx = os.environ.get('HOME')", "os.environ"),
        ("import os\nx = os.getenv('HOME')", "os.getenv"),
        ("import os\nos.putenv('A', 'b')", "os.putenv"),
        ("import os\nos.unsetenv('A')", "os.unsetenv"),
        ("import os as o\nx = o.environ", "o.environ"),
        ("import os.path\nx = os.environ", "os.environ"),
        ("from os import environ", "from os import environ"),
        ("from os import getenv as g", "from os import getenv"),
        ("from os import chdir, path", "from os import chdir"),
        ("from os import *", "from os import *"),
        ("from posix import putenv", "from posix import putenv"),
        ("import os\nx = getattr(os, 'environ')", "getattr(os, 'environ')"),
        ("import os\nsetattr(os, 'environ', {})", "setattr(os, 'environ', {})"),
        ("import os\nx = vars(os)['environ']", "vars(os)"),
        ("import os\nx = os.__dict__['getenv']", "os.__dict__"),
        ("x = __import__('os').environ", "__import__('os')"),
        ("import importlib\nx = importlib.import_module('os')", "import_module('os')"),
        ("import os\nx = os.path.expanduser('~')", "os.path.expanduser"),
        ("from os import path\nx = path.expandvars('$A')", "path.expandvars"),
        ("from os.path import expanduser", "from os.path import expanduser"),
        ("def f():\n    import os\n    return os.getenv('A')", "os.getenv"),
    ],
)
def test_scan_finds_every_form(source: str, what: str) -> None:
    findings = scan_source(source)
    assert findings, f"the scan missed {what!r} in:\n{source}"
    assert any(what in f.what for f in findings), findings


@pytest.mark.parametrize(
    "source",
    [
        "import os\nx = os.path.join('a', 'b')",
        "import os\nx = os.getpid()",
        "environ = {}\nx = environ['HOME']",  # a local name, not the process's
        "class A:\n    environ = {}\nx = A().environ",
        "x = getattr(object(), 'environ', None)",
        "import os\nx = getattr(os, name)",  # not a constant: nothing to prove either way
        "from os import path\nx = path.join('a')",
        "from os.path import join",
        "import sys\nx = sys.argv",
    ],
)
def test_scan_does_not_flag_innocent_code(source: str) -> None:
    assert scan_source(source) == []


# -- the runtime guard -------------------------------------------------------------


def idle_main(session: Any) -> None:
    return None


@dataclass
class Seen:
    """Which threads the skills ran on (so a clean guard means something)."""

    threads: set[str]
    lock: threading.Lock

    def note(self) -> None:
        with self.lock:
            self.threads.add(threading.current_thread().name)


@pytest.fixture
def seen() -> Seen:
    return Seen(set(), threading.Lock())


def well_behaved_skills(seen: Seen) -> dict[str, Any]:
    """A little of everything a skill does: spawn, collect, memory, progress, sleep,
    crash, wrap up after a cancel; sync and async."""

    def worker(session: Any) -> Any:
        seen.note()
        session.progress("working", step=1)
        if session.task == "crash":
            raise ValueError("worker failed on purpose")
        return {"task": session.task}

    async def worker_async(session: Any) -> Any:
        seen.note()
        await session.progress("working", step=1)
        await asyncio.sleep(0)
        if session.task == "crash":
            raise ValueError("async worker failed on purpose")
        return {"task": session.task}

    def branch(session: Any) -> Any:
        seen.note()
        session.memory_put("note", {"from": session.task})
        assert session.memory_get("note") == {"from": session.task}
        for task in ("a", "b", "crash"):
            session.spawn(kind="worker", task=task, skill="worker")
        session.spawn(kind="worker", task="c", skill="worker_async")
        got = session.collect()
        session.sleep(1.0)
        return {"statuses": sorted(c.result.status.value for c in got)}

    async def branch_async(session: Any) -> Any:
        seen.note()
        await session.memory_put("note", {"from": session.task})
        for task in ("a", "crash"):
            await session.spawn(kind="worker", task=task, skill="worker_async")
        await session.spawn(kind="worker", task="b", skill="worker")
        got = await session.collect()
        await session.sleep(1.0)
        return {"statuses": sorted(c.result.status.value for c in got)}

    def waits_for_cancel(session: Any) -> Any:
        seen.note()
        try:
            session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "never"

    async def waits_for_cancel_async(session: Any) -> Any:
        seen.note()
        try:
            await session.sleep(10_000)
        except Cancelled:
            return "partial"
        return "never"

    return {
        "main": idle_main,
        "worker": worker,
        "worker_async": worker_async,
        "branch": branch,
        "branch_async": branch_async,
        "waits_for_cancel": waits_for_cancel,
        "waits_for_cancel_async": waits_for_cancel_async,
    }


def test_a_normal_run_of_sync_and_async_skills_triggers_no_violation(
    ambient_guard: AmbientGuard, make_node: Any, clock: VirtualClock, seen: Seen
) -> None:
    node = make_node(Agent("agent", well_behaved_skills(seen), main_skill="main"), grace=5.0)
    main = node.main("agent")
    branches = [
        node.spawn(main, kind="branch", task=skill, skill=skill).ref
        for skill in ("branch", "branch_async")
    ]
    waiting = [
        node.spawn(main, kind="branch", task=skill, skill=skill, ttl=60.0).ref
        for skill in ("waits_for_cancel", "waits_for_cancel_async")
    ]
    settle(node)
    assert waiting[0].suspend() is None
    settle(node)
    assert waiting[0].resume() is None
    assert waiting[1].cancel() is None
    clock.advance(1.0)  # the branches' sleeps end
    settle(node)
    results = [ref.wait(WAIT) for ref in branches]
    assert [r.status for r in results] == [SessionState.COMPLETED] * 2
    assert results[0].artifacts == {"statuses": ["completed", "completed", "completed", "failed"]}
    assert results[1].artifacts == {"statuses": ["completed", "completed", "failed"]}
    assert waiting[1].wait(WAIT).summary == "partial"
    clock.advance(60.0)  # the other one expires
    assert waiting[0].wait(WAIT).error.code is ErrorCode.TTL_EXPIRED
    settle(node)
    # the guard watched the threads the skills really ran on
    assert any(t.startswith("sessiontree-step") for t in seen.threads), seen.threads
    assert any(t.startswith("sessiontree-loop") for t in seen.threads), seen.threads
    assert all(t.startswith(SKILL_THREAD_PREFIXES) for t in seen.threads), seen.threads
    assert ambient_guard.violations == []


def _environ_item(session: Any) -> Any:
    return os.environ["PATH"]


def _environ_get(session: Any) -> Any:
    return os.environ.get("HOME")


def _environ_contains(session: Any) -> Any:
    return "HOME" in os.environ


def _environ_copy(session: Any) -> Any:
    return dict(os.environ)


def _environ_set(session: Any) -> Any:
    os.environ["SESSIONTREE_GUARD_TEST"] = "1"


def _getenv(session: Any) -> Any:
    return os.getenv("HOME")


def _putenv(session: Any) -> Any:
    os.putenv("SESSIONTREE_GUARD_TEST", "1")


def _chdir(session: Any) -> Any:
    os.chdir("/")


def _expanduser(session: Any) -> Any:
    return os.path.expanduser("~")


BAD_CALLS = {
    "os.environ['PATH']": (_environ_item, "os.environ['PATH']"),
    "os.environ.get": (_environ_get, "os.environ.get('HOME')"),
    "'HOME' in os.environ": (_environ_contains, "os.environ contains 'HOME'"),
    "dict(os.environ)": (_environ_copy, "os.environ"),
    "os.environ[...] = ...": (_environ_set, "os.environ['SESSIONTREE_GUARD_TEST'] = ..."),
    "os.getenv": (_getenv, "os.getenv('HOME')"),
    "os.putenv": (_putenv, "os.putenv('SESSIONTREE_GUARD_TEST')"),
    "os.chdir": (_chdir, "os.chdir('/')"),
    "os.path.expanduser": (_expanduser, "os.environ"),
}


def _as_async(fn: Any) -> Any:
    async def skill(session: Any) -> Any:
        await session.checkpoint()
        return fn(session)

    return skill


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("bad", sorted(BAD_CALLS))
def test_a_skill_touching_ambient_state_is_caught_and_fails(
    ambient_guard: AmbientGuard, make_node: Any, bad: str, flavour: str
) -> None:
    fn, operation = BAD_CALLS[bad]
    skill = fn if flavour == "sync" else _as_async(fn)
    cwd, environ = os.getcwd(), dict(os.environ)
    node = make_node(Agent("agent", {"main": idle_main, "bad": skill}, main_skill="main"))
    result = node.run(node.main("agent"), kind="worker", skill="bad", timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.FAILED, result
    assert result.error is not None
    assert result.error.code is ErrorCode.CRASHED
    assert result.error.detail["type"] == "tests._guard.AmbientStateError"
    assert operation in result.error.message
    violations = ambient_guard.take()
    assert violations, "the guard recorded nothing"
    first = violations[0]
    assert first.operation.startswith(operation), first
    prefix = "sessiontree-step" if flavour == "sync" else "sessiontree-loop"
    assert first.thread.startswith(prefix), first.thread
    assert "test_no_ambient_state.py" in first.where, first.where
    # refused before it happened: the process's state is untouched
    assert os.getcwd() == cwd
    assert dict(os.environ) == environ


def test_a_skill_that_swallows_the_refusal_is_still_recorded(
    ambient_guard: AmbientGuard, make_node: Any
) -> None:
    def sneaky(session: Any) -> Any:
        try:
            return os.environ["HOME"]
        except Exception:
            return "swallowed"

    node = make_node(Agent("agent", {"main": idle_main, "sneaky": sneaky}, main_skill="main"))
    result = node.run(node.main("agent"), kind="worker", skill="sneaky", timeout=WAIT)
    assert result is not None
    assert result.summary == "swallowed"
    (violation,) = ambient_guard.take()
    assert violation.operation == "os.environ['HOME']"


def test_record_only_guard_lets_the_call_through_and_records_it(
    make_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSIONTREE_GUARD_PROBE", "visible")

    def reads(session: Any) -> Any:
        return os.getenv("SESSIONTREE_GUARD_PROBE")

    with AmbientGuard(raise_on_violation=False) as guard:
        node = make_node(Agent("agent", {"main": idle_main, "reads": reads}, main_skill="main"))
        result = node.run(node.main("agent"), kind="branch", skill="reads", timeout=WAIT)
    assert result is not None
    assert result.status is SessionState.COMPLETED
    assert result.summary == "visible"
    (violation,) = guard.violations
    assert violation.operation == "os.getenv('SESSIONTREE_GUARD_PROBE')"
    with pytest.raises(pytest.fail.Exception, match="1 ambient-state violation"):
        guard.assert_clean()


def test_guard_leaves_other_threads_alone(ambient_guard: AmbientGuard) -> None:
    assert os.environ.get("PATH") == os.getenv("PATH")
    done: list[Any] = []
    helper = threading.Thread(target=lambda: done.append(os.getenv("PATH")), name="helper")
    helper.start()
    helper.join(WAIT)
    assert done == [os.environ.get("PATH")]
    assert ambient_guard.violations == []


def test_guard_puts_os_back_as_it_was() -> None:
    before = {name: getattr(os, name) for name in ("environ", "getenv", "putenv", "chdir")}
    with AmbientGuard() as guard:
        assert guard.installed
        assert os.environ is not before["environ"]
        assert os.getenv is not before["getenv"]
    assert not guard.installed
    assert {name: getattr(os, name) for name in before} == before


def test_on_a_skill_thread_the_guard_raises(ambient_guard: AmbientGuard) -> None:
    caught: list[BaseException] = []

    def run() -> None:
        try:
            os.getenv("HOME")
        except AmbientStateError as exc:
            caught.append(exc)

    thread = threading.Thread(target=run, name="sessiontree-step-test")
    thread.start()
    thread.join(WAIT)
    assert len(caught) == 1
    assert [v.thread for v in ambient_guard.take()] == ["sessiontree-step-test"]


@pytest.fixture(autouse=True)
def _no_guard_left_behind() -> Iterator[None]:
    environ = os.environ
    yield
    assert os.environ is environ, "a guard was left installed"
