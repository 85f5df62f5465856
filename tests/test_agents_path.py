"""Where ``--agents`` modules are imported from (issue 38): the working
directory is on ``sys.path`` only for an ``--agents`` module found nowhere
else, and only for that import, so a module planted in the folder a node
starts in (an ``httptools.py`` or ``websockets.py`` that uvicorn imports
lazily) is never executed, whether the node runs from the ``sessiontree``
script or ``python -m``; an agents module beside the node still loads, and
the process backend's workers still find it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sessiontree.cli._agents import BUILTIN, load_agents
from tests._running_node import RunningNode

pytestmark = pytest.mark.timeout(120)

SCRIPT = (str(Path(sys.executable).with_name("sessiontree")),)
MODULE = (sys.executable, "-m", "sessiontree.cli")
#: modules uvicorn imports lazily, after start-up, when they are installed
PLANTED = ("httptools", "websockets", "wsproto", "uvloop")

LOCAL_AGENTS = """
import os
from sessiontree.supervision import Agent


def chat(session):
    return None


def where(session):
    return f"{__name__} in process {os.getpid()}"


agents = [Agent("local", skills={"chat": chat, "where": where}, main_skill="chat",
                default_skill="where")]
"""


def _plant(folder: Path, markers: Path) -> None:
    """A module of each ``PLANTED`` name that, if ever imported, leaves a marker."""
    markers.mkdir()
    for name in PLANTED:
        (folder / f"{name}.py").write_text(
            f"open({str(markers / name)!r}, 'w').write('executed')\n"
            f"raise ImportError('planted {name}')\n"
        )


@pytest.mark.parametrize("program", [SCRIPT, MODULE], ids=["script", "python-m"])
def test_a_module_planted_where_the_node_starts_is_never_executed(
    tmp_path: Path, program: tuple[str, ...]
) -> None:
    assert Path(program[0]).exists(), f"{program[0]} is not installed"
    folder = tmp_path / "downloads"
    folder.mkdir()
    _plant(folder, tmp_path / "markers")
    running = RunningNode(tmp_path / "store", agents=BUILTIN, cwd=folder, program=program)
    try:
        opened = running.http.post("/v1/sessions", json={"agent_id": "assistant"})
        assert opened.status_code == 200, opened.text
        main = opened.json()["info"]["session_id"]
        sent = running.http.post(f"/v1/sessions/{main}/messages", json={"message": "hi"})
        assert sent.status_code == 202, sent.text
    finally:
        assert running.stop() == 0
    assert sorted(p.name for p in (tmp_path / "markers").iterdir()) == []
    assert "planted" not in running.log()


def test_an_agents_module_beside_the_node_loads_and_its_workers_find_it(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    _plant(folder, tmp_path / "markers")
    (folder / "localagents.py").write_text(LOCAL_AGENTS)
    running = RunningNode(
        tmp_path / "store",
        *("--backend", "process", "--process-workers", "1"),
        agents="localagents:agents",
        cwd=folder,
        program=SCRIPT,
    )
    try:
        opened = running.http.post("/v1/sessions", json={"agent_id": "local"})
        assert opened.status_code == 200, opened.text
        main = opened.json()["info"]["session_id"]
        spawned = running.http.post(f"/v1/sessions/{main}/children", json={"kind": "worker"})
        assert spawned.status_code == 201, spawned.text
        child = spawned.json()["info"]["session_id"]
        waited = running.http.get(f"/v1/sessions/{child}/result", params={"timeout": 30}).json()
        assert waited["done"] is True, waited
        summary = waited["result"]["summary"]
        assert summary.startswith("localagents in process "), waited["result"]
        assert int(summary.rsplit(" ", 1)[1]) != running.proc.pid  # a worker process ran it
    finally:
        assert running.stop() == 0
    assert sorted(p.name for p in (tmp_path / "markers").iterdir()) == []


def test_sys_path_is_left_as_it_was_but_for_a_link_to_the_module_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = list(sys.path)
    load_agents(BUILTIN)
    assert sys.path == before  # a part of the package: nothing added
    folder = tmp_path / "here"
    folder.mkdir()
    (folder / "agents_beside_me.py").write_text(LOCAL_AGENTS)
    (folder / "websockets.py").write_text("raise ImportError('planted')\n")
    monkeypatch.chdir(folder)
    try:
        (agent,) = load_agents("agents_beside_me:agents")
    finally:
        sys.modules.pop("agents_beside_me", None)
    assert agent.agent_id == "local"
    assert str(folder) not in sys.path
    (added,) = sys.path[len(before) :]
    assert sys.path[: len(before)] == before
    assert sorted(p.name for p in Path(added).iterdir()) == ["agents_beside_me.py"]
    assert (Path(added) / "agents_beside_me.py").resolve() == folder / "agents_beside_me.py"
