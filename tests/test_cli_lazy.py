"""Commands import only what they use (issue 39): ``--version``, ``--help`` and
the read commands against a node load click and httpx, never the runtime,
Litestar, Textual or the model client; a command whose extra is missing says
which one to install (exit 2). The CPU each costs is measured by
benchmarks/bench_cli.py, not here: these tests read what a real process
imported."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sessiontree.cli import main as cli_main
from sessiontree.cli._agents import builtin_agents
from sessiontree.cli._lazy import LazyGroup
from sessiontree.supervision import Node
from tests._served import ServedNode

pytestmark = pytest.mark.timeout(120)

#: What a light command must not load: the runtime and the heavy libraries.
HEAVY = (
    "sessiontree.supervision",
    "sessiontree.store",
    "sessiontree.actors",
    "sessiontree.conversations",
    "sessiontree.cli.demo._scenario",
    "sessiontree.cli.server",
    "litestar",
    "uvicorn",
    "textual",
    "openai",
    "lmdb",
    "ray",
)

#: Runs the CLI in this interpreter, then prints (on stderr, last line) the
#: heavy modules it imported.
PROBE = """
import json, sys
from sessiontree.cli import main
try:
    main(sys.argv[1:], prog_name="sessiontree")
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


def _imported(*args: str) -> tuple[int, list[str]]:
    """Run ``sessiontree ARGS`` in a fresh interpreter: its exit code and the
    heavy modules it imported."""
    script = f"HEAVY = {HEAVY!r}\n{PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = json.loads(done.stderr.strip().splitlines()[-1])
    return found["code"], found["heavy"]


@pytest.fixture
def served(tmp_path: Path, make_node: Callable[..., Node]) -> Iterator[tuple[ServedNode, str]]:
    """The built-in agents served on 127.0.0.1, with one Main; and its id."""
    node = make_node(*builtin_agents())
    with ServedNode(node) as server:
        made = server.http.post("/v1/sessions", json={"agent_id": "assistant"})
        yield server, made.json()["info"]["session_id"]


@pytest.mark.parametrize(
    "args", [("--version",), ("--help",), ("sessions", "--help"), ("node", "--help")]
)
def test_version_and_help_load_no_runtime(args: tuple[str, ...]) -> None:
    code, heavy = _imported(*args)
    assert code == 0
    assert heavy == []


def test_read_commands_against_a_node_load_no_runtime(served: tuple[ServedNode, str]) -> None:
    server, main_id = served
    for args in (
        ("sessions", "ls", "--node", server.url),
        ("sessions", "show", main_id[:8], "--node", server.url),
        ("sessions", "tree", main_id, "--node", server.url),
        ("node", "status", "--node", server.url),
    ):
        code, heavy = _imported(*args)
        assert (args, code, heavy) == (args, 0, [])


def _lazy_groups() -> Iterator[tuple[str, LazyGroup]]:
    ctx = click.Context(cli_main)
    yield "sessiontree", cli_main  # type: ignore[misc]
    node = cli_main.get_command(ctx, "node")
    assert isinstance(node, LazyGroup)
    yield "sessiontree node", node


def test_each_listed_help_line_is_the_commands_own() -> None:
    """``--help`` lists lazy commands from a table; it says what each command says."""
    for path, group in _lazy_groups():
        ctx = click.Context(group)
        for name, entry in group.lazy.items():
            command = group.get_command(ctx, name)
            assert command is not None, f"{path} {name}"
            listed = click.Command(name, help=entry.help).get_short_help_str(1000)
            assert listed == command.get_short_help_str(1000), f"{path} {name}"


def test_root_help_lists_every_command() -> None:
    shown = CliRunner().invoke(cli_main, ["--help"])
    assert shown.exit_code == 0
    for name in cli_main.list_commands(click.Context(cli_main)):
        assert f"  {name} " in shown.output
    assert "Run a fixed, deterministic scenario" in shown.output


def _not_installed(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``node start`` be imported afresh, with ``modules`` not installed."""
    node_group = cli_main.get_command(click.Context(cli_main), "node")
    assert isinstance(node_group, click.Group)
    monkeypatch.delitem(node_group.commands, "start", raising=False)
    for name in [m for m in sys.modules if m.startswith("sessiontree.cli.commands._node")]:
        monkeypatch.delitem(sys.modules, name)  # node start's modules, however it is split
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # its import fails: ModuleNotFoundError


def test_node_start_without_the_node_extra_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _not_installed(monkeypatch, "uvicorn")
    store = tmp_path / "store"
    result = CliRunner().invoke(
        cli_main, ["node", "start", "--store", str(store)], prog_name="sessiontree"
    )
    assert result.exit_code == 2, result.output
    assert "'sessiontree node start' needs the node extra" in result.output
    assert "pip install 'sessiontree[node]'" in result.output
    assert "no module named 'uvicorn'" in result.output
    assert not store.exists()


def test_top_without_the_top_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textual", None)
    monkeypatch.delitem(sys.modules, "sessiontree.cli.top._app", raising=False)
    result = CliRunner().invoke(
        cli_main, ["top", "--node", "http://127.0.0.1:9"], prog_name="sessiontree"
    )
    assert result.exit_code == 2, result.output
    assert "'sessiontree top' needs the top extra" in result.output
    assert "pip install 'sessiontree[top]'" in result.output


def test_an_import_error_of_the_core_is_not_called_a_missing_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the extra's own modules are named as missing; anything else is a bug
    and propagates as it is."""
    _not_installed(monkeypatch, "tomllib")
    result = CliRunner().invoke(cli_main, ["node", "start", "--store", "x"])
    assert isinstance(result.exception, ModuleNotFoundError)
    assert "extra" not in result.output
